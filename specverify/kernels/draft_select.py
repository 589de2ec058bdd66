"""Draft selection (docs/semantics.md 6.1) in two kernels: each row's top-k of the float32-upcast
logits and their selection-softmax probabilities of the dequantized logits.

The torch path (`ops.draft_topk`) spends some thirty small kernels a call on a GPU (the order keys,
the packed top-k, the softmax with its limits, the gathers); a draft step of a topk > 1 search
calls it once. Here the vocabulary is split into blocks of BLOCK_V entries, one program per (row,
block), and a second kernel merges a row's blocks:

1. per block: each entry's order key (docs/semantics.md 6.1: value descending, -0.0 == +0.0, NaN
   above every number) packed with its reversed index into one int64, so the order is plain
   descending order with no ties; the block's BLOCK_K best keys, in order. And the block's part of
   the softmax: its maximum m_b of z = x * scale (NaN left out) and its sum s_b of e(z) = 1 where z
   equals m_b, exp(z - m_b) elsewhere.
2. per row: the k best of the blocks' kept keys (a row's k best are among its blocks' k best), the
   row maximum M = max m_b, and the normaliser sum_b s_b * f_b with f_b = 1 where m_b == M,
   exp(m_b - M) elsewhere: selection_softmax's limits hold (a row whose maximum is +inf shares the
   mass among its +inf entries, an all -inf row is uniform, a NaN anywhere makes the row NaN).

A row's work is spread over V / BLOCK_V programs instead of walking the vocabulary in one: on an H100
a top-4 of 32000 logits took ~25 us as one program per row (benchmarks/results/kernel_sequence-*.md).
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
SELECT_BLOCK_V = 1024     # vocabulary entries per program of the first kernel


LOWEST_KEY = tl.constexpr(-9223372036854775807 - 1)     # int64's least: below every packed key


@triton.jit
def packed_order_key(x, index, n):
    """The int64 whose descending order is docs/semantics.md 6.1's order of float32 values x at
    `index` in [0, n): value descending, -0.0 == +0.0, NaN above every number (NaNs tie), then index
    ascending. The order key sits in the high half and the reversed index in the low half, so no two
    entries of a row tie."""
    bits = tl.where(x == 0, 0.0, x).to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    key = tl.where(x != x, 0x7FFFFFFF, key)
    return (key.to(tl.int64) << 32) | (n - 1 - index).to(tl.int64)


@triton.jit
def best_keys(keys, BLOCK_K: tl.constexpr):
    """The BLOCK_K largest of distinct int64 keys, largest first (the largest taken away BLOCK_K
    times); LOWEST_KEY where there are fewer."""
    slot = tl.arange(0, BLOCK_K)
    best = tl.full([BLOCK_K], LOWEST_KEY, tl.int64)
    for i in tl.static_range(BLOCK_K):
        top = tl.max(keys, axis=0)
        best = tl.where(slot == i, top, best)
        keys = tl.where(keys == top, LOWEST_KEY, keys)
    return best


@triton.jit
def _select_block_kernel(x_ptr, scale_ptr, key_ptr, max_ptr, sum_ptr, vocab, s_xn, s_sn, s_kn, s_bn,
                         HAS_SCALE: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    if HAS_SCALE:
        scale = tl.load(scale_ptr + row * s_sn)
    else:
        scale = 1.0
    cols = blk * BLOCK_V + tl.arange(0, BLOCK_V)
    live = cols < vocab
    x = tl.load(x_ptr + row * s_xn + cols, mask=live, other=0.0).to(tl.float32)
    z = x * scale
    zmax = tl.max(tl.where(live & (z == z), z, float("-inf")), axis=0)
    e = tl.where(z == zmax, 1.0, tl.exp(z - zmax))
    total = tl.sum(tl.where(live, e, 0.0), axis=0)
    best = best_keys(tl.where(live, packed_order_key(x, cols, vocab), LOWEST_KEY), BLOCK_K)   # the block's, best first
    tl.store(key_ptr + row * s_kn + blk * BLOCK_K + tl.arange(0, BLOCK_K), best)
    tl.store(max_ptr + row * s_bn + blk, zmax)
    tl.store(sum_ptr + row * s_bn + blk, total)


@triton.jit
def _select_merge_kernel(x_ptr, scale_ptr, key_ptr, max_ptr, sum_ptr, p_ptr, idx_ptr, vocab, topk, num_blocks,
                         s_xn, s_sn, s_kn, s_bn, s_pn, s_in,
                         HAS_SCALE: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_C: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    if HAS_SCALE:
        scale = tl.load(scale_ptr + row * s_sn)
    else:
        scale = 1.0
    b = tl.arange(0, BLOCK_B)
    blocks = b < num_blocks
    m = tl.load(max_ptr + row * s_bn + b, mask=blocks, other=float("-inf"))
    s = tl.load(sum_ptr + row * s_bn + b, mask=blocks, other=0.0)
    zmax = tl.max(m, axis=0)
    total = tl.sum(tl.where(blocks, tl.where(m == zmax, s, s * tl.exp(m - zmax)), 0.0), axis=0)

    c = tl.arange(0, BLOCK_C)
    cand = tl.load(key_ptr + row * s_kn + c, mask=c < num_blocks * BLOCK_K, other=LOWEST_KEY)
    best = best_keys(cand, BLOCK_K)                    # the row's best keys, best first
    slot = tl.arange(0, BLOCK_K)
    kept = slot < topk
    index = (vocab - 1 - (best - ((best >> 32) << 32))).to(tl.int64)   # the low half: the reversed index
    z = tl.load(x_ptr + row * s_xn + index, mask=kept, other=0.0).to(tl.float32) * scale
    p = tl.where(z == zmax, 1.0, tl.exp(z - zmax)) / total
    tl.store(idx_ptr + row * s_in + slot, index, mask=kept)
    tl.store(p_ptr + row * s_pn + slot, p, mask=kept)


def select_topk_triton(logits: torch.Tensor, topk: int, scale: torch.Tensor | None,
                       block_v: int = SELECT_BLOCK_V) -> tuple[torch.Tensor, torch.Tensor]:
    """(p [N, k] float32, index [N, k] int64) of logits [N, V] (no argument checks: the callers'
    own). FP8 fnuz logits are upcast first (Triton reads them natively on ROCm only), and so is
    every FP8 format under the CPU's interpreter (Triton 3.9's reads e4m3fn's NaN code as 480)."""
    check_launchable(_select_block_kernel, logits.device)
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
    block_k = max(triton.next_power_of_2(topk), 2)
    num_blocks = triton.cdiv(vocab, block_v)
    keys = torch.empty((n, num_blocks * block_k), dtype=torch.int64, device=logits.device)
    maxes = torch.empty((n, num_blocks), dtype=torch.float32, device=logits.device)
    sums = torch.empty((n, num_blocks), dtype=torch.float32, device=logits.device)
    scale_arg, s_sn = (scale, scale.stride(0)) if scale is not None else (logits, 0)
    _select_block_kernel[(n, num_blocks)](logits, scale_arg, keys, maxes, sums, vocab, logits.stride(0), s_sn,
                                          keys.stride(0), maxes.stride(0), HAS_SCALE=scale is not None,
                                          BLOCK_V=block_v, BLOCK_K=block_k, num_warps=4)
    _select_merge_kernel[(n,)](logits, scale_arg, keys, maxes, sums, p, index, vocab, topk, num_blocks,
                               logits.stride(0), s_sn, keys.stride(0), maxes.stride(0), p.stride(0), index.stride(0),
                               HAS_SCALE=scale is not None, BLOCK_B=max(triton.next_power_of_2(num_blocks), 2),
                               BLOCK_C=triton.next_power_of_2(num_blocks * block_k), BLOCK_K=block_k, num_warps=4)
    return p, index
