"""One step of the draft-tree search (docs/semantics.md 6.13): `expand_beams`, and the whole search
through the Triton kernels (`draft_tree_triton`, the draft_tree record's samples).

Records of the op registry (specverify/conformance/registry/__init__.py). Every output is integers,
bools, copies or single float32 products, so everything compares exactly. The sample dtype is the
hidden states' dtype (copied bit for bit); the scores are float32 in every sample.
"""

from __future__ import annotations

import dataclasses

import torch

from reference import spec as rspec
from specverify import dtypes, ops
from specverify.conformance import strategies as S
from specverify.conformance.registry.core import EXACT, ErrorInput, OpSpec, SampleInput, only
from specverify.conformance.registry.tree_verify import TREE_FIELDS, _tree_errors, _tree_recipe, _tree_ref, _tree_samples, tree_impl
from specverify.kernels.draft_search import BeamStep, expand_beams_impl

HIDDEN_DTYPES = only("float32", "bfloat16")
TRITON_HIDDEN_BLOCK = 16    # the Triton record's hidden block: the samples' hidden sizes span several, with a tail
OUTPUTS = tuple(f.name for f in dataclasses.fields(BeamStep))
LEVELS = 8                  # scores and probabilities are multiples of 1/8: many exact ties among the products


def _levels(gen, shape) -> torch.Tensor:
    return torch.randint(0, LEVELS + 1, shape, generator=gen).float() / LEVELS


def _eb_sample(name, seed, dtype, *, bs, k, region, hidden, step, kind="plain") -> SampleInput:
    """kind: "plain" (grid values, exact ties), "nan" (NaN, inf and -0.0 among scores and
    probabilities, NaN in the hidden states), "ulp" (each beam's children float32 neighbours),
    "zeros" (every probability -0.0 or +0.0: the chosen beams are signed-zero ties)."""
    gen = torch.Generator().manual_seed(seed)
    scores = _levels(gen, (bs, k))
    probs = _levels(gen, (bs, k, k))
    if kind == "nan":
        specials = torch.tensor([float("nan"), float("inf"), -0.0, 0.0])
        pick = torch.randint(0, len(specials), (bs, k, k), generator=gen)
        probs = torch.where(S.coins(gen, (bs, k, k), 0.3), specials[pick], probs)
        scores = torch.where(S.coins(gen, (bs, k), 0.2), float("nan"), scores)
    elif kind == "zeros":             # every child probability a signed zero: the beams are ties of -0.0 and +0.0
        probs = torch.where(S.coins(gen, (bs, k, k), 0.5), -0.0, 0.0)
    elif kind == "ulp":
        probs[..., 1::2] = torch.nextafter(probs[..., 0:1], torch.tensor(2.0)).expand_as(probs[..., 1::2])
    tokens = torch.randint(0, 2**40, (bs, k, k), generator=gen)
    ancestors = S.coins(gen, (bs, k, region), 0.5)
    feats = S.normalish(gen, (bs, k, hidden))
    if kind == "nan":
        feats = torch.where(S.coins(gen, feats.shape, 0.1), float("nan"), feats)
    args = {"beam_scores": scores, "child_probs": probs, "child_tokens": tokens, "ancestors": ancestors,
            "hidden": S.cast(feats, dtypes.dtype_info(dtype).torch_dtype), "step": step}
    return SampleInput(f"{name}-bs{bs}-k{k}-R{region}-H{hidden}-step{step}", args, seed)


def _eb_samples(dtype: str, seed: int):
    yield _eb_sample("ties", seed, dtype, bs=3, k=3, region=6, hidden=37, step=1)
    yield _eb_sample("ties-step2", seed + 1, dtype, bs=2, k=4, region=8, hidden=20, step=2)
    yield _eb_sample("nan-inf-signed-zero", seed + 2, dtype, bs=4, k=3, region=6, hidden=17, step=1, kind="nan")
    yield _eb_sample("ulp-adjacent-children", seed + 3, dtype, bs=3, k=4, region=12, hidden=9, step=2, kind="ulp")
    yield _eb_sample("boundary-chain-k1", seed + 4, dtype, bs=2, k=1, region=3, hidden=5, step=3)
    yield _eb_sample("boundary-last-step-no-own-entry", seed + 5, dtype, bs=2, k=2, region=4, hidden=16, step=2)
    yield _eb_sample("boundary-no-region", seed + 6, dtype, bs=2, k=2, region=0, hidden=3, step=1)
    yield _eb_sample("empty-batch", seed + 7, dtype, bs=0, k=3, region=6, hidden=8, step=1)
    yield _eb_sample("boundary-signed-zero-ties", seed + 8, dtype, bs=3, k=3, region=6, hidden=4, step=1, kind="zeros")


def _eb_recipe(dtype: str):
    from hypothesis import strategies as st
    return st.tuples(st.integers(0, 2**16), st.integers(0, 4), st.integers(1, 5), st.integers(1, 3),
                     st.integers(1, 40), st.sampled_from(("plain", "nan", "ulp", "zeros"))).map(
        lambda t: _eb_sample(f"hyp-{t[5]}", t[0], dtype, bs=t[1], k=t[2], region=t[3] * t[2], hidden=t[4],
                             step=t[3], kind=t[5]))


def _eb_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        a = dict(s.args)
        if which == "triton":
            step = a.pop("step")
            out = expand_beams_impl(*a.values(), step, "triton", TRITON_HIDDEN_BLOCK)
        else:
            out = ops.expand_beams(**a, impl="torch")
        return {name: getattr(out, name) for name in OUTPUTS} | {"sign_bits": _sign_bits(out.scores, out.cand_scores,
                                                                                       out.hidden)}
    return impl


def _sign_bits(*floats: torch.Tensor) -> torch.Tensor:
    """The sign bit of every float output but NaN (whose sign no contract fixes), flattened in
    order: EXACT compares floats by value (-0.0 == +0.0), and these outputs are products and
    copies, exact to the bit."""
    flat = [t.float().cpu().flatten() for t in floats]
    return torch.cat([torch.signbit(x) & ~torch.isnan(x) for x in flat])


def _eb_ref(s: SampleInput) -> dict:
    a = s.args
    bs, k = a["beam_scores"].shape
    region, hidden = a["ancestors"].shape[2], a["hidden"].shape[2]
    out = rspec.expand_beams(a["beam_scores"].numpy(), a["child_probs"].numpy(), a["child_tokens"].tolist(),
                             a["ancestors"].tolist(), a["hidden"].float().tolist(), step=a["step"])
    shapes = {"scores": (bs, k), "tokens": (bs, k), "flat": (bs, k), "parent": (bs, k), "ancestors": (bs, k, region),
              "hidden": (bs, k, hidden), "cand_scores": (bs, k * k)}
    kinds = {"scores": torch.float32, "cand_scores": torch.float32, "ancestors": torch.bool, "hidden": torch.float32}
    got = {name: torch.tensor(out[name], dtype=kinds.get(name, torch.int64)).reshape(shapes[name]) for name in OUTPUTS}
    return got | {"sign_bits": _sign_bits(got["scores"], got["cand_scores"], got["hidden"])}


def _eb_errors(which: str):
    def errors():
        scores, probs = torch.ones((2, 2)), torch.ones((2, 2, 2))
        tokens, anc, feats = torch.zeros((2, 2, 2), dtype=torch.int64), torch.zeros((2, 2, 2), dtype=torch.bool), torch.zeros((2, 2, 4))

        def call(**change):
            args = dict(beam_scores=scores, child_probs=probs, child_tokens=tokens, ancestors=anc, hidden=feats,
                        step=1, impl=which) | change
            return lambda: ops.expand_beams(**args)
        yield ErrorInput("scores-list", call(beam_scores=scores.tolist()), TypeError, "beam_scores must be a torch.Tensor",
                         "beam_scores")
        yield ErrorInput("probs-float64", call(child_probs=probs.double()), ValueError, "child_probs must be torch.float32",
                         "child_probs")
        yield ErrorInput("probs-not-k-by-k", call(child_probs=torch.ones((2, 2, 3))), ValueError,
                         r"child_probs must have shape \[2, 2, 2\]", "child_probs")
        yield ErrorInput("tokens-int32", call(child_tokens=tokens.int()), ValueError, "child_tokens must be torch.int64",
                         "child_tokens")
        yield ErrorInput("ancestors-int", call(ancestors=anc.long()), ValueError, "ancestors must be torch.bool",
                         "ancestors")
        yield ErrorInput("hidden-other-beams", call(hidden=torch.zeros((2, 3, 4))), ValueError,
                         r"hidden must have shape \[2, 2, 4\]", "hidden")
        yield ErrorInput("hidden-int", call(hidden=feats.long()), ValueError, "hidden must be a float tensor", "hidden")
        yield ErrorInput("step-0", call(step=0), ValueError, "step must be an int >= 1", "step")
        yield ErrorInput("step-float", call(step=1.0), TypeError, "step must be an int >= 1", "step")
        yield ErrorInput("probs-list", call(child_probs=probs.tolist()), TypeError, "child_probs must be a torch.Tensor",
                         "child_probs")
        yield ErrorInput("hidden-fp8", call(hidden=feats.to(torch.float8_e4m3fn)), ValueError,
                         "hidden must be a float tensor of a compute dtype", "hidden")
        if which == "triton":
            k = 17
            yield ErrorInput("triton-topk-past-tile", call(beam_scores=torch.ones((1, k)), child_probs=torch.ones((1, k, k)),
                                                           child_tokens=torch.zeros((1, k, k), dtype=torch.int64),
                                                           ancestors=torch.zeros((1, k, 2), dtype=torch.bool),
                                                           hidden=torch.zeros((1, k, 4))),
                             ValueError, r"impl='triton' takes topk <= 16", "impl")
        yield ErrorInput("bad-impl", call(impl="cuda"), ValueError, "impl must be one of", "impl")
    return errors


RECORDS = (
    OpSpec("expand_beams", _eb_impl("torch"), _eb_ref, _eb_samples, _eb_recipe, _eb_errors("torch"), HIDDEN_DTYPES,
           {name: EXACT for name in OUTPUTS + ("sign_bits",)}, platform_dependent=False,
           max_examples=15),
    OpSpec("expand_beams_triton", _eb_impl("triton"), _eb_ref, _eb_samples, _eb_recipe, _eb_errors("triton"),
           HIDDEN_DTYPES, {name: EXACT for name in OUTPUTS + ("sign_bits",)}, platform_dependent=False, max_examples=5),
    OpSpec("draft_tree_triton", tree_impl("triton"), _tree_ref, _tree_samples, _tree_recipe, _tree_errors,
           only("float32"), {f: EXACT for f in TREE_FIELDS + ("kept_flat",)}, platform_dependent=False,
           max_examples=5),
)
