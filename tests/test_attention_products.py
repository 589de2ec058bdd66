"""The attention kernels' two products (docs/semantics.md 6.20): every product of two inputs exact,
every sum a float32 sum, and the paged and the indexed kernel computing a row they share alike.

The bugs of this class are silent: probabilities rounded to the cache's dtype (or to TF32 on tensor
cores) before P.V, or two kernels that round one row differently. The registry's per-dtype
tolerances cannot see the first at bfloat16 / float16 (a relative error of 2^-8 is inside
bfloat16's tolerance), so the error is held here against what float32 sums allow, from first
principles. The second makes greedy naive EAGLE (the indexed kernel) drift from target-only
decoding (the paged kernel) at a near tie; it is asserted bit for bit. Triton is interpreted on the
CPU and compiled on a GPU, where the second test matters most: on an H100 the tensor cores' K
order follows operand layouts the compiler picks per kernel (benchmarks/results/attn_dot_modes-*.md).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import reference
from specverify.kernels.attention import paged_attention_impl
from specverify.kernels.indexed_attention import decode_attention_indexed_impl

pytestmark = pytest.mark.kernels

DEV = "cuda" if torch.cuda.is_available() else "cpu"
FLOAT32_UNIT = 2.0 ** -24          # float32's unit roundoff
BS, NH, NKV, HD = 2, 4, 2, 32
CONTEXT = (70, 9)                  # one request across two 64-key blocks, one inside the first


def _inputs(dtype: torch.dtype, seed: int):
    """K / V / Q of `dtype` with the hard cases: magnitudes from 2^-6 to 2^3, ulp-adjacent pairs of
    keys (near-tie scores), a key repeated exactly (a tie), and values that are exactly +-max."""
    g = torch.Generator().manual_seed(seed)
    slots = 1 + sum(CONTEXT)
    k = torch.randn((slots, NKV, HD), generator=g) * 2.0 ** torch.randint(-6, 2, (slots, NKV, 1), generator=g)
    v = torch.randn((slots, NKV, HD), generator=g) * 2.0 ** torch.randint(-3, 3, (slots, NKV, 1), generator=g)
    k, v = k.to(dtype), v.to(dtype)
    k[2] = k[1]                                                       # a tie
    bits = torch.int16 if dtype.itemsize == 2 else torch.int32
    k[4] = (k[3].view(bits) + 1).view(dtype)                        # the next value of the dtype: a near tie
    v[5] = 255.0                                                      # a large value, exact in every dtype
    q = (torch.randn((BS, 1, NH, HD), generator=g) * 0.5).to(dtype)
    table = torch.zeros((BS, max(CONTEXT)), dtype=torch.int64)
    start = 1
    for b, n in enumerate(CONTEXT):
        table[b, :n] = torch.randperm(n, generator=g) + start
        start += n
    # A key in request 0's second block (cache index 66) that outscores its first block for every
    # head: the running maximum rises mid-row, so the rescale of the sums (alpha) is exercised.
    group = NH // NKV
    k[table[0, 66]] = (2 * q[0, 0].float().view(NKV, group, HD).sum(1)).to(dtype)
    return q, k, v, table


def _float32_bound(q, k, v, table, scale) -> np.ndarray:
    """[BS, NH]: what float32 sums of exact products may be off by, per output row: the scores'
    sums (HD terms each, relative to the sum of |products|) move each weight by up to twice that
    times e, and the weighted sum of the values (n terms) and the exponentials add a few units on
    top, all relative to max |v| of the row's keys."""
    out = np.zeros((BS, NH))
    for b, n in enumerate(CONTEXT):
        slots = table[b, :n]
        for h in range(NH):
            kh = k[slots, h // (NH // NKV)].double()
            qh = q[b, 0, h].double()
            score_err = HD * FLOAT32_UNIT * (qh.abs() * kh.abs()).sum(-1).max().item() * scale
            vmax = v[slots, h // (NH // NKV)].double().abs().max().item()
            out[b, h] = vmax * ((n + HD + 8) * FLOAT32_UNIT + 2 * math.e * score_err)
    return out


def _paged(q, k, v, table, scale, impl):
    n = torch.tensor(CONTEXT) - 1                                     # kv_lens: every key but the query's own
    args = [t.to(DEV) for t in (q, k, v, table, torch.arange(BS), n, torch.ones(BS, dtype=torch.int64),
                                torch.ones((BS, 1, 1), dtype=torch.bool))]
    return paged_attention_impl(*args, 0, scale, impl=impl).cpu()[:, 0]          # [BS, NH, HD]


def _indexed(q, k, v, table, scale):
    indptr = torch.tensor([0, CONTEXT[0], sum(CONTEXT)], dtype=torch.int64)
    indices = torch.cat([table[b, :n] for b, n in enumerate(CONTEXT)])
    args = [t.to(DEV) for t in (q[:, 0], k, v, indptr, indices)]
    return decode_attention_indexed_impl(*args, scale, impl="triton", out_dtype=torch.float32).cpu()


def _reference(q, k, v, table, scale) -> np.ndarray:
    n = np.asarray(CONTEXT) - 1
    return reference.paged_attention(q=q.double().numpy(), k_cache=k.double().numpy(), v_cache=v.double().numpy(),
                                     req_to_token=table.numpy(), rows=np.arange(BS), kv_lens=n,
                                     q_lens=np.ones(BS, dtype=np.int64), tree_mask=np.ones((BS, 1, 1), dtype=bool),
                                     region=0, scale=scale)[:, 0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("scale", [HD ** -0.5 * 1.5, 24.0])           # != 1/sqrt(d); scores past exp's range
def test_products_are_exact_and_sums_float32(dtype, seed, scale):
    q, k, v, table = _inputs(dtype, seed)
    want = _reference(q, k, v, table, scale)
    bound = _float32_bound(q, k, v, table, scale)[:, :, None]
    for name, got in (("paged", _paged(q, k, v, table, scale, "triton")), ("indexed", _indexed(q, k, v, table, scale))):
        err = np.abs(got.double().numpy() - want)
        worst = np.unravel_index(np.argmax(err / bound), err.shape)
        assert (err <= bound).all(), (f"{name} attention, {dtype}: error {err[worst]:.3g} at {worst} over the float32 "
                                      f"bound {bound[worst[:2]][0]:.3g}: a product was rounded")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_verify_row_rounds_as_the_decode_row(dtype):
    """Naive EAGLE's verify (the indexed kernel) and target-only decoding (the paged kernel) must give
    the same row bit for bit on one device, or greedy speculation drifts from target-only decoding."""
    q, k, v, table = _inputs(dtype, 3)
    scale = HD ** -0.5
    assert torch.equal(_indexed(q, k, v, table, scale), _paged(q, k, v, table, scale, "triton"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_chain_verify_row_rounds_as_the_decode_row(dtype):
    """EAGLE's verify (the paged kernel over 4 chained queries) and target-only decoding (the paged
    kernel over one) give the last query's row bit for bit: the same keys, another launch shape."""
    _, k, v, table = _inputs(dtype, 4)
    q = (torch.randn((1, 4, NH, HD), generator=torch.Generator().manual_seed(5)) * 0.5).to(dtype)
    n, scale = CONTEXT[0], HD ** -0.5
    one = torch.ones(1, dtype=torch.int64)
    decode = paged_attention_impl(*(t.to(DEV) for t in (q[:, 3:], k, v, table[:1], one * 0, one * (n - 1), one,
                                                       torch.ones((1, 1, 1), dtype=torch.bool))), 0, scale,
                                  impl="triton").cpu()[0, 0]
    verify = paged_attention_impl(*(t.to(DEV) for t in (q, k, v, table[:1], one * 0, one * (n - 4), one * 4,
                                                       torch.tril(torch.ones((1, 4, 4), dtype=torch.bool)))), 0, scale,
                                  impl="triton").cpu()[0, 3]
    assert torch.equal(verify, decode)
