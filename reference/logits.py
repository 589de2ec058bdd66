"""Logits dtype conversion (docs/semantics.md, section 2) and the greedy tie rule (section 3).

`convert_logits` turns a float64 logits row into the two views the decoder needs:

- `upcast`: float32 values the greedy rule compares (for FP8 the decoded fp8 values, before the
  scale is applied; for the other dtypes the rounded logits, which float32 holds exactly);
- `dequant`: float64 values sampling and logprobs use (for FP8 `fp8_value * scale`, computed in
  float64, where the product is exact).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
FP8_FORMATS = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
SCALE_MODES = ("static", "per_row")


def _fp8():
    """reference.fp8, imported on first FP8 use."""
    from reference import fp8  # noqa: PLC0415  (lazy: only FP8 rows need it)

    return fp8


@dataclass(frozen=True)
class ConvertedLogits:
    upcast: np.ndarray  # [V] float32, what greedy compares
    dequant: np.ndarray  # [V] float64, what sampling and logprobs use
    scale: float | None  # the float32 FP8 scale used for this row; None for non-FP8 dtypes


def row_scale(row32: np.ndarray, fmt: str) -> np.float32:
    """Per-row FP8 scale of one row (the rule lives in reference.fp8.row_scale): max |finite
    entry| / fp8_max in float32; 1 for a row with no finite nonzero entry or a zero quotient."""
    return np.float32(_fp8().row_scale(np.asarray(row32, dtype=np.float32)[None, :], fmt)[0, 0])


def convert_logits(config, row) -> ConvertedLogits:
    """Convert one float64 logits row [V] to config.logits_dtype (scale from config)."""
    dtype = config.logits_dtype
    row64 = torch.as_tensor(row, dtype=torch.float64).cpu()
    if row64.dim() != 1:
        raise ValueError(f"row: expected a 1-d logits row, got shape {tuple(row64.shape)}")
    if dtype in TORCH_DTYPES:
        rounded = row64.to(TORCH_DTYPES[dtype])
        upcast = rounded.to(torch.float32).numpy()
        return ConvertedLogits(upcast=upcast, dequant=upcast.astype(np.float64), scale=None)
    if dtype not in FP8_FORMATS:
        raise ValueError(f"config.logits_dtype: {dtype!r} is not one of {list(TORCH_DTYPES) + list(FP8_FORMATS)}")

    fp8 = _fp8()
    row32 = row64.to(torch.float32).numpy()  # float32(logits)
    mode = config.logits_scale_mode
    if mode == "static":
        scale = np.float32(config.logits_scale)
        if not (np.isfinite(scale) and scale > 0):
            raise ValueError(f"config.logits_scale: must be finite and > 0 in float32, got {config.logits_scale!r}")
    elif mode == "per_row":
        scale = row_scale(row32, dtype)
    else:
        raise ValueError(f"config.logits_scale_mode: {mode!r} is not one of {list(SCALE_MODES)}")
    with np.errstate(over="ignore"):  # an overflow to inf saturates below, as the contract says
        y = (row32 / scale).astype(np.float32)  # y = float32(logits) / float32(scale), in float32
    codes = fp8.quantize(y, dtype, np.float32(1.0))  # y is already scaled; dividing by 1 is exact
    upcast = np.asarray(fp8.decode(codes, dtype), dtype=np.float32)
    dequant = upcast.astype(np.float64) * np.float64(scale)
    return ConvertedLogits(upcast=upcast, dequant=dequant, scale=float(scale))


# What a NaN in a row means to the greedy choice: "nan_is_max" is section 3's (np.argmax and
# torch.argmax: the first NaN wins); "nan_ignored" reads each NaN as float32(-1e30) and then takes
# the first maximum: NaN beats -inf and anything below -1e30, ties with -1e30 (first index wins),
# and an all-NaN row gives 0 (an engine that masks NaN before its argmax; docs/conformance.md).
NAN_RULES = ("nan_is_max", "nan_ignored")
NAN_IGNORED_VALUE = -1e30


def greedy_token(upcast, nan: str = "nan_is_max") -> int:
    """First index holding the maximum of the float32 values (np.argmax returns the first)."""
    if nan not in NAN_RULES:
        raise ValueError(f"nan: one of {NAN_RULES}, got {nan!r}")
    upcast = np.asarray(upcast, dtype=np.float32)
    if nan == "nan_ignored":
        upcast = np.where(np.isnan(upcast), np.float32(NAN_IGNORED_VALUE), upcast)
    return int(np.argmax(upcast))
