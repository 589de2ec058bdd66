"""Environment conditions an expectation can be limited to (`when = "<name>"` in
tests/expectations/*.toml): facts about the libraries of the running process that make a test fail
for a reason outside specverify, each decided by running the thing itself, not by a version table.

An entry whose condition does not hold is inactive: it marks nothing and is never reported stale.
"""

from __future__ import annotations

import functools
import os
from typing import Callable


def _interpreter_rejects_runtime_loop_bounds() -> bool:
    """Triton's interpreter (TRITON_INTERPRET=1) cannot run `for i in range(n)` when n is read at
    run time: triton 3.6's interpreter holds every scalar as a 1-element NumPy array and turns a
    range bound into an int with int(array), which NumPy >= 2.4 refuses ("only 0-dimensional arrays
    can be converted to Python scalars"). specverify's paged-attention kernel keeps that for loop,
    since compiled Triton software-pipelines for loops only (see "Loop bounds" in
    specverify/kernels/launch.py). Probed with a three-line kernel on the CPU."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    import torch
    import triton
    import triton.language as tl
    from triton.runtime.errors import InterpreterError

    @triton.jit
    def count_to(n, out_ptr):
        total = 0
        for _ in range(0, n):
            total += 1
        tl.store(out_ptr, total)

    out = torch.zeros(1, dtype=torch.int32)
    try:
        count_to[(1,)](3, out)
    except InterpreterError as e:
        if "0-dimensional arrays" in str(e):
            return True
        raise
    if int(out[0]) != 3:
        raise RuntimeError(f"the loop-bound probe kernel counted to {int(out[0])}, not 3")
    return False


CONDITIONS: dict[str, Callable[[], bool]] = {
    "triton-interpreter-rejects-runtime-loop-bounds": _interpreter_rejects_runtime_loop_bounds,
}


@functools.cache
def holds(name: str) -> bool:
    """Whether condition `name` holds in this process (probed once). KeyError for an unknown name:
    the loader refuses those first."""
    return CONDITIONS[name]()
