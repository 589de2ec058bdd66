"""Public speculative-decoding ops (docs/semantics.md section 6).

Each op here has a reference twin in `reference/` (spec.py, attention.py, naive_eagle_kv.py, dflash.py,
state_scatter.py, layers.py, emit.py); the op registry (`specverify/conformance/registry/`) pairs them.
"""

from __future__ import annotations

import numbers

import torch

from specverify import dtypes
from specverify.kernels.argmax import check_keep, row_argmax, write_kept
from specverify.kernels.attention import paged_attention_impl
from specverify.kernels.chain_verify import ChainRows, chain_verify_rows_impl
from specverify.kernels.dflash import dflash_verify_impl
from specverify.kernels.fused_layers import (add_rmsnorm_impl, embed_concat_impl, rotary_kv_write_impl, runs_triton,
                                             silu_mul_impl)
from specverify.kernels.draft_kv_indices import draft_kv_indices_impl
from specverify.kernels.draft_plan import DraftPlan, SlotTable, draft_plan_impl
from specverify.kernels.draft_search import (MAX_TRITON_TOPK as MAX_SEARCH_TOPK, BeamStep, expand_beams_impl,
                                             keep_candidates_impl)
from specverify.kernels.draft_select import MAX_TRITON_TOPK as MAX_SELECT_TOPK, select_topk_triton
from specverify.kernels.emit import accepted_tokens_impl, emit_impl
from specverify.kernels.indexed_attention import decode_attention_indexed_impl
from specverify.kernels.kv_commit import commit_kv_impl
from specverify.kernels.launch import check_tensor, pick_impl
from specverify.kernels.norm_matmul import MAX_HIDDEN as NORM_MATMUL_MAX_HIDDEN, norm_matmul_impl
from specverify.kernels.order import order_key as _order_key, topk_stable as _topk_stable
from specverify.kernels.state_scatter import state_scatter_impl
from specverify.kernels.token_slots import token_slots_impl
from specverify.kernels.tree import _raise_first
from specverify.platform import PlatformProfile, capturing, check_fp8_format, resolve
from specverify.validation import check_int


LOGITS_TORCH_DTYPES = {dtypes.dtype_info(d).torch_dtype for d in dtypes.LOGITS_DTYPES}


def selection_softmax(z: torch.Tensor) -> torch.Tensor:
    """float32 softmax of z [N, V] float32 with its limits defined (docs/semantics.md 6.1).

    A row whose maximum is +inf shares the mass evenly among its +inf entries; an all -inf row is
    uniform (every entry ties); a row holding NaN is NaN everywhere. Finite rows: plain softmax.
    """
    m = z.amax(-1, keepdim=True)                                     # NaN propagates
    shifted = torch.where(z == m, torch.zeros_like(z), z - m)        # max entries -> 0, even at ±inf
    return torch.softmax(shifted, dim=-1)


def order_key(values: torch.Tensor) -> torch.Tensor:
    """Integer keys of `values` (any shape, a float dtype: bfloat16, float16, float32, float64)
    that order like the values in docs/semantics.md 6.1's order: -0.0 and +0.0 one key, every NaN
    the largest key. float64 gives int64 keys, the others int32 keys of their float32 upcast."""
    _tensor("values", values, "float")
    _layer_float("values", values)
    return _order_key(values)


def topk_stable(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [N, k], index [N, k] int64): the top k of each row of `values` [N, M] (a float
    dtype) in the order (value descending, index ascending), NaN above every number, -0.0 == +0.0
    (docs/semantics.md 6.1). k: an int in [1, M]. No host sync: safe inside a CUDA-graph capture."""
    _tensor("values", values, "[N, M] float")
    if values.dim() != 2:
        raise ValueError(f"values must be [N, M], got shape {tuple(values.shape)}")
    _layer_float("values", values)
    k = check_int("k", k, 1, values.shape[1], why="at most the row's length M")
    return _topk_stable(values, k)


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
    scale: [N, 1] float32, finite and > 0 (None = 1). platform: a named profile refuses FP8 logits
    of a format it does not serve (ValueError), as `build_models` and `generate` do.
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
    profile = resolve(platform)
    if platform is not None:     # the rule of build_models and generate: a named profile's FP8 formats only
        check_fp8_format("logits dtype", logits.dtype, profile)
    return draft_topk(logits, topk, profile, scale)


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
    if logits.device.type == "cuda" and topk <= MAX_SELECT_TOPK:
        # One Triton kernel per call: the same indices, the softmax to a few float32 ulps.
        return select_topk_triton(logits, topk, scale)
    x = logits.float()                                               # [N, V] the upcast
    probs = selection_softmax(x if scale is None else x * scale)     # [N, V] of the dequantized logits
    index = topk_stable(x, topk)[1]                                  # ordered by the upcast, never by probs
    return probs.gather(-1, index), index


def draft_token(logits: torch.Tensor, profile: PlatformProfile, scale: torch.Tensor | None,
                keep: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The index [N, 1] of `draft_topk(logits, 1, ...)` without its probability: what a chain
    draft reads. On the fast path one argmax and nothing else (no probability tensor to fill).
    keep: (column [R] int64, rows [N] int64): each index also goes to column[rows[n]] (a chain
    draft's token into its state row), on the fast path by the argmax kernel itself."""
    if profile.argmax_fast_path:
        return row_argmax(logits, keep=keep)
    if keep is not None:
        check_keep(keep, logits)
    index = draft_topk(logits, 1, profile, scale)[1]
    if keep is not None:
        write_kept(keep, index)
    return index


ATTENTION_TORCH_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _int_vector(name: str, t, n: int, device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor [{n}] int64, got {type(t).__name__}")
    if tuple(t.shape) != (n,) or t.dtype != torch.int64:
        raise ValueError(f"{name} must be [{n}] int64 (one entry per request), got {tuple(t.shape)} {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, q on {device}: all inputs must be on one device")


def _check_kv_cache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, nh: int, hd: int) -> None:
    """The head size of q and the paged K / V caches' layout, dtype, device and GQA grouping."""
    if hd < 16 or hd > 256 or hd & (hd - 1):
        raise ValueError(f"q head_dim must be a power of two in [16, 256], got {hd}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 3 or t.shape[2] != hd:
            raise ValueError(f"{name} must be [num_slots, num_kv_heads, {hd}], got shape {tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise ValueError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}: all inputs must be on one device")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    nkv = k_cache.shape[1]
    if nkv < 1 or nh % nkv:
        raise ValueError(f"num_heads ({nh}) must be a multiple of k_cache's num_kv_heads ({nkv})")



def paged_attention(*, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
                    rows: torch.Tensor, kv_lens: torch.Tensor, q_lens: torch.Tensor, tree_mask: torch.Tensor,
                    region: int = 0, scale: float | None = None, impl: str = "auto",
                    tensor_cores: bool = False) -> torch.Tensor:
    """Attention of new queries over the paged KV cache -> [N, Q, num_heads, head_dim] float32.

    q: [N, Q, num_heads, head_dim] (float32 / float16 / bfloat16); k_cache, v_cache: [num_slots,
    num_kv_heads, head_dim] of q's dtype, num_heads a multiple of num_kv_heads (GQA); req_to_token:
    [max_requests, max_context] int64, the slot of each request row's cache index (any page size:
    `models/kv_cache.SlotTable` builds it); rows, kv_lens, q_lens: [N] int64; tree_mask:
    [N, Q, region + Q] bool. Request b's live length is L_b = kv_lens[b] + region + q_lens[b] <=
    max_context. Query j < q_lens[b] sees every index t < kv_lens[b] and t = kv_lens[b] + r where
    tree_mask[b, j, r] (r < region + q_lens[b]). Padded lanes (j >= q_lens[b]) and queries that see
    no key give zeros; nothing at t >= L_b is read. scale: default 1/sqrt(head_dim). float32
    accumulation. impl: "triton", "torch", or "auto" (Triton on CUDA, torch elsewhere).
    tensor_cores: the Triton kernel takes its products on the TF32 tensor cores where they stay
    exact (bfloat16 / float16 on NVIDIA; docs/semantics.md 6.20), for rows no other launch must
    round alike (a draft head's); elsewhere it changes nothing.
    The value checks (lengths, slots) read the device, so they are skipped inside a CUDA-graph capture;
    an engine's hot path calls `kernels.attention.paged_attention_impl` (no checks, same code), as it
    calls `draft_topk` rather than `select_draft_topk`.
    """
    pick_impl(impl, q.device if isinstance(q, torch.Tensor) else torch.device("cpu"))
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("req_to_token", req_to_token),
                    ("tree_mask", tree_mask)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 4:
        raise ValueError(f"q must be 4-D [N, Q, num_heads, head_dim], got shape {tuple(q.shape)}")
    if q.dtype not in ATTENTION_TORCH_DTYPES:
        raise ValueError(f"q dtype {q.dtype} is not supported (float32, float16, bfloat16)")
    n, nq, nh, hd = q.shape
    _check_kv_cache(q, k_cache, v_cache, nh, hd)
    if req_to_token.dim() != 2 or req_to_token.dtype != torch.int64 or req_to_token.device != q.device:
        raise ValueError(f"req_to_token must be [max_requests, max_context] int64 on {q.device}, "
                         f"got {tuple(req_to_token.shape)} {req_to_token.dtype} on {req_to_token.device}")
    for name, t in (("rows", rows), ("kv_lens", kv_lens), ("q_lens", q_lens)):
        _int_vector(name, t, n, q.device)
    if isinstance(region, bool) or not isinstance(region, int):
        raise TypeError(f"region must be an int >= 0, got {type(region).__name__}")
    if region < 0:
        raise ValueError(f"region must be >= 0, got {region}")
    if tuple(tree_mask.shape) != (n, nq, region + nq) or tree_mask.dtype != torch.bool:
        raise ValueError(f"tree_mask must be [{n}, {nq}, {region + nq}] bool (region + Q columns), "
                         f"got {tuple(tree_mask.shape)} {tree_mask.dtype}")
    if tree_mask.device != q.device:
        raise ValueError(f"tree_mask is on {tree_mask.device}, q on {q.device}: all inputs must be on one device")
    if scale is None:
        scale = hd ** -0.5
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float > 0 or None, got {type(scale).__name__}")
    elif not (0 < float(scale) < float("inf")):
        raise ValueError(f"scale must be finite and > 0, got {scale}")
    if not isinstance(tensor_cores, bool):
        raise TypeError(f"tensor_cores must be a bool, got {type(tensor_cores).__name__}")
    if n and not capturing(q.device):
        max_context, num_slots = req_to_token.shape[1], k_cache.shape[0]
        if bool(((rows < 0) | (rows >= req_to_token.shape[0])).any()):
            raise ValueError(f"rows must be in [0, {req_to_token.shape[0]}) (req_to_token's rows)")
        if bool(((q_lens < 0) | (q_lens > nq)).any()):
            raise ValueError(f"q_lens must be in [0, {nq}] (Q, the query lanes)")
        if bool((kv_lens < 0).any()):
            raise ValueError("kv_lens must be >= 0")
        live_len = kv_lens + region + q_lens
        if bool((live_len > max_context).any()):
            raise ValueError(f"kv_lens + region + q_lens must be <= {max_context} (req_to_token's max_context)")
        width = int(live_len.max())
        t = torch.arange(width, device=q.device)
        live_slots = req_to_token[rows][:, :width][t[None, :] < live_len[:, None]]
        if bool(((live_slots < 0) | (live_slots >= num_slots)).any()):
            raise ValueError(f"req_to_token entries of live cache indices must be slots in [0, {num_slots})")
    return paged_attention_impl(q, k_cache, v_cache, req_to_token, rows, kv_lens, q_lens, tree_mask, region,
                                float(scale), impl=impl, tensor_cores=tensor_cores)


# ---------------------------------------------------------------------------------------------
# naive EAGLE (docs/semantics.md 6.6): the flattened KV index list of the fused verify, and the
# decode attention that reads it

INDEX_TORCH_DTYPES = (torch.int32, torch.int64)


def _index_tensor(name: str, t, ndim: int, what: str, device) -> None:
    """A tensor of `ndim` dims, int32 or int64, on `device` (None: any)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {what} int32 or int64, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {what}, got shape {tuple(t.shape)}")
    if t.dtype not in INDEX_TORCH_DTYPES:
        raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, the others on {device}: all inputs must be on one device")


def _slot_table_arg(req_to_token, device) -> None:
    """A slot table argument: req_to_token [R, C], int32 or int64, C >= 1, on `device` (None: any)."""
    _index_tensor("req_to_token", req_to_token, 2, "[R, C]", device)
    if req_to_token.shape[1] == 0:
        raise ValueError(f"req_to_token must be [R, C] with C >= 1, got shape {tuple(req_to_token.shape)}")


def _value_checks(checked: bool | None, device: torch.device) -> bool:
    """Whether to run the value checks, which read tensor values on the host. checked=None: only
    where that costs no device sync (CPU tensors); True: everywhere but inside a CUDA-graph capture
    (one device read; the engines' SPECVERIFY_DEBUG_CHECKS mode); False: never."""
    if checked is not None and not isinstance(checked, bool):
        raise TypeError(f"checked must be True, False or None, got {type(checked).__name__}")
    if checked is None:
        return device.type == "cpu"
    return checked and not capturing(device)


def create_draft_kv_indices(*, req_to_token: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor,
                            kv_indptr: torch.Tensor, kv_indices: torch.Tensor, impl: str = "auto",
                            checked: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The flattened KV index list of naive EAGLE's fused verify -> (kv_indptr, kv_indices), the
    buffers passed in, filled in place.

    req_to_token: [max_requests, max_context] int32/int64, the slot of each (request row, cache
    index) (any page size); rows, seq_lens: [bs] int32/int64, request b's table row and L_b, the
    tokens cached before the verify; kv_indptr: [2*bs + 1] int32/int64; kv_indices: [capacity]
    int32/int64, capacity >= 2*sum(seq_lens) + 3*bs. With s = L + 2, request b's two verify tokens
    (positions L, L + 1) are decode queries 2b and 2b + 1 over the slots req_to_token[row, 0 : s-1]
    and req_to_token[row, 0 : s]; request b's entries start at 2*cumsum_exclusive(s)[b] - b.
    kv_indptr is written whole, kv_indices[0 : total) too; entries past the total are untouched.
    impl: "triton", "torch", or "auto" (Triton on CUDA, torch elsewhere). The Triton path reads
    nothing back to the host and writes no output of data-dependent size: capture-safe.

    Shapes, dtypes and devices are always checked. The value checks (rows inside the table,
    0 <= L, L + 2 <= max_context, the capacity, an int32 kv_indptr able to hold the total) need
    sum(seq_lens) on the host: `checked=None` (default) runs them on CPU tensors only, where that
    is free; True runs them on any device outside a CUDA-graph capture (one device read); False
    never. Unchecked, a too-small kv_indices is cut at its capacity (nothing is written past it).
    """
    pick_impl(impl, seq_lens.device if isinstance(seq_lens, torch.Tensor) else torch.device("cpu"))
    _index_tensor("seq_lens", seq_lens, 1, "[bs]", None)
    device, bs = seq_lens.device, seq_lens.shape[0]
    _index_tensor("req_to_token", req_to_token, 2, "[max_requests, max_context]", device)
    _index_tensor("rows", rows, 1, "[bs]", device)
    _index_tensor("kv_indptr", kv_indptr, 1, "[2*bs + 1]", device)
    _index_tensor("kv_indices", kv_indices, 1, "[capacity]", device)
    if rows.shape[0] != bs:
        raise ValueError(f"rows must have one entry per request (seq_lens has {bs}), got {rows.shape[0]}")
    if kv_indptr.shape[0] != 2 * bs + 1:
        raise ValueError(f"kv_indptr must have 2*bs + 1 = {2 * bs + 1} entries (two queries per request), "
                         f"got {kv_indptr.shape[0]}")
    if bs and _value_checks(checked, device):
        max_requests, max_context = req_to_token.shape
        if bool(((rows < 0) | (rows >= max_requests)).any()):
            raise ValueError(f"rows must be in [0, {max_requests}) (req_to_token's rows)")
        if bool((seq_lens < 0).any()):
            raise ValueError("seq_lens must be >= 0")
        if int(seq_lens.max()) + 2 > max_context:
            raise ValueError(f"seq_lens + 2 must be <= {max_context} (req_to_token's max_context): the verify "
                             f"tokens sit at positions L and L + 1")
        total = 2 * int(seq_lens.to(torch.int64).sum()) + 3 * bs
        if kv_indices.shape[0] < total:
            raise ValueError(f"kv_indices holds {kv_indices.shape[0]} entries, the batch needs {total} "
                             f"(2*sum(seq_lens) + 3*bs)")
        if kv_indptr.dtype == torch.int32 and total > torch.iinfo(torch.int32).max:
            raise ValueError(f"kv_indptr is int32 and cannot hold the total {total}: pass int64 buffers")
    draft_kv_indices_impl(req_to_token, rows, seq_lens, kv_indptr, kv_indices, impl)
    return kv_indptr, kv_indices


INDEXED_ATTENTION_TORCH_DTYPES = ATTENTION_TORCH_DTYPES + (torch.float64,)


def decode_attention_indexed(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_indptr: torch.Tensor,
                             kv_indices: torch.Tensor, *, scale: float, impl: str = "auto",
                             out_dtype: torch.dtype | None = None, checked: bool | None = None) -> torch.Tensor:
    """Decode attention over an explicit slot list per query -> [N, num_heads, head_dim].

    q: [N, num_heads, head_dim] (float32 / float16 / bfloat16 / float64; head_dim a power of two in
    [16, 256]); k_cache, v_cache: [num_slots, num_kv_heads, head_dim] of q's dtype (the paged
    cache's layout), num_heads a multiple of num_kv_heads (GQA); kv_indptr: [N + 1] int32/int64,
    non-decreasing; kv_indices: [capacity] int32/int64. Query i attends the slots
    kv_indices[kv_indptr[i] : kv_indptr[i + 1]]: softmax of scale * <q, k> in float32 (float64 for
    float64 queries), weighted sum of v. A query with an empty list gives zeros. scale: required,
    finite and > 0. out_dtype: the output dtype, q's (default) or float32.
    impl: "triton", "torch", or "auto" (Triton on CUDA, torch elsewhere); float64 queries always take
    the torch path. The Triton path reads the list bounds on the device: capture-safe.

    The value checks (kv_indptr non-decreasing from >= 0 up to len(kv_indices), the listed slots in
    [0, num_slots)) read the device: `checked=None` runs them on CPU tensors only, True on any
    device outside a CUDA-graph capture, False never (as `create_draft_kv_indices`).
    """
    pick_impl(impl, q.device if isinstance(q, torch.Tensor) else torch.device("cpu"))
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 3:
        raise ValueError(f"q must be 3-D [N, num_heads, head_dim], got shape {tuple(q.shape)}")
    if q.dtype not in INDEXED_ATTENTION_TORCH_DTYPES:
        raise ValueError(f"q dtype {q.dtype} is not supported (float32, float16, bfloat16, float64)")
    n, nh, hd = q.shape
    _check_kv_cache(q, k_cache, v_cache, nh, hd)
    _index_tensor("kv_indptr", kv_indptr, 1, f"[N + 1] = [{n + 1}]", q.device)
    _index_tensor("kv_indices", kv_indices, 1, "[capacity]", q.device)
    if kv_indptr.shape[0] != n + 1:
        raise ValueError(f"kv_indptr must have N + 1 = {n + 1} entries (one list per query), got {kv_indptr.shape[0]}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float > 0, got {type(scale).__name__}")
    if not (0 < float(scale) < float("inf")):
        raise ValueError(f"scale must be finite and > 0, got {scale}")
    if out_dtype is not None and out_dtype not in (q.dtype, torch.float32):
        raise ValueError(f"out_dtype must be None, q's dtype {q.dtype} or torch.float32, got {out_dtype}")
    if n and _value_checks(checked, q.device):
        bounds = kv_indptr.to(torch.int64)
        if bool(bounds[0] < 0) or bool((bounds[1:] < bounds[:-1]).any()):
            raise ValueError("kv_indptr must be non-decreasing from kv_indptr[0] >= 0")
        if int(bounds[-1]) > kv_indices.shape[0]:
            raise ValueError(f"kv_indptr[N] = {int(bounds[-1])} is past the end of kv_indices "
                             f"({kv_indices.shape[0]} entries)")
        listed = kv_indices[int(bounds[0]):int(bounds[-1])]
        if bool(((listed < 0) | (listed >= k_cache.shape[0])).any()):
            raise ValueError(f"kv_indices entries in the lists must be slots in [0, {k_cache.shape[0]}) "
                             f"(k_cache's slots)")
    return decode_attention_indexed_impl(q, k_cache, v_cache, kv_indptr, kv_indices, float(scale), impl=impl,
                                         out_dtype=out_dtype)


# ---------------------------------------------------------------------------------------------
# Mamba state commit (docs/semantics.md 6.8): the state after the last accepted node, scattered
# from the verify's intermediate cache into the state cache

STATE_TORCH_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)   # float64: the float64 models' states


def mamba_state_scatter(*, dst: torch.Tensor, src: torch.Tensor, dst_indices: torch.Tensor,
                        step_indices: torch.Tensor, impl: str = "auto", checked: bool | None = None) -> torch.Tensor:
    """Commit each request's state after its last accepted draft node -> dst, written in place.

    dst: [L, S, *state] the state cache (L layers, S slots); src: [L, bs, D, *state] of dst's
    dtype, the verify's intermediate cache (request r's state after each of its D draft nodes,
    indexed by r, the position in the batch, not by slot); dtype bfloat16, float16, float32 or
    float64 (the state dtype of float64 models);
    dst_indices, step_indices: [bs] int32/int64, request r's slot and the node whose state it
    commits (-1: commit nothing). For every r with step_indices[r] >= 0:
    dst[:, dst_indices[r]] = src[:, r, step_indices[r]], every layer, a bit-exact copy (NaN,
    infinities, -0.0, subnormals as they are). Slots no committing request names are untouched,
    and so is everything for a request with step -1 (its dst_indices entry is not read: a padded
    lane may hold any value there). Tracking slots are a second call with their own dst_indices
    and step_indices. Arguments are keyword-only: a commit with slot and step swapped must not be
    expressible by position.
    impl: "triton", "torch", or "auto" (Triton on CUDA, torch elsewhere). The Triton path reads
    nothing back to the host (capture-safe); the torch path finds the committing requests on the
    host.

    Shapes, dtypes and devices are always checked (ValueError naming the argument; TypeError for a
    non-tensor). The value checks (step in [-1, D); for committing requests a slot in [0, S), no
    slot named twice) read the device: `checked=None` (default) runs them on CPU tensors only, True
    on any device outside a CUDA-graph capture (one device read), False never (as
    `create_draft_kv_indices`). Unchecked, a request with an out-of-range step or slot writes
    nothing, and two committing requests naming one slot leave either's state there.
    """
    pick_impl(impl, dst.device if isinstance(dst, torch.Tensor) else torch.device("cpu"))
    for name, t, what in (("dst", dst, "[L, S, *state]"), ("src", src, "[L, bs, D, *state]")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor {what}, got {type(t).__name__}")
    if dst.dim() < 2:
        raise ValueError(f"dst must be [L, S, *state] (at least 2-D), got shape {tuple(dst.shape)}")
    if dst.dtype not in STATE_TORCH_DTYPES:
        raise ValueError(f"dst dtype {dst.dtype} is not a state dtype (bfloat16, float16, float32, float64)")
    if src.dtype != dst.dtype:
        raise ValueError(f"src must have dst's dtype {dst.dtype}, got {src.dtype}")
    if src.device != dst.device:
        raise ValueError(f"src is on {src.device}, dst on {dst.device}: all inputs must be on one device")
    num_layers, num_slots, state = dst.shape[0], dst.shape[1], tuple(dst.shape[2:])
    if src.dim() != dst.dim() + 1:
        raise ValueError(f"src must be [L, bs, D, *state] with dst's state dims ({dst.dim() + 1}-D), "
                         f"got shape {tuple(src.shape)}")
    if src.shape[0] != num_layers:
        raise ValueError(f"src must have dst's L = {num_layers} layers, got {src.shape[0]}")
    if tuple(src.shape[3:]) != state:
        raise ValueError(f"src must have dst's state shape {state}, got {tuple(src.shape[3:])}")
    bs, num_steps = src.shape[1], src.shape[2]
    for name, t in (("dst_indices", dst_indices), ("step_indices", step_indices)):
        _index_tensor(name, t, 1, "[bs]", dst.device)
        if t.shape[0] != bs:
            raise ValueError(f"{name} must have one entry per request (src has bs = {bs}), got {t.shape[0]}")
    if bs and _value_checks(checked, dst.device):
        steps, slots = step_indices.to(torch.int64), dst_indices.to(torch.int64)
        commits = steps >= 0
        # Skipped requests get distinct negative keys: only committing slots can collide.
        keys = torch.where(commits, slots, -1 - torch.arange(bs, device=dst.device)).sort().values
        _raise_first([
            ((steps < -1) | (steps >= num_steps),
             f"step_indices must be in [-1, D) = [-1, {num_steps}) (-1 skips the request; D = src's draft nodes)"),
            (commits & ((slots < 0) | (slots >= num_slots)),
             f"dst_indices of committing requests (step_indices >= 0) must be slots in [0, {num_slots}) (dst's "
             f"slots)"),
            (keys[1:] == keys[:-1],
             "dst_indices must be distinct among committing requests (step_indices >= 0): two requests would "
             "write one slot"),
        ])
    state_scatter_impl(dst, src, dst_indices, step_indices, impl)
    return dst


# ---------------------------------------------------------------------------------------------
# DFlash (docs/semantics.md 6.9): the greedy block verify


def dflash_correct_drafts_and_bonus(*, candidates: torch.Tensor, target_predict: torch.Tensor, impl: str = "auto",
                                    vocab_size: int | None = None,
                                    checked: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """DFlash's greedy verify of one block per request -> (correct [bs] int32, bonus [bs] int64).

    candidates: [bs, B] int32/int64, B >= 1: column 0 the block's root (the last verified token),
    columns 1..B-1 the B - 1 drafted tokens; target_predict: [bs, B] int32/int64 on the same device,
    the target's greedy token after each block position. correct[b] is the length of the leading
    run where candidates[b, 1:] == target_predict[b, :-1] (the run stops at the first mismatch): the
    number of accepted DRAFT tokens, WITHOUT the bonus. bonus[b] = target_predict[b, correct[b]].
    A cycle emits correct + 1 tokens (the accepted drafts, then the bonus). A block of one (B = 1,
    no draft) gives correct 0 and bonus target_predict[b, 0]; bs = 0 gives empty outputs.
    The sampling variant is the chain case of stochastic verify: `kernels.verify_stochastic` on
    `kernels.chain_tree(candidates[:, 0], candidates[:, 1:], ...)` (docs/semantics.md 6.9).
    impl: "triton", "torch", or "auto" (Triton on CUDA, torch elsewhere). The Triton path reads
    nothing back to the host: capture-safe.

    Shapes, dtypes and devices are always checked (ValueError naming the argument; TypeError for a
    non-tensor). The value check (token ids >= 0, and < vocab_size when it is given) reads the
    device: `checked=None` (default) runs it on CPU tensors only, True on any device outside a
    CUDA-graph capture (one device read), False never (as `create_draft_kv_indices`).
    """
    pick_impl(impl, candidates.device if isinstance(candidates, torch.Tensor) else torch.device("cpu"))
    _index_tensor("candidates", candidates, 2, "[bs, B]", None)
    _index_tensor("target_predict", target_predict, 2, "[bs, B]", candidates.device)
    if target_predict.shape != candidates.shape:
        raise ValueError(f"target_predict must have candidates' shape {tuple(candidates.shape)} (one prediction "
                         f"per block position), got {tuple(target_predict.shape)}")
    if candidates.shape[1] < 1:
        raise ValueError(f"candidates must have B >= 1 columns (the root, then B - 1 drafts), "
                         f"got shape {tuple(candidates.shape)}")
    if vocab_size is not None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
            raise TypeError(f"vocab_size must be an int >= 1 or None, got {type(vocab_size).__name__}")
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if _value_checks(checked, candidates.device) and candidates.shape[0]:
        bounds = torch.stack([candidates.min(), target_predict.min(), candidates.max(), target_predict.max()])
        lo_c, lo_p, hi_c, hi_p = bounds.to(torch.int64).tolist()             # the one device read
        for name, lo, hi in (("candidates", lo_c, hi_c), ("target_predict", lo_p, hi_p)):
            if lo < 0:
                raise ValueError(f"{name} must hold token ids >= 0, got {lo}")
            if vocab_size is not None and hi >= vocab_size:
                raise ValueError(f"{name} must hold token ids < vocab_size ({vocab_size}), got {hi}")
    return dflash_verify_impl(candidates, target_predict, impl)


# ---------------------------------------------------------------------------------------------
# Fused layer ops (docs/semantics.md 6.12): the argument checks in front of
# specverify/kernels/fused_layers.py; references in reference/layers.py. The model calls the kernel
# wrappers directly (its shapes, positions and slots come from its own slot table).

LAYER_TORCH_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def _tensor(name: str, t, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {what}, got {type(t).__name__}")


def _layer_float(name: str, t: torch.Tensor) -> None:
    if t.dtype not in LAYER_TORCH_DTYPES:
        raise ValueError(f"{name} dtype {t.dtype} is not a layer dtype (bfloat16, float16, float32, float64)")


def _same_device(name: str, t: torch.Tensor, ref: torch.Tensor, ref_name: str) -> None:
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device}, {ref_name} on {ref.device}: all inputs must be on one device")


def _check_residual_and_eps(x: torch.Tensor, residual, eps) -> None:
    """A norm's residual (None, or a tensor of x's shape, dtype and device) and its eps (a finite
    float >= 0): a TypeError / ValueError naming the argument otherwise."""
    if residual is not None:
        _tensor("residual", residual, "[..., H]")
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(f"residual must have x's shape {tuple(x.shape)} and dtype {x.dtype}, got "
                             f"{tuple(residual.shape)} {residual.dtype}")
        _same_device("residual", residual, x, "x")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0.0 <= float(eps) < float("inf")):
        raise ValueError(f"eps must be a finite float >= 0, got {eps!r}")


def add_rmsnorm(x: torch.Tensor, weight: torch.Tensor, *, residual: torch.Tensor | None = None, eps: float = 1e-6,
                at: torch.Tensor | None = None, impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of the residual sum -> (normed, sum), both [..., H] in x's dtype.

    sum = x + residual, rounded once to x's dtype (x itself when residual is None: a plain norm);
    normed = sum * rsqrt(mean(sum^2) + eps) * weight, the mean over the H entries of a row,
    computed from the rounded sum in float32 (the torch path: in x's dtype as torch's rms_norm
    does), rounded once. A row whose mean square is not finite (an inf or NaN in it) is NaN throughout in normed.
    x: [..., H] float; residual: x's shape and dtype; weight: [H] float; eps: a finite float >= 0.
    at: [bs] int64, one lane per request of x [bs, q, H], each in [0, q): only the rows x[b, at[b]]
    (+ residual[b, at[b]]) are read and normed, (normed, sum) [bs, 1, H] (a draft head's last norm
    on the one row it reads; the other lanes may hold anything).
    impl: "triton", "torch", or "auto" (Triton on CUDA, torch elsewhere; float64 always torch).
    """
    pick_impl(impl, x.device if isinstance(x, torch.Tensor) else torch.device("cpu"))
    _tensor("x", x, "[..., H]")
    _tensor("weight", weight, "[H]")
    _layer_float("x", x)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must be [..., H] with H >= 1, got shape {tuple(x.shape)}")
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"weight must be [H] = [{x.shape[-1]}], got shape {tuple(weight.shape)}")
    _layer_float("weight", weight)
    _same_device("weight", weight, x, "x")
    _check_residual_and_eps(x, residual, eps)
    if at is not None:
        _tensor("at", at, "[bs]")
        if x.dim() != 3 or at.dtype != torch.int64 or at.shape != x.shape[:1]:
            raise ValueError(f"at must be [bs] int64 for x [bs, q, H] (one lane per request), got {at.dtype} "
                             f"{tuple(at.shape)} for x {tuple(x.shape)}")
        _same_device("at", at, x, "x")
        if at.numel() and not capturing(x.device) and bool(((at < 0) | (at >= x.shape[1])).any()):
            raise ValueError(f"at must be in [0, {x.shape[1]}) (x's lanes q)")
    return add_rmsnorm_impl(x, residual, weight, float(eps), impl, at=at)


def rotary_kv_write(*, qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, num_q_heads: int,
                    impl: str = "auto", checked: bool | None = None) -> torch.Tensor:
    """Rotary embedding of the query and key heads, and the paged write of keys and values.

    qkv: [T, Hq + 2 Hkv, D] float, each token's query heads, then key heads, then value heads (D
    even); positions: [T] int32/int64, each token's row of the tables; cos, sin: [P, D/2] float
    (float64 or the layer dtype), cos / sin of position p times each frequency; slots: [T]
    int32/int64, the cache slot each token writes (a padded token: the sink slot); k_cache,
    v_cache: [S, Hkv, D] of one float dtype.

    Rotate-half: a head's entries i and i + D/2 are a pair (a, b) -> (a cos - b sin, b cos + a sin)
    at its position's row. Returns the rotated query heads [T, Hq, D] in qkv's dtype; writes the
    rotated key heads to k_cache[slots[t]] and the value heads unchanged to v_cache[slots[t]], in
    the caches' dtype. The Triton path computes in float32 from the tables' float32 rounding and
    rounds once; the torch path computes in qkv's dtype with the tables rounded to it. Two tokens
    naming one slot leave either's K / V there (the sink collects every padded token's).
    Arguments are keyword-only.
    """
    pick_impl(impl, qkv.device if isinstance(qkv, torch.Tensor) else torch.device("cpu"))
    for name, t, what in (("qkv", qkv, "[T, Hq + 2 Hkv, D]"), ("positions", positions, "[T]"), ("cos", cos, "[P, D/2]"),
                          ("sin", sin, "[P, D/2]"), ("k_cache", k_cache, "[S, Hkv, D]"),
                          ("v_cache", v_cache, "[S, Hkv, D]"), ("slots", slots, "[T]")):
        _tensor(name, t, what)
    if isinstance(num_q_heads, bool) or not isinstance(num_q_heads, int):
        raise TypeError(f"num_q_heads must be an int, got {type(num_q_heads).__name__}")
    _layer_float("qkv", qkv)
    if qkv.dim() != 3 or qkv.shape[2] % 2 or qkv.shape[2] == 0:
        raise ValueError(f"qkv must be [T, Hq + 2 Hkv, D] with D even and >= 2, got shape {tuple(qkv.shape)}")
    t, heads, dim = qkv.shape
    if k_cache.dim() != 3 or k_cache.shape[2] != dim:
        raise ValueError(f"k_cache must be [S, Hkv, D] with qkv's D = {dim}, got shape {tuple(k_cache.shape)}")
    nkv = k_cache.shape[1]
    if not 1 <= num_q_heads or heads != num_q_heads + 2 * nkv:
        raise ValueError(f"num_q_heads must be >= 1 with qkv's heads = num_q_heads + 2 Hkv (Hkv = k_cache's "
                         f"{nkv}): qkv has {heads} heads, num_q_heads is {num_q_heads}")
    if v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"v_cache must have k_cache's shape {tuple(k_cache.shape)} and dtype {k_cache.dtype}, "
                         f"got {tuple(v_cache.shape)} {v_cache.dtype}")
    _layer_float("k_cache", k_cache)
    for name, table in (("cos", cos), ("sin", sin)):
        _layer_float(name, table)
        if table.dim() != 2 or table.shape[1] != dim // 2 or table.shape[0] == 0:
            raise ValueError(f"{name} must be [P, D/2] = [P >= 1, {dim // 2}], got shape {tuple(table.shape)}")
    if sin.shape != cos.shape or sin.dtype != cos.dtype:
        raise ValueError(f"sin must have cos's shape {tuple(cos.shape)} and dtype {cos.dtype}, got "
                         f"{tuple(sin.shape)} {sin.dtype}")
    for name, v in (("positions", positions), ("slots", slots)):
        _index_tensor(name, v, 1, "[T]", qkv.device)
        if v.shape != (t,):
            raise ValueError(f"{name} must be [T] = [{t}] (one per token of qkv), got shape {tuple(v.shape)}")
    for name, v in (("cos", cos), ("sin", sin), ("k_cache", k_cache), ("v_cache", v_cache)):
        _same_device(name, v, qkv, "qkv")
    if t and _value_checks(checked, qkv.device):
        _raise_first([
            ((positions < 0) | (positions >= cos.shape[0]), f"positions must be rows of the tables, in [0, {cos.shape[0]})"),
            ((slots < 0) | (slots >= k_cache.shape[0]), f"slots must be cache slots, in [0, {k_cache.shape[0]})"),
        ])
    return rotary_kv_write_impl(qkv, positions, cos, sin, k_cache, v_cache, slots, num_q_heads, impl)


def embed_concat(*, ids: torch.Tensor, table: torch.Tensor, features: torch.Tensor, impl: str = "auto",
                 checked: bool | None = None) -> torch.Tensor:
    """The draft head's input rows (docs/semantics.md 6.12): [bs, q, 2H] = the embedding row of
    each token, then its feature, in table's dtype; a copy.

    ids [bs, q] int32 / int64: token ids, in [0, V); table [V, H] float (a layer dtype): the
    embedding; features [bs, q, H] of table's dtype and device (any strides). checked: the value
    check (ids inside the table); None runs it on CPU tensors only. Arguments are keyword-only.
    """
    _index_tensor("ids", ids, 2, "[bs, q]", None)
    device = ids.device
    pick_impl(impl, device)
    _tensor("table", table, "[V, H] float")
    if table.dim() != 2 or table.shape[0] < 1 or table.shape[1] < 1:
        raise ValueError(f"table must be [V, H] with V, H >= 1, got shape {tuple(table.shape)}")
    _layer_float("table", table)
    _same_device("table", table, ids, "ids")
    bs, q = ids.shape
    _tensor("features", features, "[bs, q, H] float")
    if features.shape != (bs, q, table.shape[1]):
        raise ValueError(f"features must be [bs, q, H] = [{bs}, {q}, {table.shape[1]}] (one per id, the table's "
                         f"width), got shape {tuple(features.shape)}")
    if features.dtype != table.dtype:
        raise ValueError(f"features must have table's dtype {table.dtype}, got {features.dtype}")
    _same_device("features", features, ids, "ids")
    if _value_checks(checked, device) and ids.numel():
        _raise_first([((ids < 0) | (ids >= table.shape[0]), f"ids must be rows of the table, in [0, {table.shape[0]})")])
    return embed_concat_impl(ids, table, features, impl)


def silu_mul(gate_up: torch.Tensor, *, impl: str = "auto") -> torch.Tensor:
    """The SiLU-gated MLP activation: gate_up [..., 2I] float holds the gate projection then the
    up projection; returns silu(gate) * up [..., I] in gate_up's dtype (silu(g) = g / (1 + e^-g)).
    The Triton path computes in float32 and rounds once; the torch path rounds silu(g) to the
    dtype before the product (as the unfused model did). NaN and inf propagate (silu(-inf) is NaN).
    """
    pick_impl(impl, gate_up.device if isinstance(gate_up, torch.Tensor) else torch.device("cpu"))
    _tensor("gate_up", gate_up, "[..., 2I]")
    _layer_float("gate_up", gate_up)
    if gate_up.dim() < 1 or gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up must be [..., 2I] (an even last dim: gate, then up), got shape "
                         f"{tuple(gate_up.shape)}")
    return silu_mul_impl(gate_up, impl)


def norm_matmul(x: torch.Tensor, norm_weight: torch.Tensor, weight_t: torch.Tensor, *,
                residual: torch.Tensor | None = None, eps: float = 1e-6, gated: bool = False,
                impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of the residual sum, then a matmul -> (out [..., N], sum [..., H]) in x's dtype
    (docs/semantics.md 6.21): `add_rmsnorm`'s (normed, sum), then out = normed @ weight_t^T, the
    normed rounded to x's dtype before the product, float32 sums of exact products (the torch
    path: torch's matmul in x's dtype), rounded once. One kernel on a GPU.
    x: [..., H] float, 1 <= H <= 1024 on the Triton path (its whole row in one tile); residual:
    x's shape and dtype; norm_weight: [H] float; weight_t: [N, H] of x's dtype (W^T, an
    nn.Linear's weight); eps: a finite float >= 0.
    gated: weight_t is a SiLU-gated MLP's [2I, H] (the gate's I rows, then the up's) and out is
    `silu_mul` of the product: [..., I] = silu(gate) * up, each half rounded to x's dtype first,
    as the two ops in turn would give; N must be even.
    impl: "triton", "torch", or "auto" (Triton on CUDA, torch elsewhere; float64 always torch).
    """
    pick_impl(impl, x.device if isinstance(x, torch.Tensor) else torch.device("cpu"))
    _tensor("x", x, "[..., H]")
    _tensor("norm_weight", norm_weight, "[H]")
    _tensor("weight_t", weight_t, "[N, H]")
    _layer_float("x", x)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must be [..., H] with H >= 1, got shape {tuple(x.shape)}")
    hidden = x.shape[-1]
    if runs_triton(impl, x.device, x.dtype) and hidden > NORM_MATMUL_MAX_HIDDEN:
        raise ValueError(f"x's H must be <= {NORM_MATMUL_MAX_HIDDEN} on the Triton path (its whole row in one "
                         f"tile), got {hidden}; use impl='torch'")
    if norm_weight.shape != (hidden,):
        raise ValueError(f"norm_weight must be [H] = [{hidden}], got shape {tuple(norm_weight.shape)}")
    _layer_float("norm_weight", norm_weight)
    _same_device("norm_weight", norm_weight, x, "x")
    if weight_t.dim() != 2 or weight_t.shape[1] != hidden or weight_t.dtype != x.dtype:
        raise ValueError(f"weight_t must be [N, H] = [N, {hidden}] of x's dtype {x.dtype}, got "
                         f"{tuple(weight_t.shape)} {weight_t.dtype}")
    _same_device("weight_t", weight_t, x, "x")
    _check_residual_and_eps(x, residual, eps)
    if not isinstance(gated, bool):
        raise TypeError(f"gated must be a bool, got {type(gated).__name__}")
    if gated and weight_t.shape[0] % 2:
        raise ValueError(f"weight_t must be [2I, H] (an even N: gate, then up) when gated, got N = {weight_t.shape[0]}")
    return norm_matmul_impl(x, residual, norm_weight, weight_t, float(eps), impl, gated)


def _count(name: str, v, least: int, why: str = "") -> int:
    """An integer argument >= least as a Python int: TypeError for a non-integer (bool included),
    ValueError below the bound."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an int >= {least}, got {type(v).__name__} {v!r}")
    if v < least:
        raise ValueError(f"{name} must be an int >= {least}{' ' + why if why else ''}, got {v!r}")
    return int(v)


def expand_beams(beam_scores: torch.Tensor, child_probs: torch.Tensor, child_tokens: torch.Tensor,
                 ancestors: torch.Tensor, hidden: torch.Tensor, *, step: int, impl: str = "auto") -> BeamStep:
    """One step >= 1 of the draft-tree search (docs/semantics.md 6.13): expand, score, select, gather.

    beam_scores [bs, k] float32 (each beam's path score), child_probs [bs, k, k] float32 and
    child_tokens [bs, k, k] int64 (row p: beam p's top-k children), ancestors [bs, k, R] bool
    (each beam's draft-region entries), hidden [bs, k, H] float (each beam's draft hidden state).
    Candidate p*k + c scores beam_scores[p] * child_probs[p, c] (one float32 product); the k best in
    (score descending, index ascending; NaN above every number, -0 == +0) are the new beams, best
    first. Returns a BeamStep: their scores, tokens, flat indices k + (step-1)k^2 + chosen, parent
    beams, ancestor rows (the parent's row plus the beam's own entry step*k + q where that is < R),
    the parents' hidden states, and every candidate's score [bs, k*k].
    impl: "triton", "torch", or "auto" (Triton on CUDA for topk <= 16, torch elsewhere).
    """
    pick_impl(impl, beam_scores.device if isinstance(beam_scores, torch.Tensor) else torch.device("cpu"))
    for name, t, what in (("beam_scores", beam_scores, "[bs, k] float32"), ("child_probs", child_probs, "[bs, k, k] float32"),
                          ("child_tokens", child_tokens, "[bs, k, k] int64"), ("ancestors", ancestors, "[bs, k, R] bool"),
                          ("hidden", hidden, "[bs, k, H]")):
        _tensor(name, t, what)
    if beam_scores.dim() != 2 or beam_scores.shape[1] < 1:
        raise ValueError(f"beam_scores must be [bs, k] with k >= 1, got shape {tuple(beam_scores.shape)}")
    bs, k = beam_scores.shape
    device = beam_scores.device
    if impl == "triton" and k > MAX_SEARCH_TOPK:
        raise ValueError(f"impl='triton' takes topk <= {MAX_SEARCH_TOPK} (the kernel ranks k^2 candidates in one "
                         f"tile), got k = {k}; use impl='torch' or 'auto'")
    if ancestors.dim() != 3:
        raise ValueError(f"ancestors must be [bs, k, R] = [{bs}, {k}, R], got shape {tuple(ancestors.shape)}")
    if hidden.dim() != 3:
        raise ValueError(f"hidden must be [bs, k, H] = [{bs}, {k}, H], got shape {tuple(hidden.shape)}")
    check_tensor("beam_scores", beam_scores, (bs, k), torch.float32, device)
    check_tensor("child_probs", child_probs, (bs, k, k), torch.float32, device)
    check_tensor("child_tokens", child_tokens, (bs, k, k), torch.int64, device)
    check_tensor("ancestors", ancestors, (bs, k, ancestors.shape[2]), torch.bool, device)
    check_tensor("hidden", hidden, (bs, k, hidden.shape[2]), hidden.dtype, device)
    if hidden.dtype not in LAYER_TORCH_DTYPES:
        raise ValueError(f"hidden must be a float tensor of a compute dtype (bfloat16, float16, float32, float64), "
                         f"got {hidden.dtype}")
    step = _count("step", step, 1, "(step 0 is the draft-extend's own top-k)")
    return expand_beams_impl(beam_scores, child_probs, child_tokens, ancestors, hidden, step, impl)


def keep_candidates(scores: torch.Tensor, tokens: torch.Tensor, *, keep: int,
                    impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """The end of the draft-tree search (docs/semantics.md 6.13): the `keep` best candidates, in
    flat order -> (kept_flat [bs, keep] int64, kept_tokens [bs, keep] int64).

    scores [bs, M] float32: every candidate's path score in flat order (step 0's k, then each
    step's k^2); tokens [bs, M] int64: each candidate's token. The best are taken in the order of
    6.1 (score descending, index ascending; -0 == +0, NaN above every number, NaNs by index);
    kept_flat lists their flat indices ascending, kept_tokens their tokens. keep: an int in [0, M].
    impl: "triton", "torch", or "auto" (Triton on CUDA, torch elsewhere).
    """
    pick_impl(impl, scores.device if isinstance(scores, torch.Tensor) else torch.device("cpu"))
    _tensor("scores", scores, "[bs, M] float32")
    _tensor("tokens", tokens, "[bs, M] int64")
    if scores.dim() != 2:
        raise ValueError(f"scores must be [bs, M] float32, got shape {tuple(scores.shape)}")
    check_tensor("scores", scores, tuple(scores.shape), torch.float32, None)
    check_tensor("tokens", tokens, tuple(scores.shape), torch.int64, scores.device)
    keep = _count("keep", keep, 0)
    if keep > scores.shape[1]:
        raise ValueError(f"keep must be in [0, {scores.shape[1]}] (M, the candidates), got {keep}")
    return keep_candidates_impl(scores, tokens, keep, impl)


def token_slots(*, req_to_token: torch.Tensor, rows: torch.Tensor, kv_lens: torch.Tensor, q_lens: torch.Tensor,
                num_tokens: int, region: int = 0, sink: int = 0, impl: str = "auto",
                checked: bool | None = None) -> torch.Tensor:
    """The cache slot each new token of a forward writes (docs/semantics.md 6.14): [bs, num_tokens] int64.

    Token t of request b sits at cache index kv_lens[b] + region + t of slot-table row rows[b]
    (req_to_token [R, C] int32/int64), read at that index clamped to C - 1; a token with
    t >= q_lens[b] is padding and gets `sink`. rows, kv_lens, q_lens: [bs] int32/int64.
    checked: the value checks (rows in [0, R), kv_lens >= 0, q_lens in [0, num_tokens], live
    indices inside the row); None runs them on CPU tensors only. Arguments are keyword-only.
    """
    device = req_to_token.device if isinstance(req_to_token, torch.Tensor) else torch.device("cpu")
    pick_impl(impl, device)
    _slot_table_arg(req_to_token, None)
    for name, t in (("rows", rows), ("kv_lens", kv_lens), ("q_lens", q_lens)):
        _index_tensor(name, t, 1, "[bs]", device)
    bs = rows.shape[0]
    for name, t in (("kv_lens", kv_lens), ("q_lens", q_lens)):
        if t.shape != (bs,):
            raise ValueError(f"{name} must be [bs] = [{bs}] (one per row of rows), got shape {tuple(t.shape)}")
    num_tokens, region, sink = (_count(name, v, 0) for name, v in (("num_tokens", num_tokens), ("region", region),
                                                                     ("sink", sink)))
    if _value_checks(checked, device) and bs:
        _raise_first([
            ((rows < 0) | (rows >= req_to_token.shape[0]), f"rows must be rows of req_to_token, in [0, {req_to_token.shape[0]})"),
            (kv_lens < 0, "kv_lens must be >= 0"),
            ((q_lens < 0) | (q_lens > num_tokens), f"q_lens must lie in [0, num_tokens = {num_tokens}]"),
            (kv_lens + region + q_lens > req_to_token.shape[1],
             f"kv_lens + region + q_lens must be <= C = {req_to_token.shape[1]} (a live token past its row)"),
        ])
    return token_slots_impl(req_to_token, rows, kv_lens, q_lens, num_tokens, region, sink, impl)


def emit_tokens(*, produced: torch.Tensor, count: torch.Tensor, rows: torch.Tensor, seq_len: torch.Tensor,
                pending: torch.Tensor, emitted: torch.Tensor, budget: torch.Tensor, finished: torch.Tensor,
                eos_token_id: int | None, impl: str = "auto",
                checked: bool | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The emit of a decode step (docs/semantics.md 6.15): the EOS / max_new_tokens cut, and the
    request state it moves, written in place.

    produced [bs, W] int64: each lane's candidate tokens in order, count [bs] (in [1, W]) of them
    real; rows [bs]: each lane's row of the request state, whose vectors seq_len, pending, emitted,
    budget [R] int64 and finished [R] bool are read and written at those rows. A live lane (row not
    finished) takes its tokens up to and including the first eos_token_id among its count, at most
    budget - emitted of them, and stops when it took the last allowed one or an EOS; its row gets
    emitted + taken, finished = stop, seq_len + count, pending = produced[count - 1]. A finished row's
    lanes take nothing and leave it as it is. Returns (head [bs, W + 2] int64: the taken tokens then
    -1, taken, finished; taken [bs] int64; finished [bs] bool). rows and count: int32 or int64.
    checked: the value checks (rows inside the state, count in [1, W], no unfinished row on two lanes,
    budget > emitted on every unfinished row);
    None runs them on CPU tensors only. Arguments are keyword-only.
    """
    pick_impl(impl, produced.device if isinstance(produced, torch.Tensor) else torch.device("cpu"))
    _tensor("produced", produced, "[bs, W] int64")
    if produced.dim() != 2 or produced.shape[1] < 1:
        raise ValueError(f"produced must be [bs, W] with W >= 1, got shape {tuple(produced.shape)}")
    bs, w = produced.shape
    device = produced.device
    check_tensor("produced", produced, (bs, w), torch.int64, device)
    for name, t in (("count", count), ("rows", rows)):
        _index_tensor(name, t, 1, "[bs]", device)
        if t.shape != (bs,):
            raise ValueError(f"{name} must be [bs] = [{bs}] (one per lane of produced), got shape {tuple(t.shape)}")
    state = (("seq_len", seq_len), ("pending", pending), ("emitted", emitted), ("budget", budget), ("finished", finished))
    for name, t in state:
        _tensor(name, t, "[R]")
        if t.dim() != 1:
            raise ValueError(f"{name} must be a 1-D request-state vector [R], got shape {tuple(t.shape)}")
    lengths = {name: t.shape[0] for name, t in state}
    if len(set(lengths.values())) > 1:
        odd = next(name for name, n in lengths.items() if n != lengths["seq_len"])
        raise ValueError(f"seq_len, pending, emitted, budget and finished must have one length R: seq_len has "
                         f"{lengths['seq_len']}, {odd} {lengths[odd]}")
    for name, t in state:
        check_tensor(name, t, (seq_len.shape[0],), torch.bool if name == "finished" else torch.int64, device)
    if eos_token_id is not None:
        eos_token_id = _count("eos_token_id", eos_token_id, 0, "or None")
    if _value_checks(checked, device) and bs:
        inside = rows[(rows >= 0) & (rows < seq_len.shape[0])]
        live_rows = torch.sort(inside[~finished[inside]]).values
        _raise_first([
            ((rows < 0) | (rows >= seq_len.shape[0]), f"rows must be rows of the request state, in [0, {seq_len.shape[0]})"),
            ((count < 1) | (count > w), f"count must lie in [1, W = {w}]"),
            (live_rows[1:] == live_rows[:-1],
             "rows must not name one unfinished row on two lanes (each writes it)"),
            (emitted[live_rows] >= budget[live_rows],
             "budget must exceed emitted on every unfinished row (a running request has room for a token)"),
        ])
    return emit_impl(produced, count, rows, seq_len, pending, emitted, budget, finished, eos_token_id, impl)


def accepted_tokens(*, tree_tokens: torch.Tensor, accept: torch.Tensor, num_correct: torch.Tensor,
                    bonus: torch.Tensor, impl: str = "auto",
                    checked: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The candidate tokens a verify's accepted path makes (docs/semantics.md 6.17), the input of
    `emit_tokens` in a speculative cycle.

    tree_tokens [bs, D] int64: each lane's tree tokens (node 0 the root); accept [bs, W]: the
    accepted nodes, root first (6.3 / 6.4; entries past the path are not read); num_correct [bs]: the accepted drafts
    n, in [0, W - 1]; bonus [bs] int64: the token after the last of them. Returns (produced [bs, W]
    int64: the tokens of nodes accept[1..n], then the bonus, then zeros; count [bs] int64 = n + 1).
    accept and num_correct: int32 or int64. checked: the value checks (num_correct in [0, W - 1],
    every node accept[1..n] a draft node, in [1, D)); None runs them on CPU tensors only.
    Arguments are keyword-only.
    """
    pick_impl(impl, accept.device if isinstance(accept, torch.Tensor) else torch.device("cpu"))
    _index_tensor("accept", accept, 2, "[bs, W]", None)
    bs, w = accept.shape
    if w < 1:
        raise ValueError(f"accept must be [bs, W] with W >= 1 (the root's column), got shape {tuple(accept.shape)}")
    device = accept.device
    _tensor("tree_tokens", tree_tokens, "[bs, D] int64")
    if tree_tokens.dim() != 2 or tree_tokens.shape[0] != bs or tree_tokens.shape[1] < 1:
        raise ValueError(f"tree_tokens must be [bs, D] = [{bs}, D >= 1] (one row per lane of accept), "
                         f"got shape {tuple(tree_tokens.shape)}")
    d = tree_tokens.shape[1]
    check_tensor("tree_tokens", tree_tokens, (bs, d), torch.int64, device)
    _index_tensor("num_correct", num_correct, 1, "[bs]", device)
    if num_correct.shape != (bs,):
        raise ValueError(f"num_correct must be [bs] = [{bs}] (one per lane of accept), got shape "
                         f"{tuple(num_correct.shape)}")
    _tensor("bonus", bonus, "[bs] int64")
    check_tensor("bonus", bonus, (bs,), torch.int64, device)
    if _value_checks(checked, device) and bs:
        j = torch.arange(w, device=device)[None, :]
        on_path = (j >= 1) & (j <= num_correct.long()[:, None])
        _raise_first([
            ((num_correct < 0) | (num_correct > w - 1), f"num_correct must lie in [0, W - 1 = {w - 1}]"),
            (on_path & ((accept < 1) | (accept >= d)),
             f"accept[b, 1..num_correct[b]] must be draft nodes, in [1, D = {d})"),
        ])
    return accepted_tokens_impl(tree_tokens, accept, num_correct, bonus, impl)


def chain_verify_rows(*, rows: torch.Tensor, seq_len: torch.Tensor, pending: torch.Tensor, finished: torch.Tensor,
                      req_id: torch.Tensor, drafts: torch.Tensor, req_to_token: torch.Tensor | None = None,
                      sink: int = 0, impl: str = "auto", checked: bool | None = None) -> ChainRows:
    """The rows a chain cycle verifies (docs/semantics.md 6.19), read from each lane's request row.

    rows [bs] int32 / int64: each lane's row of the request state; seq_len, pending, req_id [R]
    int64 and finished [R] bool: the state's vectors; drafts [R, S] int64: each row's draft chain.
    Returns a `ChainRows`: tokens [bs, S + 1] (the pending root, then the drafts), positions
    [bs, S + 1] = seq_len + j, seq_lens, req_ids, live (not finished) and q_lens (S + 1 on a live
    lane, else 0), read at rows[b]; with the slot table req_to_token [R', C] (int32 / int64, the
    lanes' rows of it the state's rows) also slots [bs, S + 1]: node j's slot req_to_token[rows[b], seq_len + j] (the index
    clamped to C - 1) on a live lane, `sink` on a finished one; without it slots is None (and sink
    must stay 0). checked: the value checks (rows inside the state; with the table, inside the
    table too and each live lane's S + 1 nodes inside its row); None runs them on CPU tensors only. Arguments are
    keyword-only.
    """
    _index_tensor("rows", rows, 1, "[bs]", None)
    device = rows.device
    pick_impl(impl, device)
    _tensor("seq_len", seq_len, "[R] int64")
    if seq_len.dim() != 1:
        raise ValueError(f"seq_len must be a 1-D request-state vector [R], got shape {tuple(seq_len.shape)}")
    r = seq_len.shape[0]
    for name, t in (("seq_len", seq_len), ("pending", pending), ("req_id", req_id), ("finished", finished)):
        _tensor(name, t, "[R]")
        check_tensor(name, t, (r,), torch.bool if name == "finished" else torch.int64, device)
    _tensor("drafts", drafts, "[R, S] int64")
    if drafts.dim() != 2 or drafts.shape[0] != r:
        raise ValueError(f"drafts must be [R, S] = [{r}, S] (one chain per state row), got shape {tuple(drafts.shape)}")
    check_tensor("drafts", drafts, tuple(drafts.shape), torch.int64, device)
    table = _chain_slot_table(req_to_token, sink, device)
    if _value_checks(checked, device) and rows.numel():
        checks = [((rows < 0) | (rows >= r), f"rows must be rows of the request state, in [0, {r})")]
        if table is not None:
            (t_rows, c), d = req_to_token.shape, drafts.shape[1] + 1
            lane_rows = rows.clamp(0, r - 1).long()
            checks += [((rows < 0) | (rows >= t_rows), f"rows must be rows of req_to_token, in [0, {t_rows})"),
                       (~finished[lane_rows] & (seq_len[lane_rows] + d > c),
                        f"seq_len + S + 1 must be <= C = {c} on a live lane (a verified node past its row)")]
        _raise_first(checks)
    return chain_verify_rows_impl(rows, seq_len, pending, finished, req_id, drafts, table, impl)


def _chain_slot_table(req_to_token, sink, device) -> tuple[torch.Tensor, int] | None:
    """`chain_verify_rows`' slot arguments checked: None without a table (sink then left at 0)."""
    if req_to_token is None:
        if isinstance(sink, bool) or not isinstance(sink, numbers.Integral) or sink != 0:
            raise ValueError("sink is given without req_to_token: the chain reads no slots without the table")
        return None
    _slot_table_arg(req_to_token, device)
    return req_to_token, _count("sink", sink, 0)


def draft_plan(*, q_lens: torch.Tensor, kv_lens: torch.Tensor, finished: torch.Tensor, width: int, num_steps: int,
               req_to_token: torch.Tensor | None = None, rows: torch.Tensor | None = None,
               ahead_tokens: int | None = None, sink: int = 0, impl: str = "auto",
               checked: bool | None = None) -> DraftPlan:
    """Where a draft phase's tokens sit (docs/semantics.md 6.18): the draft-extend's rows and the
    draft steps' positions, per lane, and with the slot table the cache slots they write.

    q_lens [bs] int64: the lane's new tokens for the extend, in [0, width]; kv_lens [bs] int64 >= 0:
    its draft entries before them; finished [bs] bool: a finished lane runs nothing; width: the
    extend's columns (>= 1); num_steps: the draft steps' positions wanted (>= 1). Returns a
    `DraftPlan` of int64 tensors: q_lens (0 where finished), positions [bs, width] = kv_lens + 1 + j,
    last = max(q_lens - 1, 0), root = kv_lens + q_lens, ahead [bs, num_steps] = root + 1 + s, live
    (1 / 0). With req_to_token [R, C] (int32 / int64) and rows [bs] (int32 / int64, the lanes' rows
    of it) also slots [bs, width]: extend token j's slot, req_to_token[rows[b], kv_lens[b] + j] for
    j < q_lens (the plan's), `sink` for the others; and ahead_slots [bs, ahead_tokens] (default
    num_steps): req_to_token[rows[b], root[b] + i] on a live lane, `sink` on a finished one (every
    index clamped to C - 1, as `token_slots` reads); without them those two fields are None.
    checked: the value checks (q_lens in [0, width], kv_lens >= 0; with the table rows inside it and
    each live extend token inside its row); None runs them on CPU tensors only. Arguments are
    keyword-only.
    """
    width = check_int("width", width, 1)
    num_steps = check_int("num_steps", num_steps, 1)
    _tensor("q_lens", q_lens, "[bs] int64")
    if q_lens.dim() != 1:
        raise ValueError(f"q_lens must be 1-D [bs], got shape {tuple(q_lens.shape)}")
    bs, device = q_lens.shape[0], q_lens.device
    pick_impl(impl, device)
    check_tensor("q_lens", q_lens, (bs,), torch.int64, device)
    _tensor("kv_lens", kv_lens, "[bs] int64")
    check_tensor("kv_lens", kv_lens, (bs,), torch.int64, device)
    _tensor("finished", finished, "[bs] bool")
    check_tensor("finished", finished, (bs,), torch.bool, device)
    table = _plan_slot_table(req_to_token, rows, ahead_tokens, sink, bs, num_steps, device)
    if _value_checks(checked, device) and bs:
        checks = [
            ((q_lens < 0) | (q_lens > width), f"q_lens must lie in [0, width = {width}]"),
            (kv_lens < 0, "kv_lens must be >= 0"),
        ]
        if table is not None:
            r, c = table.req_to_token.shape
            checks += [((rows < 0) | (rows >= r), f"rows must be rows of req_to_token, in [0, {r})"),
                       (~finished & (kv_lens + q_lens > c),
                        f"kv_lens + q_lens must be <= C = {c} on a live lane (an extend token past its row)")]
        _raise_first(checks)
    return draft_plan_impl(q_lens, kv_lens, finished, width, num_steps, table, impl)


def _plan_slot_table(req_to_token, rows, ahead_tokens, sink, bs: int, num_steps: int, device) -> SlotTable | None:
    """`draft_plan`'s slot arguments checked: None without a table (and then none of the others)."""
    if req_to_token is None:
        given = [name for name, v in (("rows", rows), ("ahead_tokens", ahead_tokens)) if v is not None]
        if not isinstance(sink, numbers.Integral) or isinstance(sink, bool) or sink != 0:
            given.append("sink")
        if given:
            raise ValueError(f"{given[0]} is given without req_to_token: the plan reads no slots without the table")
        return None
    _slot_table_arg(req_to_token, device)
    if rows is None:
        raise ValueError("rows must be given with req_to_token: the [bs] rows of the table the lanes read")
    _index_tensor("rows", rows, 1, "[bs]", device)
    if rows.shape != (bs,):
        raise ValueError(f"rows must be [bs] = [{bs}] (one per lane of q_lens), got shape {tuple(rows.shape)}")
    ahead_tokens = num_steps if ahead_tokens is None else _count("ahead_tokens", ahead_tokens, 0)
    return SlotTable(req_to_token, rows, ahead_tokens, _count("sink", sink, 0))


def commit_accepted_kv(*, kv: torch.Tensor, req_to_token: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor,
                       accept: torch.Tensor, live: torch.Tensor, sink: int = 0, impl: str = "auto",
                       checked: bool | None = None) -> torch.Tensor:
    """The K/V commit after a tree verify (docs/semantics.md 6.16): the accepted path moves down.

    kv [P, slots, heads, head_dim] (every layer's K and V planes, heads x head_dim contiguous),
    moved in place and returned. Lane b's verify wrote its tree nodes at cache indices
    seq_lens[b] + node of slot-table row rows[b] (req_to_token [R, C], indices clamped to C - 1);
    accept [bs, W] holds the node at each depth of its accepted path, -1 past it. For a live lane
    (live [bs] bool) and every depth j with accept[b, j] >= 0, every plane's slot at index
    seq_lens[b] + j gets what the slot at seq_lens[b] + accept[b, j] held before the call. A path
    never moves a node up (accept[b, j] >= j). sink: the slot a torch-path no-op copies onto itself.
    rows, seq_lens, accept: int32 or int64. checked: the value checks (rows inside the table,
    seq_lens >= 0, accept >= -1, and on live lanes accept >= depth, every moved index inside its row
    and every moved slot inside kv and not the sink); None runs them on CPU tensors only. Arguments
    are keyword-only.
    """
    device = kv.device if isinstance(kv, torch.Tensor) else torch.device("cpu")
    pick_impl(impl, device)
    _tensor("kv", kv, "[P, slots, heads, head_dim]")
    if kv.dim() != 4:
        raise ValueError(f"kv must be 4-D [P, slots, heads, head_dim], got shape {tuple(kv.shape)}")
    _layer_float("kv", kv)
    if kv.stride(3) != 1 or kv.stride(2) != kv.shape[3]:
        raise ValueError(f"kv must hold each slot's heads x head_dim contiguously (strides [..., {kv.shape[3]}, 1]), "
                         f"got strides {tuple(kv.stride())}")
    _slot_table_arg(req_to_token, device)
    _index_tensor("accept", accept, 2, "[bs, W]", device)
    bs, w = accept.shape
    for name, t in (("rows", rows), ("seq_lens", seq_lens)):
        _index_tensor(name, t, 1, "[bs]", device)
        if t.shape != (bs,):
            raise ValueError(f"{name} must be [bs] = [{bs}] (one per row of accept), got shape {tuple(t.shape)}")
    _tensor("live", live, "[bs] bool")
    check_tensor("live", live, (bs,), torch.bool, device)
    sink = _count("sink", sink, 0)
    if sink >= kv.shape[1]:
        raise ValueError(f"sink must be a slot of kv, in [0, {kv.shape[1]}), got {sink}")
    if _value_checks(checked, device) and bs:
        c = req_to_token.shape[1]
        _raise_first([
            ((rows < 0) | (rows >= req_to_token.shape[0]), f"rows must be rows of req_to_token, in [0, {req_to_token.shape[0]})"),
            (seq_lens < 0, "seq_lens must be >= 0"),
            (accept < -1, "accept must be >= -1 (-1 past the accepted path)"),
        ])
        j = torch.arange(w, device=device)[None, :]
        kept = (accept >= 0) & live[:, None]
        moved = torch.cat([accept.long().clamp(min=0), j.expand(bs, w)], 1)      # each move's source, then destination
        slots = req_to_token[rows.long()[:, None], (seq_lens.long()[:, None] + moved).clamp(max=c - 1)]
        _raise_first([
            (kept & (accept < j), "accept must be >= its depth on live lanes (a path never moves a node up)"),
            (kept & (seq_lens[:, None] + accept >= c),
             f"seq_lens + accept must be < C = {c} on live lanes (a moved node inside its row)"),
            (torch.cat([kept, kept], 1) & ((slots < 0) | (slots >= kv.shape[1])),
             f"req_to_token must map the moved indices to slots of kv, in [0, {kv.shape[1]})"),
            (torch.cat([kept, kept], 1) & (slots == sink),
             f"req_to_token must not map a moved index to the sink slot {sink} (only padding writes it)"),
        ])
    return commit_kv_impl(kv, req_to_token, rows, seq_lens, accept, live, sink, impl)
