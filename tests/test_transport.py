"""The shared-memory ring between decoder and output processor (DESIGN invariant 6 across a
process boundary): exact bytes, in order, once; every broken stream is a clear error, in bounded
time.

Producers run in "spawn" children (this process has torch imported, so no fork); their targets
live in tests/support/transport_peers.py.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import threading
import time

import pytest

from specverify.protocol.transport import (
    DIE_EXIT_CODE,
    DuplicateMessage,
    LostMessage,
    ProducerAborted,
    ProducerDied,
    RingConsumer,
    RingProducer,
    RingSpec,
    TornMessage,
    TransportError,
    TransportTimeout,
    discard_ring,
)
from tests.support import transport_peers
from tests.support.transport_peers import make_messages

STARTUP_S = 20.0      # a cold spawn child on a loaded 2-core machine
DEATH_BOUND_S = 3.0   # a dead producer must be reported within this


@contextlib.contextmanager
def producer_process(**kwargs):
    """Start `transport_peers.produce(**kwargs)` in a spawn child; yield (process, ring name).

    On exit the child is joined (killed if still running) and a ring it left behind is unlinked.
    """
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=transport_peers.produce, args=(sender,), kwargs=kwargs, daemon=True)
    proc.start()
    sender.close()
    name = None
    try:
        assert receiver.poll(STARTUP_S), f"producer child gave no ring name in {STARTUP_S} s"
        name = receiver.recv()
        yield proc, name
    finally:
        receiver.close()
        proc.join(5.0)
        if proc.is_alive():
            proc.kill()
            proc.join(5.0)
        if name is not None:
            discard_ring(name)


def test_round_trip_exact_bytes_in_order_through_a_wrapping_ring():
    count, slots, max_bytes, seed = 300, 4, 2000, 1234        # 300 messages wrap 4 slots 75 times
    expected = make_messages(seed, count, max_bytes)
    peer = producer_process(slots=slots, max_bytes=max_bytes, count=count, seed=seed)
    with peer as (proc, name), RingConsumer.attach(name) as consumer:
        assert consumer.producer_pid == proc.pid
        received = [consumer.receive(timeout=10.0) for _ in range(count)]
        assert consumer.receive(timeout=10.0) is None
    assert len(received) == len(expected)
    for i, (got, want) in enumerate(zip(received, expected)):
        assert got == want, f"message {i}: {len(got)} bytes received, {len(want)} sent, seed {seed}"
    assert proc.exitcode == 0


def test_clean_close_ends_stream_with_none():
    expected = make_messages(7, 3, 64)
    with producer_process(slots=4, max_bytes=64, count=3, seed=7) as (proc, name):
        with RingConsumer.attach(name) as consumer:
            assert [consumer.receive(timeout=10.0) for _ in range(3)] == expected
            assert consumer.receive(timeout=10.0) is None
            assert consumer.receive(timeout=0.0) is None      # stays ended
    assert proc.exitcode == 0
    assert not discard_ring(name)                             # the producer unlinked its ring


@pytest.mark.parametrize("fault, error, words", [
    ("skip_sequence", LostMessage, r"message seq 3 is lost; the slot carries seq 4"),
    ("repeat_sequence", DuplicateMessage, r"carries seq 2, 1 behind"),
    ("tear", TornMessage, r"begin marker says seq 3, end marker says seq 0"),
    ("corrupt", TornMessage, r"checksum"),
])
def test_broken_message_raises_its_error(fault, error, words):
    expected = make_messages(5, 4, 256)
    with producer_process(slots=4, max_bytes=256, count=4, seed=5, faults={2: fault}) as (_, name):
        with RingConsumer.attach(name) as consumer:
            assert [consumer.receive(timeout=10.0) for _ in range(2)] == expected[:2]
            with pytest.raises(error, match=words) as info:
                consumer.receive(timeout=10.0)
    assert type(info.value) is error


def test_producer_dying_mid_write_raises_producer_died():
    expected = make_messages(11, 6, 512)
    with producer_process(slots=4, max_bytes=512, count=6, seed=11,
                          faults={3: "die_mid_write"}) as (proc, name):
        with RingConsumer.attach(name) as consumer:
            assert [consumer.receive(timeout=10.0) for _ in range(3)] == expected[:3]
            start = time.monotonic()
            with pytest.raises(ProducerDied, match=r"seq 4 .*died mid-write"):
                consumer.receive(timeout=30.0)
            assert time.monotonic() - start < DEATH_BOUND_S
    assert proc.exitcode == DIE_EXIT_CODE


def test_producer_killed_while_consumer_waits_raises_producer_died():
    expected = make_messages(13, 2, 128)
    with producer_process(slots=4, max_bytes=128, count=2, seed=13, close=False,
                          hold_s=60.0) as (proc, name):
        with RingConsumer.attach(name) as consumer:
            assert [consumer.receive(timeout=10.0) for _ in range(2)] == expected
            killer = threading.Timer(0.3, proc.kill)
            start = time.monotonic()
            killer.start()
            try:
                with pytest.raises(ProducerDied, match=r"seq 3 .*no write of that message"):
                    consumer.receive(timeout=30.0)
            finally:
                killer.cancel()
            assert time.monotonic() - start < DEATH_BOUND_S


def test_oversize_message_rejected_at_send_naming_the_bound():
    with RingProducer.create(RingSpec(2, 64)) as producer, RingConsumer.attach(
            producer.name) as consumer:
        with pytest.raises(ValueError, match=r"65 bytes exceeds max_message_bytes=64"):
            producer.send(bytes(65))
        producer.send(bytes(range(64)))                       # exactly the bound is fine
        assert consumer.receive(timeout=1.0) == bytes(range(64))


def test_overrun_slot_reads_as_lost():
    with RingProducer.create(RingSpec(2, 16)) as producer, RingConsumer.attach(
            producer.name) as consumer:
        producer.send(b"a")
        producer.send(b"b")
        producer.send(b"c", _fault="overrun")                 # overwrites unread seq 1
        with pytest.raises(LostMessage, match=r"message seq 1 is lost; the slot carries seq 3"):
            consumer.receive(timeout=1.0)


def test_overwrite_during_copy_is_torn():
    with RingProducer.create(RingSpec(1, 16)) as producer, RingConsumer.attach(
            producer.name) as consumer:
        producer.send(b"first")
        consumer._after_copy = lambda: producer.send(b"second", _fault="overrun")
        with pytest.raises(TornMessage, match=r"overwritten while being read"):
            consumer.receive(timeout=1.0)


def test_receive_timeout_names_the_wait():
    with RingProducer.create(RingSpec(2, 16)) as producer, RingConsumer.attach(
            producer.name) as consumer:
        start = time.monotonic()
        with pytest.raises(TransportTimeout, match=r"receive waited 0.2 s for message seq 1 .*"
                                                   r"producer pid \d+ is alive") as info:
            consumer.receive(timeout=0.2)
        assert 0.2 <= time.monotonic() - start < 2.0
        assert isinstance(info.value, TimeoutError)


def test_send_timeout_names_the_wait_when_ring_is_full():
    with RingProducer.create(RingSpec(2, 16)) as producer, RingConsumer.attach(producer.name):
        producer.send(b"1")
        producer.send(b"2")
        with pytest.raises(TransportTimeout, match=r"send waited 0.1 s for a free slot .*all 2 "
                                                   r"slots hold unread messages; consumer pid"):
            producer.send(b"3", timeout=0.1)


def test_exception_in_producer_context_aborts_the_stream():
    with pytest.raises(RuntimeError, match="decoder failed"):
        with RingProducer.create(RingSpec(2, 16)) as producer:
            consumer = RingConsumer.attach(producer.name)
            producer.send(b"partial")
            raise RuntimeError("decoder failed")
    with consumer:
        assert consumer.receive(timeout=1.0) == b"partial"     # published data still drains
        with pytest.raises(ProducerAborted, match=r"aborted the stream after 1 message"):
            consumer.receive(timeout=1.0)


def test_consumer_does_not_unlink_and_producer_does():
    producer = RingProducer.create(RingSpec(2, 16))
    RingConsumer.attach(producer.name).close()
    with RingConsumer.attach(producer.name) as again:         # still there after a consumer left
        producer.send(b"x")
        assert again.receive(timeout=1.0) == b"x"
        producer.close()
        assert again.receive(timeout=1.0) is None             # mapping outlives the unlink
    with pytest.raises(FileNotFoundError):
        RingConsumer.attach(producer.name)
    with pytest.raises(TransportError, match="closed; cannot send"):
        producer.send(b"late")


def test_attach_rejects_a_segment_that_is_not_a_ring():
    producer = RingProducer.create(RingSpec(2, 16))
    try:
        producer._words[0] = 0                                # wipe the magic word
        with pytest.raises(TransportError, match=r"is not a specverify ring: magic 0x0+,"):
            RingConsumer.attach(producer.name)
    finally:
        producer.close(linger=0.0)


@pytest.mark.parametrize("slots, max_bytes, error", [(0, 16, ValueError), (2, 0, ValueError),
                                                     (2.0, 16, TypeError), (True, 16, TypeError),
                                                     (2, "16", TypeError)])
def test_ring_spec_rejects_bad_shapes(slots, max_bytes, error):
    with pytest.raises(error, match=r"RingSpec\.\w+ must be a positive int"):
        RingSpec(slots, max_bytes)


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1.0])
def test_non_finite_or_negative_timeouts_are_refused_not_hung(timeout):
    # A NaN deadline never passes: before the check, receive and send (on a full ring) spun forever.
    # SIGALRM turns a regression back into a hang into a failure instead of a stuck run.
    def hung(signum, frame):
        raise AssertionError(f"a wait with timeout={timeout} did not return (the check is gone)")
    old = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, 10.0)
    try:
        _timeouts_are_refused(timeout)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _timeouts_are_refused(timeout):
    with RingProducer.create(RingSpec(1, 16)) as producer, RingConsumer.attach(producer.name) as consumer:
        start = time.monotonic()
        with pytest.raises(ValueError, match=r"timeout must be a finite number of seconds >= 0"):
            consumer.receive(timeout=timeout)
        producer.send(b"x")
        with pytest.raises(ValueError, match=r"timeout must be a finite number of seconds >= 0"):
            producer.send(b"y", timeout=timeout)
        with pytest.raises(TypeError, match=r"timeout must be a number of seconds"):
            consumer.receive(timeout="1")
        with pytest.raises(ValueError, match=r"linger must be a finite number"):
            producer.close(linger=timeout)
        assert time.monotonic() - start < 2.0
        assert consumer.receive(timeout=1.0) == b"x"


def test_second_consumer_in_the_same_process_is_refused():
    with RingProducer.create(RingSpec(2, 16)) as producer:
        first = RingConsumer.attach(producer.name)
        try:
            with pytest.raises(TransportError, match=r"already has a consumer in this process"):
                RingConsumer.attach(producer.name)
            producer.send(b"only-once")
            assert first.receive(timeout=1.0) == b"only-once"
        finally:
            first.close()
        # Once the first consumer is closed, attaching again is allowed (and reads on from there).
        with RingConsumer.attach(producer.name) as again:
            producer.send(b"next")
            assert again.receive(timeout=1.0) == b"next"


def test_a_live_consumer_elsewhere_blocks_attach_and_a_dead_one_frees_the_ring():
    """One ring, one consumer: while a consumer in another process is alive, attaching fails naming
    its pid; once it died (killed while attached), a new consumer attaches and reads on from the
    first message the dead one did not consume."""
    ctx = multiprocessing.get_context("spawn")
    with RingProducer.create(RingSpec(4, 16)) as producer:
        producer.send(b"first")
        producer.send(b"second")
        receiver, sender = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=transport_peers.consume_one_then_wait, args=(sender, producer.name), daemon=True)
        proc.start()
        sender.close()
        try:
            assert receiver.poll(STARTUP_S), f"consumer child received nothing in {STARTUP_S} s"
            assert receiver.recv() == b"first"
            with pytest.raises(TransportError, match=rf"already has a consumer, pid {proc.pid}"):
                RingConsumer.attach(producer.name)
        finally:
            receiver.close()
            proc.kill()
            proc.join(5.0)
        with RingConsumer.attach(producer.name) as again:
            assert again.receive(timeout=1.0) == b"second"


def test_ring_spec_layout_is_aligned():
    spec = RingSpec(3, 530_001)
    assert spec.slot_bytes % 64 == 0
    assert spec.end_offset % 8 == 0 and spec.end_offset >= 32 + spec.max_message_bytes
    assert spec.slot_bytes >= spec.end_offset + 8
    assert spec.total_bytes == 192 + 3 * spec.slot_bytes


@pytest.mark.parametrize("spec", [None, {"slots": 4}, "RingSpec"])
def test_create_refuses_a_spec_that_is_not_a_ring_spec(spec):
    """Found by the first generated-mutant campaign: without this check a dict or None reached
    `_check_room` and failed there with an AttributeError."""
    with pytest.raises(TypeError, match=rf"^spec must be a RingSpec, got {type(spec).__name__}$"):
        RingProducer.create(spec)
