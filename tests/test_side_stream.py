"""`SideStream` (specverify/engine/side_stream.py): work forked beside the current CUDA stream
starts after what that stream queued before the fork, and what the current stream queues after the
join sees the forked work's results, eagerly and inside a captured graph. On the CPU the forked
work runs in order, where it is written.

The GPU tests make each ordering observable by a long device sleep (`torch.cuda._sleep`) on the
stream the other one must wait for: without the fork's wait the side stream's copy would read the
buffer before the sleeping stream fills it, without the join the current stream would read what the
side stream has not written yet."""

from __future__ import annotations

import pytest
import torch

from specverify.engine.side_stream import SideStream

# About 10 ms of device clock cycles at ~2 GHz: far longer than a launch's latency.
SLEEP_CYCLES = 20_000_000


def test_on_the_cpu_the_forked_work_runs_in_order():
    side = SideStream("cpu")
    x = torch.zeros(4)
    with side.fork():
        x += 1
        seen = x.clone()
    side.join()
    x *= 3
    assert seen.tolist() == [1.0] * 4 and x.tolist() == [3.0] * 4


def fork_after_sleep(side: SideStream, src: torch.Tensor, dst: torch.Tensor) -> None:
    """The current stream sleeps then fills src; the side stream copies src into dst."""
    torch.cuda._sleep(SLEEP_CYCLES)
    src.fill_(1.0)
    with side.fork():
        dst.copy_(src)
    side.join()


def join_after_sleep(side: SideStream, dst: torch.Tensor, out: torch.Tensor) -> None:
    """The side stream sleeps then fills dst; after the join the current stream copies it out."""
    with side.fork():
        torch.cuda._sleep(SLEEP_CYCLES)
        dst.fill_(2.0)
    side.join()
    out.copy_(dst)


@pytest.mark.cuda
@pytest.mark.parametrize("order", ["fork", "join"])
def test_forked_work_waits_for_the_queue_and_the_join_waits_for_it(order):
    side = SideStream("cuda")
    assert side.stream is not None and side.stream != torch.cuda.current_stream()
    a, b = torch.zeros(1 << 16, device="cuda"), torch.zeros(1 << 16, device="cuda")
    torch.cuda.synchronize()
    (fork_after_sleep if order == "fork" else join_after_sleep)(side, a, b)
    torch.cuda.synchronize()
    want = 1.0 if order == "fork" else 2.0
    assert bool((b == want).all()), f"{order}: the other stream's work was not waited for"


@pytest.mark.cuda
@pytest.mark.parametrize("order", ["fork", "join"])
def test_a_captured_graph_keeps_the_fork_and_the_join(order):
    """Captured on a stream of its own (as the decoders' runner does), replayed after the buffers
    are cleared: the replay orders the two branches as the eager calls do."""
    side = SideStream("cuda")
    a, b = torch.zeros(1 << 16, device="cuda"), torch.zeros(1 << 16, device="cuda")
    fn = fork_after_sleep if order == "fork" else join_after_sleep
    capture_stream = torch.cuda.Stream()
    capture_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture_stream):
        fn(side, a, b)                              # warm-up, outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=capture_stream):
            fn(side, a, b)
    torch.cuda.synchronize()
    a.zero_()
    b.zero_()
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    want = 1.0 if order == "fork" else 2.0
    assert bool((b == want).all()), f"{order}: the replay lost the ordering of the two streams"


@pytest.mark.cuda
def test_a_join_with_nothing_forked_adds_nothing_to_a_capture():
    """A join with nothing forked since the last one (an MTP draft of one step forks nothing) waits
    for nothing: inside a capture a wait on the side stream's work from before it would invalidate
    the capture. The side stream worked before the capture, then the capture joins twice."""
    side = SideStream("cuda")
    a = torch.zeros(1 << 10, device="cuda")
    with side.fork():
        a.add_(1.0)
    side.join()
    assert not side.forked
    capture_stream = torch.cuda.Stream()
    capture_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture_stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=capture_stream):
            side.join()
            a.add_(2.0)
            side.join()
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    assert bool((a == 3.0).all())


class SlowContextHead:
    """An MTP head whose context K/V write starts after a long device sleep on the stream it is
    queued on (the cycle's side stream): the steps must still read the written layers."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, attr):
        return getattr(self.inner, attr)

    def write_kv(self, cache, batch, features, *, context=None):
        torch.cuda._sleep(SLEEP_CYCLES // 4)
        self.inner.write_kv(cache, batch, features, context=context)


@pytest.mark.cuda
@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "captured"])
@pytest.mark.parametrize("num_steps", [3, 1])
def test_mtp_steps_wait_for_slow_context_writes(cuda_graph, num_steps):
    """MTP's heads 1.. write their context K/V on the side stream beside head 0's forward; step i
    reads head i's layer after the join. Made slow, the writes change no cycle of the trace (its
    drafts included): the steps waited for them, eagerly and in the captured graph. With one step
    there is no context write and nothing to join (the captured cycle must still capture)."""
    import dataclasses

    import specverify
    from specverify.engine.spec_config import SpecConfig
    from tests.support.cases import ragged_prompts

    models = specverify.build_models("tiny", device="cuda", compute_dtype="float32", logits_dtype="float32")
    prompts, budgets = ragged_prompts(53, 3, models.config.vocab_size, max_len=9), [9, 12, 10]
    spec = SpecConfig(algorithm="mtp", num_steps=num_steps, cuda_graph=cuda_graph)
    want = specverify.generate(models, prompts, spec=spec, max_new_tokens=budgets, trace=True)
    slow = dataclasses.replace(models, mtp=[models.mtp[0]] + [SlowContextHead(h) for h in models.mtp[1:]])
    got = specverify.generate(slow, prompts, spec=spec, max_new_tokens=budgets, trace=True)
    assert got.tokens == want.tokens
    assert got.trace == want.trace, "a step read a head's layer before its context write finished"
