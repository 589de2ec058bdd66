"""The attention kernels' two products (docs/semantics.md 6.20): every product of two inputs exact,
every sum a float32 sum, and the paged and the indexed kernel computing a row they share alike. The
paged kernel's tensor-core mode (`tensor_cores=True`, a draft head's attention: TF32 products, the
probabilities split in two) is held to the same bound, and only the draft head may ask for it.

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
from specverify import build_models, ops
from specverify.conformance.registry import REGISTRY
from specverify.kernels import attention, launch
from specverify.kernels.attention import paged_attention_impl
from specverify.kernels.indexed_attention import decode_attention_indexed_impl
from specverify.kernels.launch import TF32_FRACTION_BITS, tf32_exact
from specverify.models import Batch, chain_mask, layers
from specverify.platform import get_profile
from tests.support.launches import launch_spy

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


def _paged(q, k, v, table, scale, impl, tensor_cores=False):
    n = torch.tensor(CONTEXT) - 1                                     # kv_lens: every key but the query's own
    args = [t.to(DEV) for t in (q, k, v, table, torch.arange(BS), n, torch.ones(BS, dtype=torch.int64),
                                torch.ones((BS, 1, 1), dtype=torch.bool))]
    return paged_attention_impl(*args, 0, scale, impl=impl, tensor_cores=tensor_cores).cpu()[:, 0]   # [BS, NH, HD]


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
    for name, got in (("paged", _paged(q, k, v, table, scale, "triton")),
                      ("paged on tensor cores", _paged(q, k, v, table, scale, "triton", tensor_cores=True)),
                      ("indexed", _indexed(q, k, v, table, scale))):
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


@pytest.mark.parametrize("tensor_cores", [False, True], ids=["fma", "tensor-cores"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_chain_verify_row_rounds_as_the_decode_row(dtype, tensor_cores):
    """EAGLE's verify (the paged kernel over 4 chained queries) and target-only decoding (the paged
    kernel over one) give the last query's row bit for bit: the same keys, another launch shape.
    On the tensor cores too (a draft-extend's row and a draft step's: one kernel)."""
    _, k, v, table = _inputs(dtype, 4)
    q = (torch.randn((1, 4, NH, HD), generator=torch.Generator().manual_seed(5)) * 0.5).to(dtype)
    n, scale = CONTEXT[0], HD ** -0.5
    one = torch.ones(1, dtype=torch.int64)
    decode = paged_attention_impl(*(t.to(DEV) for t in (q[:, 3:], k, v, table[:1], one * 0, one * (n - 1), one,
                                                       torch.ones((1, 1, 1), dtype=torch.bool))), 0, scale,
                                  impl="triton", tensor_cores=tensor_cores).cpu()[0, 0]
    verify = paged_attention_impl(*(t.to(DEV) for t in (q, k, v, table[:1], one * 0, one * (n - 4), one * 4,
                                                       torch.tril(torch.ones((1, 4, 4), dtype=torch.bool)))), 0, scale,
                                  impl="triton", tensor_cores=tensor_cores).cpu()[0, 3]
    assert torch.equal(verify, decode)


def _fits_tf32(x: torch.Tensor) -> bool:
    """Every float32 value of x keeps its value with the fraction bits TF32 lacks cleared."""
    return bool(((x.view(torch.int32) & ((1 << (23 - TF32_FRACTION_BITS)) - 1)) == 0).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_tf32_is_taken_only_where_every_value_fits_it(dtype):
    """The choice against the dtype's own extremes: its largest value, its smallest normal and
    subnormal, and the values with every fraction bit set (+-(2 - eps)). float64 does not fit
    float32's exponent range at all."""
    fi = torch.finfo(dtype)
    extremes = torch.tensor([fi.max, fi.smallest_normal, fi.smallest_normal * fi.eps, 2 - fi.eps, -(2 - fi.eps)],
                            dtype=torch.float64).to(dtype)
    wide = extremes.float()
    fits = bool(torch.isfinite(wide).all()) and bool((wide.double() == extremes.double()).all()) and _fits_tf32(wide)
    assert tf32_exact(dtype, "cuda") == fits, f"{dtype}: TF32 products would {'be' if fits else 'not be'} exact"
    assert not tf32_exact(dtype, "hip"), "a ROCm build keeps IEEE float32 products (Triton has no TF32 dot there)"


def test_only_the_draft_head_asks_for_the_tensor_cores(monkeypatch):
    """The target's attention (prefill, decode, verify) keeps the FMA units, so its rows round as
    the indexed kernel's; the draft head's takes the tensor cores. Read off the engine's own calls."""
    calls = []
    real = layers.paged_attention_impl

    def spy(*args, **kwargs):
        calls.append(kwargs.get("tensor_cores", False))
        return real(*args, **kwargs)
    monkeypatch.setattr(layers, "paged_attention_impl", spy)
    models = build_models("tiny", seed=3, device="cpu")
    cfg = models.config
    cache = models.target.new_cache(max_requests=1)
    row = cache.table.alloc_row()
    cache.table.reserve(row, 4)
    mask, parents = chain_mask(1, 4, "cpu")
    kv = torch.zeros(1, dtype=torch.int64)
    batch = Batch(torch.arange(4)[None, :], torch.arange(4)[None, :], torch.tensor([row]), kv, torch.full((1,), 4),
                  mask, parents)
    models.target.forward(cache, batch)
    assert calls == [False] * cfg.num_layers, f"the target's layers asked for tensor cores: {calls}"
    calls.clear()
    models.draft.forward(cache, batch, torch.zeros((1, 4, cfg.hidden_size)))
    assert calls == [True], f"the draft head's attention calls: {calls}"


@pytest.mark.parametrize("tensor_cores", [False, True], ids=["fma", "tensor-cores"])
def test_the_op_hands_its_product_mode_to_the_kernel(tensor_cores):
    """`ops.paged_attention` (the registry's record of the draft head's call) gives what the kernel
    gives in the mode asked for, bit for bit: the checks in front of the kernel change nothing."""
    q, k, v, table = _inputs(torch.bfloat16, 6)
    scale = HD ** -0.5
    n = torch.tensor(CONTEXT) - 1
    args = dict(q=q, k_cache=k, v_cache=v, req_to_token=table, rows=torch.arange(BS), kv_lens=n,
                q_lens=torch.ones(BS, dtype=torch.int64), tree_mask=torch.ones((BS, 1, 1), dtype=torch.bool))
    got = ops.paged_attention(**{name: t.to(DEV) for name, t in args.items()}, scale=scale, impl="triton",
                              tensor_cores=tensor_cores).cpu()[:, 0]
    assert torch.equal(got, _paged(q, k, v, table, scale, "triton", tensor_cores=tensor_cores))


def test_the_backend_follows_the_torch_build(monkeypatch):
    """A ROCm build of torch makes the kernels' backend "hip", where no dot takes TF32."""
    monkeypatch.setattr(torch.version, "hip", "6.2.0")
    assert launch.gpu_backend() == "hip" and not tf32_exact(torch.bfloat16)
    monkeypatch.setattr(torch.version, "hip", None)
    assert launch.gpu_backend() == "cuda" and tf32_exact(torch.bfloat16)


def test_the_probability_split_clears_exactly_tf32s_missing_bits():
    """A TF32 operand holds 10 of float32's 23 fraction bits: the split clears the other 13, and
    the kernel's mask keeps the sign, the exponent and those 10."""
    assert launch.TF32_LOW_BITS == (1 << 13) - 1
    assert int(attention.TF32_KEEP.value) == 0xFFFFE000


def _spy_on_the_op(monkeypatch) -> list:
    """The product mode of each call the op hands to the kernel wrapper (which then runs nothing:
    only the mode is read)."""
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs.get("tensor_cores"))
        return torch.zeros(())
    monkeypatch.setattr(ops, "paged_attention_impl", spy)
    return calls


@pytest.mark.parametrize("record,mode", [("paged_attention_tensor_cores", True), ("paged_attention_triton", False)])
def test_each_attention_record_runs_its_product_mode(monkeypatch, record, mode):
    """The tensor-core record checks the draft head's call, the Triton record the target's."""
    calls = _spy_on_the_op(monkeypatch)
    op = REGISTRY[record]
    op.impl(next(iter(op.samples("bfloat16", 0))), get_profile("cpu"))
    assert calls == [mode]


def test_the_op_keeps_the_fma_units_unless_asked(monkeypatch):
    calls = _spy_on_the_op(monkeypatch)
    sample = next(iter(REGISTRY["paged_attention_triton"].samples("bfloat16", 0)))
    ops.paged_attention(**sample.args, impl="triton")
    assert calls == [False]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("tensor_cores", [False, True], ids=["fma", "tensor-cores"])
def test_the_kernel_takes_tf32_only_when_asked_and_exact(monkeypatch, dtype, tensor_cores):
    """The kernel is launched with TF32 products exactly when the caller asks and the inputs fit
    TF32 (bfloat16 / float16; never float32). Only the launch's arguments are read: nothing runs."""
    launched = launch_spy(monkeypatch, attention, "_paged_attention_kernel", "TF32")
    q, k, v, table = _inputs(dtype, 0)
    _paged(q, k, v, table, HD ** -0.5, "triton", tensor_cores=tensor_cores)
    assert launched == [tensor_cores and dtype != torch.float32]
