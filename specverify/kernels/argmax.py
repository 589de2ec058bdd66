"""Row argmax with the tie contract (first maximal index of the float32 upcast), split over the
vocabulary so one row uses many programs.

Stage 1: grid (rows, blocks); each program reduces BLOCK_V columns of one row to its maximum and
the first column holding it. Stage 2: grid (rows,); the first block holding the row maximum wins,
so ties across blocks also go to the lowest index. FP8 logits are upcast inside the kernel (no
float32 copy of the row). NaN ranks above every number, +inf included, and the first NaN wins, as
in torch.argmax (docs/semantics.md 6.1).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specverify.kernels.launch import check_launchable, pick_impl


@triton.jit
def _block_argmax_kernel(
    x_ptr, part_val_ptr, part_idx_ptr,
    vocab, num_blocks,
    stride_xn, stride_pn,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)      # row * stride passes 2**31 at bs x D x V rows of a verify
    blk = tl.program_id(1)
    cols = blk * BLOCK_V + tl.arange(0, BLOCK_V)
    live = cols < vocab
    x = tl.load(x_ptr + row * stride_xn + cols, mask=live, other=0.0).to(tl.float32)
    isnan = (x != x) & live
    # NaN ranks above every number (+inf too): the block's first NaN wins, its value stays NaN.
    first_nan = tl.min(tl.where(isnan, cols, vocab + BLOCK_V), axis=0)
    # Padding is set after the upcast: an FP8 format without -inf cannot carry it through a load.
    x = tl.where(live & (x == x), x, float("-inf"))
    best = tl.max(x, axis=0)
    # First column holding the maximum; padded lanes get an index past every live one.
    first = tl.min(tl.where((x == best) & live, cols, vocab + BLOCK_V), axis=0)
    first = tl.where(first >= vocab, blk * BLOCK_V, first)     # an all -inf block: its first column
    has_nan = first_nan < vocab
    tl.store(part_val_ptr + row * stride_pn + blk, tl.where(has_nan, float("nan"), best))
    tl.store(part_idx_ptr + row * stride_pn + blk, tl.where(has_nan, first_nan, first))


@triton.jit
def _reduce_blocks_kernel(
    part_val_ptr, part_idx_ptr, out_ptr, keep_ptr, keep_rows_ptr,
    num_blocks,
    stride_pn, stride_keep, stride_keep_rows,
    BLOCK_B: tl.constexpr, KEEP: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)      # row * stride passes 2**31 at bs x D x V rows of a verify
    if KEEP:     # the kept column's row, read first so its load overlaps the parts'
        keep_row = tl.load(keep_rows_ptr + row * stride_keep_rows).to(tl.int64)
    blks = tl.arange(0, BLOCK_B)
    live = blks < num_blocks
    vals = tl.load(part_val_ptr + row * stride_pn + blks, mask=live, other=float("-inf"))
    idx = tl.load(part_idx_ptr + row * stride_pn + blks, mask=live, other=0)
    nan_blk = tl.min(tl.where((vals != vals) & live, blks, BLOCK_B), axis=0)   # first block with a NaN
    best = tl.max(tl.where(vals == vals, vals, float("-inf")), axis=0)
    winner = tl.min(tl.where((vals == best) & live, blks, BLOCK_B), axis=0)
    winner = tl.where(nan_blk < BLOCK_B, nan_blk, winner)
    index = tl.sum(tl.where(blks == winner, idx, 0), axis=0)
    tl.store(out_ptr + row, index)
    if KEEP:     # also into the kept column's row keep_rows[row]
        tl.store(keep_ptr + keep_row * stride_keep, index)


def row_argmax(x: torch.Tensor, *, impl: str = "auto", block_v: int = 4096,
               keep: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """First maximal index of each row of the float32 upcast, NaN ranking above every number.
    x: [N, V] -> [N, 1] int64.

    impl: "triton", "torch", or "auto" (Triton on CUDA, torch elsewhere).
    keep: (column [R] int64, rows [N] int64): each row's index is also written to
    column[rows[n]] (a chain draft's token into its state row: no gather, no scatter after it).
    """
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"x must be [N, V] with V >= 1, got shape {tuple(x.shape)}")
    if keep is not None:
        check_keep(keep, x)
    if pick_impl(impl, x.device) == "torch":
        out = torch.argmax(x if x.dtype in (torch.float32, torch.float16, torch.bfloat16) else x.float(),
                           dim=-1, keepdim=True)
        if keep is not None:
            write_kept(keep, out)
        return out
    check_launchable(_block_argmax_kernel, x.device)
    if x.dtype in (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz):
        x = x.float()           # Triton reads the fnuz formats natively on ROCm only
    x = x if x.stride(1) == 1 else x.contiguous()
    n, vocab = x.shape
    block_v = min(block_v, triton.next_power_of_2(vocab))
    num_blocks = triton.cdiv(vocab, block_v)
    part_val = torch.empty((n, num_blocks), dtype=torch.float32, device=x.device)
    part_idx = torch.empty((n, num_blocks), dtype=torch.int64, device=x.device)
    out = torch.empty((n, 1), dtype=torch.int64, device=x.device)
    if n == 0:
        return out
    _block_argmax_kernel[(n, num_blocks)](x, part_val, part_idx, vocab, num_blocks, x.stride(0),
                                          part_val.stride(0), BLOCK_V=block_v, num_warps=8)
    column, rows = keep if keep is not None else (out, out)
    _reduce_blocks_kernel[(n,)](part_val, part_idx, out, column, rows, num_blocks, part_val.stride(0),
                                column.stride(0), rows.stride(0),
                                BLOCK_B=triton.next_power_of_2(num_blocks), KEEP=keep is not None)
    return out


def write_kept(keep, index: torch.Tensor) -> None:
    """column[rows[n]] = index[n, 0] for keep = (column, rows): the torch form of the merge kernel's
    KEEP store (a checked keep)."""
    keep[0][keep[1]] = index[:, 0]


def check_keep(keep, x: torch.Tensor) -> None:
    """keep = (column [R] int64, rows [N] int64 in [0, R)) on x's device; the rows' range is read
    back on CPU tensors only (a device read would stall a captured step)."""
    if not (isinstance(keep, tuple) and len(keep) == 2 and all(isinstance(t, torch.Tensor) for t in keep)):
        raise TypeError(f"keep must be a (column, rows) pair of tensors, got {type(keep).__name__}")
    column, rows = keep
    if column.dim() != 1 or column.dtype != torch.int64:
        raise ValueError(f"keep's column must be a 1-D int64 tensor, got {column.dtype} {tuple(column.shape)}")
    if tuple(rows.shape) != (x.shape[0],) or rows.dtype != torch.int64:
        raise ValueError(f"keep's rows must be [{x.shape[0]}] int64 (one per row of x), got {rows.dtype} "
                         f"{tuple(rows.shape)}")
    if column.device != x.device or rows.device != x.device:
        raise ValueError(f"keep's tensors must be on x's device {x.device}, got {column.device} and {rows.device}")
    if x.device.type == "cpu" and rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= column.shape[0]):
        raise ValueError(f"keep's rows must lie in [0, {column.shape[0]}) (the column's length), got "
                         f"[{int(rows.min())}, {int(rows.max())}]")
