"""The golden catalogue: every golden of `golden/`, as data for `specverify/golden/`.

- **Op goldens** `ops/<op>/<dtype>`: one per (op of the registry, dtype it lists on any platform
  policy), holding every sample `op.samples(dtype, seed)` yields for a seed fixed by the name
  (crc32), and the reference outputs per sample. Reference = `op.ref`; optimized =
  `registry.run_impl` on a profile, wherever `dtype in op.dtypes_for(profile.policy)` (the tests
  run an op that does not read the profile, `platform_dependent=False`, on the native profile or
  the one SPECVERIFY_PLATFORM selects only, as test_ops_differential does). Samples whose input arrays hold
  more than MAX_SAMPLE_BYTES stay out (listed in the golden's meta; size). Rules and
  tolerance dtype are the record's own (`op.compare`, `op.tolerance_dtype`). The stored inputs
  are checked against the samples the registry makes now (`samples_drift`): a sample changed,
  added or dropped since the golden was made is a drift, not a comparison on stale inputs.
- **End-to-end goldens** `e2e/<algorithm>/<config>/<logits dtype>/<draft>/<sampling>/seed<N>`:
  a ragged batch (different budgets) decoded target-only or with EAGLE (chains and trees, page
  sizes 1 and > 1), greedy and sampled, float32 / bfloat16 / float16 / FP8 logits (CUDA- and
  ROCm-served formats, static scales != 1 and per-row scales), the plain draft head and the
  steered one (`tests/support/steering.py`), EOS in some. Models compute in float64 (so a GPU run
  is held to the same tokens) and are rebuilt from (preset, seed, dtypes); the golden stores a
  sha256 of their weights, and a model builder that drifted is reported as such. The steering
  oracle is stored (made from the reference's own target-only greedy run). Outputs: tokens, the
  per-cycle accept lengths and trace (tree tokens, parents, accepted nodes, emitted tokens) and,
  per request, the reference trace's first near-tie cycle: both sides are compared only up to
  it (docs of `reference/eagle.py`), and the number of requests that cut affects is reported.
- **Accept-length baselines** `accept_lengths/<profile>.json`: the mean accept length per cycle
  the optimized decoder measures on that profile, for steered drafts at agreement 0.5 and 0.8,
  topk 1 and 2, greedy and sampled, checked one-sided with tolerance ACCEPT_TOLERANCE.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import zlib

import numpy as np
import torch

import reference
import specverify
from specverify import SpecConfig, dtypes, golden
from specverify.golden import EXACT, OPTIMIZED, AcceptScenario, BaselineSet, GoldenCase, compare
from tests.support.cases import cached_models, ragged_prompts
from specverify.conformance.registry import REGISTRY, OpSpec, SampleInput, run_impl
from tests.support.steering import SteeredDraft, lookahead, steer_logits, steered_models

ACCEPT_TOLERANCE = 0.05      # relative: a drop below 95 % of the baseline fails; a rise above 105 % is reported
MODEL_PRESET = "tiny"


def name_seed(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


# ---------------------------------------------------------------------------------------------
# op goldens


MAX_SAMPLE_BYTES = 32 * 1024   # a sample whose input arrays hold more is left out of its op golden (size)


def tree_bytes(x) -> int:
    """Bytes of the tensors and arrays in a tree."""
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, np.ndarray):
        return int(x.nbytes)
    if isinstance(x, dict):
        return sum(tree_bytes(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(tree_bytes(v) for v in x)
    return 0


def _sample(entry: dict) -> SampleInput:
    return SampleInput(entry["name"], entry["args"], entry["seed"])


def _stored_form(tree) -> tuple[str, dict]:
    """A tree as the golden stores it: its JSON skeleton as text (each tensor's and array's dtype
    and shape, each scalar's type: True and 1 differ there) and each array's bytes. Equal exactly
    when the trees are, NaN payloads and signed zeros included."""
    skeleton, arrays = golden.encode(tree)
    return json.dumps(skeleton, sort_keys=True), {k: v.tobytes() for k, v in arrays.items()}


def _where_texts_differ(stored: str, now: str, width: int = 40) -> str:
    i = len(os.path.commonprefix([stored, now]))
    lo = max(i - width, 0)
    return f"stored ...{stored[lo:i + width]}..., now ...{now[lo:i + width]}..."


def samples_drift(now: dict, stored: dict) -> str | None:
    """Why the stored inputs of an op golden are not the samples the registry makes now (a sample
    added, removed or changed since the golden was made: its values bit for bit, its dtypes and
    types, its name and seed), or None."""
    added, removed = sorted(set(now) - set(stored)), sorted(set(stored) - set(now))
    if added or removed:
        return f"the registry's samples changed: {len(added)} new {added[:3]}, {len(removed)} gone {removed[:3]}"
    for key in now:
        (skeleton_now, bytes_now), (skeleton_stored, bytes_stored) = _stored_form(now[key]), _stored_form(stored[key])
        if skeleton_now == skeleton_stored and bytes_now == bytes_stored:
            continue
        diff = compare(now[key], stored[key], rules={}, tolerance_dtype="float64")
        if not diff.ok:
            return f"the registry's sample {key} changed: {diff.message()}"
        if skeleton_now != skeleton_stored:
            return (f"the registry's sample {key} changed a dtype or a type where the values compare equal: "
                    f"{_where_texts_differ(skeleton_stored, skeleton_now)}")
        return (f"the registry's sample {key} changed in its bits where the values compare equal "
                f"(a NaN's payload or sign)")
    return None


def op_case(op: OpSpec, dtype: str) -> GoldenCase:
    name = f"ops/{op.name}/{dtype}"
    seed = name_seed(name)

    def build():
        samples = list(op.samples(dtype, seed))
        kept = [(i, s) for i, s in enumerate(samples) if tree_bytes(s.args) <= MAX_SAMPLE_BYTES]
        skipped = [f"{i:03d}:{s.name} ({tree_bytes(s.args)} bytes)" for i, s in enumerate(samples)
                   if tree_bytes(s.args) > MAX_SAMPLE_BYTES]
        inputs = {f"{i:03d}:{s.name}": {"name": s.name, "seed": s.seed, "args": s.args} for i, s in kept}
        meta = {"generator": f"specverify.conformance.registry REGISTRY[{op.name!r}].samples({dtype!r}, seed)", "seed": seed,
                "dtype": dtype, "op": op.name, "samples": len(kept),
                "skipped_samples": skipped, "skip_rule": f"inputs above {MAX_SAMPLE_BYTES} bytes of arrays stay out of "
                                                         f"golden/ (size); test_ops_differential still runs them"}
        return inputs, meta

    def ref(inputs):
        return {key: op.ref(_sample(entry)) for key, entry in inputs.items()}

    def optimized(inputs, profile):
        return {key: run_impl(op, _sample(entry), profile) for key, entry in inputs.items()}

    def applies(profile) -> bool:
        return dtype in op.dtypes_for(profile.policy)

    def sample_drift(inputs):
        return samples_drift(build()[0], inputs)

    marks = ("fp8",) if dtypes.dtype_info(dtype).is_fp8 else ()
    return GoldenCase(name, build, ref, optimized, dict(op.compare), op.tolerance_dtype, applies, marks,
                      check_inputs=sample_drift, platform_dependent=op.platform_dependent)


def op_cases() -> list[GoldenCase]:
    out = []
    for op in REGISTRY.values():
        names = sorted({d for listed in op.dtypes.values() for d in listed}, key=list(dtypes.DTYPES).index)
        out += [op_case(op, d) for d in names]
    return out


# ---------------------------------------------------------------------------------------------
# end-to-end goldens

SAMPLING = {
    "greedy": {},
    "t0.3-topk20": dict(temperature=0.3, top_k=20),      # low temperatures: steered drafts get accepted
    "t0.4-minp0.1": dict(temperature=0.4, min_p=0.1),
    "t1.0-topp0.9": dict(temperature=1.0, top_p=0.9),
    "t0.05": dict(temperature=0.05),                      # near-greedy sampling: steered drafts keep being accepted
}
SCALES = {"1": ("static", 1.0), "0.37": ("static", 0.37), "3.5": ("static", 3.5), "per_row": ("per_row", None)}
BUDGETS = {1: [8], 3: [2, 8, 5], 4: [2, 8, 5, 6]}     # ragged: every request its own budget


@dataclasses.dataclass(frozen=True)
class Scenario:
    topk: int | None = None        # None: target-only decoding
    steps: int = 0
    draft_tokens: int = 0
    page_size: int = 1
    logits_dtype: str = "float32"
    scale: str = "1"
    agreement: float | None = None  # the steered draft's agreement; None: the plain head
    sampling: str = "greedy"
    seed: int = 0
    bs: int = 3
    eos: bool = False
    model_seed: int = 0

    @property
    def speculative(self) -> bool:
        return self.topk is not None

    @property
    def name(self) -> str:
        if self.speculative:
            algo, config = "eagle", f"k{self.topk}-s{self.steps}-d{self.draft_tokens}-p{self.page_size}"
            draft = "plain" if self.agreement is None else f"steer{self.agreement}"
        else:
            algo, config, draft = "target", f"p{self.page_size}", "none"
        dt = self.logits_dtype
        if dtypes.dtype_info(dt).is_fp8:
            dt += "-perrow" if self.scale == "per_row" else f"-x{self.scale}"
        sampling = self.sampling + ("-eos" if self.eos else "")
        model = "" if self.model_seed == 0 else f"-m{self.model_seed}"
        return f"e2e/{algo}/{config}/{dt}/{draft}/{sampling}/seed{self.seed}{model}"


SCENARIOS = (
    Scenario(page_size=1, logits_dtype="float32"),
    Scenario(page_size=4, logits_dtype="bfloat16", sampling="t1.0-topp0.9", seed=1, bs=4),
    Scenario(page_size=1, logits_dtype="float8_e5m2fnuz", scale="per_row", eos=True, seed=2),
    Scenario(1, 3, 4, 1, "float32", seed=0),
    Scenario(1, 3, 4, 4, "float8_e4m3fn", "0.37", agreement=0.8),
    Scenario(1, 2, 3, 1, "bfloat16", agreement=0.6, sampling="t0.3-topk20", seed=3),
    Scenario(2, 3, 6, 1, "float8_e4m3fnuz", "per_row", agreement=1.0),
    Scenario(2, 3, 6, 4, "float32", agreement=0.6, sampling="t0.4-minp0.1", seed=4, eos=True),
    Scenario(4, 2, 8, 4, "float8_e5m2", "3.5", sampling="t1.0-topp0.9", seed=5, bs=1),
    Scenario(2, 2, 4, 1, "bfloat16", agreement=0.8, eos=True, model_seed=3),
    Scenario(1, 1, 2, 1, "float8_e5m2fnuz", "0.37", agreement=1.0, sampling="t0.3-topk20", seed=6),
    Scenario(3, 3, 8, 2, "float16", agreement=0.8, seed=7, bs=4),
)


def _model_args(inputs: dict) -> dict:
    m = inputs["model"]
    return dict(seed=m["seed"], compute_dtype=m["compute_dtype"], logits_dtype=m["logits_dtype"],
                logits_scale=m["logits_scale"], logits_scale_mode=m["logits_scale_mode"], hybrid=m["hybrid"])


def fingerprint(models) -> str:
    """sha256 over the float64 master weights (name, dtype, shape, bytes) of target and draft."""
    h = hashlib.sha256()
    for part, weights in (("target", models.target_weights), ("draft", models.draft_weights)):
        for key in sorted(weights):
            t = weights[key].detach().to("cpu").contiguous()
            h.update(f"{part}/{key}:{t.dtype}:{list(t.shape)};".encode())
            h.update(t.numpy().tobytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=16)
def _fingerprint_of(preset: str, args: tuple) -> str:
    return fingerprint(cached_models(preset, **dict(args)))


def _models(inputs: dict, profile=None):
    args = _model_args(inputs)
    if profile is None or profile.device == "cpu":
        return cached_models(inputs["model"]["preset"], **args)
    return specverify.build_models(inputs["model"]["preset"], platform=profile, **args)


def model_drift(inputs: dict) -> str | None:
    """Why the models rebuilt from the stored arguments are not the ones the golden was made with."""
    args = _model_args(inputs)
    now = _fingerprint_of(inputs["model"]["preset"], tuple(sorted(args.items())))
    if now != inputs["model"]["fingerprint"]:
        return (f"model builder drift: build_models({inputs['model']['preset']!r}, {args}) now gives weights with "
                f"sha256 {now[:16]}..., the golden was made from {inputs['model']['fingerprint'][:16]}...")
    return None


def _oracle(inputs: dict, models) -> torch.Tensor:
    ctx = models.config.max_context
    rows = inputs["draft"]["oracle"]
    oracle = torch.full((len(rows), ctx + 1), -1, dtype=torch.int64)
    for r, row in enumerate(rows):
        oracle[r, :len(row)] = torch.tensor(row, dtype=torch.int64)
    return oracle


def _hook(inputs: dict, models):
    draft = inputs["draft"]
    if draft["kind"] == "plain":
        return None
    oracle = _oracle(inputs, models)

    def hook(r, positions, tokens, logits):
        return steer_logits(logits, torch.tensor([r]), positions, tokens, oracle, draft["agreement"], draft["seed"])
    return hook


def _cycle(c) -> dict:
    return {"tree_tokens": [int(t) for t in c.tree_tokens], "tree_parents": [int(t) for t in c.tree_parents],
            "accepted": [int(t) for t in c.accepted], "emitted": [int(t) for t in c.emitted]}


def _ints(rows) -> list:
    return [[int(t) for t in row] for row in rows]


def _spec(inputs: dict) -> SpecConfig | None:
    s = inputs["spec"]
    return None if s is None else SpecConfig(num_steps=s["num_steps"], topk=s["topk"],
                                             num_draft_tokens=s["num_draft_tokens"], page_size=s["page_size"])


def e2e_reference(inputs: dict) -> dict:
    models = _models(inputs)
    kw = dict(inputs["sampling"], max_new_tokens=list(inputs["max_new_tokens"]), eos_token_id=inputs["eos_token_id"])
    spec = _spec(inputs)
    if spec is None:
        return {"tokens": _ints(reference.generate(models, inputs["prompts"], **kw).tokens)}
    ref = reference.generate_speculative(models, inputs["prompts"], spec_num_steps=spec.num_steps, topk=spec.topk,
                                         num_draft_tokens=spec.draft_tokens, draft_logits_hook=_hook(inputs, models),
                                         **kw)
    return {"tokens": _ints(ref.tokens),
            "accept_lengths": [[len(c.emitted) for c in t.cycles] for t in ref.traces],
            "trace": [[_cycle(c) for c in t.cycles] for t in ref.traces],
            "first_near_tie": [t.first_near_tie for t in ref.traces]}


def e2e_optimized(inputs: dict, profile) -> dict:
    models = _models(inputs, profile)
    kw = dict(inputs["sampling"], max_new_tokens=list(inputs["max_new_tokens"]), eos_token_id=inputs["eos_token_id"])
    spec = _spec(inputs)
    if spec is None:
        out = specverify.generate(models, inputs["prompts"], page_size=inputs["page_size"], platform=profile, **kw)
        return {"tokens": _ints(out.tokens)}
    if inputs["draft"]["kind"] == "steered":
        d = inputs["draft"]
        models = dataclasses.replace(models, draft=SteeredDraft(models.draft, _oracle(inputs, models), d["agreement"],
                                                                d["seed"]))
    out = specverify.generate(models, inputs["prompts"], spec=spec, platform=profile, trace=True, **kw)
    return {"tokens": _ints(out.tokens), "accept_lengths": _ints(out.accept_lengths),
            "trace": [[_cycle(c) for c in cycles] for cycles in out.trace]}


def near_tie_views(got: dict, want: dict, side: str):
    """Cut every request at the first near-tie cycle the golden records for it: tokens up to the
    ones emitted before that cycle (none when the prefill token is a near-tie, cycle -1), accept
    lengths and trace up to that cycle. The optimized side has no near-tie output: the field is
    dropped from what it is compared against. Every other field passes through unchanged."""
    cuts = want.get("first_near_tie") if isinstance(want, dict) else None
    if not isinstance(cuts, list) or not isinstance(got, dict):
        return got, want, []
    g, w = dict(got), dict(want)
    if side == OPTIMIZED:
        w.pop("first_near_tie")
    for d in (g, w):
        for field in ("tokens", "accept_lengths", "trace"):
            if isinstance(d.get(field), list):
                d[field] = list(d[field])
    affected = []
    for r, cycle in enumerate(cuts):
        if cycle is None:
            continue
        cycles = max(cycle, 0)
        lengths = want["accept_lengths"][r]
        n_tokens = 0 if cycle < 0 else 1 + sum(lengths[:cycle])
        for d in (g, w):
            for field, n in (("tokens", n_tokens), ("accept_lengths", cycles), ("trace", cycles)):
                rows = d.get(field)
                if isinstance(rows, list) and r < len(rows) and isinstance(rows[r], list):
                    rows[r] = rows[r][:n]
        affected.append(f"request {r} from cycle {cycle}")
    notes = []
    if affected:
        notes.append(f"{len(affected)} of {len(cuts)} requests compared only up to their first near-tie "
                     f"({'; '.join(affected)})")
    return g, w, notes


def _first_run_eos(inputs: dict) -> int:
    """An EOS the run meets: the token the last request emits third (or last) without one."""
    free = e2e_reference(dict(inputs, eos_token_id=None))["tokens"][-1]
    return free[min(2, len(free) - 1)]


def e2e_case(sc: Scenario) -> GoldenCase:
    name = sc.name
    key = name_seed(name)
    mode, scale = SCALES[sc.scale]

    def build():
        model = dict(preset=MODEL_PRESET, seed=sc.model_seed, compute_dtype="float64", logits_dtype=sc.logits_dtype,
                     logits_scale=scale, logits_scale_mode=mode, hybrid=False)
        models = cached_models(MODEL_PRESET, **{k: v for k, v in model.items() if k != "preset"})
        model["fingerprint"] = fingerprint(models)
        prompts = ragged_prompts(key, sc.bs, models.config.vocab_size, max_len=8)
        budgets = list(BUDGETS[sc.bs])
        spec = None
        if sc.speculative:
            spec = dict(num_steps=sc.steps, topk=sc.topk, num_draft_tokens=sc.draft_tokens, page_size=sc.page_size)
        inputs = {"prompts": prompts, "max_new_tokens": budgets, "sampling": dict(SAMPLING[sc.sampling], seed=sc.seed),
                  "eos_token_id": None, "page_size": sc.page_size, "spec": spec, "model": model,
                  "draft": {"kind": "plain"}}
        if sc.agreement is not None:
            # The oracle: each prompt and the reference's target-only greedy continuation, as long
            # as the steering wrapper's pre-run would make it (tests/support/steering.py).
            look = lookahead(models, prompts, budgets, _spec(inputs))
            free = reference.generate(models, prompts, max_new_tokens=look).tokens
            inputs["draft"] = {"kind": "steered", "agreement": sc.agreement, "seed": sc.model_seed,
                               "oracle": [list(p) + [int(t) for t in f] for p, f in zip(prompts, free)]}
        if sc.eos:
            inputs["eos_token_id"] = _first_run_eos(inputs)
        meta = {"generator": "tests.support.golden_catalogue Scenario (prompts from ragged_prompts(crc32(name)))",
                "seed": sc.seed, "dtype": sc.logits_dtype, "scenario": dataclasses.asdict(sc)}
        return inputs, meta

    def applies(profile) -> bool:
        return not dtypes.dtype_info(sc.logits_dtype).is_fp8 or profile.supports_fp8(sc.logits_dtype)

    marks = ("e2e",) + (("fp8",) if dtypes.dtype_info(sc.logits_dtype).is_fp8 else ())
    return GoldenCase(name, build, e2e_reference, e2e_optimized, {"tokens": EXACT, "accept_lengths": EXACT,
                                                                  "trace": EXACT, "first_near_tie": EXACT},
                      "float64", applies, marks, views=near_tie_views if sc.speculative else None,
                      check_inputs=model_drift)


# ---------------------------------------------------------------------------------------------
# accept-length baselines (measured by the optimized decoder, per platform profile)

ACCEPT_BS = 6
ACCEPT_BUDGET = 24
ACCEPT_SCENARIOS = (
    # name, topk, steps, D, agreement, sampling
    ("k1-s3-a0.5-greedy", 1, 3, 4, 0.5, "greedy"),
    ("k1-s3-a0.8-greedy", 1, 3, 4, 0.8, "greedy"),
    ("k2-s3-d6-a0.5-greedy", 2, 3, 6, 0.5, "greedy"),
    ("k2-s3-d6-a0.8-greedy", 2, 3, 6, 0.8, "greedy"),
    ("k1-s3-a0.8-t0.05", 1, 3, 4, 0.8, "t0.05"),
    ("k2-s3-d6-a0.5-t0.05", 2, 3, 6, 0.5, "t0.05"),
)


def _accept_models(profile):
    if profile.device == "cpu":
        return cached_models(MODEL_PRESET, seed=0, compute_dtype="float32")
    return specverify.build_models(MODEL_PRESET, seed=0, compute_dtype="float32", platform=profile)


def _accept_measure(topk, steps, d, agreement, sampling):
    def measure(profile) -> dict:
        models = _accept_models(profile)
        prompts = ragged_prompts(name_seed("accept_lengths"), ACCEPT_BS, models.config.vocab_size, min_len=4,
                                 max_len=12)
        budgets = [ACCEPT_BUDGET] * ACCEPT_BS
        spec = SpecConfig(num_steps=steps, topk=topk, num_draft_tokens=d)
        steered = steered_models(models, prompts, budgets, agreement=agreement, spec=spec)
        out = specverify.generate(steered, prompts, spec=spec, max_new_tokens=budgets, platform=profile,
                                  **dict(SAMPLING[sampling], seed=11))
        lengths = [n for per in out.accept_lengths for n in per]
        return {"mean": sum(lengths) / len(lengths), "cycles": len(lengths), "tokens": sum(lengths)}
    return measure


ACCEPT = BaselineSet("accept_lengths", tuple(
    AcceptScenario(name, {"topk": k, "num_steps": s, "num_draft_tokens": d, "agreement": a, "sampling": sampling,
                          "requests": ACCEPT_BS, "max_new_tokens": ACCEPT_BUDGET, "compute_dtype": "float32",
                          "logits_dtype": "float32"}, _accept_measure(k, s, d, a, sampling))
    for name, k, s, d, a, sampling in ACCEPT_SCENARIOS), ACCEPT_TOLERANCE)

E2E_CASES = [e2e_case(sc) for sc in SCENARIOS]
OP_CASES = op_cases()
CATALOGUE = [*OP_CASES, *E2E_CASES, ACCEPT]
