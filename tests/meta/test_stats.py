"""The suite's own statistics: the chi-square tail against closed forms, and pooling."""

import math

import pytest

from specverify.conformance.stats import pooled_chi_square, upper_gamma_q


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


# ------------------------------------------------------------------------------------------------
# power of the chi-square (specverify/conformance/stats.py: critical values, noncentral tail, draws needed)

from statistics import NormalDist  # noqa: E402

import numpy as np  # noqa: E402

from specverify.conformance.stats import (  # noqa: E402
    chi_square_critical,
    chi_square_power,
    draws_for_power,
    effect_size_w2,
    noncentral_chi_square_sf,
    power_at,
)


@pytest.mark.parametrize("df,alpha,x", [(1, 0.05, 3.841458820694124), (2, 0.01, 9.210340371976182),
                                        (10, 1e-6, None), (40, 1e-6, None)])
def test_critical_value_inverts_the_tail(df, alpha, x):
    c = chi_square_critical(df, alpha)
    if x is not None:  # textbook values
        assert c == pytest.approx(x, rel=1e-9)
    assert upper_gamma_q(df / 2, c / 2) == pytest.approx(alpha, rel=1e-8)


@pytest.mark.parametrize("lam", [0.0, 0.5, 4.0, 40.0, 300.0])
@pytest.mark.parametrize("x", [0.5, 3.84, 23.9])
def test_noncentral_tail_matches_the_df1_closed_form(lam, x):
    # df = 1: X = (Z + sqrt(lam))^2, so P(X > x) = Phi(-sqrt(x) - sqrt(lam)) + Phi(-sqrt(x) + sqrt(lam)).
    phi = NormalDist().cdf
    want = phi(-math.sqrt(x) - math.sqrt(lam)) + phi(-math.sqrt(x) + math.sqrt(lam))
    assert noncentral_chi_square_sf(x, 1, lam) == pytest.approx(want, rel=1e-9, abs=1e-15)


def test_noncentral_tail_matches_simulation_at_df5():
    rng = np.random.default_rng(20260101)
    draws = rng.noncentral_chisquare(5, 12.0, size=200_000)
    for x in (5.0, 15.0, 30.0):
        # 200k draws: binomial sd <= 0.0012, the tolerance is 5 sd (false-failure rate ~1e-6, seeded).
        assert noncentral_chi_square_sf(x, 5, 12.0) == pytest.approx((draws > x).mean(), abs=0.006)


P0 = {0: 0.30, 1: 0.25, 2: 0.20, 3: 0.15, 4: 0.10}
Q1 = {0: 0.27, 1: 0.27, 2: 0.20, 3: 0.15, 4: 0.11}


def test_predicted_power_matches_simulated_pearson_rejections():
    """The noncentral approximation of Pearson's statistic under a fixed alternative: simulated
    rejection rates (seeded) agree with power_at within 0.05 over a range of powers."""
    rng = np.random.default_rng(7)
    cells = sorted(P0)
    p = np.array([P0[c] for c in cells])
    q = np.array([Q1[c] for c in cells])
    alpha = 0.001
    crit = chi_square_critical(len(cells) - 1, alpha)
    for n in (1000, 3000, 6000):
        counts = rng.multinomial(n, q, size=4000)
        stats = ((counts - n * p) ** 2 / (n * p)).sum(-1)
        simulated = (stats > crit).mean()
        assert power_at(P0, Q1, n, alpha=alpha) == pytest.approx(simulated, abs=0.05), n


def test_effect_size_and_draws_for_power():
    w2, df, zero = effect_size_w2(P0, Q1, 10_000)
    assert df == 4 and zero == 0.0
    assert w2 == pytest.approx(sum((Q1[c] - P0[c]) ** 2 / P0[c] for c in P0), rel=1e-12)
    n = draws_for_power(P0, Q1, alpha=1e-6, power=0.999)
    assert chi_square_power(df, n * w2, 1e-6) >= 0.999
    assert chi_square_power(df, (n / 1.25) * w2, 1e-6) < 0.999, "the smallest n on the grid"
    with pytest.raises(ValueError, match="effect too small"):
        draws_for_power(P0, P0, alpha=1e-6, power=0.999, limit=100_000)


def test_mass_outside_the_support_is_power_by_itself():
    # The alternative puts 1% where the law has none: one draw there fails pooled_chi_square.
    q = {0: 0.29, 1: 0.25, 2: 0.20, 3: 0.15, 4: 0.10, 9: 0.01}
    w2, df, zero = effect_size_w2(P0, q, 5000)
    assert zero == pytest.approx(0.01)
    assert power_at(P0, q, 2000, alpha=1e-6) >= 1 - 0.99 ** 2000
    _, p_value, _ = pooled_chi_square({0: 29, 1: 25, 2: 20, 3: 15, 4: 10, 9: 1}, P0, 100)
    assert p_value < 1e-6
