"""The matrix's shared vocabulary: the report schema, the column order of the profiles, the test
outcomes, the algorithm and no-dtype names, and MatrixError."""

from __future__ import annotations

SCHEMA = "specverify-matrix/1"
PROFILE_ORDER = ("cuda", "cuda-emulated", "rocm", "rocm-emulated", "cpu")
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
ALGORITHMS = ("eagle", "naive_eagle", "target", "-")
NO_DTYPE = "-"


class MatrixError(ValueError):
    """A bad argument or an unusable input file: exit status 2, one line naming it."""
