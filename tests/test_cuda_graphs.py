"""CUDA graphs and the GPU: graph replay == eager bit for bit, padded buckets do not leak into live
rows, replays see fresh inputs, and speculative decoding on the GPU (FP8 included) is lossless.

The CPU half checks the same runner without graphs (padding, refills, bucket choice), so the
padded path is exercised in CPU CI too."""

from __future__ import annotations

import functools

import pytest
import torch

import reference
import specverify
from specverify.engine.generate import new_requests
from specverify.engine.sampling import SamplingParams
from specverify.engine.speculative import SpecConfig, SpecDecoder, SpecRequest, generate_speculative
from specverify.kernels.cuda_graph import BucketGraphRunner, bucket_for
from tests.support.asserts import assert_tokens_equal
from tests.support.cases import ragged_budgets, ragged_prompts
from tests.support.steering import steered_models


@functools.lru_cache(maxsize=16)
def models_on(device: str, **kwargs):
    return specverify.build_models("tiny", device=device, **kwargs)


def decoder_after_prefill(device, spec, bs, *, cuda_graph, agreement=0.7, seed=5):
    plain = models_on(device, compute_dtype="float32")
    prompts = ragged_prompts(seed, bs, plain.config.vocab_size, max_len=10)
    reqs = new_requests(prompts, [20] * bs, 0, cls=SpecRequest)
    cfg = SpecConfig(num_steps=spec[0], topk=spec[1], num_draft_tokens=spec[2], cuda_graph=cuda_graph)
    models = steered_models(plain, prompts, 20, agreement=agreement, spec=cfg)
    dec = SpecDecoder(models, cfg, SamplingParams(), eos_token_id=None, static_shapes=True)
    dec.start(reqs)
    return dec


def draft_inputs(dec, seed):
    """Inputs of one decode-time draft phase for every running request (random accepted runs)."""
    g = torch.Generator().manual_seed(seed)
    reqs = dec.running()
    lens = torch.randint(1, dec.S + 2, (len(reqs),), generator=g).tolist()
    tokens = [torch.randint(0, 389, (n,), generator=g).tolist() for n in lens]
    feats = torch.randn((len(reqs), dec.S + 1, dec.models.config.hidden_size), generator=g).to(dec.dev)
    kv = [r.cached for r in reqs]
    for r, toks in zip(reqs, tokens):
        dec.cache.table.reserve(r.row, r.cached + len(toks) + dec.region + 1)
    return dec._draft_inputs(reqs, tokens, feats.to(dec.models.target.dtype), kv, dec.S + 1)


def snapshot(dec):
    """The draft KV buffers without the sink slot: padded lanes of both runs write it, in an
    unspecified order, and nothing live ever reads it."""
    return [t[1:].clone() for t in dec.cache.draft_kv.k + dec.cache.draft_kv.v]


SPECS = [(3, 1, 4), (2, 2, 4), (3, 4, 8)]


# -- CPU: the runner without graphs -------------------------------------------------------------

def test_bucket_choice_and_errors():
    assert [bucket_for(n) for n in (1, 2, 3, 5, 64, 65)] == [1, 2, 4, 8, 64, 128]
    with pytest.raises(ValueError, match="exceeds the largest CUDA-graph bucket 256"):
        bucket_for(257)


def test_runner_pads_and_refills_between_calls():
    seen = []
    pad = {"x": torch.tensor(-1.0)}
    runner = BucketGraphRunner(lambda b: seen.append(b["x"].clone()) or {"y": b["x"] * 2}, pad, use_graphs=False)
    out = runner.run({"x": torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])})
    assert out["y"].tolist() == [2, 4, 6, 8, 10] and seen[-1].tolist() == [1, 2, 3, 4, 5, -1, -1, -1]
    out = runner.run({"x": torch.tensor([7.0])})
    assert out["y"].tolist() == [14] and seen[-1].tolist() == [7]
    runner.run({"x": torch.tensor([9.0, 9.0, 9.0])})
    assert seen[-1].tolist() == [9, 9, 9, -1], "stale rows from a larger earlier batch must not survive"
    with pytest.raises(ValueError, match="input 'z' has no pad row"):
        runner.run({"z": torch.tensor([1.0])})


@pytest.mark.parametrize("spec", SPECS, ids=[f"S{s}-k{k}-D{d}" for s, k, d in SPECS])
def test_padded_static_path_is_lossless_on_cpu(spec, request):
    plain = models_on("cpu", compute_dtype="float64")
    prompts = ragged_prompts(9, 5, plain.config.vocab_size, max_len=9)
    budgets = ragged_budgets(9, 5, high=12)
    cfg = SpecConfig(num_steps=spec[0], topk=spec[1], num_draft_tokens=spec[2])
    models = steered_models(plain, prompts, budgets, agreement=0.6, spec=cfg)
    got = generate_speculative(models, prompts, budgets, cfg, SamplingParams(), seed=0, eos_token_id=None,
                               num_logprobs=0, static_shapes=True)
    want = reference.generate(models, prompts, max_new_tokens=budgets).tokens
    assert_tokens_equal(got.tokens, want, f"padded static draft phase {spec}", request.node.nodeid)


# -- CUDA ----------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("spec", SPECS, ids=[f"S{s}-k{k}-D{d}" for s, k, d in SPECS])
@pytest.mark.parametrize("bs", [1, 3, 8])
def test_graph_replay_equals_eager_bit_for_bit(spec, bs):
    graph = decoder_after_prefill("cuda", spec, bs, cuda_graph=True)
    eager = decoder_after_prefill("cuda", spec, bs, cuda_graph=False)
    for call in range(3):                                  # capture, then replays with new inputs
        a = graph.runner.run(draft_inputs(graph, call))
        b = eager.runner.run(draft_inputs(eager, call))
        for name in a:
            assert torch.equal(a[name], b[name]), f"call {call}: {name} differs between graph and eager"
        for x, y in zip(snapshot(graph), snapshot(eager)):
            assert torch.equal(x, y), f"call {call}: draft KV cache differs between graph and eager"
    assert graph.runner.captures == 1 and eager.runner.captures == 0


@pytest.mark.cuda
def test_padded_bucket_rows_do_not_leak_into_live_rows():
    dec = decoder_after_prefill("cuda", (3, 2, 6), 4, cuda_graph=True)
    full = draft_inputs(dec, 11)                               # 4 live rows fill bucket 4
    live3 = {k: v[:3] for k, v in full.items()}                 # 3 live rows + 1 padded row
    out4 = dec.runner.run(full)
    out3 = dec.runner.run(live3)
    assert dec.runner.captures == 1
    for name in out3:
        assert torch.equal(out3[name], out4[name][:3]), f"{name}: the padded row changed live rows"


@pytest.mark.cuda
def test_replays_see_fresh_inputs():
    graph = decoder_after_prefill("cuda", (3, 2, 6), 3, cuda_graph=True)
    eager = decoder_after_prefill("cuda", (3, 2, 6), 3, cuda_graph=False)
    first = graph.runner.run(draft_inputs(graph, 1))
    second = graph.runner.run(draft_inputs(graph, 2))
    eager.runner.run(draft_inputs(eager, 1))
    want = eager.runner.run(draft_inputs(eager, 2))
    assert any(not torch.equal(first[k], second[k]) for k in first), "a replay returned stale outputs"
    for k in second:
        assert torch.equal(second[k], want[k])


@pytest.mark.cuda
@pytest.mark.parametrize("cuda_graph", [True, False], ids=["graph", "eager"])
@pytest.mark.parametrize("logits_dtype", ["float32", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("spec", SPECS, ids=[f"S{s}-k{k}-D{d}" for s, k, d in SPECS])
def test_speculative_greedy_on_gpu_is_lossless(spec, logits_dtype, cuda_graph, request):
    plain = models_on("cuda", compute_dtype="float64", logits_dtype=logits_dtype)
    prompts = ragged_prompts(21, 6, plain.config.vocab_size, max_len=12)
    budgets = ragged_budgets(21, 6, high=16)
    cfg = SpecConfig(num_steps=spec[0], topk=spec[1], num_draft_tokens=spec[2], cuda_graph=cuda_graph)
    models = steered_models(plain, prompts, budgets, agreement=0.6, spec=cfg)
    got = specverify.generate(models, prompts, spec=cfg, max_new_tokens=budgets)
    want = reference.generate(models, prompts, max_new_tokens=budgets).tokens
    assert_tokens_equal(got.tokens, want, f"GPU speculative greedy {logits_dtype} graph={cuda_graph}",
                        request.node.nodeid)


@pytest.mark.cuda
def test_graph_and_eager_generate_the_same_tokens_and_accept_lengths():
    plain = models_on("cuda", compute_dtype="bfloat16", logits_dtype="bfloat16")
    prompts = ragged_prompts(3, 8, plain.config.vocab_size, max_len=12)
    specs = [SpecConfig(num_steps=3, topk=2, num_draft_tokens=6, cuda_graph=g) for g in (True, False)]
    models = steered_models(plain, prompts, 24, agreement=0.6, spec=specs[0])
    runs = [specverify.generate(models, prompts, spec=s, max_new_tokens=24) for s in specs]
    assert runs[0].tokens == runs[1].tokens
    assert runs[0].accept_lengths == runs[1].accept_lengths
