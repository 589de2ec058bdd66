"""FP8 formats from their bit layouts, and the contract's quantizer (docs/semantics.md, section 2).

Independent of specverify: every value here is decoded from (sign, exponent, mantissa, bias) and
the format's rules for inf, NaN and negative zero; nothing is asked of torch.

A code is 8 bits: 1 sign bit, `exp_bits` exponent bits e, `man_bits` mantissa bits f.
    e == 0:  (-1)**sign * (f / 2**man_bits) * 2**(1 - bias)          (zero and subnormals)
    e >  0:  (-1)**sign * (1 + f / 2**man_bits) * 2**(e - bias)      (normals)
except where the format's special rules say otherwise:
    "ieee" (e5m2):      e all ones: inf when f == 0, NaN otherwise.
    "fn"   (e4m3fn):    e and f all ones: NaN. No inf.
    "fnuz" (e4m3fnuz, e5m2fnuz): code 0x80 (the would-be -0) is the only NaN. No inf, no -0.

Quantization: y = float32(x) / float32(scale) in float32; |y| goes to the nearest finite value of
the format, a tie to the code whose mantissa LSB is 0; beyond the largest finite value it
saturates; NaN -> the format's NaN code; the sign is put back, except that fnuz formats have no
-0 and a negative value that rounds to zero becomes +0.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class Fp8Format:
    name: str
    exp_bits: int
    man_bits: int
    bias: int
    rules: str  # "ieee" | "fn" | "fnuz"


FORMATS: dict[str, Fp8Format] = {
    "float8_e4m3fn": Fp8Format("float8_e4m3fn", 4, 3, 7, "fn"),
    "float8_e5m2": Fp8Format("float8_e5m2", 5, 2, 15, "ieee"),
    "float8_e4m3fnuz": Fp8Format("float8_e4m3fnuz", 4, 3, 8, "fnuz"),
    "float8_e5m2fnuz": Fp8Format("float8_e5m2fnuz", 5, 2, 16, "fnuz"),
}


def _format(fmt: str) -> Fp8Format:
    if fmt not in FORMATS:
        raise ValueError(f"fmt: {fmt!r} is not an FP8 format; expected one of {list(FORMATS)}")
    return FORMATS[fmt]


def _decode_code(code: int, f8: Fp8Format) -> float:
    """The value of one code, read off its bits."""
    sign = code >> 7
    e = (code >> f8.man_bits) & ((1 << f8.exp_bits) - 1)
    f = code & ((1 << f8.man_bits) - 1)
    e_max = (1 << f8.exp_bits) - 1
    f_max = (1 << f8.man_bits) - 1
    if f8.rules == "fnuz" and code == 0x80:
        return float("nan")
    if f8.rules == "ieee" and e == e_max:
        return float("nan") if f != 0 else (-1.0) ** sign * float("inf")
    if f8.rules == "fn" and e == e_max and f == f_max:
        return float("nan")
    if e == 0:
        magnitude = (f / 2**f8.man_bits) * 2.0 ** (1 - f8.bias)
    else:
        magnitude = (1 + f / 2**f8.man_bits) * 2.0 ** (e - f8.bias)
    return -magnitude if sign else magnitude


@lru_cache(maxsize=None)
def _table(fmt: str) -> np.ndarray:
    """[256] float64: the value of every code."""
    f8 = _format(fmt)
    table = np.array([_decode_code(c, f8) for c in range(256)], dtype=np.float64)
    table.setflags(write=False)
    return table


def table(fmt: str) -> np.ndarray:
    """[256] float64, the value of each code of `fmt` (read-only)."""
    return _table(fmt)


@lru_cache(maxsize=None)
def _positive_grid(fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """The finite values >= 0 in ascending order, [K] float64, and their codes, [K] uint8."""
    t = _table(fmt)
    codes = [c for c in range(256) if np.isfinite(t[c]) and t[c] >= 0 and not np.signbit(t[c])]
    codes.sort(key=lambda c: t[c])
    values = np.array([t[c] for c in codes], dtype=np.float64)
    assert np.all(np.diff(values) > 0), f"{fmt}: two codes share a value"
    return values, np.array(codes, dtype=np.uint8)


def max_finite(fmt: str) -> float:
    """The largest finite value of `fmt`."""
    values, _ = _positive_grid(fmt)
    return float(values[-1])


def nan_code(fmt: str) -> int:
    """The code quantize writes for NaN: the highest positive-sign NaN code, else 0x80 (fnuz)."""
    t = _table(fmt)
    positive = [c for c in range(128) if np.isnan(t[c])]
    return max(positive) if positive else 0x80


def has_negative_zero(fmt: str) -> bool:
    return bool(np.signbit(_table(fmt)[0x80]) and _table(fmt)[0x80] == 0)


def decode(codes: np.ndarray, fmt: str) -> np.ndarray:
    """codes [...] uint8 -> values [...] float32 (every FP8 value is exact in float32)."""
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise ValueError(f"codes: expected uint8, got {codes.dtype}")
    return _table(fmt)[codes].astype(np.float32)


def _check_scale(scale, shape) -> np.ndarray:
    s = np.asarray(scale)
    if s.dtype.kind != "f" and s.dtype.kind not in "iu":
        raise ValueError(f"scale: expected a number or a float array, got dtype {s.dtype}")
    s = s.astype(np.float32)
    if not np.all(np.isfinite(s) & (s > 0)):
        raise ValueError("scale: every element must be finite and > 0 in float32")
    if np.broadcast_shapes(shape, s.shape) != tuple(shape):
        raise ValueError(f"scale: shape {s.shape} does not broadcast to the input shape {tuple(shape)}")
    return s


def quantize(x: np.ndarray, fmt: str, scale) -> np.ndarray:
    """x [...] float -> codes [...] uint8 of float32(x) / float32(scale), saturating, ties to even.

    scale: a number or an array broadcastable to x (e.g. [N, 1]), finite and > 0.
    """
    f8 = _format(fmt)
    x = np.asarray(x)
    if x.dtype.kind != "f":
        raise ValueError(f"x: expected a float array, got dtype {x.dtype}")
    s = _check_scale(scale, x.shape)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        y = x.astype(np.float32) / s                          # [...] float32, IEEE division
    values, codes = _positive_grid(fmt)
    top = values[-1]

    a = np.abs(y.astype(np.float64))                          # exact: float32 -> float64
    a = np.where(np.isnan(a), 0.0, np.minimum(a, top))        # saturate (NaN handled below)
    hi = np.searchsorted(values, a, side="left")              # values[hi-1] < a <= values[hi]
    lo = np.maximum(hi - 1, 0)
    # The midpoint of two adjacent values has one bit more than they do: exact in float64.
    mid = (values[lo] + values[hi]) / 2
    lo_code, hi_code = codes[lo], codes[hi]
    tie_to_hi = (hi_code & 1) == 0
    take_hi = (a == values[hi]) | (a > mid) | ((a == mid) & tie_to_hi)
    magnitude_code = np.where(take_hi, hi_code, lo_code).astype(np.uint8)

    negative = np.signbit(y)
    if f8.rules == "fnuz":
        negative = negative & (magnitude_code != 0)           # no -0: it would be the NaN code
    out = np.where(negative, magnitude_code | np.uint8(0x80), magnitude_code)
    out = np.where(np.isnan(y), np.uint8(nan_code(fmt)), out)
    return out.astype(np.uint8)


def dequantize(codes: np.ndarray, fmt: str, scale) -> np.ndarray:
    """codes [...] uint8 -> fp8_value * scale in float64 (the product is exact there)."""
    codes = np.asarray(codes)
    s = _check_scale(scale, codes.shape)
    return decode(codes, fmt).astype(np.float64) * s.astype(np.float64)


def row_scale(x: np.ndarray, fmt: str) -> np.ndarray:
    """Per-row scale of x [..., V]: max |finite entry| / max_finite in float32 -> [..., 1] float32;
    1 where a row has no finite nonzero entry or the quotient underflows to 0."""
    x = np.asarray(x).astype(np.float32)
    mag = np.where(np.isfinite(x), np.abs(x), np.float32(0))
    amax = mag.max(axis=-1, keepdims=True)
    with np.errstate(under="ignore"):
        s = (amax / np.float32(max_finite(fmt))).astype(np.float32)
    return np.where(s > 0, s, np.float32(1)).astype(np.float32)
