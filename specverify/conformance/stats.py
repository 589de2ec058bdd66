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


# ------------------------------------------------------------------------------------------------
# Power: how many draws a chi-square needs to see a given departure from the law it tests.
#
# Under an alternative law q, Pearson's statistic against p over n draws is approximately a
# NONCENTRAL chi-square with df = cells - 1 and noncentrality lambda = n * w^2, where
# w^2 = sum_c (q_c - p_c)^2 / p_c is Cohen's effect size (squared). Its tail is the Poisson mixture
#   P(X > x) = sum_j e^{-lambda/2} (lambda/2)^j / j!  *  Q((df + 2j) / 2, x / 2),
# summed here directly (no normal or Wilson-Hilferty approximation of the tail itself; the only
# approximation is the noncentral law of Pearson's statistic, checked by simulation in
# tests/meta/test_stats.py).


def chi_square_critical(df: int, alpha: float) -> float:
    """The x with P(chi2_df > x) = alpha (bisection on the exact tail)."""
    if not (0.0 < alpha < 1.0) or df < 1:
        raise ValueError(f"chi_square_critical: need df >= 1 and 0 < alpha < 1, got df={df}, alpha={alpha}")
    lo, hi = 0.0, float(df) + 10.0
    while upper_gamma_q(df / 2.0, hi / 2.0) > alpha:
        hi = hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if upper_gamma_q(df / 2.0, mid / 2.0) > alpha:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return hi


def noncentral_chi_square_sf(x: float, df: int, lam: float) -> float:
    """P(X > x) for X ~ noncentral chi-square(df, lam), by the Poisson mixture above."""
    if lam < 0 or df < 1:
        raise ValueError(f"noncentral_chi_square_sf: need df >= 1 and lam >= 0, got df={df}, lam={lam}")
    if lam == 0.0:
        return upper_gamma_q(df / 2.0, x / 2.0)
    half = lam / 2.0
    top = int(half + 12.0 * math.sqrt(half) + 60)
    total = 0.0
    for j in range(top + 1):
        log_weight = -half + j * math.log(half) - math.lgamma(j + 1)
        if log_weight < -745.0:
            continue
        total += math.exp(log_weight) * upper_gamma_q((df + 2 * j) / 2.0, x / 2.0)
    return min(total, 1.0)


def chi_square_power(df: int, lam: float, alpha: float) -> float:
    """Probability that Pearson's test at level alpha rejects when the noncentrality is lam."""
    return noncentral_chi_square_sf(chi_square_critical(df, alpha), df, lam)


def pooled_cells(expected: dict, alternative: dict, n: int, *, min_expected: float = 5.0):
    """The cells `pooled_chi_square` uses for n draws, as two aligned probability lists (the law
    tested, the alternative). Pooling depends on the tested law only, as in pooled_chi_square."""
    big = [c for c, p in expected.items() if p * n >= min_expected]
    p = [expected[c] for c in big]
    q = [alternative.get(c, 0.0) for c in big]
    rest_p, rest_q = max(0.0, 1.0 - sum(p)), max(0.0, 1.0 - sum(q))
    if rest_p > 1e-15 or rest_q > 1e-15:
        p.append(rest_p)
        q.append(rest_q)
    return p, q


def effect_size_w2(expected: dict, alternative: dict, n: int, *, min_expected: float = 5.0):
    """(Cohen's w^2, df, zero_mass) of `alternative` against `expected` over the cells the test
    uses at n draws. w^2 sums the cells the tested law gives mass; zero_mass is what the
    alternative puts where the tested law puts (almost) none: a single draw there fails the test
    by itself (pooled_chi_square's pooled cell then has expected ~0)."""
    p, q = pooled_cells(expected, alternative, n, min_expected=min_expected)
    w2, zero_mass = 0.0, 0.0
    for pc, qc in zip(p, q):
        if pc < 1e-12:
            zero_mass += qc
        else:
            w2 += (qc - pc) ** 2 / pc
    return w2, len(p) - 1, zero_mass


def power_at(expected: dict, alternative: dict, n: int, *, alpha: float, min_expected: float = 5.0) -> float:
    """Probability that the pooled test at level alpha rejects n draws of `alternative`: the
    noncentral chi-square power of the cells with mass, or the chance of >= 1 draw where the tested
    law has none, whichever is larger (each alone is a lower bound of the rejection probability)."""
    w2, df, zero_mass = effect_size_w2(expected, alternative, n, min_expected=min_expected)
    by_support = 1.0 - (1.0 - zero_mass) ** n
    return max(chi_square_power(df, n * w2, alpha) if df >= 1 else 0.0, by_support)


def draws_for_power(expected: dict, alternative: dict, *, alpha: float, power: float,
                    start: int = 1000, limit: int = 10_000_000, min_expected: float = 5.0) -> int:
    """The smallest n on a grid (start, x1.25 ...) at which Pearson's test of `expected` at level
    alpha rejects draws from `alternative` with probability >= power (`power_at`). Pooling is
    recomputed at every n, as the test does it. Raises when `limit` is not enough."""
    n = start
    while n <= limit:
        if power_at(expected, alternative, n, alpha=alpha, min_expected=min_expected) >= power:
            return n
        n = int(n * 1.25) + 1
    raise ValueError(f"draws_for_power: more than {limit} draws needed (effect too small)")
