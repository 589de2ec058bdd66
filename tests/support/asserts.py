"""Assertion helpers that say what was expected, what came, and how to re-run the case."""

from __future__ import annotations

import os

from specverify.conformance.compare import assert_close, combined_tolerance, rerun_hint  # noqa: F401


def assert_tokens_equal(actual: list[list[int]], expected: list[list[int]], what: str,
                        nodeid: str | None = None) -> None:
    """Exact token equality per request, reporting the first divergence."""
    if len(actual) != len(expected):
        raise AssertionError(f"{what}: {len(actual)} requests, expected {len(expected)}{rerun_hint(nodeid)}")
    for r, (a, e) in enumerate(zip(actual, expected)):
        if a != e:
            at = next((i for i, (x, y) in enumerate(zip(a, e)) if x != y), min(len(a), len(e)))
            raise AssertionError(
                f"{what}: request {r} diverges at token {at}: got {a[at:at + 5]}, expected {e[at:at + 5]} "
                f"(lengths {len(a)} vs {len(e)}; env SPECVERIFY_PLATFORM={os.environ.get('SPECVERIFY_PLATFORM', '')})"
                f"{rerun_hint(nodeid)}")
