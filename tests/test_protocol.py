"""The packed speculative logprob message (docs/protocol.md, DESIGN invariant 6).

specverify.protocol (numpy sender and receiver) against reference.protocol (struct loops):
round trips over capacities, widths, flags and counts; the packed receiver against the legacy
layout cut to the same width; every malformed message a MalformedMessage, never an IndexError.
Re-run one group: python -m pytest tests/test_protocol.py -k malformed
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import protocol as ref
from specverify.protocol import (
    DRAFT_TOKENS,
    PREEMPTED,
    RECOVERY_STOP,
    TARGET_TOKENS,
    Capacity,
    MalformedMessage,
    MessageWriter,
    pack_header,
    read_message,
    unpack_header,
)

# Seeded (derandomized); the number of examples comes from the loaded hypothesis profile.
SETTINGS = settings(deadline=None, derandomize=True)

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
SMALL = Capacity(max_bsz=8, k=3, max_draft_tokens=2)
DEFAULT = Capacity()
CAPACITIES = (SMALL, Capacity(max_bsz=5, k=0, max_draft_tokens=1), Capacity(max_bsz=3, k=7, max_draft_tokens=6),
              DEFAULT)
SPECIAL_SCORES = np.array([0.0, -0.0, -np.inf, np.inf, -1e-45, np.finfo(np.float32).min,
                           np.finfo(np.float32).max], dtype=np.float32)


def ref_cap(cap: Capacity) -> ref.ProtocolCapacity:
    return ref.ProtocolCapacity(cap.max_bsz, cap.k, cap.max_draft_tokens)


# ------------------------------------------------------------------------------------------
# message batches: the inputs of one message, built from a seed


@dataclasses.dataclass
class Batch:
    capacity: Capacity
    msg_id: int
    keep_running: bool
    flag: int
    counts: np.ndarray      # [bsz]
    token_ids: np.ndarray   # [bsz, rows, width]
    logprobs: np.ndarray    # [bsz, rows, width] float32
    ranks: np.ndarray       # [bsz, rows]

    @property
    def width(self) -> int:
        return self.token_ids.shape[2]

    def write(self, writer: MessageWriter) -> bytes:
        return bytes(writer.write(msg_id=self.msg_id, keep_running=self.keep_running, flag=self.flag,
                                  counts=self.counts, token_ids=self.token_ids, logprobs=self.logprobs,
                                  ranks=self.ranks))

    def expected(self) -> dict:
        """What the receiver must return: the first count rows of each request, as plain lists."""
        rows = [max(int(c), 0) for c in self.counts]
        return {"msg_id": self.msg_id, "keep_running": self.keep_running, "flag": self.flag,
                "width": self.width, "bsz": len(rows), "counts": [int(c) for c in self.counts],
                "token_ids": [self.token_ids[i, :n].tolist() for i, n in enumerate(rows)],
                "logprobs": [self.logprobs[i, :n].tolist() for i, n in enumerate(rows)],
                "ranks": [self.ranks[i, :n].tolist() for i, n in enumerate(rows)]}

    def legacy_bytes(self) -> bytes:
        e = self.expected()
        return ref.legacy_encode(msg_id=self.msg_id, keep_running=self.keep_running, flag=self.flag,
                                 counts=e["counts"], token_ids=e["token_ids"], logprobs=e["logprobs"],
                                 ranks=e["ranks"], capacity=ref_cap(self.capacity))


COUNT_MODES = ("mixed", "full", "signals", "sequential")


def make_batch(cap: Capacity, *, seed: int, bsz: int, width: int, flag: int = TARGET_TOKENS, msg_id: int = 1,
               keep_running: bool = True, count_mode: str = "mixed", extra_rows: int = 0,
               token_dtype=np.int64) -> Batch:
    rng = np.random.default_rng(seed)
    D = cap.max_draft_tokens
    if count_mode == "full":
        counts = np.full(bsz, D)
    elif count_mode == "signals":
        counts = rng.choice([0, RECOVERY_STOP, PREEMPTED], size=bsz)
    elif count_mode == "sequential":
        counts = np.arange(bsz) % (D + 1)
    else:
        counts = rng.choice([0, RECOVERY_STOP, PREEMPTED, *range(1, D + 1), *range(1, D + 1)], size=bsz)
    counts = counts.astype(rng.choice([np.int32, np.int64]))
    rows = min(max([0, *counts.tolist()]) + extra_rows, D)
    token_ids = rng.integers(INT32_MIN, INT32_MAX, size=(bsz, rows, width), endpoint=True).astype(token_dtype)
    token_ids[rng.random(token_ids.shape) < 0.1] = -1
    logprobs = (-np.abs(rng.standard_normal((bsz, rows, width))) * 8).astype(np.float32)
    special = rng.random(logprobs.shape) < 0.1
    logprobs[special] = rng.choice(SPECIAL_SCORES, size=int(special.sum()))
    ranks = rng.integers(INT32_MIN, INT32_MAX, size=(bsz, rows), endpoint=True).astype(np.int32)
    return Batch(cap, msg_id, keep_running, flag, counts, token_ids, logprobs, ranks)


@st.composite
def message_batches(draw, capacity: Capacity | None = None, max_default_bsz: int = 48):
    """One message's inputs: capacity, bsz (0, max and between), width 1..k+1, any flag, counts
    mixing signals and row counts. The default capacity's bsz is capped except for its maximum."""
    cap = capacity or draw(st.sampled_from(CAPACITIES))
    limit = min(cap.max_bsz, max_default_bsz)
    bsz = draw(st.one_of(st.just(0), st.just(1), st.just(cap.max_bsz), st.integers(0, limit)))
    width = draw(st.one_of(st.just(1), st.just(cap.k + 1), st.integers(1, cap.k + 1)))
    return make_batch(
        cap, seed=draw(st.integers(0, 2**32 - 1)), bsz=bsz, width=width,
        flag=draw(st.one_of(st.sampled_from([TARGET_TOKENS, DRAFT_TOKENS, 0, 255]), st.integers(0, 255))),
        msg_id=draw(st.one_of(st.just(1), st.just(INT32_MAX), st.integers(1, INT32_MAX))),
        keep_running=draw(st.booleans()), count_mode=draw(st.sampled_from(COUNT_MODES)),
        extra_rows=draw(st.integers(0, 2)), token_dtype=draw(st.sampled_from([np.int32, np.int64])))


def decoded(buf, cap: Capacity) -> dict:
    return dataclasses.asdict(read_message(buf, capacity=cap))


def set_word(buf: bytes, index: int, value: int) -> bytes:
    """A copy of buf with int32 word `index` of the meta replaced."""
    out = bytearray(buf)
    struct.pack_into("<i", out, 4 * index, value)
    return bytes(out)


# ------------------------------------------------------------------------------------------
# capacity


def test_default_capacity_sizes():
    assert (DEFAULT.max_bsz, DEFAULT.k, DEFAULT.max_draft_tokens) == (512, 20, 6)
    assert DEFAULT.meta_bytes == 4 * 515 == 2060
    assert DEFAULT.block_bytes == 4 * 126 + 4 * 126 + 4 * 6 == 1032
    assert DEFAULT.max_message_bytes == 2060 + 512 * 1032 + 16 == 530460    # + the capacity trailer
    assert DEFAULT.message_bytes(0) == 2060 + 16 and DEFAULT.message_bytes(3) == 2060 + 3 * 1032 + 16


@pytest.mark.parametrize("cap", CAPACITIES, ids=str)
def test_capacity_sizes_match_the_reference(cap):
    assert cap.meta_bytes == ref.meta_size(ref_cap(cap))
    assert cap.block_bytes == ref.block_size(ref_cap(cap))


@pytest.mark.parametrize("kwargs, match", [
    ({"max_bsz": 0}, r"max_bsz must be in 1\.\."),
    ({"k": -1}, r"k must be in 0\.\.65534"),
    ({"k": 65535}, r"k must be in 0\.\.65534 \(k\+1 must fit the 16-bit width field\)"),
    ({"max_draft_tokens": 0}, r"max_draft_tokens must be in 1\.\."),
])
def test_capacity_rejects_out_of_range(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Capacity(**kwargs)


def test_capacity_rejects_non_ints():
    with pytest.raises(TypeError, match="max_bsz must be an int"):
        Capacity(max_bsz=True)
    with pytest.raises(TypeError, match="k must be an int"):
        Capacity(k=2.0)
    with pytest.raises(ValueError, match=r"bsz must be in 0\.\.8"):
        SMALL.message_bytes(9)


# ------------------------------------------------------------------------------------------
# header


def test_pack_header_values():
    assert pack_header(TARGET_TOKENS, 1) == 0x103
    assert pack_header(DRAFT_TOKENS, 21) == 0x1504
    assert pack_header(255, 21) == 0x15FF
    assert pack_header(0, 1) == 0x100
    assert pack_header(3, 4, capacity=SMALL) == 0x403


@pytest.mark.parametrize("flag, width, cap, match", [
    (256, 1, DEFAULT, r"message_flag must be in 0\.\.255"),
    (-1, 1, DEFAULT, r"message_flag must be in 0\.\.255"),
    (3, 0, DEFAULT, r"max_num_logprobs must be in 1\.\.21"),
    (3, 22, DEFAULT, r"max_num_logprobs must be in 1\.\.21"),
    (3, 5, SMALL, r"max_num_logprobs must be in 1\.\.4 .*k=3"),
    (3, 0x10000, Capacity(k=65534), r"max_num_logprobs must be in 1\.\.65535"),
])
def test_pack_header_refuses_out_of_range(flag, width, cap, match):
    with pytest.raises(ValueError, match=match):
        pack_header(flag, width, capacity=cap)


def test_regression_flag_overflow_into_width_bits_is_refused():
    # Unchecked, flag 256 | width 1 << 8 would be 0x100: silently read back as flag 0, width 1.
    assert 256 | (1 << 8) == pack_header(0, 1)
    with pytest.raises(ValueError, match=r"message_flag must be in 0\.\.255"):
        pack_header(256, 1)
    with pytest.raises(ValueError, match=r"message_flag"):
        pack_header(3 | (2 << 8), 1)


@pytest.mark.parametrize("value, match", [
    (TARGET_TOKENS, r"legacy header \(message_flag 3 alone"),
    (DRAFT_TOKENS, r"legacy header \(message_flag 4 alone"),
    (0, r"legacy header"),
    (3 | (22 << 8), r"max_num_logprobs 22, above k\+1 = 21"),
    (0xFFFFFF, r"max_num_logprobs 65535, above k\+1 = 21"),
    (-1, r"negative"),
    (INT32_MIN, r"negative"),
    ((1 << 24) | 0x103, r"bits above 23"),
    (INT32_MAX, r"bits above 23"),
])
def test_unpack_header_rejects(value, match):
    with pytest.raises(MalformedMessage, match=match):
        unpack_header(value)


def test_unpack_header_widest_field_and_numpy_ints():
    assert unpack_header(0xFFFFFF, capacity=Capacity(k=65534)) == (255, 65535)
    assert unpack_header(np.int32(0x1504)) == (DRAFT_TOKENS, 21)
    with pytest.raises(TypeError):
        unpack_header(3.0)


@given(cap=st.sampled_from(CAPACITIES), flag=st.integers(0, 255), data=st.data())
@SETTINGS
def test_header_round_trip_and_reference(cap, flag, data):
    width = data.draw(st.integers(1, cap.k + 1))
    value = pack_header(flag, width, capacity=cap)
    assert value == ref.packed_header(flag, width)
    assert 0 <= value < 2**24
    assert unpack_header(value, capacity=cap) == (flag, width) == ref.split_header(value)


# ------------------------------------------------------------------------------------------
# round trips


@given(batch=message_batches())
@SETTINGS
def test_round_trip(batch):
    cap = batch.capacity
    buf = batch.write(MessageWriter(cap))
    assert len(buf) == cap.message_bytes(len(batch.counts))
    got = decoded(buf, cap)
    assert got == batch.expected()
    assert got == ref.packed_decode(buf, capacity=ref_cap(cap))


def test_round_trip_full_default_struct():
    batch = make_batch(DEFAULT, seed=7, bsz=512, width=21, count_mode="full", msg_id=INT32_MAX, keep_running=False)
    buf = batch.write(MessageWriter())
    assert len(buf) == DEFAULT.max_message_bytes
    msg = read_message(buf)
    assert (msg.msg_id, msg.keep_running, msg.flag, msg.width, msg.top_logprobs) == (INT32_MAX, False, 3, 21, 20)
    assert dataclasses.asdict(msg) == batch.expected()


def test_empty_batch_and_signal_only_batch():
    for batch in (make_batch(SMALL, seed=1, bsz=0, width=2),
                  make_batch(SMALL, seed=2, bsz=8, width=4, count_mode="signals")):
        msg = read_message(batch.write(MessageWriter(SMALL)), capacity=SMALL)
        assert dataclasses.asdict(msg) == batch.expected()
        assert all(t == [] and lp == [] and r == [] for t, lp, r in zip(msg.token_ids, msg.logprobs, msg.ranks))


def test_torch_tensors_write_the_same_bytes():
    batch = make_batch(SMALL, seed=3, bsz=5, width=3, extra_rows=1)
    expected = batch.write(MessageWriter(SMALL))
    got = bytes(MessageWriter(SMALL).write(
        msg_id=batch.msg_id, keep_running=batch.keep_running, flag=batch.flag,
        counts=torch.from_numpy(batch.counts), token_ids=torch.from_numpy(batch.token_ids.astype(np.int64)),
        logprobs=torch.from_numpy(batch.logprobs), ranks=torch.from_numpy(batch.ranks)))
    assert got == expected


def test_write_returns_a_read_only_view_of_the_message():
    view = MessageWriter(SMALL).write(**kwargs_of(make_batch(SMALL, seed=4, bsz=3, width=2)))
    assert view.readonly and view.nbytes == SMALL.message_bytes(3)


# ------------------------------------------------------------------------------------------
# writer reuse: one buffer, stale columns and rows must not leak


def test_writer_reuse_stale_columns_do_not_leak():
    writer = MessageWriter(DEFAULT)
    wide = make_batch(DEFAULT, seed=10, bsz=12, width=21, count_mode="full")
    narrow = make_batch(DEFAULT, seed=11, bsz=9, width=2, count_mode="sequential")
    wide_buf = wide.write(writer)
    narrow_buf = narrow.write(writer)
    assert decoded(narrow_buf, DEFAULT) == narrow.expected()
    assert decoded(narrow_buf, DEFAULT) == ref.packed_decode(narrow_buf)
    # The stale data is really there (so the test means something): read as a legacy k+1-column
    # message, request 0 row 0 shows the wide message's column 2 after the narrow one's two.
    legacy_view = ref.legacy_decode(set_word(narrow_buf, 1, narrow.flag))
    assert narrow.counts[1] >= 1
    assert legacy_view["token_ids"][1][0][:2] == narrow.token_ids[1, 0].tolist()
    assert legacy_view["token_ids"][1][0][2:] == wide.token_ids[1, 0, 2:].tolist()
    # Rows past a count are not written either: request 0 has count 0, its block is the wide one's.
    block = slice(DEFAULT.meta_bytes, DEFAULT.meta_bytes + DEFAULT.block_bytes)
    assert narrow.counts[0] == 0 and narrow_buf[block] == wide_buf[block]


@given(data=st.data(), cap=st.sampled_from(CAPACITIES[:3]))
@SETTINGS
def test_writer_reuse_across_messages(data, cap):
    writer = MessageWriter(cap)
    for batch in data.draw(st.lists(message_batches(cap), min_size=2, max_size=4)):
        buf = batch.write(writer)
        assert decoded(buf, cap) == batch.expected() == ref.packed_decode(buf, capacity=ref_cap(cap))


def test_refused_write_leaves_the_buffer_alone():
    writer = MessageWriter(SMALL)
    good = make_batch(SMALL, seed=5, bsz=4, width=3)
    view = writer.write(**kwargs_of(good))
    before = bytes(view)
    bad = kwargs_of(make_batch(SMALL, seed=6, bsz=4, width=3, count_mode="full"))
    bad["token_ids"] = bad["token_ids"].astype(np.int64)
    bad["token_ids"][-1, -1, -1] = INT32_MAX + 1
    with pytest.raises(ValueError, match="token_ids must fit int32"):
        writer.write(**bad)
    assert bytes(view) == before


# ------------------------------------------------------------------------------------------
# packed receiver == legacy layout cut to the same width


def legacy_cut(legacy: dict, width: int) -> dict:
    out = dict(legacy, width=width)
    out["token_ids"] = [[row[:width] for row in req] for req in legacy["token_ids"]]
    out["logprobs"] = [[row[:width] for row in req] for req in legacy["logprobs"]]
    return out


WIDTH_CASES = [(SMALL, w) for w in range(1, SMALL.k + 2)] + [(DEFAULT, w) for w in range(1, DEFAULT.k + 2)]


@pytest.mark.parametrize("cap, width", WIDTH_CASES, ids=[f"k{c.k}-width{w}" for c, w in WIDTH_CASES])
def test_packed_equals_legacy_cut_to_width(cap, width):
    bsz = cap.max_bsz if cap is SMALL else 9
    batch = make_batch(cap, seed=100 + width, bsz=bsz, width=width, flag=DRAFT_TOKENS, count_mode="sequential")
    buf = batch.write(MessageWriter(cap))
    legacy = ref.legacy_decode(batch.legacy_bytes(), capacity=ref_cap(cap))
    # The legacy rows carry k+1 columns; those past the width are the padding token -1 / score 0.0.
    pad = cap.k + 1 - width
    assert all(row[width:] == [-1] * pad for req in legacy["token_ids"] for row in req)
    assert all(row[width:] == [0.0] * pad for req in legacy["logprobs"] for row in req)
    got = decoded(buf, cap)
    assert got == legacy_cut(legacy, width)
    assert got == ref.packed_decode(buf, capacity=ref_cap(cap))


def test_top_logprobs_zero_sends_only_the_sampled_token():
    # top_logprobs = 0 (the PR's motivating case): width 1, every row is [sampled token].
    batch = make_batch(DEFAULT, seed=12, bsz=6, width=1, count_mode="full")
    msg = read_message(batch.write(MessageWriter()))
    assert msg.width == 1 and msg.top_logprobs == 0
    legacy = ref.legacy_decode(batch.legacy_bytes())
    assert [[row[:1] for row in req] for req in legacy["token_ids"]] == msg.token_ids
    assert all(len(row) == 1 for req in msg.token_ids for row in req)


# ------------------------------------------------------------------------------------------
# malformed messages: a clear MalformedMessage, never an IndexError


def test_regression_legacy_header_is_a_clear_error_not_indexerror():
    # Seed 003: a test fixture still wrote meta[1] = 4 (flag only); the packed receiver decoded
    # actual_topk = 0, sliced every row to nothing and crashed on row[0] with an IndexError.
    for flag in (TARGET_TOKENS, DRAFT_TOKENS):
        batch = make_batch(DEFAULT, seed=13, bsz=3, width=21, flag=flag, count_mode="full")
        with pytest.raises(MalformedMessage, match=rf"max_num_logprobs 0: a legacy header \(message_flag {flag}"):
            read_message(batch.legacy_bytes())
        with pytest.raises(ValueError, match="legacy header"):
            ref.packed_decode(batch.legacy_bytes())
    # The reverse mismatch is refused too: a legacy reader does not take a packed header.
    packed = make_batch(DEFAULT, seed=14, bsz=2, width=3).write(MessageWriter())
    with pytest.raises(ValueError, match="not a legacy header"):
        ref.legacy_decode(packed)


def malformed_cases():
    D, maxb = DEFAULT.max_draft_tokens, DEFAULT.max_bsz
    return [
        ("msg-id-0", 0, 0, r"meta\[0\] = 0: ±msg_id needs msg_id in 1\.\.2147483647"),
        ("msg-id-int32-min", 0, INT32_MIN, r"meta\[0\] = -2147483648"),
        ("legacy-header", 1, DRAFT_TOKENS, r"legacy header"),
        ("width-above-k+1", 1, 3 | (22 << 8), r"max_num_logprobs 22, above k\+1 = 21"),
        ("bits-above-23", 1, (1 << 24) | 0x1503, r"bits above 23"),
        ("negative-header", 1, -0x1503, r"negative"),
        ("bsz-above-max", 2, maxb + 1, r"bsz meta\[2\] = 513 outside 0\.\.max_bsz 512"),
        ("bsz-negative", 2, -1, r"bsz meta\[2\] = -1 outside 0\.\.max_bsz 512"),
        ("count-7", 4, D + 1, r"count of request 1 \(meta\[4\]\) is 7; .*1\.\.max_draft_tokens 6"),
        ("count-minus-5", 3, -5, r"count of request 0 \(meta\[3\]\) is -5"),
        ("count-minus-1", 5, -1, r"count of request 2 \(meta\[5\]\) is -1"),
        ("count-int32-max", 5, INT32_MAX, r"count of request 2"),
    ]


@pytest.mark.parametrize("word, value, match", [c[1:] for c in malformed_cases()],
                         ids=[c[0] for c in malformed_cases()])
def test_malformed_meta_is_a_clear_error(word, value, match):
    good = make_batch(DEFAULT, seed=15, bsz=3, width=4, count_mode="full").write(MessageWriter())
    bad = set_word(good, word, value)
    with pytest.raises(MalformedMessage, match=match):
        read_message(bad)
    with pytest.raises(ValueError):
        ref.packed_decode(bad)


@pytest.mark.parametrize("cap", [SMALL, DEFAULT], ids=str)
def test_truncated_and_overlong_buffers(cap):
    bsz = 3
    good = make_batch(cap, seed=16, bsz=bsz, width=cap.k + 1, count_mode="full").write(MessageWriter(cap))
    need = cap.message_bytes(bsz)
    assert len(good) == need
    short_meta = [0, 1, 4, 11, cap.meta_bytes - 4, cap.meta_bytes - 1]
    short_blocks = [cap.meta_bytes, cap.meta_bytes + 1, cap.meta_bytes + cap.block_bytes - 1,
                    cap.meta_bytes + cap.block_bytes, need - cap.block_bytes // 2, need - 4, need - 1]
    for cut in short_meta:
        with pytest.raises(MalformedMessage, match=rf"message is {cut} bytes, shorter than its meta"):
            read_message(good[:cut], capacity=cap)
    for cut in short_blocks:
        with pytest.raises(MalformedMessage, match=rf"truncated: bsz 3 needs {need} bytes .* got {cut}"):
            read_message(good[:cut], capacity=cap)
    for cut in short_meta + short_blocks:
        with pytest.raises(ValueError):
            ref.packed_decode(good[:cut], capacity=ref_cap(cap))
    # A message is exactly its length: trailing bytes are refused (they would hide a capacity
    # mismatch), and past the full struct the capacities disagree.
    for extra in (1, 4, 16):
        with pytest.raises(MalformedMessage, match=rf"longer than a message of bsz 3: exactly {need} bytes"):
            read_message(good + b"\x7f" * extra, capacity=cap)
        with pytest.raises(ValueError):
            ref.packed_decode(good + b"\x7f" * extra, capacity=ref_cap(cap))
    with pytest.raises(MalformedMessage, match="longer than the full struct"):
        read_message(good + b"\0" * (cap.max_message_bytes - need + 1), capacity=cap)


def test_receiver_with_smaller_k_rejects_a_wider_message():
    buf = make_batch(DEFAULT, seed=17, bsz=2, width=8).write(MessageWriter())
    with pytest.raises(MalformedMessage, match=r"capacity mismatch: .*k=20.*receiver has .*k=5"):
        read_message(buf, capacity=Capacity(k=5))
    # Without the trailer's verdict the header check alone would still refuse it.
    with pytest.raises(MalformedMessage, match=r"max_num_logprobs 8, above k\+1 = 6"):
        unpack_header(pack_header(TARGET_TOKENS, 8), capacity=Capacity(k=5))


# Same block size as DEFAULT (D * (2k + 3) = 2 * 129 = 6 * 43) and the same max_bsz: every message
# has the same length under both capacities, so only the trailer tells them apart.
SAME_LENGTH_AS_DEFAULT = Capacity(max_bsz=512, k=63, max_draft_tokens=2)
MISMATCH_CAPS = [*CAPACITIES, SAME_LENGTH_AS_DEFAULT, Capacity(max_bsz=8, k=3, max_draft_tokens=3),
                 Capacity(max_bsz=9, k=3, max_draft_tokens=2)]
MISMATCH_PAIRS = [(a, b) for a in MISMATCH_CAPS for b in MISMATCH_CAPS if a != b]


@pytest.mark.parametrize("sender, receiver", MISMATCH_PAIRS,
                         ids=[f"{a.max_bsz}-{a.k}-{a.max_draft_tokens}-to-{b.max_bsz}-{b.k}-{b.max_draft_tokens}"
                              for a, b in MISMATCH_PAIRS])
def test_capacity_mismatch_is_refused_never_garbage(sender, receiver):
    assert SAME_LENGTH_AS_DEFAULT.block_bytes == DEFAULT.block_bytes
    for bsz in sorted({0, 1, min(sender.max_bsz, receiver.max_bsz, 3)}):
        batch = make_batch(sender, seed=40 + bsz, bsz=bsz, width=1, count_mode="full")
        buf = batch.write(MessageWriter(sender))
        with pytest.raises(MalformedMessage, match="capacity mismatch"):
            read_message(buf, capacity=receiver)
        with pytest.raises(ValueError, match="capacity mismatch"):
            ref.packed_decode(buf, capacity=ref_cap(receiver))


def test_message_without_trailer_is_refused():
    batch = make_batch(SMALL, seed=41, bsz=2, width=2, count_mode="full")
    buf = batch.write(MessageWriter(SMALL))
    stripped = buf[:-16] + b"\0" * 16
    with pytest.raises(MalformedMessage, match="no capacity trailer"):
        read_message(stripped, capacity=SMALL)
    with pytest.raises(ValueError):
        ref.packed_decode(stripped, capacity=ref_cap(SMALL))


@pytest.mark.parametrize("layout", ["strided-bytes", "strided-int32", "fortran-2d"])
def test_non_contiguous_buffers_decode_their_logical_bytes(layout):
    batch = make_batch(SMALL, seed=42, bsz=3, width=2)
    buf = batch.write(MessageWriter(SMALL))
    raw = np.frombuffer(buf, dtype=np.uint8)
    if layout == "strided-bytes":
        arr = np.repeat(raw, 2)[::2]
    elif layout == "strided-int32":
        arr = np.repeat(raw.view("<i4"), 2)[::2]
    else:
        arr = np.asfortranarray(raw.reshape(-1, 4))
        assert not arr.flags.c_contiguous
    assert arr.tobytes() == buf
    assert decoded(arr, SMALL) == batch.expected()


INTERESTING_WORDS = [0, 1, -1, 2, 3, 4, 6, 7, -3, -5, -9, 255, 256, 0x103, 0x1503, 0x1603, 0xFFFFFF,
                     1 << 24, INT32_MAX, INT32_MIN]


@given(batch=message_batches(max_default_bsz=8), data=st.data())
@SETTINGS
def test_corrupted_messages_never_crash_and_agree_with_the_reference(batch, data):
    cap = batch.capacity
    buf = batch.write(MessageWriter(cap))
    how = data.draw(st.sampled_from(["word", "cut", "grow"]))
    if how == "word":
        word = data.draw(st.integers(0, min(cap.meta_words - 1, 3 + len(batch.counts) + 1)))
        buf = set_word(buf, word, data.draw(st.one_of(st.sampled_from(INTERESTING_WORDS),
                                                      st.integers(INT32_MIN, INT32_MAX))))
    elif how == "cut":
        buf = buf[:data.draw(st.integers(0, len(buf)))]
    else:
        buf = buf + bytes(data.draw(st.integers(0, cap.max_message_bytes - len(buf) + 8)))
    try:
        expected = ref.packed_decode(buf, capacity=ref_cap(cap))
    except ValueError:
        with pytest.raises(MalformedMessage):
            read_message(buf, capacity=cap)
    else:
        assert decoded(buf, cap) == expected


# ------------------------------------------------------------------------------------------
# the sender refuses what it cannot send


def kwargs_of(batch: Batch) -> dict:
    return {"msg_id": batch.msg_id, "keep_running": batch.keep_running, "flag": batch.flag,
            "counts": batch.counts, "token_ids": batch.token_ids, "logprobs": batch.logprobs, "ranks": batch.ranks}


def _with(**changes):
    def edit(kw):
        kw.update(changes)
        return kw
    return edit


def _retype(name, dtype):
    def edit(kw):
        kw[name] = kw[name].astype(dtype)
        return kw
    return edit


def _set(name, index, value):
    def edit(kw):
        kw[name] = kw[name].astype(np.int64) if kw[name].dtype.kind in "iu" else kw[name].copy()
        kw[name][index] = value
        return kw
    return edit


def _reshape(name, slicer):
    def edit(kw):
        kw[name] = kw[name][slicer]
        return kw
    return edit


def _grow_rows(kw):
    for name in ("token_ids", "logprobs", "ranks"):
        a = kw[name]
        kw[name] = np.concatenate([a, a[:, :1]], axis=1)
    return kw


def _one_row_but_count_2_at_1(kw):
    for name in ("token_ids", "logprobs", "ranks"):
        kw[name] = kw[name][:, :1]
    kw["counts"] = np.ones_like(kw["counts"])
    kw["counts"][1] = 2
    return kw


def _nine_requests(kw):
    for name in ("counts", "token_ids", "logprobs", "ranks"):
        kw[name] = np.concatenate([kw[name], kw[name][:1]], axis=0)
    return kw


WRITER_ERRORS = {
    "bsz-above-max": (_nine_requests, r"bsz = len\(counts\) = 9 exceeds max_bsz 8"),
    "rows-above-max-draft-tokens": (_grow_rows, r"3 rows per request, above max_draft_tokens 2"),
    "width-0": (_reshape("token_ids", np.s_[:, :, :0]), r"max_num_logprobs = token_ids.shape\[2\] must be in 1\.\.4"),
    "width-above-k+1": (lambda kw: {**kw, "token_ids": np.zeros((8, 2, 5), np.int32),
                                    "logprobs": np.zeros((8, 2, 5), np.float32)},
                        r"token_ids.shape\[2\] must be in 1\.\.4 .*got 5"),
    "count-above-max-draft-tokens": (_set("counts", 2, 3), r"counts\[2\] = 3; a count is .*1\.\.max_draft_tokens 2"),
    "count-minus-5": (_set("counts", 0, -5), r"counts\[0\] = -5"),
    "count-above-rows": (_one_row_but_count_2_at_1, r"counts\[1\] = 2 exceeds the 1 rows given"),
    "msg-id-0": (_with(msg_id=0), r"msg_id must be in 1\.\.2147483647"),
    "msg-id-above-int32": (_with(msg_id=2**31), r"msg_id must be in 1\.\.2147483647"),
    "flag-256": (_with(flag=256), r"message_flag must be in 0\.\.255"),
    "flag-negative": (_with(flag=-1), r"message_flag must be in 0\.\.255"),
    "token-ids-float": (_retype("token_ids", np.float32), r"token_ids must be an integer array"),
    "logprobs-float64": (_retype("logprobs", np.float64), r"logprobs must be float32"),
    "counts-float": (_retype("counts", np.float64), r"counts must be an integer array"),
    "counts-2d": (_reshape("counts", np.s_[:, None]), r"counts must be \[bsz\], got shape \(8, 1\)"),
    "logprobs-shape": (_reshape("logprobs", np.s_[:, :, :1]), r"logprobs shape \(8, 2, 1\) != token_ids shape"),
    "ranks-shape": (_reshape("ranks", np.s_[:, :1]), r"ranks must be \[bsz, rows\] = \(8, 2\)"),
    "token-id-above-int32": (_set("token_ids", (0, 0, 0), INT32_MAX + 1), r"token_ids must fit int32"),
    "rank-below-int32": (_set("ranks", (0, 0), INT32_MIN - 1), r"ranks must fit int32"),
    "token-requests-mismatch": (_reshape("token_ids", np.s_[:7]), r"token_ids has 7 requests, counts has bsz 8"),
}


@pytest.mark.parametrize("edit, match", list(WRITER_ERRORS.values()), ids=list(WRITER_ERRORS))
def test_writer_refuses(edit, match):
    batch = make_batch(SMALL, seed=18, bsz=8, width=4, count_mode="full")
    kwargs = edit(kwargs_of(batch))
    with pytest.raises(ValueError, match=match):
        MessageWriter(SMALL).write(**kwargs)


def test_writer_type_errors():
    kwargs = kwargs_of(make_batch(SMALL, seed=19, bsz=2, width=2))
    with pytest.raises(TypeError, match="keep_running must be a bool"):
        MessageWriter(SMALL).write(**{**kwargs, "keep_running": 1})
    with pytest.raises(TypeError, match="capacity must be a Capacity"):
        MessageWriter((8, 3, 2))
    with pytest.raises(ValueError, match="logprobs: tensor dtype torch.bfloat16 has no numpy equivalent"):
        MessageWriter(SMALL).write(**{**kwargs, "logprobs": torch.zeros(2, 2, 2, dtype=torch.bfloat16)})
