"""Comparing a decoder's per-cycle traces with a reference speculative decoder's (docs/semantics.md
6.5, 6.7), up to each request's first near-tie, and reporting what the comparison covered.

`compare_traces` walks both sides request by request: every cycle before the reference's first
near-tie must match field by field (tree tokens, parents, accepted nodes, emitted tokens); a
request without a near-tie must match in its cycle count and tokens too, one with a near-tie in
the tokens before it. `report` records the coverage as user properties, warns with
`TraceNearTieWarning` when near-ties stopped requests early, and fails a case where they stopped too
many or where too few cycles were compared: skipping must not be able to hide everything.
"""

from __future__ import annotations

import warnings

from tests.support.asserts import rerun_hint


class TraceNearTieWarning(UserWarning):
    """A request's trace comparison stopped early at a decision the reference flags as a near-tie."""


def fields(cycle) -> tuple:
    return cycle.tree_tokens, cycle.tree_parents, cycle.accepted, cycle.emitted


def compare_traces(out, ref, prompts, budgets, what: str, nodeid: str | None = None,
                   context: str = "") -> tuple[dict, list]:
    """`out`: the decoder's `generate(..., trace=True)` output; `ref`: the reference's
    (`SpecReferenceOutput`). Returns (stats {requests, cycles_compared, skipped: [str]}, the compared
    reference cycles as (request, CycleTrace) pairs, for the caller's own counts)."""
    stats = {"requests": len(prompts), "cycles_compared": 0, "skipped": []}
    compared = []
    for r, (got, want) in enumerate(zip(out.trace, ref.traces)):
        cut = want.first_near_tie
        upto = len(want.cycles) if cut is None else max(cut, 0)
        for i in range(upto):
            if i >= len(got) or fields(got[i]) != fields(want.cycles[i]):
                g = fields(got[i]) if i < len(got) else "no cycle"
                raise AssertionError(
                    f"{what}: request {r} cycle {i} differs\n  optimized (tokens, parents, accepted, emitted): {g}"
                    f"\n  reference: {fields(want.cycles[i])}\n  prompt {prompts[r]}, budget {budgets[r]}{context}"
                    f"{rerun_hint(nodeid) if nodeid else ''}")
            compared.append((r, want.cycles[i]))
        stats["cycles_compared"] += upto
        if cut is None:
            assert len(got) == len(want.cycles), \
                f"{what}: request {r} ran {len(got)} cycles, reference {len(want.cycles)}"
            assert out.tokens[r] == want.tokens, f"{what}: request {r} tokens {out.tokens[r]} != {want.tokens}"
        else:
            n = 0 if cut < 0 else 1 + sum(len(cy.emitted) for cy in want.cycles[:cut])
            assert out.tokens[r][:n] == want.tokens[:n], f"{what}: request {r} tokens before the near-tie differ"
            stats["skipped"].append(f"request {r}: {want.near_ties[0]}")
        # The trace accounts for every token: the prefill token, then each cycle's emitted ones.
        assert [len(cy.emitted) for cy in got] == out.accept_lengths[r]
        assert out.tokens[r] == out.tokens[r][:1] + [t for cy in got for t in cy.emitted]
    return stats, compared


def report(stats: dict, name: str, record_property, *, max_skipped_fraction: float, min_compared: int) -> None:
    skipped = stats["skipped"]
    record_property("trace_requests", stats["requests"])
    record_property("trace_cycles_compared", stats["cycles_compared"])
    record_property("trace_near_tie_skips", len(skipped))
    if skipped:
        warnings.warn(TraceNearTieWarning(
            f"{name}: {len(skipped)} of {stats['requests']} requests compared only up to a near-tie: "
            + "; ".join(skipped)))
    assert len(skipped) <= max_skipped_fraction * stats["requests"], \
        f"{name}: near-ties stopped {len(skipped)} of {stats['requests']} requests: {skipped}"
    assert stats["cycles_compared"] >= min_compared, \
        f"{name}: only {stats['cycles_compared']} cycles compared (at least {min_compared})"
