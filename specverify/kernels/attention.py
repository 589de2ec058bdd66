"""Paged attention of new queries (prefill/extend, decode, tree verify) over the KV slot pool.

Layout (the one `specverify/models/kv_cache.py` and `models/layers.py` use): K and V are
[num_slots, num_kv_heads, head_dim] indexed by token slot; `req_to_token[rows[b], t]` is the slot
of cache index t of request b (page_size is implicit in the table: a page is page_size consecutive
slots, so any page size >= 1 is one slot table). Request b's live length is
L_b = kv_lens[b] + region + q_lens[b]; query j < q_lens[b] sees every prefix index t < kv_lens[b]
and region index t = kv_lens[b] + r (r < region + q_lens[b]) where tree_mask[b, j, r]. Padded
query lanes (j >= q_lens[b]) and queries that see no key produce zeros. Nothing at t >= L_b is read.

Triton: grid (requests, kv heads); one program holds the group's heads x query lanes as rows of a
[BLOCK_M, head_dim] tile and runs an online softmax over KV blocks of BLOCK_N cache indices, the
loop bound being L_b read from the device tensors (a captured graph costs the live lengths).
float32 accumulation; the output is float32 [N, Q, num_heads, head_dim] (float64 queries: the torch
path in float64).

The two products (docs/semantics.md 6.20): every product of two inputs is exact and every sum a
float32 sum. By default they run on the FMA units (`input_precision="ieee"`), as the indexed kernel's
do, so a row the two kernels share rounds alike. `tensor_cores=True` (a draft head's rows, which no
other launch must match) takes them on the TF32 tensor cores where that keeps them exact
(`launch.tf32_exact`: bfloat16 / float16 on NVIDIA): Q.K as it is (the inputs fit TF32), P.V as three
products, P split into parts of 11, 11 and 2 significant bits, each exact. On an H100 at decode sizes
that takes the call from ~11.5 to ~6 us (benchmarks/results/kernel_sequence-*.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specverify.kernels.launch import TF32_LOW_BITS, check_launchable, pick_impl, tf32_exact

BLOCK_N = 64        # cache indices per KV block of the Triton kernel (32: 0.33 TB/s, 64: 0.54 TB/s at
                    # 8K context, bs 64, decode, H100; benchmarks/results/device_cycle-*.md)
NUM_WARPS = 4
NUM_STAGES = 3      # Triton's defaults
TF32_KEEP = tl.constexpr(0xFFFFFFFF & ~TF32_LOW_BITS)   # the bits of a float32 that a TF32 operand keeps


@triton.jit
def _scores(q, k, TF32: tl.constexpr):
    """q [M, D] . k [N, D]^T, float32, every product exact (on TF32 only where q and k fit it)."""
    if TF32:
        return tl.dot(q, tl.trans(k), input_precision="tf32")
    return tl.dot(q, tl.trans(k), input_precision="ieee")


@triton.jit
def _tf32_part(x):
    """x with the low fraction bits a TF32 operand lacks cleared: its top 11 significant bits."""
    return (x.to(tl.uint32, bitcast=True) & TF32_KEEP).to(tl.float32, bitcast=True)


@triton.jit
def _weighted_values(p, v, TF32: tl.constexpr):
    """p [M, N] float32 . v [N, D], float32, every product exact. On TF32 (v fits it, p's 24
    significant bits do not: TF32 holds 11) p is split into three parts that each fit, its top 11
    bits, the next 11 and the last 2 (each difference exact in float32): three exact products."""
    if TF32:
        p_top = _tf32_part(p)
        rest = p - p_top
        p_mid = _tf32_part(rest)
        return (tl.dot(p_top, v, input_precision="tf32") + tl.dot(p_mid, v, input_precision="tf32")
                + tl.dot(rest - p_mid, v, input_precision="tf32"))
    return tl.dot(p, v, input_precision="ieee")


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, table_ptr, rows_ptr, kv_lens_ptr, q_lens_ptr, mask_ptr,
    region, num_q, group, scale,
    s_qb, s_qj, s_qh, s_qd,
    s_ks, s_kh, s_kd,
    s_vs, s_vh, s_vd,
    s_ob, s_oj, s_oh, s_od,
    s_tr, s_tt,
    s_mb, s_mj, s_mr,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TF32: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    row = tl.load(rows_ptr + b)
    kv_len = tl.load(kv_lens_ptr + b)
    q_len = tl.load(q_lens_ptr + b)
    live_len = kv_len + region + q_len                    # cache indices [0, live_len) are live

    m = tl.arange(0, BLOCK_M)
    j = m % num_q                                         # query lane of each tile row
    head = kvh * group + m // num_q                       # query head of each tile row
    row_ok = m < group * num_q
    row_live = row_ok & (j < q_len)
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + b * s_qb + j[:, None] * s_qj + head[:, None] * s_qh + d[None, :] * s_qd,
                mask=row_live[:, None], other=0.0).to(tl.float32)

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    for start in range(0, live_len, BLOCK_N):
        t = start + tl.arange(0, BLOCK_N)
        key_live = t < live_len
        slot = tl.load(table_ptr + row * s_tr + t * s_tt, mask=key_live, other=0)
        k = tl.load(k_ptr + slot[:, None] * s_ks + kvh * s_kh + d[None, :] * s_kd,
                    mask=key_live[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + slot[:, None] * s_vs + kvh * s_vh + d[None, :] * s_vd,
                    mask=key_live[:, None], other=0.0).to(tl.float32)
        r = t - kv_len                                    # region index (< 0: prefix)
        in_region = (r >= 0) & key_live
        tree = tl.load(mask_ptr + b * s_mb + j[:, None] * s_mj + r[None, :] * s_mr,
                       mask=row_live[:, None] & in_region[None, :], other=0)
        seen = row_live[:, None] & (((r < 0)[None, :] & key_live[None, :]) | (tree != 0))
        s = _scores(q, k, TF32) * scale
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.where(seen, tl.exp(s - m_safe[:, None]), 0.0)
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + _weighted_values(p, v, TF32)
        m_i = m_new
    denom = tl.where(l_i > 0, l_i, 1.0)
    out = tl.where((l_i > 0)[:, None], acc / denom[:, None], 0.0)
    tl.store(out_ptr + b * s_ob + j[:, None] * s_oj + head[:, None] * s_oh + d[None, :] * s_od, out,
             mask=row_ok[:, None])


def _torch_attention(q, k_cache, v_cache, req_to_token, rows, kv_lens, q_lens, tree_mask, region, scale):
    n, nq, nh, hd = q.shape
    group = nh // k_cache.shape[1]
    acc = _acc_dtype(q)
    out = torch.zeros((n, nq, nh, hd), dtype=acc, device=q.device)
    if n == 0 or nq == 0:
        return out
    live_len = kv_lens + region + q_lens                                   # [N]
    width = int(live_len.max())                                            # the CPU path syncs
    if width == 0:
        return out
    t = torch.arange(width, device=q.device)
    key_live = t[None, :] < live_len[:, None]                              # [N, T]
    slots = torch.where(key_live, req_to_token[rows][:, :width], torch.zeros_like(key_live, dtype=torch.int64))
    keys = torch.where(key_live[:, :, None, None], k_cache[slots].to(acc), 0.0)      # [N, T, KVH, D]
    values = torch.where(key_live[:, :, None, None], v_cache[slots].to(acc), 0.0)
    keys = keys.repeat_interleave(group, dim=2).permute(0, 2, 1, 3)                  # [N, H, T, D]
    values = values.repeat_interleave(group, dim=2).permute(0, 2, 1, 3)
    rel = t[None, :] - kv_lens[:, None]                                    # [N, T]
    idx = rel.clamp(0, tree_mask.shape[2] - 1)[:, None, :].expand(-1, nq, -1)
    tree = torch.gather(tree_mask, 2, idx) & (rel >= 0)[:, None, :]       # [N, Q, T]
    q_live = torch.arange(nq, device=q.device)[None, :] < q_lens[:, None]  # [N, Q]
    seen = q_live[:, :, None] & key_live[:, None, :] & ((rel < 0)[:, None, :] | tree)
    seen = seen[:, None]                                                   # [N, 1, Q, T]
    scores = q.to(acc).permute(0, 2, 1, 3) @ keys.transpose(2, 3) * scale   # [N, H, Q, T]
    scores = scores.masked_fill(~seen, float("-inf"))
    top = scores.amax(-1, keepdim=True)
    top = torch.where(torch.isinf(top) & (top < 0), torch.zeros_like(top), top)
    p = torch.where(seen, torch.exp(scores - top), 0.0)
    total = p.sum(-1, keepdim=True)
    res = (p @ values) / torch.where(total > 0, total, torch.ones_like(total))
    return res.permute(0, 2, 1, 3).contiguous()


def _acc_dtype(q: torch.Tensor) -> torch.dtype:
    """float32 accumulation, float64 for float64 queries (the precision mode the tests use)."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def paged_attention_impl(q, k_cache, v_cache, req_to_token, rows, kv_lens, q_lens, tree_mask, region, scale,
                         impl: str = "auto", block_n: int = BLOCK_N, out_dtype: torch.dtype | None = None,
                         num_warps: int = NUM_WARPS, num_stages: int = NUM_STAGES,
                         tensor_cores: bool = False) -> torch.Tensor:
    """The kernel wrapper behind `specverify.ops.paged_attention` (inputs already checked).
    tree_mask: bool or int8 (the engine converts it once per forward, not per layer).
    out_dtype: the Triton path's output dtype (default float32): the kernel rounds its float32
    result once on the store, as `.to(out_dtype)` would, without a separate cast kernel.

    tensor_cores: the Triton path's products on the TF32 tensor cores where they stay exact (q's
    dtype bfloat16 / float16, an NVIDIA build); elsewhere, and on the torch path, it changes nothing.

    float64 queries always take the torch path (the Triton kernel accumulates in float32); on a
    GPU that path reads the longest live length back, so it is a precision mode, not a fast one."""
    if pick_impl(impl, q.device) == "torch" or q.dtype == torch.float64:
        return _torch_attention(q, k_cache, v_cache, req_to_token, rows, kv_lens, q_lens, tree_mask.bool(), region,
                                scale)
    check_launchable(_paged_attention_kernel, q.device)
    n, nq, nh, hd = q.shape
    nkv = k_cache.shape[1]
    group = nh // nkv
    # Every (request, query lane, head) is stored by the kernel (zeros for padded lanes).
    out = torch.empty((n, nq, nh, hd), dtype=out_dtype or torch.float32, device=q.device)
    if n == 0 or nq == 0:
        return out
    block_m = max(16, triton.next_power_of_2(group * nq))
    mask = tree_mask.to(torch.int8)
    # The kernel indexes the per-request vectors densely: strided views (a column of a packed
    # tensor) are made contiguous first.
    rows, kv_lens, q_lens = rows.contiguous(), kv_lens.contiguous(), q_lens.contiguous()
    _paged_attention_kernel[(n, nkv)](
        q, k_cache, v_cache, out, req_to_token, rows, kv_lens, q_lens, mask,
        region, nq, group, float(scale),
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(), *req_to_token.stride(),
        *mask.stride(),
        HEAD_DIM=hd, BLOCK_M=block_m, BLOCK_N=block_n, TF32=tensor_cores and tf32_exact(q.dtype),
        num_warps=num_warps, num_stages=num_stages)
    return out
