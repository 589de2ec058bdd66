"""The Mamba state commit `ops.mamba_state_scatter` (docs/semantics.md 6.8).

The registry records (specverify/conformance/registry/) hold the op (torch path) and its Triton kernel
(interpreted on the CPU) against the reference on named samples; this file adds what a record
cannot say: a hand-computed commit, the tracking second call composed with the first, every bit
pattern (NaN payloads included) copied as it is, dst untouched outside the committing requests'
slots, Triton == torch == reference on strided caches, states over several chunks and a batch
split over launches, the switches of the value checks (checked=, a CUDA-graph capture), the
validation errors with their bounds, and keyword-only arguments: seed 004's bug, a multi-layer
update called by position with two index arguments in the wrong order, cannot be written.
"""

from __future__ import annotations

import inspect

import pytest
import torch

import reference
from specverify import ops
from specverify.kernels import state_scatter as kernel

pytestmark = [pytest.mark.kernels, pytest.mark.bitexact]

DEV = "cuda" if torch.cuda.is_available() else "cpu"
IMPLS = ["torch", "triton"]
BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def _scatter(dst, src, slots, steps, impl, **kw):
    got = ops.mamba_state_scatter(dst=dst, src=src, dst_indices=torch.tensor(slots, device=DEV),
                                  step_indices=torch.tensor(steps, device=DEV), impl=impl, **kw)
    assert got is dst
    return dst


def _reference(dst, src, slots, steps) -> torch.Tensor:
    out = reference.mamba_state_scatter(dst=dst.cpu().tolist(), src=src.cpu().tolist(), dst_indices=slots,
                                        step_indices=steps)
    return torch.tensor(out, dtype=dst.dtype).reshape(dst.shape)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.cpu().view(BITS[x.dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("impl", IMPLS)
def test_hand_computed_commit(impl, dtype):
    # src[l, r, d] = [100l + 10r + d, 100l + 10r + d + 0.5]: layer, batch position, node, element.
    # Slots are a permutation of batch positions, so reading src by slot gives other numbers.
    l, r, d, e = torch.meshgrid(torch.arange(2), torch.arange(3), torch.arange(3), torch.arange(2), indexing="ij")
    src = (100 * l + 10 * r + d + 0.5 * e).to(dtype).to(DEV)                # [L=2, bs=3, D=3, 2]
    dst = torch.full((2, 4, 2), -1.0, dtype=dtype, device=DEV)               # [L=2, S=4, 2]
    _scatter(dst, src, [2, 0, 1], [1, -1, 2], impl)
    want = torch.tensor([[[-1, -1], [22, 22.5], [1, 1.5], [-1, -1]],          # request 2 node 2 -> slot 1,
                         [[-1, -1], [122, 122.5], [101, 101.5], [-1, -1]]],   # request 0 node 1 -> slot 2
                        dtype=dtype)
    assert torch.equal(dst.cpu(), want)


def _track_steps(seq_lens, last_steps, interval):
    """The node after which a request's length reaches a multiple of `interval` (the last such
    accepted node), -1 where no accepted node does: the tracking call's own steps."""
    out = []
    for n, last in zip(seq_lens, last_steps):
        hits = [d for d in range(last + 1) if (n + d + 1) % interval == 0]
        out.append(hits[-1] if hits else -1)
    return out


@pytest.mark.parametrize("impl", IMPLS)
def test_tracking_second_call(impl):
    # Five lanes (the last a padded lane: slot -1, step -1), chains of D = 4 nodes; node d holds
    # the state after the token at position seq_len + d. Cache slots 0..7, tracking slots 8..11.
    gen = torch.Generator().manual_seed(4)
    seq_lens, accepted = [5, 10, 3, 14, 0], [2, 4, 1, 3, 0]
    steps = [a - 1 for a in accepted]                                       # topk 1: accepted - 1
    cache_slots, track_slots = [7, 2, 5, 0, -1], [8, 9, 10, 11, -1]
    track = _track_steps(seq_lens, steps, interval=4)
    assert track == [-1, 1, 0, 1, -1]                                       # lengths 12, 4 and 16
    src = torch.randn((3, 5, 4, 2, 3), generator=gen).to(DEV)               # [L, bs, D, 2, 3]
    dst = torch.randn((3, 12, 2, 3), generator=gen).to(DEV)                 # [L, S, 2, 3]
    before = dst.clone()
    _scatter(dst, src, cache_slots, steps, impl)
    after_first = dst.clone()
    _scatter(dst, src, track_slots, track, impl)                            # the second call
    want = _reference(_reference(before, src, cache_slots, steps), src, track_slots, track)
    assert torch.equal(dst.cpu(), want)
    for r, (slot, step) in enumerate(zip(track_slots, track)):
        if step >= 0:
            assert torch.equal(dst[:, slot], src[:, r, step])
    assert torch.equal(dst[:, :8], after_first[:, :8])                      # the first call's slots kept
    untouched = [1, 3, 4, 6, 8]                                             # named by no committing request
    assert torch.equal(dst[:, untouched], before[:, untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("impl", IMPLS)
def test_every_bit_pattern_is_copied_and_nothing_else_is_touched(impl, dtype):
    # Random bit patterns: NaN payloads, signalling NaNs, -0.0, subnormals, infinities. A copy
    # keeps every one; dst keeps its own patterns wherever no committing request writes.
    gen = torch.Generator().manual_seed(7)
    bits = BITS[dtype]
    lo, hi = torch.iinfo(bits).min, torch.iinfo(bits).max
    src = torch.randint(lo, hi, (2, 6, 3, 19), generator=gen, dtype=torch.int64).to(bits).view(dtype).to(DEV)
    dst = torch.randint(lo, hi, (2, 9, 19), generator=gen, dtype=torch.int64).to(bits).view(dtype).to(DEV)
    before = _bits(dst).clone()
    slots, steps = [3, 8, 0, 5, 3, 1], [2, 0, -1, 1, -1, 2]        # request 4 is skipped on request 0's slot
    _scatter(dst, src, slots, steps, impl)
    got = _bits(dst)
    for r, (slot, step) in enumerate(zip(slots, steps)):
        if step >= 0:
            assert torch.equal(got[:, slot], _bits(src)[:, r, step]), f"request {r}"
    untouched = [0, 2, 4, 6, 7]
    assert torch.equal(got[:, untouched], before[:, untouched])


def _case(name):
    """(base buffer, the dst view of it, src, slots, steps): caches that are views of larger buffers."""
    gen = torch.Generator().manual_seed(len(name))
    if name == "strided-slots-and-batch-major-src":
        src = torch.randn((6, 3, 2, 4, 5), generator=gen).transpose(0, 1)           # stored [bs, L, D, ...]
        return torch.randn((3, 14, 4, 5), generator=gen), lambda t: t[:, ::2], src, \
            [6, 0, 3, -1, 4, 1], [1, 0, -1, -1, 1, 0]                                # dst: every other slot
    if name == "state-over-chunks":                                                   # 37 = 2 chunks of 16 + 5
        return torch.randn((2, 5, 37), generator=gen), lambda t: t, torch.randn((2, 4, 3, 37), generator=gen), \
            [4, 1, 0, 2], [2, -1, 0, 1]
    if name == "int32-indices-scalar-state":
        return torch.randn((4, 6), generator=gen), lambda t: t, torch.randn((4, 3, 5), generator=gen), \
            [5, 0, 2], [4, 3, -1]
    raise KeyError(name)


@pytest.mark.parametrize("name", ["strided-slots-and-batch-major-src", "state-over-chunks",
                                  "int32-indices-scalar-state"])
def test_triton_matches_torch_and_reference(name):
    base, view, src, slots, steps = _case(name)
    want = _reference(view(base), src, slots, steps)
    index_dtype = torch.int32 if "int32" in name else torch.int64
    got = {}
    for impl in IMPLS:
        out_base = base.clone().to(DEV)
        out = view(out_base)                                                # the op writes through the view
        kernel.state_scatter_impl(out, src.to(DEV), torch.tensor(slots, dtype=index_dtype, device=DEV),
                                  torch.tensor(steps, dtype=index_dtype, device=DEV), impl, block=16)
        got[impl] = out_base.cpu()
    assert torch.equal(_bits(got["triton"]), _bits(got["torch"]))
    expected_base = base.clone()
    view(expected_base).copy_(want)                                         # slots outside the view untouched
    assert torch.equal(got["torch"], expected_base)


def test_a_batch_larger_than_one_launch_is_split(monkeypatch):
    monkeypatch.setattr(kernel, "MAX_GRID_REQUESTS", 2)
    gen = torch.Generator().manual_seed(3)
    dst, src = torch.randn((2, 8, 3), generator=gen), torch.randn((2, 5, 2, 3), generator=gen)
    slots, steps = [7, 1, 4, 0, 6], [1, 0, -1, 1, 0]
    out = dst.to(DEV)
    _scatter(out, src.to(DEV), slots, steps, "triton")
    assert torch.equal(out.cpu(), _reference(dst, src, slots, steps))


def test_a_state_that_cannot_be_viewed_flat():
    # The state dims transposed: no [L, S, E] view with unit stride exists. impl="triton" says so
    # and writes nothing; "auto" and "torch" take the torch path.
    gen = torch.Generator().manual_seed(5)
    stored = torch.randn((2, 4, 5, 3), generator=gen)
    src = torch.randn((2, 2, 3, 3, 5), generator=gen).to(DEV)
    slots, steps = [3, 0], [2, 1]
    want = _reference(stored.transpose(2, 3), src, slots, steps)
    out = stored.clone().to(DEV).transpose(2, 3)                           # [L, S, 3, 5], not flat
    with pytest.raises(ValueError, match=r"^dst: impl='triton' needs the state dims of dst viewable flat"):
        _scatter(out, src, slots, steps, "triton")
    assert torch.equal(out.cpu(), stored.transpose(2, 3))
    for impl in ("auto", "torch"):
        out = stored.clone().to(DEV).transpose(2, 3)
        _scatter(out, src, slots, steps, impl)
        assert torch.equal(out.cpu(), want)


# ---------------------------------------------------------------------------------------------
# checks


def _small():
    gen = torch.Generator().manual_seed(1)
    return torch.randn((2, 6, 5), generator=gen).to(DEV), torch.randn((2, 3, 4, 5), generator=gen).to(DEV)


@pytest.mark.parametrize("slots, steps, message", [
    ([4, 0, 2], [1, 4, 3], r"^step_indices must be in \[-1, D\) = \[-1, 4\) \(-1 skips the request; D = src's draft "
                           r"nodes\)$"),
    ([4, 0, 2], [1, -1, -3], r"^step_indices must be in \[-1, D\) = \[-1, 4\)"),
    ([4, 6, 2], [1, 0, 3], r"^dst_indices of committing requests \(step_indices >= 0\) must be slots in \[0, 6\) "
                           r"\(dst's slots\)$"),
    ([4, 0, 4], [1, 2, 0], r"^dst_indices must be distinct among committing requests \(step_indices >= 0\): two "
                           r"requests would write one slot$"),
])
@pytest.mark.parametrize("impl", IMPLS)
def test_value_errors_name_the_argument_and_the_bound(impl, slots, steps, message):
    dst, src = _small()
    before = dst.clone()
    with pytest.raises(ValueError, match=message):
        _scatter(dst, src, slots, steps, impl, checked=True)
    assert torch.equal(dst, before)                                         # checked before anything is written


@pytest.mark.parametrize("impl", IMPLS)
def test_skipped_requests_may_name_any_slot(impl):
    # A skipped request's slot is never read: -1, S, or a committing request's slot are all fine.
    dst, src = _small()
    for slots in ([4, 4, -1], [6, 1, 1]):
        out = dst.clone()
        _scatter(out, src, slots, [-1, 2, -1], impl, checked=True)
        want = dst.clone()
        want[:, slots[1]] = src[:, 1, 2]
        assert torch.equal(out, want), slots


@pytest.mark.parametrize("impl", IMPLS)
def test_unchecked_out_of_range_requests_write_nothing(impl):
    # checked=False: a step past the nodes, a slot past the cache or below 0 commit nothing (no
    # write outside the buffers); the in-range request is still committed.
    dst, src = _small()
    before = dst.clone()
    for slots, steps in (([4, 6, 2], [1, 0, 3]), ([4, -2, 2], [1, 0, 3]), ([4, 0, 2], [1, 4, -5])):
        out = before.clone()
        _scatter(out, src, slots, steps, impl, checked=False)
        want = before.clone()
        for r, (slot, step) in enumerate(zip(slots, steps)):
            if 0 <= step < 4 and 0 <= slot < 6:
                want[:, slot] = src[:, r, step]
        assert torch.equal(out, want), (slots, steps)


@pytest.mark.parametrize("impl", IMPLS)
def test_unchecked_duplicate_slots_leave_one_of_the_states(impl):
    """Element by element: on a GPU the kernel's programs copy chunks of each request's state and
    race on a duplicated slot, which may end up holding chunks of both states (an H100 did)."""
    dst, src = _small()
    _scatter(dst, src, [3, 1, 3], [0, 2, 2], impl, checked=False)
    assert torch.equal(dst[:, 1], src[:, 1, 2])
    got, first, second = dst[:, 3], src[:, 0, 0], src[:, 2, 2]
    assert not torch.equal(first, second), "the two states must differ for the test to see anything"
    assert ((got == first) | (got == second)).all(), "a duplicated slot holds a value of neither state"


def test_value_checks_run_on_the_cpu_by_default_and_never_inside_a_capture(monkeypatch):
    dst, src = _small()
    duplicate = dict(dst_indices=torch.tensor([3, 1, 3], device=DEV), step_indices=torch.tensor([0, 2, 2], device=DEV))
    if DEV == "cpu":
        with pytest.raises(ValueError, match="must be distinct"):
            ops.mamba_state_scatter(dst=dst, src=src, **duplicate)            # checked=None: the CPU checks
    monkeypatch.setattr(ops, "capturing", lambda device=None: True)           # as inside a CUDA-graph capture
    ops.mamba_state_scatter(dst=dst, src=src, **duplicate, checked=True)      # no device read: no check


# ---------------------------------------------------------------------------------------------
# seed 004: a positional-argument mix-up in the multi-layer Mamba update


def test_every_argument_is_keyword_only():
    params = inspect.signature(ops.mamba_state_scatter).parameters.values()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)


def test_a_positional_call_is_a_type_error_not_a_silent_swap():
    # The seed's bug: a caller passed (slots, steps) where (steps, slots) was meant. Here the swap
    # would even pass every check (both in range, distinct) and commit the wrong states; by
    # position it cannot be written at all.
    dst, src = _small()
    slots, steps = torch.tensor([2, 1, 0], device=DEV), torch.tensor([1, 2, 0], device=DEV)
    with pytest.raises(TypeError, match="takes 0 positional arguments"):
        ops.mamba_state_scatter(dst, src, slots, steps)
    with pytest.raises(TypeError, match="takes 0 positional arguments"):
        ops.mamba_state_scatter(dst, src=src, dst_indices=slots, step_indices=steps)
    right = ops.mamba_state_scatter(dst=dst.clone(), src=src, dst_indices=slots, step_indices=steps)
    swapped = ops.mamba_state_scatter(dst=dst.clone(), src=src, dst_indices=steps, step_indices=slots)
    assert not torch.equal(right, swapped)


# ---------------------------------------------------------------------------------------------
# CUDA: no host read, a captured graph, offsets past int32


@pytest.mark.cuda
def test_cuda_path_reads_nothing_back_and_captures():
    """Triton with the default checks (None: off on CUDA) under sync-debug "error", then captured
    in a CUDA graph and replayed with other indices (the second, tracking-style call)."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(11)
    src = torch.randn((3, 4, 3, 2, 40), generator=gen).to(dev, torch.bfloat16)
    dst = torch.randn((3, 9, 2, 40), generator=gen).to(dev, torch.bfloat16)
    slots, steps = torch.tensor([5, 0, 8, 2], device=dev), torch.tensor([2, -1, 0, 1], device=dev)
    before = dst.clone()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ops.mamba_state_scatter(dst=dst, src=src, dst_indices=slots, step_indices=steps)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(dst.cpu(), _reference(before, src, slots.tolist(), steps.tolist()))
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops.mamba_state_scatter(dst=dst, src=src, dst_indices=slots, step_indices=steps, checked=True)
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        ops.mamba_state_scatter(dst=dst, src=src, dst_indices=slots, step_indices=steps, checked=True)
    dst.copy_(before)
    slots.copy_(torch.tensor([1, 3, 4, 6])), steps.copy_(torch.tensor([-1, 2, 1, 0]))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(dst.cpu(), _reference(before, src, [1, 3, 4, 6], [-1, 2, 1, 0]))


@pytest.mark.cuda
def test_cuda_offsets_past_int32():
    """A request whose intermediate-cache row starts past element 2**31: the kernel's offsets are
    int64 (an int32 batch offset wraps negative there). src is a view over a 4 GiB buffer whose
    request stride is 2**30 elements; only its three rows are filled."""
    dev = torch.device("cuda")
    stride = 2 ** 30
    state = 96
    storage = torch.empty(2 * stride + state, dtype=torch.bfloat16, device=dev)
    src = storage.as_strided((1, 3, 1, state), (state, stride, state, 1))   # [L=1, bs=3, D=1, E]
    gen = torch.Generator().manual_seed(13)
    rows = torch.randn((3, state), generator=gen).to(dev, torch.bfloat16)
    for r in range(3):
        src[0, r, 0].copy_(rows[r])
    dst = torch.zeros((1, 4, state), dtype=torch.bfloat16, device=dev)
    ops.mamba_state_scatter(dst=dst, src=src, dst_indices=torch.tensor([3, 0, 1], device=dev),
                            step_indices=torch.tensor([0, -1, 0], device=dev), impl="triton")
    torch.cuda.synchronize()
    assert torch.equal(dst[0, 1], rows[2]) and torch.equal(dst[0, 3], rows[0])
    assert not dst[0, 0].any() and not dst[0, 2].any()
    del storage, src
    torch.cuda.empty_cache()
