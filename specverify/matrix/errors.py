"""The matrix's shared vocabulary: the report schema, the column order of the profiles, the test
outcomes, the algorithm and no-dtype names, and MatrixError."""

from __future__ import annotations

SCHEMA = "specverify-matrix/1"
PROFILE_ORDER = ("cuda", "cuda-emulated", "rocm", "rocm-emulated", "cpu")
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
ALGORITHMS = ("eagle", "naive_eagle", "mtp_dflash", "target", "-")   # mtp_dflash: the MTP and DFlash chain drafts
NO_DTYPE = "-"


class MatrixError(ValueError):
    """A bad argument or an unusable input file: exit status 2, one line naming it."""
