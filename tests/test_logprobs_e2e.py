"""Logprobs end to end: `generate(..., logprobs=N)` goes through the packed message and the output
processor for every algorithm; the records equal the reference's (teacher-forced over the same
emitted tokens) within the tolerance table, with exact token ids and ranks; speculative and
target-only logprobs agree."""

from __future__ import annotations

import pytest

import reference
import specverify
from specverify import dtypes
from specverify.engine.speculative import SpecConfig
from tests.support.cases import cached_models, ragged_budgets, ragged_prompts, steered_cached_models

pytestmark = pytest.mark.e2e

# The message carries float32 logprobs: they compare by the float32 entry of the table.
TOL = dtypes.tolerance("float32")

ALGORITHMS = {
    "target-only": None,
    "eagle-chain": SpecConfig(num_steps=3, topk=1),
    "eagle-tree": SpecConfig(num_steps=3, topk=2, num_draft_tokens=6),
    "naive-eagle": SpecConfig(algorithm="naive_eagle"),
}
SAMPLING = {"greedy": {}, "sampled": dict(temperature=0.8, top_p=0.95)}


def reference_records(models, prompt, tokens, n):
    """The reference's record of each emitted token, teacher-forced over prompt + tokens."""
    rows = reference.forward_logits(models.config, models.target_weights, prompt + tokens[:-1])[len(prompt) - 1:]
    return [reference.logprob_record(reference.convert_logits(models.config, row).dequant, t, n)
            for row, t in zip(rows, tokens)]


def assert_records_match(got, want, what):
    assert len(got) == len(want), f"{what}: {len(got)} records, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g.token, g.rank) == (w.token, w.rank), f"{what} token {i}: (token, rank) {(g.token, g.rank)} vs {(w.token, w.rank)}"
        assert [t for t, _ in g.top] == [t for t, _ in w.top], f"{what} token {i}: top ids differ"
        assert g.logprob == pytest.approx(w.logprob, abs=TOL.atol, rel=TOL.rtol), f"{what} token {i}: logprob"
        assert [v for _, v in g.top] == pytest.approx([v for _, v in w.top], abs=TOL.atol, rel=TOL.rtol)


@pytest.mark.parametrize("n", [1, 5, 20])
@pytest.mark.parametrize("mode", list(SAMPLING))
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("logits_dtype", ["float32", pytest.param("float8_e4m3fn", marks=pytest.mark.fp8)])
def test_logprobs_match_reference(algorithm, mode, n, logits_dtype, seed):
    plain = cached_models(compute_dtype="float64", logits_dtype=logits_dtype)
    prompts = ragged_prompts(seed, 3, plain.config.vocab_size, max_len=8)
    budgets = ragged_budgets(seed, 3, high=9)
    models = plain if ALGORITHMS[algorithm] is None else steered_cached_models(
        0.6, prompts, budgets, ALGORITHMS[algorithm], compute_dtype="float64", logits_dtype=logits_dtype)
    out = specverify.generate(models, prompts, spec=ALGORITHMS[algorithm], max_new_tokens=budgets, logprobs=n,
                              seed=seed, **SAMPLING[mode])
    assert [len(r) for r in out.logprobs] == [len(t) for t in out.tokens]
    for r, (prompt, tokens) in enumerate(zip(prompts, out.tokens)):
        assert [rec.token for rec in out.logprobs[r]] == tokens
        assert_records_match(out.logprobs[r], reference_records(models, prompt, tokens, n),
                             f"{algorithm}/{mode}/{logits_dtype} request {r}")


@pytest.mark.parametrize("algorithm", ["eagle-chain", "eagle-tree", "naive-eagle"])
def test_speculative_and_target_only_logprobs_agree(algorithm, seed):
    plain = cached_models(compute_dtype="float64")
    prompts = ragged_prompts(seed, 4, plain.config.vocab_size, max_len=8)
    models = steered_cached_models(0.6, prompts, 12, ALGORITHMS[algorithm], compute_dtype="float64")
    spec = specverify.generate(models, prompts, spec=ALGORITHMS[algorithm], max_new_tokens=12, logprobs=4)
    plain = specverify.generate(models, prompts, max_new_tokens=12, logprobs=4)
    assert spec.tokens == plain.tokens
    for r in range(len(prompts)):
        assert_records_match(spec.logprobs[r], plain.logprobs[r], f"{algorithm} vs target-only request {r}")
    assert any(n > 1 for lengths in spec.accept_lengths for n in lengths), "some steps must emit several tokens"


def test_no_logprobs_means_none():
    models = cached_models()
    assert specverify.generate(models, [[1, 2]], max_new_tokens=3).logprobs is None
    assert specverify.generate(models, [[1, 2]], spec=ALGORITHMS["eagle-chain"], max_new_tokens=3).logprobs is None


def test_an_aborted_request_is_reported_preempted_with_its_tokens_so_far():
    from specverify.engine.logprobs import LogprobChannel
    from specverify.engine.requests import new_requests
    from specverify.engine.sampling import SamplingParams
    from specverify.engine.speculative import SpecDecoder

    prompts, spec = [[1, 2, 3], [4, 5], [6]], SpecConfig(num_steps=2, topk=1)
    models = steered_cached_models(0.6, prompts, 12, spec, compute_dtype="float64")
    reqs = new_requests(prompts, [12] * 3)
    channel = LogprobChannel(3, 2, max_rows=3)
    decoder = SpecDecoder(models, spec, SamplingParams(), seed=0, eos_token_id=None, channel=channel)
    decoder.start(reqs)
    decoder.step()
    decoder.abort(reqs[1])
    while decoder.running():
        decoder.step()
    results = channel.close()
    assert [r.status for r in results] == ["running", "preempted", "running"]
    assert [r.tokens for r in results] == [r.output for r in reqs]
    assert len(results[1].tokens) < 12 and len(results[1].logprobs) == len(results[1].tokens)


@pytest.mark.fp8
@pytest.mark.parametrize("algorithm", ["target-only", "eagle-tree"])
@pytest.mark.parametrize("scale", [{"logits_scale": 0.37}, {"logits_scale_mode": "per_row"}],
                         ids=["static-scale-0.37", "per-row-scale"])
def test_logprobs_with_an_fp8_scale_match_reference(algorithm, scale, seed):
    # Issue 7: with every logprob test at scale 1.0, dropping `* scale` before the log-softmax
    # passed. A scale != 1 (static or per row) must reach the records exactly as the reference's.
    models = cached_models(compute_dtype="float64", logits_dtype="float8_e4m3fn", **scale)
    prompts = ragged_prompts(seed, 2, models.config.vocab_size, max_len=6)
    out = specverify.generate(models, prompts, spec=ALGORITHMS[algorithm], max_new_tokens=5, logprobs=3)
    for r, (prompt, tokens) in enumerate(zip(prompts, out.tokens)):
        assert_records_match(out.logprobs[r], reference_records(models, prompt, tokens, 3),
                             f"{algorithm}/{scale} request {r}")


@pytest.mark.fp8
def test_naive_logprobs_with_a_per_row_scale_match_reference():
    """Naive EAGLE's two verify rows each carry their own FP8 scale: the record of the token after an
    accepted draft (row 1) must take row 1's logits and scale. A static scale is the same on both
    rows and a draft that is never accepted reports row 0 only: the draft is steered and the scale
    is per row, so a cycle reporting row 1 with row 0's scale fails."""
    kw = dict(compute_dtype="float64", logits_dtype="float8_e4m3fn", logits_scale_mode="per_row")
    spec = ALGORITHMS["naive-eagle"]
    prompts = ragged_prompts(5, 3, cached_models(**kw).config.vocab_size, max_len=6)
    models = steered_cached_models(0.8, prompts, 9, spec, **kw)
    out = specverify.generate(models, prompts, spec=spec, max_new_tokens=9, logprobs=3)
    assert any(n == 2 for per in out.accept_lengths for n in per), "no draft accepted: row 1 never reported"
    for r, (prompt, tokens) in enumerate(zip(prompts, out.tokens)):
        assert_records_match(out.logprobs[r], reference_records(models, prompt, tokens, 3),
                             f"naive per-row scale request {r}")
