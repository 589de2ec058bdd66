"""The total order of float values the selection ops share (docs/semantics.md 6.1): integer
order keys with NaN defined and -0.0 == +0.0, and the stable top-k over them. Pure torch, no host
syncs; `specverify.ops` exports both, and the kernels' torch paths call them from here."""

from __future__ import annotations

import torch


def order_key(values: torch.Tensor) -> torch.Tensor:
    """Integer keys [N, M] that order like the float values, with NaN defined.

    float64 -> int64 keys, any other float dtype -> int32 keys of its float32 upcast. -0.0 and
    +0.0 get one key; every NaN gets the largest key (NaN ranks above +inf; NaNs tie, so the
    index decides). Elementwise, no host sync: safe inside a CUDA-graph capture.
    """
    if values.dtype == torch.float64:
        x, int_dtype, top = values, torch.int64, torch.iinfo(torch.int64).max
    else:
        x, int_dtype, top = values.float(), torch.int32, torch.iinfo(torch.int32).max
    x = torch.where(x == 0, torch.zeros_like(x), x)                  # -0 -> +0 (NaN != 0 stays)
    bits = x.view(int_dtype)
    key = torch.where(bits < 0, bits ^ top, bits)                     # sign-magnitude -> two's order
    return torch.where(torch.isnan(x), torch.full_like(key, top), key)


def topk_stable(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of the last dim in the order (value descending, index ascending); NaN ranks above
    every number (NaNs by index), so no row ever yields a duplicate index.

    values: [N, M] float -> (vals [N, k], index [N, k] int64). The ranking runs on `order_key`
    integers (exact ties, NaN defined); torch.topk promises no tie order, so ties are resolved
    here: for 32-bit keys (every dtype but float64) by packing the index into the key, for float64
    by finding the k-th key and taking its boundary ties in index order. No host sync, so it is
    safe inside a CUDA-graph capture.
    """
    n, m = values.shape
    key = order_key(values)
    if k == 1:
        index = torch.argmax(key, dim=-1, keepdim=True)              # first maximal index
        return values.gather(-1, index), index
    if key.dtype == torch.int32:
        # One int64 per entry, all distinct: the order key in the high half, the index reversed
        # in the low half. (value descending, index ascending) is then plain descending order,
        # and torch.topk has no ties to break: no scan over the row, a handful of kernels.
        reversed_index = (m - 1) - torch.arange(m, device=values.device)
        packed = (key.to(torch.int64) << 32) | reversed_index
        top = torch.topk(packed, k, dim=-1).values                   # sorted, descending
        index = (m - 1) - (top & 0xFFFFFFFF)
        return values.gather(-1, index), index
    kth = torch.topk(key, k, dim=-1).values[:, -1:]                  # [N, 1]
    above = key > kth
    tied = key == kth
    room = k - above.sum(-1, keepdim=True)                           # boundary ties to take
    chosen = above | (tied & (torch.cumsum(tied.to(torch.int32), -1) <= room))
    # Compact the k chosen columns in ascending index order; others go to a spill column k.
    slot = torch.where(chosen, torch.cumsum(chosen.to(torch.int64), -1) - 1, torch.full_like(key, k, dtype=torch.int64))
    compact = torch.zeros((n, k + 1), dtype=torch.int64, device=values.device)
    compact.scatter_(-1, slot, torch.arange(m, device=values.device).expand(n, m))
    index = compact[:, :k]
    order = torch.sort(key.gather(-1, index), dim=-1, descending=True, stable=True).indices  # ties keep index order
    index = index.gather(-1, order)
    return values.gather(-1, index), index
