"""The Mamba state commit (docs/semantics.md 6.8).

Records of the op registry (specverify/conformance/registry/__init__.py)."""

from __future__ import annotations


import torch

import reference
from specverify import dtypes, ops
from specverify.kernels.state_scatter import state_scatter_impl
from specverify.conformance import strategies as S
from specverify.conformance.registry.core import EXACT, ErrorInput, OpSpec, SampleInput, only


# ---------------------------------------------------------------------------------------------
# Mamba state commit (docs/semantics.md 6.8): each request's state after its last accepted node,
# copied from the intermediate cache [L, bs, D, *state] into its slot of the state cache
# [L, S, *state]. The torch record goes through the op; the Triton record through the kernel
# wrapper with a small state chunk (interpreted on the CPU), so its states straddle chunk edges.
# A pure copy: dst compares exactly, and bit for bit (dst_bits) for NaN, -0.0 and subnormals.

MSS_TRITON_BLOCK = 32
MSS_BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
            torch.bfloat16: torch.int16}
MSS_MANTISSA_BITS = {torch.float64: 52, torch.float32: 23, torch.float16: 10,
                     torch.bfloat16: 7}   # subnormal codes: [1, 2**bits)


def _mss_bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(MSS_BITS[x.dtype])


def _mss_values(gen, shape, dtype, kind):
    """Random states of `dtype`. kind "nan": about a third of the entries NaN, ±inf, ±0.0 or ±max;
    "ulp": the draft nodes of one (layer, request) differ by one ulp per node (shape [L, bs, D, ...]:
    node d = base + d ulps), a sixth of the bases subnormal; "plain": normal values (`S.normalish`)."""
    x = S.cast(S.normalish(gen, shape), dtype)
    if kind == "nan":
        big = torch.finfo(dtype).max
        specials = S.cast(torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, big, -big],
                                       dtype=torch.float64), dtype)
        pick = torch.randint(0, 3 * specials.numel(), shape, generator=gen)
        x = torch.where(pick < specials.numel(), specials[pick.clamp(max=specials.numel() - 1)], x)
    elif kind == "ulp":
        bits = _mss_bits(x).to(torch.int64)
        sub = torch.randint(1, 2 ** MSS_MANTISSA_BITS[dtype] - 8, shape, generator=gen)      # subnormal codes
        bits = torch.where(torch.randint(0, 6, shape, generator=gen) == 0, sub, bits)
        if len(shape) >= 3:
            bits = bits[:, :, :1] + torch.arange(shape[2]).view(1, 1, -1, *([1] * (len(shape) - 3)))
        x = bits.to(MSS_BITS[dtype]).view(dtype)
    return x


def _mss_sample(name, seed, dtype, *, layers, num_slots, num_steps, state, slots, steps, kind="plain",
                index_dtype=torch.int64) -> SampleInput:
    """dst [layers, num_slots, *state] and src [layers, bs, num_steps, *state] of `dtype` (values of
    `_mss_values`' kind; dst's own values differ from src's); request r commits node steps[r] into
    slot slots[r]. dst holds NaN / ulp-neighbour values too for those kinds, so untouched slots
    must keep them bit for bit."""
    gen = torch.Generator().manual_seed(seed)
    torch_dtype = dtypes.dtype_info(dtype).torch_dtype
    bs = len(slots)
    src = _mss_values(gen, (layers, bs, num_steps, *state), torch_dtype, kind)
    dst = _mss_values(gen, (layers, num_slots, *state), torch_dtype, kind)
    if kind == "ulp":
        dst = (_mss_bits(dst) - 1).view(torch_dtype)
    return SampleInput(name, {"dst": dst, "src": src, "dst_indices": torch.tensor(slots, dtype=index_dtype),
                              "step_indices": torch.tensor(steps, dtype=index_dtype)}, seed)


def _mss_random(name, seed, dtype, *, layers, num_slots, bs, num_steps, state, skip=0.3, kind="plain"):
    """bs <= num_slots requests on distinct slots; each skipped with probability `skip`, and a
    skipped request's slot is then what a padded lane may hold: -1, num_slots, or a slot another
    request commits to."""
    gen = torch.Generator().manual_seed(seed + 1)
    slots = torch.randperm(num_slots, generator=gen)[:bs].tolist()
    steps = torch.randint(0, num_steps, (bs,), generator=gen).tolist()
    for r in range(bs):
        if bool(S.coins(gen, (), skip)):
            steps[r] = -1
            slots[r] = (-1, num_slots, slots[0], slots[r])[int(torch.randint(0, 4, (), generator=gen))]
    return _mss_sample(name, seed, dtype, layers=layers, num_slots=num_slots, num_steps=num_steps, state=state,
                       slots=slots, steps=steps, kind=kind)


def _mss_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        a = s.args
        dst = a["dst"].clone()                                              # the op writes in place
        if which == "triton":
            state_scatter_impl(dst, a["src"], a["dst_indices"], a["step_indices"], "triton", block=MSS_TRITON_BLOCK)
        elif ops.mamba_state_scatter(**{**a, "dst": dst}, impl=which) is not dst:
            raise AssertionError("mamba_state_scatter must return the dst it was given")
        return {"dst": dst, "dst_bits": _mss_bits(dst)}
    return impl


def _mss_ref(s: SampleInput) -> dict:
    a = s.args
    out = reference.mamba_state_scatter(dst=a["dst"].tolist(), src=a["src"].tolist(),
                                        dst_indices=a["dst_indices"].tolist(), step_indices=a["step_indices"].tolist())
    dst = torch.tensor(out, dtype=a["dst"].dtype).reshape(a["dst"].shape)
    return {"dst": dst, "dst_bits": _mss_bits(dst)}


def _mss_samples(small: bool):
    def samples(dtype: str, seed: int):
        def one(name, i, **kw):
            return _mss_sample(name, seed + i, dtype, **kw)
        shape = dict(layers=2, num_slots=7, num_steps=4, state=(5,))
        yield one("empty-batch", 0, **shape, slots=[], steps=[])
        yield one("boundary-slot-0-and-last-step-last", 1, **shape, slots=[6, 3, 0], steps=[3, 0, 3])
        yield one("all-skipped", 2, **shape, slots=[2, 5, 0], steps=[-1, -1, -1])
        yield one("mixed-steps", 3, layers=3, num_slots=9, num_steps=5, state=(2, 3),
                  slots=[4, 8, 1, 0, 6], steps=[2, 0, -1, 4, 1])
        # Padded lanes: skipped requests whose slots are -1, S, or a slot another request commits to.
        yield one("skips-with-padded-lane-slots", 4, **shape, slots=[-1, 3, 3, 7, 5], steps=[-1, 1, -1, -1, 2])
        # The second call of a commit: tracking slots (the top of the cache, every other one) with
        # their own steps; most requests cross no tracking boundary this cycle.
        yield one("tracking-second-call", 5, layers=2, num_slots=12, num_steps=4, state=(3,),
                  slots=[6, 8, 10, 7], steps=[-1, 2, 0, -1])
        yield one("nan-inf-signed-zero-copied", 6, **shape, slots=[1, 4, 6], steps=[2, -1, 0], kind="nan")
        yield one("ulp-adjacent-nodes-and-subnormals", 7, **shape, slots=[5, 2, 0], steps=[1, 2, -1], kind="ulp")
        yield one("int32-indices", 8, **shape, slots=[3, 0], steps=[0, 3], index_dtype=torch.int32)
        yield one("scalar-state", 9, layers=3, num_slots=4, num_steps=2, state=(), slots=[2, 0, 3], steps=[1, 0, -1])
        b = MSS_TRITON_BLOCK
        yield one("boundary-state-at-chunk-edges", 10, layers=1, num_slots=5, num_steps=2, state=(2 * b + 1,),
                  slots=[4, 1, 2], steps=[1, 0, 1])
        yield one("boundary-state-one-chunk", 11, layers=2, num_slots=3, num_steps=3, state=(b,),
                  slots=[2, 0], steps=[2, 1])
        if not small:
            yield _mss_random("large-L4-bs64", seed + 12, dtype, layers=4, num_slots=80, bs=64, num_steps=5,
                              state=(2, 3, 16))
        for i in range(1 if small else 3):
            gen = torch.Generator().manual_seed(seed + 20 + i)
            num_slots = int(torch.randint(1, 10, (), generator=gen))
            yield _mss_random(f"random-{i}", seed + 30 + i, dtype, layers=int(torch.randint(1, 4, (), generator=gen)),
                              num_slots=num_slots, bs=int(torch.randint(0, num_slots + 1, (), generator=gen)),
                              num_steps=int(torch.randint(1, 5, (), generator=gen)), state=((3,), (2, 5), (4, 9))[i % 3],
                              kind=("plain", "nan", "ulp")[i % 3])
    return samples


def _mss_recipe(dtype: str):
    from hypothesis import strategies as st
    return st.tuples(st.integers(0, 2**16), st.integers(1, 3), st.integers(1, 8), st.integers(0, 8), st.integers(1, 4),
                     st.sampled_from(((), (3,), (3, 13))), st.sampled_from((0.0, 0.3, 1.0)),
                     st.sampled_from(("plain", "nan", "ulp"))).map(
        lambda t: _mss_random(f"hyp-{t[7]}", t[0], dtype, layers=t[1], num_slots=t[2], bs=min(t[3], t[2]),
                              num_steps=t[4], state=t[5], skip=t[6], kind=t[7]))


def _mss_errors(which: str):
    base = _mss_sample("base", 0, "float32", layers=2, num_slots=6, num_steps=4, state=(5,),
                       slots=[4, 0, 2], steps=[1, -1, 3]).args

    def call(**changes):
        return lambda: ops.mamba_state_scatter(**{**base, **changes}, impl=which)

    def errors():
        dst, src, slots, steps = base["dst"], base["src"], base["dst_indices"], base["step_indices"]
        yield ErrorInput("positional-call", lambda: ops.mamba_state_scatter(dst, src, slots, steps), TypeError,
                         "takes 0 positional arguments", "positional")
        yield ErrorInput("dst-list", call(dst=dst.tolist()), TypeError, "dst must be a torch.Tensor", "dst")
        yield ErrorInput("dst-1d", call(dst=dst[0, 0]), ValueError, r"dst must be \[L, S, \*state\] \(at least 2-D\)",
                         "dst")
        yield ErrorInput("dst-int32", call(dst=dst.to(torch.int32)), ValueError,
                         r"dst dtype torch.int32 is not a state dtype \(bfloat16, float16, float32, float64\)", "dst")
        yield ErrorInput("dst-float8", call(dst=dst.to(torch.float8_e4m3fn), src=src.to(torch.float8_e4m3fn)),
                         ValueError, r"dst dtype torch.float8_e4m3fn is not a state dtype", "dst")
        yield ErrorInput("src-dtype-mismatch", call(src=src.half()), ValueError,
                         "src must have dst's dtype torch.float32, got torch.float16", "src")
        yield ErrorInput("src-device", call(src=src.to("meta")), ValueError, "src is on meta, dst on cpu", "src")
        yield ErrorInput("src-missing-node-dim", call(src=src[:, :, 0]), ValueError,
                         r"src must be \[L, bs, D, \*state\] with dst's state dims \(4-D\)", "src")
        yield ErrorInput("src-layers", call(src=torch.cat([src, src[:1]])), ValueError,
                         "src must have dst's L = 2 layers, got 3", "src")
        yield ErrorInput("src-state-shape", call(src=src[..., :4]), ValueError,
                         r"src must have dst's state shape \(5,\), got \(4,\)", "src")
        yield ErrorInput("dst-indices-float", call(dst_indices=slots.float()), ValueError,
                         "dst_indices must be int32 or int64", "dst_indices")
        yield ErrorInput("step-indices-bool", call(step_indices=steps >= 0), ValueError,
                         "step_indices must be int32 or int64", "step_indices")
        yield ErrorInput("step-indices-list", call(step_indices=steps.tolist()), TypeError,
                         "step_indices must be a torch.Tensor", "step_indices")
        yield ErrorInput("dst-indices-length", call(dst_indices=slots[:2]), ValueError,
                         r"dst_indices must have one entry per request \(src has bs = 3\), got 2", "dst_indices")
        yield ErrorInput("step-indices-2d", call(step_indices=steps[None]), ValueError, "step_indices must be 1-D",
                         "step_indices")
        yield ErrorInput("step-past-last-node", call(step_indices=torch.tensor([1, 4, 3])), ValueError,
                         r"step_indices must be in \[-1, D\) = \[-1, 4\)", "step_indices")
        yield ErrorInput("step-below-skip", call(step_indices=torch.tensor([1, -2, 3])), ValueError,
                         r"step_indices must be in \[-1, D\) = \[-1, 4\)", "step_indices")
        yield ErrorInput("slot-past-cache", call(dst_indices=torch.tensor([6, 0, 2])), ValueError,
                         r"dst_indices of committing requests \(step_indices >= 0\) must be slots in \[0, 6\)",
                         "dst_indices")
        yield ErrorInput("slot-negative", call(dst_indices=torch.tensor([4, 0, -1])), ValueError,
                         r"must be slots in \[0, 6\)", "dst_indices")
        yield ErrorInput("duplicate-slots", call(dst_indices=torch.tensor([2, 0, 2])), ValueError,
                         r"dst_indices must be distinct among committing requests", "dst_indices")
        yield ErrorInput("checked-string", call(checked="yes"), TypeError, "checked must be True, False or None",
                         "checked")
        yield ErrorInput("bad-impl", lambda: ops.mamba_state_scatter(**base, impl="cuda"), ValueError,
                         "impl must be one of", "impl")
    return errors




RECORDS = (
    OpSpec("mamba_state_scatter", _mss_impl("torch"), _mss_ref, _mss_samples(False), _mss_recipe, _mss_errors("torch"),
           only("float32", "float16", "bfloat16", "float64"), {"dst": EXACT, "dst_bits": EXACT}, platform_dependent=False,
           max_examples=15),
    OpSpec("mamba_state_scatter_triton", _mss_impl("triton"), _mss_ref, _mss_samples(True), _mss_recipe,
           _mss_errors("triton"), only("float32", "float16", "bfloat16"), {"dst": EXACT, "dst_bits": EXACT},
           platform_dependent=False, max_examples=3),
)
