"""The op registry: every op with an optimized and a reference implementation, described once.

An `OpSpec` names the op, its two callables (the optimized one takes a `SampleInput` and the
platform profile, the reference one the `SampleInput`; both return a dict of named outputs), its
input generators (named edge cases and seeded random samples, a hypothesis recipe), its error
inputs, the dtypes it supports per platform policy, and how each output compares. Differential and
property tests are generated from these records (tests/test_ops_differential.py). Expected failures
and skips are not part of a record: they are data, per platform profile, in tests/expectations/.

The conformance interface: `SPECVERIFY_IMPL=module:object` plugs a third implementation into the
same records. For every op, `object.<op name>(**sample.args)` is called with the sample's
arguments (torch tensors and plain values, as `SampleInput.summary` lists them) and returns a dict
holding every output named in the record's `compare` (array-likes; they are converted with
torch.as_tensor). An op the object lacks is skipped with a reason naming the missing attribute.
`tests/support/example_impl.py` is a small example.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import struct
import types
from typing import Any, Callable, Iterable

import numpy as np
import torch

import reference
from reference import fp8 as rfp8
from reference import protocol as rproto
from reference import spec as rspec
from specverify import dtypes, ops
from specverify.validation import import_named
from specverify.engine.logprobs import logprob_rows
from specverify.engine.sampling import SamplingParams, sample_from_probs, sampling_probs
from specverify.kernels.argmax import row_argmax
from specverify.kernels.draft_kv_indices import draft_kv_indices_impl
from specverify.kernels.state_scatter import state_scatter_impl
from specverify.kernels.tree import build_tree
from specverify.kernels.verify import target_predict, verify_greedy, verify_naive, verify_stochastic
from specverify.protocol import message as msg
from specverify.spec.eagle import expand_search, finish_search, start_search
from tests.support import strategies as S

EXACT = "exact"        # integers equal; floats equal value for value (NaN matches NaN)
CLOSE = "close"        # by the tolerance table entry of OpSpec.tolerance_dtype
IMPL_ENV = "SPECVERIFY_IMPL"
SAMPLE_OPTION = "--sv-sample"
# Every op carries named edge cases of these kinds (tests/meta/test_registry.py checks it).
EDGE_KINDS = ("nan", "empty", "ulp", "boundary")
# Sample generators make their values with tests/support/strategies.py's exact building blocks
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
    """Move every tensor inside a sample's args (dicts and lists too) to `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
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
    return import_named(spec, label=f"{IMPL_ENV}={spec!r}", example="tests.support.example_impl:IMPL")


def missing_op(plugin, op: OpSpec) -> str | None:
    """Why a plugged-in implementation cannot run `op` (None when it can)."""
    if plugin is None or callable(getattr(plugin, op.name, None)):
        return None
    return f"{os.environ.get(IMPL_ENV, type(plugin).__name__)} has no attribute {op.name!r}: op not implemented"


def run_impl(op: OpSpec, sample: SampleInput, profile, plugin=None) -> dict:
    """The implementation under test on the profile's device; outputs come back to the CPU.
    plugin: a SPECVERIFY_IMPL object (its op gets the sample's args as keywords)."""
    moved = dataclasses.replace(sample, args=on_device(sample.args, profile.device))
    if plugin is None:
        out = op.impl(moved, profile)
    else:
        out = getattr(plugin, op.name)(**moved.args)
        if not isinstance(out, dict):
            raise AssertionError(f"{IMPL_ENV} op {op.name} returned {type(out).__name__}, expected a dict "
                                 f"with the outputs {sorted(op.compare)}")
        missing = sorted(set(op.compare) - set(out))
        if missing:
            raise AssertionError(f"{IMPL_ENV} op {op.name} returned no output {missing}")
        out = {k: (v if v is None or isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v)))
               for k, v in out.items()}
    return {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in out.items()}


def select_samples(op: OpSpec, dtype: str, seed: int, name: str | None = None) -> list[tuple[int, SampleInput]]:
    """(index, sample) of the op's samples; only the one called `name` when a name is given."""
    found = list(enumerate(op.samples(dtype, seed)))
    if name is None:
        return found
    return [(i, s) for i, s in found if s.name == name]


def replay_command(test: str, op: str, profile: str, dtype: str, sample: SampleInput) -> str:
    """A command that re-runs just this sample of test_differential (the seed comes from the test
    id, so it is the same)."""
    impl = os.environ.get(IMPL_ENV)
    env = f"{IMPL_ENV}={impl} " if impl else ""
    return (f"{env}python -m pytest 'tests/test_ops_differential.py::{test}[{op}-{profile}-{dtype}]' "
            f"{SAMPLE_OPTION}='{sample.name}'")


# ---------------------------------------------------------------------------------------------
# select_draft_topk


def _select_impl(s: SampleInput, profile) -> dict:
    p, index = ops.select_draft_topk(s.args["logits"], s.args["topk"], platform=profile, scale=s.args["scale"])
    if s.args["topk"] == 1 and profile.argmax_fast_path:
        # The fast path's p is a placeholder: exactly 1.0, and nothing to hold against a softmax.
        if not torch.all(p == 1.0):
            raise AssertionError(f"argmax fast path must return p == 1.0, got {p.flatten()[:4].tolist()}")
        return {"index": index, "p": None}
    return {"index": index, "p": p}


def _dequant32(logits: torch.Tensor, scale: torch.Tensor) -> np.ndarray:
    """float32(logits) * scale with the product rounded to float32 (section 6.1), as numpy."""
    with np.errstate(invalid="ignore", over="ignore"):
        return logits.float().numpy() * scale.float().numpy()


def _select_ref(s: SampleInput) -> dict:
    logits, scale, k = s.args["logits"], s.args["scale"], s.args["topk"]
    upcast, deq = logits.float().numpy(), _dequant32(logits, scale)
    ps, idx = [], []
    for row_up, row_dq in zip(upcast, deq):
        p, i = rspec.select_draft_topk(row_up, k, row_dq)
        ps.append(p)
        idx.append(i)
    return {"index": torch.tensor(idx, dtype=torch.int64).view(-1, k),
            "p": torch.tensor(ps, dtype=torch.float64).view(-1, k)}


def _select_sample(name, x, dtype, k, seed, scale_kind="1"):
    gen = torch.Generator().manual_seed(seed)
    values, scale = S.with_scale(x, dtype, scale_kind, gen)
    return SampleInput(f"{name}-scale{scale_kind}", {"logits": values, "scale": scale,
                                                    "topk": min(k, x.shape[1])}, seed)


def _select_samples(dtype: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    kinds = S.SCALE_KINDS
    for n, vocab in enumerate((2, 63, 64, 65, 389, 1025)):         # around kernel block sizes
        for m, k in enumerate((1, 2, 4)):
            sk = kinds[(n + m) % len(kinds)]
            yield _select_sample(f"grid-V{vocab}-k{k}", S.grid_logits(gen, 3, vocab), dtype, k, seed, sk)
            yield _select_sample(f"tie-heavy-V{vocab}-k{k}", S.tie_heavy_rows(gen, 3, vocab), dtype, k, seed,
                                 kinds[(n + m + 1) % len(kinds)])
    for name, rows in S.edge_logits(70).items():
        for k in (1, 3):
            yield _select_sample(f"{name}-k{k}", rows, dtype, k, seed, "3.5" if k == 1 else "per-row")
    issue = torch.tensor([[0.49999997, 0.5, -1.0, -2.0]])
    for k in (1, 2):
        yield _select_sample(f"ulp-issue-k{k}", issue, dtype, k, seed)
    for k, sk in ((1, "0.37"), (2, "3.5"), (3, "per-row")):
        yield _select_sample(f"ulp-adjacent-k{k}", S.ulp_adjacent_rows(gen, 4, 97), dtype, k, seed, sk)
        yield _select_sample(f"nan-rows-k{k}", S.nan_rows(gen, 4, 33), dtype, k, seed, sk)
        yield _select_sample(f"inf-rows-k{k}", S.inf_rows(gen, 3, 33), dtype, k, seed, sk)
    for k in (1, 3):
        yield _select_sample(f"empty-batch-k{k}", torch.zeros((0, 7)), dtype, k, seed)
    x = S.grid_logits(gen, 2, 129)
    x[0, 0], x[1, 128] = 7.0, 7.0
    for sk in ("0.37", "per-row"):
        yield _select_sample(f"boundary-V129-k2", x, dtype, 2, seed, sk)
    yield _select_sample("boundary-k-eq-V", S.tie_heavy_rows(gen, 3, 5), dtype, 5, seed, "3.5")
    yield _select_sample("bs1", S.tie_heavy_rows(gen, 1, 389), dtype, 1, seed)
    yield _select_sample("large-bs", S.tie_heavy_rows(gen, 257, 97), dtype, 2, seed, "per-row")


def _select_recipe(dtype: str):
    from hypothesis import strategies as st
    return st.tuples(S.hard_logits_rows(), st.integers(1, 4)).map(
        lambda t: _select_sample(f"hyp-{t[0][3]}", S.build_hard_logits(t[0]), dtype, t[1], t[0][0], t[0][4]))


def _select_errors():
    x = torch.zeros((2, 5))
    one = torch.ones((2, 1))

    def call(logits=x, k=1, scale=one):
        return lambda: ops.select_draft_topk(logits, k, platform="cpu", scale=scale)
    yield ErrorInput("topk-0", call(k=0), ValueError, r"topk must be in \[1, 5\]", "topk")
    yield ErrorInput("topk-above-vocab", call(k=6), ValueError, r"topk must be in \[1, 5\]", "topk")
    yield ErrorInput("topk-bool", call(k=True), TypeError, "topk must be an int", "topk")
    yield ErrorInput("topk-float", call(k=2.0), TypeError, "topk must be an int", "topk")
    yield ErrorInput("1-D", call(logits=x[0]), ValueError, "logits must be 2-D", "logits")
    yield ErrorInput("not-a-tensor", call(logits=[[0.0, 1.0]]), TypeError, "logits must be a torch.Tensor", "logits")
    yield ErrorInput("int-logits", call(logits=x.long()), ValueError, "logits dtype torch.int64 is not a logits dtype",
                     "logits")
    yield ErrorInput("scale-shape", call(scale=torch.ones(3, 1)), ValueError, r"scale must have shape \[2, 1\]", "scale")
    yield ErrorInput("scale-float64", call(scale=one.double()), ValueError, "scale must be float32", "scale")
    yield ErrorInput("scale-negative", call(scale=-one), ValueError, "scale must be finite and > 0", "scale")
    yield ErrorInput("scale-nan", call(scale=torch.full((2, 1), float("nan"))), ValueError,
                     "scale must be finite and > 0", "scale")
    yield ErrorInput("scale-zero", call(scale=torch.zeros((2, 1))), ValueError, "scale must be finite and > 0", "scale")


# ---------------------------------------------------------------------------------------------
# draft tree


def _tree_inputs(seed, bs, topk, steps, d, vocab, kind: str = "tree") -> SampleInput:
    """kind: "tree" (softmax-like distributions of grid levels: exact ties), "nan" (some
    probabilities NaN), "ulp" (the best probabilities float32 neighbours), "boundary" (the best
    token at index 0 or V-1)."""
    gen = torch.Generator().manual_seed(seed)
    dists = [S.probs_from(gen, (bs, 1 if i == 0 else topk), vocab) for i in range(steps)]
    for dist in dists:
        flat = dist.view(-1, vocab)
        for r in range(flat.shape[0]):
            if kind == "nan" and r % 2 == 0:
                flat[r, torch.randint(0, vocab, (1,), generator=gen)] = float("nan")
            elif kind == "ulp":
                top = flat[r].max()
                flat[r, torch.randperm(vocab, generator=gen)[:2]] = torch.stack([top, torch.nextafter(top, top + 1)])
            elif kind == "boundary":
                flat[r, (0, vocab - 1)[r % 2]] = 1.0
    roots = torch.randint(0, vocab, (bs,), generator=gen)
    seq_lens = torch.randint(0, 50, (bs,), generator=gen)
    return SampleInput(f"{kind}-k{topk}-S{steps}-D{d}-bs{bs}", {"dists": dists, "roots": roots, "seq_lens": seq_lens,
                                                                "topk": topk, "steps": steps, "d": d}, seed)


def _tree_impl(s: SampleInput, profile) -> dict:
    a = s.args
    k, steps = a["topk"], a["steps"]
    bs, _, vocab = a["dists"][0].shape
    p0, i0 = ops.topk_stable(a["dists"][0][:, 0], k)
    search = start_search(p0, i0, steps)
    for step in range(1, steps):
        p, idx = ops.topk_stable(a["dists"][step].reshape(bs * k, vocab), k)
        expand_search(search, step, p.view(bs, k, k), idx.view(bs, k, k))
    kept_flat, kept_tokens, beam_flat = finish_search(search, a["d"])
    tree = build_tree(a["roots"], kept_flat, kept_tokens, beam_flat, a["seq_lens"], topk=k, num_steps=steps,
                      impl=s.args.get("impl", "auto"))
    return {f: getattr(tree, f) for f in TREE_FIELDS} | {"kept_flat": kept_flat}


TREE_FIELDS = ("tokens", "parents", "positions", "mask", "first_child", "next_sibling", "flat_index")


def _tree_ref(s: SampleInput) -> dict:
    a = s.args
    trees = rspec.build_tree([d.numpy() for d in a["dists"]], a["roots"].tolist(), a["seq_lens"].tolist(),
                             topk=a["topk"], num_steps=a["steps"], num_draft_tokens=a["d"])
    bs, d = len(trees), a["d"]
    shapes = {f: (bs, d, d) if f == "mask" else (bs, d) for f in TREE_FIELDS}
    out = {f: torch.tensor([getattr(t, f) for t in trees], dtype=torch.bool if f == "mask" else torch.int64)
           .view(shapes[f]) for f in TREE_FIELDS}
    out["kept_flat"] = torch.tensor([t.kept_flat for t in trees], dtype=torch.int64).view(bs, d - 1)
    return out


def _tree_samples(dtype: str, seed: int):
    for shape in ((2, 1, 3, 4), (3, 2, 3, 5), (2, 4, 3, 8), (1, 3, 4, 10), (4, 2, 1, 3), (2, 4, 2, 7)):
        bs, k, steps, d = shape
        yield _tree_inputs(seed + sum(shape), bs, k, steps, d, 17)
    for kind in ("nan", "ulp", "boundary"):
        for shape in ((3, 2, 3, 5), (2, 4, 2, 7)):
            yield _tree_inputs(seed + len(kind), *shape, 17, kind)
    yield _tree_inputs(seed, 2, 4, 2, 7, 4, "boundary-V-eq-k")
    yield _tree_inputs(seed, 0, 2, 3, 5, 17, "empty-batch")


def _tree_recipe(dtype: str):
    return S.tree_shapes().map(lambda t: _tree_inputs(*t))


def _tree_errors():
    roots, lens = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    beams = torch.zeros((1, 1, 2), dtype=torch.int64)

    def call(kept, topk=2, steps=2, beam_flat=beams):
        return lambda: build_tree(roots, kept, kept, beam_flat, lens, topk=topk, num_steps=steps)
    # k=2, S=2 has 2 + 4 = 6 candidates: flat indices live in [0, 6).
    yield ErrorInput("flat-out-of-range", call(torch.tensor([[0, 1, 6]])), ValueError, "kept_flat", "kept_flat")
    yield ErrorInput("flat-negative", call(torch.tensor([[-1, 1, 2]])), ValueError, "kept_flat", "kept_flat")
    yield ErrorInput("too-many-kept", call(torch.arange(7)[None]), ValueError, "kept", "kept_flat")
    yield ErrorInput("chain-needs-D-eq-S+1", call(torch.tensor([[0, 1, 2]]), topk=1, steps=2,
                                                  beam_flat=torch.zeros((1, 1, 1), dtype=torch.int64)),
                     ValueError, "more than the 2 candidates of topk=1, num_steps=2", "topk")


# ---------------------------------------------------------------------------------------------
# greedy and stochastic verify (trees built by the reference from random distributions)


def _ref_trees(seed, bs, topk, steps, d, vocab):
    s = _tree_inputs(seed, bs, topk, steps, d, vocab)
    return _tree_ref(s), s


def _verify_sample(name, seed, shape, dtype, vocab=19, plant=True, kind="plain"):
    """kind: "plain"; "nan" (NaN entries in some target rows); "ulp" (a planted token only one
    float32 ulp above a rival); "boundary" (tokens 0 and V-1 planted). The target probabilities
    follow the logits: p ∝ 2**x (`S.pow2_probs`, softmax-like; a row holding a NaN is NaN); for
    "boundary" tokens 0 and V-1 each get the whole row's weight on top of their own."""
    bs, topk, steps, d = shape
    tree, s = _ref_trees(seed, bs, topk, steps, d, vocab)
    gen = torch.Generator().manual_seed(seed + 1)
    x = S.tie_heavy_rows(gen, bs * d, vocab).view(bs, d, vocab)
    if kind == "boundary":
        tree["tokens"] = torch.where(tree["tokens"] % 2 == 0, 0, vocab - 1)
        tree["tokens"][:, 0] = 1
    if plant:
        # Make the target agree with some drafts so paths of every length get accepted.
        for b in range(bs):
            for j in range(1, d):
                par = int(tree["parents"][b, j])
                if par >= 0 and bool(S.coins(gen, (), 0.6)):
                    x[b, par, :] = torch.where(x[b, par] >= 3.0, 2.0, x[b, par])
                    x[b, par, int(tree["tokens"][b, j])] = 3.5
                    if kind == "ulp":
                        rival = (int(tree["tokens"][b, j]) + 1) % vocab
                        x[b, par, rival] = 3.5
                        x[b, par, int(tree["tokens"][b, j])] = float(torch.nextafter(torch.tensor(3.5), torch.tensor(4.0)))
    if kind == "nan":
        x[:, ::2, torch.randint(0, vocab, (1,), generator=gen)] = float("nan")
    values, scale = S.as_logits_dtype(x.reshape(bs * d, vocab), dtype)
    coins = S.unit_floats(gen, (bs, d))
    final = S.unit_floats(gen, (bs,))
    if kind == "boundary":
        w = S.pow2_weights(x)
        total = w.sum(-1)
        w[..., 0] += total
        w[..., -1] += total
        probs = S.probs_from_weights(w)
    else:
        probs = S.pow2_probs(x)
    return SampleInput(name, {"tree": tree, "logits": values.view(bs, d, vocab), "steps": steps,
                              "probs": probs, "coins": coins, "final": final}, seed)


def _as_tree(t: dict):
    from specverify.kernels.tree import DraftTree
    return DraftTree(**{f: t[f] for f in TREE_FIELDS})


def _greedy_impl(s: SampleInput, profile) -> dict:
    accept, n, bonus = verify_greedy(_as_tree(s.args["tree"]), target_predict(s.args["logits"]),
                                     num_steps=s.args["steps"])
    return {"accept_nodes": accept, "num_correct": n, "bonus": bonus}


def _greedy_ref(s: SampleInput) -> dict:
    t = s.args["tree"]
    out = [rspec.greedy_verify(t["tokens"][b].tolist(), t["parents"][b].tolist(),
                               s.args["logits"][b].float().numpy(), num_steps=s.args["steps"])
           for b in range(t["tokens"].shape[0])]
    return _verify_out(out, s.args["steps"] + 1)


def _verify_out(out, width: int) -> dict:
    return {"accept_nodes": torch.tensor([o[0] for o in out], dtype=torch.int64).view(len(out), width),
            "num_correct": torch.tensor([o[1] for o in out], dtype=torch.int64),
            "bonus": torch.tensor([o[2] for o in out], dtype=torch.int64)}


def _stochastic_impl(s: SampleInput, profile) -> dict:
    a = s.args
    accept, n, bonus = verify_stochastic(_as_tree(a["tree"]), a["probs"], a["coins"], a["final"],
                                         num_steps=a["steps"])
    return {"accept_nodes": accept, "num_correct": n, "bonus": bonus}


def _stochastic_ref(s: SampleInput) -> dict:
    a, t = s.args, s.args["tree"]
    out = [rspec.stochastic_verify(t["tokens"][b].tolist(), t["parents"][b].tolist(), a["probs"][b].numpy(),
                                   a["coins"][b].tolist(), float(a["final"][b]), num_steps=a["steps"])
           for b in range(t["tokens"].shape[0])]
    return _verify_out(out, s.args["steps"] + 1)


VERIFY_SHAPES = ((1, 1, 1, 2), (3, 1, 4, 5), (2, 2, 3, 5), (3, 4, 3, 8), (2, 3, 2, 7))


def _verify_samples(dtype: str, seed: int):
    for i, shape in enumerate(VERIFY_SHAPES):
        yield _verify_sample(f"planted-{shape}", seed + i, shape, dtype)
        yield _verify_sample(f"random-{shape}", seed + 100 + i, shape, dtype, plant=False)
    yield _verify_sample("large-bs", seed, (64, 2, 3, 6), dtype)
    for kind in ("nan", "ulp", "boundary"):
        for i, shape in enumerate(((3, 1, 4, 5), (3, 4, 3, 8))):
            yield _verify_sample(f"{kind}-{shape}", seed + 7 * i, shape, dtype, kind=kind)
    yield _verify_sample("empty-batch", seed, (0, 2, 3, 5), dtype, plant=False)


def _stochastic_samples(dtype: str, seed: int):
    return (s for s in _verify_samples(dtype, seed) if not s.name.startswith("nan"))


def _verify_recipe(dtype: str):
    return S.tree_shapes().map(lambda t: _verify_sample("hyp", t[0], t[1:5], dtype, vocab=max(t[5], 5)))


def _verify_errors():
    tree = _as_tree(_ref_trees(1, 2, 2, 2, 4, 7)[0])
    logits = torch.zeros((2, 4, 7))

    def greedy(predict=None, steps=2, t=tree):
        return lambda: verify_greedy(t, target_predict(logits) if predict is None else predict, num_steps=steps)
    yield ErrorInput("num-steps-0", greedy(steps=0), ValueError, "num_steps must be an int >= 1", "num_steps")
    yield ErrorInput("tree-not-a-tree", greedy(t={"tokens": 1}), ValueError, "tree must be a DraftTree", "tree")
    yield ErrorInput("logits-2-D", lambda: target_predict(logits[0]), ValueError, "logits must be a 3-D tensor", "logits")
    yield ErrorInput("logits-empty-vocab", lambda: target_predict(logits[..., :0]), ValueError,
                     "logits must have a non-empty vocabulary dimension", "logits")


def _stochastic_errors():
    tree = _as_tree(_ref_trees(1, 2, 2, 2, 4, 7)[0])
    probs = torch.full((2, 4, 7), 1 / 7, dtype=torch.float64)
    coins, final = torch.zeros((2, 4), dtype=torch.float64), torch.zeros(2, dtype=torch.float64)

    def call(p=probs, c=coins, f=final, steps=2):
        return lambda: verify_stochastic(tree, p, c, f, num_steps=steps)
    yield ErrorInput("num-steps-0", call(steps=0), ValueError, "num_steps must be an int >= 1", "num_steps")
    yield ErrorInput("probs-2-D", call(p=probs[0]), ValueError, "target_probs must be a 3-D tensor", "target_probs")
    yield ErrorInput("probs-empty-vocab", call(p=probs[..., :0]), ValueError,
                     "target_probs must have a non-empty vocabulary dimension", "target_probs")
    yield ErrorInput("coin-is-1", call(c=torch.ones((2, 4), dtype=torch.float64)), ValueError,
                     r"coins must lie in \[0, 1\)", "coins")


# ---------------------------------------------------------------------------------------------
# the naive-EAGLE accept step (docs/semantics.md 6.7)


def _naive_impl(s: SampleInput, profile) -> dict:
    a = s.args
    accept, n, bonus = verify_naive(a["probs"], a["draft"], a["coin"], a["final"], **a["mode"])
    return {"accept_nodes": accept, "num_correct": n, "bonus": bonus}


def _naive_ref(s: SampleInput) -> dict:
    a = s.args
    out = []
    for b in range(a["draft"].shape[0]):
        mode = ({"draft_q": a["mode"]["draft_q"][b].numpy()} if "draft_q" in a["mode"]
                else {"draft_p": float(a["mode"]["draft_p"][b])})
        out.append(reference.naive_verify(a["probs"][b].numpy(), int(a["draft"][b]), float(a["coin"][b]),
                                          float(a["final"][b]), **mode))
    return _verify_out(out, 2)


def _naive_sample(name, seed, probs, draft, coin, final, *, q=None, p=None):
    mode = {"draft_q": q.double()} if q is not None else {"draft_p": torch.as_tensor(p, dtype=torch.float64)}
    return SampleInput(name, {"probs": probs.double(), "draft": torch.as_tensor(draft, dtype=torch.int64),
                              "coin": torch.as_tensor(coin, dtype=torch.float64),
                              "final": torch.as_tensor(final, dtype=torch.float64), "mode": mode}, seed)


def _naive_random(name, seed, bs, vocab, exact: bool, agree: float = 0.5):
    """Target rows from tie-heavy logits x, p ∝ 2**x (`S.pow2_probs`, softmax-like); the draft's q
    the same or a sharper copy of p_0 (q ∝ 2**(t x), t = 1 with probability `agree`, else 2.5), so
    the ratio p_0(d) / q(d) lands on both sides of the coin; d drawn from q (exact inverse CDF)."""
    gen = torch.Generator().manual_seed(seed)
    x = S.tie_heavy_rows(gen, bs * 2, vocab).view(bs, 2, vocab).double()
    probs = S.pow2_probs(x)
    temper = torch.where(S.coins(gen, (bs, 1), agree), 1.0, 2.5).double()
    wq = S.pow2_weights(x[:, 0] * temper)
    q = S.probs_from_weights(wq)
    draft = S.draw_from_weights(gen, wq)
    coin = S.unit_floats(gen, (bs,))
    final = S.unit_floats(gen, (bs,))
    if exact:
        return _naive_sample(name, seed, probs, draft, coin, final, q=q)
    return _naive_sample(name, seed, probs, draft, coin, final, p=q.gather(1, draft[:, None])[:, 0])


def _naive_samples(dtype: str, seed: int):
    for exact in (True, False):
        mode = "exact" if exact else "shortcut"
        for i, (bs, vocab) in enumerate(((1, 2), (3, 5), (5, 19), (4, 389))):
            yield _naive_random(f"{mode}-random-bs{bs}-V{vocab}", seed + i, bs, vocab, exact)
        yield _naive_random(f"{mode}-large-bs", seed + 9, 64, 33, exact)
        yield _naive_random(f"empty-batch-{mode}", seed, 0, 7, exact)
    # p_0(d) / q(d) = 0.5 exactly: a coin of 0.5 rejects (strict <), one ulp below accepts.
    half = torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64)
    q = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    below = float(np.nextafter(0.5, 0.0))
    probs = torch.stack([half, torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)])[None].repeat(2, 1, 1)
    yield _naive_sample("ulp-coin-at-the-ratio", seed, probs, [0, 0], [0.5, below], [0.3, 0.3], q=q[None].repeat(2, 1))
    yield _naive_sample("ulp-coin-at-the-ratio-shortcut", seed, probs, [0, 0], [0.5, below], [0.3, 0.3],
                        p=[0.5, 0.5])
    # q(d) = 0: the ratio is +inf (accept) where p_0(d) > 0, NaN (reject) where p_0(d) = 0 too.
    p0 = torch.tensor([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]], dtype=torch.float64)
    probs = torch.stack([p0, torch.full((2, 3), 1 / 3, dtype=torch.float64)], 1)
    yield _naive_sample("nan-ratio-q-zero", seed, probs, [0, 0], [0.7, 0.7], [0.5, 0.5],
                        q=torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64))
    # p_0 == q: the ratio is 1, every coin accepts.
    same = S.pow2_probs(torch.arange(6, dtype=torch.float64))
    yield _naive_sample("boundary-p-equals-q", seed, torch.stack([same, same])[None].repeat(3, 1, 1), [5, 0, 3],
                        [0.0, 0.5, float(np.nextafter(1.0, 0.0))], [0.1, 0.6, 0.99], q=same[None].repeat(3, 1))
    # Tokens 0 and V-1; a final landing exactly on a running sum of the residual passes it.
    v = 8
    p0 = torch.zeros(v, dtype=torch.float64)
    p0[0], p0[3], p0[v - 1] = 0.5, 0.25, 0.25
    q = torch.zeros(v, dtype=torch.float64)
    q[0], q[v - 1] = 0.75, 0.25
    probs = torch.stack([p0, torch.flip(p0, (0,))])[None].repeat(3, 1, 1)
    # residual max(p0 - q, 0) = 0.25 at token 3 only; d = 0 rejected at coin 0.9 (ratio 2/3)
    yield _naive_sample("boundary-vocab-edges", seed, probs, [0, v - 1, v - 1], [0.9, 0.2, 0.99], [0.5, 0.5, 0.0],
                        q=q[None].repeat(3, 1))
    yield _naive_sample("boundary-vocab-edges-shortcut", seed, probs, [0, v - 1, v - 1], [0.9, 0.2, 0.99],
                        [0.5, 0.5, 0.0], p=[0.75, 0.25, 0.25])


def _naive_recipe(dtype: str):
    from hypothesis import strategies as st
    return st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 6), st.integers(2, 60), st.booleans(),
                     st.floats(0.0, 1.0)).map(
        lambda t: _naive_random(f"hyp-{'exact' if t[3] else 'shortcut'}-V{t[2]}", t[0], t[1], t[2], t[3], t[4]))


def _naive_errors():
    probs = torch.full((2, 2, 5), 0.2, dtype=torch.float64)
    q = torch.full((2, 5), 0.2, dtype=torch.float64)
    d, u = torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.float64)

    def call(p=probs, draft=d, coin=u, **mode):
        return lambda: verify_naive(p, draft, coin, u, **(mode or {"draft_q": q}))
    yield ErrorInput("both-modes", call(draft_q=q, draft_p=u), ValueError, "exactly one of draft_q", "draft_q")
    yield ErrorInput("no-mode", lambda: verify_naive(probs, d, u, u), ValueError, "exactly one of draft_q", "draft_q")
    yield ErrorInput("probs-three-nodes", call(p=torch.full((2, 3, 5), 0.2, dtype=torch.float64)), ValueError,
                     r"target_probs must be a 3-D tensor \[bs, 2, V\]", "target_probs")
    yield ErrorInput("draft-past-vocab", call(draft=torch.tensor([0, 5])), ValueError, r"draft must lie in \[0, 5\)",
                     "draft")
    yield ErrorInput("coin-is-1", call(coin=torch.ones(2, dtype=torch.float64)), ValueError,
                     r"coin must lie in \[0, 1\)", "coin")
    yield ErrorInput("draft-q-float32", call(draft_q=q.float()), ValueError, "draft_q", "draft_q")


# ---------------------------------------------------------------------------------------------
# sampling probabilities (docs/semantics.md section 4) and the inverse-CDF draw


def _dequant64(logits: torch.Tensor, scale: torch.Tensor) -> np.ndarray:
    """float64(logits) * float64(scale) per row: exact (a product of two float32 fits float64)."""
    return logits.double().numpy() * scale.double().numpy()


def _sampling_impl(s: SampleInput, profile) -> dict:
    a = s.args
    params = SamplingParams(a["temperature"], a["top_k"], a["top_p"], a["min_p"])
    return {"p": sampling_probs(a["logits"], a["scale"], params)}


def _sampling_ref(s: SampleInput) -> dict:
    a = s.args
    rows = [reference.filtered_probs(z, a["temperature"], a["top_k"], a["top_p"], a["min_p"])
            for z in _dequant64(a["logits"], a["scale"])]
    return {"p": torch.tensor(rows, dtype=torch.float64).view(a["logits"].shape)}


# scale -> (x, T): a float32 logit x near -1 and a temperature T with x * float32(scale) / T ==
# -0.6931471805599453 (float64's -ln 2) in float64, whose exp is 0.5 exactly, so the probabilities of
# the logits [0, x] are exactly 2/3 and 1/3 = 0.5 * 2/3: the min-p boundary p == min_p * max(p) with
# min_p 0.5, hit exactly. Data, not a search over exp at generation time (exp's last bit is the
# platform's); tests/meta/test_registry.py checks that math.exp and torch.exp still give 0.5.
HALF_TEMPERATURE = {"1": (-1.0, 1.4426950408889634), "0.37": (-1.0, 0.5337971720082225),
                    "3.5": (-0.9999999403953552, 5.049432342141733)}


def _sampling_sample(name, x, dtype, seed, scale_kind, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    gen = torch.Generator().manual_seed(seed)
    values, scale = S.with_scale(x, dtype, scale_kind, gen)
    return SampleInput(f"{name}-scale{scale_kind}", {"logits": values, "scale": scale, "temperature": temperature,
                                                    "top_k": top_k, "top_p": top_p, "min_p": min_p}, seed)


PARAM_GRID = ((1.0, 0, 1.0, 0.0), (0.7, 3, 1.0, 0.0), (1.3, 0, 0.8, 0.0), (1.0, 0, 1.0, 0.1),
              (0.9, 5, 0.6, 0.05), (2.0, 1, 1.0, 0.0))


def _sampling_samples(dtype: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    kinds = S.SCALE_KINDS
    for i, params in enumerate(PARAM_GRID):
        for j, (kind, vocab) in enumerate((("grid", 33), ("tie-heavy", 65), ("ulp", 40))):
            x = S.ROW_KINDS[kind](gen, 3, vocab)
            yield _sampling_sample(f"{kind}-V{vocab}-T{params[0]}-k{params[1]}-p{params[2]}-m{params[3]}", x, dtype,
                                   seed, kinds[(i + j) % len(kinds)], *params)
    # Exact boundaries: all-equal rows of 4 and 8 tokens have probabilities 1/4, 1/8 exactly.
    for vocab in (4, 8):
        for top_p in (0.25, 0.5, 0.75):
            yield _sampling_sample(f"boundary-top-p{top_p}-V{vocab}", torch.zeros((2, vocab)), dtype, seed,
                                   "3.5", 1.0, 0, top_p)
    # min-p boundary: logits [0, x] at scale s and temperature T with exp(x * s / T) == 0.5.
    for kind, (x, t) in HALF_TEMPERATURE.items():
        row = torch.tensor([[0.0, x], [x, 0.0]])
        info = dtypes.dtype_info(dtype)
        if float(row.to(info.torch_dtype).float()[0, 1]) != x:
            continue                                  # x is not a value of this dtype
        scale = torch.full((2, 1), float(kind), dtype=torch.float32)
        yield SampleInput(f"boundary-min-p-scale{kind}", {"logits": row.to(info.torch_dtype), "scale": scale,
                                                         "temperature": t, "top_k": 0, "top_p": 1.0, "min_p": 0.5},
                          seed)
    for kind in ("nan", "inf"):
        yield _sampling_sample(f"{kind}-rows", S.ROW_KINDS[kind](gen, 4, 17), dtype, seed, "per-row", 0.8, 3, 0.9, 0.05)
    m = torch.full((2, 20), float("-inf"))
    m[0, 0], m[1, 19], m[1, 5] = 1.0, 0.5, 0.5
    yield _sampling_sample("boundary-neg-inf-mask", m, dtype, seed, "0.37", 1.0, 2, 0.9, 0.1)
    yield _sampling_sample("empty-batch", torch.zeros((0, 9)), dtype, seed, "1", 1.0, 2, 0.9, 0.1)


def _sampling_recipe(dtype: str):
    from hypothesis import strategies as st
    params = st.tuples(st.sampled_from([0.5, 1.0, 1.7]), st.integers(0, 6), st.sampled_from([1.0, 0.9, 0.5]),
                       st.sampled_from([0.0, 0.05, 0.3]))
    rows = S.hard_logits_rows(max_vocab=64, kinds=("grid", "tie-heavy", "ulp", "inf"))
    return st.tuples(rows, params).map(lambda t: _sampling_sample(
        f"hyp-{t[0][3]}", S.build_hard_logits(t[0]), dtype, t[0][0], t[0][4], *t[1]))


def _sampling_errors():
    x, one = torch.zeros((2, 5)), torch.ones((2, 1))

    def call(**kw):
        return lambda: sampling_probs(x, one, SamplingParams(**kw))
    yield ErrorInput("temperature-negative", call(temperature=-1.0), ValueError, "temperature", "temperature")
    yield ErrorInput("top-k-negative", call(temperature=1.0, top_k=-1), ValueError, "top_k", "top_k")
    yield ErrorInput("top-p-0", call(temperature=1.0, top_p=0.0), ValueError, "top_p", "top_p")
    yield ErrorInput("min-p-1", call(temperature=1.0, min_p=1.0), ValueError, "min_p", "min_p")
    yield ErrorInput("scale-shape", lambda: sampling_probs(x, torch.ones((3, 1)), SamplingParams(1.0)), ValueError,
                     "scale", "scale")


def _draw_impl(s: SampleInput, profile) -> dict:
    return {"token": sample_from_probs(s.args["p"], s.args["u"])}


def _draw_ref(s: SampleInput) -> dict:
    tokens = [reference.draw(row.tolist(), float(u)) for row, u in zip(s.args["p"], s.args["u"])]
    return {"token": torch.tensor(tokens, dtype=torch.int64)}


def _draw_sample(name, p, u, seed):
    return SampleInput(name, {"p": p.double(), "u": torch.as_tensor(u, dtype=torch.float64)}, seed)


def _draw_samples(dtype: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    for vocab in (1, 2, 17, 65, 389):
        p = S.pow2_probs(S.grid_logits(gen, 5, vocab))
        yield _draw_sample(f"random-V{vocab}", p, S.unit_floats(gen, (5,)), seed)
    half = torch.tensor([[0.5, 0.5]] * 3)
    # u equal to a cumulative sum must pass it ("exceeds"); u = 0 takes the first positive index.
    yield _draw_sample("boundary-u-eq-cumsum", half, [0.5, 0.0, float(np.nextafter(1.0, 0.0))], seed)
    yield _draw_sample("boundary-zeros-at-edges", torch.tensor([[0.0, 0.5, 0.5, 0.0], [0, 0, 0, 1.0]]), [0.75, 0.3],
                       seed)
    short = torch.tensor([[0.3, 0.3, 0.3, 0.0]])       # sums to 0.9: u past it -> the last positive
    yield _draw_sample("boundary-mass-short", short, [0.95], seed)
    a = torch.tensor(0.25, dtype=torch.float64)
    ulp = torch.stack([a, torch.nextafter(a, a + 1), 1 - a - torch.nextafter(a, a + 1), a.new_tensor(0.0)])
    yield _draw_sample("ulp-adjacent", ulp[None].repeat(3, 1), [0.25, float(torch.nextafter(a, a + 1)), 0.4], seed)
    yield _draw_sample("nan-entries", torch.tensor([[0.6, float("nan"), 0.4], [0.2, 0.3, float("nan")]]),
                       [0.3, 0.9], seed)
    yield _draw_sample("empty-batch", torch.zeros((0, 5)), torch.zeros(0), seed)


def _draw_recipe(dtype: str):
    from hypothesis import strategies as st
    return st.tuples(st.integers(0, 2**31 - 1), st.integers(1, 6), st.integers(1, 80)).map(lambda t: _draw_sample(
        f"hyp-V{t[2]}", S.pow2_probs(S.grid_logits(torch.Generator().manual_seed(t[0]), t[1], t[2])),
        S.unit_floats(torch.Generator().manual_seed(t[0] + 1), (t[1],)), t[0]))


def _draw_errors():
    p, u = torch.full((2, 4), 0.25, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    yield ErrorInput("u-shape", lambda: sample_from_probs(p, torch.zeros(3, dtype=torch.float64)), ValueError, "u",
                     "u")
    yield ErrorInput("p-1-D", lambda: sample_from_probs(p[0], u), ValueError, "p", "p")


# ---------------------------------------------------------------------------------------------
# logprob records


def _logprob_impl(s: SampleInput, profile) -> dict:
    a = s.args
    ids, lps, ranks = logprob_rows(a["logits"], a["scale"], a["tokens"], a["n"])
    return {"ids": ids, "logprobs": lps, "ranks": ranks}


def _logprob_ref(s: SampleInput) -> dict:
    a = s.args
    recs = [reference.logprob_record(z, int(t), a["n"]) for z, t in zip(_dequant64(a["logits"], a["scale"]), a["tokens"])]
    m, w = len(recs), a["n"] + 1
    return {"ids": torch.tensor([[r.token] + [i for i, _ in r.top] for r in recs], dtype=torch.int64).view(m, w),
            "logprobs": torch.tensor([[r.logprob] + [x for _, x in r.top] for r in recs], dtype=torch.float64).view(m, w),
            "ranks": torch.tensor([r.rank for r in recs], dtype=torch.int64)}


def _logprob_sample(name, x, dtype, seed, scale_kind, n, tokens=None):
    gen = torch.Generator().manual_seed(seed)
    values, scale = S.with_scale(x, dtype, scale_kind, gen)
    if tokens is None:
        tokens = torch.randint(0, x.shape[1], (x.shape[0],), generator=gen)
    return SampleInput(f"{name}-n{n}-scale{scale_kind}", {"logits": values, "scale": scale,
                                                         "tokens": torch.as_tensor(tokens, dtype=torch.int64), "n": n},
                       seed)


def _logprob_samples(dtype: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    kinds = S.SCALE_KINDS
    for i, (kind, vocab) in enumerate((("grid", 33), ("tie-heavy", 65), ("ulp", 40), ("nan", 17), ("inf", 17))):
        for j, n in enumerate((0, 1, 5)):
            yield _logprob_sample(kind, S.ROW_KINDS[kind](gen, 4, vocab), dtype, seed, kinds[(i + j) % 4], n)
    x = S.grid_logits(gen, 2, 129)
    x[0, 0], x[1, 128] = 9.0, 9.0
    yield _logprob_sample("boundary-V129", x, dtype, seed, "per-row", 3, [128, 0])
    yield _logprob_sample("boundary-n-eq-V", S.tie_heavy_rows(gen, 2, 6), dtype, seed, "0.37", 6)
    yield _logprob_sample("all-equal", torch.zeros((2, 9)), dtype, seed, "3.5", 4)
    yield _logprob_sample("empty-batch", torch.zeros((0, 9)), dtype, seed, "1", 2)


def _logprob_recipe(dtype: str):
    from hypothesis import strategies as st
    rows = S.hard_logits_rows(max_vocab=64)
    return st.tuples(rows, st.integers(0, 4)).map(lambda t: _logprob_sample(
        f"hyp-{t[0][3]}", S.build_hard_logits(t[0]), dtype, t[0][0], t[0][4], min(t[1], t[0][2])))


def _logprob_errors():
    x, one, tok = torch.zeros((2, 5)), torch.ones((2, 1)), torch.tensor([0, 1])
    yield ErrorInput("token-out-of-vocab", lambda: logprob_rows(x, one, torch.tensor([0, 5]), 1), ValueError,
                     "tokens", "tokens")
    yield ErrorInput("n-above-vocab", lambda: logprob_rows(x, one, tok, 6), ValueError, "n", "n")


# ---------------------------------------------------------------------------------------------
# FP8 quantization and the logits-dtype conversion (docs/semantics.md section 2)


def _fp8_hard_rows(gen: torch.Generator, dtype: str) -> dict[str, torch.Tensor]:
    """Named float32 rows for the quantizer: every code's neighbourhood, midpoints (ties to even),
    ulp steps around them, saturation, infinities, NaN, signed zeros, subnormals; "random": random
    signs and full float32 significands over every binade from below the smallest subnormal code
    (rounds to 0 or to it) to past the largest finite one (saturates)."""
    info = dtypes.dtype_info(dtype)
    codes = torch.arange(256, dtype=torch.uint8).view(info.torch_dtype).float()
    finite = codes[torch.isfinite(codes)].unique()
    mids = (finite[1:] + finite[:-1]) / 2                              # exact in float32
    inf = torch.tensor(float("inf"))
    rows = {
        "boundary-codes": codes[torch.isfinite(codes)][None],
        "ulp-midpoints": torch.stack([mids, torch.nextafter(mids, inf), torch.nextafter(mids, -inf)]),
        "boundary-saturate": torch.tensor([[info.max_finite, info.max_finite * 1.07, 1e30, float("inf"),
                                            -info.max_finite * 1.5, float("-inf"), 0.0, -0.0]]),
        "nan-values": torch.tensor([[float("nan"), 1.0, -2.5, float("nan"), 0.0, 3.0, -1e-9, 7.0]]),
        "random": S.binade_rows(gen, 3, 50, math.frexp(float(finite[finite > 0].min()))[1] - 3,
                                math.frexp(info.max_finite)[1]),
    }
    return rows


def _quantize_impl(s: SampleInput, profile) -> dict:
    a = s.args
    return {"codes": dtypes.quantize_fp8(a["x"], a["dtype"], a["scale"]).view(torch.uint8)}


def _quantize_ref(s: SampleInput) -> dict:
    a = s.args
    return {"codes": torch.from_numpy(rfp8.quantize(a["x"].numpy(), a["dtype"], a["scale"].numpy()).astype(np.int64))}


def _quantize_samples(dtype: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    for i, (name, x) in enumerate(_fp8_hard_rows(gen, dtype).items()):
        for kind in dict.fromkeys((S.SCALE_KINDS[i % 4], "0.37" if i % 2 else "3.5")):
            yield SampleInput(f"{name}-scale{kind}", {"x": x, "dtype": dtype, "scale": S.row_scales(gen, x.shape[0], kind)},
                              seed)
    yield SampleInput("empty-batch", {"x": torch.zeros((0, 4)), "dtype": dtype, "scale": torch.ones((0, 1))}, seed)


def _quantize_recipe(dtype: str):
    return S.hard_logits_rows(max_vocab=64).map(lambda t: SampleInput(
        f"hyp-{t[3]}", {"x": S.build_hard_logits(t) * 40, "dtype": dtype,
                        "scale": S.row_scales(torch.Generator().manual_seed(t[0]), t[1], t[4])}, t[0]))


def _quantize_errors():
    x = torch.zeros((2, 3))

    def call(scale=torch.ones((2, 1)), dtype="float8_e4m3fn", xx=x):
        return lambda: dtypes.quantize_fp8(xx, dtype, scale)
    yield ErrorInput("scale-negative", call(scale=-torch.ones((2, 1))), ValueError, "finite and > 0", "scale")
    yield ErrorInput("scale-nan", call(scale=float("nan")), ValueError, "finite and > 0", "scale")
    yield ErrorInput("scale-shape", call(scale=torch.ones((3, 1))), ValueError, "does not broadcast", "scale")
    yield ErrorInput("dtype-not-fp8", call(dtype="float16"), ValueError, "expected one of the FP8 dtypes", "dtype")
    yield ErrorInput("x-int", call(xx=x.long()), ValueError, "expected a floating-point tensor", "x")


def _convert_impl(s: SampleInput, profile) -> dict:
    a = s.args
    values, scale = dtypes.to_logits_dtype(a["x"], a["dtype"], scale_mode=a["scale_mode"], static_scale=a["static_scale"])
    return {"upcast": values.float(), "scale": scale}


def _convert_ref(s: SampleInput) -> dict:
    a = s.args
    cfg = types.SimpleNamespace(logits_dtype=a["dtype"], logits_scale_mode=a["scale_mode"], logits_scale=a["static_scale"])
    rows = [reference.convert_logits(cfg, row) for row in a["x"].double()]
    n, v = a["x"].shape
    return {"upcast": torch.tensor(np.array([r.upcast for r in rows], dtype=np.float32).reshape(n, v)),
            "scale": torch.tensor([[1.0 if r.scale is None else r.scale] for r in rows], dtype=torch.float32).view(n, 1)}


def _convert_sample(name, x, dtype, mode, static, seed):
    return SampleInput(f"{name}-{mode}{static if mode == 'static' else ''}",
                       {"x": x, "dtype": dtype, "scale_mode": mode, "static_scale": static}, seed)


def _convert_samples(dtype: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    fp8 = dtypes.dtype_info(dtype).is_fp8
    rows = _fp8_hard_rows(gen, dtype if fp8 else "float8_e4m3fn")
    rows["ulp-adjacent"] = S.ulp_adjacent_rows(gen, 3, 20)
    rows["boundary-all-zero"] = torch.zeros((2, 6))
    modes = (("static", 0.37), ("static", 3.5), ("per_row", 1.0)) if fp8 else (("static", 1.0),)
    for name, x in rows.items():
        for mode, static in modes:
            yield _convert_sample(name, x, dtype, mode, static, seed)
    yield _convert_sample("empty-batch", torch.zeros((0, 5)), dtype, modes[-1][0], modes[-1][1], seed)


def _convert_recipe(dtype: str):
    from hypothesis import strategies as st
    modes = st.sampled_from([("static", 0.37), ("static", 3.5), ("per_row", 1.0), ("static", 1.0)])
    return st.tuples(S.hard_logits_rows(max_vocab=64), modes).map(lambda t: _convert_sample(
        f"hyp-{t[0][3]}", S.build_hard_logits(t[0]) * 30, dtype, t[1][0], t[1][1], t[0][0]))


def _convert_errors():
    x = torch.zeros((2, 3))
    yield ErrorInput("mode-batch", lambda: dtypes.to_logits_dtype(x, "float8_e4m3fn", scale_mode="batch"), ValueError,
                     "not one of", "mode")
    yield ErrorInput("static-scale-negative", lambda: dtypes.to_logits_dtype(x, "float8_e4m3fn", static_scale=-1.0),
                     ValueError, "finite and > 0", "static_scale")
    yield ErrorInput("static-scale-nan", lambda: dtypes.to_logits_dtype(x, "float8_e4m3fn", static_scale=float("nan")),
                     ValueError, "finite and > 0", "static_scale")
    yield ErrorInput("dtype-not-logits", lambda: dtypes.to_logits_dtype(x, "float64"), ValueError,
                     "is not a logits dtype", "dtype")
    yield ErrorInput("empty-vocab", lambda: dtypes.to_logits_dtype(x[:, :0], "float16"), ValueError,
                     "expected shape", "logits")


# ---------------------------------------------------------------------------------------------
# the row argmax (torch path and the Triton kernel, interpreted on the CPU)


def _argmax_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        kw = {"block_v": 32} if which == "triton" else {}
        return {"index": row_argmax(s.args["x"], impl=which, **kw)}
    return impl


def _argmax_ref(s: SampleInput) -> dict:
    x = s.args["x"]
    return {"index": torch.tensor([reference.greedy_token(row) for row in x.float().numpy()],
                                  dtype=torch.int64).view(x.shape[0], 1)}


def _argmax_sample(name, x, dtype, seed):
    values, _ = S.as_logits_dtype(x, dtype)
    return SampleInput(name, {"x": values}, seed)


def _argmax_samples(small: bool):
    def samples(dtype: str, seed: int):
        gen = torch.Generator().manual_seed(seed)
        vocabs = (1, 31, 32, 33, 65) if small else (1, 31, 32, 33, 64, 65, 389, 4097)
        rows = 3 if small else 6
        for vocab in vocabs:
            yield _argmax_sample(f"tie-heavy-V{vocab}", S.tie_heavy_rows(gen, rows, vocab), dtype, seed)
        x = torch.zeros((3, 70))
        x[0, 0], x[1, 69], x[2, [5, 40]] = 1.0, 1.0, 2.0          # both edges; a tie across blocks
        yield _argmax_sample("boundary-V70", x, dtype, seed)
        yield _argmax_sample("ulp-adjacent", S.ulp_adjacent_rows(gen, 3, 70), dtype, seed)
        yield _argmax_sample("nan-rows", S.nan_rows(gen, 4, 70), dtype, seed)
        yield _argmax_sample("inf-rows", S.inf_rows(gen, 3, 70), dtype, seed)
        yield _argmax_sample("all-equal", torch.zeros((2, 70)), dtype, seed)
        yield _argmax_sample("empty-batch", torch.zeros((0, 33)), dtype, seed)
    return samples


def _argmax_recipe(dtype: str):
    return S.hard_logits_rows(max_vocab=70).map(lambda t: _argmax_sample(f"hyp-{t[3]}", S.build_hard_logits(t), dtype,
                                                                          t[0]))


def _argmax_errors(which: str):
    def errors():
        yield ErrorInput("1-D", lambda: row_argmax(torch.zeros(3), impl=which), ValueError, r"x must be \[N, V\]", "x")
        yield ErrorInput("empty-vocab", lambda: row_argmax(torch.zeros((2, 0)), impl=which), ValueError,
                         r"x must be \[N, V\] with V >= 1", "x")
        yield ErrorInput("bad-impl", lambda: row_argmax(torch.zeros((2, 3)), impl="cuda"), ValueError,
                         "impl must be one of", "impl")
    return errors


# ---------------------------------------------------------------------------------------------
# paged attention over the KV slot pool (torch path and the Triton kernel, interpreted on the CPU)

# The KV block sizes the attention kernels use, or may be tuned to: the boundary samples straddle
# every one (lengths b - 1, b, b + 1). The lengths are data of this file, never read from a kernel:
# a retune must not silently change the golden inputs. tests/meta/test_registry.py fails, naming
# this list, when a kernel's BLOCK_N leaves it.
KV_BLOCK_SIZES = (16, 32, 64, 128)
# (name suffix, live lengths) of the paged-attention boundary samples: b - 1, b, b + 1 of every
# KV_BLOCK_SIZES entry (and a live length of 1), grouped so that a sample's float32 arrays stay under
# the golden size cap (tests/support/golden_catalogue.py MAX_SAMPLE_BYTES; tests/meta/test_registry.py
# checks both).
ATTN_BOUNDARY_LIVE = (("16", (1, 15, 16, 17)), ("32", (31, 32, 33)), ("64", (63, 64, 65)),
                      ("128-below", (127,)), ("128-at", (128,)), ("128-above", (129,)))


def _attn_sample(name, seed, dtype, kv_lens, q_lens, *, region=0, page_size=1, heads=(2, 1), lanes=None,
                 garbage=False, keys=None) -> SampleInput:
    """A real paged layout: each request owns whole pages (shuffled over the pool, page 0 = the
    sink) covering its live indices and one more, reserved-but-unwritten index; the rest of its
    table row maps the sink, as `SlotTable` leaves unowned indices.
    garbage: every slot no live index uses (sink, spare pages, the tail of a request's last page)
    holds NaN; table entries past the live length point at NaN slots (the spare page, the sink) or
    at another request's live slot; padded query lanes are NaN."""
    gen = torch.Generator().manual_seed(seed)
    n, (nh, nkv), hd = len(kv_lens), heads, 16
    lanes = max([1, *q_lens]) if lanes is None else lanes
    live = [k + region + q for k, q in zip(kv_lens, q_lens)]
    max_context = max([1, *live]) + 2
    owned = [-(-(length + 1) // page_size) for length in live]
    num_pages = 1 + sum(owned) + 1
    order = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
    first = [sum(owned[:b]) for b in range(n)]
    table = torch.zeros((n + 1, max_context), dtype=torch.int64)
    rows = torch.randperm(n + 1, generator=gen)[:n]
    used = torch.zeros(num_pages * page_size, dtype=torch.bool)
    for b in range(n):
        pages = torch.tensor(order[first[b]:first[b] + owned[b]], dtype=torch.int64)
        slots = torch.zeros(max_context, dtype=torch.int64)
        mine = (pages[:, None] * page_size + torch.arange(page_size)).flatten()[:max_context]
        slots[:mine.numel()] = mine
        if garbage:   # past the live length: the spare page, the sink, another request's slot
            spare = [order[-1], 0, order[0]]
            for t in range(live[b], max_context):
                slots[t] = spare[t % 3] * page_size + t % page_size
        table[int(rows[b])] = slots
        used[slots[:live[b]]] = True
    shape = (num_pages * page_size, nkv, hd)
    k = S.normalish(gen, shape) if keys is None else keys(gen, shape)
    v = S.normalish(gen, shape)
    q = S.normalish(gen, (n, lanes, nh, hd))
    mask = S.coins(gen, (n, lanes, region + lanes), 0.5)
    mask[:, torch.arange(lanes), region + torch.arange(lanes)] = True      # every token sees itself
    if garbage:
        k[~used], v[~used] = float("nan"), float("nan")
        q[torch.arange(lanes)[None, :] >= torch.tensor(q_lens, dtype=torch.int64)[:, None]] = float("nan")
    torch_dtype = dtypes.dtype_info(dtype).torch_dtype
    return SampleInput(name, {"q": S.cast(q, torch_dtype), "k_cache": S.cast(k, torch_dtype),
                              "v_cache": S.cast(v, torch_dtype),
                              "req_to_token": table, "rows": rows, "kv_lens": torch.tensor(kv_lens, dtype=torch.int64),
                              "q_lens": torch.tensor(q_lens, dtype=torch.int64), "tree_mask": mask, "region": region},
                       seed)


def _ulp_keys(gen, shape):
    """Keys that are one float32 ulp apart along the slots (slot s: base * (1 + s * 2**-23), exact
    in float64, rounded once by the cast): scores tie up to an ulp or two."""
    base = S.normalish(gen, shape[1:])
    steps = torch.arange(shape[0], dtype=torch.float64)[:, None, None] * 2.0**-23
    return base[None] * (1 + steps)


def _attn_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        return {"out": ops.paged_attention(**s.args, impl=which)}
    return impl


def _attn_ref(s: SampleInput) -> dict:
    args = {k: (v.double().numpy() if isinstance(v, torch.Tensor) and v.dtype.is_floating_point
                else v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in s.args.items()}
    return {"out": torch.from_numpy(reference.paged_attention(**args))}


def _attn_samples(small: bool):
    def samples(dtype: str, seed: int):
        yield _attn_sample("empty-batch", seed, dtype, [], [])
        yield _attn_sample("decode", seed, dtype, [1, 12], [1, 1])
        yield _attn_sample("prefill-from-empty", seed + 1, dtype, [0, 0], [5, 3])
        yield _attn_sample("kv0-region-only", seed + 2, dtype, [0, 4], [2, 1], region=3)
        yield _attn_sample("page1-one-slot-pages", seed + 3, dtype, [5, 9], [3, 2], region=1, page_size=1)
        yield _attn_sample("page3-partial-last-page", seed + 4, dtype, [4, 2], [3, 2], region=2, page_size=3)
        yield _attn_sample("nan-garbage-past-live", seed + 5, dtype, [6, 3], [2, 3], region=2, page_size=3,
                           lanes=4, garbage=True)
        yield _attn_sample("ulp-adjacent-scores", seed + 6, dtype, [9, 5], [2, 2], keys=_ulp_keys)
        # live lengths around every KV block size (ATTN_BOUNDARY_LIVE); NaN slots right past each live end
        for j, (suffix, live) in enumerate(ATTN_BOUNDARY_LIVE):
            q_lens = [1 + i % 2 if n > 1 else 1 for i, n in enumerate(live)]
            yield _attn_sample(f"boundary-live-len-at-kv-block{suffix}", seed + 30 + j, dtype,
                               [n - q for n, q in zip(live, q_lens)], q_lens, page_size=2, heads=(1, 1), garbage=True)
        yield _attn_sample("gqa-8-to-2", seed + 9, dtype, [6], [2], region=1, heads=(8, 2))
        gen = torch.Generator().manual_seed(seed)
        for i in range(1):
            n = int(torch.randint(1, 4, (1,), generator=gen))
            kv = torch.randint(0, 13, (n,), generator=gen).tolist()
            ql = torch.randint(0, 4, (n,), generator=gen).tolist()
            yield _attn_sample(f"random-{i}", seed + 20 + i, dtype, kv, ql, region=int(torch.randint(0, 3, (1,),
                               generator=gen)), page_size=int(torch.randint(1, 5, (1,), generator=gen)),
                               heads=(2, 1) if small else (2, 2), lanes=3, garbage=True)
    return samples


def _attn_recipe(dtype: str):
    from hypothesis import strategies as st
    lens = st.lists(st.tuples(st.integers(0, 34), st.integers(0, 3)), min_size=1, max_size=3)
    return st.tuples(st.integers(0, 2**16), lens, st.integers(0, 2), st.integers(1, 4), st.booleans()).map(
        lambda t: _attn_sample(f"hyp-page{t[3]}", t[0], dtype, [a for a, _ in t[1]], [c for _, c in t[1]],
                               region=t[2], page_size=t[3], lanes=3, garbage=t[4]))


def _attn_errors(which: str):
    def call(**changes):
        s = _attn_sample("base", 0, "float32", [3, 2], [2, 1], region=1, heads=(4, 2))
        return lambda: ops.paged_attention(**{**s.args, **changes}, impl=which)
    base = _attn_sample("base", 0, "float32", [3, 2], [2, 1], region=1, heads=(4, 2)).args

    def errors():
        yield ErrorInput("q-3d", call(q=base["q"][0]), ValueError, r"q must be 4-D", "q")
        yield ErrorInput("q-int", call(q=base["q"].to(torch.int32)), ValueError, "q dtype", "q")
        yield ErrorInput("head-dim-12", call(q=base["q"][..., :12]), ValueError, "head_dim must be a power of two", "q")
        yield ErrorInput("k-dtype", call(k_cache=base["k_cache"].half()), ValueError, "k_cache must have q's dtype",
                         "k_cache")
        yield ErrorInput("v-shape", call(v_cache=base["v_cache"][:5]), ValueError, "v_cache must have", "v_cache")
        yield ErrorInput("gqa-3-heads", call(q=base["q"][:, :, :3]), ValueError, "multiple of", "num_heads")
        yield ErrorInput("kv-lens-int32", call(kv_lens=base["kv_lens"].int()), ValueError, r"kv_lens must be \[2\] int64",
                         "kv_lens")
        yield ErrorInput("kv-lens-negative", call(kv_lens=torch.tensor([-1, 2])), ValueError, "kv_lens must be >= 0",
                         "kv_lens")
        yield ErrorInput("q-lens-over-lanes", call(q_lens=torch.tensor([3, 1])), ValueError, r"q_lens must be in \[0, 2\]",
                         "q_lens")
        yield ErrorInput("live-past-max-context", call(kv_lens=torch.tensor([100, 2])), ValueError,
                         "must be <= ", "kv_lens")
        yield ErrorInput("row-out-of-table", call(rows=torch.tensor([0, 9])), ValueError, "rows must be in", "rows")
        yield ErrorInput("slot-out-of-pool", call(req_to_token=base["req_to_token"] + 10_000), ValueError,
                         "must be slots in", "req_to_token")
        yield ErrorInput("mask-shape", call(tree_mask=base["tree_mask"][:, :, :2]), ValueError,
                         r"tree_mask must be \[2, 2, 3\] bool", "tree_mask")
        yield ErrorInput("region-negative", call(region=-1), ValueError, "region must be >= 0", "region")
        yield ErrorInput("region-float", call(region=1.0), TypeError, "region must be an int", "region")
        yield ErrorInput("scale-zero", call(scale=0.0), ValueError, "scale must be finite and > 0", "scale")
        yield ErrorInput("q-list", call(q=[1.0]), TypeError, "q must be a torch.Tensor", "q")
        yield ErrorInput("bad-impl", lambda: ops.paged_attention(**base, impl="cuda"), ValueError,
                         "impl must be one of", "impl")
    return errors


# ---------------------------------------------------------------------------------------------
# naive EAGLE (docs/semantics.md 6.6): the flat KV index list of the fused verify (torch path and
# the Triton kernel on a padded grid, interpreted on the CPU), and decode attention over it

NKV_SENTINEL = -7          # what the output buffers hold before the op: entries it must not touch
NKV_PAD_PROGRAMS = 3       # the Triton record's grid: bs + 3 programs, the last 3 past the batch


def _nkv_sample(name, seed, lens, page_size, *, spare=0, index_dtypes=(torch.int64,) * 5, sink_lanes=(),
                extra_context=0) -> SampleInput:
    """A slot table as `SlotTable` lays it out: request b owns whole pages (shuffled over the pool,
    page 0 = the sink) covering its L + 2 verify indices, the rest of its row maps the sink; the
    rows are a permutation of the table's rows, one row unused. A lane of `sink_lanes` is an
    engine's padded lane: its row maps only the sink. The output buffers hold NKV_SENTINEL, and
    kv_indices has room for `spare` entries past the total (0: the capacity fits exactly).
    index_dtypes: of (req_to_token, rows, seq_lens, kv_indptr, kv_indices)."""
    gen = torch.Generator().manual_seed(seed)
    bs = len(lens)
    max_context = max([0, *lens]) + 2 + extra_context
    owned = [0 if b in sink_lanes else -(-(length + 2) // page_size) for b, length in enumerate(lens)]
    order = (torch.randperm(sum(owned), generator=gen) + 1).tolist()
    rows = torch.randperm(bs + 1, generator=gen)[:bs]
    table = torch.zeros((bs + 1, max_context), dtype=torch.int64)
    first = 0
    for b in range(bs):
        pages = torch.tensor(order[first:first + owned[b]], dtype=torch.int64)
        first += owned[b]
        slots = (pages[:, None] * page_size + torch.arange(page_size)).flatten()[:max_context]
        table[int(rows[b]), :slots.numel()] = slots
    total = 2 * sum(lens) + 3 * bs
    t_dt, r_dt, l_dt, p_dt, i_dt = index_dtypes
    return SampleInput(name, {"req_to_token": table.to(t_dt), "rows": rows.to(r_dt),
                              "seq_lens": torch.tensor(lens, dtype=l_dt),
                              "kv_indptr": torch.full((2 * bs + 1,), NKV_SENTINEL, dtype=p_dt),
                              "kv_indices": torch.full((total + spare,), NKV_SENTINEL, dtype=i_dt)}, seed)


def _nkv_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        a = s.args
        kv_indptr, kv_indices = a["kv_indptr"].clone(), a["kv_indices"].clone()   # the op writes in place
        if which == "triton":
            # The kernel wrapper on a padded grid: programs past the batch must write nothing.
            draft_kv_indices_impl(a["req_to_token"], a["rows"], a["seq_lens"], kv_indptr, kv_indices, "triton",
                                  num_programs=a["seq_lens"].shape[0] + NKV_PAD_PROGRAMS)
        else:
            got = ops.create_draft_kv_indices(**{**a, "kv_indptr": kv_indptr, "kv_indices": kv_indices}, impl=which)
            if got[0] is not kv_indptr or got[1] is not kv_indices:
                raise AssertionError("create_draft_kv_indices must return the buffers it was given")
        return {"kv_indptr": kv_indptr, "kv_indices": kv_indices}
    return impl


def _nkv_ref(s: SampleInput) -> dict:
    a = s.args
    indptr, indices = reference.create_draft_kv_indices(req_to_token=a["req_to_token"].tolist(),
                                                        rows=a["rows"].tolist(), seq_lens=a["seq_lens"].tolist())
    buffer = a["kv_indices"].tolist()            # entries past the list keep what the buffer held
    buffer[:len(indices)] = indices
    return {"kv_indptr": torch.tensor(indptr, dtype=a["kv_indptr"].dtype),
            "kv_indices": torch.tensor(buffer, dtype=a["kv_indices"].dtype)}


def _nkv_samples(small: bool):
    i32, i64 = torch.int32, torch.int64

    def samples(dtype: str, seed: int):
        yield _nkv_sample("empty-batch", seed, [], 1, spare=3)
        yield _nkv_sample("boundary-bs1-L0", seed + 1, [0], 1)
        yield _nkv_sample("ragged-page1", seed + 2, [5, 0, 12, 3, 0, 7], 1, spare=5)
        yield _nkv_sample("ragged-page4", seed + 3, [9, 0, 1, 6, 14], 4, spare=2)
        yield _nkv_sample("ragged-page16", seed + 4, [17, 0, 30, 2], 16, spare=4, extra_context=5)
        yield _nkv_sample("boundary-capacity-exact-page4", seed + 5, [4, 0, 11], 4)
        # 2s - 1 entries per request = 63, 65, 127, 129: around the kernel's copy block of 64
        yield _nkv_sample("boundary-list-at-copy-block", seed + 6, [30, 31, 62, 63], 16, spare=1)
        yield _nkv_sample("padded-lane-sink-row", seed + 7, [4, 9, 0], 4, spare=2, sink_lanes=(2,))
        yield _nkv_sample("int32-buffers-page4", seed + 8, [3, 0, 8], 4, spare=3, index_dtypes=(i32,) * 5)
        yield _nkv_sample("mixed-int-dtypes-page1", seed + 9, [2, 5], 1, spare=1,
                          index_dtypes=(i32, i64, i32, i64, i32))
        gen = torch.Generator().manual_seed(seed)
        bs = 13 if small else 64                                 # the interpreter runs a program in ~7 ms
        yield _nkv_sample(f"large-bs{bs}-page4", seed + 10, torch.randint(0, 17, (bs,), generator=gen).tolist(), 4,
                          spare=0 if small else 7)
        for i in range(1 if small else 3):
            bs = int(torch.randint(1, 9, (1,), generator=gen))
            lens = torch.randint(0, 40, (bs,), generator=gen).tolist()
            page = (1, 4, 16)[int(torch.randint(0, 3, (1,), generator=gen))]
            yield _nkv_sample(f"random-{i}-page{page}", seed + 20 + i, lens, page,
                              spare=int(torch.randint(0, 4, (1,), generator=gen)))
    return samples


def _nkv_recipe(dtype: str):
    from hypothesis import strategies as st
    lens = st.lists(st.integers(0, 40), min_size=0, max_size=6)
    return st.tuples(st.integers(0, 2**16), lens, st.sampled_from((1, 4, 16)), st.integers(0, 4), st.booleans()).map(
        lambda t: _nkv_sample(f"hyp-page{t[2]}", t[0], t[1], t[2], spare=t[3],
                              index_dtypes=((torch.int32 if t[4] else torch.int64),) * 5))


def _nkv_errors(which: str):
    base = _nkv_sample("base", 0, [3, 1], 4).args          # capacity exactly 2*4 + 3*2 = 14

    def call(**changes):
        return lambda: ops.create_draft_kv_indices(**{**base, **changes}, impl=which)

    def errors():
        table, rows, lens = base["req_to_token"], base["rows"], base["seq_lens"]
        yield ErrorInput("req-to-token-1d", call(req_to_token=table[0]), ValueError, "req_to_token must be 2-D",
                         "req_to_token")
        yield ErrorInput("req-to-token-float", call(req_to_token=table.float()), ValueError,
                         "req_to_token must be int32 or int64", "req_to_token")
        yield ErrorInput("rows-list", call(rows=[0, 1]), TypeError, "rows must be a torch.Tensor", "rows")
        yield ErrorInput("rows-length", call(rows=rows[:1]), ValueError, "rows must have one entry per request", "rows")
        yield ErrorInput("seq-lens-int16", call(seq_lens=lens.to(torch.int16)), ValueError,
                         "seq_lens must be int32 or int64", "seq_lens")
        yield ErrorInput("seq-lens-2d", call(seq_lens=lens[None]), ValueError, "seq_lens must be 1-D", "seq_lens")
        yield ErrorInput("indptr-length", call(kv_indptr=base["kv_indptr"][:4]), ValueError,
                         r"kv_indptr must have 2\*bs \+ 1 = 5 entries", "kv_indptr")
        yield ErrorInput("indptr-float", call(kv_indptr=base["kv_indptr"].double()), ValueError,
                         "kv_indptr must be int32 or int64", "kv_indptr")
        yield ErrorInput("indices-2d", call(kv_indices=base["kv_indices"][None]), ValueError,
                         "kv_indices must be 1-D", "kv_indices")
        yield ErrorInput("capacity-one-short", call(kv_indices=base["kv_indices"][:13]), ValueError,
                         r"kv_indices holds 13 entries, the batch needs 14 \(2\*sum\(seq_lens\) \+ 3\*bs\)", "kv_indices")
        yield ErrorInput("seq-lens-negative", call(seq_lens=torch.tensor([3, -1])), ValueError, "seq_lens must be >= 0",
                         "seq_lens")
        yield ErrorInput("seq-len-past-max-context", call(seq_lens=torch.tensor([3, 4])), ValueError,
                         r"seq_lens \+ 2 must be <= 5 \(req_to_token's max_context\)", "seq_lens")
        yield ErrorInput("row-out-of-table", call(rows=torch.tensor([0, 3])), ValueError, r"rows must be in \[0, 3\)",
                         "rows")
        yield ErrorInput("checked-string", call(checked="yes"), TypeError, "checked must be True, False or None",
                         "checked")
        yield ErrorInput("bad-impl", lambda: ops.create_draft_kv_indices(**base, impl="cuda"), ValueError,
                         "impl must be one of", "impl")
    return errors


def _ia_sample(name, seed, dtype, lens, *, heads=(2, 1), num_slots=24, start=0, spare=2, garbage=False,
               keys=None, index_dtype=torch.int64, lists=None) -> SampleInput:
    """N = len(lens) decode queries; query i's list has lens[i] entries, slots drawn (with repeats)
    from the pool's slots 1..num_slots-1, or `lists` (kv_indptr, kv_indices) given outright. The
    lists start at kv_indptr[0] = start; kv_indices has `start` entries before them and `spare`
    after them. garbage: slots no list names (the sink among them) hold NaN K/V, and the index
    entries outside the lists name those slots."""
    gen = torch.Generator().manual_seed(seed)
    (nh, nkv), hd = heads, 16
    if lists is None:
        indptr = [start]
        for length in lens:
            indptr.append(indptr[-1] + length)
        listed = torch.randint(1, num_slots, (indptr[-1] - start,), generator=gen)
    else:
        indptr, listed = lists[0], torch.tensor(lists[1], dtype=torch.int64)
        lens = [b - a for a, b in zip(indptr, indptr[1:])]
    n = len(lens)
    used = torch.zeros(num_slots, dtype=torch.bool)
    used[listed] = True
    unused = (~used).nonzero().flatten()
    outside = torch.randint(0, num_slots, (start + spare,), generator=gen)
    if garbage:
        outside = unused[torch.randint(0, unused.numel(), (start + spare,), generator=gen)]
    kv_indices = torch.cat([outside[:start], listed, outside[start:]])
    shape = (num_slots, nkv, hd)
    k = S.normalish(gen, shape) if keys is None else keys(gen, shape)
    v = S.normalish(gen, shape)
    q = S.normalish(gen, (n, nh, hd))
    if garbage:
        k[~used], v[~used] = float("nan"), float("nan")
    torch_dtype = dtypes.dtype_info(dtype).torch_dtype
    return SampleInput(name, {"q": S.cast(q, torch_dtype), "k_cache": S.cast(k, torch_dtype),
                              "v_cache": S.cast(v, torch_dtype),
                              "kv_indptr": torch.tensor(indptr, dtype=index_dtype), "kv_indices": kv_indices.to(index_dtype),
                              "scale": hd ** -0.5}, seed)


def _naive_lists(lens, page_size, seed):
    """(kv_indptr, kv_indices) of naive EAGLE's verify over a paged table (the reference's lists)."""
    a = _nkv_sample("lists", seed, lens, page_size).args
    return reference.create_draft_kv_indices(req_to_token=a["req_to_token"].tolist(), rows=a["rows"].tolist(),
                                             seq_lens=lens)


def _ia_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        # float16 / bfloat16 queries: the float32 result before the cast to q's dtype, so the record's
        # one tolerance covers every dtype (tests/test_draft_kv_indices.py checks the cast itself).
        low = s.args["q"].dtype in (torch.float16, torch.bfloat16)
        return {"out": ops.decode_attention_indexed(**s.args, impl=which, out_dtype=torch.float32 if low else None)}
    return impl


def _ia_ref(s: SampleInput) -> dict:
    a = s.args
    return {"out": torch.from_numpy(reference.decode_attention_indexed(
        a["q"].double().numpy(), a["k_cache"].double().numpy(), a["v_cache"].double().numpy(),
        a["kv_indptr"].numpy(), a["kv_indices"].numpy(), scale=a["scale"]))}


def _ia_samples(small: bool):
    def samples(dtype: str, seed: int):
        yield _ia_sample("empty-batch", seed, dtype, [])
        if not small:
            yield _ia_sample("decode", seed + 1, dtype, [1, 12, 7])
        yield _ia_sample("empty-kv-lists-give-zeros", seed + 2, dtype, [0, 5, 0, 3], start=2)
        yield _ia_sample("nan-garbage-outside-lists", seed + 3, dtype, [6, 3, 9], start=4, spare=3, garbage=True)
        yield _ia_sample("ulp-adjacent-scores", seed + 4, dtype, [9, 5], keys=_ulp_keys)
        for b in KV_BLOCK_SIZES:          # list lengths around every KV block size
            yield _ia_sample(f"boundary-list-len-at-kv-block{b}", seed + 40 + b, dtype, [b - 1, b, b + 1, 1],
                             heads=(1, 1), num_slots=40, garbage=True)
        yield _ia_sample("gqa-8-to-2", seed + 6, dtype, [6, 2], heads=(8, 2), num_slots=16)
        yield _ia_sample("mha-3-heads", seed + 7, dtype, [4, 7], heads=(3, 3), num_slots=12)
        if not small:
            yield _ia_sample("indptr-start-past-zero", seed + 8, dtype, [3, 0, 4], start=5)
        yield _ia_sample("int32-index-buffers", seed + 9, dtype, [5, 2, 8], index_dtype=torch.int32, garbage=True)
        for page in (4,) if small else (1, 4):
            yield _ia_sample(f"naive-eagle-lists-page{page}", seed + 10 + page, dtype, [], num_slots=48,
                             lists=_naive_lists([5, 0, 9], page, seed + page), garbage=True)
        gen = torch.Generator().manual_seed(seed)
        for i in range(1 if small else 2):
            n = int(torch.randint(1, 5, (1,), generator=gen))
            lens = torch.randint(0, 20, (n,), generator=gen).tolist()
            yield _ia_sample(f"random-{i}", seed + 20 + i, dtype, lens, heads=((2, 1), (4, 2))[i % 2],
                             start=int(torch.randint(0, 3, (1,), generator=gen)), garbage=bool(i % 2 == 0))
    return samples


def _ia_recipe(dtype: str):
    from hypothesis import strategies as st
    lens = st.lists(st.integers(0, 20), min_size=0, max_size=4)
    return st.tuples(st.integers(0, 2**16), lens, st.sampled_from(((2, 1), (4, 2), (1, 1))), st.integers(0, 3),
                     st.booleans()).map(
        lambda t: _ia_sample(f"hyp-heads{t[2][0]}-{t[2][1]}", t[0], dtype, t[1], heads=t[2], start=t[3],
                             garbage=t[4]))


def _ia_errors(which: str):
    base = _ia_sample("base", 0, "float32", [3, 0, 2], heads=(4, 2)).args      # 5 listed entries, 2 spare

    def call(**changes):
        return lambda: ops.decode_attention_indexed(**{**base, **changes}, impl=which)

    def errors():
        q, k, v = base["q"], base["k_cache"], base["v_cache"]
        yield ErrorInput("q-2d", call(q=q[0]), ValueError, r"q must be 3-D", "q")
        yield ErrorInput("q-int", call(q=q.to(torch.int32)), ValueError, "q dtype", "q")
        yield ErrorInput("head-dim-12", call(q=q[..., :12]), ValueError, "head_dim must be a power of two", "q")
        yield ErrorInput("k-dtype", call(k_cache=k.half()), ValueError, "k_cache must have q's dtype", "k_cache")
        yield ErrorInput("v-shape", call(v_cache=v[:5]), ValueError, "v_cache must have", "v_cache")
        yield ErrorInput("gqa-3-heads", call(q=q[:, :3]), ValueError, "multiple of", "num_heads")
        yield ErrorInput("indptr-length", call(kv_indptr=base["kv_indptr"][:3]), ValueError,
                         r"kv_indptr must have N \+ 1 = 4 entries", "kv_indptr")
        yield ErrorInput("indptr-float", call(kv_indptr=base["kv_indptr"].float()), ValueError,
                         "kv_indptr must be int32 or int64", "kv_indptr")
        yield ErrorInput("indices-2d", call(kv_indices=base["kv_indices"][None]), ValueError,
                         "kv_indices must be 1-D", "kv_indices")
        yield ErrorInput("indptr-decreasing", call(kv_indptr=torch.tensor([0, 3, 2, 5])), ValueError,
                         "kv_indptr must be non-decreasing", "kv_indptr")
        yield ErrorInput("indptr-past-indices", call(kv_indptr=torch.tensor([0, 3, 3, 8])), ValueError,
                         r"kv_indptr\[N\] = 8 is past the end of kv_indices \(7 entries\)", "kv_indices")
        yield ErrorInput("slot-out-of-pool", call(kv_indices=base["kv_indices"] + 1000), ValueError,
                         r"must be slots in \[0, 24\)", "kv_indices")
        yield ErrorInput("scale-missing", lambda: ops.decode_attention_indexed(
            *(base[a] for a in ("q", "k_cache", "v_cache", "kv_indptr", "kv_indices")), impl=which), TypeError,
            "keyword-only argument: 'scale'", "scale")
        yield ErrorInput("scale-zero", call(scale=0.0), ValueError, "scale must be finite and > 0", "scale")
        yield ErrorInput("scale-bool", call(scale=True), TypeError, "scale must be a float", "scale")
        yield ErrorInput("q-list", call(q=[1.0]), TypeError, "q must be a torch.Tensor", "q")
        yield ErrorInput("out-dtype-float16", lambda: ops.decode_attention_indexed(**base, impl=which,
                                                                                   out_dtype=torch.float16),
                         ValueError, "out_dtype must be None", "out_dtype")
        yield ErrorInput("bad-impl", lambda: ops.decode_attention_indexed(**base, impl="cuda"), ValueError,
                         "impl must be one of", "impl")
    return errors


# ---------------------------------------------------------------------------------------------
# Mamba state commit (docs/semantics.md 6.8): each request's state after its last accepted node,
# copied from the intermediate cache [L, bs, D, *state] into its slot of the state cache
# [L, S, *state]. The torch record goes through the op; the Triton record through the kernel
# wrapper with a small state chunk (interpreted on the CPU), so its states straddle chunk edges.
# A pure copy: dst compares exactly, and bit for bit (dst_bits) for NaN, -0.0 and subnormals.

MSS_TRITON_BLOCK = 32
MSS_BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
            torch.bfloat16: torch.int16}
MSS_MANTISSA_BITS = {torch.float64: 52, torch.float32: 23, torch.float16: 10,
                     torch.bfloat16: 7}   # subnormal codes: [1, 2**bits)


def _mss_bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(MSS_BITS[x.dtype])


def _mss_values(gen, shape, dtype, kind):
    """Random states of `dtype`. kind "nan": about a third of the entries NaN, ±inf, ±0.0 or ±max;
    "ulp": the draft nodes of one (layer, request) differ by one ulp per node (shape [L, bs, D, ...]:
    node d = base + d ulps), a sixth of the bases subnormal; "plain": normal values (`S.normalish`)."""
    x = S.cast(S.normalish(gen, shape), dtype)
    if kind == "nan":
        big = torch.finfo(dtype).max
        specials = S.cast(torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, big, -big],
                                       dtype=torch.float64), dtype)
        pick = torch.randint(0, 3 * specials.numel(), shape, generator=gen)
        x = torch.where(pick < specials.numel(), specials[pick.clamp(max=specials.numel() - 1)], x)
    elif kind == "ulp":
        bits = _mss_bits(x).to(torch.int64)
        sub = torch.randint(1, 2 ** MSS_MANTISSA_BITS[dtype] - 8, shape, generator=gen)      # subnormal codes
        bits = torch.where(torch.randint(0, 6, shape, generator=gen) == 0, sub, bits)
        if len(shape) >= 3:
            bits = bits[:, :, :1] + torch.arange(shape[2]).view(1, 1, -1, *([1] * (len(shape) - 3)))
        x = bits.to(MSS_BITS[dtype]).view(dtype)
    return x


def _mss_sample(name, seed, dtype, *, layers, num_slots, num_steps, state, slots, steps, kind="plain",
                index_dtype=torch.int64) -> SampleInput:
    """dst [layers, num_slots, *state] and src [layers, bs, num_steps, *state] of `dtype` (values of
    `_mss_values`' kind; dst's own values differ from src's); request r commits node steps[r] into
    slot slots[r]. dst holds NaN / ulp-neighbour values too for those kinds, so untouched slots
    must keep them bit for bit."""
    gen = torch.Generator().manual_seed(seed)
    torch_dtype = dtypes.dtype_info(dtype).torch_dtype
    bs = len(slots)
    src = _mss_values(gen, (layers, bs, num_steps, *state), torch_dtype, kind)
    dst = _mss_values(gen, (layers, num_slots, *state), torch_dtype, kind)
    if kind == "ulp":
        dst = (_mss_bits(dst) - 1).view(torch_dtype)
    return SampleInput(name, {"dst": dst, "src": src, "dst_indices": torch.tensor(slots, dtype=index_dtype),
                              "step_indices": torch.tensor(steps, dtype=index_dtype)}, seed)


def _mss_random(name, seed, dtype, *, layers, num_slots, bs, num_steps, state, skip=0.3, kind="plain"):
    """bs <= num_slots requests on distinct slots; each skipped with probability `skip`, and a
    skipped request's slot is then what a padded lane may hold: -1, num_slots, or a slot another
    request commits to."""
    gen = torch.Generator().manual_seed(seed + 1)
    slots = torch.randperm(num_slots, generator=gen)[:bs].tolist()
    steps = torch.randint(0, num_steps, (bs,), generator=gen).tolist()
    for r in range(bs):
        if bool(S.coins(gen, (), skip)):
            steps[r] = -1
            slots[r] = (-1, num_slots, slots[0], slots[r])[int(torch.randint(0, 4, (), generator=gen))]
    return _mss_sample(name, seed, dtype, layers=layers, num_slots=num_slots, num_steps=num_steps, state=state,
                       slots=slots, steps=steps, kind=kind)


def _mss_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        a = s.args
        dst = a["dst"].clone()                                              # the op writes in place
        if which == "triton":
            state_scatter_impl(dst, a["src"], a["dst_indices"], a["step_indices"], "triton", block=MSS_TRITON_BLOCK)
        elif ops.mamba_state_scatter(**{**a, "dst": dst}, impl=which) is not dst:
            raise AssertionError("mamba_state_scatter must return the dst it was given")
        return {"dst": dst, "dst_bits": _mss_bits(dst)}
    return impl


def _mss_ref(s: SampleInput) -> dict:
    a = s.args
    out = reference.mamba_state_scatter(dst=a["dst"].tolist(), src=a["src"].tolist(),
                                        dst_indices=a["dst_indices"].tolist(), step_indices=a["step_indices"].tolist())
    dst = torch.tensor(out, dtype=a["dst"].dtype).reshape(a["dst"].shape)
    return {"dst": dst, "dst_bits": _mss_bits(dst)}


def _mss_samples(small: bool):
    def samples(dtype: str, seed: int):
        def one(name, i, **kw):
            return _mss_sample(name, seed + i, dtype, **kw)
        shape = dict(layers=2, num_slots=7, num_steps=4, state=(5,))
        yield one("empty-batch", 0, **shape, slots=[], steps=[])
        yield one("boundary-slot-0-and-last-step-last", 1, **shape, slots=[6, 3, 0], steps=[3, 0, 3])
        yield one("all-skipped", 2, **shape, slots=[2, 5, 0], steps=[-1, -1, -1])
        yield one("mixed-steps", 3, layers=3, num_slots=9, num_steps=5, state=(2, 3),
                  slots=[4, 8, 1, 0, 6], steps=[2, 0, -1, 4, 1])
        # Padded lanes: skipped requests whose slots are -1, S, or a slot another request commits to.
        yield one("skips-with-padded-lane-slots", 4, **shape, slots=[-1, 3, 3, 7, 5], steps=[-1, 1, -1, -1, 2])
        # The second call of a commit: tracking slots (the top of the cache, every other one) with
        # their own steps; most requests cross no tracking boundary this cycle.
        yield one("tracking-second-call", 5, layers=2, num_slots=12, num_steps=4, state=(3,),
                  slots=[6, 8, 10, 7], steps=[-1, 2, 0, -1])
        yield one("nan-inf-signed-zero-copied", 6, **shape, slots=[1, 4, 6], steps=[2, -1, 0], kind="nan")
        yield one("ulp-adjacent-nodes-and-subnormals", 7, **shape, slots=[5, 2, 0], steps=[1, 2, -1], kind="ulp")
        yield one("int32-indices", 8, **shape, slots=[3, 0], steps=[0, 3], index_dtype=torch.int32)
        yield one("scalar-state", 9, layers=3, num_slots=4, num_steps=2, state=(), slots=[2, 0, 3], steps=[1, 0, -1])
        b = MSS_TRITON_BLOCK
        yield one("boundary-state-at-chunk-edges", 10, layers=1, num_slots=5, num_steps=2, state=(2 * b + 1,),
                  slots=[4, 1, 2], steps=[1, 0, 1])
        yield one("boundary-state-one-chunk", 11, layers=2, num_slots=3, num_steps=3, state=(b,),
                  slots=[2, 0], steps=[2, 1])
        if not small:
            yield _mss_random("large-L4-bs64", seed + 12, dtype, layers=4, num_slots=80, bs=64, num_steps=5,
                              state=(2, 3, 16))
        for i in range(1 if small else 3):
            gen = torch.Generator().manual_seed(seed + 20 + i)
            num_slots = int(torch.randint(1, 10, (), generator=gen))
            yield _mss_random(f"random-{i}", seed + 30 + i, dtype, layers=int(torch.randint(1, 4, (), generator=gen)),
                              num_slots=num_slots, bs=int(torch.randint(0, num_slots + 1, (), generator=gen)),
                              num_steps=int(torch.randint(1, 5, (), generator=gen)), state=((3,), (2, 5), (4, 9))[i % 3],
                              kind=("plain", "nan", "ulp")[i % 3])
    return samples


def _mss_recipe(dtype: str):
    from hypothesis import strategies as st
    return st.tuples(st.integers(0, 2**16), st.integers(1, 3), st.integers(1, 8), st.integers(0, 8), st.integers(1, 4),
                     st.sampled_from(((), (3,), (3, 13))), st.sampled_from((0.0, 0.3, 1.0)),
                     st.sampled_from(("plain", "nan", "ulp"))).map(
        lambda t: _mss_random(f"hyp-{t[7]}", t[0], dtype, layers=t[1], num_slots=t[2], bs=min(t[3], t[2]),
                              num_steps=t[4], state=t[5], skip=t[6], kind=t[7]))


def _mss_errors(which: str):
    base = _mss_sample("base", 0, "float32", layers=2, num_slots=6, num_steps=4, state=(5,),
                       slots=[4, 0, 2], steps=[1, -1, 3]).args

    def call(**changes):
        return lambda: ops.mamba_state_scatter(**{**base, **changes}, impl=which)

    def errors():
        dst, src, slots, steps = base["dst"], base["src"], base["dst_indices"], base["step_indices"]
        yield ErrorInput("positional-call", lambda: ops.mamba_state_scatter(dst, src, slots, steps), TypeError,
                         "takes 0 positional arguments", "positional")
        yield ErrorInput("dst-list", call(dst=dst.tolist()), TypeError, "dst must be a torch.Tensor", "dst")
        yield ErrorInput("dst-1d", call(dst=dst[0, 0]), ValueError, r"dst must be \[L, S, \*state\] \(at least 2-D\)",
                         "dst")
        yield ErrorInput("dst-int32", call(dst=dst.to(torch.int32)), ValueError,
                         r"dst dtype torch.int32 is not a state dtype \(bfloat16, float16, float32, float64\)", "dst")
        yield ErrorInput("dst-float8", call(dst=dst.to(torch.float8_e4m3fn), src=src.to(torch.float8_e4m3fn)),
                         ValueError, r"dst dtype torch.float8_e4m3fn is not a state dtype", "dst")
        yield ErrorInput("src-dtype-mismatch", call(src=src.half()), ValueError,
                         "src must have dst's dtype torch.float32, got torch.float16", "src")
        yield ErrorInput("src-device", call(src=src.to("meta")), ValueError, "src is on meta, dst on cpu", "src")
        yield ErrorInput("src-missing-node-dim", call(src=src[:, :, 0]), ValueError,
                         r"src must be \[L, bs, D, \*state\] with dst's state dims \(4-D\)", "src")
        yield ErrorInput("src-layers", call(src=torch.cat([src, src[:1]])), ValueError,
                         "src must have dst's L = 2 layers, got 3", "src")
        yield ErrorInput("src-state-shape", call(src=src[..., :4]), ValueError,
                         r"src must have dst's state shape \(5,\), got \(4,\)", "src")
        yield ErrorInput("dst-indices-float", call(dst_indices=slots.float()), ValueError,
                         "dst_indices must be int32 or int64", "dst_indices")
        yield ErrorInput("step-indices-bool", call(step_indices=steps >= 0), ValueError,
                         "step_indices must be int32 or int64", "step_indices")
        yield ErrorInput("step-indices-list", call(step_indices=steps.tolist()), TypeError,
                         "step_indices must be a torch.Tensor", "step_indices")
        yield ErrorInput("dst-indices-length", call(dst_indices=slots[:2]), ValueError,
                         r"dst_indices must have one entry per request \(src has bs = 3\), got 2", "dst_indices")
        yield ErrorInput("step-indices-2d", call(step_indices=steps[None]), ValueError, "step_indices must be 1-D",
                         "step_indices")
        yield ErrorInput("step-past-last-node", call(step_indices=torch.tensor([1, 4, 3])), ValueError,
                         r"step_indices must be in \[-1, D\) = \[-1, 4\)", "step_indices")
        yield ErrorInput("step-below-skip", call(step_indices=torch.tensor([1, -2, 3])), ValueError,
                         r"step_indices must be in \[-1, D\) = \[-1, 4\)", "step_indices")
        yield ErrorInput("slot-past-cache", call(dst_indices=torch.tensor([6, 0, 2])), ValueError,
                         r"dst_indices of committing requests \(step_indices >= 0\) must be slots in \[0, 6\)",
                         "dst_indices")
        yield ErrorInput("slot-negative", call(dst_indices=torch.tensor([4, 0, -1])), ValueError,
                         r"must be slots in \[0, 6\)", "dst_indices")
        yield ErrorInput("duplicate-slots", call(dst_indices=torch.tensor([2, 0, 2])), ValueError,
                         r"dst_indices must be distinct among committing requests", "dst_indices")
        yield ErrorInput("checked-string", call(checked="yes"), TypeError, "checked must be True, False or None",
                         "checked")
        yield ErrorInput("bad-impl", lambda: ops.mamba_state_scatter(**base, impl="cuda"), ValueError,
                         "impl must be one of", "impl")
    return errors


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


# ---------------------------------------------------------------------------------------------
# DFlash (docs/semantics.md 6.9): the greedy block verify, (correct drafts without the bonus,
# bonus); the torch path and the Triton kernel (interpreted on the CPU)

# Token ids are only compared for equality: nothing floating is read or written.
DFLASH_EDGE_EXEMPT = (("nan", "token ids compared for equality: no floating value is read or written"),
                      ("ulp", "token ids compared for equality: no floating value is read or written"))


def _dflash_sample(name, seed, bs, width, *, vocab=29, tokens=None, runs=None, after="random",
                   index_dtypes=(torch.int64, torch.int64)) -> SampleInput:
    """bs blocks of `width` tokens. target_predict is drawn from [0, vocab) (or from `tokens`, at
    least two). Row b's first runs[b] drafts equal the predictions (runs None: drawn in
    [0, width - 1]); when a draft is left, the next one misses, and the drafts after it are `after`:
    "match" (right again: the run must stop at the miss all the same) or "random". A block of one
    (no draft) gets the root of row b + 1 equal to row b's prediction, so a kernel reading one
    column past its block meets a "match". index_dtypes: of (candidates, target_predict)."""
    gen = torch.Generator().manual_seed(seed)
    pool = torch.arange(vocab) if tokens is None else torch.tensor(tokens, dtype=torch.int64)

    def draw(*shape):
        return pool[torch.randint(0, pool.numel(), shape, generator=gen)]

    pred, cand = draw(bs, width), draw(bs, width)
    runs = torch.randint(0, width, (bs,), generator=gen).tolist() if runs is None else list(runs)
    for b, n in enumerate(runs):
        cand[b, 1:n + 1] = pred[b, :n]
        if n + 1 < width:
            others = pool[pool != pred[b, n]]
            cand[b, n + 1] = others[int(torch.randint(0, others.numel(), (1,), generator=gen))]
            if after == "match":
                cand[b, n + 2:] = pred[b, n + 1:-1]
    if width == 1:
        cand[1:, 0] = pred[:-1, 0]
    c_dt, p_dt = index_dtypes
    return SampleInput(name, {"candidates": cand.to(c_dt), "target_predict": pred.to(p_dt)}, seed)


def _dflash_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        correct, bonus = ops.dflash_correct_drafts_and_bonus(**s.args, impl=which)
        if correct.dtype != torch.int32 or bonus.dtype != torch.int64:
            raise AssertionError(f"dflash_correct_drafts_and_bonus returned {correct.dtype} / {bonus.dtype}, "
                                 f"want int32 / int64")
        return {"correct": correct, "bonus": bonus}
    return impl


def _dflash_ref(s: SampleInput) -> dict:
    a = s.args
    correct, bonus = reference.dflash_correct_drafts_and_bonus(candidates=a["candidates"].tolist(),
                                                               target_predict=a["target_predict"].tolist())
    return {"correct": torch.tensor(correct, dtype=torch.int32), "bonus": torch.tensor(bonus, dtype=torch.int64)}


def _dflash_samples(small: bool):
    i32, i64 = torch.int32, torch.int64

    def samples(dtype: str, seed: int):
        yield _dflash_sample("empty-batch", seed, 0, 4)
        yield _dflash_sample("empty-batch-block1", seed + 1, 0, 1)
        yield _dflash_sample("boundary-block1", seed + 2, 6, 1)
        yield _dflash_sample("boundary-block2-one-draft", seed + 3, 5, 2, runs=[0, 1, 1, 0, 1])
        yield _dflash_sample("boundary-all-correct", seed + 4, 4, 7, runs=[6] * 4)
        yield _dflash_sample("first-draft-wrong-then-match", seed + 5, 4, 6, runs=[0] * 4, after="match")
        yield _dflash_sample("mismatch-then-match", seed + 6, 6, 8, runs=[1, 3, 5, 2, 6, 0], after="match")
        yield _dflash_sample("boundary-tokens-0-and-V-1", seed + 7, 5, 6, tokens=(0, 151935), after="match")
        yield _dflash_sample("boundary-ids-above-int32", seed + 8, 3, 5, tokens=(2**31 - 1, 2**31, 2**40 + 3),
                             runs=[4, 2, 0], after="match")
        # B - 1 = 16 drafts fill the kernel's lanes exactly; 17 spill into a block of 32
        yield _dflash_sample("boundary-drafts-fill-lanes", seed + 9, 3, 17, runs=[16, 15, 7], after="match")
        yield _dflash_sample("boundary-drafts-past-lanes", seed + 10, 3, 18, runs=[17, 16, 0], after="match")
        yield _dflash_sample("int32-inputs", seed + 11, 5, 6, index_dtypes=(i32, i32), after="match")
        yield _dflash_sample("mixed-int32-int64", seed + 12, 4, 5, index_dtypes=(i32, i64))
        yield _dflash_sample("mixed-int64-int32", seed + 13, 4, 5, index_dtypes=(i64, i32), after="match")
        yield _dflash_sample("bs1-block16", seed + 14, 1, 16)
        bs = 13 if small else 64
        yield _dflash_sample(f"large-bs{bs}-block16", seed + 15, bs, 16, vocab=7)
        gen = torch.Generator().manual_seed(seed)
        for i in range(1 if small else 3):
            bs, width, vocab = (int(torch.randint(low, high, (1,), generator=gen)) for low, high in
                                ((1, 9), (1, 12), (2, 40)))
            yield _dflash_sample(f"random-{i}", seed + 20 + i, bs, width, vocab=vocab, after=("random", "match")[i % 2])
    return samples


def _dflash_recipe(dtype: str):
    from hypothesis import strategies as st
    return st.tuples(st.integers(0, 2**16), st.integers(0, 6), st.integers(1, 12), st.integers(2, 30),
                     st.sampled_from(("random", "match")), st.booleans()).map(
        lambda t: _dflash_sample(f"hyp-block{t[2]}", t[0], t[1], t[2], vocab=t[3], after=t[4],
                                 index_dtypes=((torch.int32 if t[5] else torch.int64),) * 2))


def _dflash_errors(which: str):
    base = _dflash_sample("base", 0, 2, 4).args

    def call(**changes):
        return lambda: ops.dflash_correct_drafts_and_bonus(**{**base, **changes}, impl=which)

    def errors():
        cand, pred = base["candidates"], base["target_predict"]
        yield ErrorInput("candidates-list", call(candidates=cand.tolist()), TypeError,
                         "candidates must be a torch.Tensor", "candidates")
        yield ErrorInput("candidates-1d", call(candidates=cand[0]), ValueError, "candidates must be 2-D", "candidates")
        yield ErrorInput("target-predict-3d", call(target_predict=pred[None]), ValueError,
                         "target_predict must be 2-D", "target_predict")
        yield ErrorInput("candidates-float", call(candidates=cand.float()), ValueError,
                         "candidates must be int32 or int64", "candidates")
        yield ErrorInput("target-predict-int16", call(target_predict=pred.to(torch.int16)), ValueError,
                         "target_predict must be int32 or int64", "target_predict")
        yield ErrorInput("width-mismatch", call(target_predict=pred[:, :3]), ValueError,
                         r"target_predict must have candidates' shape \(2, 4\)", "target_predict")
        yield ErrorInput("bs-mismatch", call(target_predict=pred[:1]), ValueError,
                         r"target_predict must have candidates' shape \(2, 4\)", "target_predict")
        yield ErrorInput("block-of-zero", call(candidates=cand[:, :0], target_predict=pred[:, :0]), ValueError,
                         "candidates must have B >= 1 columns", "candidates")
        yield ErrorInput("device-mismatch", call(target_predict=pred.to("meta")), ValueError,
                         "target_predict is on meta", "target_predict")
        yield ErrorInput("candidates-negative", call(candidates=torch.tensor([[3, 1, 2, 0], [4, -1, 2, 2]])),
                         ValueError, "candidates must hold token ids >= 0, got -1", "candidates")
        yield ErrorInput("target-predict-negative", call(target_predict=torch.tensor([[3, 1, -2, 0], [4, 1, 2, 2]])),
                         ValueError, "target_predict must hold token ids >= 0, got -2", "target_predict")
        yield ErrorInput("token-past-vocab", call(candidates=torch.tensor([[3, 1, 2, 0], [4, 1, 2, 2]]),
                                                  target_predict=torch.tensor([[3, 1, 2, 0], [4, 1, 5, 2]]),
                                                  vocab_size=5), ValueError,
                         r"target_predict must hold token ids < vocab_size \(5\), got 5", "target_predict")
        yield ErrorInput("vocab-size-float", call(vocab_size=29.0), TypeError, "vocab_size must be an int",
                         "vocab_size")
        yield ErrorInput("vocab-size-zero", call(vocab_size=0), ValueError, "vocab_size must be >= 1", "vocab_size")
        yield ErrorInput("checked-string", call(checked="yes"), TypeError, "checked must be True, False or None",
                         "checked")
        yield ErrorInput("bad-impl", lambda: ops.dflash_correct_drafts_and_bonus(**base, impl="cuda"), ValueError,
                         "impl must be one of", "impl")
    return errors


# ---------------------------------------------------------------------------------------------
# the registry

ALL_LOGITS = dtypes.LOGITS_DTYPES
FLOAT_LOGITS = ("float32", "bfloat16", "float16")


def _per_policy(fp8_for_cuda, fp8_for_rocm):
    return {"cpu": FLOAT_LOGITS + dtypes.FP8_DTYPES, "cuda": FLOAT_LOGITS + fp8_for_cuda,
            "rocm": FLOAT_LOGITS + fp8_for_rocm}


LOGITS_BY_POLICY = _per_policy(("float8_e4m3fn", "float8_e5m2"), ("float8_e4m3fnuz", "float8_e5m2fnuz"))
FP8_BY_POLICY = {"cpu": dtypes.FP8_DTYPES, "cuda": ("float8_e4m3fn", "float8_e5m2"),
                 "rocm": ("float8_e4m3fnuz", "float8_e5m2fnuz")}


# An index op: no floating value anywhere, so no NaN and no ulp neighbours to meet.
NKV_EDGE_EXEMPT = (("nan", "an integer index op: no floating value is read or written"),
                   ("ulp", "an integer index op: no floating value is read or written"))


def _only(*names):
    return {p: tuple(names) for p in POLICIES}


REGISTRY: dict[str, OpSpec] = {op.name: op for op in (
    OpSpec("select_draft_topk", _select_impl, _select_ref, _select_samples, _select_recipe, _select_errors,
           LOGITS_BY_POLICY, {"index": EXACT, "p": CLOSE}, max_examples=12),
    OpSpec("draft_tree", _tree_impl, _tree_ref, _tree_samples, _tree_recipe, _tree_errors, _only("float32"),
           {f: EXACT for f in TREE_FIELDS + ("kept_flat",)}, platform_dependent=False, max_examples=20),
    OpSpec("verify_greedy", _greedy_impl, _greedy_ref, _verify_samples, _verify_recipe, _verify_errors,
           LOGITS_BY_POLICY, {"accept_nodes": EXACT, "num_correct": EXACT, "bonus": EXACT},
           platform_dependent=False, max_examples=8),
    OpSpec("verify_stochastic", _stochastic_impl, _stochastic_ref, _stochastic_samples, _verify_recipe,
           _stochastic_errors, _only("float64"), {"accept_nodes": EXACT, "num_correct": EXACT, "bonus": EXACT},
           platform_dependent=False, max_examples=20,
           edge_exempt=(("nan", "target_probs come from sampling_probs, which turns a row holding NaN into NaN "
                                "everywhere; the reference refuses to draw from it (ValueError) and the optimized op "
                                "reads no values on its hot path: NaN rows are outside 6.4's contract"),)),
    OpSpec("verify_naive", _naive_impl, _naive_ref, _naive_samples, _naive_recipe, _naive_errors, _only("float64"),
           {"accept_nodes": EXACT, "num_correct": EXACT, "bonus": EXACT}, platform_dependent=False, max_examples=20),
    OpSpec("sampling_probs", _sampling_impl, _sampling_ref, _sampling_samples, _sampling_recipe, _sampling_errors,
           LOGITS_BY_POLICY, {"p": CLOSE}, tolerance_dtype="float64", platform_dependent=False, max_examples=8),
    OpSpec("sample_from_probs", _draw_impl, _draw_ref, _draw_samples, _draw_recipe, _draw_errors, _only("float64"),
           {"token": EXACT}, platform_dependent=False, max_examples=25),
    OpSpec("logprob_rows", _logprob_impl, _logprob_ref, _logprob_samples, _logprob_recipe, _logprob_errors,
           LOGITS_BY_POLICY, {"ids": EXACT, "logprobs": CLOSE, "ranks": EXACT}, tolerance_dtype="float64",
           platform_dependent=False, max_examples=8),
    OpSpec("quantize_fp8", _quantize_impl, _quantize_ref, _quantize_samples, _quantize_recipe, _quantize_errors,
           FP8_BY_POLICY, {"codes": EXACT}, platform_dependent=False, max_examples=10),
    OpSpec("convert_logits", _convert_impl, _convert_ref, _convert_samples, _convert_recipe, _convert_errors,
           LOGITS_BY_POLICY, {"upcast": EXACT, "scale": EXACT}, platform_dependent=False, max_examples=8),
    OpSpec("row_argmax", _argmax_impl("torch"), _argmax_ref, _argmax_samples(False), _argmax_recipe,
           _argmax_errors("torch"), LOGITS_BY_POLICY, {"index": EXACT}, platform_dependent=False, max_examples=10),
    OpSpec("row_argmax_triton", _argmax_impl("triton"), _argmax_ref, _argmax_samples(True), _argmax_recipe,
           _argmax_errors("triton"), LOGITS_BY_POLICY, {"index": EXACT}, platform_dependent=False, max_examples=3),
    OpSpec("paged_attention", _attn_impl("torch"), _attn_ref, _attn_samples(False), _attn_recipe,
           _attn_errors("torch"), _only("float32", "float16", "bfloat16"), {"out": CLOSE}, platform_dependent=False,
           max_examples=10),
    OpSpec("paged_attention_triton", _attn_impl("triton"), _attn_ref, _attn_samples(True), _attn_recipe,
           _attn_errors("triton"), _only("float32", "float16", "bfloat16"), {"out": CLOSE},
           platform_dependent=False, max_examples=3),
    OpSpec("create_draft_kv_indices", _nkv_impl("torch"), _nkv_ref, _nkv_samples(False), _nkv_recipe,
           _nkv_errors("torch"), _only("float32"), {"kv_indptr": EXACT, "kv_indices": EXACT},
           platform_dependent=False, max_examples=15, edge_exempt=NKV_EDGE_EXEMPT),
    OpSpec("create_draft_kv_indices_triton", _nkv_impl("triton"), _nkv_ref, _nkv_samples(True), _nkv_recipe,
           _nkv_errors("triton"), _only("float32"), {"kv_indptr": EXACT, "kv_indices": EXACT},
           platform_dependent=False, max_examples=3, edge_exempt=NKV_EDGE_EXEMPT),
    OpSpec("decode_attention_indexed", _ia_impl("torch"), _ia_ref, _ia_samples(False), _ia_recipe,
           _ia_errors("torch"), _only("float32", "float16", "bfloat16", "float64"), {"out": CLOSE},
           platform_dependent=False, max_examples=10),
    OpSpec("decode_attention_indexed_triton", _ia_impl("triton"), _ia_ref, _ia_samples(True), _ia_recipe,
           _ia_errors("triton"), _only("float32", "float16", "bfloat16"), {"out": CLOSE}, platform_dependent=False,
           max_examples=3),
    OpSpec("mamba_state_scatter", _mss_impl("torch"), _mss_ref, _mss_samples(False), _mss_recipe, _mss_errors("torch"),
           _only("float32", "float16", "bfloat16", "float64"), {"dst": EXACT, "dst_bits": EXACT}, platform_dependent=False,
           max_examples=15),
    OpSpec("mamba_state_scatter_triton", _mss_impl("triton"), _mss_ref, _mss_samples(True), _mss_recipe,
           _mss_errors("triton"), _only("float32", "float16", "bfloat16"), {"dst": EXACT, "dst_bits": EXACT},
           platform_dependent=False, max_examples=3),
    OpSpec("message_codec", _codec_impl, _codec_ref, _codec_samples, _codec_recipe, _codec_errors,
           _only("float32"), {"meta": EXACT, "counts": EXACT, "token_ids": EXACT, "logprobs": EXACT,
                                   "ranks": EXACT}, platform_dependent=False, max_examples=15),
    OpSpec("dflash_correct_drafts_and_bonus", _dflash_impl("torch"), _dflash_ref, _dflash_samples(False),
           _dflash_recipe, _dflash_errors("torch"), _only("float32"), {"correct": EXACT, "bonus": EXACT},
           platform_dependent=False, max_examples=20, edge_exempt=DFLASH_EDGE_EXEMPT),
    OpSpec("dflash_correct_drafts_and_bonus_triton", _dflash_impl("triton"), _dflash_ref, _dflash_samples(True),
           _dflash_recipe, _dflash_errors("triton"), _only("float32"), {"correct": EXACT, "bonus": EXACT},
           platform_dependent=False, max_examples=8, edge_exempt=DFLASH_EDGE_EXEMPT),
)}


def compare_outputs(op: OpSpec, got: dict, want: dict, what: str) -> None:
    """Every output named in op.compare: EXACT (integers equal; floats equal, NaN matching NaN)
    or CLOSE (the tolerance table entry of op.tolerance_dtype)."""
    from tests.support.asserts import assert_close
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
            assert_close(g, w, op.tolerance_dtype, f"{what}: output {name!r}")
