"""Public speculative-decoding ops (docs/semantics.md section 6).

Each op here has a reference twin in `reference/spec.py`; the op registry in tests pairs them.
"""

from __future__ import annotations

import torch

from specverify import dtypes
from specverify.kernels.argmax import row_argmax
from specverify.platform import PlatformProfile, capturing, resolve


LOGITS_TORCH_DTYPES = {dtypes.dtype_info(d).torch_dtype for d in dtypes.LOGITS_DTYPES}


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
    integers (exact ties, NaN defined); torch.topk promises no tie order, so the k-th key is found
    with it and the boundary ties are resolved by index here. No host sync, so it is safe inside
    a CUDA-graph capture.
    """
    n, m = values.shape
    key = order_key(values)
    if k == 1:
        index = torch.argmax(key, dim=-1, keepdim=True)              # first maximal index
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


def selection_softmax(z: torch.Tensor) -> torch.Tensor:
    """float32 softmax of z [N, V] float32 with its limits defined (docs/semantics.md 6.1).

    A row whose maximum is +inf shares the mass evenly among its +inf entries; an all -inf row is
    uniform (every entry ties); a row holding NaN is NaN everywhere. Finite rows: plain softmax.
    """
    m = z.amax(-1, keepdim=True)                                     # NaN propagates
    shifted = torch.where(z == m, torch.zeros_like(z), z - m)        # max entries -> 0, even at ±inf
    return torch.softmax(shifted, dim=-1)


def _check_scale(scale, logits: torch.Tensor) -> None:
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"scale must be a torch.Tensor [N, 1] float32 or None, got {type(scale).__name__}")
    if scale.shape != (logits.shape[0], 1):
        raise ValueError(f"scale must have shape [{logits.shape[0]}, 1], got {tuple(scale.shape)}")
    if scale.dtype != torch.float32:
        raise ValueError(f"scale must be float32, got {scale.dtype}")
    if scale.device != logits.device:
        raise ValueError(f"scale is on {scale.device}, logits on {logits.device}: both must be on one device")
    # The value check reads the device; inside a CUDA-graph capture it cannot (the captured scale
    # was checked when the eager warm-up ran).
    if not capturing(scale.device) and not bool(torch.all(torch.isfinite(scale) & (scale > 0))):
        raise ValueError("scale must be finite and > 0 in every row")


def select_draft_topk(logits: torch.Tensor, topk: int, *, platform: PlatformProfile | str | None = None,
                      scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft selection: (p [N, k] float32, index [N, k] int64) from logits [N, V].

    The indices are those of the float32-upcast logits in the order (value descending, index
    ascending), NaN ranking above every number (docs/semantics.md 6.1). topk == 1 on a profile
    that allows the argmax fast path: that first index and p = 1, no softmax. Otherwise the
    softmax path: the same order, and p = the float32 softmax of the dequantized logits
    (float32(logits) * scale) at those indices (`selection_softmax` defines the ±inf limits).
    scale: [N, 1] float32, finite and > 0 (None = 1).
    """
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor [N, V], got {type(logits).__name__}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [N, V], got shape {tuple(logits.shape)}")
    if logits.dtype not in LOGITS_TORCH_DTYPES:
        raise ValueError(f"logits dtype {logits.dtype} is not a logits dtype of the registry "
                         f"({', '.join(dtypes.LOGITS_DTYPES)})")
    vocab = logits.shape[1]
    if isinstance(topk, bool) or not isinstance(topk, int):
        raise TypeError(f"topk must be an int in [1, {vocab}] (the vocab size), got {type(topk).__name__}")
    if not 1 <= topk <= vocab:
        raise ValueError(f"topk must be in [1, {vocab}] (the vocab size), got {topk}")
    if scale is not None:
        _check_scale(scale, logits)
    return draft_topk(logits, topk, resolve(platform), scale)


def draft_topk(logits: torch.Tensor, topk: int, profile: PlatformProfile,
               scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`select_draft_topk` without the argument checks, for the engine's hot path: its logits and
    scales come from the model's own delivery (valid by construction), and the scale value check
    would read the device on every draft step. Same contract, same code."""
    if topk == 1 and profile.argmax_fast_path:
        # A vocab-split Triton argmax on CUDA (FP8 upcast in the kernel, no float32 copy);
        # torch.argmax elsewhere. Both return the first maximal index of the upcast, NaN first.
        index = row_argmax(logits)
        return torch.ones(index.shape, dtype=torch.float32, device=logits.device), index
    x = logits.float()                                               # [N, V] the upcast
    probs = selection_softmax(x if scale is None else x * scale)     # [N, V] of the dequantized logits
    index = topk_stable(x, topk)[1]                                  # ordered by the upcast, never by probs
    return probs.gather(-1, index), index
