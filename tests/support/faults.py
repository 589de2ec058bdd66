"""Test-side faulty variants of stochastic verify, and the exact law of its output with or
without each fault (tests/test_stochastic_power.py).

Nothing here is planted into `specverify/`: a test monkeypatches one torch-fallback function of
`specverify.kernels.verify` with a variant below, or feeds the real op faulty inputs. Each variant
is the real function rebuilt with the zoo's own patch for that bug (tests/mutants/verify.toml), so
the injected fault and the planted mutant are one and the same.

`emitted_law` is this file's own enumeration of what one stochastic verify of one tree emits
(accepted draft tokens + bonus), written from docs/semantics.md 6.4 with the faults as switches;
a test holds its fault-free law equal to `reference.emitted_path_probability`.
"""

from __future__ import annotations

import collections
import functools
import inspect
from pathlib import Path

from specverify.kernels import verify as V
from specverify.mutants import apply, load_zoo

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------
# faulty variants of the torch fallback: the zoo's own patches, planted into one function


def zoo_variant(func, mutant_name: str):
    """`func` rebuilt from its source with the zoo mutant `mutant_name` planted (the same patch
    `python -m specverify mutants` plants into a copy of the tree), in its module's namespace. A
    target not found exactly once in the function refuses, as the harness does."""
    mutant = next((m for m in load_zoo(ROOT / "tests" / "mutants", ROOT) if m.name == mutant_name), None)
    if mutant is None:
        raise KeyError(f"the zoo has no mutant {mutant_name!r}")
    source = apply(mutant, inspect.getsource(func))
    namespace = dict(vars(inspect.getmodule(func)))
    exec(compile(source, f"<{mutant_name}: {func.__qualname__}>", "exec"), namespace)
    return namespace[func.__name__]


def walk_accepting_on_equal(tree, probs, coins, num_steps):
    """Injected fault (c): `<=` for `<` in the acceptance comparison (zoo: stochastic-le-torch)."""
    return _walk_le()(tree, probs, coins, num_steps)


def bonus_without_residual(tree, probs, accept, n, final, num_steps):
    """Injected fault (b): the rejected siblings' tokens are NOT removed from the residual the
    bonus is drawn from (zoo: bonus-without-residual-removal)."""
    return _bonus_unremoved()(tree, probs, accept, n, final, num_steps)


# The real functions, taken at import: a test monkeypatches the module attributes afterwards.
_REAL_WALK, _REAL_BONUS = V._stochastic_walk_torch, V._residual_bonus


@functools.lru_cache(maxsize=None)
def _walk_le():
    return zoo_variant(_REAL_WALK, "stochastic-le-torch")


@functools.lru_cache(maxsize=None)
def _bonus_unremoved():
    return zoo_variant(_REAL_BONUS, "bonus-without-residual-removal")


# ------------------------------------------------------------------------------------------------
# the exact law of one verify's output


def _children(parents: list[int]) -> list[list[int]]:
    kids = [[] for _ in parents]
    for j, p in enumerate(parents):
        if p >= 0:
            kids[p].append(j)
    return kids


def _node_outcomes(row: list[float], child_tokens: list[int], *, coin_grid: int | None, accept_on_equal: bool):
    """[(P(child i accepted) for each i), P(none)] at one node. Continuous coins: the acceptance
    intervals [acc_{i-1}, acc_i) (the comparison's boundary has probability 0). Grid coins
    u = k / coin_grid, k uniform in 0..coin_grid-1: every u is walked exactly as the op walks it."""
    m = len(child_tokens)
    if coin_grid is None:
        accept, prev, acc = [], 0.0, 0.0
        for t in child_tokens:
            acc = acc + row[t]
            accept.append(max(0.0, min(acc, 1.0) - min(prev, 1.0)))
            prev = acc
        return accept, 1.0 - min(acc, 1.0)
    counts = [0] * (m + 1)
    for k in range(coin_grid):
        u = k / coin_grid
        acc, hit = 0.0, m
        for i, t in enumerate(child_tokens):
            acc = acc + row[t]
            if (u <= acc) if accept_on_equal else (u < acc):
                hit = i
                break
        counts[hit] += 1
    return [c / coin_grid for c in counts[:m]], counts[m] / coin_grid


def emitted_law(tokens: list[int], parents: list[int], probs: list[list[float]], num_steps: int, *,
                coin_grid: int | None = None, accept_on_equal: bool = False,
                remove_rejected: bool = True) -> dict[tuple[int, ...], float]:
    """{emitted tuple: probability} of one stochastic verify of the tree `tokens` / `parents`
    (node 0 the root, parents before children) with node rows `probs` [D][V]; `final` is a
    continuous uniform. The switches are the faults: grid coins, `<=`, no residual removal."""
    kids = _children(parents)
    law: dict[tuple[int, ...], float] = collections.defaultdict(float)

    def bonus(cur: int, zeroed: set[int], weight: float, prefix: tuple[int, ...]) -> None:
        row = [0.0 if t in zeroed else x for t, x in enumerate(probs[cur])]
        total = sum(row)
        if weight > 0.0 and not total > 0.0:
            raise ValueError(f"node {cur}: the residual has no mass (a case this law does not model)")
        for t, x in enumerate(row):
            if x > 0.0 and weight > 0.0:
                law[prefix + (t,)] += weight * x / total

    def walk(cur: int, depth: int, weight: float, prefix: tuple[int, ...]) -> None:
        if depth == num_steps or not kids[cur]:
            bonus(cur, set(), weight, prefix)
            return
        child_tokens = [tokens[c] for c in kids[cur]]
        accept, none = _node_outcomes(probs[cur], child_tokens, coin_grid=coin_grid,
                                      accept_on_equal=accept_on_equal)
        for c, p in zip(kids[cur], accept):
            if p > 0.0:
                walk(c, depth + 1, weight * p, prefix + (tokens[c],))
        if none > 0.0:
            bonus(cur, set(child_tokens) if remove_rejected else set(), weight * none, prefix)

    walk(0, 0, 1.0, ())
    return dict(law)
