"""Fused layer kernels of the decoder's forward (docs/semantics.md 6.12): the residual add
with the RMSNorm after it, the rotary embedding with the paged K/V write, and the SiLU-gated MLP
activation. Each replaces a chain of small elementwise kernels whose launches, not their bytes,
set a small model's step time (benchmarks/results/profile-small-*.md).

All three compute in float32 and round once to the output dtype:

- `add_rmsnorm`: s = x + residual (rounded to x's dtype: the residual stream the next layer adds
  to), y = s * rsqrt(mean(s^2) + eps) * weight. One program per row, the whole row in one tile.
  With `at` ([bs] lanes of x [bs, q, H]) it reads one row per request, x[b, at[b]] (+ the
  residual's), and writes [bs, 1, H]: the lane gather of a draft head's last norm rides in it.
- `rotary_kv_write`: qkv [T, Hq + 2 Hkv, D] holds each token's query, key and value heads; the
  query and key heads are rotated (rotate-half: the first and second halves of a head are the
  pair's two coordinates) by the cos / sin row of the token's position, the query heads go to the
  output, the rotated keys and the values to slot slots[t] of the K / V caches. One program per
  token, all its heads in one tile.
- `silu_mul`: gu [M, 2I] holds the gate projection then the up projection; y = silu(g) * u.
- `embed_concat`: the draft head's input rows, [table[ids[t]] | features[t]] (a copy, no
  arithmetic: the gather and the concatenate of the head's first matmul in one kernel).

The torch paths compute what the unfused model computed (`specverify/models/layers.py` before the
fusion), in the input dtype, so CPU results do not move.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from specverify.kernels.launch import check_launchable, pick_impl

SILU_BLOCK = 1024       # columns of the activation per program


def runs_triton(impl: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Triton for CUDA tensors of 16 / 32-bit floats ("auto"); float64 keeps the torch path (a
    precision mode: the kernels compute in float32)."""
    return pick_impl(impl, device) == "triton" and dtype != torch.float64


def use_triton(impl: str, x: torch.Tensor) -> bool:
    return runs_triton(impl, x.device, x.dtype)


# -- residual add + RMSNorm -------------------------------------------------------------------------

@triton.jit
def _add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, sum_ptr, lane_ptr, hidden, eps, lanes,
                        s_xm, s_rm, s_om, s_sm,
                        HAS_RESIDUAL: tl.constexpr, HAS_LANES: tl.constexpr, BLOCK_H: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)     # a long prefill's rows x stride may pass 2**31
    src = row
    if HAS_LANES:                           # request `row`'s lane: row lane_ptr[row] of its `lanes`
        src = row * lanes + tl.load(lane_ptr + row)
    cols = tl.arange(0, BLOCK_H)
    live = cols < hidden
    s = tl.load(x_ptr + src * s_xm + cols, mask=live, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + src * s_rm + cols, mask=live, other=0.0)
        s = (s.to(tl.float32) + r.to(tl.float32)).to(sum_ptr.dtype.element_ty)
    if HAS_RESIDUAL or HAS_LANES:
        tl.store(sum_ptr + row * s_sm + cols, s, mask=live)
    s = s.to(tl.float32)
    mean_sq = tl.sum(s * s, axis=0) / hidden
    # A row holding an inf or NaN has no scale: NaN throughout (as torch's CUDA rms_norm gives).
    rstd = tl.where(mean_sq < float("inf"), 1.0 / tl.sqrt(mean_sq + eps), float("nan"))
    w = tl.load(w_ptr + cols, mask=live, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * s_om + cols, s * rstd * w, mask=live)


def gather_lanes(x: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """x [bs, q, ...] -> x[b, at[b]] as [bs, 1, ...] (at: [bs] int64 in [0, q), unchecked)."""
    index = at.view((-1,) + (1,) * (x.dim() - 1)).expand((-1, 1) + tuple(x.shape[2:]))
    return x.gather(1, index)


def add_rmsnorm_impl(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                     impl: str = "auto", at: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(normed, sum) of x [..., H] (+ residual): the wrapper behind `ops.add_rmsnorm` (inputs
    already checked). Without a residual, sum is x itself. at: [bs] int64 lanes of x [bs, q, H]:
    the rows x[b, at[b]] only, (normed, sum) [bs, 1, H]."""
    if not use_triton(impl, x):
        if at is not None:
            x, residual = gather_lanes(x, at), (None if residual is None else gather_lanes(residual, at))
        s = x if residual is None else x + residual
        normed = F.rms_norm(s, (s.shape[-1],), weight, eps)
        acc = torch.float64 if s.dtype == torch.float64 else torch.float32
        finite = torch.isfinite(s.to(acc).square().mean(-1, keepdim=True))
        return torch.where(finite, normed, torch.full_like(normed, float("nan"))), s
    check_launchable(_add_rmsnorm_kernel, x.device)
    hidden = x.shape[-1]
    # Rows of x [M, H] as the kernel reads them (with lanes: request b's lane j is row b * q + j).
    x2 = x.reshape(-1, hidden)
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    r2 = None if residual is None else residual.reshape(-1, hidden)
    if r2 is not None and r2.stride(-1) != 1:
        r2 = r2.contiguous()
    rows, shape = (x2.shape[0], x.shape) if at is None else (x.shape[0], (x.shape[0], 1, hidden))
    at = None if at is None else at.contiguous()          # the kernel reads request b's lane at b
    out = torch.empty((rows, hidden), dtype=x.dtype, device=x.device)
    total = x2 if r2 is None and at is None else torch.empty_like(out)
    if rows:
        _add_rmsnorm_kernel[(rows,)](
            x2, x2 if r2 is None else r2, weight, out, total, x2 if at is None else at, hidden, float(eps),
            1 if at is None else x.shape[1],
            x2.stride(0), x2.stride(0) if r2 is None else r2.stride(0), out.stride(0), total.stride(0),
            HAS_RESIDUAL=r2 is not None, HAS_LANES=at is not None, BLOCK_H=triton.next_power_of_2(hidden))
    if residual is None and at is None:
        return out.view(shape), x
    return out.view(shape), total.view(shape)


# -- rotary embedding + paged K/V write ---------------------------------------------------------------

@triton.jit
def _rotary_kv_write_kernel(qkv_ptr, pos_ptr, cos_ptr, sin_ptr, slot_ptr, q_ptr, k_ptr, v_ptr,
                            num_q_heads, num_kv_heads, table_rows,
                            s_xt, s_xh, s_pos, s_slot, s_cs, s_qt, s_qh, s_ks, s_kh, s_vs, s_vh,
                            HALF: tl.constexpr, BLOCK_HEADS: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)       # a long prefill's tokens x stride may pass 2**31
    heads = tl.arange(0, BLOCK_HEADS)
    d = tl.arange(0, HALF)
    total = num_q_heads + 2 * num_kv_heads
    live = heads < total
    pos = tl.minimum(tl.maximum(tl.load(pos_ptr + t * s_pos), 0), table_rows - 1)     # read clamped to the tables
    slot = tl.load(slot_ptr + t * s_slot)
    cos = tl.load(cos_ptr + pos * s_cs + d).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + pos * s_cs + d).to(tl.float32)[None, :]
    base = qkv_ptr + t * s_xt + heads[:, None] * s_xh + d[None, :]
    x1 = tl.load(base, mask=live[:, None], other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF, mask=live[:, None], other=0.0).to(tl.float32)
    is_v = heads >= num_q_heads + num_kv_heads
    y1 = tl.where(is_v[:, None], x1, x1 * cos - x2 * sin)
    y2 = tl.where(is_v[:, None], x2, x2 * cos + x1 * sin)
    is_q = heads < num_q_heads
    q_off = q_ptr + t * s_qt + heads[:, None] * s_qh + d[None, :]
    tl.store(q_off, y1, mask=is_q[:, None])
    tl.store(q_off + HALF, y2, mask=is_q[:, None])
    is_k = (heads >= num_q_heads) & ~is_v
    k_off = k_ptr + slot * s_ks + (heads - num_q_heads)[:, None] * s_kh + d[None, :]
    tl.store(k_off, y1, mask=is_k[:, None])
    tl.store(k_off + HALF, y2, mask=is_k[:, None])
    v_ok = is_v & live
    v_off = v_ptr + slot * s_vs + (heads - num_q_heads - num_kv_heads)[:, None] * s_vh + d[None, :]
    tl.store(v_off, y1, mask=v_ok[:, None])
    tl.store(v_off + HALF, y2, mask=v_ok[:, None])


def rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., heads, D] rotated by cos / sin [..., 1, D/2] (x's dtype), in x's dtype."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rotary_kv_write_impl(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, num_q_heads: int,
                         impl: str = "auto") -> torch.Tensor:
    """Rotated query heads [T, Hq, D] of qkv [T, Hq + 2 Hkv, D]; writes the rotated keys and the
    values to the caches at `slots` (the wrapper behind `ops.rotary_kv_write`, inputs checked). The
    tables are read at the positions clamped to [0, P)."""
    t, heads, dim = qkv.shape
    nkv = (heads - num_q_heads) // 2
    if not use_triton(impl, qkv):
        rows = positions.clamp(0, cos.shape[0] - 1)                 # read clamped to the tables
        c = cos[rows].to(qkv.dtype)[:, None, :]
        s = sin[rows].to(qkv.dtype)[:, None, :]
        qk = rotate_half(qkv[:, :num_q_heads + nkv], c, s)
        k_cache[slots] = qk[:, num_q_heads:].to(k_cache.dtype)
        v_cache[slots] = qkv[:, num_q_heads + nkv:].to(v_cache.dtype)
        return qk[:, :num_q_heads]
    check_launchable(_rotary_kv_write_kernel, qkv.device)
    q = torch.empty((t, num_q_heads, dim), dtype=qkv.dtype, device=qkv.device)
    if t == 0:
        return q
    qkv = qkv if qkv.stride(-1) == 1 else qkv.contiguous()
    if cos.stride(-1) != 1 or sin.stride(-1) != 1 or cos.stride(0) != sin.stride(0):
        cos, sin = cos.contiguous(), sin.contiguous()
    _rotary_kv_write_kernel[(t,)](
        qkv, positions, cos, sin, slots, q, k_cache, v_cache, num_q_heads, nkv, cos.shape[0],
        qkv.stride(0), qkv.stride(1), positions.stride(0), slots.stride(0), cos.stride(0), q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        HALF=dim // 2, BLOCK_HEADS=triton.next_power_of_2(heads))
    return q


# -- SiLU-gated activation --------------------------------------------------------------------------

@triton.jit
def silu_times(g, u):
    """silu(g) * u of float32 g, u, in float32: `silu_mul`'s arithmetic, shared by every kernel that
    gates (`_silu_mul_kernel`, `norm_matmul`'s gated epilogue), so they round alike bit for bit."""
    return g / (1.0 + tl.exp(-g)) * u


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, inter, s_gm, s_om, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)     # tokens x 2I passes 2**31 at a 64K-token prefill of a big MLP
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = cols < inter
    g = tl.load(gu_ptr + row * s_gm + cols, mask=live, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * s_gm + inter + cols, mask=live, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * s_om + cols, silu_times(g, u), mask=live)


def silu_mul_impl(gate_up: torch.Tensor, impl: str = "auto", block: int = SILU_BLOCK) -> torch.Tensor:
    """silu(gate) * up of gate_up [..., 2I] -> [..., I] (the wrapper behind `ops.silu_mul`).
    block: columns per program (a power of two; the tests pass a small one so rows span blocks)."""
    inter = gate_up.shape[-1] // 2
    if not use_triton(impl, gate_up):
        return F.silu(gate_up[..., :inter]) * gate_up[..., inter:]
    check_launchable(_silu_mul_kernel, gate_up.device)
    g2 = gate_up.reshape(-1, 2 * inter)
    g2 = g2 if g2.stride(-1) == 1 else g2.contiguous()
    out = torch.empty((g2.shape[0], inter), dtype=gate_up.dtype, device=gate_up.device)
    if g2.shape[0] and inter:
        block = min(block, triton.next_power_of_2(inter))
        _silu_mul_kernel[(g2.shape[0], triton.cdiv(inter, block))](g2, out, inter, g2.stride(0), out.stride(0),
                                                                   BLOCK=block)
    return out.view(*gate_up.shape[:-1], inter)


# -- the draft head's input: embedding row | feature -----------------------------------------------

@triton.jit
def _embed_concat_kernel(ids_ptr, table_ptr, feat_ptr, out_ptr, hidden, q,
                         s_ib, s_iq, s_tab, s_fb, s_fq, s_fh, s_out,
                         BLOCK_H: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)       # token t = b * q + j of the [bs, q] batch
    b, j = t // q, t % q
    h = tl.arange(0, BLOCK_H)
    live = h < hidden
    token = tl.load(ids_ptr + b * s_ib + j * s_iq).to(tl.int64)
    row = tl.load(table_ptr + token * s_tab + h, mask=live, other=0.0)
    feat = tl.load(feat_ptr + b * s_fb + j * s_fq + h * s_fh, mask=live, other=0.0)
    tl.store(out_ptr + t * s_out + h, row, mask=live)
    tl.store(out_ptr + t * s_out + hidden + h, feat, mask=live)


def _embed_concat_torch(ids: torch.Tensor, table: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    return torch.cat([table[ids], features], dim=-1)


def embed_concat_impl(ids: torch.Tensor, table: torch.Tensor, features: torch.Tensor,
                      impl: str = "auto") -> torch.Tensor:
    """[bs, q, 2H] = [table[ids] | features] in table's dtype, features [bs, q, H] of table's
    dtype (the wrapper behind `ops.embed_concat`, inputs checked)."""
    if not use_triton(impl, table):
        return _embed_concat_torch(ids, table, features)
    check_launchable(_embed_concat_kernel, table.device)
    bs, q = ids.shape
    hidden = table.shape[1]
    out = torch.empty((bs, q, 2 * hidden), dtype=table.dtype, device=table.device)
    if bs * q == 0:
        return out
    table = table if table.stride(1) == 1 else table.contiguous()
    block = triton.next_power_of_2(hidden)
    _embed_concat_kernel[(bs * q,)](
        ids, table, features, out, hidden, q, ids.stride(0), ids.stride(1), table.stride(0), *features.stride(),
        out.stride(1), BLOCK_H=block, num_warps=4 if block >= 1024 else 1)
    return out
