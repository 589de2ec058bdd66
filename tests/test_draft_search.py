"""The draft phase's per-step kernels (issue 25) inside the decoder: the draft selection
(`kernels.draft_select`, docs/semantics.md 6.1; a chain's top-1 through the vocab-split argmax,
`kernels.argmax`) and the search step (`ops.expand_beams`, 6.13; a chain runs no search).

Each has its registry records (`select_draft_topk_triton`; `expand_beams_triton` and the whole
search through the kernels, `draft_tree_triton`); here the EAGLE cycle runs its draft phase through
both Triton kernels and its per-cycle trace (tree tokens, parents, accepted nodes, emitted tokens) must equal the reference
decoder's, as in tests/test_spec_trace.py. A CPU-only machine interprets the kernel; a CUDA machine
runs it natively (the CPU models' search tensors go to the GPU and back for the step).
"""

from __future__ import annotations

import pytest
import torch

from specverify.engine import eagle_cycle
from specverify.kernels import argmax, draft_search, draft_select
from specverify.spec import eagle
from tests.test_spec_trace import compare, report

ON_GPU = torch.cuda.is_available()


def _on_gpu(fn, *tensors):
    """fn(*tensors) with CPU tensors moved to the GPU for the call when there is one (a CUDA
    machine runs the kernel natively), the outputs moved back."""
    if ON_GPU and tensors[0].device.type == "cpu":
        out = fn(*(t.cuda() if isinstance(t, torch.Tensor) else t for t in tensors))
        if isinstance(out, torch.Tensor):
            return out.cpu()
        if isinstance(out, tuple):
            return type(out)(t.cpu() for t in out)
        return draft_search.BeamStep(**{name: t.cpu() for name, t in vars(out).items()})
    return fn(*tensors)


@pytest.fixture
def draft_kernels(monkeypatch):
    """Every search step and every softmax-path draft selection of the decoder go through the
    Triton kernels; records the steps and the selections' topk."""
    calls = {"steps": [], "select": [], "token": 0}
    original_select, original_token = eagle_cycle.draft_topk, eagle_cycle.draft_token

    def through_search_kernel(beam_scores, child_probs, child_tokens, ancestors, hidden, step, impl="auto", *rest):
        calls["steps"].append(step)
        return _on_gpu(lambda *t: draft_search.expand_beams_impl(*t[:5], t[5], "triton"),
                       beam_scores, child_probs, child_tokens, ancestors, hidden, step)

    def through_select_kernel(logits, topk, profile, scale):
        if topk == 1 and profile.argmax_fast_path:
            return original_select(logits, topk, profile, scale)
        calls["select"].append(topk)
        return _on_gpu(lambda x, s: draft_select.select_topk_triton(x, topk, s), logits, scale)
    def through_argmax_kernel(logits, profile, scale, keep=None):
        if not profile.argmax_fast_path:
            return original_token(logits, profile, scale, keep)
        calls["token"] += 1
        if keep is None:
            return _on_gpu(lambda x: argmax.row_argmax(x, impl="triton"), logits)

        def kept_by_the_kernel(x, column, rows):
            return argmax.row_argmax(x, impl="triton", keep=(column, rows)), column
        # The kernel writes the kept column itself; where it ran on a GPU copy, that copy comes back.
        index, column = _on_gpu(kept_by_the_kernel, logits, *keep)
        keep[0].copy_(column)
        return index
    monkeypatch.setattr(eagle, "expand_beams_impl", through_search_kernel)
    monkeypatch.setattr(eagle_cycle, "draft_topk", through_select_kernel)
    monkeypatch.setattr(eagle_cycle, "draft_token", through_argmax_kernel)
    return calls


CASES = [
    dict(topk=2, steps=3, draft="wide", page_size=1, bs=3, logits_dtype="float32", scale="1", sampling="greedy",
         head="partial", eos=False),
    dict(topk=4, steps=2, draft="two", page_size=4, bs=3, logits_dtype="bfloat16", scale="0.37",
         sampling="t1.0-topp0.9", head="right", eos=True),
    dict(topk=1, steps=3, draft="chain", page_size=1, bs=1, logits_dtype="float8_e4m3fn", scale="per_row",
         sampling="greedy", head="partial", eos=False),
]


@pytest.mark.kernels
@pytest.mark.e2e
@pytest.mark.parametrize("c", CASES, ids=lambda c: f"k{c['topk']}-S{c['steps']}-{c['draft']}-{c['sampling']}")
def test_trace_through_the_draft_kernels_equals_reference(draft_kernels, c, request, record_property):
    report(compare(c, request.node.nodeid), c, record_property)
    steps = draft_kernels["steps"]
    if c["topk"] == 1:
        assert not steps, f"a chain ran the search kernel (steps {sorted(set(steps))})"
        assert draft_kernels["token"], "no chain draft step went through the argmax kernel"
    else:
        assert steps and min(steps) == 1 and max(steps) == c["steps"] - 1, (
            f"the search kernel ran for steps {sorted(set(steps))}, want 1..{c['steps'] - 1}")
    assert set(draft_kernels["select"]) == ({c["topk"]} if c["topk"] > 1 else set()), (
        f"the selection kernel ran for topk {sorted(set(draft_kernels['select']))}")


@pytest.mark.parametrize("k, auto_path", [(16, "triton"), (17, "torch")])
def test_a_gpu_runs_the_step_kernel_up_to_its_tile(k, auto_path, monkeypatch):
    """The search step's dispatch on a CUDA device, where "auto" picks Triton: the kernel ranks
    k^2 candidates in one tile, so "auto" takes it up to MAX_TRITON_TOPK beams and torch's path
    above; impl="triton" takes the kernel and impl="torch" torch's path at any k. The device's
    answer is stood in for (this runs on any machine); the paths only record that they ran."""
    assert draft_search.MAX_TRITON_TOPK == 16
    monkeypatch.setattr(draft_search, "pick_impl", lambda impl, device: "torch" if impl == "torch" else "triton")
    ran = []
    monkeypatch.setattr(draft_search, "_expand_triton", lambda *args: ran.append("triton"))
    monkeypatch.setattr(draft_search, "_expand_torch", lambda *args: ran.append("torch"))
    args = (torch.rand(1, k), torch.rand(1, k, k), torch.zeros((1, k, k), dtype=torch.int64),
            torch.zeros((1, k, 4), dtype=torch.bool), torch.zeros((1, k, 8)))
    for impl in ("auto", "triton", "torch"):
        draft_search.expand_beams_impl(*args, 1, impl)
    assert ran == [auto_path, "triton", "torch"]
