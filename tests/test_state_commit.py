"""The recurrent-state commit of the speculative cycles (issue 11; docs/semantics.md 6.8): after
every verify step of a hybrid-model generation, each running request's committed state, in every
recurrent layer, equals the state the reference recurrence reaches over exactly the tokens the
request has cached (its prompt and its output but the pending last token), re-run in float64.

EAGLE with topk 1 (a chain: step = accepted count - 1) and topk > 1 (a tree: the last accepted
node's tree position), and naive EAGLE; greedy and sampled; drafts steered so that cycles accept
0, some and all of their drafts; padded (bucket) lanes included, which must commit nothing.
"""

from __future__ import annotations

import pytest

import reference
from specverify import SpecConfig
from specverify.engine.sampling import SamplingParams
from tests.support.asserts import assert_close
from tests.support.cases import ragged_budgets, ragged_prompts, steered_cached_models
from tests.test_device_cycle import start_decoder

SPECS = {"eagle-topk1": SpecConfig(num_steps=3, topk=1),
         "eagle-topk2": SpecConfig(num_steps=3, topk=2, num_draft_tokens=6, page_size=4),
         "naive": SpecConfig(algorithm="naive_eagle")}
SAMPLING = {"greedy": SamplingParams(), "t0.6": SamplingParams(temperature=0.6, top_k=30)}


@pytest.mark.parametrize("sampling", list(SAMPLING))
@pytest.mark.parametrize("name", list(SPECS))
def test_committed_state_equals_the_recurrence_over_the_cached_tokens(name, sampling):
    spec = SPECS[name]
    prompts = ragged_prompts(61, 3, 389, max_len=9)
    budgets = ragged_budgets(61, 3, low=6, high=12)
    models = steered_cached_models(0.7, prompts, budgets, spec, compute_dtype="float64", hybrid=True)
    cfg, weights = models.config, models.target_weights
    dec, reqs = start_decoder(models, spec, SAMPLING[sampling], prompts, budgets, eos=None, pad_batches=True)
    assert dec.cache.states.state, "the hybrid model must have a recurrent layer"
    checked, lengths = 0, set()
    while dec.running():
        dec.step()
        for r in reqs:
            lengths.update(r.accept_lengths[-1:])
            if r.finished:
                continue
            cached = (r.prompt + r.output)[:r.cached]
            want = reference.recurrent_states(cfg, weights, cached)
            for layer, (buf, w) in enumerate(zip(dec.cache.states.state, want)):
                assert_close(buf[r.row].cpu(), w, "float64",
                             f"{name}/{sampling}: request {r.index} after {len(r.accept_lengths)} cycles, "
                             f"recurrent layer {layer}, {r.cached} cached tokens")
            checked += 1
    assert checked >= 6, f"only {checked} committed states compared"
    assert 1 in lengths and max(lengths) >= 2, f"cycles must reject and accept drafts: {sorted(lengths)}"
