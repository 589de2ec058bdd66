"""The Mamba state commit after verify (docs/semantics.md 6.8): a Triton kernel and a torch fallback.

During verify a linear-recurrent layer stores its state after every draft node in an intermediate
cache src [L, bs, D, *state], indexed by the request's position r in the batch. The commit copies,
for every request with step_indices[r] >= 0,

    dst[:, dst_indices[r]] = src[:, r, step_indices[r]]          (every layer at once)

into the state cache dst [L, S, *state], indexed by slot; step -1 skips the request. A second call
with other dst_indices / step_indices (tracking slots with their own steps) is the same op.

Triton: grid (chunks of the flattened state, requests). Program (c, r) reads request r's slot and
step, and copies elements [c*BLOCK, (c+1)*BLOCK) of the state for every layer: the source row is
found by the batch position r, never by the slot. A skipped request (step -1), and, in an unchecked
call, a request whose step or slot is out of range, runs its layer loop zero times: nothing is read
or written for it, never memory outside the buffers. Every offset is computed in int64 (a layer of
a large cache holds more than 2**31 elements). The state tail is a masked load with an explicit
`other=` (the lanes past the state are never stored either). The kernel reads nothing back to the
host: capture-safe.

torch: advanced indexing over the requests that are not skipped; finding them is a host read, so
the torch path is not capture-safe (the CPU's path, and the fallback for layouts whose state dims
cannot be viewed flat).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from specverify.kernels.launch import check_launchable, pick_impl

BLOCK = 2048          # state elements a program copies per layer
NUM_WARPS = 4
MAX_GRID_REQUESTS = 65535   # the grid's second dimension: larger batches are launched in parts


@triton.jit
def _state_scatter_kernel(
    dst_ptr, src_ptr, dst_idx_ptr, step_idx_ptr,
    num_layers, num_slots, num_steps, state_numel,
    stride_dl, stride_ds, stride_sl, stride_sb, stride_sd, stride_di, stride_si,
    BLOCK: tl.constexpr,
):
    chunk = tl.program_id(0).to(tl.int64)
    r = tl.program_id(1).to(tl.int64)
    slot = tl.load(dst_idx_ptr + r * stride_di).to(tl.int64)
    step = tl.load(step_idx_ptr + r * stride_si).to(tl.int64)
    live = (step >= 0) & (step < num_steps) & (slot >= 0) & (slot < num_slots)
    layers = tl.where(live, num_layers, 0)                  # a skipped request copies nothing

    offs = chunk * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    in_state = offs < state_numel
    src_p = src_ptr + r * stride_sb + step * stride_sd + offs     # the batch position's row
    dst_p = dst_ptr + slot * stride_ds + offs
    layer = 0
    while layer < layers:                                   # a while loop: see "Loop bounds" in launch.py
        vals = tl.load(src_p, mask=in_state, other=0.0)
        tl.store(dst_p, vals, mask=in_state)
        src_p += stride_sl
        dst_p += stride_dl
        layer += 1


def flat_state(t: torch.Tensor, lead: int) -> torch.Tensor | None:
    """t [*lead dims, *state] viewed as [*lead dims, E] with unit stride over E (E = the state's
    element count), or None when the state dims cannot be viewed so. An empty tensor (whose
    strides say nothing) always views."""
    numel = math.prod(t.shape[lead:])
    try:
        flat = t.view(*t.shape[:lead], numel)
    except RuntimeError:
        return None
    return flat if numel <= 1 or flat.numel() == 0 or flat.stride(-1) == 1 else None


def _triton_state_scatter(dst, src, dst_indices, step_indices, block, num_warps):
    check_launchable(_state_scatter_kernel, dst.device)
    flat_dst, flat_src = flat_state(dst, 2), flat_state(src, 3)
    for name, flat, shape in (("dst", flat_dst, "[L, S, E]"), ("src", flat_src, "[L, bs, D, E]")):
        if flat is None:
            raise ValueError(f"{name}: impl='triton' needs the state dims of {name} viewable flat as {shape} "
                             f"with unit stride over E; pass a contiguous {name}, or impl='torch'")
    num_layers, num_slots, numel = flat_dst.shape
    bs, num_steps = flat_src.shape[1], flat_src.shape[2]
    if bs == 0 or num_layers == 0 or numel == 0:
        return
    chunks = triton.cdiv(numel, block)
    for first in range(0, bs, MAX_GRID_REQUESTS):
        part = slice(first, min(bs, first + MAX_GRID_REQUESTS))
        src_part, di, si = flat_src[:, part], dst_indices[part], step_indices[part]
        _state_scatter_kernel[(chunks, src_part.shape[1])](
            flat_dst, src_part, di, si,
            num_layers, num_slots, num_steps, numel,
            flat_dst.stride(0), flat_dst.stride(1), src_part.stride(0), src_part.stride(1), src_part.stride(2),
            di.stride(0), si.stride(0),
            BLOCK=block, num_warps=num_warps)


def _torch_state_scatter(dst, src, dst_indices, step_indices):
    """The same copies by advanced indexing (finding the live requests reads the host)."""
    slots, steps = dst_indices.to(torch.int64), step_indices.to(torch.int64)
    live = (steps >= 0) & (steps < src.shape[2]) & (slots >= 0) & (slots < dst.shape[1])
    rows = live.nonzero().flatten()                                          # the host read
    dst[:, slots[rows]] = src[:, rows, steps[rows]]                          # [L, n, *state]


def state_scatter_impl(dst: torch.Tensor, src: torch.Tensor, dst_indices: torch.Tensor, step_indices: torch.Tensor,
                       impl: str = "auto", *, block: int = BLOCK, num_warps: int = NUM_WARPS) -> None:
    """The kernel wrapper behind `specverify.ops.mamba_state_scatter` (inputs already checked):
    writes dst in place. "auto" takes Triton on CUDA when both caches' state dims view flat, else
    torch. block: state elements per program and layer (a power of two; the tests shrink it to
    cross chunk boundaries on small states)."""
    use = pick_impl(impl, dst.device)
    if use == "triton" and impl == "auto" and (flat_state(dst, 2) is None or flat_state(src, 3) is None):
        use = "torch"
    if use == "triton":
        _triton_state_scatter(dst, src, dst_indices, step_indices, block, num_warps)
    else:
        _torch_state_scatter(dst, src, dst_indices, step_indices)
