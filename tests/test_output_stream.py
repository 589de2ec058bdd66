"""Interleaved streams of many requests through the output processor, held against the reference.

A hypothesis state machine sends target and draft messages for up to five request slots: several
target steps before a draft message, drafts of some requests only, chunked-prefill zeros,
requests preempted or stopped in between while the others go on, a smaller `bsz` than the
processor serves, every row width. Each message is packed by specverify's writer, carried by the
shared-memory ring (specverify.protocol.transport) and read twice:
by specverify's reader into the OutputProcessor, and byte by byte by the reference decoder
(reference.protocol.packed_decode) folded by reference.protocol.merge_stream. After every step
both hold the same tokens, statuses, logprob records and draft rows per request; a message the
stream cannot take (tokens for a request that ended, drafts before any target step, anything after
the end) is refused by both. (Issue 23 item 7; the continuous-batching engine comes separately.)
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from reference import protocol as rproto
from specverify.protocol.message import (DRAFT_TOKENS, PREEMPTED, RECOVERY_STOP, TARGET_TOKENS, Capacity,
                                         MessageWriter, read_message)
from specverify.protocol.output import OutputProcessor, StreamError
from specverify.protocol.transport import RingConsumer, RingProducer, RingSpec

CAP = Capacity(max_bsz=5, k=3, max_draft_tokens=3)
RCAP = rproto.ProtocolCapacity(CAP.max_bsz, CAP.k, CAP.max_draft_tokens)
# ulp neighbours, ties, -inf and a subnormal among the logprobs: carried bit for bit
LOGPROBS = st.sampled_from([0.0, -0.5, -0.5, float(np.nextafter(np.float32(-0.5), np.float32(0))), -1e-45,
                            -20.25, float("-inf")])


def _records(rows):
    token_ids, logprobs, ranks = rows
    return [(ids[0], np.float32(lps[0]).tobytes(), rank, tuple((t, np.float32(lp).tobytes())
                                                           for t, lp in zip(ids[1:], lps[1:])))
            for ids, lps, rank in zip(token_ids, logprobs, ranks)]


class OutputStream(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.writer = MessageWriter(CAP)
        self.proc = None
        self.decoded = []
        self.msg_id = 0

    @initialize(num_requests=st.integers(1, CAP.max_bsz))
    def start(self, num_requests):
        self.num_requests = num_requests
        self.proc = OutputProcessor(num_requests)
        # Every message crosses the shared-memory ring before either side reads it.
        self.producer = RingProducer.create(RingSpec(4, 1024))
        self.consumer = RingConsumer.attach(self.producer.name)

    def _send(self, data, flag, counts, keep_running=True):
        """Pack one message (random rows when `data` is given, zeros otherwise) and read it both ways."""
        bsz, rows = len(counts), CAP.max_draft_tokens
        width = data.draw(st.integers(1, CAP.k + 1), label="width") if data else 1
        if data:
            ids = data.draw(st.lists(st.integers(0, 2**31 - 1), min_size=bsz * rows * width,
                                     max_size=bsz * rows * width), label="ids")
            lps = data.draw(st.lists(LOGPROBS, min_size=len(ids), max_size=len(ids)), label="logprobs")
            ranks = data.draw(st.lists(st.integers(1, 1000), min_size=bsz * rows, max_size=bsz * rows), label="ranks")
        else:
            ids, lps, ranks = [0] * (bsz * rows * width), [0.0] * (bsz * rows * width), [1] * (bsz * rows)
        self.msg_id += 1
        wire = bytes(self.writer.write(
            msg_id=self.msg_id, keep_running=keep_running, flag=flag, counts=np.array(counts),
            token_ids=np.array(ids, dtype=np.int64).reshape(bsz, rows, width),
            logprobs=np.array(lps, dtype=np.float32).reshape(bsz, rows, width),
            ranks=np.array(ranks, dtype=np.int64).reshape(bsz, rows)))
        self.producer.send(wire)
        carried = self.consumer.receive(timeout=5.0)
        assert carried == wire, f"message {self.msg_id}: the ring delivered other bytes"
        return read_message(carried, capacity=CAP), rproto.packed_decode(carried, capacity=RCAP)

    def _both_take(self, msg, decoded):
        self.proc.process(msg)
        self.decoded.append(decoded)

    def _both_refuse(self, msg, decoded):
        with pytest.raises(StreamError):
            self.proc.process(msg)
        with pytest.raises(ValueError):
            rproto.merge_stream([*self.decoded, decoded], self.num_requests)

    def _running(self):
        return [r.status == "running" for r in self.proc.results]

    @rule(data=st.data())
    def target_step(self, data):
        bsz = data.draw(st.integers(1, self.num_requests), label="bsz")
        choices = st.sampled_from([0, 1, 1, 2, 3, PREEMPTED, RECOVERY_STOP])
        counts = [data.draw(choices, label=f"count {i}") if running else 0
                  for i, running in enumerate(self._running()[:bsz])]
        self._both_take(*self._send(data, TARGET_TOKENS, counts))

    @rule(data=st.data())
    def draft_step(self, data):
        with_steps = [len(r.logprobs) > 0 for r in self.proc.results]
        bsz = data.draw(st.integers(1, self.num_requests), label="bsz")
        counts = [data.draw(st.integers(0, CAP.max_draft_tokens), label=f"draft {i}") if has else 0
                  for i, has in enumerate(with_steps[:bsz])]
        self._both_take(*self._send(data, DRAFT_TOKENS, counts))

    @precondition(lambda self: not all(r.status == "running" for r in self.proc.results))
    @rule(data=st.data())
    def tokens_after_a_stop_are_refused(self, data):
        ended = [i for i, running in enumerate(self._running()) if not running]
        slot = data.draw(st.sampled_from(ended), label="ended slot")
        counts = [0] * slot + [data.draw(st.integers(1, CAP.max_draft_tokens), label="count")]
        self._both_refuse(*self._send(data, TARGET_TOKENS, counts))

    @precondition(lambda self: any(len(r.logprobs) == 0 for r in self.proc.results))
    @rule(data=st.data())
    def drafts_before_a_target_step_are_refused(self, data):
        empty = [i for i, r in enumerate(self.proc.results) if len(r.logprobs) == 0]
        slot = data.draw(st.sampled_from(empty), label="slot without steps")
        counts = [0] * slot + [data.draw(st.integers(1, CAP.max_draft_tokens), label="count")]
        self._both_refuse(*self._send(data, DRAFT_TOKENS, counts))

    def teardown(self):
        """The stream ends with a keep_running=False message, which both take; anything after it
        both refuse. The ring is closed whatever happened."""
        try:
            self._both_take(*self._send(None, TARGET_TOKENS, [0] * self.num_requests, keep_running=False))
            self.the_same_results()
            for flag in (TARGET_TOKENS, DRAFT_TOKENS):
                self._both_refuse(*self._send(None, flag, [0]))
        finally:
            self.consumer.close()
            self.producer.close(linger=0.0)

    @invariant()
    def the_same_results(self):
        want = rproto.merge_stream(self.decoded, self.num_requests)
        for i, (got, ref) in enumerate(zip(self.proc.results, want)):
            assert got.tokens == ref["tokens"], f"request {i}: tokens"
            assert got.status == ref["status"], f"request {i}: status"
            assert [(r.token, np.float32(r.logprob).tobytes(), r.rank,
                     tuple((t, np.float32(lp).tobytes()) for t, lp in r.top)) for r in got.logprobs] == \
                [rec for step in ref["steps"] for rec in _records(step)], f"request {i}: logprob records"
            got_drafts = [[(r.token, np.float32(r.logprob).tobytes(), r.rank,
                            tuple((t, np.float32(lp).tobytes()) for t, lp in r.top)) for r in step]
                          for step in got.draft_logprobs]
            assert got_drafts == [[] if d is None else _records(d) for d in ref["drafts"]], f"request {i}: drafts"


OutputStream.TestCase.settings = settings(max_examples=60, stateful_step_count=25, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
test_interleaved_streams_match_the_reference = OutputStream.TestCase
