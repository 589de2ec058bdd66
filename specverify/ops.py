"""Public speculative-decoding ops (docs/semantics.md section 6).

Each op here has a reference twin in `reference/spec.py`; the op registry in tests pairs them.
"""

from __future__ import annotations

import torch

from specverify import dtypes
from specverify.kernels.argmax import row_argmax
from specverify.platform import PlatformProfile, resolve


LOGITS_TORCH_DTYPES = {dtypes.dtype_info(d).torch_dtype for d in dtypes.LOGITS_DTYPES}


def topk_stable(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of the last dim in the order (value descending, index ascending).

    values: [N, M] float -> (vals [N, k], index [N, k] int64). torch.topk promises no tie order,
    so the k-th value is found with it and the boundary ties are resolved by index here. No host
    sync, so it is safe inside a CUDA-graph capture.
    """
    n, m = values.shape
    if k == 1:
        index = torch.argmax(values, dim=-1, keepdim=True)          # first maximal index
        return values.gather(-1, index), index
    kth = torch.topk(values, k, dim=-1).values[:, -1:]               # [N, 1]
    above = values > kth
    tied = values == kth
    room = k - above.sum(-1, keepdim=True)                           # boundary ties to take
    chosen = above | (tied & (torch.cumsum(tied.to(torch.int32), -1) <= room))
    # Compact the k chosen columns in ascending index order; others go to a spill column k.
    slot = torch.where(chosen, torch.cumsum(chosen.to(torch.int64), -1) - 1, torch.full_like(values, k, dtype=torch.int64))
    compact = torch.zeros((n, k + 1), dtype=torch.int64, device=values.device)
    compact.scatter_(-1, slot, torch.arange(m, device=values.device).expand(n, m))
    index = compact[:, :k]
    vals = values.gather(-1, index)
    order = torch.sort(vals, dim=-1, descending=True, stable=True).indices  # ties keep index order
    return vals.gather(-1, order), index.gather(-1, order)


def select_draft_topk(logits: torch.Tensor, topk: int, *, platform: PlatformProfile | str | None = None,
                      scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft selection: (p [N, k] float32, index [N, k] int64) from logits [N, V].

    topk == 1 on a profile that allows the argmax fast path: the first maximal index of the
    float32-upcast logits and p = 1, no softmax. Otherwise the softmax path: float32 softmax of
    the (dequantized) logits and its top-k in the order (probability descending, index ascending).
    scale: [N, 1] float32 FP8 dequantization scale (None = 1).
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [N, V], got shape {tuple(logits.shape)}")
    if logits.dtype not in LOGITS_TORCH_DTYPES:
        raise ValueError(f"logits dtype {logits.dtype} is not a logits dtype of the registry "
                         f"({', '.join(dtypes.LOGITS_DTYPES)})")
    vocab = logits.shape[1]
    if not 1 <= topk <= vocab:
        raise ValueError(f"topk must be in [1, {vocab}] (the vocab size), got {topk}")
    if scale is not None and scale.shape != (logits.shape[0], 1):
        raise ValueError(f"scale must have shape [{logits.shape[0]}, 1], got {tuple(scale.shape)}")
    profile = resolve(platform)
    if topk == 1 and profile.argmax_fast_path:
        # A vocab-split Triton argmax on CUDA (FP8 upcast in the kernel, no float32 copy);
        # torch.argmax elsewhere. Both return the first maximal index of the upcast.
        index = row_argmax(logits)
        return torch.ones(index.shape, dtype=torch.float32, device=logits.device), index
    x = logits.float()
    probs = torch.softmax(x if scale is None else x * scale, dim=-1)
    return topk_stable(probs, topk)
