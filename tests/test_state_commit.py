"""The recurrent-state commit of the speculative cycles (issue 11; docs/semantics.md 6.8): after
every verify step of a hybrid-model generation, each running request's committed state, in every
recurrent layer (two of them in the tiny hybrid, recurrent / attention / recurrent), recurrent
state and conv window both, equals the state the reference recurrence reaches over exactly the
tokens the request has cached (its prompt and its output but the pending last token), re-run in
float64. With a tracking interval I, the request's tracking slot holds the state over its first
floor(cached / I) * I tokens (a cycle that crosses two multiples keeps the later one).

EAGLE with topk 1 (a chain: step = accepted count - 1) and topk > 1 (a tree: the last accepted
node's tree position), MTP and DFlash (chains), and naive EAGLE; greedy and sampled; drafts steered so that cycles accept
0, some and all of their drafts; padded (bucket) lanes included, which must commit nothing.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import reference
from specverify import SpecConfig
from specverify.engine.sampling import SamplingParams
from specverify.kernels.cuda_graph import DEFAULT_BUCKETS
from tests.support.asserts import assert_close
from tests.support.cases import ragged_budgets, ragged_prompts, steered_cached_models
from tests.test_device_cycle import start_decoder

SPECS = {"eagle-topk1": SpecConfig(num_steps=3, topk=1),
         "eagle-topk2": SpecConfig(num_steps=3, topk=2, num_draft_tokens=6, page_size=4),
         "mtp": SpecConfig(algorithm="mtp", num_steps=3),
         "dflash": SpecConfig(algorithm="dflash", num_steps=3, page_size=4),
         "naive": SpecConfig(algorithm="naive_eagle")}
SAMPLING = {"greedy": SamplingParams(), "t0.1": SamplingParams(temperature=0.1, top_k=30)}


@pytest.mark.parametrize("sampling", list(SAMPLING))
@pytest.mark.parametrize("name", list(SPECS))
def test_committed_state_equals_the_recurrence_over_the_cached_tokens(name, sampling):
    spec = SPECS[name]
    prompts = ragged_prompts(61, 3, 389, max_len=9)
    budgets = ragged_budgets(61, 3, low=6, high=12)
    models = steered_cached_models(0.7, prompts, budgets, spec, compute_dtype="float64", hybrid=True)
    dec, reqs = start_decoder(models, spec, SAMPLING[sampling], prompts, budgets, eos=None, pad_batches=True)
    assert len(dec.cache.states.state) >= 2, "the hybrid model must have two recurrent layers"
    checked, lengths = 0, set()
    while dec.running():
        dec.step()
        for r in reqs:
            lengths.update(r.accept_lengths[-1:])
            if r.finished:
                continue
            assert_states(models, dec, r.row, (r.prompt + r.output)[:r.cached],
                          f"{name}/{sampling}: request {r.index} after {len(r.accept_lengths)} cycles")
            checked += 1
    assert checked >= 6, f"only {checked} committed states compared"
    assert 1 in lengths and max(lengths) >= 2, f"cycles must reject and accept drafts: {sorted(lengths)}"


@pytest.mark.parametrize("interval", [None, 2], ids=["untracked", "i2"])
@pytest.mark.parametrize("name", list(SPECS))
def test_padded_lanes_commit_no_state(name, interval):
    """A padded lane of a bucket runs on the pad row, which no request owns: every cycle commits its
    recurrent state and conv window (and, with a tracking interval, its tracking slot) only for live
    lanes, so the pad row's slots stay zero from the prefill to the last cycle."""
    spec = dataclasses.replace(SPECS[name], state_track_interval=interval)
    prompts = ragged_prompts(61, 3, 389, max_len=9)
    budgets = ragged_budgets(61, 3, low=6, high=12)
    models = steered_cached_models(0.7, prompts, budgets, spec, compute_dtype="float64", hybrid=True)
    dec, reqs = start_decoder(models, spec, SamplingParams(), prompts, budgets, eos=None, pad_batches=True)
    states = dec.cache.states
    pad = torch.tensor([dec.pad_row])
    slots = torch.cat([pad, states.tracking_slot(pad)]) if interval is not None else pad
    cycles = padded = 0
    while dec.running():
        padded += len(dec.running()) not in DEFAULT_BUCKETS              # its bucket holds pad lanes
        dec.step()
        cycles += 1
        for name_, buf in (("recurrent state", states.stacked), ("conv window", states.conv_stacked)):
            assert not buf[:, slots.to(buf.device)].any(), f"{name}: cycle {cycles} wrote the pad row's {name_}"
    assert cycles > 3 and padded, f"{name}: {cycles} cycles, {padded} with padded lanes"


def assert_states(models, dec, slot, tokens, what: str) -> None:
    """Every recurrent layer's state and conv window in `slot` equal the reference's over `tokens`."""
    states = dec.cache.states
    want = reference.recurrent_states(models.config, models.target_weights, tokens)
    assert len(want) == len(states.state)
    for layer, (state, window) in enumerate(want):
        where = f"{what}, recurrent layer {layer}, slot {slot}, {len(tokens)} tokens"
        assert_close(states.state[layer][slot].cpu(), state, "float64", f"{where}: recurrent state")
        assert_close(states.conv[layer][slot].cpu(), window, "float64", f"{where}: conv window")


TRACKED = {"eagle-topk2-i2": (SpecConfig(num_steps=3, topk=2, num_draft_tokens=6, state_track_interval=2), 0.8),
           "eagle-topk1-i5": (SpecConfig(num_steps=3, topk=1, state_track_interval=5), 0.7),
           "dflash-i2": (SpecConfig(algorithm="dflash", num_steps=3, state_track_interval=2), 0.8),
           "naive-i3": (SpecConfig(algorithm="naive_eagle", state_track_interval=3), 0.7),
           # always right: finishing cycles accept more than the budget lets through
           "mtp-i2-right": (SpecConfig(algorithm="mtp", num_steps=3, state_track_interval=2), 1.0),
           "naive-i2-right": (SpecConfig(algorithm="naive_eagle", state_track_interval=2), 1.0)}


@pytest.mark.parametrize("name", list(TRACKED))
def test_tracking_slot_holds_the_state_at_the_last_multiple_of_the_interval(name):
    spec, agreement = TRACKED[name]
    interval = spec.state_track_interval
    prompts = ragged_prompts(67, 3, 389, max_len=9)
    budgets = ragged_budgets(67, 3, low=8, high=14)
    models = steered_cached_models(agreement, prompts, budgets, spec, compute_dtype="float64", hybrid=True)
    dec, reqs = start_decoder(models, spec, SamplingParams(), prompts, budgets, eos=None, pad_batches=True)
    states = dec.cache.states
    checked, crossed_twice, finishing = 0, 0, 0
    while dec.running():
        before = {r.index: r.cached for r in reqs}
        was_finished = {r.index for r in reqs if r.finished}
        dec.step()
        for r in reqs:
            if r.index in was_finished:
                continue
            # A request that finishes in this cycle tracks only what the EOS / budget cut let through.
            finishing += r.finished
            crossed_twice += r.cached // interval - before[r.index] // interval >= 2
            mark = r.cached // interval * interval
            slot = int(states.tracking_slot(torch.tensor(r.row)))
            what = f"{name}: request {r.index}, {r.cached} cached, tracked at {mark}"
            if mark == 0:
                assert all(not buf[slot].any() for buf in states.state + states.conv), f"{what}: slot written"
            else:
                assert_states(models, dec, slot, (r.prompt + r.output)[:mark], what)
            checked += 1
    assert checked >= 6 and finishing >= 2, f"only {checked} tracking slots compared, {finishing} at the finish"
    if spec.num_steps + 1 > interval:       # a full cycle's S + 1 tokens can pass two multiples
        assert crossed_twice, "no cycle crossed two multiples of the interval: the latest-multiple rule is untested"
