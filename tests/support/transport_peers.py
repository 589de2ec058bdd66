"""Producer processes for tests/test_transport.py, started with the "spawn" start method.

A spawned child imports this module to find its target. Importing `specverify.protocol.transport`
the usual way would run `specverify/__init__.py`, which imports torch (about 2 s per child), so
`transport()` loads `specverify/protocol/transport.py` from its file path when the package is not
imported yet. The test process has the package imported already and gets the package's module,
so its exception classes are the ones the tests catch.
"""

from __future__ import annotations

import importlib.util
import random
import sys
import time
from pathlib import Path

_TRANSPORT_FILE = Path(__file__).resolve().parents[2] / "specverify" / "protocol" / "transport.py"
_STANDALONE_NAME = "_specverify_transport_standalone"


def transport():
    """The transport module, imported without `specverify/__init__.py` unless already paid for."""
    if "specverify" in sys.modules:
        from specverify.protocol import transport as module
        return module
    module = sys.modules.get(_STANDALONE_NAME)
    if module is None:
        spec = importlib.util.spec_from_file_location(_STANDALONE_NAME, _TRANSPORT_FILE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[_STANDALONE_NAME] = module     # dataclasses look the module up while loading
        spec.loader.exec_module(module)
    return module


def make_messages(seed: int, count: int, max_bytes: int) -> list[bytes]:
    """`count` seeded random messages; the first three are the edge lengths 0, 1 and max."""
    rng = random.Random(seed)
    edges = [0, 1, max_bytes]
    return [rng.randbytes(edges[i] if i < len(edges) else rng.randint(0, max_bytes))
            for i in range(count)]


def produce(conn, *, slots: int, max_bytes: int, count: int, seed: int,
            faults: dict[int, str] | None = None, close: bool = True, hold_s: float = 0.0) -> None:
    """Create a ring, send its name through `conn`, send `make_messages(seed, count, max_bytes)`
    (message i with fault `faults.get(i)`), sleep `hold_s` seconds, then close unless told not to.
    """
    t = transport()
    faults = faults or {}
    ring = t.RingProducer.create(t.RingSpec(slots, max_bytes))
    conn.send(ring.name)
    conn.close()
    for i, payload in enumerate(make_messages(seed, count, max_bytes)):
        ring.send(payload, timeout=10.0, _fault=faults.get(i))
    time.sleep(hold_s)
    if close:
        ring.close()


def consume_and_process(conn, name: str, capacity_fields: tuple, num_requests: int) -> None:
    """Consumer child for tests/test_output_processor.py: attach to ring `name` FIRST (standard
    library only, so the attach does not wait for torch to import), report "attached" through
    `conn`, drain the stream, then decode every message and run the output processor here, in this
    process, and send back the per-request results. Importing the decoder package (numpy, torch)
    happens after the stream is drained, so no ring deadline depends on how long that takes (on a
    loaded GPU runner it can exceed the producer's linger)."""
    t = transport()
    payloads = []
    with t.RingConsumer.attach(name) as ring:
        conn.send("attached")
        while (payload := ring.receive(timeout=60.0)) is not None:
            payloads.append(payload)
    from specverify.protocol.message import Capacity, read_message
    from specverify.protocol.output import OutputProcessor

    cap = Capacity(*capacity_fields)
    proc = OutputProcessor(num_requests)
    for payload in payloads:
        proc.process(read_message(payload, capacity=cap))
    conn.send([(r.tokens, [(x.token, x.logprob, x.rank, x.top) for x in r.logprobs]) for r in proc.results])
    conn.close()


def consume_one_then_wait(conn, name: str) -> None:
    """Attach to ring `name`, receive one message, send it back through `conn`, then wait to be
    killed (a consumer that dies holding its attachment)."""
    t = transport()
    ring = t.RingConsumer.attach(name)
    conn.send(ring.receive(timeout=10.0))
    conn.close()
    while True:
        time.sleep(1.0)
