"""Stochastic verify has the exact law, and the chi-square that proves it has power
(DESIGN invariants 2 and 9; docs/semantics.md 4 and 6.4).

At the op level the exact JOINT law of what one stochastic verify emits for a fixed tree (the
accepted draft tokens and the bonus, as one tuple) is known: `reference.emitted_path_probability`,
and this suite's own enumeration `tests.support.faults.emitted_law`, which also gives the law under
each injected fault. `verify_stochastic` is batched, so N independent verifies of one tree are one
call with the tree and the probabilities repeated N times and N rows of seeded uniforms.

The trees have siblings, depth 3 and a zero-probability draft token; the node rows are the
sampling distributions (temperature, top-k, top-p, min-p) of FP8 logits at a static scale != 1 or
per-row scales, built by `specverify.engine.sampling.sampling_probs` and checked against
`reference.filtered_probs` of the reference's own FP8 decoding.

Injected verify bugs (test-side: faulty inputs, or a monkeypatched torch-fallback function; nothing
is planted in specverify/):
  (a) the target probabilities at temperature x1.1;
  (b) the bonus drawn without the rejected siblings removed from the residual;
  (c) `<=` instead of `<` in the acceptance comparison (on a coin grid, see GRID).
For each, the number of draws N is chosen from the exact effect size (Cohen's w^2 over the pooled
cells, noncentrality N w^2) so that the chi-square at ALPHA rejects with probability >= POWER
(specverify/conformance/stats.py). The fault-free run at the same N must pass at ALPHA; each faulty run
must fail at ALPHA. All uniforms are seeded, so every outcome is reproducible; the rates below say
how often a fresh seed would flip it.
"""

from __future__ import annotations

import collections
import dataclasses
import functools

import numpy as np
import pytest
import torch

import reference
from reference import fp8 as ref_fp8
from specverify import dtypes
from specverify.platform import get_profile
from specverify.engine.sampling import SamplingParams, sampling_probs
from specverify.kernels import DraftTree, verify_stochastic
from specverify.kernels import verify as verify_module
from tests.support import faults
from specverify.conformance.stats import draws_for_power, effect_size_w2, pooled_chi_square, power_at

ALPHA = 1e-6        # false-positive rate of each chi-square (a correct verify fails with this probability)
POWER = 0.999       # the chance each injected bug is detected at the N chosen (false negatives <= 1e-3)
MAX_DRAWS = 400_000  # N above this means the case is too weak to be a power test: the test says so
GRID = 64           # fault (c): coins and probabilities on the 2^-6 grid
SEED = 1_234_567
V = 10
NUM_STEPS = 3
# root 0 -> {1, 2, 3}; 1 -> {4, 5}; 4 -> {6}: siblings at two depths, a path of depth 3.
PARENTS = [-1, 0, 0, 0, 1, 1, 4]
# Draft tokens by the rank (0 = most probable) of the token in the parent's target row: the root's
# children are its 2nd, 1st and 9th most probable tokens (the last filtered out by every config
# below, a draft the target never samples), node 1's children its 1st and 3rd, node 4's its 1st.
CHILD_RANKS = {1: 1, 2: 0, 3: 8, 4: 0, 5: 2, 6: 0}


@dataclasses.dataclass(frozen=True)
class Config:
    dtype: str
    scale_mode: str
    static_scale: float
    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def params(self, temperature_factor: float = 1.0) -> dict:
        return dict(temperature=self.temperature * temperature_factor, top_k=self.top_k, top_p=self.top_p,
                    min_p=self.min_p)


CONFIGS = {
    "top_k-e4m3fn-static0.37": Config("float8_e4m3fn", "static", 0.37, 0.8, top_k=4),
    "top_p-e5m2-per_row": Config("float8_e5m2", "per_row", 1.0, 1.0, top_p=0.8),
    "min_p-e4m3fnuz-static2.5": Config("float8_e4m3fnuz", "static", 2.5, 1.3, min_p=0.12),
    "all-e4m3fn-per_row": Config("float8_e4m3fn", "per_row", 1.0, 0.9, top_k=6, top_p=0.9, min_p=0.05),
}


@dataclasses.dataclass(frozen=True)
class Case:
    tokens: list          # [D]
    probs: np.ndarray     # [D, V] float64, the node rows (sampling_probs of the FP8 logits)
    probs_hot: np.ndarray  # [D, V] the same logits at temperature x1.1 (fault (a))


def _logits(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn((len(PARENTS), V), generator=gen, dtype=torch.float64) * 2.5


@functools.lru_cache(maxsize=None)
def case(name: str) -> Case:
    cfg = CONFIGS[name]
    values, scale = dtypes.to_logits_dtype(_logits(SEED + len(name)), cfg.dtype, scale_mode=cfg.scale_mode,
                                           static_scale=cfg.static_scale)
    probs = sampling_probs(values, scale, SamplingParams(**cfg.params())).numpy()
    hot = sampling_probs(values, scale, SamplingParams(**cfg.params(1.1))).numpy()
    # The reference reads the same FP8 bit patterns with its own decoder and filters.
    z = ref_fp8.decode(values.view(torch.uint8).numpy(), cfg.dtype).astype(np.float64) * scale.double().numpy()
    for j in range(len(PARENTS)):
        want = reference.filtered_probs(z[j], **cfg.params())
        np.testing.assert_allclose(probs[j], want, rtol=0, atol=1e-12)
        assert ((probs[j] > 0) == (np.asarray(want) > 0)).all(), f"{name}: support of row {j}"
    tokens = [0] * len(PARENTS)
    for j, rank in CHILD_RANKS.items():
        order = sorted(range(V), key=lambda t: (-probs[PARENTS[j]][t], t))
        tokens[j] = order[rank]
    return Case(tokens, probs, hot)


def grid_probs(probs: np.ndarray) -> np.ndarray:
    """Each row rounded to multiples of 1/GRID (largest remainder, ties to the lower index),
    summing to exactly 1; zeros stay zero."""
    out = np.zeros_like(probs)
    for j, row in enumerate(probs):
        scaled = row * GRID
        units = np.floor(scaled)
        short = GRID - int(units.sum())
        frac = scaled - units
        for t in sorted(range(len(row)), key=lambda t: (-frac[t], t))[:short]:
            units[t] += 1
        out[j] = units / GRID
    assert (out.sum(-1) == 1.0).all()
    return out


def tree_of(tokens: list[int], reps: int) -> DraftTree:
    """The DraftTree of PARENTS with `tokens`, repeated `reps` times along the batch."""
    d = len(PARENTS)
    first_child, next_sibling = [-1] * d, [-1] * d
    for j in range(d - 1, 0, -1):           # children in ascending node order
        p = PARENTS[j]
        next_sibling[j] = first_child[p]
        first_child[p] = j
    depth = [0] * d
    mask = torch.zeros((d, d), dtype=torch.bool)
    for j in range(d):
        a = j
        while a >= 0:
            mask[j, a] = True
            a = PARENTS[a]
        depth[j] = 0 if j == 0 else depth[PARENTS[j]] + 1

    def rows(x):
        return torch.tensor(x, dtype=torch.int64)[None].repeat(reps, 1)
    return DraftTree(rows(tokens), rows(PARENTS), rows(depth), mask[None].repeat(reps, 1, 1), rows(first_child),
                     rows(next_sibling), torch.arange(reps * d, dtype=torch.int64).view(reps, d))


def sample(tokens: list[int], probs: np.ndarray, n: int, *, seed: int, coin_grid: int | None = None) -> collections.Counter:
    """Counts of the emitted tuples of n independent stochastic verifies (torch fallback)."""
    gen = torch.Generator().manual_seed(seed)
    if coin_grid is None:
        coins = torch.rand((n, len(PARENTS)), generator=gen, dtype=torch.float64)
    else:
        coins = torch.randint(0, coin_grid, (n, len(PARENTS)), generator=gen).double() / coin_grid
    final = torch.rand((n,), generator=gen, dtype=torch.float64)
    p = torch.from_numpy(probs)[None].expand(n, -1, -1)
    accept, num_correct, bonus = verify_stochastic(tree_of(tokens, n), p, coins, final, num_steps=NUM_STEPS,
                                                   impl="torch")
    drafted = torch.tensor(tokens)[accept.clamp(min=0)]
    drafted[accept < 0] = -1
    rows = torch.cat([drafted[:, 1:], bonus[:, None]], dim=1).numpy()
    keys, counts = np.unique(rows, axis=0, return_counts=True)
    out = collections.Counter()
    for key, c in zip(keys, counts):
        out[tuple(int(t) for t in key if t >= 0)] += int(c)
    assert sum(out.values()) == n
    return out


def chi_square(counts: collections.Counter, law: dict, n: int) -> tuple[float, float, int]:
    return pooled_chi_square(counts, law, n)


def law_of(c: Case, probs: np.ndarray | None = None, **switches) -> dict:
    rows = (c.probs if probs is None else probs).tolist()
    return faults.emitted_law(c.tokens, PARENTS, rows, NUM_STEPS, **switches)


def draws_needed(law: dict, faulty: dict) -> int:
    n = draws_for_power(law, faulty, alpha=ALPHA, power=POWER, start=2000)
    assert n <= MAX_DRAWS, f"the injected bug needs {n} draws: too weak a case"
    return n


def describe(law: dict, faulty: dict, n: int) -> str:
    w2, df, zero = effect_size_w2(law, faulty, n)
    return (f"w^2 = {w2:.4g} on {df} df (+ {zero:.3g} mass outside the support), N = {n}, noncentrality "
            f"{n * w2:.1f}, power {power_at(law, faulty, n, alpha=ALPHA):.6f} at alpha {ALPHA}")


# ------------------------------------------------------------------------------------------------
# the laws themselves


@pytest.mark.parametrize("name", list(CONFIGS))
def test_own_law_equals_the_reference_law(name):
    """faults.emitted_law (fault-free) equals reference.emitted_path_probability on every
    emitted tuple, sums to 1, and its first token follows the root's target row (losslessness of
    the first token, exactly). Also on the 2^-6 grid (probabilities and coins)."""
    c = case(name)
    for probs, grid in ((c.probs, None), (grid_probs(c.probs), GRID)):
        law = law_of(c, probs, coin_grid=grid)
        assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
        for emitted, p in law.items():
            want = reference.emitted_path_probability(c.tokens, PARENTS, probs, list(emitted), num_steps=NUM_STEPS)
            assert p == pytest.approx(want, rel=1e-12, abs=1e-15), (name, emitted)
        first = collections.Counter()
        for emitted, p in law.items():
            first[emitted[0]] += p
        np.testing.assert_allclose([first[t] for t in range(V)], probs[0], atol=1e-12)
    # The cases are real: acceptance at two depths, rejection, a zero-probability draft.
    assert c.probs[0][c.tokens[3]] == 0.0
    full_path = tuple(c.tokens[j] for j in (1, 4, 6))
    assert sum(p for emitted, p in law_of(c).items() if emitted[:3] == full_path) > 0.01


def test_injected_walk_is_the_zoo_patch_and_changes_decisions_on_the_grid():
    """The injected `<=` walk is the real torch walk with the zoo's patch planted: it keeps the
    real results on continuous coins (u == acc has probability ~0 there) and changes decisions on
    the grid, where the boundary event is real."""
    gen = torch.Generator().manual_seed(5)
    c = case("top_k-e4m3fn-static0.37")
    tree = tree_of(c.tokens, 4000)
    probs = torch.from_numpy(grid_probs(c.probs))[None].expand(4000, -1, -1)
    smooth = torch.rand((4000, len(PARENTS)), generator=gen, dtype=torch.float64)
    grid = torch.randint(0, GRID, (4000, len(PARENTS)), generator=gen).double() / GRID
    real = verify_module._stochastic_walk_torch(tree, probs, smooth, NUM_STEPS)
    assert all(torch.equal(a, b) for a, b in zip(real, faults.walk_accepting_on_equal(tree, probs, smooth, NUM_STEPS)))
    real = verify_module._stochastic_walk_torch(tree, probs, grid, NUM_STEPS)
    assert not torch.equal(real[1], faults.walk_accepting_on_equal(tree, probs, grid, NUM_STEPS)[1])


# ------------------------------------------------------------------------------------------------
# the chi-square: the real verify passes, each injected bug fails


@functools.lru_cache(maxsize=None)
def plan(name: str) -> dict:
    """The faulty laws of bugs (a) and (b) and the N each needs; N for the fault-free run is the
    larger (its false-positive rate is ALPHA whatever N is)."""
    c = case(name)
    law = law_of(c)
    hot = law_of(c, c.probs_hot)
    no_residual = law_of(c, remove_rejected=False)
    n_hot, n_res = draws_needed(law, hot), draws_needed(law, no_residual)
    return dict(law=law, hot=hot, no_residual=no_residual, n_hot=n_hot, n_res=n_res)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_real_verify_passes_the_joint_chi_square(name):
    """The emitted tuples of N seeded verifies (N the largest of the bug cases) fit the exact
    joint law. False-positive rate ALPHA = 1e-6."""
    c, pl = case(name), plan(name)
    n = max(pl["n_hot"], pl["n_res"])
    stat, p_value, df = chi_square(sample(c.tokens, c.probs, n, seed=SEED), pl["law"], n)
    assert p_value > ALPHA, f"{name}: chi-square {stat:.1f} on {df} df, p = {p_value:.3g}, N = {n}, seed {SEED}"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_detects_target_probabilities_at_temperature_x1_1(name):
    """Bug (a): verify fed the target rows at 1.1 x T. N from the exact effect size for power
    >= 0.999 at ALPHA = 1e-6 (the check is a false positive for a correct verify with rate 1e-6;
    it misses this bug with probability <= 1e-3 for a fresh seed)."""
    c, pl = case(name), plan(name)
    n = pl["n_hot"]
    stat, p_value, df = chi_square(sample(c.tokens, c.probs_hot, n, seed=SEED), pl["law"], n)
    assert p_value < ALPHA, f"{name}: T x1.1 not detected: chi-square {stat:.1f} on {df} df, p = {p_value:.3g}; " \
                            + describe(pl["law"], pl["hot"], n)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_detects_bonus_without_residual_removal(name, monkeypatch):
    """Bug (b): the bonus drawn from the full row, the rejected siblings not removed. N from the
    exact effect size (power >= 0.999 at ALPHA = 1e-6; false-positive rate 1e-6)."""
    c, pl = case(name), plan(name)
    n = pl["n_res"]
    monkeypatch.setattr(verify_module, "_residual_bonus", faults.bonus_without_residual)
    stat, p_value, df = chi_square(sample(c.tokens, c.probs, n, seed=SEED), pl["law"], n)
    assert p_value < ALPHA, f"{name}: no-residual bonus not detected: chi-square {stat:.1f} on {df} df, " \
                            f"p = {p_value:.3g}; " + describe(pl["law"], pl["no_residual"], n)


# Bug (c) needs the boundary event u == acc to happen: with continuous uniforms it has probability
# ~0 and `<=` is invisible. On the grid it is real: node probabilities are multiples of 2^-6 (their
# float64 running sums are exact) and the coins are k / 64, k uniform in 0..63. Under the strict rule
# the walk's law is then still EXACTLY the continuous law (the number of grid points in
# [acc_{i-1}, acc_i) is 64 (acc_i - acc_{i-1})), so the correct verify must pass; under `<=` child i
# owns (acc_{i-1}, acc_i] instead: the first child gains u = 0 (1/64, even when its probability is 0)
# and rejection loses one grid point, at every node.


@pytest.mark.parametrize("name", list(CONFIGS))
def test_strict_comparison_on_the_grid_and_le_detected(name, monkeypatch):
    """Bug (c): `<=` for `<` in the acceptance walk. The real verify on grid probabilities and grid
    coins passes the exact law (false-positive rate ALPHA = 1e-6); the `<=` walk fails it, with N
    chosen from the exact effect size of the `<=` law for power >= 0.999 at ALPHA."""
    c = case(name)
    probs = grid_probs(c.probs)
    law = law_of(c, probs, coin_grid=GRID)
    law_le = law_of(c, probs, coin_grid=GRID, accept_on_equal=True)
    assert law == pytest.approx(law_of(c, probs)), "strict rule on the grid = the continuous law"
    n = draws_needed(law, law_le)
    stat, p_value, df = chi_square(sample(c.tokens, probs, n, seed=SEED, coin_grid=GRID), law, n)
    assert p_value > ALPHA, f"{name}: grid run of the real verify: chi-square {stat:.1f} on {df} df, p = {p_value:.3g}"
    monkeypatch.setattr(verify_module, "_stochastic_walk_torch", faults.walk_accepting_on_equal)
    stat, p_value, df = chi_square(sample(c.tokens, probs, n, seed=SEED, coin_grid=GRID), law, n)
    assert p_value < ALPHA, f"{name}: `<=` not detected: chi-square {stat:.1f} on {df} df, p = {p_value:.3g}; " \
                            + describe(law, law_le, n)


@pytest.mark.kernels
def test_triton_walk_equals_torch_and_reference_on_the_grid():
    """The boundary u == acc on the Triton kernel (interpreted on the CPU): grid coins and grid
    probabilities, every request's outputs equal to the torch fallback and to
    reference.stochastic_verify. Kills `<=` in either implementation deterministically."""
    c = case("all-e4m3fn-per_row")
    probs = grid_probs(c.probs)
    n = 96
    gen = torch.Generator().manual_seed(11)
    coins = torch.randint(0, GRID, (n, len(PARENTS)), generator=gen).double() / GRID
    # The root's coins of the first requests sit exactly on its acceptance boundaries: 0 and the
    # running sums of its children's probabilities.
    boundaries = [0.0] + np.cumsum([probs[0][c.tokens[j]] for j in (1, 2, 3)]).tolist()
    coins[:len(boundaries), 0] = torch.tensor([min(x, 1 - 1 / GRID) for x in boundaries], dtype=torch.float64)
    final = torch.rand((n,), generator=gen, dtype=torch.float64)
    # The native profile's device: CUDA on a GPU machine, else the CPU with Triton interpreted.
    dev = get_profile().device
    tree = tree_of(c.tokens, n)
    tree = dataclasses.replace(tree, **{f.name: getattr(tree, f.name).to(dev) for f in dataclasses.fields(tree)})
    p = torch.from_numpy(probs)[None].repeat(n, 1, 1).to(dev)
    coins, final = coins.to(dev), final.to(dev)
    got = {impl: [x.cpu() for x in verify_stochastic(tree, p, coins, final, num_steps=NUM_STEPS, impl=impl)]
           for impl in ("torch", "triton")}
    coins, final = coins.cpu(), final.cpu()
    for b in range(n):
        want = reference.stochastic_verify(c.tokens, PARENTS, probs, coins[b].tolist(), float(final[b]),
                                           num_steps=NUM_STEPS)
        for impl, (accept, num_correct, bonus) in got.items():
            assert (accept[b].tolist(), int(num_correct[b]), int(bonus[b])) == (list(want[0]), want[1], want[2]), \
                (impl, b)
