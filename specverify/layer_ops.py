"""Public fused layer ops (docs/semantics.md 6.11-6.13), re-exported by `specverify.ops`: the
argument checks in front of `specverify/kernels/fused_layers.py`. Reference twins:
`reference/layers.py`.

Shapes, dtypes and devices are always checked (ValueError naming the argument, TypeError for a
non-tensor). `rotary_kv_write`'s value checks (positions inside the cos / sin table, slots inside
the caches) read the device: `checked=None` (default) runs them on CPU tensors only, True on any
device outside a CUDA-graph capture, False never (as the other ops). The model calls these ops
unchecked: its positions and slots come from its own slot table.
"""

from __future__ import annotations

import torch

from specverify.kernels.fused_layers import add_rmsnorm_impl, rotary_kv_write_impl, silu_mul_impl
from specverify.kernels.launch import pick_impl
from specverify.kernels.tree import _raise_first
from specverify.platform import capturing

LAYER_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def _tensor(name: str, t, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {what}, got {type(t).__name__}")


def _float(name: str, t: torch.Tensor) -> None:
    if t.dtype not in LAYER_DTYPES:
        raise ValueError(f"{name} dtype {t.dtype} is not a layer dtype (bfloat16, float16, float32, float64)")


def _same_device(name: str, t: torch.Tensor, ref: torch.Tensor, ref_name: str) -> None:
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device}, {ref_name} on {ref.device}: all inputs must be on one device")


def _value_checks(checked, device: torch.device) -> bool:
    if checked is not None and not isinstance(checked, bool):
        raise TypeError(f"checked must be True, False or None, got {type(checked).__name__}")
    if checked is None:
        checked = device.type == "cpu"
    return checked and not capturing(device)


def add_rmsnorm(x: torch.Tensor, weight: torch.Tensor, *, residual: torch.Tensor | None = None, eps: float = 1e-6,
                impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of the residual sum -> (normed, sum), both [..., H] in x's dtype.

    sum = x + residual, rounded once to x's dtype (x itself when residual is None: a plain norm);
    normed = sum * rsqrt(mean(sum^2) + eps) * weight, the mean over the H entries of a row,
    computed from the rounded sum in float32 (the torch path: in x's dtype as torch's rms_norm
    does), rounded once. A row whose mean square is not finite (an inf or NaN in it) is NaN throughout in normed.
    x: [..., H] float; residual: x's shape and dtype; weight: [H] float; eps: a finite float >= 0.
    impl: "triton", "torch", or "auto" (Triton on CUDA, torch elsewhere; float64 always torch).
    """
    pick_impl(impl, x.device if isinstance(x, torch.Tensor) else torch.device("cpu"))
    _tensor("x", x, "[..., H]")
    _tensor("weight", weight, "[H]")
    _float("x", x)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must be [..., H] with H >= 1, got shape {tuple(x.shape)}")
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"weight must be [H] = [{x.shape[-1]}], got shape {tuple(weight.shape)}")
    _float("weight", weight)
    _same_device("weight", weight, x, "x")
    if residual is not None:
        _tensor("residual", residual, "[..., H]")
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(f"residual must have x's shape {tuple(x.shape)} and dtype {x.dtype}, got "
                             f"{tuple(residual.shape)} {residual.dtype}")
        _same_device("residual", residual, x, "x")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0.0 <= float(eps) < float("inf")):
        raise ValueError(f"eps must be a finite float >= 0, got {eps!r}")
    return add_rmsnorm_impl(x, residual, weight, float(eps), impl)


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
    _float("qkv", qkv)
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
    _float("k_cache", k_cache)
    for name, table in (("cos", cos), ("sin", sin)):
        _float(name, table)
        if table.dim() != 2 or table.shape[1] != dim // 2 or table.shape[0] == 0:
            raise ValueError(f"{name} must be [P, D/2] = [P >= 1, {dim // 2}], got shape {tuple(table.shape)}")
    if sin.shape != cos.shape or sin.dtype != cos.dtype:
        raise ValueError(f"sin must have cos's shape {tuple(cos.shape)} and dtype {cos.dtype}, got "
                         f"{tuple(sin.shape)} {sin.dtype}")
    for name, v in (("positions", positions), ("slots", slots)):
        if v.dtype not in INDEX_DTYPES:
            raise ValueError(f"{name} must be int32 or int64, got {v.dtype}")
        if v.shape != (t,):
            raise ValueError(f"{name} must be [T] = [{t}] (one per token of qkv), got shape {tuple(v.shape)}")
    for name, v in (("positions", positions), ("cos", cos), ("sin", sin), ("k_cache", k_cache), ("v_cache", v_cache),
                    ("slots", slots)):
        _same_device(name, v, qkv, "qkv")
    if t and _value_checks(checked, qkv.device):
        _raise_first([
            ((positions < 0) | (positions >= cos.shape[0]), f"positions must be rows of the tables, in [0, {cos.shape[0]})"),
            ((slots < 0) | (slots >= k_cache.shape[0]), f"slots must be cache slots, in [0, {k_cache.shape[0]})"),
        ])
    return rotary_kv_write_impl(qkv, positions, cos, sin, k_cache, v_cache, slots, num_q_heads, impl)


def silu_mul(gate_up: torch.Tensor, *, impl: str = "auto") -> torch.Tensor:
    """The SiLU-gated MLP activation: gate_up [..., 2I] float holds the gate projection then the
    up projection; returns silu(gate) * up [..., I] in gate_up's dtype (silu(g) = g / (1 + e^-g)).
    The Triton path computes in float32 and rounds once; the torch path rounds silu(g) to the
    dtype before the product (as the unfused model did). NaN and inf propagate (silu(-inf) is NaN).
    """
    pick_impl(impl, gate_up.device if isinstance(gate_up, torch.Tensor) else torch.device("cpu"))
    _tensor("gate_up", gate_up, "[..., 2I]")
    _float("gate_up", gate_up)
    if gate_up.dim() < 1 or gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up must be [..., 2I] (an even last dim: gate, then up), got shape "
                         f"{tuple(gate_up.shape)}")
    return silu_mul_impl(gate_up, impl)
