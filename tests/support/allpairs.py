"""All-pairs (pairwise) covering designs: every pair of values of two factors meets in at least
one case. A deterministic greedy construction, small enough to read."""

from __future__ import annotations

import itertools


def all_pairs(factors: dict[str, list]) -> list[dict]:
    """Cases (dicts factor -> value) covering every value pair of every two factors."""
    names = list(factors)
    uncovered = {(a, i, b, j) for a, b in itertools.combinations(range(len(names)), 2)
                 for i in range(len(factors[names[a]])) for j in range(len(factors[names[b]]))}
    cases = []
    while uncovered:
        # Seed each case with the first uncovered pair, then fill the other factors greedily.
        a, i, b, j = min(uncovered)
        choice = {a: i, b: j}
        for f in range(len(names)):
            if f in choice:
                continue
            best, gain = 0, -1
            for v in range(len(factors[names[f]])):
                g = sum(((min(f, o), v if f < o else choice[o], max(f, o), choice[o] if f < o else v) in uncovered)
                        for o in choice)
                if g > gain:
                    best, gain = v, g
            choice[f] = best
        for x, y in itertools.combinations(sorted(choice), 2):
            uncovered.discard((x, choice[x], y, choice[y]))
        cases.append({names[f]: factors[names[f]][v] for f, v in sorted(choice.items())})
    return cases


def uncovered_pairs(factors: dict[str, list], cases: list[dict]) -> list[tuple]:
    """The value pairs no case covers (empty for a valid design)."""
    missing = []
    for a, b in itertools.combinations(factors, 2):
        seen = {(c[a], c[b]) for c in cases}
        missing += [(a, x, b, y) for x in factors[a] for y in factors[b] if (x, y) not in seen]
    return missing


def case_id(case: dict) -> str:
    """A test id for one case of a design: factor=value pairs joined by '-'."""
    return "-".join(f"{k}={v}" for k, v in case.items())


def draft_tokens(topk: int, steps: int, draft: str) -> int:
    """D for the `draft` factor of the speculative matrices: "chain" = S + 1 (always for topk 1),
    "two" = 2, "wide" = as many as the tree allows, capped at 8."""
    most = 1 + topk + (steps - 1) * topk * topk
    if topk == 1 or draft == "chain":
        return min(steps + 1, most)
    return 2 if draft == "two" else min(most, 8)
