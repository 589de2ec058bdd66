"""Bad input on the public API: every outcome is the documented error, never anything else.

The rule (docs/bad-input.md): a wrong *type* raises TypeError, a right type out of its bound
raises ValueError (or the module's own subclass: MalformedMessage, ProfileUnavailable, ...), and
the message names the argument. An int is an int: not a bool, not a float, not a str.

Two parts:
- `test_sweep_*`: hypothesis generates bad arguments per entry point (wrong types, NaN / inf,
  negatives, out-of-range values, bools for ints, floats for ints, strings, wrong nesting), one
  argument broken per call. Each case has an expected class (TypeError for a type case,
  ValueError for a value case); any other outcome -- accepted, another class, an error that does
  not name the argument, a hang -- fails, with the per-entry-point table of outcomes in the message
  (and printed: `-s` or `-rA` shows it).
- `test_named_case`: the exact cases issue 7 lists, one named case each, and those of issue 21
  item 7: what the environment lacks (a CUDA device, a profile's device, an FP8 format of the
  profile, a ring's shared-memory segment) is a clear error naming the argument, never torch's
  AssertionError or a bare OSError. The absent device is chosen per machine (`absent_cuda_device`),
  so the cases test something real on a CPU box and on a GPU runner alike.

Derandomized; re-run one part: python -m pytest tests/test_public_api_errors.py -k "sweep and generate"
"""

from __future__ import annotations

import collections
import contextlib
import fractions
import math
import os
import signal
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference
import specverify
from specverify import dtypes
from specverify.engine.sampling import SamplingParams
from specverify import ops
from specverify.models import TargetModel
from specverify.platform import ENV_VAR, ProfileUnavailable, get_profile, native_platform, resolve
from specverify.protocol import Capacity, MalformedMessage, MessageWriter, pack_header, read_message, unpack_header
from specverify.protocol import transport
from specverify.protocol.transport import (RingConsumer, RingExists, RingNotFound, RingProducer, RingSpec,
                                           RingUnavailable, TransportError, discard_ring)

def absent_cuda_device() -> str:
    """A CUDA device this machine lacks: "cuda" where torch sees no GPU (a CPU box, a CPU-only
    build), else the index one past torch.cuda.device_count() (a GPU runner)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return "cuda" if count == 0 else f"cuda:{count}"


def absent_profile() -> str:
    """A GPU profile whose device this machine lacks: "rocm" unless this is a ROCm box."""
    return "cuda" if native_platform() == "rocm" else "rocm"


EXAMPLES = 100
SWEEP = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
HANG_S = 3.0
V = 389          # tiny vocab
MAX_CONTEXT = 512


# ------------------------------------------------------------------------------------------
# bad values, each tagged with the class it must raise


class Hung(Exception):
    """A call that did not return within HANG_S seconds."""


@contextlib.contextmanager
def hang_guard(seconds: float = HANG_S):
    """Raise Hung in this (main) thread if the body runs longer than `seconds`."""
    def fire(signum, frame):
        raise Hung(f"no answer within {seconds} s")
    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def typed(error, strategy):
    return st.tuples(st.just(error), strategy)


# Not an int (and not None): bools, floats (integral ones included), digit strings, containers...
NOT_INT = st.one_of(
    st.booleans(), st.just(np.bool_(True)),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([2.0, 1.7, 2.5, -0.0, 1e300]),
    st.text(max_size=3), st.sampled_from(["3", "1", ""]),
    st.lists(st.integers(0, 3), max_size=2), st.just({"a": 1}), st.just(1 + 2j),
    st.just(fractions.Fraction(3, 2)), st.just(np.float64(2.0)), st.just(torch.tensor(2)),
)
# Not a real number (and not None).
NOT_REAL = st.one_of(st.booleans(), st.just(np.bool_(False)), st.text(max_size=3), st.sampled_from(["0.5", "nan"]),
                     st.lists(st.floats(0, 1), max_size=2), st.just(1 + 0j), st.just(torch.tensor(0.5)))
NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf, np.float64("nan"), np.float32("inf")])


def bad_int(lo=None, hi=None, *, none_ok: bool = False):
    """Tagged bad values for an int argument in [lo, hi]."""
    parts = [typed(TypeError, NOT_INT)]
    if not none_ok:
        parts.append(typed(TypeError, st.none()))
    if lo is not None:
        parts.append(typed(ValueError, st.one_of(st.integers(max_value=lo - 1), st.just(np.int64(lo - 1)))))
    if hi is not None:
        parts.append(typed(ValueError, st.one_of(st.integers(min_value=hi + 1), st.just(np.int32(hi + 1))
                                                 if hi + 1 < 2**31 else st.just(hi + 1))))
    return st.one_of(parts)


def bad_real(lo=None, hi=None, *, lo_open=False, hi_open=False, none_ok: bool = False, extra=(),
             tensor_ok: bool = False):
    """Tagged bad values for a finite real argument in the interval (tensor_ok: a tensor is valid)."""
    not_real = NOT_REAL.filter(lambda v: not isinstance(v, torch.Tensor)) if tensor_ok else NOT_REAL
    parts = [typed(TypeError, not_real), typed(ValueError, NON_FINITE)]
    if not none_ok:
        parts.append(typed(TypeError, st.none()))
    if lo is not None:
        below = st.floats(max_value=lo, exclude_max=not lo_open, allow_nan=False, allow_infinity=False)
        parts.append(typed(ValueError, below))
    if hi is not None:
        above = st.floats(min_value=hi, exclude_min=not hi_open, allow_nan=False, allow_infinity=False)
        parts.append(typed(ValueError, above))
    if extra:
        parts.append(typed(ValueError, st.sampled_from(list(extra))))
    return st.one_of(parts)


def bad_choice(allowed, *, none_ok: bool = False):
    parts = [typed(ValueError, st.text(max_size=8).filter(lambda s: s not in allowed)),
             typed(TypeError, st.one_of(st.integers(), st.booleans(), st.floats(), st.just(b"eagle"),
                                        st.just(torch.float32)))]
    if not none_ok:
        parts.append(typed(TypeError, st.none()))
    return st.one_of(parts)


BAD_TOKEN = st.one_of(
    typed(TypeError, st.one_of(st.booleans(), st.floats(allow_nan=True), st.sampled_from([1.7, 1.0, 2.0]),
                               st.text(max_size=2), st.none(), st.just(np.float64(3.0)), st.just(torch.tensor(3)))),
    typed(ValueError, st.one_of(st.integers(max_value=-1), st.integers(min_value=V))),
)


@st.composite
def bad_prompts(draw):
    """A prompt list broken in one place: type, nesting, emptiness or a token id."""
    kind = draw(st.sampled_from(["token", "flat", "not-a-list", "row-not-a-list", "empty", "empty-row"]))
    rows = draw(st.lists(st.lists(st.integers(0, V - 1), min_size=1, max_size=4), min_size=1, max_size=3))
    if kind == "token":
        error, value = draw(BAD_TOKEN)
        r = draw(st.integers(0, len(rows) - 1))
        rows[r].insert(draw(st.integers(0, len(rows[r]))), value)
        return error, rows
    if kind == "flat":
        return TypeError, rows[0]
    if kind == "not-a-list":
        return TypeError, draw(st.one_of(st.text(max_size=4), st.integers(), st.none(), st.just(torch.tensor(rows[0])),
                                         st.just({0: rows[0]})))
    if kind == "row-not-a-list":
        rows[draw(st.integers(0, len(rows) - 1))] = draw(st.one_of(st.integers(0, 5), st.text(max_size=3), st.none(),
                                                                   st.just(torch.tensor([1, 2]))))
        return TypeError, rows
    if kind == "empty":
        return ValueError, []
    rows[draw(st.integers(0, len(rows) - 1))] = []
    return ValueError, rows


@st.composite
def bad_budgets(draw):
    """max_new_tokens broken: a bad int, or a list of the wrong length or with a bad entry."""
    kind = draw(st.sampled_from(["scalar", "scalar", "length", "entry"]))
    if kind == "scalar":
        return draw(bad_int(1, MAX_CONTEXT - 3))
    if kind == "length":
        return ValueError, draw(st.lists(st.integers(1, 4), min_size=2, max_size=4))   # one prompt
    error, value = draw(bad_int(1, MAX_CONTEXT - 3))
    return error, [value]


# ------------------------------------------------------------------------------------------
# the sweep machinery


OUTCOMES: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


def classify(call, expected: type, names: tuple[str, ...]) -> str:
    """Run `call`; return the outcome: 'ok' or what went wrong."""
    try:
        with hang_guard():
            call()
    except Hung:
        return "HUNG"
    except expected as e:
        text = str(e)
        if not any(n in text for n in names):
            return f"UNNAMED {type(e).__name__}: {text[:80]}"
        return "ok"
    except Exception as e:       # noqa: BLE001 - any other class is the finding
        return f"WRONG {type(e).__name__} (wanted {expected.__name__}): {str(e)[:80]}"
    return "ACCEPTED"


def sweep(entry: str, arguments: dict, invoke, data) -> None:
    """Draw an argument and a tagged bad value for it, call, record the outcome."""
    arg = data.draw(st.sampled_from(sorted(arguments)), label="argument")
    strategy, names = arguments[arg]
    expected, value = data.draw(strategy, label="bad value")
    outcome = classify(lambda: invoke(arg, value), expected, names)
    key = "ok" if outcome == "ok" else f"{arg}={value!r:.40}: {outcome}"
    OUTCOMES[entry][key if outcome == "ok" else "BAD"] += 1
    OUTCOMES[entry]["cases"] += 1
    assert outcome == "ok", f"{entry}({key})"


def report(entry: str) -> str:
    c = OUTCOMES[entry]
    return f"{entry}: {c['cases']} cases, {c['ok']} documented errors, {c['BAD']} other outcomes"


def run_sweep(entry, test):
    """Run the hypothesis test `test`; print and attach the entry point's outcome counts."""
    OUTCOMES.pop(entry, None)
    try:
        test()
    finally:
        print(report(entry))
    c = OUTCOMES[entry]
    assert c["cases"] >= EXAMPLES // 2 and c["BAD"] == 0, report(entry)


@pytest.fixture(scope="module")
def models():
    return specverify.build_models("tiny", seed=0, device="cpu")


# ------------------------------------------------------------------------------------------
# the sweeps, one per entry point


GENERATE_ARGS = {
    "prompts": (bad_prompts(), ("prompts",)),
    "max_new_tokens": (bad_budgets(), ("max_new_tokens",)),
    "temperature": (bad_real(0.0, extra=[1e-310, 5e-324, 1e-201]), ("temperature",)),
    "top_k": (bad_int(0), ("top_k",)),
    "top_p": (bad_real(0.0, 1.0, lo_open=True), ("top_p",)),
    "min_p": (bad_real(0.0, 1.0, hi_open=True), ("min_p",)),
    "seed": (bad_int(0, 2**32 - 1), ("seed",)),
    "eos_token_id": (bad_int(0, V - 1, none_ok=True), ("eos_token_id",)),
    "logprobs": (bad_int(0, V), ("logprobs",)),
    "page_size": (bad_int(1), ("page_size",)),
    "spec": (typed(TypeError, st.one_of(st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                                        st.text(max_size=5), st.integers(), st.booleans(),
                                        st.just(SamplingParams()))), ("spec",)),
    "platform": (st.one_of(typed(ValueError, st.text(max_size=8).filter(
        lambda s: s not in ("", "cpu", "cuda-emulated", "rocm-emulated"))),
        typed(TypeError, st.one_of(st.integers(), st.booleans(), st.floats(), st.just(b"cpu")))), ("platform",)),
}


def test_sweep_generate(models):
    base = dict(max_new_tokens=2, temperature=0.7, seed=1)

    @given(data=st.data())
    @SWEEP
    def inner(data):
        def invoke(arg, value):
            kwargs = dict(base, **{arg: value}) if arg != "prompts" else dict(base)
            prompts = value if arg == "prompts" else [[1, 2, 3]]
            specverify.generate(models, prompts, **kwargs)
        sweep("generate", GENERATE_ARGS, invoke, data)
    run_sweep("generate", inner)


def test_sweep_generate_speculative(models):
    """The same arguments with spec= set: the speculative path validates the same way."""
    spec = specverify.SpecConfig(num_steps=2, topk=2, num_draft_tokens=3)
    args = {k: v for k, v in GENERATE_ARGS.items() if k not in ("spec", "page_size")}

    @given(data=st.data())
    @SWEEP
    def inner(data):
        def invoke(arg, value):
            kwargs = dict(max_new_tokens=2, temperature=0.7, seed=1, spec=spec)
            if arg != "prompts":
                kwargs[arg] = value
            specverify.generate(models, value if arg == "prompts" else [[1, 2, 3]], **kwargs)
        sweep("generate(spec=...)", args, invoke, data)
    run_sweep("generate(spec=...)", inner)


BUILD_ARGS = {
    "preset": (bad_choice(("tiny", "small")), ("preset",)),
    "seed": (bad_int(0, 2**32 - 1), ("seed",)),
    "hybrid": (typed(TypeError, st.one_of(st.integers(), st.text(max_size=3), st.none(), st.floats())), ("hybrid",)),
    "compute_dtype": (bad_choice(dtypes.COMPUTE_DTYPES), ("compute_dtype",)),
    "logits_dtype": (bad_choice(dtypes.LOGITS_DTYPES), ("logits_dtype",)),
    "logits_scale": (bad_real(0.0, 3.4028234663852886e38, lo_open=True, none_ok=True, extra=[1e-50, 1e39]), ("logits_scale",)),
    "logits_scale_mode": (bad_choice(dtypes.SCALE_MODES), ("logits_scale_mode",)),
    "platform": (GENERATE_ARGS["platform"][0], ("platform",)),
    "device": (st.one_of(typed(ValueError, st.sampled_from(["gpu", "meta", "xla", "cpux", "", "mps", "xpu", "hip",
                                                            "cuda:-1", torch.device("meta")])),
                         # absent: ProfileUnavailable, a ValueError
                         typed(ValueError, st.sampled_from([absent_cuda_device(), torch.device(absent_cuda_device()),
                                                            f"cuda:{max(torch.cuda.device_count(), 7)}"])),
                         typed(TypeError, st.one_of(st.integers(), st.floats(), st.booleans(), st.just(b"cpu")))),
               ("device",)),
}


def test_sweep_build_models():
    @given(data=st.data())
    @SWEEP
    def inner(data):
        sweep("build_models", BUILD_ARGS,
              lambda arg, value: specverify.build_models(**{"preset": "tiny", "device": "cpu", arg: value}), data)
    run_sweep("build_models", inner)


SPEC_ARGS = {
    "algorithm": (bad_choice(("eagle", "naive_eagle")), ("algorithm",)),
    "num_steps": (bad_int(1, none_ok=True), ("num_steps",)),     # None: the algorithm's default
    "topk": (bad_int(1), ("topk",)),
    "num_draft_tokens": (st.one_of(typed(TypeError, NOT_INT), typed(ValueError, st.integers(max_value=1)),
                                   typed(ValueError, st.integers(min_value=8))), ("num_draft_tokens",)),
    "page_size": (bad_int(1), ("page_size",)),
    "cuda_graph": (typed(TypeError, st.one_of(st.integers(), st.text(max_size=3), st.none())), ("cuda_graph",)),
    "naive_sampling": (bad_choice(("exact", "inexact_shortcut")), ("naive_sampling",)),
}


def test_sweep_spec_config():
    @given(data=st.data())
    @SWEEP
    def inner(data):
        def invoke(arg, value):
            kwargs = dict(num_steps=3, topk=2, num_draft_tokens=5)
            kwargs[arg] = value
            specverify.SpecConfig(**kwargs)
        sweep("SpecConfig", SPEC_ARGS, invoke, data)
    run_sweep("SpecConfig", inner)


def test_sweep_sampling_params_and_platform():
    args = {
        "temperature": GENERATE_ARGS["temperature"], "top_k": GENERATE_ARGS["top_k"],
        "top_p": GENERATE_ARGS["top_p"], "min_p": GENERATE_ARGS["min_p"],
        "get_profile": (GENERATE_ARGS["platform"][0], ("platform",)),
        "resolve": (GENERATE_ARGS["platform"][0], ("platform",)),
    }

    @given(data=st.data())
    @SWEEP
    def inner(data):
        def invoke(arg, value):
            if arg == "get_profile":
                get_profile(value)
            elif arg == "resolve":
                resolve(value)
            else:
                SamplingParams(**{arg: value})
        sweep("SamplingParams/get_profile", args, invoke, data)
    run_sweep("SamplingParams/get_profile", inner)


SMALL = Capacity(max_bsz=4, k=3, max_draft_tokens=2)


def _write_kwargs():
    return dict(msg_id=1, keep_running=True, flag=3, counts=np.array([1, 2]),
                token_ids=np.zeros((2, 2, 2), np.int32), logprobs=np.zeros((2, 2, 2), np.float32),
                ranks=np.ones((2, 2), np.int32))


PROTOCOL_ARGS = {
    "Capacity.max_bsz": (bad_int(1, 2**31 - 1), ("max_bsz",)),
    "Capacity.k": (bad_int(0, 65534), ("k",)),
    "Capacity.max_draft_tokens": (bad_int(1, 2**31 - 1), ("max_draft_tokens",)),
    "pack_header.message_flag": (bad_int(0, 255), ("message_flag",)),
    "pack_header.max_num_logprobs": (bad_int(1, SMALL.k + 1), ("max_num_logprobs",)),
    "unpack_header.value": (st.one_of(typed(TypeError, NOT_INT), typed(MalformedMessage, st.one_of(
        st.integers(max_value=-1), st.integers(min_value=2**24), st.integers(0, 255),
        st.integers(SMALL.k + 2, 0xFFFF).map(lambda w: (w << 8) | 3)))), ("header", "meta[1]")),
    "write.msg_id": (bad_int(1, 2**31 - 1), ("msg_id",)),
    "write.flag": (bad_int(0, 255), ("message_flag",)),
    "write.keep_running": (typed(TypeError, st.one_of(st.integers(), st.none(), st.text(max_size=2))),
                           ("keep_running",)),
    "read_message.buf": (typed(TypeError, st.one_of(st.text(max_size=8), st.integers(), st.none(),
                                                     st.lists(st.integers(0, 255), max_size=4))), ("buf",)),
    "read_message.capacity": (typed(TypeError, st.one_of(st.integers(), st.none(), st.tuples(st.integers()))),
                              ("capacity",)),
}


def test_sweep_protocol():
    good = bytes(MessageWriter(SMALL).write(**_write_kwargs()))

    @given(data=st.data())
    @SWEEP
    def inner(data):
        def invoke(arg, value):
            where, name = arg.split(".")
            if where == "Capacity":
                Capacity(**{name: value})
            elif where == "pack_header":
                kw = dict(message_flag=3, max_num_logprobs=1)
                kw[name] = value
                pack_header(kw["message_flag"], kw["max_num_logprobs"], capacity=SMALL)
            elif where == "unpack_header":
                unpack_header(value, capacity=SMALL)
            elif where == "write":
                MessageWriter(SMALL).write(**dict(_write_kwargs(), **{name: value}))
            elif name == "buf":
                read_message(value, capacity=SMALL)
            else:
                read_message(good, capacity=value)
        sweep("protocol", PROTOCOL_ARGS, invoke, data)
    run_sweep("protocol", inner)


@given(data=st.data())
@settings(max_examples=150, derandomize=True, deadline=None, database=None)
def test_fuzzed_messages_decode_or_raise_malformed(data):
    """Random edits of a valid message, from several capacities' senders to one receiver:
    a correct decode or MalformedMessage, nothing else."""
    sender = data.draw(st.sampled_from([SMALL, Capacity(max_bsz=4, k=1, max_draft_tokens=3),
                                        Capacity(max_bsz=3, k=3, max_draft_tokens=2)]))
    kwargs = _write_kwargs()
    kwargs["token_ids"] = kwargs["token_ids"][:, :, :min(2, sender.k + 1)]
    kwargs["logprobs"] = kwargs["logprobs"][:, :, :min(2, sender.k + 1)]
    buf = bytearray(MessageWriter(sender).write(**kwargs))
    for _ in range(data.draw(st.integers(0, 3))):
        how = data.draw(st.sampled_from(["byte", "cut", "grow"]))
        if how == "byte" and buf:
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
        elif how == "cut":
            del buf[data.draw(st.integers(0, len(buf))):]
        else:
            buf += bytes(data.draw(st.integers(1, 20)))
    try:
        msg = read_message(bytes(buf), capacity=SMALL)
    except MalformedMessage:
        OUTCOMES["read_message fuzz"]["MalformedMessage"] += 1
        return
    OUTCOMES["read_message fuzz"]["decoded"] += 1
    assert sender == SMALL, "a message of another capacity was decoded"
    assert msg.bsz == 2 and msg.width == 2


# Not a name /dev/shm can hold: empty, a '/' inside, a NUL (the OS would cut the name there), not
# ASCII, longer than NAME_MAX.
BAD_RING_NAMES = ["", "/", "//", "a/b", "/a/b", "a\0b", "\0", "ring\n", "é", "x" * 256, "/" + "x" * 256]

TRANSPORT_ARGS = {
    "RingSpec.slots": (bad_int(1), ("slots",)),
    "RingSpec.max_message_bytes": (bad_int(1), ("max_message_bytes",)),
    "receive.timeout": (bad_real(0.0), ("timeout",)),
    "send.timeout": (bad_real(0.0), ("timeout",)),
    "close.linger": (bad_real(0.0), ("linger",)),
    "attach.name": (st.one_of(typed(TypeError, st.one_of(st.integers(), st.none(), st.just(b"ring"))),
                              typed(ValueError, st.sampled_from(BAD_RING_NAMES))), ("name",)),
    "create.name": (st.one_of(typed(TypeError, st.one_of(st.integers(), st.just(b"ring"), st.just(["r"]))),
                              typed(ValueError, st.sampled_from(BAD_RING_NAMES))), ("name",)),
    "discard_ring.name": (st.one_of(typed(TypeError, st.one_of(st.integers(), st.none(), st.just(b"ring"))),
                                    typed(ValueError, st.sampled_from(BAD_RING_NAMES))), ("name",)),
    "attach.producer_pid": (st.one_of(typed(TypeError, NOT_INT), typed(ValueError, st.integers(max_value=0))),
                            ("producer_pid",)),
    "send.payload": (typed(TypeError, st.one_of(st.text(max_size=3), st.integers(), st.none())), ("payload",)),
}


def test_sweep_transport():
    # One full ring (send must wait) with an idle consumer (receive must wait): a NaN or infinite
    # deadline accepted here hangs, and the hang guard turns that into a failure.
    with RingProducer.create(RingSpec(1, 16)) as producer:
        producer.send(b"full")
        with RingConsumer.attach(producer.name) as consumer:
            @given(data=st.data())
            @SWEEP
            def inner(data):
                def invoke(arg, value):
                    where, name = arg.split(".")
                    if where == "RingSpec":
                        RingSpec(**dict(dict(slots=1, max_message_bytes=16), **{name: value}))
                    elif arg == "receive.timeout":
                        # drain the one message first so that receive has to wait
                        consumer._position = consumer._words[8]
                        consumer.receive(timeout=value)
                    elif arg == "send.timeout":
                        producer.send(b"x", timeout=value)
                    elif arg == "send.payload":
                        producer.send(value, timeout=0.0)
                    elif arg == "close.linger":
                        producer.close(linger=value)
                    elif arg == "create.name":
                        RingProducer.create(RingSpec(1, 16), name=value).close(linger=0.0)   # (if accepted)
                    elif arg == "discard_ring.name":
                        discard_ring(value)
                    elif name == "name":
                        RingConsumer.attach(value)
                    else:
                        RingConsumer.attach(producer.name, producer_pid=value)
                sweep("transport", TRANSPORT_ARGS, invoke, data)
            run_sweep("transport", inner)


def test_sweep_dtypes():
    x = torch.linspace(-3, 3, 8).reshape(2, 4)
    args = {
        "quantize_fp8.scale": (bad_real(0.0, lo_open=True, extra=[1e-50, 1e39], tensor_ok=True), ("scale",)),
        "dequantize_fp8.scale": (bad_real(0.0, lo_open=True, tensor_ok=True), ("scale",)),
        "logits_scale.static_scale": (bad_real(0.0, lo_open=True), ("static_scale",)),
        "logits_scale.mode": (bad_choice(dtypes.SCALE_MODES), ("mode",)),
        "to_logits_dtype.scale_mode": (bad_choice(dtypes.SCALE_MODES), ("mode",)),
    }

    @given(data=st.data())
    @SWEEP
    def inner(data):
        def invoke(arg, value):
            fn, name = arg.split(".")
            if fn == "quantize_fp8":
                dtypes.quantize_fp8(x, "float8_e4m3fn", value)
            elif fn == "dequantize_fp8":
                dtypes.dequantize_fp8(dtypes.quantize_fp8(x, "float8_e4m3fn", 1.0), value)
            elif fn == "logits_scale":
                kw = dict(mode="static", static_scale=1.0)
                kw[name] = value
                dtypes.logits_scale(x, "float8_e4m3fn", **kw)
            else:
                dtypes.to_logits_dtype(x, "float8_e4m3fn", scale_mode=value)
        sweep("dtypes", args, invoke, data)
    run_sweep("dtypes", inner)


# ------------------------------------------------------------------------------------------
# the exact cases of issue 7, each a named case


def _models_e4m3fn():
    return specverify.build_models("tiny", seed=0, device="cpu", logits_dtype="float8_e4m3fn")


def _spec(**kw):
    return specverify.SpecConfig(**kw)


def _gen(models, prompts=((1, 2, 3),), **kw):
    kw.setdefault("max_new_tokens", 2)
    return specverify.generate(models, [list(p) for p in prompts] if prompts and isinstance(prompts[0], tuple)
                               else prompts, **kw)


def _ring_receive_nan():
    with RingProducer.create(RingSpec(2, 16)) as producer, RingConsumer.attach(producer.name) as consumer:
        consumer.receive(timeout=math.nan)


def _ring_send_nan():
    with RingProducer.create(RingSpec(1, 16)) as producer, RingConsumer.attach(producer.name):
        producer.send(b"a")
        producer.send(b"b", timeout=math.nan)


def _second_attach():
    with RingProducer.create(RingSpec(2, 16)) as producer, RingConsumer.attach(producer.name):
        RingConsumer.attach(producer.name)


def _capacity_mismatch():
    sender, receiver = Capacity(max_bsz=512, k=20, max_draft_tokens=6), Capacity(max_bsz=512, k=63, max_draft_tokens=2)
    kw = _write_kwargs()
    read_message(bytes(MessageWriter(sender).write(**kw)), capacity=receiver)


def _non_contiguous_garbage():
    # A strided view of *garbage* bytes must be a MalformedMessage (not numpy's plain ValueError).
    read_message(np.arange(400, dtype=np.uint8)[::2], capacity=SMALL)


def _fp8_logits(dtype: str) -> torch.Tensor:
    return dtypes.quantize_fp8(torch.linspace(-3, 3, 2 * 8).reshape(2, 8), dtype, 1.0)


@contextlib.contextmanager
def _env(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def _profile_from_env_absent():
    with _env(ENV_VAR, absent_profile()):
        get_profile()


def _faked_one_gpu(device: str):
    """build_models on a machine made to report exactly one CUDA device (the index check of a
    real GPU runner, exercised on a CPU box too)."""
    with mock.patch.object(torch.cuda, "is_available", return_value=True), \
            mock.patch.object(torch.cuda, "device_count", return_value=1):
        specverify.build_models("tiny", device=device)


def _missing_ring_name() -> str:
    return f"specverify-absent-{os.getpid()}"


def _attach_after_close():
    producer = RingProducer.create(RingSpec(2, 16))
    producer.close(linger=0.0)
    RingConsumer.attach(producer.name)


def _create_taken_name():
    with RingProducer.create(RingSpec(2, 16)) as producer:
        RingProducer.create(RingSpec(2, 16), name=producer.name).close(linger=0.0)   # (if accepted)


def _create_too_large():
    # 2**60 bytes: more than any /dev/shm holds and any address space maps.
    RingProducer.create(RingSpec(1, 2**60)).close(linger=0.0)                        # (if accepted)


def _os_refuses(error: OSError, call):
    with mock.patch.object(transport, "SharedMemory", side_effect=error):
        call()


def _attach_empty_segment():
    import _posixshmem
    name = f"specverify-empty-{os.getpid()}"
    os.close(_posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600))
    try:
        RingConsumer.attach(name)
    finally:
        _posixshmem.shm_unlink("/" + name)


NAMED_CASES = {
    # silently accepted before
    "token-id-float-1.7": (lambda m: _gen(m, [[1.7, 2]]), TypeError, r"prompts\[0\]\[0\] must be an int"),
    "token-id-bool": (lambda m: _gen(m, [[True, 2]]), TypeError, r"prompts\[0\]\[0\] must be an int"),
    "token-id-str": (lambda m: _gen(m, [["3"]]), TypeError, r"prompts\[0\]\[0\] must be an int"),
    "max-new-tokens-2.7": (lambda m: _gen(m, max_new_tokens=2.7), TypeError, "max_new_tokens must be an int"),
    "max-new-tokens-str": (lambda m: _gen(m, max_new_tokens="3"), TypeError, "max_new_tokens must be an int"),
    "top-k-nan": (lambda m: _gen(m, temperature=1.0, top_k=math.nan), TypeError, "top_k must be an int"),
    "temperature-inf": (lambda m: _gen(m, temperature=math.inf), ValueError, "temperature must be a finite"),
    "spec-topk-2.0": (lambda m: _spec(topk=2.0, num_draft_tokens=4), TypeError, "topk must be an int"),
    "spec-topk-True": (lambda m: _spec(topk=True, num_steps=1), TypeError, "topk must be an int"),
    "spec-num-steps-2.5": (lambda m: _spec(num_steps=2.5), TypeError, "num_steps must be an int"),
    "spec-page-size-2.5": (lambda m: _spec(page_size=2.5), TypeError, "page_size must be an int"),
    "platform-bogus-target-only": (lambda m: _gen(m, platform="bogus"), ValueError, "platform profile 'bogus' is unknown"),
    "rocm-profile-e4m3fn-build": (lambda m: specverify.build_models("tiny", logits_dtype="float8_e4m3fn",
                                                                    platform="rocm-emulated"),
                                  ValueError, "not an FP8 format of platform profile 'rocm-emulated'"),
    "rocm-profile-e4m3fn-generate": (lambda m: _gen(_models_e4m3fn(), platform="rocm-emulated"),
                                     ValueError, "not an FP8 format of platform profile 'rocm-emulated'"),
    "scale-mode-batch": (lambda m: specverify.build_models("tiny", device="cpu", logits_scale_mode="batch"),
                         ValueError, "logits_scale_mode must be one of"),
    "scale-negative": (lambda m: specverify.build_models("tiny", device="cpu", logits_scale=-1.0),
                       ValueError, r"logits_scale must be in \(0, "),
    "scale-nan": (lambda m: specverify.build_models("tiny", device="cpu", logits_scale=math.nan),
                  ValueError, "logits_scale must be a finite number"),
    # deep inside before
    "spec-dict": (lambda m: _gen(m, spec={"num_steps": 2}), TypeError, "spec must be None or a SpecConfig"),
    "spec-str": (lambda m: _gen(m, spec="eagle"), TypeError, "spec must be None or a SpecConfig"),
    "seed-float": (lambda m: _gen(m, temperature=1.0, seed=1.5), TypeError, "seed must be an int"),
    "build-seed-float": (lambda m: specverify.build_models("tiny", seed=0.5), TypeError, "seed must be an int"),
    "logprobs-1.5": (lambda m: _gen(m, logprobs=1.5), TypeError, "logprobs must be an int"),
    "flat-prompt-list": (lambda m: _gen(m, [1, 2, 3]), TypeError, r"prompts\[0\] must be a list of token ids.*flat"),
    # hung before
    "receive-timeout-nan": (lambda m: _ring_receive_nan(), ValueError, "timeout must be a finite number"),
    "send-timeout-nan": (lambda m: _ring_send_nan(), ValueError, "timeout must be a finite number"),
    # wrong class before
    "read-message-non-contiguous": (lambda m: _non_contiguous_garbage(), MalformedMessage, "meta"),
    # garbage before
    "temperature-subnormal": (lambda m: _gen(m, [[1, 2, 3]], max_new_tokens=4, temperature=1e-310, seed=3),
                              ValueError, r"temperature must be 0 \(greedy\) or >= 1e-200"),
    "temperature-subnormal-speculative": (lambda m: _gen(m, [[1, 2, 3]], max_new_tokens=4, temperature=1e-310,
                                                         seed=3, spec=_spec(num_steps=2, topk=2, num_draft_tokens=3)),
                                          ValueError, r"temperature must be 0 \(greedy\) or >= 1e-200"),
    "temperature-subnormal-reference": (lambda m: reference.generate(m, [[1, 2, 3]], max_new_tokens=4,
                                                                     temperature=1e-310, seed=3),
                                        ValueError, r"temperature: must be >= 0, and either 0 \(greedy\) or a finite number >= 1e-200"),
    "capacity-mismatch-same-length": (lambda m: _capacity_mismatch(), MalformedMessage, "capacity mismatch"),
    "second-attach-same-process": (lambda m: _second_attach(), TransportError, "already has a consumer in this process"),
    # what the environment lacks (issue 21 item 7): torch's AssertionError / a bare OSError before
    "device-cuda-absent": (lambda m: specverify.build_models("tiny", device=absent_cuda_device()),
                           ProfileUnavailable, r"device 'cuda(:\d+)?' is absent: this machine has"),
    "device-torch-device-absent": (lambda m: specverify.build_models("tiny", device=torch.device(absent_cuda_device())),
                                   ProfileUnavailable, r"device 'cuda(:\d+)?' is absent"),
    "device-cuda-absent-named-platform": (lambda m: specverify.build_models("tiny", platform="cpu",
                                                                            device=absent_cuda_device()),
                                          ProfileUnavailable, r"device 'cuda(:\d+)?' is absent"),
    "device-cuda-index-past-count": (lambda m: _faked_one_gpu("cuda:1"), ProfileUnavailable,
                                     r"device 'cuda:1' is absent: this machine has 1 CUDA device\(s\), indices 0 to 0"),
    "device-target-model-absent": (lambda m: TargetModel(m.config, m.target_weights, absent_cuda_device()),
                                   ProfileUnavailable, r"device 'cuda(:\d+)?' is absent"),
    "device-mps": (lambda m: specverify.build_models("tiny", device="mps"), ValueError,
                   r"device must be a 'cpu' or 'cuda' device .*got 'mps'"),
    "device-meta": (lambda m: specverify.build_models("tiny", device=torch.device("meta")), ValueError,
                    r"device must be a 'cpu' or 'cuda' device"),
    "device-bogus": (lambda m: specverify.build_models("tiny", device="bogus"), ValueError,
                     r"device 'bogus' is not a torch device"),
    "device-int": (lambda m: specverify.build_models("tiny", device=0), TypeError,
                   r"device must be None, a str or a torch.device, got int"),
    "platform-device-absent": (lambda m: specverify.build_models("tiny", platform=absent_profile()),
                               ProfileUnavailable, r"platform: platform profile '(rocm|cuda)' needs a \w+ device"),
    "platform-env-device-absent": (lambda m: _profile_from_env_absent(), ProfileUnavailable,
                                   rf"{ENV_VAR}: platform profile '(rocm|cuda)' needs a \w+ device"),
    "select-topk-e4m3fn-rocm-emulated": (lambda m: ops.select_draft_topk(_fp8_logits("float8_e4m3fn"), 2,
                                                                         platform="rocm-emulated"),
                                         ValueError, r"logits dtype 'float8_e4m3fn' is not an FP8 format of platform "
                                                     r"profile 'rocm-emulated' \(it serves \('float8_e4m3fnuz', "
                                                     r"'float8_e5m2fnuz'\)\)"),
    "select-topk-fnuz-cuda-emulated-fast-path": (lambda m: ops.select_draft_topk(_fp8_logits("float8_e5m2fnuz"), 1,
                                                                                 platform=get_profile("cuda-emulated")),
                                                 ValueError, r"logits dtype 'float8_e5m2fnuz' is not an FP8 format of "
                                                             r"platform profile 'cuda-emulated'"),
    "ring-attach-missing": (lambda m: RingConsumer.attach(_missing_ring_name()), RingNotFound,
                            r"ring name 'specverify-absent-\d+': no such ring"),
    "ring-attach-after-close": (lambda m: _attach_after_close(), RingNotFound, r"ring name '.*': no such ring"),
    "ring-create-name-taken": (lambda m: _create_taken_name(), RingExists, r"ring name '.*' is taken"),
    "ring-create-too-large": (lambda m: _create_too_large(), RingUnavailable,
                              r"spec RingSpec\(slots=1, .*\) needs \d+ bytes of shared memory .* but "),
    "ring-attach-permission": (lambda m: _os_refuses(PermissionError(13, "Permission denied"),
                                                     lambda: RingConsumer.attach("specverify-theirs")),
                               RingUnavailable, r"ring name 'specverify-theirs': permission denied"),
    "ring-create-os-refuses": (lambda m: _os_refuses(OSError(12, "Cannot allocate memory"),
                                                     lambda: RingProducer.create(RingSpec(1, 16), name="specverify-x")),
                               RingUnavailable, r"ring name 'specverify-x': the OS refused .*Cannot allocate memory"),
    "ring-attach-empty-segment": (lambda m: _attach_empty_segment(), TransportError,
                                  r"shared memory 'specverify-empty-\d+' is not a specverify ring"),
    "ring-name-slash": (lambda m: RingConsumer.attach("a/b"), ValueError, r"name must be printable ASCII without '/'"),
    "ring-name-nul": (lambda m: RingProducer.create(RingSpec(1, 16), name="ring\0x").close(linger=0.0), ValueError,
                      r"name must be printable ASCII"),
    "ring-name-too-long": (lambda m: RingConsumer.attach("x" * 256), ValueError,
                           r"name must be at most 255 characters .*got 256"),
    "ring-create-name-int": (lambda m: RingProducer.create(RingSpec(1, 16), name=7), TypeError,
                             r"name must be None \(a free name is picked\) or a str, got int"),
    "ring-discard-name-int": (lambda m: discard_ring(7), TypeError, r"name must be a str"),
}


@pytest.mark.parametrize("case", list(NAMED_CASES))
def test_named_case(case, models):
    call, error, match = NAMED_CASES[case]
    with hang_guard(10.0):
        with pytest.raises(error, match=match):
            call(models)


def test_absent_things_are_absent_here():
    """The named cases' absent device and profile really are absent on this machine, and a
    present device is accepted (the check refuses only what is missing)."""
    device = torch.device(absent_cuda_device())
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert count == 0 or device.index >= count
    assert absent_profile() not in specverify.platform.available_profiles()
    present = "cuda:0" if count else "cpu"
    assert specverify.platform.check_device(present) == torch.device(present)


def test_missing_ring_errors_are_os_errors_too():
    """RingNotFound / RingExists stay FileNotFoundError / FileExistsError (callers that caught the
    OS error keep working), and every ring error is a TransportError."""
    assert issubclass(RingNotFound, FileNotFoundError) and issubclass(RingExists, FileExistsError)
    assert all(issubclass(e, TransportError) and issubclass(e, OSError)
               for e in (RingUnavailable, RingNotFound, RingExists))
    assert discard_ring(_missing_ring_name()) is False


def test_smallest_temperature_samples_identically_on_both_sides(models):
    """At the documented minimum both implementations sample, and emit the same tokens."""
    kw = dict(max_new_tokens=4, temperature=1e-200, seed=3)
    got = specverify.generate(models, [[1, 2, 3]], **kw).tokens
    assert got == reference.generate(models, [[1, 2, 3]], **kw).tokens
    assert all(0 <= t < V for t in got[0])


def test_numpy_integers_are_ints(models):
    out = specverify.generate(models, [[np.int64(1), np.int32(2)]], max_new_tokens=np.int64(2), seed=np.uint32(1),
                              logprobs=np.int16(1))
    assert out.tokens == specverify.generate(models, [[1, 2]], max_new_tokens=2, seed=1, logprobs=1).tokens
    assert specverify.SpecConfig(num_steps=np.int64(2), topk=np.int32(1)).draft_tokens == 3


# ------------------------------------------------------------------------------------------
# a bad platform on the command line and in pytest: one line, no traceback

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("how", ["--platform", "SPECVERIFY_PLATFORM"])
def test_cli_bad_platform_is_one_line(how, monkeypatch):
    import subprocess
    import sys
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    env.pop("SPECVERIFY_PLATFORM", None)
    args = [sys.executable, "-m", "specverify", "demo"]
    if how == "--platform":
        args += ["--platform", "bogus"]
    else:
        env["SPECVERIFY_PLATFORM"] = "bogus"
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT, encoding="utf-8")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "'bogus' is unknown" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_pytest_bad_platform_env_is_a_usage_error(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("SPECVERIFY_PLATFORM", "bogus")
    pytester.makeconftest((ROOT / "conftest.py").read_text(encoding="utf-8"))
    pytester.makepyfile(test_sample="def test_plain():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in text and "Traceback" not in text
    result.stderr.fnmatch_lines(["ERROR: SPECVERIFY_PLATFORM='bogus': *platform profile 'bogus' is unknown*"])
