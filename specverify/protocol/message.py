"""The packed speculative logprob message (docs/protocol.md).

One fixed little-endian struct, `meta` then one block per request:

    meta    int32[3 + max_bsz]   [±msg_id, header, bsz, count_0 .. count_{max_bsz-1}]
    block i tokens int32[D, k+1], scores float32[D, k+1], ranks int32[D]   (D = max_draft_tokens)

with `header = message_flag | (max_num_logprobs << 8)`. A message on the wire is the struct cut
after block bsz-1. `MessageWriter` fills one reused buffer, writing only the `width` columns of
the rows in use; `read_message` validates everything it is about to index before it reads, then
gathers exactly those columns.
"""

from __future__ import annotations

import functools
import numbers
import struct
from dataclasses import dataclass

import numpy as np

TARGET_TOKENS = 3        # message_flag: rows of the target model (accepted tokens)
DRAFT_TOKENS = 4         # message_flag: rows of the draft (MTP) model
CHUNKED_PREFILL = 0      # count: the request is still in prefill, nothing to read
RECOVERY_STOP = -3       # count: recovery stop, nothing to read
PREEMPTED = -9           # count: preempted / aborted, nothing to read
SIGNAL_COUNTS = (CHUNKED_PREFILL, RECOVERY_STOP, PREEMPTED)

FLAG_MASK = 0xFF         # header bits 0..7
WIDTH_SHIFT = 8
WIDTH_MASK = 0xFFFF      # header bits 8..23, after the shift
HEADER_BITS = 24         # bits 24..31 must be zero
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# The capacity trailer: four int32 words after the last block, [magic, max_bsz, k, max_draft_tokens].
# Every offset of the struct follows from the capacity, so a receiver built with another capacity
# would read garbage wherever the lengths happen to fit; the trailer makes the mismatch an error.
TRAILER_MAGIC = int.from_bytes(b"SVcp", "little")
TRAILER_BYTES = 16


class MalformedMessage(ValueError):
    """A received message (or header) that breaks the contract of docs/protocol.md."""


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _check_int(name: str, value, lo: int, hi: int, bound: str = "", exc: type = ValueError) -> int:
    """`value` as a Python int in lo..hi, else an error naming `name` and the bound."""
    if not _is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not lo <= value <= hi:
        why = f" ({bound})" if bound else ""
        raise exc(f"{name} must be in {lo}..{hi}{why}, got {value}")
    return int(value)


@dataclass(frozen=True)
class Capacity:
    """The fixed sizes both ends compile in (FastDeploy: MAX_BSZ 512, K 20, MAX_DRAFT_TOKEN_NUM 6)."""

    max_bsz: int = 512
    k: int = 20                  # top-k alternatives a row can carry; a row has k+1 columns
    max_draft_tokens: int = 6    # rows per request

    def __post_init__(self):
        _check_int("max_bsz", self.max_bsz, 1, INT32_MAX)
        # k+1 must fit the 16-bit width field of the header.
        _check_int("k", self.k, 0, WIDTH_MASK - 1, "k+1 must fit the 16-bit width field")
        _check_int("max_draft_tokens", self.max_draft_tokens, 1, INT32_MAX)

    @property
    def max_width(self) -> int:
        """Largest max_num_logprobs: the sampled token plus k alternatives."""
        return self.k + 1

    @property
    def meta_words(self) -> int:
        return 3 + self.max_bsz

    @property
    def meta_bytes(self) -> int:
        return 4 * self.meta_words

    @property
    def block_bytes(self) -> int:
        cells = self.max_draft_tokens * (self.k + 1)
        return 4 * cells + 4 * cells + 4 * self.max_draft_tokens   # tokens, scores, ranks

    def message_bytes(self, bsz: int) -> int:
        """Length on the wire of a message of `bsz` requests: meta, bsz blocks, the capacity trailer."""
        bsz = _check_int("bsz", bsz, 0, self.max_bsz, "max_bsz")
        return self.meta_bytes + bsz * self.block_bytes + TRAILER_BYTES

    @property
    def trailer(self) -> tuple[int, int, int, int]:
        """The four int32 words every message of this capacity ends with."""
        return (TRAILER_MAGIC, self.max_bsz, self.k, self.max_draft_tokens)

    @property
    def max_message_bytes(self) -> int:
        """Size of the longest message: the full struct of max_bsz blocks plus the trailer."""
        return self.message_bytes(self.max_bsz)


DEFAULT_CAPACITY = Capacity()


@functools.lru_cache(maxsize=None)
def _block_dtype(k: int, max_draft_tokens: int) -> np.dtype:
    """One request block as a packed little-endian record."""
    cells = (max_draft_tokens, k + 1)
    return np.dtype([("tokens", "<i4", cells), ("scores", "<f4", cells), ("ranks", "<i4", (max_draft_tokens,))])


# ------------------------------------------------------------------------------------------
# header


def pack_header(message_flag: int, max_num_logprobs: int, *, capacity: Capacity = DEFAULT_CAPACITY) -> int:
    """meta[1] = message_flag | (max_num_logprobs << 8). Refuses a flag that would spill into the
    width bits and a width the receiver could not hold."""
    flag = _check_int("message_flag", message_flag, 0, FLAG_MASK, "the low 8 bits of meta[1]")
    width = _check_int("max_num_logprobs", max_num_logprobs, 1, capacity.max_width,
                       f"top_logprobs + 1, at most k+1 with k={capacity.k}")
    return flag | (width << WIDTH_SHIFT)


def unpack_header(value: int, *, capacity: Capacity = DEFAULT_CAPACITY) -> tuple[int, int]:
    """(message_flag, max_num_logprobs) of a packed header; MalformedMessage when it is not one."""
    if not _is_int(value):
        raise TypeError(f"header must be an int, got {type(value).__name__}")
    value = int(value)
    if value < 0:
        raise MalformedMessage(f"header meta[1] = {value} is negative; a packed header is "
                               f"message_flag | max_num_logprobs << 8, in 0..{2**HEADER_BITS - 1}")
    if value >> HEADER_BITS:
        raise MalformedMessage(f"header meta[1] = {value:#x} has bits above 23 set; bits 24..31 must be zero "
                               f"(header at most {2**HEADER_BITS - 1:#x})")
    flag = value & FLAG_MASK
    width = (value >> WIDTH_SHIFT) & WIDTH_MASK
    if width == 0:
        raise MalformedMessage(f"header meta[1] = {value} carries max_num_logprobs 0: a legacy header "
                               f"(message_flag {flag} alone, no width); the packed layout needs "
                               f"message_flag | max_num_logprobs << 8 with max_num_logprobs in "
                               f"1..{capacity.max_width}")
    if width > capacity.max_width:
        raise MalformedMessage(f"header meta[1] = {value:#x} carries max_num_logprobs {width}, above "
                               f"k+1 = {capacity.max_width} (k={capacity.k})")
    return flag, width


# ------------------------------------------------------------------------------------------
# the decoded message


@dataclass
class Message:
    """A received message. Requests whose count is <= 0 have empty row lists."""

    msg_id: int
    keep_running: bool
    flag: int
    width: int                          # max_num_logprobs = top_logprobs + 1
    bsz: int
    counts: list[int]                   # [bsz]
    token_ids: list[list[list[int]]]    # [bsz][count][width]; column 0 = sampled token
    logprobs: list[list[list[float]]]   # [bsz][count][width]
    ranks: list[list[int]]              # [bsz][count]; rank of the sampled token

    @property
    def top_logprobs(self) -> int:
        return self.width - 1


def _rows_in_use(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Index pairs (request, row) of every row in use, requests in order, and rows per request.
    counts [bsz] -> req [total], row [total], n [bsz]."""
    n = np.maximum(counts, 0).astype(np.intp)
    req = np.repeat(np.arange(n.size), n)
    starts = np.cumsum(n) - n
    row = np.arange(req.size) - np.repeat(starts, n)
    return req, row, n


def _bad_count(counts: np.ndarray, max_draft_tokens: int) -> int | None:
    """Index of the first count outside {0, -3, -9} ∪ [1, max_draft_tokens], or None."""
    ok = ((counts >= 1) & (counts <= max_draft_tokens)) | np.isin(counts, SIGNAL_COUNTS)
    return None if ok.all() else int(np.argmin(ok))


COUNT_RULE = "0 (chunked prefill), -3 (recovery stop), -9 (preempted) or 1..max_draft_tokens"


# ------------------------------------------------------------------------------------------
# sender


def _as_array(name: str, x, *, dtype: str, ndim: int, shape_doc: str) -> np.ndarray:
    """Host numpy view of `x` (torch tensors copied with .cpu().numpy()), dtype and rank checked."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu()
        try:
            x = x.numpy()
        except TypeError as e:
            raise ValueError(f"{name}: tensor dtype {x.dtype} has no numpy equivalent ({e})") from None
    x = np.asarray(x)
    if dtype == "int" and x.dtype.kind not in "iu":
        raise ValueError(f"{name} must be an integer array, got dtype {x.dtype}")
    if dtype == "float32" and x.dtype != np.float32:
        raise ValueError(f"{name} must be float32 (the wire type; convert explicitly), got dtype {x.dtype}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must be {shape_doc}, got shape {tuple(x.shape)}")
    return x


def _check_int32(name: str, values: np.ndarray) -> None:
    if values.size and (values.min() < INT32_MIN or values.max() > INT32_MAX):
        raise ValueError(f"{name} must fit int32 ({INT32_MIN}..{INT32_MAX}), "
                         f"got values in {values.min()}..{values.max()}")


class MessageWriter:
    """The sender: one preallocated struct reused for every message.

    `write` returns a read-only view of the buffer cut to the message; it is valid until the next
    `write` (take `bytes(...)` to keep it). Columns and rows a message does not use keep whatever
    an earlier message left there, as in the original's static buffer; the receiver never reads them.
    """

    def __init__(self, capacity: Capacity = DEFAULT_CAPACITY):
        if not isinstance(capacity, Capacity):
            raise TypeError(f"capacity must be a Capacity, got {type(capacity).__name__}")
        self.capacity = capacity
        self._buf = bytearray(capacity.max_message_bytes)
        self._meta = np.frombuffer(self._buf, dtype="<i4", count=capacity.meta_words)   # [3 + max_bsz]
        blocks = np.frombuffer(self._buf, dtype=_block_dtype(capacity.k, capacity.max_draft_tokens),
                               count=capacity.max_bsz, offset=capacity.meta_bytes)
        self._tokens = blocks["tokens"]   # [max_bsz, D, k+1]
        self._scores = blocks["scores"]   # [max_bsz, D, k+1]
        self._ranks = blocks["ranks"]     # [max_bsz, D]

    def write(self, *, msg_id: int, keep_running: bool, flag: int, counts, token_ids, logprobs,
              ranks) -> memoryview:
        """Pack one message. counts [bsz] int; token_ids [bsz, rows, width] int;
        logprobs [bsz, rows, width] float32; ranks [bsz, rows] int; rows <= max_draft_tokens,
        width = max_num_logprobs in 1..k+1. Only the first count_i rows of request i are sent."""
        cap = self.capacity
        msg_id = _check_int("msg_id", msg_id, 1, INT32_MAX)
        if not isinstance(keep_running, (bool, np.bool_)):
            raise TypeError(f"keep_running must be a bool, got {type(keep_running).__name__}")
        counts = _as_array("counts", counts, dtype="int", ndim=1, shape_doc="[bsz]")
        token_ids = _as_array("token_ids", token_ids, dtype="int", ndim=3, shape_doc="[bsz, rows, width]")
        logprobs = _as_array("logprobs", logprobs, dtype="float32", ndim=3, shape_doc="[bsz, rows, width]")
        ranks = _as_array("ranks", ranks, dtype="int", ndim=2, shape_doc="[bsz, rows]")

        bsz = counts.shape[0]
        if bsz > cap.max_bsz:
            raise ValueError(f"bsz = len(counts) = {bsz} exceeds max_bsz {cap.max_bsz}")
        if token_ids.shape[0] != bsz:
            raise ValueError(f"token_ids has {token_ids.shape[0]} requests, counts has bsz {bsz}")
        _, rows, width = token_ids.shape
        if rows > cap.max_draft_tokens:
            raise ValueError(f"token_ids has {rows} rows per request, above max_draft_tokens {cap.max_draft_tokens}")
        if not 1 <= width <= cap.max_width:
            raise ValueError(f"max_num_logprobs = token_ids.shape[2] must be in 1..{cap.max_width} "
                             f"(top_logprobs + 1, at most k+1 with k={cap.k}), got {width}")
        header = pack_header(flag, width, capacity=cap)   # checks the flag
        if logprobs.shape != token_ids.shape:
            raise ValueError(f"logprobs shape {tuple(logprobs.shape)} != token_ids shape {tuple(token_ids.shape)}")
        if ranks.shape != (bsz, rows):
            raise ValueError(f"ranks must be [bsz, rows] = {(bsz, rows)}, got {tuple(ranks.shape)}")
        bad = _bad_count(counts, cap.max_draft_tokens)
        if bad is not None:
            raise ValueError(f"counts[{bad}] = {counts[bad]}; a count is {COUNT_RULE} {cap.max_draft_tokens}")
        if bsz and counts.max() > rows:
            bad = int(np.argmax(counts > rows))
            raise ValueError(f"counts[{bad}] = {counts[bad]} exceeds the {rows} rows given per request")

        req, row, _ = _rows_in_use(counts)
        tok = token_ids[req, row]   # [total, width]
        rnk = ranks[req, row]       # [total]
        _check_int32("token_ids", tok)
        _check_int32("ranks", rnk)

        meta = self._meta
        meta[0] = msg_id if keep_running else -msg_id
        meta[1] = header
        meta[2] = bsz
        meta[3:3 + bsz] = counts
        meta[3 + bsz:] = 0          # ignored by the receiver; zeroed so the meta is deterministic
        self._tokens[req, row, :width] = tok
        self._scores[req, row, :width] = logprobs[req, row]
        self._ranks[req, row] = rnk
        end = cap.message_bytes(bsz)
        struct.pack_into("<4i", self._buf, end - TRAILER_BYTES, *cap.trailer)
        return memoryview(self._buf)[:end].toreadonly()


# ------------------------------------------------------------------------------------------
# receiver


def _capacity_mismatch(tail, cap: Capacity) -> str:
    return (f"capacity mismatch: the sender's trailer says max_bsz={tail[1]}, k={tail[2]}, "
            f"max_draft_tokens={tail[3]}; this receiver has max_bsz={cap.max_bsz}, k={cap.k}, "
            f"max_draft_tokens={cap.max_draft_tokens} (both ends must use the same Capacity)")


def read_message(buf, *, capacity: Capacity = DEFAULT_CAPACITY) -> Message:
    """Decode one wire message. Everything indexed is validated first: a bad message raises
    MalformedMessage (a ValueError) naming the field and its bound, never an IndexError."""
    cap = capacity
    if not isinstance(cap, Capacity):
        raise TypeError(f"capacity must be a Capacity, got {type(cap).__name__}")
    try:
        view = memoryview(buf)
    except (TypeError, ValueError):
        raise TypeError(f"buf must be bytes-like, got {type(buf).__name__}") from None
    if not view.c_contiguous:
        buf = view.tobytes()          # a strided view: its bytes in logical order
        view = memoryview(buf)
    size = view.nbytes
    if size >= TRAILER_BYTES:
        # A trailer of another capacity at the end: say so before anything is read with ours.
        tail = struct.unpack_from("<4i", view.cast("B"), size - TRAILER_BYTES)
        if tail[0] == TRAILER_MAGIC and tail != cap.trailer:
            raise MalformedMessage(_capacity_mismatch(tail, cap))
    if size < cap.meta_bytes:
        raise MalformedMessage(f"message is {size} bytes, shorter than its meta: int32[3 + max_bsz] = "
                               f"{cap.meta_bytes} bytes (max_bsz {cap.max_bsz})")
    if size > cap.max_message_bytes:
        raise MalformedMessage(f"message is {size} bytes, longer than the full struct of {cap.max_message_bytes} "
                               f"bytes (capacity {cap}): sender and receiver capacities differ")
    meta = np.frombuffer(buf, dtype="<i4", count=cap.meta_words)   # [3 + max_bsz]

    signed_id = int(meta[0])
    if signed_id == 0 or signed_id == INT32_MIN:
        raise MalformedMessage(f"meta[0] = {signed_id}: ±msg_id needs msg_id in 1..{INT32_MAX} "
                               f"(sign = keep_running)")
    flag, width = unpack_header(int(meta[1]), capacity=cap)
    bsz = int(meta[2])
    if not 0 <= bsz <= cap.max_bsz:
        raise MalformedMessage(f"bsz meta[2] = {bsz} outside 0..max_bsz {cap.max_bsz}")
    counts = meta[3:3 + bsz]       # [bsz]
    bad = _bad_count(counts, cap.max_draft_tokens)
    if bad is not None:
        raise MalformedMessage(f"count of request {bad} (meta[{3 + bad}]) is {counts[bad]}; a count is "
                               f"{COUNT_RULE} {cap.max_draft_tokens}")
    need = cap.message_bytes(bsz)
    if size < need:
        raise MalformedMessage(f"message truncated: bsz {bsz} needs {need} bytes (meta {cap.meta_bytes} + "
                               f"{bsz} blocks of {cap.block_bytes} + trailer {TRAILER_BYTES}), got {size}")
    if size > need:
        raise MalformedMessage(f"message is {size} bytes, longer than a message of bsz {bsz}: exactly {need} "
                               f"bytes (meta {cap.meta_bytes} + {bsz} blocks of {cap.block_bytes} + trailer "
                               f"{TRAILER_BYTES}); trailing bytes are not accepted")
    # The length is exact, so the trailer is the buffer's last 16 bytes: a foreign capacity there
    # was refused above; what is left to check is that there is one at all.
    magic = struct.unpack_from("<i", view.cast("B"), need - TRAILER_BYTES)[0]
    if magic != TRAILER_MAGIC:
        raise MalformedMessage(f"message has no capacity trailer: the last {TRAILER_BYTES} bytes start with "
                               f"{magic:#010x}, expected {TRAILER_MAGIC:#010x} (a sender that predates the trailer)")

    req, row, n = _rows_in_use(counts)
    if req.size:
        blocks = np.frombuffer(buf, dtype=_block_dtype(cap.k, cap.max_draft_tokens), count=bsz,
                               offset=cap.meta_bytes)
        tok = blocks["tokens"][req, row, :width].tolist()     # [total][width]
        lps = blocks["scores"][req, row, :width].tolist()     # [total][width]
        rnk = blocks["ranks"][req, row].tolist()              # [total]
    else:
        tok, lps, rnk = [], [], []

    token_ids, logprobs, ranks = [], [], []
    start = 0
    for c in n.tolist():
        token_ids.append(tok[start:start + c])
        logprobs.append(lps[start:start + c])
        ranks.append(rnk[start:start + c])
        start += c
    return Message(msg_id=abs(signed_id), keep_running=signed_id > 0, flag=flag, width=width, bsz=bsz,
                   counts=counts.tolist(), token_ids=token_ids, logprobs=logprobs, ranks=ranks)
