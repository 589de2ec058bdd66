"""The dtype registry: compute and logits dtypes, FP8 quantization, and tolerances as data.

docs/semantics.md section 2 is the contract. The FP8 path is

    y = float32(logits) / float32(scale)          # in float32
    q = saturating round-to-nearest-even(y)        # to the FP8 format
    dequantized = float32(q) * scale

`reference/fp8.py` implements the same quantizer independently from the bit layouts;
tests/test_dtypes.py compares the two on every code, every midpoint and random sweeps.

torch's own `.to(fp8)` is not the contract's quantizer on its own: it keeps inf for e5m2 and
turns overflow into NaN for the fnuz formats, so `quantize_fp8` clamps to the largest finite
magnitude first (clamp keeps NaN) and lets the cast do only the rounding.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from specverify.platform import capturing
from specverify.validation import is_real

# --------------------------------------------------------------------------------------------
# Registry


@dataclass(frozen=True)
class DtypeInfo:
    name: str                 # torch attribute name, e.g. "float8_e4m3fn"
    torch_dtype: torch.dtype
    is_fp8: bool
    exponent_bits: int
    mantissa_bits: int        # stored fraction bits (the implicit leading 1 not counted)
    bias: int                 # exponent bias
    max_finite: float         # largest finite magnitude
    has_inf: bool
    has_negative_zero: bool
    itemsize: int             # bytes per element


def _info(name, exponent_bits, mantissa_bits, bias, max_finite, has_inf, has_negative_zero):
    torch_dtype = getattr(torch, name)
    itemsize = torch.empty((), dtype=torch_dtype).element_size()
    return DtypeInfo(name, torch_dtype, name.startswith("float8_"), exponent_bits, mantissa_bits,
                     bias, float(max_finite), has_inf, has_negative_zero, itemsize)


DTYPES: dict[str, DtypeInfo] = {
    info.name: info
    for info in (
        _info("float64", 11, 52, 1023, torch.finfo(torch.float64).max, True, True),
        _info("float32", 8, 23, 127, torch.finfo(torch.float32).max, True, True),
        _info("float16", 5, 10, 15, 65504.0, True, True),
        _info("bfloat16", 8, 7, 127, torch.finfo(torch.bfloat16).max, True, True),
        _info("float8_e4m3fn", 4, 3, 7, 448.0, False, True),
        _info("float8_e5m2", 5, 2, 15, 57344.0, True, True),
        _info("float8_e4m3fnuz", 4, 3, 8, 240.0, False, False),
        _info("float8_e5m2fnuz", 5, 2, 16, 57344.0, False, False),
    )
}

COMPUTE_DTYPES = ("float64", "float32", "bfloat16", "float16")
LOGITS_DTYPES = ("float32", "bfloat16", "float16",
                 "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")

SCALE_MODES = ("static", "per_row")

_BY_TORCH_DTYPE = {info.torch_dtype: info for info in DTYPES.values()}


def dtype_info(d: str | torch.dtype) -> DtypeInfo:
    """The registry entry for a dtype name ("bfloat16") or a torch.dtype (torch.bfloat16)."""
    if isinstance(d, torch.dtype):
        if d in _BY_TORCH_DTYPE:
            return _BY_TORCH_DTYPE[d]
    elif isinstance(d, str):
        if d in DTYPES:
            return DTYPES[d]
    raise ValueError(f"dtype {d!r} is not in the registry; known names: {sorted(DTYPES)}")


def _fp8_info(dtype: str | torch.dtype, arg: str) -> DtypeInfo:
    info = dtype_info(dtype)
    if not info.is_fp8:
        raise ValueError(f"{arg}: expected one of the FP8 dtypes {FP8_DTYPES}, got {info.name!r}")
    return info


def _check_float_tensor(t, arg: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{arg}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.dtype.is_floating_point:
        raise ValueError(f"{arg}: expected a floating-point tensor, got {t.dtype}")


# --------------------------------------------------------------------------------------------
# FP8 quantization


def _check_static_scale(scale) -> float:
    if not is_real(scale):
        raise TypeError(f"static_scale: expected a float, got {type(scale).__name__}")
    s32 = torch.tensor([scale], dtype=torch.float32)
    if not (math.isfinite(float(scale)) and bool(torch.isfinite(s32)) and float(s32) > 0):
        raise ValueError(f"static_scale: must be finite and > 0 in float32, got {scale!r}")
    return float(scale)


def _scale_tensor(scale, like: torch.Tensor) -> torch.Tensor:
    """`scale` (a number or a float tensor broadcastable to `like`) as float32 on like.device.

    A number becomes a 1-element tensor, not a Python scalar: on CUDA, dividing by a CPU scalar
    is computed as a multiplication by its reciprocal, which is not `y / scale` in float32.
    Checking the values synchronizes with the device.
    """
    if isinstance(scale, torch.Tensor):
        if not scale.dtype.is_floating_point:
            raise ValueError(f"scale: expected a floating-point tensor, got {scale.dtype}")
        s = scale.to(device=like.device, dtype=torch.float32)
        try:
            shape = torch.broadcast_shapes(like.shape, s.shape)
        except RuntimeError:
            shape = None
        if shape != like.shape:
            raise ValueError(f"scale: shape {tuple(s.shape)} does not broadcast to the input "
                             f"shape {tuple(like.shape)} (e.g. use [N, 1] for [N, V] rows)")
        # The value check reads the device; inside a CUDA-graph capture it cannot, and the
        # captured scale was checked when the eager path ran first.
        if not capturing(s.device) and not bool(torch.all(torch.isfinite(s) & (s > 0))):
            raise ValueError("scale: every element must be finite and > 0 in float32")
        return s
    if not is_real(scale):
        raise TypeError(f"scale: expected a float or a float tensor, got {type(scale).__name__}")
    s32 = torch.tensor([scale], dtype=torch.float32)
    if not (math.isfinite(float(scale)) and bool(torch.isfinite(s32)) and float(s32) > 0):
        raise ValueError(f"scale: must be finite and > 0 in float32, got {scale!r}")
    return s32.to(like.device)


def quantize_fp8(x: torch.Tensor, dtype: str | torch.dtype, scale) -> torch.Tensor:
    """Saturating round-to-nearest-even of float32(x) / float32(scale) to an FP8 dtype.

    x: [...] any float dtype; scale: a number or a float tensor broadcastable to x (e.g. [N, 1]),
    finite and > 0. Returns [...] in the FP8 dtype. Beyond ±max finite (inf included) -> ±max
    finite; NaN -> NaN; for the fnuz formats -0 -> +0.
    """
    info = _fp8_info(dtype, "dtype")
    _check_float_tensor(x, "x")
    return _quantize(x, info, _scale_tensor(scale, x))


def _quantize(x: torch.Tensor, info: DtypeInfo, s: torch.Tensor) -> torch.Tensor:
    """quantize_fp8 after validation: s is a float32 tensor on x's device."""
    y = x.to(torch.float32) / s                                  # [...] float32
    y = torch.clamp(y, -info.max_finite, info.max_finite)        # saturate; NaN passes through
    if not info.has_negative_zero:
        y = torch.where(y == 0, torch.zeros_like(y), y)          # -0 -> +0
    return y.to(info.torch_dtype)


def dequantize_fp8(q: torch.Tensor, scale) -> torch.Tensor:
    """float32(q) * scale, in float32. q: [...] FP8; scale: a number or a tensor broadcastable to q."""
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q: expected a torch.Tensor, got {type(q).__name__}")
    _fp8_info(q.dtype, "q.dtype")
    return q.to(torch.float32) * _scale_tensor(scale, q)


def logits_scale(logits: torch.Tensor, dtype: str | torch.dtype, *, mode: str,
                 static_scale: float = 1.0) -> torch.Tensor:
    """The FP8 scale of each logits row. logits: [..., V] float -> [..., 1] float32.

    mode "static": `static_scale` for every row. mode "per_row": max(|row|) / max_finite in
    float32, the max taken over the finite entries; a row with no finite nonzero entry (all
    zero, or only NaN / inf) gets 1, and so does a row whose scale underflows float32 to 0.
    """
    info = _fp8_info(dtype, "dtype")
    _check_float_tensor(logits, "logits")
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits: expected shape [..., V] with V >= 1, got {tuple(logits.shape)}")
    out_shape = (*logits.shape[:-1], 1)
    if not isinstance(mode, str):
        raise TypeError(f"mode: expected a str, one of {SCALE_MODES}, got {type(mode).__name__} {mode!r}")
    if mode == "static":
        # A fill on the device (no host-to-device copy), so it can be captured in a CUDA graph.
        return torch.full(out_shape, _check_static_scale(static_scale), dtype=torch.float32, device=logits.device)
    if mode == "per_row":
        x = logits.to(torch.float32)                             # [..., V]
        mag = torch.where(torch.isfinite(x), x.abs(), torch.zeros_like(x))
        amax = mag.amax(dim=-1, keepdim=True)                    # [..., 1]
        s = amax / torch.full_like(amax, info.max_finite)       # tensor / tensor: a true division
        return torch.where(s > 0, s, torch.ones_like(s))
    raise ValueError(f"mode: {mode!r} is not one of {SCALE_MODES}; a scale computed over the "
                     "whole batch is not supported, because it would make a request's tokens "
                     "depend on its neighbours (batch invariance)")


def to_logits_dtype(logits: torch.Tensor, dtype: str | torch.dtype, *, scale_mode: str = "static",
                    static_scale: float = 1.0, shared_ones: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Convert logits [..., V] to a logits dtype. Returns (values [..., V], scale [..., 1] float32).

    Non-FP8: values = logits.to(dtype) (round to nearest even), scale = ones (shared_ones: a
    read-only view of one cached element per device, which costs no kernel; a model's forward
    delivers it, and nothing may write into it).
    FP8: scale from `logits_scale(mode=scale_mode)`, values = quantize_fp8(logits, dtype, scale).
    """
    info = dtype_info(dtype)
    if info.name not in LOGITS_DTYPES:
        raise ValueError(f"dtype: {info.name!r} is not a logits dtype; expected one of {LOGITS_DTYPES}")
    _check_float_tensor(logits, "logits")
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits: expected shape [..., V] with V >= 1, got {tuple(logits.shape)}")
    if not info.is_fp8:
        shape = (*logits.shape[:-1], 1)
        ones = _one(logits.device).expand(shape) if shared_ones else torch.ones(shape, dtype=torch.float32,
                                                                                 device=logits.device)
        return logits.to(info.torch_dtype), ones
    scale = logits_scale(logits, info.name, mode=scale_mode, static_scale=static_scale)
    return _quantize(logits, info, scale), scale          # a scale made here needs no checking


@functools.lru_cache(maxsize=None)
def _one(device: torch.device) -> torch.Tensor:
    """A float32 1 on `device` (0-dim), made once and never evicted (a captured graph reads it by
    address): the shared scale of logits that carry none."""
    return torch.ones((), dtype=torch.float32, device=device)


def upcast_logits(values: torch.Tensor) -> torch.Tensor:
    """values [..., V] in a logits dtype -> float32. The tie contract's upcast (section 3):
    greedy compares these values, for FP8 before the scale is applied."""
    _check_float_tensor(values, "values")
    return values.float()


# --------------------------------------------------------------------------------------------
# Tolerances


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


TOLERANCES: dict[str, Tolerance] = {
    # Hidden states / logits in a compute dtype, against the float64 reference:
    #   float64: same precision, only summation order differs (~1e-15 per op).
    "float64": Tolerance(atol=1e-9, rtol=1e-9),
    #   float32: eps 1.2e-7, accumulated over a few layers and dot products of width H / I.
    "float32": Tolerance(atol=1e-4, rtol=1e-4),
    #   bfloat16: eps 7.8e-3 (8-bit significand); every matmul input and output rounds, and
    #   logits of magnitude ~5 drift up to ~0.1 absolute through the tiny model's two layers.
    "bfloat16": Tolerance(atol=1.25e-1, rtol=5e-2),
    #   float16: eps 9.8e-4 (11-bit significand); same rounding points as bfloat16.
    "float16": Tolerance(atol=1e-2, rtol=1e-2),
    # Dequantized FP8 logits: rtol is one quantization step, 2**-mantissa_bits relative (a value
    # may round to the neighbouring code when the upstream float32 logits differ slightly);
    # atol is one subnormal step at scale 1, 2**(1 - bias - mantissa_bits), for values that
    # round to or near zero (multiply it by the scale when the scale exceeds 1).
    #   e4m3fn: 3 mantissa bits, smallest subnormal 2**-9.
    "float8_e4m3fn": Tolerance(atol=2.0**-9, rtol=2.0**-3),
    #   e5m2: 2 mantissa bits, smallest subnormal 2**-16.
    "float8_e5m2": Tolerance(atol=2.0**-16, rtol=2.0**-2),
    #   e4m3fnuz: 3 mantissa bits, bias 8, smallest subnormal 2**-10.
    "float8_e4m3fnuz": Tolerance(atol=2.0**-10, rtol=2.0**-3),
    #   e5m2fnuz: 2 mantissa bits, bias 16, smallest subnormal 2**-17.
    "float8_e5m2fnuz": Tolerance(atol=2.0**-17, rtol=2.0**-2),
}


def tolerance(name: str | torch.dtype) -> Tolerance:
    """The tolerance for a dtype name (or torch.dtype) of TOLERANCES."""
    key = name
    if isinstance(name, torch.dtype) and name in _BY_TORCH_DTYPE:
        key = _BY_TORCH_DTYPE[name].name
    if not isinstance(key, str) or key not in TOLERANCES:
        raise ValueError(f"tolerance: no entry for {name!r}; known names: {sorted(TOLERANCES)}")
    return TOLERANCES[key]
