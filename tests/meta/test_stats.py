"""The suite's own statistics: the chi-square tail against closed forms, and pooling."""

import math

import pytest

from tests.support.stats import pooled_chi_square, upper_gamma_q


@pytest.mark.parametrize("x", [0.01, 0.5, 1.0, 3.0, 10.0, 30.0, 60.0])
def test_chi_square_tail_matches_closed_forms(x):
    # df = 2: the tail is exp(-x/2); df = 1: erfc(sqrt(x/2)); df = 4: exp(-x/2) (1 + x/2)
    assert upper_gamma_q(1.0, x / 2) == pytest.approx(math.exp(-x / 2), rel=1e-12)
    assert upper_gamma_q(0.5, x / 2) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-10)
    assert upper_gamma_q(2.0, x / 2) == pytest.approx(math.exp(-x / 2) * (1 + x / 2), rel=1e-12)


def test_pooled_chi_square_flags_mass_outside_the_support():
    _, p, _ = pooled_chi_square({0: 50, 1: 45, 2: 5}, {0: 0.5, 1: 0.5}, 100)
    assert p < 1e-12


def test_pooled_chi_square_accepts_an_exact_fit():
    stat, p, df = pooled_chi_square({0: 500, 1: 300, 2: 200}, {0: 0.5, 1: 0.3, 2: 0.2}, 1000)
    assert stat == 0 and p == pytest.approx(1.0) and df == 2
