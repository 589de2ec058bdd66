"""The MTP (docs/semantics.md 6.10) and DFlash (6.11) drafts inside the device cycle (issue 11
item 2), on the CPU: `SpecConfig(algorithm="mtp" | "dflash")` runs `engine/block_drafts.py`.

- greedy losslessness: the speculative tokens equal target-only greedy decoding, dense and hybrid,
  with the drafts steered at agreement 0.7 (tests/support/steering.py, the DFlash block rows by
  6.11's mask-token rule) so that cycles accept no draft, some and all of them;
- the padded-bucket path (what CUDA graphs replay) decodes exactly as the live-shape path, greedy
  and sampled, and never leaks into live requests' K/V (every MTP head's layer included) or state:
  padded runs with zeros and NaN in the pad lanes are bit-identical, live vs padded tokens exact
  and floats by the tolerance table;
- what the drafts compute: the chains equal the cache-free reference's (`reference.eagle`) cycle by
  cycle; every DFlash block row's logits equal the reference head's over all context and block
  rows (bidirectional); MTP step i runs head i (its own weights and K/V layer);
- DFlash's greedy verify is `ops.dflash_correct_drafts_and_bonus`, and its result decides;
- bad configurations are refused with the argument and the bound named.

The workload is small (the whole file runs in well under a minute on two cores).
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

import reference
import specverify
from reference.eagle import draft_row
from specverify import ops
from specverify.engine.sampling import SamplingParams
from specverify.engine.speculative import SpecConfig, SpecDecoder
from specverify.models import DraftHead
from tests.support.cases import cached_models, ragged_prompts, steered_cached_models
from tests.support.traces import compare_traces
from tests.support.pad_contents import fill_pad_contents
from tests.test_device_cycle import EXACT, assert_pad_row_maps_to_sink, assert_same_live_state, start_decoder

VOCAB = 389                        # the tiny preset
PROMPTS = ragged_prompts(29, 4, VOCAB, max_len=8)
BUDGETS = [3, 14, 9, 12]           # requests finish at different cycles
AGREEMENT = 0.7
ALGORITHMS = ("mtp", "dflash")
SPECS = {"mtp": SpecConfig(algorithm="mtp"), "dflash": SpecConfig(algorithm="dflash"),
         "mtp-S2": SpecConfig(algorithm="mtp", num_steps=2), "dflash-page4": SpecConfig(algorithm="dflash", page_size=4)}
SAMPLING = {"greedy": SamplingParams(), "t0.1-topk20": SamplingParams(temperature=0.1, top_k=20)}
FILLS = ("zeros", "nan")           # pad contents of the padded runs (tests/support/pad_contents.py)


@functools.lru_cache(maxsize=None)
def steered(hybrid: bool = False, compute_dtype: str = "float32"):
    """Models with every draft steered for the workload (one pre-run covers every spec)."""
    return steered_cached_models(AGREEMENT, PROMPTS, BUDGETS, list(SPECS.values()), compute_dtype=compute_dtype,
                                 hybrid=hybrid)


# -- losslessness and the acceptance it exercises --------------------------------------------------

@pytest.mark.parametrize("spec_name, hybrid", [("mtp", False), ("dflash", False), ("mtp", True), ("dflash", True),
                                               ("mtp-S2", False)],
                         ids=["mtp", "dflash", "mtp-hybrid", "dflash-hybrid", "mtp-S2"])
def test_greedy_is_lossless_and_accepts_none_some_and_all(spec_name, hybrid):
    models, spec = steered(hybrid), SPECS[spec_name]
    want = specverify.generate(models, PROMPTS, max_new_tokens=BUDGETS).tokens
    got = specverify.generate(models, PROMPTS, spec=spec, max_new_tokens=BUDGETS)
    assert got.tokens == want, f"{spec_name}: speculative greedy differs from target-only greedy"
    lengths = {n for per_request in got.accept_lengths for n in per_request}
    s = spec.num_steps
    assert {1, s + 1} <= lengths, f"{spec_name}: accept lengths {sorted(lengths)} miss 1 or S + 1 = {s + 1}"
    if s > 1:
        assert lengths & set(range(2, s + 1)), f"{spec_name}: no cycle accepted some but not all drafts"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_penalized_greedy_is_lossless(algorithm):
    """With sampling penalties (section 7) the greedy verify runs on each node's penalized logits
    (DFlash: its block op on their argmax); still target-only's tokens."""
    models, penalties = steered(), dict(repetition_penalty=1.3, presence_penalty=0.5)
    want = specverify.generate(models, PROMPTS, max_new_tokens=BUDGETS, **penalties).tokens
    got = specverify.generate(models, PROMPTS, spec=SPECS[algorithm], max_new_tokens=BUDGETS, **penalties)
    assert got.tokens == want
    assert max(n for a in got.accept_lengths for n in a) >= 2, "no cycle accepted a draft token"


# -- the padded path -------------------------------------------------------------------------------

@pytest.mark.bitexact
@pytest.mark.parametrize("sampling, spec_name, hybrid", [
    ("greedy", "mtp", False), ("greedy", "dflash-page4", False),
    ("t0.1-topk20", "mtp", True), ("t0.1-topk20", "dflash", True),
], ids=["greedy-mtp", "greedy-dflash-page4", "sampled-mtp-hybrid", "sampled-dflash-hybrid"])
def test_padded_buckets_decode_exactly_as_live_shapes(sampling, spec_name, hybrid):
    """Step for step: padded runs whose pad lanes hold zeros and NaN (tests/support/pad_contents.py,
    refilled after every step) keep every running request's cached K/V (target and every draft
    layer) and state rows bit for bit the same (same shapes: exact on every machine), and equal
    the live-shape run's: outputs, traces and accept lengths exactly, floats by the tolerance of
    the compute dtype (the live run does its matrix products at other row counts, which a CPU GEMM
    may round apart); the pad row owns no slot. The hybrid cases compute in float64, so that an
    ulp of batch-shape rounding in the hidden states cannot flip a sampled token either."""
    compute = "float64" if hybrid else "float32"
    models = steered(hybrid, compute)
    spec, params = SPECS[spec_name], SAMPLING[sampling]
    live, lreqs = start_decoder(models, spec, params, PROMPTS, BUDGETS, eos=None, pad_batches=False)
    padded = {kind: start_decoder(models, spec, params, PROMPTS, BUDGETS, eos=None, pad_batches=True)
              for kind in FILLS}
    layers = spec.num_steps if spec.algorithm == "mtp" else 1
    assert all(len(dec.cache.draft_kv.k) == layers for dec, _ in padded.values()) and len(live.cache.draft_kv.k) == layers
    steps = 0
    while live.running() or any(dec.running() for dec, _ in padded.values()):
        for kind, (dec, _) in padded.items():
            filled = fill_pad_contents(dec, kind, seed=steps)
            assert {"pending", "draft K sink [0]"} <= set(filled), f"{kind}: filled only {filled}"
        live.step()
        for dec, _ in padded.values():
            dec.step()
        steps += 1
        what = f"{spec_name} after step {steps}"
        (zeros, zreqs), (nan, nreqs) = padded["zeros"], padded["nan"]
        assert_same_live_state(nan, nreqs, zeros, zreqs, f"{what}: NaN pad lanes against zeros", floats=EXACT)
        assert_same_live_state(zeros, zreqs, live, lreqs, f"{what}: padded against live shapes", floats=compute)
        for kind, (dec, _) in padded.items():
            assert_pad_row_maps_to_sink(dec, f"{what} ({kind})")
    for dec, reqs in padded.values():
        assert dec.traces == live.traces
        assert [r.accept_lengths for r in reqs] == [r.accept_lengths for r in lreqs]
    assert max(n for r in lreqs for n in r.accept_lengths) >= 2, "no cycle accepted a draft token"
    assert steps >= 4


# -- what the drafts compute -----------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_chains_equal_the_reference_cycle_by_cycle(algorithm):
    """Plain heads (their own proposals, not the steering's), float64: the traces (chain tokens,
    accepted nodes, emitted tokens) equal reference.eagle's with algorithm=..., greedy and sampled."""
    models = cached_models(compute_dtype="float64")
    prompts, budgets, spec = PROMPTS[:2], [4, 4], SPECS[algorithm]
    for kwargs in (dict(), dict(temperature=0.8, seed=5)):
        out = specverify.generate(models, prompts, spec=spec, max_new_tokens=budgets, trace=True, **kwargs)
        ref = reference.eagle.generate(models, prompts, spec_num_steps=spec.num_steps, algorithm=algorithm,
                                       max_new_tokens=budgets, **kwargs)
        stats, _ = compare_traces(out, ref, prompts, budgets, f"{algorithm} {kwargs}")
        assert not stats["skipped"] and stats["cycles_compared"] >= 4, stats


class RecordingHead:
    """A draft head that records every forward's (input ids, positions, q_lens, logits)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def forward(self, cache, batch, features, *, at=None):
        out = self.inner.forward(cache, batch, features, at=at)
        self.calls.append((batch.input_ids.clone(), batch.positions.clone(), batch.q_lens.clone(), out.logits.clone()))
        return out

    def hidden_states(self, cache, batch, features):
        return self.inner.hidden_states(cache, batch, features)

    def context_input(self, cache, batch, features):
        return self.inner.context_input(cache, batch, features)

    def write_kv(self, cache, batch, features, *, context=None):
        self.inner.write_kv(cache, batch, features, context=context)


def test_dflash_block_rows_see_every_context_and_block_row():
    """The prefill's draft: each block row's logits equal the reference head's over all context rows
    (x_t, h_{t-1}, t) and all S block rows (mask id V, g, n + i), queried at that row."""
    models = cached_models(compute_dtype="float64")
    cfg, spec = models.config, SPECS["dflash"]
    head = RecordingHead(models.dflash)
    prompts = PROMPTS[:2]
    dec, reqs = start_decoder(dataclasses.replace(models, dflash=head), spec, SamplingParams(), prompts, [5, 5],
                              eos=None, pad_batches=False)
    (ids, positions, q_lens, logits) = head.calls[0]       # the context rows run `hidden_states`: no logits
    s, v = spec.num_steps, cfg.vocab_size
    assert bool((ids == v).all()) and q_lens.tolist() == [s] * len(prompts)
    for b, (prompt, req) in enumerate(zip(prompts, reqs)):
        seq = list(prompt) + req.output[:1]                              # the root x_n, n = len(prompt)
        n = len(seq) - 1
        assert positions[b].tolist() == list(range(n + 1, n + s + 1))
        hidden = reference.model.forward(cfg, models.target_weights, seq)[1]
        tokens, feats, pos = seq[1:], [hidden[t - 1] for t in range(1, n + 1)], list(range(1, n + 1))
        g = draft_row(cfg, models.target_weights, models.dflash_weights, tokens, torch.stack(feats), pos)[1]
        rows = (tokens + [v] * s, torch.stack(feats + [g] * s), pos + [n + i for i in range(1, s + 1)])
        for i in range(1, s + 1):
            want = draft_row(cfg, models.target_weights, models.dflash_weights, *rows, query=n - 1 + i)[0]
            # float64 compute, delivered as float32 logits: the float32 rounding of the reference's.
            torch.testing.assert_close(logits[b, i - 1], want.float(), rtol=1e-6, atol=1e-6,
                                       msg=lambda m: f"request {b} block row {i}: {m}")


def test_mtp_step_i_runs_head_i():
    """Head 2 replaced (another head's weights, still on K/V layer 2): the third draft of a cycle
    changes, the first two do not; head 1 replaced: the first draft stays."""
    models = cached_models()
    cfg, heads = models.config, models.mtp

    def first_chains(mtp):
        out = specverify.generate(dataclasses.replace(models, mtp=mtp), PROMPTS, spec=SPECS["mtp"],
                                  max_new_tokens=BUDGETS, trace=True)
        return [t[0].tree_tokens for t in out.trace]

    def head_like(j, weights):
        return DraftHead(cfg, weights, models.target.w, dtype=models.target.dtype, device=models.device, kv_layer=j)

    base = first_chains(heads)
    third = first_chains([heads[0], heads[1], head_like(2, models.mtp_weights[0])])
    second = first_chains([heads[0], head_like(1, models.mtp_weights[2]), heads[2]])
    assert [c[:3] for c in third] == [c[:3] for c in base]
    assert any(c[3] != b[3] for c, b in zip(third, base)), "replacing head 2 left every third draft unchanged"
    assert [c[:2] for c in second] == [c[:2] for c in base]
    assert any(c[2] != b[2] for c, b in zip(second, base)), "replacing head 1 left every second draft unchanged"


def test_mtp_one_step_runs_head_0_alone():
    """num_steps = 1: the cycle drafts d_1 by head 0 and no other head runs (no shared context, no
    context writes): a draft of head 0 alone decodes as the three heads do, and its traces equal
    the reference's at spec_num_steps=1."""
    models = cached_models(compute_dtype="float64")
    spec = SpecConfig(algorithm="mtp", num_steps=1)
    prompts, budgets = PROMPTS[:2], [4, 4]
    alone = specverify.generate(dataclasses.replace(models, mtp=models.mtp[:1]), prompts, spec=spec,
                                max_new_tokens=budgets, trace=True)
    every = specverify.generate(models, prompts, spec=spec, max_new_tokens=budgets, trace=True)
    assert alone.tokens == every.tokens and alone.trace == every.trace
    ref = reference.eagle.generate(models, prompts, spec_num_steps=1, algorithm="mtp", max_new_tokens=budgets)
    stats, _ = compare_traces(alone, ref, prompts, budgets, "mtp S1")
    assert not stats["skipped"] and stats["cycles_compared"] >= 4, stats


# -- DFlash's greedy verify is the block op --------------------------------------------------------

def test_dflash_greedy_verify_runs_the_block_op(monkeypatch):
    models, spec = steered(), SPECS["dflash"]
    real = ops.dflash_correct_drafts_and_bonus
    calls = []

    def spy(**kwargs):
        calls.append(tuple(kwargs["candidates"].shape))
        return real(**kwargs)

    monkeypatch.setattr(ops, "dflash_correct_drafts_and_bonus", spy)
    got = specverify.generate(models, PROMPTS, spec=spec, max_new_tokens=BUDGETS)
    cycles = max(len(a) for a in got.accept_lengths)
    assert len(calls) == cycles and calls[0] == (len(PROMPTS), spec.num_steps + 1), calls
    assert max(n for a in got.accept_lengths for n in a) == spec.num_steps + 1

    # Its result decides: forced to accept nothing, every cycle emits its bonus only, still lossless.
    def nothing_right(**kwargs):
        correct, _ = real(**kwargs)
        return torch.zeros_like(correct), kwargs["target_predict"][:, 0].clone()

    monkeypatch.setattr(ops, "dflash_correct_drafts_and_bonus", nothing_right)
    forced = specverify.generate(models, PROMPTS, spec=spec, max_new_tokens=BUDGETS)
    assert forced.tokens == got.tokens
    assert all(n == 1 for a in forced.accept_lengths for n in a)

    calls.clear()
    monkeypatch.setattr(ops, "dflash_correct_drafts_and_bonus", spy)
    specverify.generate(models, PROMPTS, spec=spec, max_new_tokens=BUDGETS, temperature=0.7, seed=3)
    specverify.generate(models, PROMPTS, spec=SPECS["mtp"], max_new_tokens=BUDGETS)
    assert calls == [], "sampled DFlash and MTP verify by the chain walks, not the greedy block op"


# -- bad configurations ----------------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_chain_configs_are_refused_with_the_bound(algorithm):
    assert SpecConfig(algorithm=algorithm).num_steps == 3 and SpecConfig(algorithm=algorithm).draft_tokens == 4
    with pytest.raises(ValueError, match=r"topk.*must be 1.*topk=2"):
        SpecConfig(algorithm=algorithm, topk=2, num_draft_tokens=4)
    with pytest.raises(ValueError, match=r"num_draft_tokens.*must be 3.*num_draft_tokens=4"):
        SpecConfig(algorithm=algorithm, num_steps=2, num_draft_tokens=4)


def test_mtp_steps_beyond_its_heads_are_refused():
    models = cached_models()
    heads = models.config.mtp_heads
    spec = SpecConfig(algorithm="mtp", num_steps=heads + 1)
    with pytest.raises(ValueError, match=rf"num_steps={heads + 1}.*mtp_heads={heads}"):
        specverify.generate(models, [[1, 2, 3]], spec=spec, max_new_tokens=2)
    with pytest.raises(ValueError, match="mtp_heads"):
        SpecDecoder(models, spec, SamplingParams(), seed=0, eos_token_id=None)
    # DFlash has no per-step heads: the same depth runs, and its trees are blocks of heads + 2 nodes.
    out = specverify.generate(models, [[1, 2, 3]], spec=SpecConfig(algorithm="dflash", num_steps=heads + 1),
                              max_new_tokens=4, trace=True)
    assert out.tokens == specverify.generate(models, [[1, 2, 3]], max_new_tokens=4).tokens
    assert out.trace[0] and all(len(cycle.tree_tokens) == heads + 2 for cycle in out.trace[0])
