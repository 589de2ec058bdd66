"""The flattened KV index list of naive EAGLE's fused verify (docs/semantics.md 6.6): a Triton
kernel and a torch fallback.

Naive EAGLE verifies two tokens per request, the last output token at position L and the draft
token at position L + 1 (L = seq_lens[b], the tokens cached before the verify), and runs each as
its own decode query. With s = L + 2, query 2b attends the slots req_to_token[row, 0 : s-1]
(L + 1 entries) and query 2b + 1 the slots req_to_token[row, 0 : s] (L + 2 entries), so request
b holds 2s - 1 consecutive entries of the flat list, from

    off_b = sum over i < b of (2 s_i - 1) = 2 * cumsum_exclusive(s)[b] - b.

kv_indptr [2bs + 1]: kv_indptr[0] = 0, kv_indptr[2b + 1] = off_b + s_b - 1,
kv_indptr[2b + 2] = off_b + 2 s_b - 1. kv_indices: entries [0, total) written, total =
2 * sum(L) + 3 * bs; entries past the total are left as they were. Both are caller-provided
buffers of a fixed size, so the op runs inside a captured CUDA graph (the Triton path reads
nothing back to the host). req_to_token maps cache indices to slots for any page size (a page is
page_size consecutive slots), so one code serves page_size 1 and > 1.

Triton: one program per request. Its exclusive prefix sum is a masked load of the seq_lens before
it over one power-of-two block (masked lanes 0, neutral for the sum; the original SGLang kernel
gave that load no `other=`, leaving masked lanes undefined). Programs past the batch (a padded
grid) write nothing. No entry is ever written at or past the capacity of kv_indices: when the
unchecked caller's buffer is too small the list is cut there, never memory past it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specverify.kernels.launch import check_launchable, pick_impl

BLOCK_N = 64        # list entries a program copies per loop step


@triton.jit
def _draft_kv_indices_kernel(
    table_ptr, rows_ptr, seq_lens_ptr, kv_indptr_ptr, kv_indices_ptr,
    bs, capacity,
    stride_tr, stride_tt, stride_rows, stride_sl, stride_ip, stride_ix,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
):
    bid = tl.program_id(0)
    b = bid.to(tl.int64)
    live = bid < bs                                       # a program past the batch writes nothing
    # Exclusive prefix sum of s = L + 2 over the requests before b: masked lanes load 0.
    lanes = tl.arange(0, BLOCK_B)
    before = (lanes < bid) & (lanes < bs)
    prev_lens = tl.load(seq_lens_ptr + lanes * stride_sl, mask=before, other=0).to(tl.int64)
    cum_s = tl.sum(prev_lens, axis=0) + 2 * b
    off = 2 * cum_s - b                                   # sum over i < b of (2 s_i - 1)

    row = tl.load(rows_ptr + b * stride_rows, mask=live, other=0).to(tl.int64)
    s = tl.load(seq_lens_ptr + b * stride_sl, mask=live, other=0).to(tl.int64) + 2
    tl.store(kv_indptr_ptr + (2 * b + 1) * stride_ip, off + s - 1, mask=live)
    tl.store(kv_indptr_ptr + (2 * b + 2) * stride_ip, off + 2 * s - 1, mask=live)
    tl.store(kv_indptr_ptr, off * 0, mask=live & (bid == 0))

    count = tl.where(live, 2 * s - 1, 0)                  # this request's entries
    start = tl.zeros_like(count)                          # a while loop: see "Loop bounds" in launch.py
    while start < count:
        j = start + tl.arange(0, BLOCK_N)
        in_list = j < count
        t = tl.where(j < s - 1, j, j - (s - 1))           # query 2b: 0..s-2, then query 2b+1: 0..s-1
        slot = tl.load(table_ptr + row * stride_tr + t * stride_tt, mask=in_list, other=0)
        dest = off + j
        tl.store(kv_indices_ptr + dest * stride_ix, slot, mask=in_list & (dest < capacity))
        start += BLOCK_N


def _triton_draft_kv_indices(req_to_token, rows, seq_lens, kv_indptr, kv_indices, num_programs, block_n):
    check_launchable(_draft_kv_indices_kernel, seq_lens.device)
    bs = seq_lens.shape[0]
    if bs == 0:
        kv_indptr.zero_()                                 # kv_indptr is [1]: just kv_indptr[0] = 0
        return
    grid = bs if num_programs is None else num_programs
    if grid < bs:
        raise ValueError(f"num_programs must be >= bs ({bs}), got {grid}")
    _draft_kv_indices_kernel[(grid,)](
        req_to_token, rows, seq_lens, kv_indptr, kv_indices,
        bs, kv_indices.shape[0],
        *req_to_token.stride(), rows.stride(0), seq_lens.stride(0), kv_indptr.stride(0), kv_indices.stride(0),
        BLOCK_B=triton.next_power_of_2(bs), BLOCK_N=block_n)


def _torch_draft_kv_indices(req_to_token, rows, seq_lens, kv_indptr, kv_indices):
    """The same lists by tensor ops (reads the longest list back to the host: not capture-safe)."""
    bs = seq_lens.shape[0]
    device = seq_lens.device
    s = seq_lens.to(torch.int64) + 2                                        # [bs]
    b = torch.arange(bs, device=device)
    off = 2 * (torch.cumsum(s, 0) - s) - b                                  # sum over i < b of (2 s_i - 1)
    ends = torch.stack([off + s - 1, off + 2 * s - 1], dim=1).flatten()     # [2bs]: kv_indptr[1:]
    kv_indptr[:1] = 0
    kv_indptr[1:] = ends.to(kv_indptr.dtype)
    if bs == 0:
        return
    count = 2 * s - 1                                                       # [bs] entries per request
    j = torch.arange(int(count.max()), device=device)[None, :]              # the host read
    in_list = j < count[:, None]
    t = torch.where(j < (s - 1)[:, None], j, j - (s - 1)[:, None])          # query 2b, then query 2b+1
    t = torch.where(in_list, t, 0)
    slots = req_to_token[rows.to(torch.int64)[:, None], t]                  # [bs, width]
    dest = off[:, None] + j
    keep = in_list & (dest < kv_indices.shape[0])                           # never past the capacity
    kv_indices[dest[keep]] = slots[keep].to(kv_indices.dtype)


def draft_kv_indices_impl(req_to_token: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor,
                          kv_indptr: torch.Tensor, kv_indices: torch.Tensor, impl: str = "auto", *,
                          num_programs: int | None = None, block_n: int = BLOCK_N) -> None:
    """The kernel wrapper behind `specverify.ops.create_draft_kv_indices` (inputs already checked):
    fills kv_indptr and kv_indices[0 : total) in place.

    num_programs: the Triton grid (default bs); a larger grid pads it with programs past the batch,
    which write nothing (the tests use it; the torch path ignores it)."""
    if pick_impl(impl, seq_lens.device) == "triton":
        _triton_draft_kv_indices(req_to_token, rows, seq_lens, kv_indptr, kv_indices, num_programs, block_n)
    else:
        _torch_draft_kv_indices(req_to_token, rows, seq_lens, kv_indptr, kv_indices)
