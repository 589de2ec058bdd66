"""Decode attention over an explicit slot list per query (naive EAGLE's verify queries;
docs/semantics.md 6.6).

Query i of q [N, num_heads, head_dim] attends the KV slots kv_indices[kv_indptr[i] : kv_indptr[i+1]]
of k_cache / v_cache, laid out as the paged cache holds them (`models/kv_cache.KVBuffers`):
[num_slots, num_kv_heads, head_dim] indexed by token slot; head h reads kv head
h // (num_heads // num_kv_heads) (GQA). Softmax and accumulation in float32 (float64 queries: the
torch path in float64); a query whose list is empty gives zeros. Only the listed slots are read.

Triton: grid (queries, kv heads); one program holds the group's heads as rows of a
[BLOCK_M, head_dim] tile and runs an online softmax over the list in blocks of BLOCK_N entries,
rounding its float32 result once on the store to the output dtype, to nearest even, bit for bit as
`.to(out_dtype)` rounds it (no cast kernel after it: a verify layer of naive EAGLE's cycle runs one
kernel fewer).
The list bounds are read from kv_indptr on the device, so the kernel reads nothing back to the
host and a captured graph costs the live lengths.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specverify.kernels.launch import check_launchable, pick_impl
from specverify.kernels.rounding import bfloat16_nearest_even

BLOCK_N = 64        # list entries per KV block of the Triton kernel
# Launch parameters: Triton's defaults, the paged attention kernel's. An H100 sweep
# (benchmarks/experiments/indexed_attn_sweep.py) found 2 warps without pipelining ~30% faster at
# bs 64, but then a bfloat16 verify row rounds differently from the decode row target-only
# decoding computes for the same position: greedy naive EAGLE drifted from target-only in 21 of
# 64 requests (against 0 of 64 with these), and a steered draft lost its oracle with it.
# The list loop is a while loop (see "Loop bounds" in launch.py), which Triton does not pipeline, so
# NUM_STAGES no longer acts on it. On an H100 with Triton 3.6 that loop gave the same output bit for bit as
# the pipelined for loop it replaced (and so still matches the paged attention kernel's decode rows) and ran
# faster (9x to 11x at head_dim 128, where the pipelined build spilled registers; 1.3x at 64).
NUM_WARPS, NUM_STAGES = 4, 3


@triton.jit
def _indexed_decode_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, indptr_ptr, indices_ptr,
    group, scale,
    s_qn, s_qh, s_qd,
    s_ks, s_kh, s_kd,
    s_vs, s_vh, s_vd,
    s_on, s_oh, s_od,
    s_ip, s_ix,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, OUT_BFLOAT16: tl.constexpr,
):
    i = tl.program_id(0)
    kvh = tl.program_id(1)
    start = tl.load(indptr_ptr + i * s_ip).to(tl.int64)
    end = tl.load(indptr_ptr + (i + 1) * s_ip).to(tl.int64)

    m = tl.arange(0, BLOCK_M)
    head = kvh * group + m                                # query head of each tile row
    row_ok = m < group
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + i * s_qn + head[:, None] * s_qh + d[None, :] * s_qd,
                mask=row_ok[:, None], other=0.0).to(tl.float32)

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    pos = start                                           # a while loop: see "Loop bounds" in launch.py
    while pos < end:
        p = pos + tl.arange(0, BLOCK_N)
        live = p < end
        slot = tl.load(indices_ptr + p * s_ix, mask=live, other=0).to(tl.int64)
        k = tl.load(k_ptr + slot[:, None] * s_ks + kvh * s_kh + d[None, :] * s_kd,
                    mask=live[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + slot[:, None] * s_vs + kvh * s_vh + d[None, :] * s_vd,
                    mask=live[:, None], other=0.0).to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        s = tl.where(live[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        w = tl.where(live[None, :], tl.exp(s - m_safe[:, None]), 0.0)
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(w, axis=1)
        acc = acc * alpha[:, None] + tl.dot(w, v, input_precision="ieee")
        m_i = m_new
        pos += BLOCK_N
    denom = tl.where(l_i > 0, l_i, 1.0)
    out = tl.where((l_i > 0)[:, None], acc / denom[:, None], 0.0)   # an empty list: zeros
    if OUT_BFLOAT16:
        out = bfloat16_nearest_even(out)
    # float32 stores as is; float16 rounds to nearest even on the store, here and in the interpreter.
    tl.store(out_ptr + i * s_on + head[:, None] * s_oh + d[None, :] * s_od, out, mask=row_ok[:, None])


def _torch_indexed_decode(q, k_cache, v_cache, kv_indptr, kv_indices, scale, out_dtype):
    """The same attention by tensor ops (reads the longest list back to the host)."""
    n, nh, hd = q.shape
    group = nh // k_cache.shape[1]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = torch.zeros((n, nh, hd), dtype=acc, device=q.device)
    if n == 0:
        return out.to(out_dtype)
    starts = kv_indptr[:-1].to(torch.int64)
    lens = (kv_indptr[1:].to(torch.int64) - starts).clamp(min=0)           # [N]
    width = int(lens.max())                                                 # the host read
    if width == 0:
        return out.to(out_dtype)
    t = torch.arange(width, device=q.device)
    live = t[None, :] < lens[:, None]                                       # [N, T]
    pos = torch.where(live, starts[:, None] + t[None, :], 0)
    slots = torch.where(live, kv_indices[pos].to(torch.int64), 0)          # [N, T]
    keys = torch.where(live[:, :, None, None], k_cache[slots].to(acc), 0.0)        # [N, T, KVH, D]
    values = torch.where(live[:, :, None, None], v_cache[slots].to(acc), 0.0)
    keys = keys.repeat_interleave(group, dim=2).permute(0, 2, 1, 3)                  # [N, H, T, D]
    values = values.repeat_interleave(group, dim=2).permute(0, 2, 1, 3)
    scores = (q.to(acc)[:, :, None, :] @ keys.transpose(2, 3))[:, :, 0] * scale     # [N, H, T]
    seen = live[:, None, :]
    scores = scores.masked_fill(~seen, float("-inf"))
    top = scores.amax(-1, keepdim=True)
    top = torch.where(torch.isinf(top) & (top < 0), torch.zeros_like(top), top)
    w = torch.where(seen, torch.exp(scores - top), 0.0)
    total = w.sum(-1, keepdim=True)
    res = (w[:, :, None, :] @ values)[:, :, 0] / torch.where(total > 0, total, torch.ones_like(total))
    return res.to(out_dtype)


def decode_attention_indexed_impl(q, k_cache, v_cache, kv_indptr, kv_indices, scale: float, impl: str = "auto",
                                  out_dtype: torch.dtype | None = None, block_n: int = BLOCK_N) -> torch.Tensor:
    """The kernel wrapper behind `specverify.ops.decode_attention_indexed` (inputs already checked)
    -> [N, num_heads, head_dim] of out_dtype (default q's dtype).

    float64 queries always take the torch path (the Triton kernel accumulates in float32)."""
    out_dtype = q.dtype if out_dtype is None else out_dtype
    if pick_impl(impl, q.device) == "torch" or q.dtype == torch.float64:
        return _torch_indexed_decode(q, k_cache, v_cache, kv_indptr, kv_indices, scale, out_dtype)
    check_launchable(_indexed_decode_kernel, q.device)
    n, nh, hd = q.shape
    nkv = k_cache.shape[1]
    group = nh // nkv
    # The kernel stores every row in out_dtype, rounded as `.to(out_dtype)` rounds float32.
    out = torch.empty((n, nh, hd), dtype=out_dtype, device=q.device)
    if n == 0:
        return out
    _indexed_decode_kernel[(n, nkv)](
        q, k_cache, v_cache, out, kv_indptr, kv_indices,
        group, float(scale),
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(), kv_indptr.stride(0), kv_indices.stride(0),
        HEAD_DIM=hd, BLOCK_M=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n,
        OUT_BFLOAT16=out_dtype == torch.bfloat16, num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return out
