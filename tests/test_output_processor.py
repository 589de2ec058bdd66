"""The output processor: message streams -> per-request results (tokens, logprobs, ranks, top
alternatives), draft-token messages merged into their target step, stop / preemption / recovery
counts honoured; and the same stream carried across processes by the shared-memory ring."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

from specverify.protocol.message import (DRAFT_TOKENS, PREEMPTED, RECOVERY_STOP, TARGET_TOKENS, Capacity,
                                         MessageWriter, read_message)
from specverify.protocol.output import OutputProcessor, StreamError
from tests.support import transport_peers

CAP = Capacity(max_bsz=4, k=3, max_draft_tokens=3)


def message(writer, counts, *, flag=TARGET_TOKENS, width=2, keep_running=True, base=0):
    """A message whose row j of request i holds token base + 10*i + j, alternatives +100, +200..."""
    bsz = len(counts)
    ids = np.zeros((bsz, CAP.max_draft_tokens, width), dtype=np.int64)
    lps = np.zeros((bsz, CAP.max_draft_tokens, width), dtype=np.float32)
    for i in range(bsz):
        for j in range(CAP.max_draft_tokens):
            ids[i, j] = base + 10 * i + j + 100 * np.arange(width)
            lps[i, j] = -(np.arange(width) + 1) * 0.5 - j
    ranks = np.tile(np.arange(1, CAP.max_draft_tokens + 1), (bsz, 1))
    wire = writer.write(msg_id=1, keep_running=keep_running, flag=flag, counts=np.array(counts),
                        token_ids=ids, logprobs=lps, ranks=ranks)
    return read_message(bytes(wire), capacity=CAP)


def test_target_steps_append_tokens_with_logprobs_and_ranks():
    w, proc = MessageWriter(CAP), OutputProcessor(3)
    proc.process(message(w, [1, 2, 0]))
    proc.process(message(w, [3, 0, 1], base=1000))
    r0, r1, r2 = proc.results
    assert r0.tokens == [0, 1000, 1001, 1002]
    assert r1.tokens == [10, 11]
    assert r2.tokens == [1020]
    rec = r1.logprobs[1]
    assert (rec.token, rec.rank, rec.logprob) == (11, 2, -1.5)
    assert rec.top == ((111, -2.0),)
    assert all(r.status == "running" for r in proc.results) and not proc.finished


def test_draft_messages_merge_into_the_matching_target_step():
    w, proc = MessageWriter(CAP), OutputProcessor(2)
    proc.process(message(w, [2, 1]))
    proc.process(message(w, [1, 0], flag=DRAFT_TOKENS, width=3, base=500))
    proc.process(message(w, [1, 1], base=2000))
    r0, r1 = proc.results
    assert [len(step) for step in r0.draft_logprobs] == [1, 0]
    assert r0.draft_logprobs[0][0].token == 500 and len(r0.draft_logprobs[0][0].top) == 2
    assert r1.draft_logprobs == [[], []]
    assert r0.tokens == [0, 1, 2000], "draft rows never become emitted tokens"


def test_preemption_and_recovery_stop_end_a_request():
    w, proc = MessageWriter(CAP), OutputProcessor(3)
    proc.process(message(w, [1, 1, 1]))
    proc.process(message(w, [PREEMPTED, RECOVERY_STOP, 2]))
    assert [r.status for r in proc.results] == ["preempted", "recovery_stop", "running"]
    assert [len(r.tokens) for r in proc.results] == [1, 1, 3]
    with pytest.raises(StreamError, match="request 0 got count 1 after it ended"):
        proc.process(message(w, [1, 0, 0]))


def test_stream_end_and_errors():
    w, proc = MessageWriter(CAP), OutputProcessor(2)
    with pytest.raises(StreamError, match="draft tokens before any target step"):
        proc.process(message(w, [1, 0], flag=DRAFT_TOKENS))
    proc.process(message(w, [0, 1], keep_running=False))
    assert proc.finished
    with pytest.raises(StreamError, match="after the stream ended"):
        proc.process(message(w, [0, 1]))
    with pytest.raises(StreamError, match="bsz 3, the processor serves 1"):
        OutputProcessor(1).process(message(w, [1, 1, 1]))
    with pytest.raises(StreamError, match="flag 7 is neither"):
        OutputProcessor(1).process(message(w, [1], flag=7))


STARTUP_S = 120.0   # a cold spawn child on a loaded machine (a GPU runner under pytest -n auto)


def test_engine_messages_cross_processes_unchanged():
    """The decoder's real message stream through the ring to an output processor in another
    process gives exactly the in-process results."""
    import specverify
    from specverify.engine import logprobs as engine_logprobs
    from specverify.engine.speculative import SpecConfig
    from specverify.protocol.transport import RingProducer, RingSpec
    from tests.support.cases import steered_cached_models

    sent = []
    real = engine_logprobs.LogprobChannel._deliver

    def tap(self, counts, token_ids, logprobs, ranks, *, keep_running):
        real(self, counts, token_ids, logprobs, ranks, keep_running=keep_running)
        sent.append((bytes(self.writer.write(msg_id=1, keep_running=keep_running, flag=TARGET_TOKENS, counts=counts,
                                             token_ids=token_ids, logprobs=logprobs, ranks=ranks)), self.capacity))

    spec = SpecConfig(num_steps=2, topk=2, num_draft_tokens=4)
    models = steered_cached_models(0.6, [[1, 2, 3], [9], [4, 4]], [7, 5, 9], spec, compute_dtype="float64")
    # "spawn", never fork: this process has torch (and, on a GPU runner, CUDA) initialised.
    mp_ctx = mp.get_context("spawn")
    with pytest.MonkeyPatch.context() as mpatch:
        mpatch.setattr(engine_logprobs.LogprobChannel, "_deliver", tap)
        out = specverify.generate(models, [[1, 2, 3], [9], [4, 4]], max_new_tokens=[7, 5, 9], logprobs=3,
                                  spec=spec)
    cap = sent[0][1]
    receiver, sender = mp_ctx.Pipe(duplex=False)
    with RingProducer.create(RingSpec(slots=4, max_message_bytes=cap.max_message_bytes)) as ring:
        child = mp_ctx.Process(target=transport_peers.consume_and_process, daemon=True,
                               args=(sender, ring.name, (cap.max_bsz, cap.k, cap.max_draft_tokens), 3))
        child.start()
        sender.close()
        try:
            # Send only once the consumer is attached: the stream then has no deadline tied to how
            # long the child takes to start.
            assert receiver.poll(STARTUP_S), f"the consumer child did not attach in {STARTUP_S} s"
            assert receiver.recv() == "attached"
            for payload, _ in sent:
                ring.send(payload, timeout=60.0)
        except BaseException:
            child.kill()
            raise
    try:
        assert receiver.poll(STARTUP_S), f"the consumer child sent no results in {STARTUP_S} s"
        got = receiver.recv()
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    assert [tokens for tokens, _ in got] == out.tokens
    for (_, recs), want in zip(got, out.logprobs):
        assert recs == [(x.token, x.logprob, x.rank, tuple(tuple(p) for p in x.top)) for x in want]
