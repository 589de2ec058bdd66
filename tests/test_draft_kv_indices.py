"""Naive EAGLE's flat KV index list (`ops.create_draft_kv_indices`) and the decode attention that
reads it (`ops.decode_attention_indexed`), docs/semantics.md 6.6.

The registry records (specverify/conformance/registry/) hold both ops against the reference on named
samples; this file adds what a record cannot say: the offsets 2*cumsum(L+2) - b and kv_indptr on
a hand-written example, tables made by the real `SlotTable` (page sizes 1, 4, 16, pages
interleaved between requests), the torch path up to bs 64 and the Triton kernel (interpreted on
the CPU) on small batches, a padded grid, strided buffers, the untouched tail of kv_indices, the
cut at the capacity of an unchecked call, the errors, the output dtype of the attention, its
bfloat16 rounding (exact ties both ways through the op, and float32 bit patterns of every class
through the kernel's rounding: subnormals, the largest finite value, infinities, NaN payloads), and
the two ops together against `paged_attention` of the same verify (a causal chain of two tokens).
Integers compare exactly.
"""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

import reference
from specverify import ops
from specverify.kernels.draft_kv_indices import draft_kv_indices_impl
from specverify.kernels.rounding import bfloat16_nearest_even
from specverify.models import SlotTable, chain_mask
from tests.support.asserts import assert_close

pytestmark = pytest.mark.kernels

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SENTINEL = -7


def _table(lens: list[int], page_size: int, seed: int, *, max_context: int | None = None):
    """(req_to_token, rows) from a SlotTable: every request reserves its L + 2 verify indices in
    two rounds, so the pages of different requests interleave in the pool."""
    gen = torch.Generator().manual_seed(seed)
    max_context = max([1, *lens]) + 2 if max_context is None else max_context
    num_pages = 2 + sum(-(-(n + 2) // page_size) for n in lens)
    table = SlotTable(max_requests=len(lens) + 2, max_context=max_context, num_pages=num_pages, page_size=page_size)
    spare = table.alloc_row()                                     # a row nobody in the batch uses
    rows = [table.alloc_row() for _ in lens]
    for share in (2, 1):
        for row, n in zip(rows, lens):
            table.reserve(row, (n + 2) // share)
    table.reserve(spare, 1)
    order = torch.randperm(len(rows), generator=gen)              # rows not in table order
    return table.req_to_token.clone(), torch.tensor(rows, dtype=torch.int64)[order]


def _buffers(bs: int, capacity: int, dtype=torch.int64):
    return (torch.full((2 * bs + 1,), SENTINEL, dtype=dtype, device=DEV),
            torch.full((capacity,), SENTINEL, dtype=dtype, device=DEV))


def _expected(table, rows, lens, capacity):
    indptr, indices = reference.create_draft_kv_indices(req_to_token=table.tolist(), rows=rows.tolist(),
                                                        seq_lens=list(lens))
    tail = [SENTINEL] * (capacity - len(indices))
    return indptr, indices + tail


def _run(table, rows, lens, capacity, impl, dtype=torch.int64, **kw):
    kv_indptr, kv_indices = _buffers(len(lens), capacity, dtype)
    got = ops.create_draft_kv_indices(req_to_token=table.to(DEV), rows=rows.to(DEV),
                                      seq_lens=torch.tensor(lens, dtype=torch.int64, device=DEV),
                                      kv_indptr=kv_indptr, kv_indices=kv_indices, impl=impl, **kw)
    assert got[0] is kv_indptr and got[1] is kv_indices
    return kv_indptr.cpu().tolist(), kv_indices.cpu().tolist()


# ---------------------------------------------------------------------------------------------
# create_draft_kv_indices


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_hand_example_offsets_and_indptr(impl):
    # Three requests, L = 2, 0, 3 -> s = L + 2 = 4, 2, 5; footprints 2s - 1 = 7, 3, 9.
    table = torch.tensor([[90, 91, 92, 93, 94, 95, 96],
                          [10, 11, 12, 13, 14, 15, 16],
                          [20, 21, 22, 23, 24, 25, 26],
                          [30, 31, 32, 33, 34, 35, 36]])
    rows, lens = torch.tensor([2, 0, 3]), [2, 0, 3]
    s = torch.tensor(lens) + 2
    b = torch.arange(3)
    offsets = 2 * (torch.cumsum(s, 0) - s) - b                    # 2*cumsum_exclusive(L + 2) - b
    assert offsets.tolist() == [0, 7, 10]
    indptr, indices = _run(table, rows, lens, 19 + 2, impl)
    assert indptr == [0, 3, 7, 8, 10, 14, 19]
    for i in range(3):                                            # kv_indptr[2b+1] = off+s-1, [2b+2] = off+2s-1
        assert indptr[2 * i + 1] == offsets[i] + s[i] - 1 and indptr[2 * i + 2] == offsets[i] + 2 * s[i] - 1
    assert indices == [20, 21, 22, 20, 21, 22, 23,                # row 2, L=2: 0..2 then 0..3
                       90, 90, 91,                                # row 0, L=0: 0 then 0..1
                       30, 31, 32, 33, 30, 31, 32, 33, 34,        # row 3, L=3: 0..3 then 0..4
                       SENTINEL, SENTINEL]                        # past the total: untouched


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("bs", [1, 2, 17, 64])
def test_torch_path_matches_reference(bs, page_size, seed):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, 30, (bs,), generator=gen).tolist()
    lens[0] = 0                                                   # L = 0 in every batch
    table, rows = _table(lens, page_size, seed, max_context=max(lens) + 2 + 3)
    capacity = 2 * sum(lens) + 3 * bs + bs % 3                    # bs 1, 64: exact; 2, 17: a tail
    assert list(_run(table, rows, lens, capacity, "torch")) == list(_expected(table, rows, lens, capacity))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_triton_kernel_matches_reference(page_size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    lens = [0, *torch.randint(0, 70, (4,), generator=gen).tolist()]     # lists up to 2 copy blocks
    table, rows = _table(lens, page_size, seed)
    capacity = 2 * sum(lens) + 3 * len(lens) + 4
    want = _expected(table, rows, lens, capacity)
    assert list(_run(table.to(dtype), rows.to(dtype), lens, capacity, "triton", dtype)) == list(want)


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_padded_grid_and_strided_buffers(impl):
    """Programs past the batch write nothing; every tensor may be a strided view."""
    lens = [3, 0, 6]
    table, rows = _table(lens, 4, 5)
    total = 2 * sum(lens) + 3 * len(lens)
    packed = torch.stack([rows, torch.tensor(lens)], 1)                  # columns of stride 2
    indptr_store = torch.full((2 * (2 * len(lens) + 1),), SENTINEL, device=DEV)
    indices_store = torch.full((2 * (total + 3),), SENTINEL, device=DEV)
    kv_indptr, kv_indices = indptr_store[::2], indices_store[::2]
    draft_kv_indices_impl(table.t().contiguous().t().to(DEV), packed[:, 0].to(DEV), packed[:, 1].to(DEV),
                          kv_indptr, kv_indices, impl, num_programs=len(lens) + 5)
    want_indptr, want_indices = _expected(table, rows, lens, total + 3)
    assert kv_indptr.tolist() == want_indptr and kv_indices.tolist() == want_indices
    assert indptr_store[1::2].eq(SENTINEL).all() and indices_store[1::2].eq(SENTINEL).all()   # the gaps


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_unchecked_small_capacity_is_cut_never_overrun(impl):
    lens = [5, 2]
    table, rows = _table(lens, 1, 3)
    total = 2 * sum(lens) + 3 * len(lens)                                # 20
    table, rows, seq_lens = table.to(DEV), rows.to(DEV), torch.tensor(lens, device=DEV)
    store = torch.full((total,), SENTINEL, device=DEV)
    kv_indptr, _ = _buffers(len(lens), 0)
    ops.create_draft_kv_indices(req_to_token=table, rows=rows, seq_lens=seq_lens, kv_indptr=kv_indptr,
                                kv_indices=store[:total - 6], impl=impl, checked=False)
    want_indptr, want_indices = _expected(table.cpu(), rows.cpu(), lens, total)
    assert kv_indptr.tolist() == want_indptr
    assert store[:total - 6].tolist() == want_indices[:total - 6] and store[total - 6:].eq(SENTINEL).all()
    with pytest.raises(ValueError, match=r"kv_indices holds 14 entries, the batch needs 20"):
        ops.create_draft_kv_indices(req_to_token=table, rows=rows, seq_lens=seq_lens, kv_indptr=kv_indptr,
                                    kv_indices=store[:total - 6], impl=impl, checked=True)


def test_empty_batch_sets_indptr_zero_and_touches_nothing_else():
    for impl in ("torch", "triton"):
        kv_indptr, kv_indices = _buffers(0, 4)
        ops.create_draft_kv_indices(req_to_token=torch.zeros((1, 3), dtype=torch.int64, device=DEV),
                                    rows=torch.zeros(0, dtype=torch.int64, device=DEV),
                                    seq_lens=torch.zeros(0, dtype=torch.int64, device=DEV),
                                    kv_indptr=kv_indptr, kv_indices=kv_indices, impl=impl)
        assert kv_indptr.tolist() == [0] and kv_indices.eq(SENTINEL).all()


ERRORS = {
    "int16-rows": (dict(rows=torch.tensor([0, 1], dtype=torch.int16)), ValueError, "rows must be int32 or int64"),
    "indptr-one-short": (dict(kv_indptr=torch.zeros(4, dtype=torch.int64)), ValueError,
                         r"kv_indptr must have 2\*bs \+ 1 = 5 entries"),
    "capacity": (dict(kv_indices=torch.zeros(13, dtype=torch.int64)), ValueError,
                 r"kv_indices holds 13 entries, the batch needs 14"),
    "past-max-context": (dict(seq_lens=torch.tensor([4, 1])), ValueError, r"seq_lens \+ 2 must be <= 5"),
    "table-float": (dict(req_to_token=torch.zeros((3, 5))), ValueError, "req_to_token must be int32 or int64"),
    "seq-lens-list": (dict(seq_lens=[3, 1]), TypeError, "seq_lens must be a torch.Tensor"),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_errors_name_the_argument_and_the_bound(name):
    changes, exc, match = ERRORS[name]
    args = dict(req_to_token=torch.arange(15).view(3, 5), rows=torch.tensor([2, 0]), seq_lens=torch.tensor([3, 1]),
                kv_indptr=torch.zeros(5, dtype=torch.int64), kv_indices=torch.zeros(14, dtype=torch.int64))
    with pytest.raises(exc, match=match):
        ops.create_draft_kv_indices(**{**args, **changes})


# ---------------------------------------------------------------------------------------------
# decode_attention_indexed


def _attention_inputs(seed: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn((4, 4, 16), generator=gen).to(dtype)
    k = torch.randn((20, 2, 16), generator=gen).to(dtype)
    v = torch.randn((20, 2, 16), generator=gen).to(dtype)
    kv_indptr = torch.tensor([0, 5, 5, 12, 13])
    kv_indices = torch.randint(0, 20, (13,), generator=gen)
    return q, k, v, kv_indptr, kv_indices


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_attention_output_is_the_float32_result_in_q_dtype(dtype, impl):
    q, k, v, kv_indptr, kv_indices = (t.to(DEV) for t in _attention_inputs(11, dtype))
    out = ops.decode_attention_indexed(q, k, v, kv_indptr, kv_indices, scale=0.25, impl=impl)
    wide = ops.decode_attention_indexed(q, k, v, kv_indptr, kv_indices, scale=0.25, impl=impl, out_dtype=torch.float32)
    assert out.dtype == dtype and wide.dtype == torch.float32
    assert torch.equal(out, wide.to(dtype))
    assert torch.count_nonzero(out[1]) == 0                              # the empty list: zeros


# Pairs of cache values whose float32 mean lies exactly halfway between two neighbours of the
# 16-bit format (ties to the even one, down and up, both signs), is exact, overflows float32 on
# the way (the sum of two maxima), or meets inf and NaN.
def _ulp_after(x: float, dtype) -> float:
    t = torch.tensor([x], dtype=dtype)
    return (t.view(torch.int16) + 1).view(dtype).item()


def _tie_pairs(dtype) -> list[tuple[float, float]]:
    one = 1.0
    up1 = _ulp_after(one, dtype)                  # odd last bit
    up2 = _ulp_after(up1, dtype)                  # even last bit
    big = torch.finfo(dtype).max
    return [(one, up1),                           # mean halfway 1 | up1: to 1 (even)
            (up1, up2),                           # halfway up1 | up2: to up2 (even)
            (-up1, -up2),                         # the same, negative
            (one, up2),                           # mean up1: exact
            (big, big),                           # bfloat16: the float32 sum overflows to inf
            (float("inf"), 1.0), (float("-inf"), -1.0),
            (float("nan"), 1.0)]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")    # the interpreter's sum of two maxima
@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_attention_output_rounds_ties_to_even_like_torch(dtype, impl):
    """Each query sees two keys of equal score (zero q and keys): its output is the float32 mean of
    two cache values, rounded once to q's dtype. The means sit on the hard cases (exact ties both
    ways, exact, an overflow, infinities, NaN): the kernel's store rounds each as `.to(dtype)`
    rounds the float32 mean (NaN stays NaN)."""
    pairs = _tie_pairs(dtype)
    n, heads, hd = len(pairs), 2, 16
    v = torch.zeros((2 * n, 1, hd), dtype=torch.float32)
    for i, (a, b) in enumerate(pairs):
        v[2 * i], v[2 * i + 1] = a, b
    v = v.to(dtype)
    k = torch.zeros_like(v)
    q = torch.zeros((n, heads, hd), dtype=dtype)
    kv_indptr = torch.arange(0, 2 * n + 1, 2, dtype=torch.int64)
    kv_indices = torch.arange(2 * n, dtype=torch.int64)
    args = [t.to(DEV) for t in (q, k, v, kv_indptr, kv_indices)]
    out = ops.decode_attention_indexed(*args, scale=1.0, impl=impl).cpu()
    mean = (v[0::2].float() + v[1::2].float()) / 2                                  # [n, 1, hd]
    want = mean.expand(n, heads, hd).to(dtype)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(out), nan)
    apart = (out.view(torch.int16) != want.view(torch.int16)) & ~nan
    assert not apart.any(), f"{impl} {dtype}: rows {sorted(set(apart.nonzero()[:, 0].tolist()))} round apart from torch"
    assert want[0, 0, 0].item() == 1.0 and want[1, 0, 0].item() == _ulp_after(_ulp_after(1.0, dtype), dtype)


@triton.jit
def _round_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + i, bfloat16_nearest_even(tl.load(x_ptr + i, mask=i < n)), mask=i < n)


# float32 bit patterns on every class the rounding meets: ties (to even down and up, negative),
# one ulp either side of a tie, zeros and subnormals, the largest finite value (down, a tie and
# above it round to inf), infinities, and NaNs whose payload would carry into the exponent.
ROUNDING_PATTERNS = [0x3F808000, 0x3F818000, 0xBF808000, 0x3F80FFFF, 0x3F807FFF,
                     0x00000000, 0x80000000, 0x00000001, 0x00008000, 0x00018000, 0x007FFFFF,
                     0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0xFF7F8000,
                     0x7F800000, 0xFF800000,
                     0x7FC00000, 0xFFC00000, 0x7FFFFFFF, 0xFFFFFFFF, 0x7F800001, 0x7FBFFFFF, 0x7FFF8000]


def test_bfloat16_rounding_equals_torch_bit_for_bit():
    """The kernel's float32 -> bfloat16 rounding (`kernels.rounding.bfloat16_nearest_even`) on the patterns above
    gives torch's `.to(torch.bfloat16)` bits for every number, and the quiet NaN 0x7FC0 for every NaN
    (a payload of ones must not carry into the sign and come out as -0)."""
    bits = torch.tensor(ROUNDING_PATTERNS, dtype=torch.int64).to(torch.int32)       # two's complement
    x = bits.view(torch.float32)
    y = torch.empty(len(ROUNDING_PATTERNS), dtype=torch.bfloat16, device=DEV)
    _round_kernel[(1,)](x.to(DEV), y, len(ROUNDING_PATTERNS), BLOCK=32)
    y = y.cpu()
    want = x.to(torch.bfloat16)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(y), nan)
    apart = [hex(ROUNDING_PATTERNS[i]) for i in (y.view(torch.int16) != want.view(torch.int16)).nonzero()[:, 0].tolist()
             if not nan[i]]
    assert not apart, f"rounded apart from torch: {apart}"
    assert (y.view(torch.int16)[nan] == 0x7FC0).all(), "a NaN must come out as the quiet NaN 0x7FC0"


def test_float64_takes_the_torch_path_in_float64():
    q, k, v, kv_indptr, kv_indices = (t.double() if t.is_floating_point() else t for t in _attention_inputs(12))
    out = ops.decode_attention_indexed(q, k, v, kv_indptr, kv_indices, scale=0.3, impl="triton")
    want = reference.decode_attention_indexed(q.numpy(), k.numpy(), v.numpy(), kv_indptr.numpy(), kv_indices.numpy(),
                                              scale=0.3)
    assert out.dtype == torch.float64
    assert_close(out, torch.from_numpy(want), "float64", "float64 decode_attention_indexed vs the reference")


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_the_two_ops_give_the_paged_attention_of_the_verify(impl):
    """Naive EAGLE's verify: two tokens per request at positions L, L + 1, each a decode query over
    its list, equal paged attention of a causal chain of two tokens over kv_lens = L."""
    lens = [0, 7, 3]
    bs, nh, nkv, hd = len(lens), 4, 2, 16
    table, rows = _table(lens, 4, 21)
    gen = torch.Generator().manual_seed(21)
    num_slots = int(table.max()) + 1
    k, v = torch.randn((num_slots, nkv, hd), generator=gen), torch.randn((num_slots, nkv, hd), generator=gen)
    q = torch.randn((bs, 2, nh, hd), generator=gen)
    table, rows, k, v, q = (t.to(DEV) for t in (table, rows, k, v, q))
    kv_indptr = torch.empty(2 * bs + 1, dtype=torch.int64, device=DEV)
    kv_indices = torch.empty(2 * sum(lens) + 3 * bs, dtype=torch.int64, device=DEV)
    seq_lens = torch.tensor(lens, device=DEV)
    ops.create_draft_kv_indices(req_to_token=table, rows=rows, seq_lens=seq_lens, kv_indptr=kv_indptr,
                                kv_indices=kv_indices, impl=impl)
    got = ops.decode_attention_indexed(q.reshape(bs * 2, nh, hd), k, v, kv_indptr, kv_indices,
                                       scale=1 / math.sqrt(hd), impl=impl)
    mask, _ = chain_mask(bs, 2, DEV)
    want = ops.paged_attention(q=q, k_cache=k, v_cache=v, req_to_token=table, rows=rows, kv_lens=seq_lens,
                               q_lens=torch.full((bs,), 2, device=DEV), tree_mask=mask.contiguous(), impl="torch")
    assert_close(got.view(bs, 2, nh, hd), want, "float32", f"naive EAGLE verify attention ({impl}) vs paged_attention")


@pytest.mark.cuda
def test_cuda_paths_read_nothing_back_and_capture():
    """On CUDA both ops (Triton, default checks) run under sync-debug "error" and in a CUDA graph."""
    lens = [5, 0, 9]
    table, rows = _table(lens, 4, 2)
    dev = torch.device("cuda")
    table, rows, seq_lens = table.to(dev), rows.to(dev), torch.tensor(lens, device=dev)
    kv_indptr = torch.empty(7, dtype=torch.int64, device=dev)
    kv_indices = torch.full((64,), SENTINEL, dtype=torch.int64, device=dev)
    gen = torch.Generator().manual_seed(2)
    k = torch.randn((int(table.max()) + 1, 1, 16), generator=gen).to(dev, torch.bfloat16)
    q = torch.randn((6, 2, 16), generator=gen).to(dev, torch.bfloat16)

    def step():
        ops.create_draft_kv_indices(req_to_token=table, rows=rows, seq_lens=seq_lens, kv_indptr=kv_indptr,
                                    kv_indices=kv_indices)
        return ops.decode_attention_indexed(q, k, k, kv_indptr, kv_indices, scale=0.25)

    torch.cuda.set_sync_debug_mode("error")
    try:
        eager = step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    want_indptr, want_indices = _expected(table.cpu(), rows.cpu(), lens, 64)
    assert kv_indptr.tolist() == want_indptr and kv_indices.tolist() == want_indices
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()                                                           # warm-up off the default stream
    torch.cuda.current_stream().wait_stream(stream)
    kv_indices.fill_(SENTINEL)
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    assert kv_indices.tolist() == want_indices and torch.equal(captured, eager)
