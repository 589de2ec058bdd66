"""The draft-tree search's per-step kernel (issue 25, docs/semantics.md 6.13) inside the decoder.

`ops.expand_beams` has its registry records (the op alone, and the whole search through the
kernels: `draft_tree_triton`); here the EAGLE cycle runs its search through the Triton kernel and
its per-cycle trace (tree tokens, parents, accepted nodes, emitted tokens) must equal the reference
decoder's, as in tests/test_spec_trace.py. A CPU-only machine interprets the kernel; a CUDA machine
runs it natively (the CPU models' search tensors go to the GPU and back for the step).
"""

from __future__ import annotations

import pytest
import torch

from specverify.kernels import draft_search
from specverify.spec import eagle
from tests.test_spec_trace import compare, report

ON_GPU = torch.cuda.is_available()


@pytest.fixture
def search_kernel(monkeypatch):
    """Every search step of the decoder goes through the Triton kernel; counts the launches."""
    calls = []

    def through_kernel(beam_scores, child_probs, child_tokens, ancestors, hidden, step, impl="auto", *rest):
        calls.append(step)
        args = (beam_scores, child_probs, child_tokens, ancestors, hidden)
        if ON_GPU and beam_scores.device.type == "cpu":
            out = draft_search.expand_beams_impl(*(t.cuda() for t in args), step, "triton")
            return draft_search.BeamStep(**{name: t.cpu() for name, t in vars(out).items()})
        return draft_search.expand_beams_impl(*args, step, "triton")
    monkeypatch.setattr(eagle, "expand_beams_impl", through_kernel)
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
def test_trace_through_the_search_kernel_equals_reference(search_kernel, c, request, record_property):
    report(compare(c, request.node.nodeid), c, record_property)
    assert search_kernel and min(search_kernel) == 1 and max(search_kernel) == c["steps"] - 1, (
        f"the search kernel ran for steps {sorted(set(search_kernel))}, want 1..{c['steps'] - 1}")
