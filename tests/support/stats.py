"""Goodness-of-fit statistics written here (scipy is not a dependency)."""

import math

# P(chi2_df > x) = Q(df/2, x/2), the regularized upper incomplete gamma function. Q(a, z) is
# computed exactly up to float64 rounding (no Wilson-Hilferty approximation): for z < a + 1 by
# the power series of the lower function, gamma(a, z) = z^a e^-z sum_n z^n / (a (a+1) ... (a+n)),
# Q = 1 - P; otherwise by Legendre's continued fraction for the upper function,
# Gamma(a, z) = e^-z z^a / (z + 1 - a - 1(1-a)/(z + 3 - a - 2(2-a)/(z + 5 - a - ...))),
# evaluated with the modified Lentz method.


def _prefactor(a: float, z: float) -> float:
    return math.exp(-z + a * math.log(z) - math.lgamma(a))


def upper_gamma_q(a: float, z: float) -> float:
    if z <= 0.0:
        return 1.0
    if z < a + 1.0:
        term = 1.0 / a
        total = term
        n = 1
        while abs(term) > abs(total) * 1e-17 and n < 10_000:
            term = term * z / (a + n)
            total = total + term
            n = n + 1
        return 1.0 - total * _prefactor(a, z)
    tiny = 1e-300
    b = z + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b = b + 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h = h * delta
        if abs(delta - 1.0) < 1e-16:
            break
    return _prefactor(a, z) * h


def chi_square_pvalue(observed: list[int], expected: list[float]) -> tuple[float, float, int]:
    """(statistic, upper-tail p-value, df) of Pearson's chi-square over the given cells."""
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    df = len(observed) - 1
    return stat, upper_gamma_q(df / 2.0, stat / 2.0), df




def pooled_chi_square(observed: dict, expected: dict, n: int, *, min_expected: float = 5.0):
    """Pearson chi-square of counts `observed` (cell -> count) against probabilities `expected`
    (cell -> p, summing to 1) for n draws. Cells expected fewer than `min_expected` times are
    pooled into one, and so is every observed cell the expectation gives no mass (a draw there
    is a failure by itself: the pooled cell then has expected ~0 and a huge statistic).
    Returns (statistic, p-value, df)."""
    big = [c for c, p in expected.items() if p * n >= min_expected]
    obs = [observed.get(c, 0) for c in big]
    exp = [expected[c] * n for c in big]
    rest_obs = n - sum(obs)
    rest_exp = n - sum(exp)
    if rest_obs or rest_exp > 1e-9:
        obs.append(rest_obs)
        exp.append(max(rest_exp, 1e-12))
    return chi_square_pvalue(obs, exp)
