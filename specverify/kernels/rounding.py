"""Roundings a Triton kernel does itself so that its bits do not depend on where it runs.

A float32 -> bfloat16 store rounds to nearest even on a GPU but truncates under the Triton
interpreter (the CPU suite's Triton). A kernel whose bfloat16 output is compared bit for bit, or
must equal torch's `.to(torch.bfloat16)`, rounds with `bfloat16_nearest_even` first.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def bfloat16_nearest_even(x):
    """float32 -> bfloat16, to nearest even, in integer arithmetic: torch's `.to(torch.bfloat16)` bits
    for every number, on every GPU and in the interpreter. A NaN becomes the quiet NaN 0x7FC0 (its
    payload would otherwise carry into the exponent or the sign)."""
    bits = x.to(tl.uint32, bitcast=True)
    up = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    up = tl.where(x != x, 0x7FC0, up)
    return up.to(tl.uint16).to(tl.bfloat16, bitcast=True)
