"""The speculative logprob message read byte by byte (docs/protocol.md), with `struct` and loops.

Two layouts share one struct: meta int32[3 + max_bsz] = [±msg_id, meta[1], bsz, counts...], then
per request i, at meta_size + i * block_size: tokens int32[D*(k+1)], scores float32[D*(k+1)],
ranks int32[D] (D = max_draft_tokens). They differ in meta[1] and in the columns written:

- legacy: meta[1] = message_flag alone; every row has all k+1 columns, the unused ones padded with
  token -1 and score 0.0;
- packed: meta[1] = message_flag + 256 * width; only `width` columns are meaningful; the message
  is cut after block bsz-1 and ends with a 16-byte capacity trailer [magic, max_bsz, k, D].

Plain dicts and lists out; a bad message is a ValueError. Independent of specverify by design.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
NO_ROWS = (0, -3, -9)   # chunked prefill, recovery stop, preempted
# packed layout only: the message ends with int32 [magic, max_bsz, k, max_draft_tokens]
TRAILER_MAGIC = 0x70635653   # the bytes "SVcp" read as a little-endian int32
TRAILER_SIZE = 16


class ProtocolCapacity(NamedTuple):
    max_bsz: int = 512
    k: int = 20
    max_draft_tokens: int = 6


DEFAULT_PROTOCOL_CAPACITY = ProtocolCapacity()


def meta_size(cap: ProtocolCapacity) -> int:
    return 4 * (3 + cap.max_bsz)


def block_size(cap: ProtocolCapacity) -> int:
    per_row = cap.k + 1
    return 4 * cap.max_draft_tokens * per_row * 2 + 4 * cap.max_draft_tokens


def token_offset(cap: ProtocolCapacity, i: int, j: int, c: int) -> int:
    """Byte offset of tokens[j*(k+1) + c] of request i."""
    return meta_size(cap) + i * block_size(cap) + 4 * (j * (cap.k + 1) + c)


def score_offset(cap: ProtocolCapacity, i: int, j: int, c: int) -> int:
    return token_offset(cap, i, j, c) + 4 * cap.max_draft_tokens * (cap.k + 1)


def rank_offset(cap: ProtocolCapacity, i: int, j: int) -> int:
    return meta_size(cap) + i * block_size(cap) + 8 * cap.max_draft_tokens * (cap.k + 1) + 4 * j


# ------------------------------------------------------------------------------------------
# header


def packed_header(flag: int, width: int) -> int:
    """meta[1] of the packed layout: flag in the low byte, width in the 16 bits above it."""
    if flag < 0 or flag > 255:
        raise ValueError(f"flag {flag} does not fit one byte")
    if width < 1 or width > 65535:
        raise ValueError(f"width {width} is not in 1..65535")
    return flag + 256 * width


def split_header(value: int) -> tuple[int, int]:
    """(flag, width) of a packed meta[1]; width 0 is a legacy header (the caller decides)."""
    if value < 0 or value >= 2**24:
        raise ValueError(f"header {value} is not in 0..2**24-1")
    width, flag = divmod(value, 256)
    return flag, width


# ------------------------------------------------------------------------------------------
# reading helpers


def _int(buf, offset: int) -> int:
    return struct.unpack_from("<i", buf, offset)[0]


def _float(buf, offset: int) -> float:
    return struct.unpack_from("<f", buf, offset)[0]


def _read_meta(buf, cap: ProtocolCapacity, trailer: int = 0) -> tuple[int, int, int]:
    """(signed id, meta[1], bsz), after the length and id checks both layouts share."""
    size = len(buf)
    if size < meta_size(cap):
        raise ValueError(f"{size} bytes: shorter than the meta ({meta_size(cap)} bytes)")
    if size > meta_size(cap) + cap.max_bsz * block_size(cap) + trailer:
        raise ValueError(f"{size} bytes: longer than the whole struct")
    signed_id = _int(buf, 0)
    if signed_id == 0 or signed_id == INT32_MIN:
        raise ValueError(f"message id word {signed_id} is not ±(1..2**31-1)")
    header = _int(buf, 4)
    bsz = _int(buf, 8)
    return signed_id, header, bsz


def _read_counts(buf, cap: ProtocolCapacity, bsz: int) -> list[int]:
    if bsz < 0 or bsz > cap.max_bsz:
        raise ValueError(f"bsz {bsz} is not in 0..{cap.max_bsz}")
    counts = []
    for i in range(bsz):
        c = _int(buf, 12 + 4 * i)
        if c not in NO_ROWS and not 1 <= c <= cap.max_draft_tokens:
            raise ValueError(f"request {i} has count {c}")
        counts.append(c)
    if len(buf) < meta_size(cap) + bsz * block_size(cap):
        raise ValueError(f"{len(buf)} bytes: too short for {bsz} requests")
    return counts


def _read_rows(buf, cap: ProtocolCapacity, counts: list[int], width: int) -> tuple[list, list, list]:
    token_ids, logprobs, ranks = [], [], []
    for i, count in enumerate(counts):
        req_tokens, req_scores, req_ranks = [], [], []
        for j in range(max(count, 0)):
            req_tokens.append([_int(buf, token_offset(cap, i, j, c)) for c in range(width)])
            req_scores.append([_float(buf, score_offset(cap, i, j, c)) for c in range(width)])
            req_ranks.append(_int(buf, rank_offset(cap, i, j)))
        token_ids.append(req_tokens)
        logprobs.append(req_scores)
        ranks.append(req_ranks)
    return token_ids, logprobs, ranks


def _as_dict(signed_id, flag, width, counts, token_ids, logprobs, ranks) -> dict:
    return {"msg_id": abs(signed_id), "keep_running": signed_id > 0, "flag": flag, "width": width,
            "bsz": len(counts), "counts": counts, "token_ids": token_ids, "logprobs": logprobs,
            "ranks": ranks}


# ------------------------------------------------------------------------------------------
# the two layouts


def packed_decode(buf, *, capacity: ProtocolCapacity = DEFAULT_PROTOCOL_CAPACITY) -> dict:
    """Decode a packed message: keys msg_id, keep_running, flag, width, bsz, counts, token_ids,
    logprobs, ranks (rows of `width` values, empty for counts <= 0)."""
    buf = bytes(buf)
    if len(buf) >= TRAILER_SIZE:
        tail = struct.unpack_from("<4i", buf, len(buf) - TRAILER_SIZE)
        if tail[0] == TRAILER_MAGIC and tail[1:] != tuple(capacity):
            raise ValueError(f"capacity mismatch: trailer {tail[1:]}, receiver {tuple(capacity)}")
    signed_id, header, bsz = _read_meta(buf, capacity, TRAILER_SIZE)
    flag, width = split_header(header)
    if width == 0:
        raise ValueError(f"header {header} has no width: a legacy header")
    if width > capacity.k + 1:
        raise ValueError(f"width {width} above k+1 = {capacity.k + 1}")
    counts = _read_counts(buf, capacity, bsz)
    need = meta_size(capacity) + bsz * block_size(capacity) + TRAILER_SIZE
    if len(buf) != need:
        raise ValueError(f"{len(buf)} bytes: a packed message of {bsz} requests is exactly {need} bytes")
    if struct.unpack_from("<4i", buf, need - TRAILER_SIZE) != (TRAILER_MAGIC, *capacity):
        raise ValueError(f"the capacity trailer is missing or is not {(TRAILER_MAGIC, *capacity)}")
    token_ids, logprobs, ranks = _read_rows(buf, capacity, counts, width)
    return _as_dict(signed_id, flag, width, counts, token_ids, logprobs, ranks)


def legacy_encode(*, msg_id: int, keep_running: bool, flag: int, counts: list[int], token_ids: list,
                  logprobs: list, ranks: list, capacity: ProtocolCapacity = DEFAULT_PROTOCOL_CAPACITY) -> bytes:
    """The legacy message: meta[1] = flag, every row k+1 columns wide. token_ids[i] / logprobs[i]
    hold counts[i] rows (each up to k+1 values), ranks[i] counts[i] ranks. Columns past a row's
    values, and rows past its count, hold token -1, score 0.0, rank 0."""
    cap = capacity
    bsz = len(counts)
    out = bytearray(meta_size(cap) + bsz * block_size(cap))
    struct.pack_into("<i", out, 0, msg_id if keep_running else -msg_id)
    struct.pack_into("<i", out, 4, flag)
    struct.pack_into("<i", out, 8, bsz)
    for i in range(bsz):
        struct.pack_into("<i", out, 12 + 4 * i, counts[i])
    for i in range(bsz):
        for j in range(cap.max_draft_tokens):
            used = j < counts[i]
            for c in range(cap.k + 1):
                if used and c < len(token_ids[i][j]):
                    tok, score = token_ids[i][j][c], logprobs[i][j][c]
                else:
                    tok, score = -1, 0.0
                struct.pack_into("<i", out, token_offset(cap, i, j, c), tok)
                struct.pack_into("<f", out, score_offset(cap, i, j, c), score)
            struct.pack_into("<i", out, rank_offset(cap, i, j), ranks[i][j] if used else 0)
    return bytes(out)


def legacy_decode(buf, *, capacity: ProtocolCapacity = DEFAULT_PROTOCOL_CAPACITY) -> dict:
    """Decode a legacy message: rows of all k+1 columns; width reported as k+1."""
    buf = bytes(buf)
    signed_id, header, bsz = _read_meta(buf, capacity)
    if header < 0 or header > 255:
        raise ValueError(f"meta[1] = {header} is not a bare flag: not a legacy header")
    counts = _read_counts(buf, capacity, bsz)
    width = capacity.k + 1
    token_ids, logprobs, ranks = _read_rows(buf, capacity, counts, width)
    return _as_dict(signed_id, header, width, counts, token_ids, logprobs, ranks)


# ------------------------------------------------------------------------------------------
# the output stream: decoded messages -> per-request results (the output processor's contract)

PREEMPTED = -9
RECOVERY_STOP = -3
TARGET_FLAG = 3
DRAFT_FLAG = 4


def merge_stream(messages: list, num_requests: int) -> list:
    """Fold decoded messages (dicts of `packed_decode`) into one result per request slot:
    {"tokens", "status" (running | preempted | recovery_stop), "steps": [(token_ids, logprobs,
    ranks) per target step with tokens], "drafts": [draft rows of that step or None]}.

    Target messages: count 0 adds nothing (chunked prefill), -9 preempts, -3 is a recovery stop,
    a positive count appends that many rows as one step. Draft messages: a positive count replaces
    the draft rows of the request's latest step. ValueError: a message after the one that ended
    the stream (keep_running false), more slots than requests, a flag other than 3 or 4, a count
    for a request that already stopped, draft rows before any target step."""
    out = [{"tokens": [], "status": "running", "steps": [], "drafts": []} for _ in range(num_requests)]
    ended = False
    for n, m in enumerate(messages):
        if ended:
            raise ValueError(f"message {n}: the stream already ended")
        if m["bsz"] > num_requests:
            raise ValueError(f"message {n}: {m['bsz']} slots for {num_requests} requests")
        if m["flag"] not in (TARGET_FLAG, DRAFT_FLAG):
            raise ValueError(f"message {n}: flag {m['flag']}")
        for slot in range(m["bsz"]):
            count, req = m["counts"][slot], out[slot]
            rows = (m["token_ids"][slot], m["logprobs"][slot], m["ranks"][slot])
            if m["flag"] == DRAFT_FLAG:
                if count > 0:
                    if len(req["steps"]) == 0:
                        raise ValueError(f"message {n}: draft rows for request {slot} before any target step")
                    req["drafts"][len(req["drafts"]) - 1] = rows
                continue
            if count == 0:
                continue
            if req["status"] != "running":
                raise ValueError(f"message {n}: count {count} for request {slot}, which ended ({req['status']})")
            if count == PREEMPTED:
                req["status"] = "preempted"
            elif count == RECOVERY_STOP:
                req["status"] = "recovery_stop"
            else:
                req["tokens"] = req["tokens"] + [row[0] for row in rows[0]]
                req["steps"].append(rows)
                req["drafts"].append(None)
        ended = not m["keep_running"]
    return out
