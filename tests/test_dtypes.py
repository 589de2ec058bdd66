"""specverify.dtypes: the registry, the FP8 quantizer against reference.fp8, scales, tolerances.

The FP8 comparisons are exact: codes compared bit for bit, NaN compared as "both NaN".
Re-run one format: python -m pytest tests/test_dtypes.py -k float8_e4m3fnuz
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from reference import fp8 as ref
from specverify import dtypes as D

pytestmark = pytest.mark.bitexact

FP8 = D.FP8_DTYPES
NON_FP8_LOGITS = tuple(d for d in D.LOGITS_DTYPES if d not in FP8)
# Seeded (derandomized); the number of examples comes from the loaded hypothesis profile.
SETTINGS = settings(deadline=None, derandomize=True)


# ------------------------------------------------------------------------------------------
# helpers


def all_codes() -> np.ndarray:
    return np.arange(256, dtype=np.uint8)  # [256]


def codes_of(q: torch.Tensor) -> np.ndarray:
    return q.view(torch.uint8).cpu().numpy()


def assert_same_codes(x: np.ndarray, fmt: str, scale, what: str) -> None:
    """quantize_fp8 and reference.fp8.quantize give the same code for every element of x."""
    x = np.asarray(x, dtype=np.float32)
    torch_scale = torch.from_numpy(scale.astype(np.float32)) if isinstance(scale, np.ndarray) else scale
    got = codes_of(D.quantize_fp8(torch.from_numpy(x), fmt, torch_scale))
    want = ref.quantize(x, fmt, scale)
    assert got.shape == x.shape, f"{fmt}/{what}: output shape {got.shape}, input {x.shape}"
    both_nan = np.isnan(ref.decode(got, fmt)) & np.isnan(ref.decode(want, fmt))
    bad = np.flatnonzero((got != want) & ~both_nan)
    if bad.size:
        i = bad[0]
        xi = x.reshape(-1)[i]
        s = np.broadcast_to(np.asarray(scale, np.float32), x.shape).reshape(-1)[i]
        raise AssertionError(
            f"{fmt}/{what}: {bad.size} of {x.size} codes differ; first at flat index {i}: "
            f"x={xi!r} (bits {np.float32(xi).view(np.uint32):#010x}), scale={s!r}: "
            f"quantize_fp8 -> {_code_str(got.reshape(-1)[i], fmt)}, "
            f"reference -> {_code_str(want.reshape(-1)[i], fmt)}. "
            f"Re-run: python -m pytest tests/test_dtypes.py -k {fmt}")


def _code_str(code, fmt: str) -> str:
    return f"{int(code):#04x} ({ref.decode(np.array([code], np.uint8), fmt)[0]})"


def finite_grid(fmt: str) -> np.ndarray:
    """Every finite value of fmt, ascending, both signs: [K] float32."""
    t = ref.table(fmt)
    return np.unique(t[np.isfinite(t)]).astype(np.float32)


# ------------------------------------------------------------------------------------------
# registry


def test_registry_names_and_groups():
    assert set(D.DTYPES) == {"float64", "float32", "float16", "bfloat16", *FP8}
    assert D.COMPUTE_DTYPES == ("float64", "float32", "bfloat16", "float16")
    assert D.FP8_DTYPES == ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    assert D.LOGITS_DTYPES == ("float32", "bfloat16", "float16", *FP8)
    for name, info in D.DTYPES.items():
        assert info.name == name and info.torch_dtype == getattr(torch, name)
        assert info.is_fp8 == (name in FP8)


@pytest.mark.parametrize("name", sorted(D.DTYPES))
def test_registry_matches_finfo(name):
    info = D.DTYPES[name]
    fi = torch.finfo(info.torch_dtype)
    assert 1 + info.exponent_bits + info.mantissa_bits == fi.bits == 8 * info.itemsize
    assert info.max_finite == fi.max
    # eps measured on torch's own values: torch.finfo(float8_e5m2fnuz).eps says 0.125 (torch
    # 2.13), but the value after 1.0 in that format is 1.25.
    one = torch.ones(1, dtype=info.torch_dtype)
    if info.itemsize == 1:
        after_one = (one.view(torch.uint8) + 1).view(info.torch_dtype)
    else:
        after_one = torch.nextafter(one, torch.full_like(one, 2.0))
    assert (after_one.double() - 1).item() == 2.0 ** -info.mantissa_bits
    assert fi.smallest_normal == 2.0 ** (1 - info.bias)


@pytest.mark.parametrize("fmt", FP8)
def test_registry_fp8_matches_reference_layout(fmt):
    info, f8 = D.DTYPES[fmt], ref.FORMATS[fmt]
    assert (info.exponent_bits, info.mantissa_bits, info.bias) == (f8.exp_bits, f8.man_bits, f8.bias)
    assert info.max_finite == ref.max_finite(fmt)
    assert info.has_inf == bool(np.isinf(ref.table(fmt)).any())
    assert info.has_negative_zero == ref.has_negative_zero(fmt)
    assert info.itemsize == 1


def test_dtype_info_accepts_names_and_torch_dtypes():
    for name, info in D.DTYPES.items():
        assert D.dtype_info(name) is info
        assert D.dtype_info(info.torch_dtype) is info


@pytest.mark.parametrize("bad", ["float8_e4m3", "fp32", torch.int32, torch.complex64, 3, None])
def test_dtype_info_unknown(bad):
    with pytest.raises(ValueError, match="float8_e4m3fnuz") as e:
        D.dtype_info(bad)
    assert repr(bad) in str(e.value)


# ------------------------------------------------------------------------------------------
# reference decode vs torch decode


@pytest.mark.parametrize("fmt", FP8)
def test_reference_decode_matches_torch_on_all_codes(fmt):
    codes = all_codes()
    want = torch.tensor(codes, dtype=torch.uint8).view(getattr(torch, fmt)).float().numpy()
    got = ref.decode(codes, fmt)
    assert got.dtype == np.float32
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    bad = np.flatnonzero(~same)
    assert bad.size == 0, \
        f"{fmt}: codes {[hex(c) for c in bad[:8]]} decode to {got[bad[:8]]}, torch {want[bad[:8]]}"


def test_format_facts_table():
    """The table of docs/semantics.md section 2, read off reference.fp8."""
    facts = {  # max finite, inf codes, NaN codes
        "float8_e4m3fn": (448.0, [], [0x7F, 0xFF]),
        "float8_e5m2": (57344.0, [0x7C, 0xFC], [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF]),
        "float8_e4m3fnuz": (240.0, [], [0x80]),
        "float8_e5m2fnuz": (57344.0, [], [0x80]),
    }
    for fmt, (top, inf_codes, nan_codes) in facts.items():
        t = ref.table(fmt)
        assert ref.max_finite(fmt) == top
        assert list(np.flatnonzero(np.isinf(t))) == inf_codes, fmt
        assert list(np.flatnonzero(np.isnan(t))) == nan_codes, fmt


@pytest.mark.parametrize("fmt", ["float8_e4m3fnuz", "float8_e5m2fnuz"])
def test_fnuz_rules(fmt):
    t = ref.table(fmt)
    assert not ref.has_negative_zero(fmt)
    assert not np.isinf(t).any()
    assert list(np.flatnonzero(np.isnan(t))) == [0x80]
    assert np.count_nonzero(t == 0) == 1 and not np.signbit(t[0])
    q = D.quantize_fp8(torch.tensor([-0.0, 0.0, -1e-30, -1e-45, float("nan"), -float("nan")]), fmt, 1.0)
    assert codes_of(q).tolist() == [0x00, 0x00, 0x00, 0x00, 0x80, 0x80]


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2"])
def test_negative_zero_kept_where_it_exists(fmt):
    assert ref.has_negative_zero(fmt)
    q = D.quantize_fp8(torch.tensor([-0.0, 0.0, -1e-30]), fmt, 1.0)
    assert codes_of(q).tolist() == [0x80, 0x00, 0x80]


# ------------------------------------------------------------------------------------------
# quantize_fp8 vs reference.fp8.quantize, exactly


@pytest.mark.parametrize("fmt", FP8)
def test_quantize_every_code_value(fmt):
    """Each of the 256 codes of every format, decoded, as input (its own codes round-trip)."""
    own = ref.decode(all_codes(), fmt)
    assert_same_codes(own, fmt, 1.0, "own codes")
    others = np.concatenate([ref.decode(all_codes(), f) for f in FP8])
    assert_same_codes(others, fmt, 1.0, "codes of every format")
    back = ref.quantize(own, fmt, 1.0)
    keep = np.isfinite(own) & ~((own == 0) & np.signbit(own) & (not ref.has_negative_zero(fmt)))
    assert np.array_equal(back[keep], all_codes()[keep]), f"{fmt}: finite codes must round-trip"


@pytest.mark.parametrize("fmt", FP8)
def test_quantize_midpoints_ties_to_even(fmt):
    grid = finite_grid(fmt)
    mid = ((grid[:-1].astype(np.float64) + grid[1:]) / 2).astype(np.float32)
    assert np.array_equal(mid.astype(np.float64) * 2, grid[:-1].astype(np.float64) + grid[1:])
    above = np.nextafter(mid, np.float32(np.inf))
    below = np.nextafter(mid, np.float32(-np.inf))
    assert_same_codes(mid, fmt, 1.0, "midpoints")
    assert_same_codes(np.concatenate([above, below]), fmt, 1.0, "midpoints +- 1 ulp")
    codes = ref.quantize(mid, fmt, 1.0)
    assert np.all(codes & 1 == 0), f"{fmt}: a midpoint rounded to an odd code"


@pytest.mark.parametrize("fmt", FP8)
def test_quantize_saturates(fmt):
    info = D.DTYPES[fmt]
    top = np.float32(info.max_finite)
    m = info.mantissa_bits
    x = np.array([top, top * (1 + 2.0 ** -(m + 2)), top * (1 + 2.0 ** -(m + 1)), 2 * top, 1e30,
                  np.finfo(np.float32).max, np.inf], dtype=np.float32)
    x = np.concatenate([x, -x])
    assert_same_codes(x, fmt, 1.0, "saturation")
    got = D.quantize_fp8(torch.from_numpy(x), fmt, 1.0).float().numpy()
    assert np.array_equal(got, np.where(x > 0, top, -top)), f"{fmt}: got {got}"


@pytest.mark.parametrize("fmt", FP8)
def test_quantize_subnormals_zero_nan(fmt):
    grid = finite_grid(fmt)
    tiny = grid[grid > 0][:8]  # the smallest positive values: the subnormals first
    f32_sub = np.array([1e-45, 2.0 ** -149, 1e-40, np.finfo(np.float32).tiny], dtype=np.float32)
    x = np.concatenate([tiny, tiny / 2, tiny * 0.75, tiny * 1.25, f32_sub,
                        np.array([0.0, np.nan], dtype=np.float32)]).astype(np.float32)
    assert_same_codes(np.concatenate([x, -x]), fmt, 1.0, "subnormals, zero, NaN")
    assert torch.isnan(D.quantize_fp8(torch.tensor([np.nan]), fmt, 1.0).float()).all()


@pytest.mark.parametrize("fmt", FP8)
def test_quantize_divides_in_float32(fmt):
    """y = float32(x) / float32(scale), the correctly rounded quotient, not x * (1 / scale).

    (A float64 quotient rounded to float32 is the same number, so that variant is not wrong.)"""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(4099) * 37).astype(np.float32)
    x64 = torch.from_numpy(x.astype(np.float64) + 1e-9)  # a float64 input is rounded to float32 first
    grid = finite_grid(fmt).astype(np.float64)
    mid = (grid[:-1] + grid[1:]) / 2                                   # [K-1] exact
    for scale in (0.1, 3.0, 7.3, 1 / 448, 1e-3, 0.37, 1 / 3):
        assert_same_codes(x, fmt, scale, f"scale={scale}")
        # x whose quotient x / scale lands on or one float32 step from a midpoint: here the
        # way the division is done (quotient or reciprocal product) decides the code.
        near = (mid * np.float32(scale)).astype(np.float32)            # [K-1]
        up, down = [near], [near]
        for _ in range(2):
            up.append(np.nextafter(up[-1], np.float32(np.inf)))
            down.append(np.nextafter(down[-1], np.float32(-np.inf)))
        cands = np.concatenate(up + down[1:])                           # [5 * (K-1)]
        assert_same_codes(cands, fmt, scale, f"quotients near midpoints, scale={scale}")
        assert np.array_equal(codes_of(D.quantize_fp8(x64, fmt, scale)),
                              ref.quantize(x64.numpy(), fmt, scale)), \
            f"{fmt}: float64 input, scale={scale}"


def _rows_and_scales():
    """Logits-like float32 rows [N, V] and a scale: a static float or a per-row [N, 1] array."""
    rows = hnp.arrays(np.float32, st.tuples(st.integers(1, 5), st.integers(1, 33)),
                      elements=st.floats(width=32, allow_nan=True, allow_infinity=True))
    static = st.sampled_from([1.0, 0.5, 3.0, 0.1, 7.3, 1 / 448, 1e-3, 1e4])
    per_row = st.floats(2.0**-20, 2.0**20, width=32)
    return rows.flatmap(lambda x: st.tuples(
        st.just(x),
        st.one_of(static, hnp.arrays(np.float32, (x.shape[0], 1), elements=per_row))))


@pytest.mark.parametrize("fmt", FP8)
@SETTINGS
@given(case=_rows_and_scales())
def test_quantize_sweep(fmt, case):
    x, scale = case
    assert_same_codes(x, fmt, scale, "hypothesis sweep")


@pytest.mark.parametrize("fmt", FP8)
@SETTINGS
@given(x=hnp.arrays(np.float32, st.integers(1, 64),
                    elements=st.floats(-600.0, 600.0, width=32)))
def test_quantize_sweep_in_range(fmt, x):
    """Values near the format's range, where most rounding decisions happen."""
    assert_same_codes(x, fmt, 1.0, "in-range sweep")


@pytest.mark.parametrize("fmt", FP8)
def test_quantize_errors(fmt):
    x = torch.ones(2, 3)
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e-50, 1e39):
        with pytest.raises(ValueError, match="scale"):
            D.quantize_fp8(x, fmt, bad)
    with pytest.raises(ValueError, match="scale"):
        D.quantize_fp8(x, fmt, torch.tensor([[1.0], [0.0]]))
    with pytest.raises(ValueError, match="scale.*broadcast"):
        D.quantize_fp8(x, fmt, torch.ones(3, 1))
    with pytest.raises(ValueError, match="scale"):
        D.quantize_fp8(x, fmt, torch.ones(2, 1, dtype=torch.int32))
    with pytest.raises(TypeError, match="scale"):
        D.quantize_fp8(x, fmt, "1.0")
    with pytest.raises(ValueError, match="x"):
        D.quantize_fp8(torch.ones(2, dtype=torch.int64), fmt, 1.0)
    with pytest.raises(ValueError, match="dtype.*float32"):
        D.quantize_fp8(x, "float32", 1.0)
    with pytest.raises(ValueError, match="scale"):
        ref.quantize(x.numpy(), fmt, 0.0)
    with pytest.raises(ValueError, match="fmt"):
        ref.quantize(x.numpy(), "float8_e3m4", 1.0)


@pytest.mark.parametrize("fmt", FP8)
def test_dequantize(fmt):
    q = torch.tensor(all_codes()).view(getattr(torch, fmt))  # [256]
    scale = torch.full((256,), 0.37)
    got = D.dequantize_fp8(q.reshape(16, 16), scale.reshape(16, 16)[:, :1])
    assert got.dtype == torch.float32 and got.shape == (16, 16)
    exact = q.reshape(16, 16).float() * torch.tensor(0.37, dtype=torch.float32)  # float32 product
    torch.testing.assert_close(got, exact, rtol=0, atol=0, equal_nan=True)
    want = ref.dequantize(all_codes().reshape(16, 16), fmt, np.full((16, 1), 0.37, np.float32))
    np.testing.assert_allclose(got.numpy(), want, rtol=2**-23, equal_nan=True)
    with pytest.raises(ValueError, match="q.dtype"):
        D.dequantize_fp8(torch.ones(3), 1.0)


# ------------------------------------------------------------------------------------------
# scales and conversion


@pytest.mark.parametrize("fmt", FP8)
def test_logits_scale_static(fmt):
    logits = torch.randn(3, 5, 17, generator=torch.Generator().manual_seed(0))
    s = D.logits_scale(logits, fmt, mode="static", static_scale=0.25)
    assert s.shape == (3, 5, 1) and s.dtype == torch.float32 and bool((s == 0.25).all())
    with pytest.raises(ValueError, match="scale"):
        D.logits_scale(logits, fmt, mode="static", static_scale=0.0)


@pytest.mark.parametrize("fmt", FP8)
def test_logits_scale_per_row(fmt):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 29, generator=g, dtype=torch.float64) * 40
    logits[1] = 0.0                                    # all zero -> 1
    logits[2, 3], logits[2, 7] = float("nan"), float("inf")  # ignored
    logits[3] = float("-inf")                          # no finite entry -> 1
    logits[4] = -0.0
    logits[5, :] = 1e-44                               # amax / max_finite underflows float32 -> 1
    s = D.logits_scale(logits, fmt, mode="per_row")
    want = ref.row_scale(logits.numpy(), fmt)
    assert s.shape == (6, 1) and s.dtype == torch.float32
    assert np.array_equal(s.numpy(), want), f"{s.numpy().ravel()} vs {want.ravel()}"
    assert s[1].item() == s[3].item() == s[4].item() == s[5].item() == 1.0
    finite = logits[2][torch.isfinite(logits[2])].float()
    assert s[2].item() == (finite.abs().max() / torch.tensor(D.DTYPES[fmt].max_finite)).item()


def test_logits_scale_per_row_is_batch_invariant():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(5, 4, 31, generator=g) * torch.logspace(-3, 3, 5)[:, None, None]
    s = D.logits_scale(logits, "float8_e4m3fn", mode="per_row")   # [5, 4, 1]
    for b in range(5):
        assert torch.equal(s[b], D.logits_scale(logits[b], "float8_e4m3fn", mode="per_row"))


@pytest.mark.parametrize("mode", ["batch", "per_tensor", "PER_ROW", ""])
def test_logits_scale_unknown_mode(mode):
    with pytest.raises(ValueError, match="mode") as e:
        D.logits_scale(torch.ones(2, 3), "float8_e5m2", mode=mode)
    msg = str(e.value)
    assert "static" in msg and "per_row" in msg and "batch" in msg


def test_logits_scale_rejects_non_fp8():
    with pytest.raises(ValueError, match="dtype"):
        D.logits_scale(torch.ones(2, 3), "bfloat16", mode="per_row")


@pytest.mark.parametrize("dtype", D.LOGITS_DTYPES)
@pytest.mark.parametrize("shape", [(7, 37), (2, 3, 37)], ids=["2d", "3d"])
def test_to_logits_dtype_shapes(dtype, shape):
    logits = torch.randn(*shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 9
    values, scale = D.to_logits_dtype(logits, dtype, scale_mode="per_row")
    assert values.shape == shape and values.dtype == getattr(torch, dtype)
    assert scale.shape == (*shape[:-1], 1) and scale.dtype == torch.float32
    if dtype in NON_FP8_LOGITS:
        assert torch.equal(values, logits.to(getattr(torch, dtype)))
        assert bool((scale == 1).all())
    else:
        want = ref.quantize(logits.numpy(), dtype, ref.row_scale(logits.numpy(), dtype))
        assert np.array_equal(codes_of(values), want)
        assert np.array_equal(scale.numpy(), ref.row_scale(logits.numpy(), dtype))


@pytest.mark.parametrize("fmt", FP8)
def test_to_logits_dtype_static_and_batch_invariant(fmt):
    logits = torch.randn(2, 3, 41, generator=torch.Generator().manual_seed(4)) * 100
    values, scale = D.to_logits_dtype(logits, fmt, static_scale=0.5)
    assert bool((scale == 0.5).all())
    assert np.array_equal(codes_of(values), codes_of(D.quantize_fp8(logits, fmt, 0.5)))
    for mode in D.SCALE_MODES:
        batch, _ = D.to_logits_dtype(logits, fmt, scale_mode=mode, static_scale=0.5)
        for b in range(2):
            for t in range(3):
                one, _ = D.to_logits_dtype(logits[b, t:t + 1], fmt, scale_mode=mode, static_scale=0.5)
                assert np.array_equal(codes_of(batch[b, t]), codes_of(one[0])), (mode, b, t)


def test_to_logits_dtype_errors():
    with pytest.raises(ValueError, match="dtype.*float64"):
        D.to_logits_dtype(torch.ones(2, 3), "float64")
    with pytest.raises(ValueError, match="dtype"):
        D.to_logits_dtype(torch.ones(2, 3), "int8")
    with pytest.raises(ValueError, match="logits"):
        D.to_logits_dtype(torch.ones(2, 0), "float32")
    with pytest.raises(ValueError, match="logits"):
        D.to_logits_dtype(torch.ones(2, 3, dtype=torch.int64), "float8_e4m3fn")
    with pytest.raises(ValueError, match="mode"):
        D.to_logits_dtype(torch.ones(2, 3), "float8_e4m3fn", scale_mode="batch")


def independent_upcast(values: torch.Tensor, dtype: str) -> np.ndarray:
    """float32 values of a logits-dtype tensor read from its bit patterns without torch's
    conversion: reference.fp8.decode for FP8, numpy's float16, bfloat16 as the high half of a
    float32, float32 as itself."""
    if dtype in FP8:
        return ref.decode(codes_of(values), dtype).astype(np.float32)
    if dtype == "float16":
        return values.view(torch.int16).numpy().view(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        bits = values.view(torch.int16).numpy().view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32)
    assert dtype == "float32"
    return values.view(torch.int32).numpy().view(np.float32)


@pytest.mark.parametrize("dtype", D.LOGITS_DTYPES)
def test_upcast_logits(dtype):
    """upcast_logits against the values read from the bit patterns (every FP8 code, NaN included)."""
    if dtype in FP8:
        values = torch.from_numpy(all_codes()).view(getattr(torch, dtype))[None]
    else:
        values, _ = D.to_logits_dtype(torch.linspace(-5, 5, 23)[None] * 1.37 + 1e-3, dtype)
    up = D.upcast_logits(values)
    want = independent_upcast(values, dtype)
    assert up.dtype == torch.float32 and up.shape == values.shape
    np.testing.assert_array_equal(up.numpy(), want)     # NaN equals NaN here; signed zeros compare equal
    finite = ~np.isnan(want)                            # a NaN's sign is not part of the contract
    assert np.array_equal(np.signbit(up.numpy())[finite], np.signbit(want)[finite])


# ------------------------------------------------------------------------------------------
# tolerances


def test_tolerance_table():
    assert set(D.TOLERANCES) == set(D.COMPUTE_DTYPES) | set(FP8)
    for name in D.TOLERANCES:
        tol = D.tolerance(name)
        assert tol is D.TOLERANCES[name] and tol.atol > 0 and tol.rtol > 0
        assert D.tolerance(getattr(torch, name)) is tol
    order = [D.tolerance(n).rtol for n in ("float64", "float32", "float16", "bfloat16")]
    assert order == sorted(order), "tolerances must widen as precision drops"
    for fmt in FP8:
        info = D.DTYPES[fmt]
        assert D.tolerance(fmt).rtol == 2.0 ** -info.mantissa_bits
        assert D.tolerance(fmt).atol == 2.0 ** (1 - info.bias - info.mantissa_bits)
        assert D.tolerance(fmt).atol == float(np.min(np.abs(finite_grid(fmt))[finite_grid(fmt) != 0]))


@pytest.mark.parametrize("fmt", FP8)
def test_fp8_tolerance_covers_one_step(fmt):
    """Dequantized values one code apart, anywhere in the range, are within the FP8 tolerance."""
    grid = finite_grid(fmt).astype(np.float64)
    tol = D.tolerance(fmt)
    lo, hi = grid[:-1], grid[1:]
    assert np.all(np.abs(hi - lo) <= tol.atol + tol.rtol * np.maximum(np.abs(lo), np.abs(hi)))


@pytest.mark.parametrize("bad", ["int8", "float8", "", torch.int32, None])
def test_tolerance_unknown(bad):
    with pytest.raises(ValueError, match="tolerance.*float32"):
        D.tolerance(bad)


# -- pinned for the survivors of the first generated-mutant campaign (docs/mutation/seed-0.md) --

@pytest.mark.parametrize("name", sorted(D.DTYPES))
def test_negative_zero_in_the_table_matches_torch(name):
    """has_negative_zero says whether -0.0 survives a cast to the dtype with its sign (the fnuz
    formats have no -0: their 0x80 is NaN)."""
    info = D.DTYPES[name]
    zero = torch.tensor([-0.0]).to(info.torch_dtype).to(torch.float64)
    assert info.has_negative_zero == bool(torch.signbit(zero).item())


def test_dequantize_refuses_what_is_not_a_tensor():
    with pytest.raises(TypeError, match=r"^q: expected a torch.Tensor, got list$"):
        D.dequantize_fp8([1.0], 1.0)


@pytest.mark.parametrize("shape", [(), (3, 0)])
def test_logits_scale_needs_a_vocab_dimension(shape):
    with pytest.raises(ValueError, match=r"logits: expected shape \[\.\.\., V\] with V >= 1"):
        D.logits_scale(torch.zeros(shape), "float8_e4m3fn", mode="per_row")
