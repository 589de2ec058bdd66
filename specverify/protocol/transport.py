"""A cross-process transport for packed messages: one producer, one consumer, a shared-memory ring.

The producer (the decoder) sends opaque byte strings of at most `max_message_bytes`; the consumer
(the output processor, another process) receives exactly those bytes, once each, in order. Every
way the stream can break surfaces as a `TransportError` subclass with a message that says what was
expected and what was found; nothing here waits without a timeout.

Layout of the segment. Every field is one native unsigned 64-bit word (little-endian on x86),
read and written whole through a `memoryview.cast("Q")`, so a field is one load or one store.

    ring header, 192 bytes, word index: field
        0  magic               b"SVRING01"; written last by `create`, checked by `attach`
        1  version             1
        2  slots
        3  slot_bytes          size of one slot, a multiple of 64
        4  max_message_bytes
        5  producer_pid
        6  consumer_pid        0 until a consumer attaches
        7  state               0 open, 1 closed (clean end of stream), 2 aborted
        8  write_seq           slots published by the producer     (own cache line)
        16 read_seq            slots consumed by the consumer      (own cache line)
    then `slots` slots of `slot_bytes`; the p-th published message (p from 0) is in slot p % slots:
        word 0                 begin marker: the message's sequence number, written FIRST
        word 1                 length of the payload in bytes
        word 2                 zlib.crc32 of the payload
        word 3                 reserved, 0
        bytes 32 ..            payload, capacity round8(max_message_bytes)
        word at 32 + round8(max_message_bytes)
                               end marker: the sequence number again, written LAST

Sequence numbers start at 1: the p-th published message carries p + 1. Position (which slot)
and identity (which sequence number) are kept apart on purpose, so a producer that skips or
repeats a number, or a slot overwritten before it was read, shows up as a mismatch.

Protocol. `send` waits (with a timeout) until write_seq - read_seq < slots, then writes begin,
payload, length, crc, end, and only then increments write_seq. `receive` reads state, then
write_seq; when a slot is published it reads end then begin (they must agree), copies the payload,
re-reads begin and end (seqlock: a concurrent overwrite changes begin before any payload byte),
checks the crc and the sequence number, and only then increments read_seq.

Faults and how the consumer sees them:
    LostMessage        the slot carries a sequence number ahead of the expected one
    DuplicateMessage   the slot carries a sequence number behind the expected one
    TornMessage        begin and end markers disagree in a published slot, the markers moved
                       while the payload was copied, the length is out of range, or the crc
                       does not match the payload
    ProducerDied       nothing more is published, the stream is not closed, and the producer
                       process no longer exists (a zombie counts as dead); the message says
                       whether it died mid-write
    ProducerAborted    the producer left its context manager with an exception (or called
                       `abort`): a failed stream is never mistaken for a clean end
    TransportTimeout   a wait ran out of time; the message names the wait

What the machine refuses surfaces as `RingUnavailable` (a TransportError and an OSError): its
subclasses `RingNotFound` (attach to a name no segment has: never created, or already closed) and
`RingExists` (create with a name that is taken); a permission error, or a ring larger than the
free room of /dev/shm, is a plain `RingUnavailable`. A malformed name is a ValueError naming `name`.

Memory ordering: CPython performs these stores and loads in program order and x86 keeps stores
in order and loads in order (TSO), which is all the protocol needs. Weakly ordered CPUs (ARM)
would need fences that Python cannot express; the seqlock re-check and the crc still catch a
torn read there, but a false `TornMessage` becomes possible.

Lifetime: the producer owns the segment. `close` marks the stream finished, waits (up to
`linger` seconds) for a consumer to have attached, then unlinks the name; an attached consumer
keeps its mapping and drains what is left. The consumer never unlinks. A producer that dies
leaves the segment behind; whoever supervises it calls `discard_ring(name)`. Neither side leaves
a registration with multiprocessing's resource tracker (the producer and consumer of one ring
often share one tracker, where one side's unregister would cancel the other's), so no
resource-tracker warnings are printed at exit.

The only imports are from the standard library (no torch), so a spawned child can load this
file quickly.
"""

from __future__ import annotations

import math
import numbers
import os
import struct
import sys
import time
import zlib
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

__all__ = [
    "RingSpec",
    "RingProducer",
    "RingConsumer",
    "discard_ring",
    "TransportError",
    "LostMessage",
    "DuplicateMessage",
    "TornMessage",
    "ProducerDied",
    "ProducerAborted",
    "TransportTimeout",
    "RingUnavailable",
    "RingNotFound",
    "RingExists",
]

MAGIC = int.from_bytes(b"SVRING01", "little")
VERSION = 1
HEADER_BYTES = 192
SLOT_HEADER_BYTES = 32

# ring header words
_MAGIC, _VERSION, _SLOTS, _SLOT_BYTES, _MAX_BYTES, _PRODUCER, _CONSUMER, _STATE = range(8)
_WRITE_SEQ = 8
_READ_SEQ = 16
# slot header words, relative to the slot's first word
_BEGIN, _LENGTH, _CRC = 0, 1, 2

OPEN, CLOSED, ABORTED = 0, 1, 2

# Test-only faults for `RingProducer.send(..., _fault=...)`; see its docstring.
FAULTS = ("skip_sequence", "repeat_sequence", "tear", "corrupt", "die_mid_write", "overrun")
DIE_EXIT_CODE = 71          # exit status of a producer killed by the "die_mid_write" fault

_ATTACHED: set[str] = set()  # names of the rings a consumer of this process is attached to
_LIVENESS_PERIOD_S = 0.01   # how often a waiting side checks that its peer still exists


class TransportError(Exception):
    """Base of every error the ring raises. After one, the stream cannot be trusted."""


class LostMessage(TransportError):
    """The next slot carries a sequence number ahead of the expected one."""


class DuplicateMessage(TransportError):
    """The next slot carries a sequence number behind the expected one."""


class TornMessage(TransportError):
    """A published slot whose markers, length or checksum disagree: an incomplete write."""


class ProducerDied(TransportError):
    """The producer process exited without closing the stream while the consumer waited."""


class ProducerAborted(TransportError):
    """The producer ended the stream as failed (an exception left its context manager)."""


class TransportTimeout(TransportError, TimeoutError):
    """A wait for a message or for a free slot ran out of time."""


class RingUnavailable(TransportError, OSError):
    """The machine refuses the ring's shared-memory segment: missing, taken, not permitted, or no
    room for it. Also an OSError, for callers that catch what the environment lacks."""


class RingNotFound(RingUnavailable, FileNotFoundError):
    """No segment has this ring name: never created, or its producer closed (unlinked) it."""


class RingExists(RingUnavailable, FileExistsError):
    """`create` with a ring name that another segment already has."""


def _is_int(x) -> bool:
    """Python ints and numpy integers; never a bool (an int is an int, not a bool or a float)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool) and type(x).__name__ != "bool_"


def _check_seconds(name: str, value) -> float:
    """A wait limit: a finite real number >= 0 (TypeError for a non-number, ValueError for NaN,
    an infinity or a negative value: a NaN deadline never passes, so the wait would hang)."""
    if isinstance(value, bool) or type(value).__name__ == "bool_" or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds (int or float), got {type(value).__name__} {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return value


NAME_MAX = 255              # bytes of a name in /dev/shm (Linux NAME_MAX), after the leading '/'
SHM_DIR = "/dev/shm"        # where POSIX shared memory lives on Linux (its free room bounds a ring)


def _check_name(name, *, none_ok: bool = False) -> str | None:
    """A ring name: printable ASCII, 1 to NAME_MAX characters after any leading '/', no other '/'.
    TypeError for a non-string, ValueError naming `name` and the bound otherwise (the OS would
    answer a bare OSError, or silently cut the name at a NUL)."""
    if name is None and none_ok:
        return None
    if not isinstance(name, str):
        what = "None (a free name is picked) or a str" if none_ok else "a str (the producer's .name)"
        raise TypeError(f"name must be {what}, got {type(name).__name__} {name!r}")
    bare = name.lstrip("/")
    if not bare:
        raise ValueError(f"name must be a non-empty ring name (the producer's .name), got {name!r}")
    bad = sorted({c for c in bare if c == "/" or not " " <= c <= "~"})
    if bad:
        raise ValueError(f"name must be printable ASCII without '/' after the leading one (a file name in "
                         f"{SHM_DIR}), got {name!r} with {''.join(bad)!r}")
    if len(bare) > NAME_MAX:
        raise ValueError(f"name must be at most {NAME_MAX} characters after the leading '/' (NAME_MAX of "
                         f"{SHM_DIR}), got {len(bare)}")
    return name


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class RingSpec:
    """Shape of a ring: `slots` messages in flight, each at most `max_message_bytes`."""

    slots: int
    max_message_bytes: int

    def __post_init__(self):
        for field in ("slots", "max_message_bytes"):
            value = getattr(self, field)
            if not _is_int(value):
                raise TypeError(f"RingSpec.{field} must be a positive int, got {type(value).__name__} {value!r}")
            if value < 1:
                raise ValueError(f"RingSpec.{field} must be a positive int (>= 1), got {value!r}")
            object.__setattr__(self, field, int(value))

    @property
    def end_offset(self) -> int:
        """Byte offset of the end marker inside a slot."""
        return SLOT_HEADER_BYTES + _round_up(self.max_message_bytes, 8)

    @property
    def slot_bytes(self) -> int:
        return _round_up(self.end_offset + 8, 64)

    @property
    def total_bytes(self) -> int:
        return HEADER_BYTES + self.slots * self.slot_bytes


def _open_shm(name: str | None, *, create: bool, size: int = 0) -> SharedMemory:
    """Create or attach a segment that the resource tracker does not follow. What the OS refuses
    is a RingUnavailable naming the ring (never a bare OSError)."""
    segment = f"{SHM_DIR}/{name.lstrip('/')}" if name else f"{SHM_DIR}/psm_* (name=None)"
    try:
        if sys.version_info >= (3, 13):
            return SharedMemory(name, create=create, size=size, track=False)
        shm = SharedMemory(name, create=create, size=size)
    except FileNotFoundError:
        raise RingNotFound(f"ring name {name!r}: no such ring (no segment {segment}); it was never created, "
                           f"or its producer closed it (close unlinks the name)") from None
    except FileExistsError:
        raise RingExists(f"ring name {name!r} is taken: the segment {segment} exists; pass name=None for a "
                         f"free one, or discard_ring(name) if a dead producer left it") from None
    except PermissionError:
        raise RingUnavailable(f"ring name {name!r}: permission denied on the segment {segment} (it belongs "
                              f"to another user)") from None
    except OSError as e:
        raise RingUnavailable(f"ring name {name!r}: the OS refused the segment {segment} "
                              f"({e.strerror or e})") from None
    except ValueError as e:                 # attach: mmap of an empty segment, another program's
        if create:
            raise
        raise TransportError(f"shared memory {name!r} is not a specverify ring ({e})") from None
    resource_tracker.unregister(shm._name, "shared_memory")   # balance the constructor's register
    return shm


def _check_room(spec: RingSpec) -> None:
    """RingUnavailable naming `spec` when the segment would not fit in the free room of SHM_DIR:
    the mapping would succeed (the file is sparse), then a send would die of SIGBUS."""
    limit, where = sys.maxsize, f"a segment holds at most {sys.maxsize} bytes"
    try:
        st = os.statvfs(SHM_DIR)
        if st.f_bavail * st.f_frsize < limit:
            limit = st.f_bavail * st.f_frsize
            where = f"{SHM_DIR} has {limit} bytes free"
    except (OSError, AttributeError):       # no /dev/shm (not Linux): only the address space bounds it
        pass
    if spec.total_bytes > limit:
        raise RingUnavailable(f"spec {spec} needs {spec.total_bytes} bytes of shared memory ({spec.slots} slot(s) "
                              f"of {spec.slot_bytes} bytes and a {HEADER_BYTES}-byte header), but {where}: lower "
                              f"slots or max_message_bytes")


def _unlink(shm: SharedMemory) -> None:
    if sys.version_info < (3, 13):
        resource_tracker.register(shm._name, "shared_memory")  # balance unlink()'s unregister
    shm.unlink()


def discard_ring(name: str) -> bool:
    """Unlink the segment `name` left behind by a producer that died; False if it is gone."""
    _check_name(name)
    try:
        shm = _open_shm(name, create=False)
    except RingNotFound:
        return False
    shm.close()
    _unlink(shm)
    return True


def _alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (an exited, unreaped child)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass                                # it exists and belongs to someone else
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return not os.path.isdir("/proc/self")  # no /proc at all: os.kill is all we know
    except OSError:
        return True
    state = stat[stat.rfind(b")") + 1:].split()[:1]   # the command name may hold spaces
    return state not in ([b"Z"], [b"X"])


class _Backoff:
    """Polling sleep: 20 us doubling to 2 ms."""

    def __init__(self):
        self.delay = 2e-5

    def sleep(self) -> None:
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, 2e-3)


class _Ring:
    """What producer and consumer share: the mapping, its word view and the slot arithmetic."""

    def __init__(self, shm: SharedMemory, spec: RingSpec):
        self._shm = shm
        self.spec = spec
        self._words = shm.buf[:spec.total_bytes].cast("Q")

    @property
    def name(self) -> str:
        return self._shm.name

    def _slot(self, position: int) -> tuple[int, int, int]:
        """(first word, end-marker word, first payload byte) of the slot for `position`."""
        first_byte = HEADER_BYTES + (position % self.spec.slots) * self.spec.slot_bytes
        return (first_byte // 8, (first_byte + self.spec.end_offset) // 8,
                first_byte + SLOT_HEADER_BYTES)

    def _detach(self) -> None:
        if self._words is not None:
            self._words.release()
            self._words = None
            self._shm.close()

    def __del__(self):
        # Only unmap (a forgotten ring is not unlinked): the word view must go before the
        # mapping, or SharedMemory's own finalizer fails with BufferError.
        if getattr(self, "_words", None) is not None:
            self._detach()

    def _peer(self, role: str, pid: int) -> str:
        if pid == 0:
            return f"no {role} has attached"
        return f"{role} pid {pid} is " + ("alive" if _alive(pid) else "gone")


class RingProducer(_Ring):
    """The sending side. Build with `create`; use as a context manager or call `close`."""

    @classmethod
    def create(cls, spec: RingSpec, *, name: str | None = None) -> RingProducer:
        """Create a ring segment (`name=None` picks a free one; read it back from `.name`)."""
        if not isinstance(spec, RingSpec):
            raise TypeError(f"spec must be a RingSpec, got {type(spec).__name__}")
        _check_name(name, none_ok=True)
        _check_room(spec)
        ring = cls(_open_shm(name, create=True, size=spec.total_bytes), spec)
        words = ring._words
        words[_VERSION] = VERSION
        words[_SLOTS] = spec.slots
        words[_SLOT_BYTES] = spec.slot_bytes
        words[_MAX_BYTES] = spec.max_message_bytes
        words[_PRODUCER] = os.getpid()
        words[_MAGIC] = MAGIC
        return ring

    def __init__(self, shm: SharedMemory, spec: RingSpec):
        super().__init__(shm, spec)
        self._published = 0     # slots published == write_seq
        self._seq = 0           # last sequence number sent
        self._finished = False

    def send(self, payload: bytes, *, timeout: float = 5.0, _fault: str | None = None) -> None:
        """Send one message; waits up to `timeout` seconds while every slot holds unread data.

        `_fault` is for tests only; it breaks this one message on purpose:
            "skip_sequence"    carry the sequence number after the expected one (lost message)
            "repeat_sequence"  carry the previous sequence number again (duplicate)
            "tear"             write the begin marker, length, crc and half the payload but not
                               the end marker, then publish and move on (torn message)
            "corrupt"          store a crc that does not match the payload (torn message)
            "die_mid_write"    write the begin marker and half the payload, then `os._exit`:
                               the calling process dies; use it only in a child process
            "overrun"          do not wait for a free slot (overwrites unread data)
        """
        timeout = _check_seconds("timeout", timeout)
        if self._finished:
            raise TransportError(f"ring {self.name!r} is closed; cannot send")
        try:
            data = memoryview(payload).cast("B")
        except TypeError:
            raise TypeError(f"payload must be bytes-like, got {type(payload).__name__}") from None
        n = data.nbytes
        if n > self.spec.max_message_bytes:
            raise ValueError(f"payload of {n} bytes exceeds max_message_bytes="
                             f"{self.spec.max_message_bytes} of ring {self.name!r}")
        if _fault is not None and _fault not in FAULTS:
            raise ValueError(f"unknown fault {_fault!r}; expected one of {FAULTS}")
        if _fault != "overrun":
            self._wait_for_space(timeout)
        seq = {"skip_sequence": self._seq + 2, "repeat_sequence": self._seq}.get(_fault,
                                                                                self._seq + 1)
        first, end, start = self._slot(self._published)
        words, buf = self._words, self._shm.buf
        words[first + _BEGIN] = seq
        if _fault in ("tear", "die_mid_write"):
            buf[start:start + n // 2] = data[:n // 2]
            if _fault == "die_mid_write":
                os._exit(DIE_EXIT_CODE)
            words[first + _LENGTH] = n
            words[first + _CRC] = zlib.crc32(data)
        else:
            buf[start:start + n] = data
            words[first + _LENGTH] = n
            words[first + _CRC] = zlib.crc32(data) ^ (0xFFFFFFFF if _fault == "corrupt" else 0)
            words[end] = seq
        self._seq = seq
        self._published += 1
        words[_WRITE_SEQ] = self._published

    def _wait_for_space(self, timeout: float) -> None:
        words, slots = self._words, self.spec.slots
        if self._published - words[_READ_SEQ] < slots:
            return
        deadline, backoff = time.monotonic() + timeout, _Backoff()
        while self._published - words[_READ_SEQ] >= slots:
            if time.monotonic() >= deadline:
                raise TransportTimeout(
                    f"send waited {timeout:g} s for a free slot in ring {self.name!r}: all "
                    f"{slots} slots hold unread messages; "
                    f"{self._peer('consumer', words[_CONSUMER])}")
            backoff.sleep()

    def close(self, *, linger: float = 5.0) -> None:
        """End the stream cleanly: the consumer drains what is left, then receives None."""
        self._finish(CLOSED, linger)

    def abort(self, *, linger: float = 5.0) -> None:
        """End the stream as failed: the consumer drains what is left, then gets ProducerAborted."""
        self._finish(ABORTED, linger)

    def _finish(self, state: int, linger: float) -> None:
        linger = _check_seconds("linger", linger)
        if self._finished:
            return
        self._finished = True
        words = self._words
        words[_STATE] = state
        # Unlinking only removes the name: a consumer that has attached keeps reading. Give one
        # that has not attached yet `linger` seconds to do so.
        deadline = time.monotonic() + linger
        while words[_CONSUMER] == 0 and time.monotonic() < deadline:
            time.sleep(1e-3)
        self._detach()
        _unlink(self._shm)

    def __enter__(self) -> RingProducer:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._finish(CLOSED if exc_type is None else ABORTED, 5.0)


class RingConsumer(_Ring):
    """The receiving side. Build with `attach`; use as a context manager or call `close`."""

    @classmethod
    def attach(cls, name: str, *, producer_pid: int | None = None) -> RingConsumer:
        """Attach to the ring `name` after its producer's `create` has returned.

        `producer_pid` overrides the pid the producer recorded; its liveness is what turns a
        wait for a message that will never come into `ProducerDied`."""
        _check_name(name)
        if producer_pid is not None and not _is_int(producer_pid):
            raise TypeError(f"producer_pid must be None or an int, got {type(producer_pid).__name__} {producer_pid!r}")
        if producer_pid is not None and producer_pid < 1:
            raise ValueError(f"producer_pid must be a process id >= 1, got {producer_pid}")
        if name.lstrip("/") in _ATTACHED:
            raise TransportError(f"ring {name!r} already has a consumer in this process (pid {os.getpid()}); "
                                 f"one ring has one consumer: close it before attaching again")
        shm = _open_shm(name, create=False)
        try:
            spec = _read_spec(shm)
            ring = cls(shm, spec, producer_pid)
        except BaseException:
            shm.close()
            raise
        return ring

    def __init__(self, shm: SharedMemory, spec: RingSpec, producer_pid: int | None):
        super().__init__(shm, spec)
        words = self._words
        self.producer_pid = words[_PRODUCER] if producer_pid is None else producer_pid
        current = words[_CONSUMER]
        if current not in (0, os.getpid()) and _alive(current):
            self._detach()
            raise TransportError(f"ring {self.name!r} already has a consumer, pid {current}")
        words[_CONSUMER] = os.getpid()
        _ATTACHED.add(self._key)
        self._registered = True
        self._position = words[_READ_SEQ]     # slots consumed == read_seq
        self._after_copy = None               # test-only hook, called between copy and re-check

    def receive(self, timeout: float = 5.0) -> bytes | None:
        """The next message's exact bytes, or None once the producer has closed and all is read.

        Waits up to `timeout` seconds, checking every 10 ms that the producer still exists."""
        timeout = _check_seconds("timeout", timeout)
        if self._words is None:
            raise TransportError(f"this consumer of ring {self.name!r} is closed; cannot receive")
        words = self._words
        deadline, backoff = time.monotonic() + timeout, _Backoff()
        next_check, producer_gone = 0.0, False
        while True:
            state = words[_STATE]               # state before write_seq: see the close order
            if words[_WRITE_SEQ] > self._position:
                return self._take()
            if state == CLOSED:
                return None
            if state == ABORTED:
                raise ProducerAborted(f"the producer of ring {self.name!r} aborted the stream "
                                      f"after {self._position} message(s)")
            if producer_gone:                   # seen gone before the reads above: final
                raise ProducerDied(self._death_report())
            now = time.monotonic()
            if now >= next_check:
                next_check = now + _LIVENESS_PERIOD_S
                producer_gone = not _alive(self.producer_pid)
                if producer_gone:
                    continue                    # re-read once: it may have published first
            if now >= deadline:
                raise TransportTimeout(
                    f"receive waited {timeout:g} s for message seq {self._position + 1} in ring "
                    f"{self.name!r}; {self._peer('producer', self.producer_pid)} and has "
                    f"published {words[_WRITE_SEQ]} message(s)")
            backoff.sleep()

    def _take(self) -> bytes:
        words, spec = self._words, self.spec
        expected = self._position + 1
        first, end, start = self._slot(self._position)
        where = f"ring {self.name!r} slot {self._position % spec.slots} (message seq {expected})"
        end_seq = words[end]                    # end first: if it is set, the write completed
        begin_seq = words[first + _BEGIN]
        if begin_seq != end_seq:
            raise TornMessage(f"{where} is torn: begin marker says seq {begin_seq}, end marker "
                              f"says seq {end_seq}; the write never completed")
        length, crc = words[first + _LENGTH], words[first + _CRC]
        if length > spec.max_message_bytes:
            raise TornMessage(f"{where} is torn: length {length} exceeds max_message_bytes="
                              f"{spec.max_message_bytes}")
        data = bytes(self._shm.buf[start:start + length])
        if self._after_copy is not None:
            self._after_copy()
        if words[first + _BEGIN] != begin_seq or words[end] != end_seq:
            raise TornMessage(f"{where} was overwritten while being read: markers moved from "
                              f"seq {begin_seq} to begin {words[first + _BEGIN]}, "
                              f"end {words[end]}")
        actual = zlib.crc32(data)
        if actual != crc:
            raise TornMessage(f"{where} is torn: checksum {actual:#010x} of the {length} payload "
                              f"bytes does not match the stored {crc:#010x}")
        if end_seq > expected:
            raise LostMessage(f"{where}: message seq {expected} is lost; the slot carries seq "
                              f"{end_seq}, {end_seq - expected} ahead")
        if end_seq < expected:
            raise DuplicateMessage(f"{where}: the slot carries seq {end_seq}, "
                                   f"{expected - end_seq} behind; a duplicate of a message "
                                   f"already due")
        self._position = expected
        words[_READ_SEQ] = expected
        return data

    def _death_report(self) -> str:
        words = self._words
        expected = self._position + 1
        first, end, _ = self._slot(self._position)
        begin_seq, end_seq = words[first + _BEGIN], words[end]
        if begin_seq != end_seq:
            detail = (f"it died mid-write: slot {self._position % self.spec.slots} has begin "
                      f"marker seq {begin_seq} and end marker seq {end_seq}, an incomplete write")
        else:
            detail = "no write of that message had started"
        return (f"producer pid {self.producer_pid} of ring {self.name!r} exited without closing "
                f"it while the consumer waited for message seq {expected} ({self._position} "
                f"delivered); {detail}")

    @property
    def _key(self) -> str:
        return self._shm.name.lstrip("/")

    def _detach(self) -> None:
        if getattr(self, "_registered", False):
            self._registered = False
            _ATTACHED.discard(self._key)
        super()._detach()

    def close(self) -> None:
        """Release the mapping. The consumer never unlinks the segment."""
        self._detach()

    def __enter__(self) -> RingConsumer:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()


def _read_spec(shm: SharedMemory) -> RingSpec:
    """Validate the ring header of an attached segment and rebuild its spec."""
    if shm.size < HEADER_BYTES:
        raise TransportError(f"shared memory {shm.name!r} of {shm.size} bytes is too small to "
                             f"hold a ring header ({HEADER_BYTES} bytes)")
    magic, version, slots, slot_bytes, max_bytes = struct.unpack_from("@5Q", shm.buf, 0)
    if magic != MAGIC:
        raise TransportError(f"shared memory {shm.name!r} is not a specverify ring: magic "
                             f"{magic:#018x}, expected {MAGIC:#018x} (or its producer has not "
                             f"finished create)")
    if version != VERSION:
        raise TransportError(f"ring {shm.name!r} has layout version {version}; this reader "
                             f"understands version {VERSION}")
    try:
        spec = RingSpec(slots, max_bytes)
    except ValueError as e:
        raise TransportError(f"ring {shm.name!r} has a malformed header: {e}") from None
    if spec.slot_bytes != slot_bytes or shm.size < spec.total_bytes:
        raise TransportError(f"ring {shm.name!r} has a malformed header: slot_bytes {slot_bytes} "
                             f"(expected {spec.slot_bytes}), segment {shm.size} bytes (expected "
                             f">= {spec.total_bytes})")
    return spec
