"""Law tests: ops judged by the distribution they emit, not token for token.

An engine that draws its own uniforms (convention `randomness: own`) cannot be compared draw for
draw; it can be compared with the exact law the reference gives. Each `LawCase` is one situation
(one row of arguments), the exact law of its outcome cells (from `reference/`, float64) and the
alternatives it must be able to tell apart: the stated effect sizes (target probabilities at
temperature x 1.1, a filter ignored, the bonus drawn from the target instead of the residual, ...).
The number of draws N is the smallest at which Pearson's chi-square at ALPHA = 1e-6 rejects EVERY
alternative with probability >= POWER = 0.999 (specverify.conformance.stats, noncentral chi-square).
The row is replicated N times along the batch and the implementation called once per chunk; the
emitted cells are counted and tested against the law. Validity (support, shapes, accepted counts
consistent with the accepted nodes) is checked on every draw.

An implementation with counter randomness (specverify itself, or a plugin declaring `counter`) is
given seeded uniforms: its law is tested the same way.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Callable

import numpy as np
import pytest
import torch

from reference import sampling as rsampling
from specverify.conformance import conventions as C
from specverify.conformance import stats
from specverify.conformance.adapters import Unsupported
from specverify.conformance import strategies as S
from specverify.conformance.registry.core import on_device

ALPHA = 1e-6
POWER = 0.999
MAX_DRAWS = 2_000_000
CHUNK_ELEMENTS = 2**22           # rows x vocab per call of the implementation


@dataclasses.dataclass(frozen=True)
class LawCase:
    name: str
    args: dict                              # one row of the op's arguments (batch 1), no uniforms
    law: dict                               # cell -> exact probability
    alternatives: dict                      # label -> (cell -> probability): what the test must detect

    def draws(self) -> tuple[int, dict]:
        """(N, label -> (w, power at N)): N the smallest on stats' grid with power >= POWER against
        every alternative."""
        n = max(stats.draws_for_power(self.law, alt, alpha=ALPHA, power=POWER, limit=MAX_DRAWS)
                for alt in self.alternatives.values())
        info = {}
        for label, alt in self.alternatives.items():
            w2, _, _ = stats.effect_size_w2(self.law, alt, n)
            info[label] = (math.sqrt(w2), stats.power_at(self.law, alt, n, alpha=ALPHA))
        return n, info


@dataclasses.dataclass(frozen=True)
class LawSpec:
    op: str                                            # the implementation's method
    uniforms: tuple[str, ...]                          # arguments holding uniforms, one per row
    cases: Callable[[dict], list[LawCase]]             # declared conventions -> cases
    own: Callable[[dict, dict], dict]                  # specverify: (args, uniforms) -> outputs
    cells: Callable[[dict], list]                      # outputs -> one cell per row
    valid: Callable[[dict, dict], str | None]          # (one row of args, outputs) -> problem or None


# ---------------------------------------------------------------------------------------------
# helpers


def _normalized(weights: list[float]) -> list[float]:
    total = sum(weights)
    return [w / total for w in weights]


def _as_law(p: list[float]) -> dict:
    return {i: x for i, x in enumerate(p) if x > 0.0}


def replicate(value, n: int):
    """Every tensor of an argument tree repeated n times along its batch (first) dimension."""
    if isinstance(value, torch.Tensor):
        return value.expand(n, *value.shape[1:]).contiguous() if value.dim() else value
    if isinstance(value, dict):
        return {k: replicate(v, n) for k, v in value.items()}
    return value


def _tokens_valid(args: dict, out: dict) -> str | None:
    """One int token per row (the support is checked on the counted cells)."""
    token = out.get("token")
    rows = next(v.shape[0] for v in args.values() if isinstance(v, torch.Tensor) and v.dim())
    if token is None or token.shape != (rows,) or token.dtype.is_floating_point:
        return (f"token: expected shape [{rows}] of integer ids, got "
                f"{'nothing' if token is None else f'shape {tuple(token.shape)} of {token.dtype}'}")
    return None


# ---------------------------------------------------------------------------------------------
# sample_from_probs: one draw from a given distribution


def _draw_cases(conv: dict) -> list[LawCase]:
    cases = []
    for name, weights in (("ties-and-a-zero-V6", [3, 3, 2, 1, 1, 0]),
                          ("vocab-edges-V64", [16] + [1] * 62 + [16]),
                          ("peaked-V12", [40, 8, 8, 4, 2, 2, 1, 1, 1, 1, 1, 1])):
        p = _normalized([float(w) for w in weights])
        hot = [x ** (1 / 1.1) for x in p]
        shifted = [0.0] + p[:-1]
        shifted[-1] += p[-1]
        cases.append(LawCase(name, {"p": torch.tensor([p], dtype=torch.float64)}, _as_law(p),
                             {"temperature x 1.1": _as_law(_normalized(hot)),
                              "the next token drawn (off by one)": _as_law(shifted)}))
    return cases


def _draw_own(args: dict, uniforms: dict) -> dict:
    from specverify.engine.sampling import sample_from_probs
    return {"token": sample_from_probs(args["p"], uniforms["u"])}


# ---------------------------------------------------------------------------------------------
# sample_filtered: temperature, top-k, top-p, min-p, then one draw (docs/semantics.md section 4)

FILTER_CASES = (  # name, vocab, (temperature, top_k, top_p, min_p)
    ("all-filters-V40", 40, (0.8, 10, 0.9, 0.0)),
    ("top-p-V48", 48, (1.3, 0, 0.7, 0.0)),
    ("min-p-V32", 32, (1.3, 0, 1.0, 0.3)),
    ("top-k-V96", 96, (1.0, 20, 1.0, 0.0)),
)


def _filter_logits(vocab: int, seed: int) -> torch.Tensor:
    """Distinct float32 logits on a 1/8 grid (no ties at any cut: the law does not depend on the
    tie rule), shuffled so the large ones sit anywhere, the vocab's edges included."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.arange(vocab, dtype=torch.float32) / 8 - vocab / 16
    return values[torch.randperm(vocab, generator=gen)][None]


def _filter_cases(conv: dict) -> list[LawCase]:
    ties = {"topk_ties": C.SPECVERIFY["topk_ties"], "topp_ties": C.SPECVERIFY["topp_ties"]}
    ties.update({k: conv[k] for k in ties})
    tie_rule = {"index": "index", "keep_tied": "value"}
    cases = []
    for name, vocab, (t, k, top_p, min_p) in FILTER_CASES:
        logits = _filter_logits(vocab, zlib.crc32(name.encode()))
        z = [float(x) for x in logits[0]]

        def law(t=t, k=k, top_p=top_p, min_p=min_p):
            return _as_law(rsampling.filtered_probs(z, t, k, top_p, min_p, topk_ties=tie_rule[ties["topk_ties"]],
                                                    topp_ties=tie_rule[ties["topp_ties"]]))
        alts = {"temperature x 1.1": law(t=t * 1.1)}
        if k:
            alts["top_k ignored"] = law(k=0)
        if top_p < 1.0:
            alts["top_p ignored"] = law(top_p=1.0)
        if min_p:
            alts["min_p ignored"] = law(min_p=0.0)
        args = {"logits": logits, "scale": torch.ones((1, 1)), "temperature": t, "top_k": k, "top_p": top_p,
                "min_p": min_p}
        if conv["inputs"] == "probs":
            probs = rsampling.softmax([x / t for x in z])
            args = {"probs": torch.tensor([probs], dtype=torch.float32), "top_k": k, "top_p": top_p, "min_p": min_p}
        cases.append(LawCase(name, args, law(), alts))
    return cases


def _filter_own(args: dict, uniforms: dict) -> dict:
    from specverify.engine.sampling import SamplingParams, sample_from_probs, sampling_probs
    params = SamplingParams(args["temperature"], args["top_k"], args["top_p"], args["min_p"])
    return {"token": sample_from_probs(sampling_probs(args["logits"], args["scale"], params), uniforms["u"])}


# ---------------------------------------------------------------------------------------------
# verify_naive: the chain [root, draft] with draft probabilities q (docs/semantics.md 6.7)


def _chain_law(p0, p1, q, d, *, bonus_from_target=False, accept_prob=None) -> dict:
    a = min(1.0, p0[d] / q[d]) if accept_prob is None else accept_prob
    residual = _normalized([max(x - y, 0.0) for x, y in zip(p0, q)]) if not bonus_from_target else p0
    law = {(1, t): a * x for t, x in enumerate(p1) if x > 0.0}
    law.update({(0, t): (1 - a) * x for t, x in enumerate(residual) if x > 0.0 and a < 1.0})
    return law


def _chain_cases(conv: dict) -> list[LawCase]:
    cases = []
    for name, p0w, qw, p1w, d in (
            ("reject-often-V6", [1, 4, 2, 2, 1, 0], [6, 1, 1, 1, 1, 0], [1, 1, 2, 3, 2, 1], 0),
            ("vocab-edges-V16", [1] + [2] * 14 + [5], [1] * 15 + [9], [3] + [1] * 15, 15),
            ("always-accepted-V8", [1, 1, 5, 1, 1, 1, 1, 1], [2, 2, 1, 1, 1, 1, 2, 2], [1, 2, 3, 4, 4, 3, 2, 1], 2)):
        p0, q, p1 = (_normalized([float(x) for x in w]) for w in (p0w, qw, p1w))
        args = {"probs": torch.tensor([[p0, p1]], dtype=torch.float64), "draft": torch.tensor([d]),
                "mode": {"draft_q": torch.tensor([q], dtype=torch.float64)}}
        alternatives = {"draft accepted with probability p(d) instead of min(1, p(d)/q(d))":
                        _chain_law(p0, p1, q, d, accept_prob=p0[d])}
        if p0[d] < q[d]:          # rejections happen: where the bonus is drawn from matters
            alternatives["bonus drawn from the target instead of the residual"] = _chain_law(
                p0, p1, q, d, bonus_from_target=True)
        cases.append(LawCase(name, args, _chain_law(p0, p1, q, d), alternatives))
    return cases


def _chain_own(args: dict, uniforms: dict) -> dict:
    from specverify.kernels.verify import verify_naive
    accept, n, bonus = verify_naive(args["probs"], args["draft"], uniforms["coin"], uniforms["final"], **args["mode"])
    return {"accept_nodes": accept, "num_correct": n, "bonus": bonus}


def _chain_valid(args: dict, out: dict) -> str | None:
    n, nodes = out["num_correct"], out["accept_nodes"]
    if nodes.shape != (n.shape[0], 2):
        return f"accept_nodes has shape {tuple(nodes.shape)}, expected [N, 2]"
    want = torch.where(n == 1, 1, -1)
    if not bool(((nodes[:, 0] == 0) & (nodes[:, 1] == want) & ((n == 0) | (n == 1))).all()):
        return "accepted counts disagree with the accepted nodes (or lie outside {0, 1})"
    return None


LAWS: dict[str, LawSpec] = {spec.op: spec for spec in (
    LawSpec("sample_from_probs", ("u",), _draw_cases, _draw_own, lambda out: out["token"].tolist(),
            _tokens_valid),
    LawSpec("sample_filtered", ("u",), _filter_cases, _filter_own, lambda out: out["token"].tolist(),
            _tokens_valid),
    LawSpec("verify_naive", ("coin", "final"), _chain_cases, _chain_own,
            lambda out: list(zip(out["num_correct"].tolist(), out["bonus"].tolist())), _chain_valid),
)}


# ---------------------------------------------------------------------------------------------
# running one case


def _rows_per_call(args: dict) -> int:
    width = max([v[0].numel() for v in args.values() if isinstance(v, torch.Tensor) and v.dim()] + [1])
    return max(1, CHUNK_ELEMENTS // width)


def emit(spec: LawSpec, case: LawCase, n: int, impl, conv: dict, device, seed: int) -> tuple[dict, str | None]:
    """Counts of the cells of n draws of `case` by `impl` (None: specverify), and the first validity
    problem seen (None when every draw is valid)."""
    gen = torch.Generator().manual_seed(seed)
    if impl is not None and callable(getattr(impl, "seed", None)):
        impl.seed(seed)             # an engine's own generator, seeded per test: the same draws in any order
    counts: dict = {}
    problem = None
    done = 0
    step = _rows_per_call(case.args)
    while done < n:
        rows = min(step, n - done)
        args = on_device(replicate(case.args, rows), device)
        uniforms = {name: S.unit_floats(gen, (rows,)).to(device) for name in spec.uniforms}
        if impl is None:
            out = spec.own(args, uniforms)
        elif conv["randomness"] == "own":
            out = getattr(impl, spec.op)(**args)
        else:
            out = getattr(impl, spec.op)(**args, **uniforms)
        out = {k: torch.as_tensor(np.asarray(v.cpu() if isinstance(v, torch.Tensor) else v)) for k, v in out.items()}
        invalid = spec.valid(args, out)
        problem = problem or invalid
        if invalid is None:                  # an invalid chunk is named, not counted
            for cell in spec.cells(out):
                counts[cell] = counts.get(cell, 0) + 1
        done += rows
    support = set(case.law)
    outside = sorted((c for c in counts if c not in support), key=str)[:5]
    if outside and problem is None:
        problem = f"cells outside the law's support were emitted: {outside}"
    return counts, problem


def law_cases(impl, missing: str = "skip"):
    from specverify.conformance.registry import missing_op
    for spec in LAWS.values():
        conv = C.conventions_for(impl, spec.op)
        why = missing_op(impl, spec.op)
        if why and missing == "omit":
            continue
        marks = [pytest.mark.skip(reason=why)] if why else []
        for case in spec.cases(conv):
            yield pytest.param(spec, case, conv, id=f"{spec.op}-{case.name}", marks=marks)


def law_test(impl, missing: str = "skip"):
    from specverify.conformance.suite import RECORD_KEY, impl_name, seed_for
    from specverify.platform import get_profile, native_platform

    @pytest.mark.kernels
    @pytest.mark.parametrize("spec,case,conv", list(law_cases(impl, missing)))
    def test_law(spec, case, conv, request):
        """The emitted distribution against the exact law: Pearson chi-square at ALPHA with N draws,
        N chosen for power >= POWER against each stated alternative."""
        n, power = case.draws()
        device = get_profile(native_platform()).device
        try:
            counts, problem = emit(spec, case, n, impl, conv, device, seed_for(request.node.name))
        except Unsupported as why:            # a parameter the engine does not offer: said, not failed
            request.node.user_properties.append((RECORD_KEY, dict(
                engine=impl_name(impl), test="law", op=spec.op, case=case.name, verdict="unsupported",
                detail=str(why), draws=n, alpha=ALPHA, randomness=conv["randomness"])))
            pytest.skip(f"{spec.op} {case.name}: unsupported by {impl_name(impl)}: {why}")
        stat, pvalue, df = stats.pooled_chi_square(counts, case.law, n)
        verdict = "fails" if problem or pvalue < ALPHA else "conforms"
        request.node.user_properties.append((RECORD_KEY, dict(
            engine=impl_name(impl), test="law", op=spec.op, case=case.name, verdict=verdict, draws=n, alpha=ALPHA,
            statistic=round(stat, 3), df=df, pvalue=pvalue, problem=problem, randomness=conv["randomness"],
            alternatives={label: {"w": round(w, 5), "power": round(p, 6)} for label, (w, p) in power.items()})))
        assert problem is None, f"{spec.op} {case.name}: {problem}"
        assert pvalue >= ALPHA, (f"{spec.op} {case.name}: {n} draws do not follow the law: chi-square {stat:.1f} "
                                 f"(df {df}), p = {pvalue:.3g} < {ALPHA:g}; the test has power >= {POWER} against: "
                                 f"{', '.join(power)}")
    return test_law

