"""Sampling probabilities (docs/semantics.md section 4), the inverse-CDF draw and the logprob rows.

Records of the op registry (specverify/conformance/registry/__init__.py)."""

from __future__ import annotations


import numpy as np
import torch

import reference
from specverify import dtypes
from specverify.engine.logprobs import logprob_rows
from specverify.engine.sampling import SamplingParams, sample_from_probs, sampling_probs
from specverify.conformance import strategies as S
from specverify.conformance.registry.core import CLOSE, EXACT, LOGITS_BY_POLICY, ErrorInput, OpSpec, SampleInput, only


# ---------------------------------------------------------------------------------------------
# sampling probabilities (docs/semantics.md section 4) and the inverse-CDF draw


def _dequant64(logits: torch.Tensor, scale: torch.Tensor) -> np.ndarray:
    """float64(logits) * float64(scale) per row: exact (a product of two float32 fits float64)."""
    return logits.double().numpy() * scale.double().numpy()


def _sampling_impl(s: SampleInput, profile) -> dict:
    a = s.args
    params = SamplingParams(a["temperature"], a["top_k"], a["top_p"], a["min_p"])
    return {"p": sampling_probs(a["logits"], a["scale"], params)}


TIES = {"index": "index", "keep_tied": "value"}     # convention value -> the reference's tie rule


def _sampling_ref(s: SampleInput, topk_ties: str = "index", topp_ties: str = "index") -> dict:
    a = s.args
    rows = [reference.filtered_probs(z, a["temperature"], a["top_k"], a["top_p"], a["min_p"],
                                     topk_ties=TIES[topk_ties], topp_ties=TIES[topp_ties])
            for z in _dequant64(a["logits"], a["scale"])]
    return {"p": torch.tensor(rows, dtype=torch.float64).view(a["logits"].shape)}


# scale -> (x, T): a float32 logit x near -1 and a temperature T with x * float32(scale) / T ==
# -0.6931471805599453 (float64's -ln 2) in float64, whose exp is 0.5 exactly, so the probabilities of
# the logits [0, x] are exactly 2/3 and 1/3 = 0.5 * 2/3: the min-p boundary p == min_p * max(p) with
# min_p 0.5, hit exactly. Data, not a search over exp at generation time (exp's last bit is the
# platform's); tests/meta/test_registry.py checks that math.exp and torch.exp still give 0.5.
HALF_TEMPERATURE = {"1": (-1.0, 1.4426950408889634), "0.37": (-1.0, 0.5337971720082225),
                    "3.5": (-0.9999999403953552, 5.049432342141733)}


def _sampling_sample(name, x, dtype, seed, scale_kind, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    gen = torch.Generator().manual_seed(seed)
    values, scale = S.with_scale(x, dtype, scale_kind, gen)
    return SampleInput(f"{name}-scale{scale_kind}", {"logits": values, "scale": scale, "temperature": temperature,
                                                    "top_k": top_k, "top_p": top_p, "min_p": min_p}, seed)


PARAM_GRID = ((1.0, 0, 1.0, 0.0), (0.7, 3, 1.0, 0.0), (1.3, 0, 0.8, 0.0), (1.0, 0, 1.0, 0.1),
              (0.9, 5, 0.6, 0.05), (2.0, 1, 1.0, 0.0))


def _sampling_samples(dtype: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    kinds = S.SCALE_KINDS
    for i, params in enumerate(PARAM_GRID):
        for j, (kind, vocab) in enumerate((("grid", 33), ("tie-heavy", 65), ("ulp", 40))):
            x = S.ROW_KINDS[kind](gen, 3, vocab)
            yield _sampling_sample(f"{kind}-V{vocab}-T{params[0]}-k{params[1]}-p{params[2]}-m{params[3]}", x, dtype,
                                   seed, kinds[(i + j) % len(kinds)], *params)
    # Exact boundaries: all-equal rows of 4 and 8 tokens have probabilities 1/4, 1/8 exactly.
    for vocab in (4, 8):
        for top_p in (0.25, 0.5, 0.75):
            yield _sampling_sample(f"boundary-top-p{top_p}-V{vocab}", torch.zeros((2, vocab)), dtype, seed,
                                   "3.5", 1.0, 0, top_p)
    # min-p boundary: logits [0, x] at scale s and temperature T with exp(x * s / T) == 0.5.
    for kind, (x, t) in HALF_TEMPERATURE.items():
        row = torch.tensor([[0.0, x], [x, 0.0]])
        info = dtypes.dtype_info(dtype)
        if float(row.to(info.torch_dtype).float()[0, 1]) != x:
            continue                                  # x is not a value of this dtype
        scale = torch.full((2, 1), float(kind), dtype=torch.float32)
        yield SampleInput(f"boundary-min-p-scale{kind}", {"logits": row.to(info.torch_dtype), "scale": scale,
                                                         "temperature": t, "top_k": 0, "top_p": 1.0, "min_p": 0.5},
                          seed)
    for kind in ("nan", "inf"):
        yield _sampling_sample(f"{kind}-rows", S.ROW_KINDS[kind](gen, 4, 17), dtype, seed, "per-row", 0.8, 3, 0.9, 0.05)
    m = torch.full((2, 20), float("-inf"))
    m[0, 0], m[1, 19], m[1, 5] = 1.0, 0.5, 0.5
    yield _sampling_sample("boundary-neg-inf-mask", m, dtype, seed, "0.37", 1.0, 2, 0.9, 0.1)
    yield _sampling_sample("empty-batch", torch.zeros((0, 9)), dtype, seed, "1", 1.0, 2, 0.9, 0.1)


def _sampling_recipe(dtype: str):
    from hypothesis import strategies as st
    params = st.tuples(st.sampled_from([0.5, 1.0, 1.7]), st.integers(0, 6), st.sampled_from([1.0, 0.9, 0.5]),
                       st.sampled_from([0.0, 0.05, 0.3]))
    rows = S.hard_logits_rows(max_vocab=64, kinds=("grid", "tie-heavy", "ulp", "inf"))
    return st.tuples(rows, params).map(lambda t: _sampling_sample(
        f"hyp-{t[0][3]}", S.build_hard_logits(t[0]), dtype, t[0][0], t[0][4], *t[1]))


def _sampling_errors():
    x, one = torch.zeros((2, 5)), torch.ones((2, 1))

    def call(**kw):
        return lambda: sampling_probs(x, one, SamplingParams(**kw))
    yield ErrorInput("temperature-negative", call(temperature=-1.0), ValueError, "temperature", "temperature")
    yield ErrorInput("top-k-negative", call(temperature=1.0, top_k=-1), ValueError, "top_k", "top_k")
    yield ErrorInput("top-p-0", call(temperature=1.0, top_p=0.0), ValueError, "top_p", "top_p")
    yield ErrorInput("min-p-1", call(temperature=1.0, min_p=1.0), ValueError, "min_p", "min_p")
    yield ErrorInput("scale-shape", lambda: sampling_probs(x, torch.ones((3, 1)), SamplingParams(1.0)), ValueError,
                     "scale", "scale")


def _draw_impl(s: SampleInput, profile) -> dict:
    return {"token": sample_from_probs(s.args["p"], s.args["u"])}


def _draw_ref(s: SampleInput) -> dict:
    tokens = [reference.draw(row.tolist(), float(u)) for row, u in zip(s.args["p"], s.args["u"])]
    return {"token": torch.tensor(tokens, dtype=torch.int64)}


def _draw_sample(name, p, u, seed):
    return SampleInput(name, {"p": p.double(), "u": torch.as_tensor(u, dtype=torch.float64)}, seed)


def _draw_samples(dtype: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    for vocab in (1, 2, 17, 65, 389):
        p = S.pow2_probs(S.grid_logits(gen, 5, vocab))
        yield _draw_sample(f"random-V{vocab}", p, S.unit_floats(gen, (5,)), seed)
    half = torch.tensor([[0.5, 0.5]] * 3)
    # u equal to a cumulative sum must pass it ("exceeds"); u = 0 takes the first positive index.
    yield _draw_sample("boundary-u-eq-cumsum", half, [0.5, 0.0, float(np.nextafter(1.0, 0.0))], seed)
    yield _draw_sample("boundary-zeros-at-edges", torch.tensor([[0.0, 0.5, 0.5, 0.0], [0, 0, 0, 1.0]]), [0.75, 0.3],
                       seed)
    short = torch.tensor([[0.3, 0.3, 0.3, 0.0]])       # sums to 0.9: u past it -> the last positive
    yield _draw_sample("boundary-mass-short", short, [0.95], seed)
    a = torch.tensor(0.25, dtype=torch.float64)
    ulp = torch.stack([a, torch.nextafter(a, a + 1), 1 - a - torch.nextafter(a, a + 1), a.new_tensor(0.0)])
    yield _draw_sample("ulp-adjacent", ulp[None].repeat(3, 1), [0.25, float(torch.nextafter(a, a + 1)), 0.4], seed)
    yield _draw_sample("nan-entries", torch.tensor([[0.6, float("nan"), 0.4], [0.2, 0.3, float("nan")]]),
                       [0.3, 0.9], seed)
    yield _draw_sample("empty-batch", torch.zeros((0, 5)), torch.zeros(0), seed)


def _draw_recipe(dtype: str):
    from hypothesis import strategies as st
    return st.tuples(st.integers(0, 2**31 - 1), st.integers(1, 6), st.integers(1, 80)).map(lambda t: _draw_sample(
        f"hyp-V{t[2]}", S.pow2_probs(S.grid_logits(torch.Generator().manual_seed(t[0]), t[1], t[2])),
        S.unit_floats(torch.Generator().manual_seed(t[0] + 1), (t[1],)), t[0]))


def _draw_errors():
    p, u = torch.full((2, 4), 0.25, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    yield ErrorInput("u-shape", lambda: sample_from_probs(p, torch.zeros(3, dtype=torch.float64)), ValueError, "u",
                     "u")
    yield ErrorInput("p-1-D", lambda: sample_from_probs(p[0], u), ValueError, "p", "p")


# ---------------------------------------------------------------------------------------------
# logprob records


def _logprob_impl(s: SampleInput, profile) -> dict:
    a = s.args
    ids, lps, ranks = logprob_rows(a["logits"], a["scale"], a["tokens"], a["n"])
    return {"ids": ids, "logprobs": lps, "ranks": ranks}


def _logprob_ref(s: SampleInput) -> dict:
    a = s.args
    recs = [reference.logprob_record(z, int(t), a["n"]) for z, t in zip(_dequant64(a["logits"], a["scale"]), a["tokens"])]
    m, w = len(recs), a["n"] + 1
    return {"ids": torch.tensor([[r.token] + [i for i, _ in r.top] for r in recs], dtype=torch.int64).view(m, w),
            "logprobs": torch.tensor([[r.logprob] + [x for _, x in r.top] for r in recs], dtype=torch.float64).view(m, w),
            "ranks": torch.tensor([r.rank for r in recs], dtype=torch.int64)}


def _logprob_sample(name, x, dtype, seed, scale_kind, n, tokens=None):
    gen = torch.Generator().manual_seed(seed)
    values, scale = S.with_scale(x, dtype, scale_kind, gen)
    if tokens is None:
        tokens = torch.randint(0, x.shape[1], (x.shape[0],), generator=gen)
    return SampleInput(f"{name}-n{n}-scale{scale_kind}", {"logits": values, "scale": scale,
                                                         "tokens": torch.as_tensor(tokens, dtype=torch.int64), "n": n},
                       seed)


def _logprob_samples(dtype: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    kinds = S.SCALE_KINDS
    for i, (kind, vocab) in enumerate((("grid", 33), ("tie-heavy", 65), ("ulp", 40), ("nan", 17), ("inf", 17))):
        for j, n in enumerate((0, 1, 5)):
            yield _logprob_sample(kind, S.ROW_KINDS[kind](gen, 4, vocab), dtype, seed, kinds[(i + j) % 4], n)
    x = S.grid_logits(gen, 2, 129)
    x[0, 0], x[1, 128] = 9.0, 9.0
    yield _logprob_sample("boundary-V129", x, dtype, seed, "per-row", 3, [128, 0])
    yield _logprob_sample("boundary-n-eq-V", S.tie_heavy_rows(gen, 2, 6), dtype, seed, "0.37", 6)
    yield _logprob_sample("all-equal", torch.zeros((2, 9)), dtype, seed, "3.5", 4)
    yield _logprob_sample("empty-batch", torch.zeros((0, 9)), dtype, seed, "1", 2)


def _logprob_recipe(dtype: str):
    from hypothesis import strategies as st
    rows = S.hard_logits_rows(max_vocab=64)
    return st.tuples(rows, st.integers(0, 4)).map(lambda t: _logprob_sample(
        f"hyp-{t[0][3]}", S.build_hard_logits(t[0]), dtype, t[0][0], t[0][4], min(t[1], t[0][2])))


def _logprob_errors():
    x, one, tok = torch.zeros((2, 5)), torch.ones((2, 1)), torch.tensor([0, 1])
    yield ErrorInput("token-out-of-vocab", lambda: logprob_rows(x, one, torch.tensor([0, 5]), 1), ValueError,
                     "tokens", "tokens")
    yield ErrorInput("n-above-vocab", lambda: logprob_rows(x, one, tok, 6), ValueError, "n", "n")




RECORDS = (
    OpSpec("sampling_probs", _sampling_impl, _sampling_ref, _sampling_samples, _sampling_recipe, _sampling_errors,
           LOGITS_BY_POLICY, {"p": CLOSE}, tolerance_dtype="float64", platform_dependent=False, max_examples=8,
           conventions=("topk_ties", "topp_ties")),
    OpSpec("sample_from_probs", _draw_impl, _draw_ref, _draw_samples, _draw_recipe, _draw_errors, only("float64"),
           {"token": EXACT}, platform_dependent=False, max_examples=25, uniforms=("u",)),
    OpSpec("logprob_rows", _logprob_impl, _logprob_ref, _logprob_samples, _logprob_recipe, _logprob_errors,
           LOGITS_BY_POLICY, {"ids": EXACT, "logprobs": CLOSE, "ranks": EXACT}, tolerance_dtype="float64",
           platform_dependent=False, max_examples=8),
)
