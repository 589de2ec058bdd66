"""A step's bookkeeping kernels inside the decoders (issue 25): the emit (`ops.emit_tokens`,
docs/semantics.md 6.15), the K/V commit after a tree verify (`ops.commit_accepted_kv`, 6.16) and a
cycle's candidate tokens from its accepted path (`ops.accepted_tokens`, 6.17).

Each op's registry records hold its kernel against the reference sample by sample; here every
decoder runs its EOS / budget cut and state update, and every EAGLE cycle its accepted tokens and
its K/V commit, through the Triton kernels (interpreted on a CPU-only machine, native on a CUDA
one: the CPU decoder's tensors go to the GPU for the call and come back), with the ops' value
checks on, and its output must equal the reference decoder's: target-only, EAGLE (chain and tree),
naive EAGLE, MTP, DFlash. The runs meet an EOS the reference run emits (a mid-run token, and token
id 0) and budgets that cut, through the engine with fewer rows than requests (reused rows) and
padded lanes on one finished pad row, the lanes the kernels must leave alone.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specverify import Engine, SpecConfig, ops
from specverify.engine.requests import new_requests
from specverify.engine.sampling import SamplingParams
from specverify.engine.speculative import SpecDecoder
from specverify.engine import eagle_cycle, naive_cycle, target_only
from specverify.conformance.registry import REGISTRY, run_impl
from specverify.kernels import chain_verify, draft_plan, emit, fused_layers, kv_commit
from specverify.models.kv_cache import SINK_SLOT
from specverify.platform import get_profile
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
    # A tree of chain size (D = S + 1) still holds siblings: its path can skip a node, so it commits.
    "eagle-tree-of-chain-size": SpecConfig(num_steps=2, topk=2, num_draft_tokens=3),
    "naive": SpecConfig(algorithm="naive_eagle"),
    "mtp": SpecConfig(algorithm="mtp", num_steps=2),
    "dflash": SpecConfig(algorithm="dflash", num_steps=3, page_size=4),
}
BUDGETS = [2, 9, 5, 12, 3, 7]


def _on_device(fn, tensors: dict):
    """fn(**tensors) through the Triton kernel: on a CUDA machine the CPU tensors go to the GPU
    and every input the op writes in place comes back; returns fn's outputs on the CPU."""
    if not ON_GPU or next(iter(tensors.values())).device.type == "cuda":
        return fn(**tensors)
    moved = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in tensors.items()}
    out = fn(**moved)
    for k, v in tensors.items():
        if isinstance(v, torch.Tensor):
            v.copy_(moved[k].cpu())
    if not isinstance(out, tuple):
        return out.cpu()
    back = [t.cpu() for t in out]
    return type(out)(*back) if hasattr(out, "_fields") else tuple(back)     # a named tuple keeps its type


@pytest.fixture
def step_kernels(monkeypatch):
    """Every emit, every accepted-token list, every K/V commit, every draft plan and every chain
    verify's rows of the decoders (EAGLE's, MTP's and DFlash's cycle, naive EAGLE's, the
    target-only step) through the Triton kernels, checked."""
    calls = {"emit": 0, "commit": 0, "accepted": 0, "plan": 0, "chain": 0}
    plan_op, chain_op = ops.draft_plan, ops.chain_verify_rows

    def emit_tokens(*, checked=None, impl="auto", **tensors):
        calls["emit"] += 1
        return _on_device(lambda **t: ops.emit_tokens(**t, impl="triton", checked=True), tensors)

    def commit_accepted_kv(*, checked=None, impl="auto", sink=0, **tensors):
        calls["commit"] += 1
        _on_device(lambda **t: ops.commit_accepted_kv(**t, sink=sink, impl="triton", checked=True), tensors)
        return tensors["kv"]

    def accepted_tokens(*, checked=None, impl="auto", **tensors):
        calls["accepted"] += 1
        return _on_device(lambda **t: ops.accepted_tokens(**t, impl="triton", checked=True), tensors)
    def draft_plan(*, checked=None, impl="auto", width, num_steps, **tensors):
        calls["plan"] += 1
        return _on_device(lambda **t: plan_op(**t, width=width, num_steps=num_steps, impl="triton", checked=True),
                          tensors)

    def chain_verify_rows(*, checked=None, impl="auto", **tensors):
        calls["chain"] += 1
        return _on_device(lambda **t: chain_op(**t, impl="triton", checked=True), tensors)
    for module in (eagle_cycle, naive_cycle, target_only):
        monkeypatch.setattr(module, "emit_tokens", emit_tokens)
    monkeypatch.setattr(eagle_cycle, "commit_accepted_kv", commit_accepted_kv)
    for module in (eagle_cycle, naive_cycle):
        monkeypatch.setattr(module, "accepted_tokens", accepted_tokens)
        monkeypatch.setattr(module, "draft_plan", draft_plan)
        monkeypatch.setattr(module, "chain_verify_rows", chain_verify_rows)
    return calls


def _run(models, spec, prompts, budgets, eos):
    engine = Engine(models, spec=spec, max_running=4, pad_batches=True, eos_token_id=eos)
    for p, n in zip(prompts, budgets):
        engine.add_request(p, n)
    while engine.has_unfinished():
        engine.step()
    return engine.output().tokens


def _case(algorithm, prompt_seed, budgets):
    spec = ALGORITHMS[algorithm]
    models = cached_models(compute_dtype="float64")
    prompts = ragged_prompts(prompt_seed, len(budgets), models.config.vocab_size, max_len=6)
    hook = None
    if spec is not None:
        models = steered_models(models, prompts, budgets, agreement=0.8, spec=spec)
        hook = reference_hook(models.draft)
    return spec, models, prompts, hook


@pytest.mark.kernels
@pytest.mark.e2e
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_decoders_through_the_step_kernels_equal_the_reference(step_kernels, algorithm):
    spec, models, prompts, hook = _case(algorithm, 31, BUDGETS)
    free = run_reference(models, hook, spec, prompts, {}, BUDGETS).tokens
    eos = free[3][4]                           # request 3 meets it at its fifth token, mid-run
    want = run_reference(models, hook, spec, prompts, {"eos_token_id": eos}, BUDGETS).tokens
    got = _run(models, spec, prompts, BUDGETS, eos)
    assert step_kernels["emit"], "no step went through the emit kernel"
    if spec is not None:
        # Only a tree's accepted path moves (6.16): a chain's (EAGLE k1, MTP, DFlash) and naive
        # EAGLE's are the first nodes, already in place, so their cycles launch no commit at all.
        if spec.topk > 1:
            assert step_kernels["commit"], "no tree cycle went through the K/V commit kernel"
        else:
            assert step_kernels["commit"] == 0, f"a chain cycle ran the K/V commit {step_kernels['commit']} times"
        assert step_kernels["accepted"], "no cycle went through the accepted-tokens kernel"
        assert step_kernels["plan"], "no draft phase went through the draft-plan kernel"
        if spec.topk == 1:
            assert step_kernels["chain"], "no chain cycle went through the chain-verify-rows kernel"
    assert got == want, f"{algorithm}: tokens through the step kernels differ from the reference"
    assert want[3][-1] == eos and len(want[3]) < BUDGETS[3], "the case lost its EOS cut"
    assert any(len(t) == n for t, n in zip(want, BUDGETS) if eos not in t), "no budget cut met"


@pytest.mark.kernels
@pytest.mark.e2e
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_token_id_zero_as_the_eos(step_kernels, algorithm):
    """eos_token_id=0 is an EOS like any other (a truth test on it would read it as none)."""
    budgets = [12] * 4
    spec, models, prompts, hook = _case(algorithm, 8, budgets)
    want = run_reference(models, hook, spec, prompts, {"eos_token_id": 0}, budgets).tokens
    assert any(t[-1] == 0 and len(t) < 12 for t in want), "no request meets token 0 before its budget"
    assert _run(models, spec, prompts, budgets, 0) == want


def test_padded_lanes_leave_the_pad_row_alone():
    """A padded bucket: the pad row's lanes take nothing and write nothing; the state rows of the
    live lanes move as the reference says (the registry samples hold the same; this one runs the
    kernel on the decoder's own state layout, the pad row shared by three lanes)."""
    state = dict(seq_len=torch.tensor([7, 9, 11, 13, 0]), pending=torch.tensor([1, 2, 3, 4, 0]),
                 emitted=torch.tensor([0, 3, 1, 0, 0]), budget=torch.tensor([4, 4, 9, 1, 0]),
                 finished=torch.tensor([False, False, False, False, True]))
    before = {k: v.clone() for k, v in state.items()}
    produced = torch.tensor([[5, 6, 0, 0], [8, 9, 10, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [12, 0, 0, 0]])
    head, taken, done = _on_device(
        lambda **t: emit.emit_impl(t["produced"], t["count"], t["rows"], *(t[k] for k in STATE), None, "triton"),
        dict(produced=produced, count=torch.tensor([2, 3, 1, 1, 1, 1]), rows=torch.tensor([2, 1, 4, 4, 4, 3]), **state))
    assert taken.tolist() == [2, 1, 0, 0, 0, 1]
    assert done.tolist() == [False, True, True, True, True, True]
    assert head[:, -2:].tolist() == [[2, 0], [1, 1], [0, 1], [0, 1], [0, 1], [1, 1]]
    assert head[2:5, :4].eq(-1).all()
    assert state["seq_len"].tolist() == [7, 12, 13, 14, 0] and state["pending"].tolist() == [1, 10, 6, 12, 0]
    assert state["emitted"].tolist() == [0, 4, 3, 1, 0] and state["finished"].tolist() == [False, True, False, True, True]
    assert all(state[k][4] == before[k][4] for k in STATE), "the pad row changed"


@pytest.mark.kernels
@pytest.mark.parametrize("record", ["emit_tokens_triton", "commit_accepted_kv_triton", "accepted_tokens_triton",
                                    "draft_plan_triton", "chain_verify_rows_triton", "embed_concat_triton"])
def test_impl_triton_runs_the_kernel(record, monkeypatch):
    """A Triton record holds the kernel only if `impl="triton"` reaches it: a wrapper that drops
    the argument would run the torch path on the CPU and pass every sample. With the torch paths
    made to fail, each record's samples must still come through (on a CUDA machine: on the GPU)."""
    def torch_path(*args, **kwargs):
        raise AssertionError(f"{record}: impl='triton' ran the torch path")
    for module, name in ((emit, "_emit_torch"), (emit, "_accepted_torch"), (kv_commit, "_commit_kv_torch"),
                         (draft_plan, "_draft_plan_torch"), (chain_verify, "_chain_verify_rows_torch"),
                         (fused_layers, "_embed_concat_torch")):
        monkeypatch.setattr(module, name, torch_path)
    op = REGISTRY[record]
    profile = get_profile("cuda" if ON_GPU else "cpu")
    samples = [s for s in op.samples("float32", 0) if all(t.numel() for t in s.args.values()
                                                             if isinstance(t, torch.Tensor))]
    assert samples, f"{record} has no non-empty sample"
    for sample in samples[:3]:
        run_impl(op, sample, profile)


class LaneRecorder:
    """A model (the target, a draft head, an MTP head) that records, for every forward, each
    lane's live query count and whether the lane's row was finished when the forward ran."""

    def __init__(self, inner, name: str, log: list, finished):
        self.inner, self.name, self.log, self.finished = inner, name, log, finished

    def __getattr__(self, attr):
        return getattr(self.inner, attr)

    def _record(self, cache, batch) -> None:
        done = self.finished()
        # The slots its tokens write: the batch's own (a draft phase's plan read them) or planned here.
        slots = batch.new_slots(cache.table.req_to_token)
        self.log.append((self.name, batch.rows.tolist(), batch.q_lens.tolist(), done[batch.rows].tolist(),
                         slots.tolist()))

    def forward(self, cache, batch, *args, **kwargs):
        self._record(cache, batch)
        return self.inner.forward(cache, batch, *args, **kwargs)

    def hidden_states(self, cache, batch, features):
        self._record(cache, batch)
        return self.inner.hidden_states(cache, batch, features)

    def write_kv(self, cache, batch, features, *, context=None):
        self._record(cache, batch)
        self.inner.write_kv(cache, batch, features, context=context)


@pytest.mark.e2e
@pytest.mark.parametrize("algorithm", ["eagle-chain", "eagle-tree", "naive", "naive-unfused", "mtp", "dflash"])
def test_finished_lanes_run_nothing_and_live_lanes_extend_what_they_emitted(algorithm):
    """6.18 / 6.19 on the decoder: in every forward of the prefill and of each cycle (the verify,
    the draft-extend, the draft steps, MTP's heads, DFlash's block) a lane whose row is finished
    when the forward runs (the pad row of a padded bucket, a request that stopped earlier or in
    this very cycle) runs no token and a live lane runs at least one; a cycle's draft-extend runs
    exactly the tokens each request still running took from it (no padding column), except naive
    EAGLE's fused one, which runs both of its rows on every live lane (6.7: one shape, the second
    row dropped after a rejection); its unfused form (`fused=False`) runs exactly what was taken. A
    finished lane that still wrote would only touch the sink or a stopping request's own slots, which
    no output reads: only this test sees it."""
    budgets = [1, 9, 5, 12]                     # request 0 stops at its prefill's token
    fused = algorithm != "naive-unfused"
    spec, models, prompts, _ = _case(algorithm if fused else "naive", 17, budgets)
    log: list = []
    state = {}

    def finished():
        return state["dec"].state.requests.finished

    def wrap(model, name):
        return LaneRecorder(model, name, log, finished)
    models = dataclasses.replace(
        models, target=wrap(models.target, "target"), draft=wrap(models.draft, "draft"),
        mtp=[wrap(h, f"mtp{j}") for j, h in enumerate(models.mtp)],
        dflash=wrap(models.dflash, "dflash") if models.dflash is not None else None)
    reqs = new_requests(prompts, budgets)
    state["dec"] = dec = SpecDecoder(models, spec, SamplingParams(), seed=0, eos_token_id=None, pad_batches=True,
                                     fused=fused)

    def check(when, entries):
        for name, rows, q_lens, done, slots in entries:
            for row, q, stopped, cells in zip(rows, q_lens, done, slots):
                assert (q == 0) == stopped, (f"{algorithm}, {when}, {name} forward: a lane on row {row} ran {q} "
                                             f"tokens with its row {'finished' if stopped else 'live'}")
                # What it writes: a cell of its row for each token it runs, the sink for the others.
                assert [c != SINK_SLOT for c in cells] == [j < q for j in range(len(cells))], (
                    f"{algorithm}, {when}, {name} forward: a lane on row {row} running {q} tokens writes the "
                    f"slots {cells} (sink {SINK_SLOT})")
    dec.start(reqs)
    assert reqs[0].finished and any(stopped for *_, done, _ in log for stopped in done), "no lane stopped at its prefill"
    # The prefill's target forward writes the rows' state (a row is finished until its prefill): its
    # draft-extend runs after, on the state it wrote.
    check("prefill", [entry for entry in log if entry[0] != "target"])
    cycles = extends = 0
    while dec.running():
        log.clear()
        running = dec.running()
        dec.step()
        cycles += 1
        check(f"cycle {cycles}", log)
        first_draft = next(entry for entry in log if entry[0] != "target")      # the draft-extend
        for row, q in zip(first_draft[1], first_draft[2]):
            req = next((r for r in running if r.row == row), None)
            if req is not None and not req.finished:
                extends += 1
                want = 2 if algorithm == "naive" else req.accept_lengths[-1]
                assert q == want, (f"{algorithm}: the draft-extend ran {q} tokens for request {req.index}, which "
                                   f"took {req.accept_lengths[-1]}")
    assert cycles > 3 and extends > 3, "the run was too short to say anything"
    assert all(r.finished for r in reqs)


@pytest.mark.e2e
@pytest.mark.parametrize("algorithm", ["eagle-chain", "eagle-tree", "naive", "mtp", "dflash"])
def test_a_draft_phase_reads_its_slots_once_in_its_plan(algorithm, monkeypatch):
    """6.18 / 6.19: the draft plan reads the slots of the draft-extend and of the S cells after the
    root, and a chain's verify rows the slots of its nodes, so a chain cycle's forwards (the
    verify, the extend, the chain steps, MTP's heads, DFlash's block, naive EAGLE's) plan no slots
    of their own (`token_slots`: one kernel each on a GPU); a tree's verify and its steps (k beams a
    step, their own region) still do. What they write is the test above's."""
    from specverify.models import layers
    spec, models, prompts, _ = _case(algorithm, 5, [9, 12, 7])
    planned = []
    real = layers.token_slots_impl

    def counted(*args, **kwargs):
        planned.append(args[4])                  # num_tokens: who planned (the verify's D, a step's k)
        return real(*args, **kwargs)
    monkeypatch.setattr(layers, "token_slots_impl", counted)
    dec = SpecDecoder(models, spec, SamplingParams(), seed=0, eos_token_id=None, pad_batches=True)
    dec.start(new_requests(prompts, [9, 12, 7]))
    cycles = 0
    while dec.running():
        planned.clear()
        dec.step()
        cycles += 1
        want = spec.num_steps if spec.topk > 1 else 0              # a tree's verify and its S - 1 steps
        assert len(planned) == want, (f"{algorithm}, cycle {cycles}: {len(planned)} forwards planned their own "
                                      f"slots (tokens {planned}), want {want}")
    assert cycles > 2


@pytest.mark.kernels
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_draft_plan_slots_at_the_row_end(impl):
    """6.18 with the slot table at the row end, which the registry's samples never reach (their
    checks refuse a live lane past its row): (a) the bound holds live lanes only, so a finished
    lane past its row (a stopped request whose row filled up, the pad row) is planned, checked, as
    the reference says: the sink and nothing else; (b) unchecked (the engine's checked=False, a
    GPU's None), a live extend token past its row reads the row's last cell (6.14's clamp), never
    the next row's."""
    import reference
    table = (torch.arange(3 * 5) + 1).view(3, 5)          # R = 3 rows of C = 5 distinct cells
    cases = [
        # (a) lane 1 finished with kv 4 + q 3 = 7 > C = 5
        (dict(q_lens=torch.tensor([1, 3]), kv_lens=torch.tensor([2, 4]), finished=torch.tensor([False, True]),
              rows=torch.tensor([1, 0])), True),
        # (b) lane 0 live with kv 3 + q 3 = 6 > C: its tokens 2.. read the row's last cell
        (dict(q_lens=torch.tensor([3, 1]), kv_lens=torch.tensor([3, 0]), finished=torch.tensor([False, False]),
              rows=torch.tensor([1, 0])), False),
    ]
    for args, checked in cases:
        args = dict(args, width=3, num_steps=2, req_to_token=table, sink=0)
        got = _on_device(lambda **t: ops.draft_plan(**t, impl=impl, checked=checked), args)
        want = reference.draft_plan(**{k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in args.items()})
        assert got.slots.tolist() == want["slots"], f"{impl}, checked={checked}: slots {got.slots.tolist()}"
        assert got.ahead_slots.tolist() == want["ahead_slots"], (
            f"{impl}, checked={checked}: ahead_slots {got.ahead_slots.tolist()}")


@pytest.mark.kernels
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_chain_verify_slots_at_the_row_end(impl):
    """6.19 with the slot table, unchecked (the engine's checked=False, a GPU's None): a live
    chain whose last nodes run past its row reads the row's last cell for them (6.14's clamp),
    never the next row's; a finished row past its end writes nothing but the sink."""
    import reference
    table = (torch.arange(3 * 5) + 1).view(3, 5)          # R = 3 rows of C = 5 distinct cells
    args = dict(rows=torch.tensor([1, 0, 2]), seq_len=torch.tensor([4, 4, 1]), pending=torch.tensor([7, 8, 9]),
                finished=torch.tensor([True, False, False]), req_id=torch.tensor([0, 1, 2]),
                drafts=torch.tensor([[1, 2], [3, 4], [5, 6]]), req_to_token=table, sink=0)
    got = _on_device(lambda **t: ops.chain_verify_rows(**t, impl=impl, checked=False), args)
    want = reference.chain_verify_rows(**{k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in args.items()})
    assert got.slots.tolist() == want["slots"], f"{impl}: slots {got.slots.tolist()}, want {want['slots']}"
    # Lane 0 (row 1, live, nodes at 4, 5, 6 of C = 5): its row's last cell, three times; lane 1 (row 0,
    # finished, past its end too): the sink.
    assert want["slots"][0] == [table[1, 4].item()] * 3 and want["slots"][1] == [0, 0, 0]


@pytest.mark.kernels
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_chain_verify_slots_bound_at_the_row_end_checked(impl):
    """6.19's bound with the slot table, checked (the draft plan's row-end test has its twin): it
    holds live lanes only, so a finished row whose nodes run past its end (a stopped request, the
    pad row) is read as the reference says, the sink and nothing else; a live chain whose last node
    is the row's last cell passes, and one a cell further is refused. The registry's error input
    and overhang sample say the same; this pins it without them."""
    import reference
    table = (torch.arange(3 * 5) + 1).view(3, 5)          # R = 3 rows of C = 5 distinct cells
    base = dict(rows=torch.tensor([1, 0, 2]), pending=torch.tensor([7, 8, 9]),
                finished=torch.tensor([True, False, False]), req_id=torch.tensor([0, 1, 2]),
                drafts=torch.tensor([[1, 2], [3, 4], [5, 6]]), req_to_token=table, sink=3)
    # Row 0 finished with nodes at 4..6 (past C = 5); row 1 live, nodes 2..4 (the last at the row end).
    args = dict(base, seq_len=torch.tensor([4, 2, 0]))
    got = _on_device(lambda **t: ops.chain_verify_rows(**t, impl=impl, checked=True), args)
    want = reference.chain_verify_rows(**{k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in args.items()})
    assert got.slots.tolist() == want["slots"], f"{impl}: slots {got.slots.tolist()}, want {want['slots']}"
    assert want["slots"][:2] == [table[1, 2:5].tolist(), [3, 3, 3]]
    # Row 1's last node one cell past its row: refused.
    with pytest.raises(ValueError, match="a verified node past its row"):
        _on_device(lambda **t: ops.chain_verify_rows(**t, impl=impl, checked=True),
                   dict(base, seq_len=torch.tensor([4, 3, 0])))
