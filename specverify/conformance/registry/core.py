"""The registry's record types and the machinery every record shares.

An `OpSpec` names the op, its two callables (the optimized one takes a `SampleInput` and the
platform profile, the reference one the `SampleInput`; both return a dict of named outputs), its
input generators (named edge cases and seeded random samples, a hypothesis recipe), its error
inputs, the dtypes it supports per platform policy, and how each output compares. Differential and
property tests are generated from these records (specverify/conformance/suite.py). Expected
failures and skips are not part of a record: they are data, per platform profile, in the
project's tests/expectations/.

The conformance interface: `--sv-impl MODULE:OBJECT` (or `SPECVERIFY_IMPL=MODULE:OBJECT`) plugs a
third implementation into the same records. For every op, `object.<op name>(**sample.args)` is
called with the sample's arguments (torch tensors and plain values, as `SampleInput.summary` lists
them) and returns a dict holding every output named in the record's `compare` (array-likes; they
are converted with torch.as_tensor). An op the object lacks is skipped with a reason naming the
missing attribute. docs/conformance.md describes the interface; `specverify.conformance.adapters`
holds a numpy example and the engines' adapters.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Callable, Iterable

import numpy as np
import torch

from specverify import dtypes
from specverify.conformance.compare import assert_close
from specverify.validation import import_named

EXACT = "exact"        # integers equal; floats equal value for value (NaN matches NaN)
CLOSE = "close"        # by the tolerance table entry of OpSpec.tolerance_dtype
IMPL_ENV = "SPECVERIFY_IMPL"
SAMPLE_OPTION = "--sv-sample"
# Every op carries named edge cases of these kinds (tests/meta/test_registry.py checks it).
EDGE_KINDS = ("nan", "empty", "ulp", "boundary")
# Sample generators make their values with specverify/conformance/strategies.py's exact building blocks
# (integer draws, exact arithmetic, one rounding to the dtype): the op goldens store them, and a
# golden must be a pure function of the seed, the catalogue and the library versions
# (tests/meta/test_golden_portability.py runs the generators under several CPU instruction sets).
# A shape is data of this file, never a kernel's tuning constant (KV_BLOCK_SIZES below).


@dataclasses.dataclass(frozen=True)
class SampleInput:
    name: str
    args: dict
    seed: int = 0

    def summary(self) -> str:
        """Shapes and dtypes of the tensors, plain values as they are; never tensor contents."""
        parts = [f"{key}={_describe(value)}" for key, value in self.args.items()]
        return f"{self.name}(seed={self.seed}; {', '.join(parts)})"

    __repr__ = summary


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)}:{str(value.dtype).replace('torch.', '')}"
    if isinstance(value, np.ndarray):
        return f"{tuple(value.shape)}:np.{value.dtype}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_describe(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return f"[{len(value)} items]"
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes>"
    return repr(value)


@dataclasses.dataclass(frozen=True)
class ErrorInput:
    """A bad input: `call` runs the optimized op on it; it must raise `exc` with a message that
    matches `match` and names the argument `arg`. `pending` (a reason) marks a contract the op
    does not meet yet: the test is a strict xfail expecting `pending_raises`."""
    name: str
    call: Callable[[], Any]
    exc: type
    match: str
    arg: str
    pending: str | None = None
    pending_raises: type | None = None


@dataclasses.dataclass(frozen=True)
class OpSpec:
    name: str
    impl: Callable[[SampleInput, Any], dict]         # (sample, platform profile) -> outputs
    ref: Callable[[SampleInput], dict]
    samples: Callable[[str, int], Iterable[SampleInput]]   # (dtype, seed) -> edge + random samples
    recipe: Callable[[str], Any]                     # dtype -> hypothesis strategy of SampleInput
    errors: Callable[[], Iterable[ErrorInput]]
    dtypes: dict[str, tuple[str, ...]]               # platform policy -> dtype names
    compare: dict[str, str]                          # output name -> EXACT | CLOSE
    tolerance_dtype: str = "float32"
    platform_dependent: bool = True                  # False: run on the native profile only
    max_examples: int = 15                           # hypothesis examples per case (ci / dev)
    edge_exempt: tuple[tuple[str, str], ...] = ()    # (edge kind of EDGE_KINDS, reason it cannot apply)
    # The semantic conventions (specverify.conformance.conventions) `ref` takes as keywords: the
    # reference of an implementation that declares another value of one of them.
    conventions: tuple[str, ...] = ()
    uniforms: tuple[str, ...] = ()                   # the args holding uniforms (an engine drawing its own omits them)

    def __post_init__(self):
        validate_record(self)

    def dtypes_for(self, policy: str) -> tuple[str, ...]:
        return self.dtypes.get(policy, ())


POLICIES = ("cpu", "cuda", "rocm")


def validate_record(op: OpSpec) -> None:
    """Refuse a malformed record when it is built, with a message naming the field."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", op.name or ""):
        raise ValueError(f"op {op.name!r}: name must be snake_case (test ids join names with '-')")
    for field in ("impl", "ref", "samples", "recipe", "errors"):
        if not callable(getattr(op, field)):
            raise ValueError(f"op {op.name}: {field} must be callable")
    if not op.compare:
        raise ValueError(f"op {op.name}: compare names no output")
    bad = [m for m in op.compare.values() if m not in (EXACT, CLOSE)]
    if bad:
        raise ValueError(f"op {op.name}: unknown comparison {bad}")
    if op.tolerance_dtype not in dtypes.TOLERANCES:
        raise ValueError(f"op {op.name}: tolerance_dtype {op.tolerance_dtype!r} has no tolerance entry")
    if not op.dtypes:
        raise ValueError(f"op {op.name}: dtypes lists no platform")
    for policy, names in op.dtypes.items():
        if policy not in POLICIES:
            raise ValueError(f"op {op.name}: unknown platform policy {policy!r}; expected one of {POLICIES}")
        unknown = [d for d in names if d not in dtypes.DTYPES]
        if unknown:
            raise ValueError(f"op {op.name}: platform {policy} lists unknown dtypes {unknown}")
    if not isinstance(op.max_examples, int) or op.max_examples < 1:
        raise ValueError(f"op {op.name}: max_examples must be an int >= 1, got {op.max_examples!r}")
    for kind, reason in op.edge_exempt:
        if kind not in EDGE_KINDS or not reason:
            raise ValueError(f"op {op.name}: edge_exempt entry ({kind!r}, {reason!r}) needs a kind of "
                             f"{EDGE_KINDS} and a reason")


def on_device(value, device):
    """Move every tensor inside a sample's args (dicts and lists too) to `device` ("clone": copy
    each where it is)."""
    if isinstance(value, torch.Tensor):
        return value.clone() if device == "clone" else value.to(device)
    if isinstance(value, dict):
        return {k: on_device(v, device) for k, v in value.items()}
    if isinstance(value, list):
        return [on_device(v, device) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# The implementation under test: specverify, or a third one named by SPECVERIFY_IMPL


def load_impl(spec: str | None = None):
    """The object SPECVERIFY_IMPL=module:object names (None when unset)."""
    spec = os.environ.get(IMPL_ENV) if spec is None else spec
    if not spec:
        return None
    return import_named(spec, label=f"{IMPL_ENV}={spec!r}", example="specverify.conformance.adapters.example:IMPL")


_UNAVAILABLE: dict[int, str | None] = {}


def engine_missing(plugin) -> str | None:
    """Why a plugged-in implementation cannot run at all (its engine is not installed: the one line
    of the adapter's EngineMissing), or None. An adapter's optional `load()` imports the engine."""
    if plugin is None or not callable(getattr(plugin, "load", None)):
        return None
    if id(plugin) not in _UNAVAILABLE:
        from specverify.conformance.adapters import EngineMissing
        try:
            plugin.load()
            _UNAVAILABLE[id(plugin)] = None
        except EngineMissing as err:
            _UNAVAILABLE[id(plugin)] = str(err)
    return _UNAVAILABLE[id(plugin)]


def missing_op(plugin, op: OpSpec | str) -> str | None:
    """Why a plugged-in implementation cannot run `op` (None when it can)."""
    name = op if isinstance(op, str) else op.name
    if plugin is None:
        return None
    unavailable = engine_missing(plugin)
    if unavailable:
        return unavailable
    if callable(getattr(plugin, name, None)):
        return None
    who = getattr(plugin, "name", None) or os.environ.get(IMPL_ENV) or type(plugin).__name__
    return f"{who} has no attribute {name!r}: op not implemented"


def run_impl(op: OpSpec, sample: SampleInput, profile, plugin=None, outputs: str = "returned") -> dict:
    """The implementation under test on the profile's device; outputs come back to the CPU.
    plugin: a plugged-in object (its op gets the sample's args as keywords). outputs: its calling
    convention, "returned" (a dict of outputs) or "in_place" (outputs written into the arguments of
    the same name; a returned dict, if any, adds to them)."""
    moved = dataclasses.replace(sample, args=on_device(sample.args, profile.device))
    if plugin is not None and outputs == "in_place":
        # The engine writes into these: its own copies, never the sample the reference reads.
        moved = dataclasses.replace(moved, args=on_device(moved.args, "clone"))
    if plugin is None:
        out = op.impl(moved, profile)
    else:
        name = getattr(plugin, "name", type(plugin).__name__)
        out = getattr(plugin, op.name)(**moved.args)
        if outputs == "in_place":
            out = {**{k: moved.args[k] for k in op.compare if k in moved.args}, **(out or {})}
        if not isinstance(out, dict):
            raise AssertionError(f"{name} op {op.name} returned {type(out).__name__}, expected a dict "
                                 f"with the outputs {sorted(op.compare)}")
        missing = sorted(set(op.compare) - set(out))
        if missing:
            raise AssertionError(f"{name} op {op.name} returned no output {missing}")
        out = {k: (v if v is None or isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v)))
               for k, v in out.items()}
    return {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in out.items()}


def select_samples(op: OpSpec, dtype: str, seed: int, name: str | None = None) -> list[tuple[int, SampleInput]]:
    """(index, sample) of the op's samples; only the one called `name` when a name is given."""
    found = list(enumerate(op.samples(dtype, seed)))
    if name is None:
        return found
    return [(i, s) for i, s in found if s.name == name]


def replay_command(test: str, sample: SampleInput | None = None) -> str:
    """A command that re-runs one test (`test`: a path::name[id] node id; the seed comes from the
    test's name, so it is the same) or just one of its samples."""
    impl = os.environ.get(IMPL_ENV)
    option = f" --sv-impl {impl}" if impl else ""
    only = f" {SAMPLE_OPTION}='{sample.name}'" if sample is not None else ""
    return f"python -m pytest '{test}'{option}{only}"


# ---------------------------------------------------------------------------------------------
# shared by the records

ALL_LOGITS = dtypes.LOGITS_DTYPES
FLOAT_LOGITS = ("float32", "bfloat16", "float16")


def _per_policy(fp8_for_cuda, fp8_for_rocm):
    return {"cpu": FLOAT_LOGITS + dtypes.FP8_DTYPES, "cuda": FLOAT_LOGITS + fp8_for_cuda,
            "rocm": FLOAT_LOGITS + fp8_for_rocm}


LOGITS_BY_POLICY = _per_policy(("float8_e4m3fn", "float8_e5m2"), ("float8_e4m3fnuz", "float8_e5m2fnuz"))
FP8_BY_POLICY = {"cpu": dtypes.FP8_DTYPES, "cuda": ("float8_e4m3fn", "float8_e5m2"),
                 "rocm": ("float8_e4m3fnuz", "float8_e5m2fnuz")}


def only(*names):
    return {p: tuple(names) for p in POLICIES}




def compare_outputs(op: OpSpec, got: dict, want: dict, what: str, tolerance=None) -> None:
    """Every output named in op.compare: EXACT (integers equal; floats equal, NaN matching NaN)
    or CLOSE (the tolerance table entry of op.tolerance_dtype, or of `tolerance`: a dtype name or
    a tuple of them, the loosest applying)."""
    for name, how in op.compare.items():
        if name not in got or name not in want:
            raise AssertionError(f"{what}: output {name!r} missing from the "
                                 f"{'implementation' if name not in got else 'reference'}")
        g, w = got[name], want[name]
        if g is None:          # the implementation declared this output not comparable here
            continue
        if how == EXACT:
            g = g.cpu()
            if g.shape != w.shape:
                raise AssertionError(f"{what}: output {name!r} has shape {tuple(g.shape)}, want {tuple(w.shape)}")
            if g.dtype.is_floating_point or w.dtype.is_floating_point:
                g64, w64 = g.to(torch.float64), w.to(torch.float64)
                same = (g64 == w64) | (torch.isnan(g64) & torch.isnan(w64))
            else:
                same = g.to(torch.int64) == w.to(torch.int64)
            if not bool(same.all()):
                diff = (~same).nonzero()[:5].tolist()
                firsts = ", ".join(f"{tuple(i)}: {g[tuple(i)].item()} vs {w[tuple(i)].item()}" for i in diff)
                raise AssertionError(f"{what}: output {name!r}: {int((~same).sum())} of {same.numel()} differ; "
                                     f"first (got vs want): {firsts}")
        else:
            assert_close(g, w, tolerance or op.tolerance_dtype, f"{what}: output {name!r}")
