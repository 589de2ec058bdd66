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


# ---------------------------------------------------------------------------------------------
# keep_candidates: the end of the search, the D-1 best candidates in flat order (6.13)

def _kc_sample(name, seed, *, bs, m, keep, kind="plain") -> SampleInput:
    """kind: "plain" (grid values in [0, 1]: many exact ties), "nan" (NaN, +-inf and +-0.0 among
    them), "ulp" (float32 neighbours: near-ties one ulp apart), "zeros" (only signed zeros)."""
    gen = torch.Generator().manual_seed(seed)
    scores = _levels(gen, (bs, m))
    if kind == "nan":
        specials = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 0.0])
        pick = torch.randint(0, len(specials), (bs, m), generator=gen)
        scores = torch.where(S.coins(gen, (bs, m), 0.4), specials[pick], scores)
    elif kind == "ulp":
        scores = torch.nextafter(scores, torch.tensor(2.0)) * S.coins(gen, (bs, m), 0.5) + \
            scores * ~S.coins(gen, (bs, m), 0.5)
    elif kind == "zeros":
        scores = torch.where(S.coins(gen, (bs, m), 0.5), -0.0, 0.0)
    tokens = torch.randint(0, 2**40, (bs, m), generator=gen)
    return SampleInput(f"{name}-bs{bs}-m{m}-keep{keep}", {"scores": scores, "tokens": tokens, "keep": keep}, seed)


def _kc_samples(dtype: str, seed: int):
    yield _kc_sample("empty-batch", seed, bs=0, m=5, keep=2)
    yield _kc_sample("ties", seed + 1, bs=3, m=36, keep=7)                 # k 4, S 3, D 8: the k4 cycle's shape
    yield _kc_sample("nan-inf-signed-zero", seed + 2, bs=4, m=20, keep=9, kind="nan")
    yield _kc_sample("ulp-adjacent", seed + 3, bs=2, m=40, keep=11, kind="ulp")
    yield _kc_sample("signed-zeros-only", seed + 4, bs=2, m=12, keep=5, kind="zeros")
    yield _kc_sample("boundary-keep-every-candidate", seed + 5, bs=2, m=9, keep=9)
    yield _kc_sample("boundary-keep-one", seed + 6, bs=3, m=21, keep=1, kind="nan")
    yield _kc_sample("boundary-keep-none", seed + 7, bs=2, m=6, keep=0)
    yield _kc_sample("boundary-wide-k16", seed + 8, bs=1, m=16 + 256, keep=63)      # past one 256-entry tile


def _kc_recipe(dtype: str):
    from hypothesis import strategies as st
    return st.tuples(st.integers(0, 2**16), st.integers(0, 3), st.integers(1, 70), st.floats(0, 1),
                     st.sampled_from(("plain", "nan", "ulp", "zeros"))).map(
        lambda t: _kc_sample(f"hyp-{t[4]}", t[0], bs=t[1], m=t[2], keep=int(t[3] * t[2]), kind=t[4]))


def _kc_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        kept_flat, kept_tokens = ops.keep_candidates(s.args["scores"], s.args["tokens"], keep=s.args["keep"],
                                                     impl=which)
        return {"kept_flat": kept_flat, "kept_tokens": kept_tokens}
    return impl


def _kc_ref(s: SampleInput) -> dict:
    a = s.args
    out = rspec.keep_candidates(a["scores"].numpy(), a["tokens"].tolist(), keep=a["keep"])
    bs = a["scores"].shape[0]
    return {name: torch.tensor(out[name], dtype=torch.int64).reshape(bs, a["keep"]) for name in out}


def _kc_errors(which: str):
    def errors():
        scores, tokens = torch.ones((2, 5)), torch.zeros((2, 5), dtype=torch.int64)

        def call(**change):
            args = dict(scores=scores, tokens=tokens, keep=2, impl=which) | change
            return lambda: ops.keep_candidates(**args)
        yield ErrorInput("scores-list", call(scores=scores.tolist()), TypeError, "scores must be a torch.Tensor",
                         "scores")
        yield ErrorInput("scores-1d", call(scores=scores[0]), ValueError, r"scores must be \[bs, M\] float32", "scores")
        yield ErrorInput("scores-float64", call(scores=scores.double()), ValueError, "scores must be torch.float32",
                         "scores")
        yield ErrorInput("tokens-int32", call(tokens=tokens.int()), ValueError, "tokens must be torch.int64", "tokens")
        yield ErrorInput("tokens-other-shape", call(tokens=tokens[:, :4]), ValueError, r"tokens must have shape \[2, 5\]",
                         "tokens")
        yield ErrorInput("keep-past-m", call(keep=6), ValueError, r"keep must be in \[0, 5\]", "keep")
        yield ErrorInput("keep-negative", call(keep=-1), ValueError, "keep must be an int >= 0", "keep")
        yield ErrorInput("keep-float", call(keep=2.0), TypeError, "keep must be an int >= 0", "keep")
        yield ErrorInput("bad-impl", call(impl="cuda"), ValueError, "impl must be one of", "impl")
    return errors


RECORDS = (
    OpSpec("keep_candidates", _kc_impl("torch"), _kc_ref, _kc_samples, _kc_recipe, _kc_errors("torch"),
           only("float32"), {"kept_flat": EXACT, "kept_tokens": EXACT}, platform_dependent=False, max_examples=15),
    OpSpec("keep_candidates_triton", _kc_impl("triton"), _kc_ref, _kc_samples, _kc_recipe, _kc_errors("triton"),
           only("float32"), {"kept_flat": EXACT, "kept_tokens": EXACT}, platform_dependent=False, max_examples=5),
    OpSpec("expand_beams", _eb_impl("torch"), _eb_ref, _eb_samples, _eb_recipe, _eb_errors("torch"), HIDDEN_DTYPES,
           {name: EXACT for name in OUTPUTS + ("sign_bits",)}, platform_dependent=False,
           max_examples=15),
    OpSpec("expand_beams_triton", _eb_impl("triton"), _eb_ref, _eb_samples, _eb_recipe, _eb_errors("triton"),
           HIDDEN_DTYPES, {name: EXACT for name in OUTPUTS + ("sign_bits",)}, platform_dependent=False, max_examples=5),
    OpSpec("draft_tree_triton", tree_impl("triton"), _tree_ref, _tree_samples, _tree_recipe, _tree_errors,
           only("float32"), {f: EXACT for f in TREE_FIELDS + ("kept_flat",)}, platform_dependent=False,
           max_examples=5),
)
