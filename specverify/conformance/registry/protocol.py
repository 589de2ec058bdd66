"""The packed logprob message (docs/protocol.md).

Records of the op registry (specverify/conformance/registry/__init__.py)."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import torch

import reference
from reference import protocol as rproto
from specverify.protocol import message as msg
from specverify.conformance import strategies as S
from specverify.conformance.registry.core import EXACT, ErrorInput, OpSpec, SampleInput, only


# ---------------------------------------------------------------------------------------------
# the packed logprob message (docs/protocol.md): specverify's writer + reader against the
# reference's byte-by-byte layout (legacy_encode re-headed as packed, plus the trailer) + reader

CODEC_CAPACITY = (5, 4, 3)      # (max_bsz, k, max_draft_tokens): small, so messages stay short


def _codec_out(d: dict) -> dict:
    rows = [r for req in d["token_ids"] for r in req]
    lps = [r for req in d["logprobs"] for r in req]
    w = d["width"]
    return {"meta": torch.tensor([d["msg_id"], int(d["keep_running"]), d["flag"], w, d["bsz"]], dtype=torch.int64),
            "counts": torch.tensor(list(d["counts"]), dtype=torch.int64),
            "token_ids": torch.tensor(rows, dtype=torch.int64).view(-1, w),
            "logprobs": torch.tensor(np.array(lps, dtype=np.float32).reshape(-1, w)),
            "ranks": torch.tensor([r for req in d["ranks"] for r in req], dtype=torch.int64)}


def _codec_impl(s: SampleInput, profile) -> dict:
    a = s.args
    cap = msg.Capacity(*CODEC_CAPACITY)
    wire = msg.MessageWriter(cap).write(msg_id=a["msg_id"], keep_running=a["keep_running"], flag=a["flag"],
                                        counts=a["counts"], token_ids=a["token_ids"], logprobs=a["logprobs"],
                                        ranks=a["ranks"])
    m = msg.read_message(bytes(wire), capacity=cap)
    return _codec_out(dataclasses.asdict(m))


def _ref_wire(a: dict) -> bytes:
    """The packed message built from the reference's layout: legacy_encode writes every column,
    then meta[1] becomes the packed header and the capacity trailer follows the last block."""
    cap = rproto.ProtocolCapacity(*CODEC_CAPACITY)
    counts = [int(c) for c in a["counts"]]
    tok, lps, rnk = a["token_ids"].tolist(), a["logprobs"].tolist(), a["ranks"].tolist()
    buf = bytearray(rproto.legacy_encode(msg_id=a["msg_id"], keep_running=a["keep_running"], flag=a["flag"],
                                         counts=counts, token_ids=tok, logprobs=lps, ranks=rnk, capacity=cap))
    struct.pack_into("<i", buf, 4, reference.packed_header(a["flag"], a["token_ids"].shape[2]))
    return bytes(buf) + struct.pack("<4i", rproto.TRAILER_MAGIC, *cap)


def _codec_ref(s: SampleInput) -> dict:
    return _codec_out(reference.packed_decode(_ref_wire(s.args), capacity=rproto.ProtocolCapacity(*CODEC_CAPACITY)))


def _codec_sample(name, seed, counts, width, *, flag=3, msg_id=7, keep_running=True, lp=None, tokens=None):
    gen = torch.Generator().manual_seed(seed)
    bsz, rows = len(counts), CODEC_CAPACITY[2]
    tok = torch.randint(0, 50000, (bsz, rows, width), generator=gen) if tokens is None else tokens
    # logprobs in (-20, 0]: -20 k / 2**24 for integer k, exact in float64, rounded once to float32
    lps = S.cast(-torch.randint(0, 2**24, (bsz, rows, width), generator=gen).double() * 20 / 2**24,
                 torch.float32) if lp is None else lp
    return SampleInput(name, {"msg_id": msg_id, "keep_running": keep_running, "flag": flag,
                              "counts": np.array(counts, dtype=np.int64), "token_ids": tok.numpy().astype(np.int64),
                              "logprobs": lps.numpy().astype(np.float32),
                              "ranks": torch.randint(1, 1000, (bsz, rows), generator=gen).numpy()}, seed)


def _codec_samples(dtype: str, seed: int):
    k1 = CODEC_CAPACITY[1] + 1
    yield _codec_sample("plain", seed, [1, 3, 2], 3)
    yield _codec_sample("boundary-width-1", seed, [3, 1], 1, flag=4)
    yield _codec_sample("boundary-width-k+1-flag-255", seed, [2, 2, 2, 2, 2], k1, flag=255, msg_id=2**31 - 1)
    yield _codec_sample("boundary-flag-0-stop", seed, [1], 2, flag=0, keep_running=False)
    yield _codec_sample("boundary-signals", seed, [0, -3, -9, 2], 2)
    yield _codec_sample("boundary-int32-tokens", seed, [2, 1], 2,
                        tokens=torch.tensor([2**31 - 1, -2**31, 0, 1, 2, 3] * 2).view(2, 3, 2))
    nan = torch.tensor([float("nan"), float("-inf"), float("inf"), -0.0, 0.0, 1e-45] * 3).view(1, 3, 6)[..., :k1]
    yield _codec_sample("nan-inf-logprobs", seed, [3], k1, lp=nan.float())
    a = torch.tensor(-1.5)
    ulp = torch.stack([a, torch.nextafter(a, a + 1), torch.nextafter(a, a - 1)]).repeat(2, 3, 1)[..., :2]
    yield _codec_sample("ulp-adjacent-logprobs", seed, [3, 3], 2, lp=ulp.view(2, 3, 2).float())
    yield _codec_sample("empty-batch", seed, [], 2)


def _codec_recipe(dtype: str):
    from hypothesis import strategies as st
    counts = st.lists(st.sampled_from([0, -3, -9, 1, 2, 3]), min_size=0, max_size=CODEC_CAPACITY[0])
    return st.tuples(st.integers(0, 2**31 - 1), counts, st.integers(1, CODEC_CAPACITY[1] + 1),
                     st.integers(0, 255), st.booleans()).map(
        lambda t: _codec_sample("hyp", t[0], t[1], t[2], flag=t[3], keep_running=t[4]))


def _codec_errors():
    cap = msg.Capacity(*CODEC_CAPACITY)
    s = _codec_sample("e", 0, [1, 2], 2).args

    def write(**kw):
        args = {k: v for k, v in s.items()} | kw
        return lambda: msg.MessageWriter(cap).write(**args)
    rcap = rproto.ProtocolCapacity(*CODEC_CAPACITY)
    legacy = rproto.legacy_encode(msg_id=1, keep_running=True, flag=3, counts=[1], token_ids=[[[1]]],
                                  logprobs=[[[0.0]]], ranks=[[1]], capacity=rcap)
    legacy += struct.pack("<4i", rproto.TRAILER_MAGIC, *rcap)
    good = bytes(msg.MessageWriter(cap).write(**s))
    yield ErrorInput("flag-256", write(flag=256), ValueError, "message_flag must be in 0..255", "message_flag")
    yield ErrorInput("width-0", write(token_ids=s["token_ids"][..., :0], logprobs=s["logprobs"][..., :0]), ValueError,
                     "max_num_logprobs", "max_num_logprobs")
    yield ErrorInput("width-above-k+1", write(token_ids=np.zeros((2, 3, 6), dtype=np.int64),
                                              logprobs=np.zeros((2, 3, 6), dtype=np.float32)),
                     ValueError, "max_num_logprobs", "max_num_logprobs")
    yield ErrorInput("count-above-rows", write(counts=np.array([1, 4])), ValueError, "counts", "counts")
    yield ErrorInput("count-negative", write(counts=np.array([1, -1])), ValueError, "counts", "counts")
    yield ErrorInput("logprobs-float64", write(logprobs=s["logprobs"].astype(np.float64)), ValueError,
                     "logprobs must be float32", "logprobs")
    yield ErrorInput("msg-id-0", write(msg_id=0), ValueError, "msg_id", "msg_id")
    yield ErrorInput("read-legacy-header", lambda: msg.read_message(legacy, capacity=cap), msg.MalformedMessage,
                     "legacy header", "header")
    yield ErrorInput("read-truncated", lambda: msg.read_message(good[:-20], capacity=cap), msg.MalformedMessage,
                     "truncated|bytes", "message")




RECORDS = (
    OpSpec("message_codec", _codec_impl, _codec_ref, _codec_samples, _codec_recipe, _codec_errors,
           only("float32"), {"meta": EXACT, "counts": EXACT, "token_ids": EXACT, "logprobs": EXACT,
                                   "ranks": EXACT}, platform_dependent=False, max_examples=15),
)
