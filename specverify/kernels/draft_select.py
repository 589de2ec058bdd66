"""Draft selection (docs/semantics.md 6.1) in one kernel: each row's top-k of the float32-upcast
logits and their selection-softmax probabilities of the dequantized logits.

The torch path (`ops.draft_topk`) spends some thirty small kernels a call on a GPU (the order keys,
the packed top-k, the softmax with its limits, the gathers); a draft step of a topk > 1 search
calls it once. Here one program per row walks the vocabulary twice:

1. the top-k: each entry's order key (docs/semantics.md 6.1: value descending, -0.0 == +0.0, NaN
   above every number) packed with its reversed index into one int64, so the order is plain
   descending order with no ties; a block's keys that beat the k-th best kept so far replace it
   (after the first block almost none do). The same pass takes the row maximum of z = x * scale.
2. the softmax normaliser: sum over the row of e(z) = 1 where z equals the maximum, exp(z - max)
   elsewhere (so a row whose maximum is +inf shares the mass among its +inf entries, an all -inf
   row is uniform, and a NaN anywhere makes the row NaN, as `ops.selection_softmax` defines).

The indices equal the torch path's exactly; the probabilities differ from torch's softmax by the
order of the sum and exp's rounding (a few float32 ulps), inside the tolerance of the registry
record and the reference decoder's draft near-tie margin (reference/eagle.py, REL_DRAFT_P).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specverify.kernels.launch import check_launchable

MAX_TRITON_TOPK = 16
SELECT_BLOCK_V = 2048


@triton.jit
def _select_topk_kernel(x_ptr, scale_ptr, p_ptr, idx_ptr, vocab, topk, s_xn, s_sn, s_pn, s_in,
                        HAS_SCALE: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lowest = -9223372036854775807 - 1                 # int64 extremes: below / above every packed key
    highest = 9223372036854775807
    slot = tl.arange(0, BLOCK_K)
    kept = slot < topk
    low = tl.full([BLOCK_K], lowest, tl.int64)
    best = low                                        # packed keys of the k best so far
    if HAS_SCALE:
        scale = tl.load(scale_ptr + row * s_sn)
    else:
        scale = 1.0
    zmax = float("-inf")

    # (While loops, not range(vocab): see "Loop bounds" in launch.py.)
    v0 = 0
    while v0 < vocab:
        cols = v0 + tl.arange(0, BLOCK_V)
        live = cols < vocab
        x = tl.load(x_ptr + row * s_xn + cols, mask=live, other=0.0).to(tl.float32)
        z = x * scale
        zmax = tl.maximum(zmax, tl.max(tl.where(live & (z == z), z, float("-inf")), axis=0))
        bits = tl.where(x == 0, 0.0, x).to(tl.int32, bitcast=True)
        key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        key = tl.where(x != x, 0x7FFFFFFF, key)
        packed = (key.to(tl.int64) << 32) | (vocab - 1 - cols).to(tl.int64)
        packed = tl.where(live, packed, lowest)
        floor = tl.min(tl.where(kept, best, highest), axis=0)
        top = tl.max(packed, axis=0)
        while top > floor:
            pos = tl.min(tl.where(kept & (best == floor), slot, BLOCK_K), axis=0)
            best = tl.where(slot == pos, top, best)
            packed = tl.where(packed == top, lowest, packed)
            floor = tl.min(tl.where(kept, best, highest), axis=0)
            top = tl.max(packed, axis=0)
        v0 += BLOCK_V

    total = 0.0
    v0 = 0
    while v0 < vocab:
        cols = v0 + tl.arange(0, BLOCK_V)
        live = cols < vocab
        z = tl.load(x_ptr + row * s_xn + cols, mask=live, other=0.0).to(tl.float32) * scale
        e = tl.where(z == zmax, 1.0, tl.exp(z - zmax))
        total += tl.sum(tl.where(live, e, 0.0), axis=0)
        v0 += BLOCK_V

    # The kept keys in descending order: rank r is the kept key with r kept keys above it.
    above = tl.sum(tl.where((best[None, :] > best[:, None]) & kept[None, :], 1, 0), axis=1)
    index = (vocab - 1 - (best - ((best >> 32) << 32))).to(tl.int64)   # the low half: the reversed index
    z = tl.load(x_ptr + row * s_xn + index, mask=kept, other=0.0).to(tl.float32) * scale
    p = tl.where(z == zmax, 1.0, tl.exp(z - zmax)) / total
    tl.store(idx_ptr + row * s_in + above, index, mask=kept)
    tl.store(p_ptr + row * s_pn + above, p, mask=kept)


def select_topk_triton(logits: torch.Tensor, topk: int, scale: torch.Tensor | None,
                       block_v: int = SELECT_BLOCK_V) -> tuple[torch.Tensor, torch.Tensor]:
    """(p [N, k] float32, index [N, k] int64) of logits [N, V] (no argument checks: the callers'
    own). FP8 fnuz logits are upcast first (Triton reads them natively on ROCm only), and so is
    every FP8 format under the CPU's interpreter (Triton 3.9's reads e4m3fn's NaN code as 480)."""
    check_launchable(_select_topk_kernel, logits.device)
    if logits.dtype in (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz) or (
            logits.device.type != "cuda" and logits.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)):
        logits = logits.float()
    logits = logits if logits.stride(1) == 1 else logits.contiguous()
    n, vocab = logits.shape
    p = torch.empty((n, topk), dtype=torch.float32, device=logits.device)
    index = torch.empty((n, topk), dtype=torch.int64, device=logits.device)
    if n == 0:
        return p, index
    block_v = min(block_v, max(triton.next_power_of_2(vocab), 16))
    _select_topk_kernel[(n,)](logits, scale if scale is not None else logits, p, index, vocab, topk,
                              logits.stride(0), scale.stride(0) if scale is not None else 0, p.stride(0),
                              index.stride(0), HAS_SCALE=scale is not None, BLOCK_V=block_v,
                              BLOCK_K=max(triton.next_power_of_2(topk), 2), num_warps=8 if block_v >= 2048 else 4)
    return p, index
