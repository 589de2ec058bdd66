"""Test-side faulty variants of stochastic verify, and the exact law of its output with or
without each fault (tests/test_stochastic_power.py).

Nothing here is planted into `specverify/`: a test monkeypatches one torch-fallback function of
`specverify.kernels.verify` with a variant below, or feeds the real op faulty inputs. Each variant
differs from the real function in the fault only: `stochastic_walk(..., accept_on_equal=False)` is
held equal to `_stochastic_walk_torch` by a test, and `bonus_without_residual` reuses the real
`_inverse_cdf`.

`emitted_law` is this file's own enumeration of what one stochastic verify of one tree emits
(accepted draft tokens + bonus), written from docs/semantics.md 6.4 with the faults as switches;
a test holds its fault-free law equal to `reference.emitted_path_probability`.
"""

from __future__ import annotations

import collections

import torch

from specverify.kernels import verify as V


# ------------------------------------------------------------------------------------------------
# faulty variants of the torch fallback


def stochastic_walk(tree, probs: torch.Tensor, coins: torch.Tensor, num_steps: int, *, accept_on_equal: bool):
    """The stochastic walk of verify.py (one pass over the nodes in ascending order), with the
    acceptance comparison `u <= acc` instead of `u < acc` when `accept_on_equal`."""
    bs, d = tree.tokens.shape
    device = tree.device
    w = torch.arange(num_steps + 1, device=device)
    rows = torch.arange(bs, device=device)
    parents = tree.parents
    tokens = tree.tokens.clamp(0, probs.shape[2] - 1)
    q = probs[rows[:, None], parents.clamp(min=0), tokens]
    cur = torch.zeros(bs, dtype=torch.int64, device=device)
    n = torch.zeros(bs, dtype=torch.int64, device=device)
    u = coins[:, 0]
    acc = torch.zeros(bs, dtype=torch.float64, device=device)
    accept = torch.where(w == 0, 0, -1).expand(bs, num_steps + 1)
    for m in range(1, d):
        visit = (parents[:, m] == cur) & (n < num_steps)
        acc = torch.where(visit, acc + q[:, m], acc)
        take = visit & ((u <= acc) if accept_on_equal else (u < acc))
        n = n + take
        accept = torch.where(take[:, None] & (w == n[:, None]), m, accept)
        cur = torch.where(take, m, cur)
        u = torch.where(take, coins[:, m], u)
        acc = torch.where(take, 0.0, acc)
    return accept.contiguous(), n


def walk_accepting_on_equal(tree, probs, coins, num_steps):
    """Injected fault (c): `<=` for `<` in the acceptance comparison."""
    return stochastic_walk(tree, probs, coins, num_steps, accept_on_equal=True)


def bonus_without_residual(tree, probs, accept, n, final, num_steps):
    """Injected fault (b): the bonus drawn from the last accepted node's full distribution, the
    rejected siblings' tokens NOT removed from it."""
    rows = torch.arange(probs.shape[0], device=probs.device)
    cur = accept.gather(1, n[:, None])[:, 0]
    return V._inverse_cdf(probs[rows, cur].clone(), final)


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
