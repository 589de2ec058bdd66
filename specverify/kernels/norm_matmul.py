"""RMSNorm fused into the matmul it feeds (docs/semantics.md 6.21; issue 25): the draft head's
attention norm runs in its q|k|v projection's kernel and its MLP norm (with the residual add) in
its gate|up projection's, so a decode-size draft forward launches neither norm as a kernel of its
own.

    s = x + residual            rounded to x's dtype (x itself without a residual)
    normed = s * rsqrt(mean(s^2) + eps) * norm_weight,  computed in float32, rounded to x's dtype
    out = normed @ W            float32 sums of exact products, rounded to x's dtype

So it equals `add_rmsnorm` followed by the matmul up to the matmul's own order of summation (and
the float32 mean square's): the same roundings at the same places.

One program per (BLOCK_N output columns, BLOCK_M = 16 rows). Each loads its rows' whole K at
once, with the norm weight and its [BLOCK_N, K] slice of W^T (an nn.Linear's layout: a row of W^T
is contiguous along K, so a narrow column block still reads whole cache lines): one round trip to
memory, then the norm and one dot. Every program recomputes its rows' norm (a few KB from L2)
instead of waiting on another kernel for it. That is what makes it pay at a small hidden size and
what bounds it: K <= `MAX_HIDDEN` (the row and the slice live in registers). On an H100, at the
small preset's draft head (K 512, bs 8): the q|k|v projection 3.7 us against 5.2 us for the norm
kernel and cuBLAS's matmul, the gate|up one 4.4 against 5.7 us; at K 2048 the tiles spill and it
loses (benchmarks/results/norm_matmul-nvidia-h100-80gb-hbm3.md).

gated (a SiLU-gated MLP's gate|up, W^T = [gate rows; up rows]): each program computes its columns
of both halves, rounds each product to x's dtype, and stores silu(gate) * up (`silu_mul`'s float32
arithmetic, rounded once): the activation needs no kernel of its own, and the gate|up product is
never written.

float32 inputs take IEEE products on the FMA units (TF32 would round them); the interpreter widens
16-bit operands to float32 too (its 16-bit dot is wrong), exact products either way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specverify.kernels import fused_layers
from specverify.kernels.fused_layers import silu_times
from specverify.kernels.launch import check_launchable, interpreted
from specverify.kernels.rounding import bfloat16_nearest_even

MAX_HIDDEN = 1024       # the widest row K the kernel holds in one tile
ROW_BLOCK = 16          # rows per program (the least a dot takes)
BLOCK_SPAN = 1 << 16    # headroom for a tile's offsets past the last entry (masked, never read)


def column_block(n_cols: int) -> int:
    """BLOCK_N for N output columns, a rule of the shape alone (every device runs the same blocks):
    16 up to 1024 columns, 32 up to 4096, 64 beyond (H100: the fastest of 16 / 32 / 64 at the
    small draft head's 1024 and 2816 columns)."""
    return 16 if n_cols <= 1024 else (32 if n_cols <= 4096 else 64)


@triton.jit
def _rounded(v, dtype, TO_BF16: tl.constexpr):
    """float32 v rounded to nearest even in `dtype`. TO_BF16 (the interpreter, whose own float32 ->
    bfloat16 conversion truncates): by the bits, the GPU's conversion exactly."""
    if TO_BF16:
        return bfloat16_nearest_even(v)
    return v.to(dtype)


@triton.jit
def _product(normed, wt, WIDE: tl.constexpr):
    """[BLOCK_M, BLOCK_N] float32 sums of exact products: normed [BLOCK_M, K] @ wt [BLOCK_N, K]^T."""
    if WIDE:
        return tl.dot(normed.to(tl.float32), tl.trans(wt.to(tl.float32)), input_precision="ieee")
    return tl.dot(normed, tl.trans(wt))


@triton.jit
def _norm_matmul_kernel(x_ptr, r_ptr, g_ptr, wt_ptr, out_ptr, sum_ptr, rows, n_cols, eps,
                        s_xm, s_rm, s_wn, s_om, s_sm,
                        HIDDEN: tl.constexpr, BLOCK_K: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                        GATED: tl.constexpr, WIDE: tl.constexpr, TO_BF16: tl.constexpr,
                        LONG_OFFSETS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # GATED: W^T holds the gate's n_cols rows, then the up's n_cols; out column n is
    # silu(gate_n) * up_n of the two products, each rounded to the dtype first (6.21).
    pid_n = tl.program_id(0)
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if LONG_OFFSETS:            # an operand reaching past 2**31 entries (32-bit offsets: the faster code)
        m, n = m.to(tl.int64), n.to(tl.int64)
    k = tl.arange(0, BLOCK_K)
    mlive, nlive, klive = m < rows, n < n_cols, k < HIDDEN
    # The weight slices first: their loads do not wait on the norm.
    wmask = nlive[:, None] & klive[None, :]
    wt = tl.load(wt_ptr + n[:, None] * s_wn + k[None, :], mask=wmask, other=0.0)
    if GATED:
        wt_up = tl.load(wt_ptr + (n + n_cols)[:, None] * s_wn + k[None, :], mask=wmask, other=0.0)
    live = mlive[:, None] & klive[None, :]
    s = tl.load(x_ptr + m[:, None] * s_xm + k[None, :], mask=live, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + m[:, None] * s_rm + k[None, :], mask=live, other=0.0)
        s = _rounded(s.to(tl.float32) + r.to(tl.float32), x_ptr.dtype.element_ty, TO_BF16)
        if pid_n == 0:                      # one column block stores the residual stream
            tl.store(sum_ptr + m[:, None] * s_sm + k[None, :], s, mask=live)
    s = s.to(tl.float32)
    mean_sq = tl.sum(s * s, axis=1) / HIDDEN
    # A row holding an inf or NaN has no scale: NaN throughout (add_rmsnorm's rule).
    rstd = tl.where(mean_sq < float("inf"), 1.0 / tl.sqrt(mean_sq + eps), float("nan"))
    g = tl.load(g_ptr + k, mask=klive, other=0.0).to(tl.float32)
    normed = _rounded(s * rstd[:, None] * g[None, :], x_ptr.dtype.element_ty, TO_BF16)
    acc = _rounded(_product(normed, wt, WIDE), out_ptr.dtype.element_ty, TO_BF16)
    if GATED:                   # ops.silu_mul's arithmetic on the rounded gate and up
        gate = acc.to(tl.float32)
        up = _rounded(_product(normed, wt_up, WIDE), out_ptr.dtype.element_ty, TO_BF16).to(tl.float32)
        acc = _rounded(silu_times(gate, up), out_ptr.dtype.element_ty, TO_BF16)
    tl.store(out_ptr + m[:, None] * s_om + n[None, :], acc, mask=mlive[:, None] & nlive[None, :])


def _span(t: torch.Tensor | None) -> int:
    """One past the largest entry offset a 2-D tensor's rows reach (its row stride counts, not its
    size: a strided view of a few rows can reach far)."""
    if t is None or t.shape[0] == 0:
        return 0
    return (t.shape[0] - 1) * t.stride(0) + (t.shape[1] - 1) * t.stride(1) + 1


def norm_matmul_triton(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                       weight_t: torch.Tensor, eps: float, gated: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [..., N], sum [..., H]) of x [..., H] (+ residual), weight_t [N, H] = W^T: the kernel
    behind `ops.norm_matmul` (inputs checked; H <= MAX_HIDDEN). Without a residual, sum is x.
    gated: weight_t is [2I, H] (gate, then up) and out [..., I] = silu(gate) * up."""
    check_launchable(_norm_matmul_kernel, x.device)
    hidden, n_cols = x.shape[-1], weight_t.shape[0] // (2 if gated else 1)
    x2 = x.reshape(-1, hidden)
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    r2 = None if residual is None else residual.reshape(-1, hidden)
    if r2 is not None and r2.stride(-1) != 1:
        r2 = r2.contiguous()
    weight_t = weight_t if weight_t.stride(-1) == 1 else weight_t.contiguous()
    rows = x2.shape[0]
    out = torch.empty((rows, n_cols), dtype=x.dtype, device=x.device)
    total = x2 if r2 is None else torch.empty_like(x2)
    if rows and not n_cols and r2 is not None:
        # No column block to store the residual stream: torch's add rounds it alike (float32, nearest
        # even), and an empty W^T may have no address to hand a kernel.
        total = x2 + r2
    elif rows and n_cols:
        block_n = column_block(weight_t.shape[0])       # gated: the blocks of the unfused gate|up product
        _norm_matmul_kernel[(triton.cdiv(n_cols, block_n), triton.cdiv(rows, ROW_BLOCK))](
            x2, x2 if r2 is None else r2, norm_weight, weight_t, out, total, rows, n_cols, float(eps),
            x2.stride(0), x2.stride(0) if r2 is None else r2.stride(0), weight_t.stride(0), out.stride(0),
            total.stride(0), HIDDEN=hidden, BLOCK_K=max(16, triton.next_power_of_2(hidden)), HAS_RESIDUAL=r2 is not None,
            GATED=gated, WIDE=x.dtype == torch.float32 or interpreted(_norm_matmul_kernel),
            TO_BF16=x.dtype == torch.bfloat16 and interpreted(_norm_matmul_kernel),
            LONG_OFFSETS=max(_span(t) for t in (x2, r2, weight_t, out, total)) >= 2 ** 31 - BLOCK_SPAN,
            BLOCK_M=ROW_BLOCK, BLOCK_N=block_n, num_warps=4)
    if r2 is None:
        return out.view(*x.shape[:-1], n_cols), x
    return out.view(*x.shape[:-1], n_cols), total.view(x.shape)


def norm_matmul_impl(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                     weight_t: torch.Tensor, eps: float, impl: str = "auto",
                     gated: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The wrapper behind `ops.norm_matmul` (inputs checked): the kernel for CUDA tensors of 16 /
    32-bit floats ("auto"), else `add_rmsnorm`'s torch path and torch's matmul (and, gated,
    `silu_mul`'s torch path)."""
    if not fused_layers.runs_triton(impl, x.device, x.dtype):
        normed, total = fused_layers.add_rmsnorm_impl(x, residual, norm_weight, eps, "torch")
        out = normed @ weight_t.t()
        return (fused_layers.silu_mul_impl(out, "torch") if gated else out), total
    return norm_matmul_triton(x, residual, norm_weight, weight_t, eps, gated)
