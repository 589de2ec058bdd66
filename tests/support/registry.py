"""The op registry: every op with an optimized and a reference implementation, described once.

An `OpSpec` names the op, its two callables (both take a `SampleInput` and return a dict of named
outputs), its input generators (named edge cases, seeded random samples, a hypothesis recipe), its
error inputs, the dtypes it supports per platform policy, how each output compares, and scoped
expectations (xfail / skip with a reason, keyed by test, platform and dtype). Differential and
property tests are generated from these records; another engine can be checked by registering its
implementation as a third callable of the same records.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

import numpy as np
import torch

import reference
from reference import spec as rspec
from specverify import dtypes, ops
from specverify.kernels.tree import build_tree
from specverify.kernels.verify import target_predict, verify_greedy, verify_stochastic
from specverify.spec.eagle import expand_search, finish_search, start_search
from tests.support import strategies as S

EXACT = "exact"
CLOSE = "close"        # by the tolerance table entry of OpSpec.tolerance_dtype


@dataclasses.dataclass(frozen=True)
class SampleInput:
    name: str
    args: dict
    seed: int = 0

    def summary(self) -> str:
        parts = []
        for key, value in self.args.items():
            if isinstance(value, torch.Tensor):
                parts.append(f"{key}={tuple(value.shape)}:{str(value.dtype).replace('torch.', '')}")
            elif isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
                parts.append(f"{key}=[{len(value)} tensors]")
            else:
                parts.append(f"{key}={value!r}")
        return f"{self.name}(seed={self.seed}; {', '.join(parts)})"

    __repr__ = summary


@dataclasses.dataclass(frozen=True)
class ErrorInput:
    name: str
    call: Callable[[], Any]     # runs the optimized op on the bad input
    exc: type
    match: str


@dataclasses.dataclass(frozen=True)
class Expectation:
    """A scoped exception to the generic tests: `kind` is "xfail" or "skip"."""
    kind: str
    test: str                   # generic test name, e.g. "test_differential"
    reason: str
    platform: str | None = None  # policy name ("cpu", "cuda", "rocm"), None = every platform
    dtype: str | None = None
    raises: type | None = None  # xfail only: the narrow exception it expects


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
    expectations: tuple[Expectation, ...] = ()

    def __post_init__(self):
        if not self.compare:
            raise ValueError(f"op {self.name}: compare names no output")
        bad = [m for m in self.compare.values() if m not in (EXACT, CLOSE)]
        if bad:
            raise ValueError(f"op {self.name}: unknown comparison {bad}")
        for policy, names in self.dtypes.items():
            unknown = [d for d in names if d not in dtypes.DTYPES]
            if unknown:
                raise ValueError(f"op {self.name}: platform {policy} lists unknown dtypes {unknown}")
        for e in self.expectations:
            if e.kind not in ("xfail", "skip"):
                raise ValueError(f"op {self.name}: expectation kind {e.kind!r}")
            if e.kind == "xfail" and e.raises is None:
                raise ValueError(f"op {self.name}: an xfail must name the exception it expects")

    def dtypes_for(self, policy: str) -> tuple[str, ...]:
        return self.dtypes.get(policy, ())

    def expectation(self, test: str, policy: str, dtype: str) -> Expectation | None:
        for e in self.expectations:
            if e.test == test and e.platform in (None, policy) and e.dtype in (None, dtype):
                return e
        return None


def on_device(value, device):
    """Move every tensor inside a sample's args (dicts and lists too) to `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: on_device(v, device) for k, v in value.items()}
    if isinstance(value, list):
        return [on_device(v, device) for v in value]
    return value


def run_impl(op: "OpSpec", sample: SampleInput, profile) -> dict:
    """The optimized op on the profile's device; outputs come back to the CPU."""
    moved = dataclasses.replace(sample, args=on_device(sample.args, profile.device))
    return {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in op.impl(moved, profile).items()}


def replay_command(test: str, op: str, profile: str, dtype: str, sample: SampleInput) -> str:
    return (f"SPECVERIFY_PLATFORM={profile} python -m pytest 'tests/test_ops_differential.py::{test}"
            f"[{op}-{profile}-{dtype}]'  # failing sample: {sample.summary()}")


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


def _select_ref(s: SampleInput) -> dict:
    logits, scale, k = s.args["logits"], s.args["scale"], s.args["topk"]
    upcast = logits.float().numpy()
    deq = logits.double().numpy() * scale.double().numpy()
    ps, idx = [], []
    for row_up, row_dq in zip(upcast, deq):
        p, i = rspec.select_draft_topk(row_up, k, row_dq)
        ps.append(p)
        idx.append(i)
    return {"index": torch.tensor(idx, dtype=torch.int64), "p": torch.tensor(ps, dtype=torch.float64)}


def _select_sample(name, x, dtype, k, seed):
    values, scale = S.as_logits_dtype(x, dtype)
    return SampleInput(name, {"logits": values, "scale": scale, "topk": min(k, x.shape[1])}, seed)


def _select_samples(dtype: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    for vocab in (2, 63, 64, 65, 389, 1025):         # around kernel block sizes
        for k in (1, 2, 4):
            yield _select_sample(f"grid-V{vocab}-k{k}", S.grid_logits(gen, 3, vocab), dtype, k, seed)
            yield _select_sample(f"tie-heavy-V{vocab}-k{k}", S.tie_heavy_rows(gen, 3, vocab), dtype, k, seed)
    for name, rows in S.edge_logits(70).items():
        for k in (1, 3):
            yield _select_sample(f"{name}-k{k}", rows, dtype, k, seed)
    yield _select_sample("bs1", S.tie_heavy_rows(gen, 1, 389), dtype, 1, seed)
    yield _select_sample("large-bs", S.tie_heavy_rows(gen, 257, 97), dtype, 2, seed)


def _select_recipe(dtype: str):
    from hypothesis import strategies as st
    return st.tuples(S.logits_rows(), st.integers(1, 4)).map(
        lambda t: _select_sample(f"hyp-{t[0][3]}", S.build_logits(t[0]), dtype, t[1], t[0][0]))


def _select_errors():
    x = torch.zeros((2, 5))
    one = torch.ones((2, 1))

    def call(logits=x, k=1, scale=one):
        return lambda: ops.select_draft_topk(logits, k, platform="cpu", scale=scale)
    yield ErrorInput("topk-0", call(k=0), ValueError, r"topk must be in \[1, 5\]")
    yield ErrorInput("topk-above-vocab", call(k=6), ValueError, r"topk must be in \[1, 5\]")
    yield ErrorInput("1-D", call(logits=x[0]), ValueError, "logits must be 2-D")
    yield ErrorInput("int-logits", call(logits=x.long()), ValueError, "logits dtype torch.int64 is not a logits dtype")
    yield ErrorInput("bad-scale", call(scale=torch.ones(3, 1)), ValueError, r"scale must have shape \[2, 1\]")


# ---------------------------------------------------------------------------------------------
# draft tree


def _tree_inputs(seed, bs, topk, steps, d, vocab) -> SampleInput:
    gen = torch.Generator().manual_seed(seed)
    dists = [S.probs_from(gen, (bs, 1 if i == 0 else topk), vocab) for i in range(steps)]
    roots = torch.randint(0, vocab, (bs,), generator=gen)
    seq_lens = torch.randint(0, 50, (bs,), generator=gen)
    return SampleInput(f"tree-k{topk}-S{steps}-D{d}", {"dists": dists, "roots": roots, "seq_lens": seq_lens,
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
    out = {f: torch.tensor([getattr(t, f) for t in trees]) for f in TREE_FIELDS}
    out["kept_flat"] = torch.tensor([t.kept_flat for t in trees], dtype=torch.int64)
    return out


def _tree_samples(dtype: str, seed: int):
    for shape in ((2, 1, 3, 4), (3, 2, 3, 5), (2, 4, 3, 8), (1, 3, 4, 10), (4, 2, 1, 3), (2, 4, 2, 7)):
        bs, k, steps, d = shape
        yield _tree_inputs(seed + sum(shape), bs, k, steps, d, 17)


def _tree_recipe(dtype: str):
    return S.tree_shapes().map(lambda t: _tree_inputs(*t))


def _tree_errors():
    roots, lens = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    beams = torch.zeros((1, 1, 2), dtype=torch.int64)

    def call(kept, topk=2, steps=2, beam_flat=beams):
        return lambda: build_tree(roots, kept, kept, beam_flat, lens, topk=topk, num_steps=steps)
    # k=2, S=2 has 2 + 4 = 6 candidates: flat indices live in [0, 6).
    yield ErrorInput("flat-out-of-range", call(torch.tensor([[0, 1, 6]])), ValueError, "kept_flat")
    yield ErrorInput("flat-negative", call(torch.tensor([[-1, 1, 2]])), ValueError, "kept_flat")
    yield ErrorInput("too-many-kept", call(torch.arange(7)[None]), ValueError, "kept")
    yield ErrorInput("chain-needs-D-eq-S+1", call(torch.tensor([[0, 1, 2]]), topk=1, steps=2,
                                                  beam_flat=torch.zeros((1, 1, 1), dtype=torch.int64)),
                     ValueError, "more than the 2 candidates of topk=1, num_steps=2")


# ---------------------------------------------------------------------------------------------
# greedy and stochastic verify (trees built by the reference from random distributions)


def _ref_trees(seed, bs, topk, steps, d, vocab):
    s = _tree_inputs(seed, bs, topk, steps, d, vocab)
    return _tree_ref(s), s


def _verify_sample(name, seed, shape, dtype, vocab=19, plant=True):
    bs, topk, steps, d = shape
    tree, s = _ref_trees(seed, bs, topk, steps, d, vocab)
    gen = torch.Generator().manual_seed(seed + 1)
    x = S.tie_heavy_rows(gen, bs * d, vocab).view(bs, d, vocab)
    if plant:
        # Make the target agree with some drafts so paths of every length get accepted.
        for b in range(bs):
            for j in range(1, d):
                par = int(tree["parents"][b, j])
                if par >= 0 and torch.rand((), generator=gen) < 0.6:
                    x[b, par, :] = torch.where(x[b, par] >= 3.0, 2.0, x[b, par])
                    x[b, par, int(tree["tokens"][b, j])] = 3.5
    values, scale = S.as_logits_dtype(x.reshape(bs * d, vocab), dtype)
    coins = torch.rand((bs, d), generator=gen, dtype=torch.float64)
    final = torch.rand((bs,), generator=gen, dtype=torch.float64)
    probs = torch.softmax(x.double() * 0.7, dim=-1)
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
    return _verify_out(out)


def _verify_out(out) -> dict:
    return {"accept_nodes": torch.tensor([o[0] for o in out]), "num_correct": torch.tensor([o[1] for o in out]),
            "bonus": torch.tensor([o[2] for o in out])}


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
    return _verify_out(out)


VERIFY_SHAPES = ((1, 1, 1, 2), (3, 1, 4, 5), (2, 2, 3, 5), (3, 4, 3, 8), (2, 3, 2, 7))


def _verify_samples(dtype: str, seed: int):
    for i, shape in enumerate(VERIFY_SHAPES):
        yield _verify_sample(f"planted-{shape}", seed + i, shape, dtype)
        yield _verify_sample(f"random-{shape}", seed + 100 + i, shape, dtype, plant=False)
    yield _verify_sample("large-bs", seed, (64, 2, 3, 6), dtype)


def _verify_recipe(dtype: str):
    return S.tree_shapes().map(lambda t: _verify_sample("hyp", t[0], t[1:5], dtype, vocab=max(t[5], 5)))


def _no_errors():
    return ()


ALL_LOGITS = dtypes.LOGITS_DTYPES
FLOAT_LOGITS = ("float32", "bfloat16", "float16")


def _per_policy(fp8_for_cuda, fp8_for_rocm):
    return {"cpu": FLOAT_LOGITS + dtypes.FP8_DTYPES, "cuda": FLOAT_LOGITS + fp8_for_cuda,
            "rocm": FLOAT_LOGITS + fp8_for_rocm}


LOGITS_BY_POLICY = _per_policy(("float8_e4m3fn", "float8_e5m2"), ("float8_e4m3fnuz", "float8_e5m2fnuz"))
PROBS_ONLY = {"cpu": ("float32",), "cuda": ("float32",), "rocm": ("float32",)}

REGISTRY: dict[str, OpSpec] = {op.name: op for op in (
    OpSpec("select_draft_topk", _select_impl, _select_ref, _select_samples, _select_recipe, _select_errors,
           LOGITS_BY_POLICY, {"index": EXACT, "p": CLOSE}),
    OpSpec("draft_tree", _tree_impl, _tree_ref, _tree_samples, _tree_recipe, _tree_errors, PROBS_ONLY,
           {f: EXACT for f in TREE_FIELDS + ("kept_flat",)}),
    OpSpec("verify_greedy", _greedy_impl, _greedy_ref, _verify_samples, _verify_recipe, _no_errors,
           LOGITS_BY_POLICY, {"accept_nodes": EXACT, "num_correct": EXACT, "bonus": EXACT}),
    OpSpec("verify_stochastic", _stochastic_impl, _stochastic_ref, _verify_samples, _verify_recipe, _no_errors,
           {"cpu": ("float64",), "cuda": ("float64",), "rocm": ("float64",)},
           {"accept_nodes": EXACT, "num_correct": EXACT, "bonus": EXACT}),
)}


def compare_outputs(op: OpSpec, got: dict, want: dict, what: str) -> None:
    from tests.support.asserts import assert_close
    for name, how in op.compare.items():
        g, w = got[name], want[name]
        if g is None:          # the implementation declared this output not comparable here
            continue
        if how == EXACT:
            g, w = g.cpu().to(torch.int64), w.to(torch.int64)
            if g.shape != w.shape or not torch.equal(g, w):
                diff = (g != w).nonzero()[:5].tolist() if g.shape == w.shape else "shape"
                raise AssertionError(f"{what}: output {name!r} differs at {diff}\n got  {g.tolist()}\n want {w.tolist()}")
        else:
            assert_close(g, w, op.tolerance_dtype, f"{what}: output {name!r}")
