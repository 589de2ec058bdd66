"""The total order of floats the selection ops share (`ops.order_key`, `ops.topk_stable`,
docs/semantics.md 6.1: value descending, index ascending, NaN above every number, -0.0 == +0.0)
against the reference's own order (`reference.spec.topk_order`, a Python sort), row by row.

The rows are the hard cases: ties of a few distinct values across a wide row (where torch's own
sort reorders equal keys unless asked to be stable), NaN, +-inf, -0.0 and +0.0, ulp-adjacent
values, every k from 1 to the row. float64 takes its own path (int64 keys, boundary ties found
by count), every other dtype the packed 32-bit one."""
from __future__ import annotations

import math

import pytest
import torch

from reference.spec import topk_order
from specverify import ops

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]


def _rows(dtype: torch.dtype, width: int, seed: int) -> torch.Tensor:
    """Four rows of `width`: three values only (long runs of ties); ties with NaN, +-inf and
    signed zeros; ulp neighbours of 1 mixed with 1; and a plain random row."""
    g = torch.Generator().manual_seed(seed)
    few = torch.tensor([0.5, -2.0, 3.0], dtype=torch.float64)[torch.randint(0, 3, (width,), generator=g)]
    special = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0], dtype=torch.float64)
    odd = special[torch.randint(0, 6, (width,), generator=g)]
    eps = torch.finfo(dtype).eps                                    # 1's neighbours in dtype: 1 + eps, 1 - eps / 2
    near = torch.tensor([1.0, 1.0 + eps, 1.0 - eps / 2], dtype=torch.float64)[torch.randint(0, 3, (width,), generator=g)]
    plain = torch.randn(width, generator=g, dtype=torch.float64)
    return torch.stack([few, odd, near, plain]).to(dtype)


@pytest.mark.parametrize("width", [5, 64, 300])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_topk_stable_is_the_reference_order(dtype, width):
    rows = _rows(dtype, width, seed=width)
    upcast = rows.double().tolist()
    for k in sorted({min(k, width) for k in (1, 2, 7, width // 2, width - 1, width)}):
        values, index = ops.topk_stable(rows, k)
        assert index.dtype == torch.int64 and index.shape == values.shape == (rows.shape[0], k)
        for r, row in enumerate(upcast):
            want = topk_order(row, k)
            assert index[r].tolist() == want, f"{dtype} width {width} k {k} row {r}: {index[r].tolist()} != {want}"
            torch.testing.assert_close(values[r], rows[r, want], rtol=0, atol=0, equal_nan=True,
                                       msg=f"{dtype} width {width} k {k} row {r}: values")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_order_key_orders_as_the_reference_does(dtype):
    """Sorting by the key (descending, stably) is the reference's order of the whole row; equal
    keys exactly for equal values, -0.0 with +0.0, NaN with NaN."""
    rows = _rows(dtype, 64, seed=3)
    key = ops.order_key(rows)
    for r, row in enumerate(rows.double().tolist()):
        got = torch.sort(key[r], descending=True, stable=True).indices.tolist()
        assert got == topk_order(row, len(row)), f"{dtype} row {r}"
        for i, a in enumerate(row):
            for j in (0, 5, 17):
                b = row[j]
                same = (a == b) or (math.isnan(a) and math.isnan(b))
                assert (key[r, i] == key[r, j]).item() == same, f"{dtype} row {r}: keys of {a} and {b}"


def test_bad_arguments_are_named():
    rows = torch.zeros((2, 4))
    for args, error, words in (((rows.tolist(), 1), TypeError, "values must be a torch.Tensor"),
                               ((rows[0], 1), ValueError, "values must be [N, M], got shape (4,)"),
                               ((rows.to(torch.int32), 1), ValueError, "values dtype torch.int32 is not a layer dtype"),
                               ((rows, 0), ValueError, "k must be in [1, 4]"),
                               ((rows, 5), ValueError, "k must be in [1, 4] (at most the row's length M), got 5"),
                               ((rows, 2.0), TypeError, "k must be an int"),
                               ((rows, True), TypeError, "k must be an int"),
                               ((torch.zeros((2, 0)), 1), ValueError, "k must be in [1, 0]")):
        with pytest.raises(error) as e:
            ops.topk_stable(*args)
        assert words in str(e.value), (args, str(e.value))
    with pytest.raises(ValueError, match="values dtype torch.int64 is not a layer dtype"):
        ops.order_key(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="values must be a torch.Tensor"):
        ops.order_key([1.0])
