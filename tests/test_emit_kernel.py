"""The emit kernel (`ops.emit_tokens`, docs/semantics.md 6.15) inside every decoder (issue 25).

The op's registry records hold the kernel against `reference.emit_tokens` sample by sample; here
every decoder's step runs its EOS / budget cut and state update through the Triton kernel
(interpreted on a CPU-only machine, native on a CUDA one: the CPU decoder's state goes to the GPU
for the call and comes back) and its output must equal the reference decoder's: target-only,
EAGLE (chain and tree), naive EAGLE. Each run meets an EOS the reference run emits and budgets that
cut inside a cycle, through the engine with fewer rows than requests (reused rows) and padded
lanes on one finished pad row, the lanes the kernel must leave alone.
"""

from __future__ import annotations

import pytest
import torch

import specverify
from specverify import Engine, SpecConfig
from specverify.engine import eagle_cycle, naive_cycle, target_only
from specverify.kernels import emit
from tests.support.cases import cached_models, ragged_prompts
from tests.support.steering import steered_models
from tests.test_continuous_batching import run_reference
from tests.test_spec_trace import reference_hook

ON_GPU = torch.cuda.is_available()
STATE = ("seq_len", "pending", "emitted", "budget", "finished")
ALGORITHMS = {
    "target": None,
    "eagle-chain": SpecConfig(num_steps=3, topk=1),
    "eagle-tree": SpecConfig(num_steps=3, topk=2, num_draft_tokens=6, page_size=4),
    "naive": SpecConfig(algorithm="naive_eagle"),
}
BUDGETS = [2, 9, 5, 12, 3, 7]


def _through_kernel(calls: list):
    """ops.emit_tokens as the decoders call it, run by the Triton kernel (argument checks kept)."""
    def emit_tokens(*, produced, count, rows, seq_len, pending, emitted, budget, finished, eos_token_id,
                    checked=None, impl="auto"):
        calls.append(produced.shape[0])
        state = dict(seq_len=seq_len, pending=pending, emitted=emitted, budget=budget, finished=finished)
        if not ON_GPU or produced.device.type == "cuda":
            return emit.emit_impl(produced, count, rows, *state.values(), eos_token_id, "triton")
        moved = {k: v.cuda() for k, v in state.items()}
        out = emit.emit_impl(produced.cuda(), count.cuda(), rows.cuda(), *moved.values(), eos_token_id, "triton")
        for k, v in moved.items():
            state[k].copy_(v.cpu())                       # the op writes the state in place
        return tuple(t.cpu() for t in out)
    return emit_tokens


@pytest.fixture
def emit_kernel(monkeypatch):
    calls = []
    for module in (eagle_cycle, naive_cycle, target_only):
        monkeypatch.setattr(module, "emit_tokens", _through_kernel(calls))
    return calls


def _run(models, spec, prompts, eos):
    engine = Engine(models, spec=spec, max_running=4, pad_batches=True, eos_token_id=eos)
    for p, n in zip(prompts, BUDGETS):
        engine.add_request(p, n)
    while engine.has_unfinished():
        engine.step()
    return engine.output().tokens


@pytest.mark.kernels
@pytest.mark.e2e
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_decoders_through_the_emit_kernel_equal_the_reference(emit_kernel, algorithm):
    spec = ALGORITHMS[algorithm]
    models = cached_models(compute_dtype="float64")
    prompts = ragged_prompts(31, len(BUDGETS), models.config.vocab_size, max_len=6)
    hook = None
    if spec is not None:
        models = steered_models(models, prompts, BUDGETS, agreement=0.8, spec=spec)
        hook = reference_hook(models.draft)
    free = run_reference(models, hook, spec, prompts, {}, BUDGETS).tokens
    eos = free[3][4]                           # request 3 meets it at its fifth token, mid-run
    want = run_reference(models, hook, spec, prompts, {"eos_token_id": eos}, BUDGETS).tokens
    got = _run(models, spec, prompts, eos)
    assert emit_kernel, "no step went through the emit kernel"
    assert got == want, f"{algorithm}: tokens through the emit kernel differ from the reference"
    assert want[3][-1] == eos and len(want[3]) < BUDGETS[3], "the case lost its EOS cut"
    if spec is not None:
        assert any(len(t) == n for t, n in zip(want, BUDGETS) if eos not in t), "no budget cut met"


def test_padded_lanes_leave_the_pad_row_alone():
    """A padded bucket: the pad row's lanes take nothing and write nothing; the state rows of the
    live lanes move as the reference says (the registry samples hold the same; this one runs the
    kernel on the decoder's own state layout, the pad row shared by three lanes)."""
    state = dict(seq_len=torch.tensor([7, 9, 11, 13, 0]), pending=torch.tensor([1, 2, 3, 4, 0]),
                 emitted=torch.tensor([0, 3, 1, 0, 0]), budget=torch.tensor([4, 4, 9, 1, 0]),
                 finished=torch.tensor([False, False, False, False, True]))
    produced = torch.tensor([[5, 6, 0, 0], [8, 9, 10, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [12, 0, 0, 0]])
    count = torch.tensor([2, 3, 1, 1, 1, 1])
    rows = torch.tensor([2, 1, 4, 4, 4, 3])
    before = {k: v.clone() for k, v in state.items()}
    if ON_GPU:
        moved = {k: v.cuda() for k, v in state.items()}
        head, taken, done = emit.emit_impl(produced.cuda(), count.cuda(), rows.cuda(), *moved.values(), None, "triton")
        state = {k: v.cpu() for k, v in moved.items()}
        head, taken, done = head.cpu(), taken.cpu(), done.cpu()
    else:
        head, taken, done = emit.emit_impl(produced, count, rows, *state.values(), None, "triton")
    assert taken.tolist() == [2, 1, 0, 0, 0, 1]
    assert done.tolist() == [False, True, True, True, True, True]
    assert head[:, -2:].tolist() == [[2, 0], [1, 1], [0, 1], [0, 1], [0, 1], [1, 1]]
    assert head[2:5, :4].eq(-1).all()
    assert state["seq_len"].tolist() == [7, 12, 13, 14, 0] and state["pending"].tolist() == [1, 10, 6, 12, 0]
    assert state["emitted"].tolist() == [0, 4, 3, 1, 0] and state["finished"].tolist() == [False, True, False, True, True]
    assert all(state[k][4] == before[k][4] for k in STATE), "the pad row changed"
