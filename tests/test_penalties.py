"""Sampling penalties (docs/semantics.md section 7): repetition, frequency and presence, in
`specverify.generate` and `reference.generate` / `reference.eagle.generate`, for target-only and
EAGLE speculative decoding.

- the rule itself, by hand on a tiny vocabulary, through the engine's functions
  (`engine/penalties.py`: prompt tokens, output counts, a verify tree's path counts) and the
  reference's `apply_penalties`: a prompt token is penalized once however often it repeats;
- target-only decoding equals the reference token for token, each penalty alone and all three
  together, greedy and sampled, in ragged batches, with EOS and max_new_tokens=1; each penalty set
  changes the output (the comparison is not vacuous); penalties off give today's tokens and
  allocate nothing;
- EAGLE (topk 1 and 2, and naive EAGLE) is lossless with penalties: greedy speculative == greedy target-only with
  the same penalties, and its per-cycle trace equals the reference speculative decoder's (greedy
  and sampled), with drafts steered towards the penalized greedy continuation so that accepted
  paths are deep and the tree-node context (drafts on the path) decides;
- sampled EAGLE with penalties emits the target-only penalized law: a chi-square of output tokens
  1 and 2 against the exact law, at a fixed false-positive rate ALPHA = 1e-6;
- validation: bad penalties raise a clear error on every entry point;
- the padded path (CPU) and, on CUDA, the captured cycle: graph == eager, one readback per step.
"""

from __future__ import annotations

import collections
import functools

import pytest
import torch

import reference
import specverify
from reference.sampling import apply_penalties
from specverify import SpecConfig
from specverify.engine import penalties
from specverify.engine.requests import new_requests
from specverify.engine.sampling import SamplingParams
from specverify.engine.target_only import TargetOnlyDecoder
from tests.support.asserts import assert_tokens_equal
from tests.support.cases import cached_models, ragged_prompts
from specverify.conformance.stats import pooled_chi_square
from tests.support.steering import lookahead, steered_models
from tests.test_device_cycle import start_decoder
from tests.test_logprobs_e2e import assert_records_match, reference_records
from tests.support.traces import compare_traces
from tests.test_spec_trace import reference_hook

pytestmark = pytest.mark.e2e

VOCAB = 389
PENALTIES = {
    "rep1.3": dict(repetition_penalty=1.3),
    "rep0.7": dict(repetition_penalty=0.7),           # below 1: rewards repeats, so counts grow past 1
    "freq0.7": dict(frequency_penalty=0.7),
    "pres-1.2": dict(presence_penalty=-1.2),
    "all": dict(repetition_penalty=0.8, frequency_penalty=0.5, presence_penalty=-1.5),
}
SAMPLING = {"greedy": dict(), "t0.8-topk30": dict(temperature=0.8, top_k=30, seed=7)}
PROMPTS = ragged_prompts(0, 4, VOCAB, max_len=12)   # where every penalty set changes some token
BUDGETS = [12, 9, 1, 12]                             # request 2: max_new_tokens=1 (the prefill token only)


def penalized_oracle(models, prompts, budgets, pen: dict) -> torch.Tensor:
    """The steering oracle of tests/support/steering.py, made of the PENALIZED target-only greedy
    continuation: steered drafts then propose what the penalized target picks, so drafts are
    accepted deep into the tree (each distinct prompt runs once)."""
    ctx = models.config.max_context
    jobs = sorted({(tuple(p), n) for p, n in zip(prompts, budgets)})
    out = specverify.generate(models, [list(p) for p, _ in jobs], max_new_tokens=[n for _, n in jobs], **pen).tokens
    done = dict(zip(jobs, out))
    oracle = torch.full((len(prompts), ctx + 1), -1, dtype=torch.int64)
    for i, (p, n) in enumerate(zip(prompts, budgets)):
        seq = torch.tensor(list(p) + done[tuple(p), n], dtype=torch.int64)
        oracle[i, :len(seq)] = seq
    return oracle


def penalty_steered(models, prompts, budgets, spec, pen: dict, agreement: float = 0.8):
    oracle = penalized_oracle(models, prompts, lookahead(models, prompts, budgets, spec), pen)
    return steered_models(models, prompts, budgets, agreement=agreement, spec=spec, oracle=oracle)


# -- the rule by hand ---------------------------------------------------------------------------

# V = 6; prompt [1, 1, 1, 3] (token 1 three times), output so far [3, 0, 0];
# r = 2, f = 0.5, p = 0.25.
#   token 0: output twice, z = 2 > 0   -> 2 / 2 = 1,    1 - 0.5*2 - 0.25 = -0.25
#   token 1: prompt only (once!)       -> -1 * 2 = -2   (counted thrice: -8; as output: -3.75)
#   token 2: unseen                    -> 0.5
#   token 3: prompt and output once    -> 3 / 2 = 1.5,  1.5 - 0.5 - 0.25 = 0.75
#   token 4: unseen                    -> -2
#   token 5: unseen, padding of the prompt row does not make token 0 a prompt token either
HAND_Z = [2.0, -1.0, 0.5, 3.0, -2.0, 1.0]
HAND_PROMPT, HAND_OUTPUT = [1, 1, 1, 3], [3, 0, 0]
HAND_PARAMS = dict(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
HAND_WANT = [-0.25, -2.0, 0.5, 0.75, -2.0, 1.0]


def test_hand_computed_rule_counts_a_repeated_prompt_token_once():
    assert apply_penalties(HAND_Z, HAND_PROMPT, HAND_OUTPUT, 2.0, 0.5, 0.25) == HAND_WANT
    # The engine: a prefill of two rows (the second prompt [2] is padded with zeros to width 4),
    # then the output recorded over two steps, as the decoders do it.
    state = penalties.PenaltyState.empty(3, 6, "cpu")
    rows = torch.tensor([2, 0])
    state.start(rows, torch.tensor([HAND_PROMPT, [2, 0, 0, 0]]), torch.tensor([4, 1]))
    state.record(rows, torch.tensor([[3, 0], [5, 5]]), torch.tensor([2, 0]))     # row 0 takes nothing
    state.record(rows, torch.tensor([[0, 4], [5, 5]]), torch.tensor([1, 1]))
    counts, prompt = state.context(rows)
    assert prompt.tolist() == [[False, True, False, True, False, False], [False, False, True, False, False, False]]
    assert counts.tolist() == [[2, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 1]]
    params = SamplingParams(**HAND_PARAMS)
    z = penalties.penalize(torch.tensor([HAND_Z, HAND_Z], dtype=torch.float64), counts, prompt, params)
    assert z[0].tolist() == HAND_WANT
    assert z[1].tolist() == apply_penalties(HAND_Z, [2], [5], 2.0, 0.5, 0.25)


def test_tree_counts_follow_the_ancestor_mask():
    """Node j's context adds the drafts on the path root -> j, itself included, never the root
    (already counted) nor a sibling; an orphan adds only itself."""
    # root 0 (token 4) -> 1 (token 2) -> 3 (token 2); root -> 2 (token 5); node 4 (token 1): orphan
    tokens = torch.tensor([[4, 2, 5, 2, 1]])
    parents = [-1, 0, 0, 1, -1]
    mask = torch.zeros(1, 5, 5, dtype=torch.bool)
    for j in range(5):
        mask[0, j, j] = mask[0, j, 0] = True
        a = parents[j]
        while a > 0:
            mask[0, j, a] = True
            a = parents[a]
    base = torch.tensor([[0, 1, 0, 0, 1, 0]], dtype=torch.int32)                 # before the cycle: 1, root 4
    got = penalties.tree_counts(base, tokens, mask)[0].tolist()
    assert got == [[0, 1, 0, 0, 1, 0], [0, 1, 1, 0, 1, 0], [0, 1, 0, 0, 1, 1], [0, 1, 2, 0, 1, 0],
                   [0, 2, 0, 0, 1, 0]]


def test_prefill_token_is_penalized_over_the_prompt():
    """max_new_tokens=1: the only token is the prefill's, penalized by the prompt (repetition
    only: the output is empty). Long prompts hold the target's favourites, so a strong penalty
    changes some first token; the speculative prefill agrees."""
    models = cached_models(compute_dtype="float64")
    prompts = ragged_prompts(11, 6, VOCAB, min_len=30, max_len=60)
    plain = reference.generate(models, prompts, max_new_tokens=1).tokens
    want = reference.generate(models, prompts, max_new_tokens=1, repetition_penalty=3.0).tokens
    assert want != plain, "no first token changed: the case does not exercise the prompt penalty"
    for spec in (None, SpecConfig(num_steps=2, topk=2, num_draft_tokens=4)):
        got = specverify.generate(models, prompts, spec=spec, max_new_tokens=1, repetition_penalty=3.0).tokens
        assert_tokens_equal(got, want, f"prefill token with repetition 3.0, spec={spec}")


# -- target-only against the reference ------------------------------------------------------------

@functools.lru_cache(maxsize=8)
def unpenalized(logits_dtype: str, sampling: str) -> list:
    models = cached_models(compute_dtype="float64", logits_dtype=logits_dtype)
    return reference.generate(models, PROMPTS, max_new_tokens=BUDGETS, **SAMPLING[sampling]).tokens


@pytest.mark.parametrize("sampling", list(SAMPLING))
@pytest.mark.parametrize("pen", list(PENALTIES))
def test_target_only_matches_reference(pen, sampling, request):
    logits_dtype = "float8_e4m3fn" if pen in ("rep1.3", "all") else "float32"
    models = cached_models(compute_dtype="float64", logits_dtype=logits_dtype)
    kwargs = dict(PENALTIES[pen], **SAMPLING[sampling])
    got = specverify.generate(models, PROMPTS, max_new_tokens=BUDGETS, **kwargs).tokens
    want = reference.generate(models, PROMPTS, max_new_tokens=BUDGETS, **kwargs).tokens
    assert_tokens_equal(got, want, f"target-only {pen} {sampling} {logits_dtype}", request.node.nodeid)
    assert [len(t) for t in got] == BUDGETS
    assert want != unpenalized(logits_dtype, sampling), f"{pen} changed no token: the case is vacuous"


def test_strong_repetition_penalty_changes_greedy_output():
    models = cached_models(compute_dtype="float64")
    plain = specverify.generate(models, PROMPTS, max_new_tokens=BUDGETS).tokens
    got = specverify.generate(models, PROMPTS, max_new_tokens=BUDGETS, repetition_penalty=3.0).tokens
    assert got == reference.generate(models, PROMPTS, max_new_tokens=BUDGETS, repetition_penalty=3.0).tokens
    assert got != plain


def test_penalties_off_reproduce_todays_tokens():
    """The neutral values are today's decoder: the same tokens as a call without them, as the
    reference, and no penalty state allocated."""
    models = cached_models(compute_dtype="float64", logits_dtype="float8_e5m2")
    off = dict(repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0)
    spec = SpecConfig(num_steps=2, topk=2, num_draft_tokens=4)
    for sampling in SAMPLING.values():
        want = reference.generate(models, PROMPTS, max_new_tokens=BUDGETS, **sampling).tokens
        assert specverify.generate(models, PROMPTS, max_new_tokens=BUDGETS, **off, **sampling).tokens == want
        a = specverify.generate(models, PROMPTS, spec=spec, max_new_tokens=BUDGETS, **off, **sampling).tokens
        assert a == specverify.generate(models, PROMPTS, spec=spec, max_new_tokens=BUDGETS, **sampling).tokens
    dec = TargetOnlyDecoder(models, SamplingParams(**off), seed=0, eos_token_id=None)
    dec.start(new_requests(PROMPTS, BUDGETS))
    assert dec.state.penalty is None
    dec = TargetOnlyDecoder(models, SamplingParams(frequency_penalty=0.1), seed=0, eos_token_id=None)
    dec.start(new_requests(PROMPTS, BUDGETS))
    assert dec.state.penalty.counts.shape == (len(PROMPTS) + 1, VOCAB)


def test_eos_with_penalties(request):
    models = cached_models(compute_dtype="float64")
    pen = PENALTIES["all"]
    free = reference.generate(models, PROMPTS, max_new_tokens=12, **pen).tokens
    eos = free[1][4]                                        # request 1 emits it 5th
    want = reference.generate(models, PROMPTS, max_new_tokens=12, eos_token_id=eos, **pen).tokens
    assert want[1][-1] == eos and len(want[1]) <= 5
    for spec in (None, SpecConfig(num_steps=3, topk=1), SpecConfig(num_steps=2, topk=2, num_draft_tokens=5)):
        models_s = models if spec is None else penalty_steered(models, PROMPTS, 12, spec, pen)
        got = specverify.generate(models_s, PROMPTS, spec=spec, max_new_tokens=12, eos_token_id=eos, **pen).tokens
        assert_tokens_equal(got, want, f"EOS with penalties, spec={spec}", request.node.nodeid)


def test_logprobs_stay_raw_with_penalties():
    """Logprobs report the raw distribution (docs/semantics.md section 7): the records of the
    penalized run equal the reference's teacher-forced raw records."""
    models = cached_models(compute_dtype="float64")
    out = specverify.generate(models, PROMPTS, max_new_tokens=BUDGETS, logprobs=3, **PENALTIES["all"])
    for r, (prompt, tokens) in enumerate(zip(PROMPTS, out.tokens)):
        assert_records_match(out.logprobs[r], reference_records(models, prompt, tokens, 3), f"request {r}")


# -- EAGLE -----------------------------------------------------------------------------------------

EAGLE_SPECS = {"chain-S3": SpecConfig(num_steps=3, topk=1),
               "tree-k2-S3-D6": SpecConfig(num_steps=3, topk=2, num_draft_tokens=6, page_size=4),
               "naive-p4": SpecConfig(algorithm="naive_eagle", page_size=4)}


# The naive chain's second verify row sees its one draft token in its context; it decides where
# the draft is a token's first occurrence and the penalties reward repeats (r < 1, p < 0): runs of
# repeats that start on such a cycle need longer outputs than the trees' deep paths do.
LOSSLESS_BUDGETS = {"naive-p4": [20, 20, 20, 1]}


@pytest.mark.parametrize("pen", ["rep1.3", "freq0.7", "all"])
@pytest.mark.parametrize("name", list(EAGLE_SPECS))
def test_eagle_greedy_is_lossless_with_penalties(name, pen, request):
    """Greedy speculative == greedy target-only with the same penalties (both implementations),
    with drafts accepted deep into the tree, where a node's context holds the drafts above it."""
    spec, budgets = EAGLE_SPECS[name], LOSSLESS_BUDGETS.get(name, BUDGETS)
    plain = cached_models(compute_dtype="float64", logits_dtype="float8_e4m3fn")
    models = penalty_steered(plain, PROMPTS, budgets, spec, PENALTIES[pen])
    got = specverify.generate(models, PROMPTS, spec=spec, max_new_tokens=budgets, **PENALTIES[pen])
    target = specverify.generate(plain, PROMPTS, max_new_tokens=budgets, **PENALTIES[pen]).tokens
    assert_tokens_equal(got.tokens, target, f"EAGLE {name} vs target-only, {pen}", request.node.nodeid)
    assert_tokens_equal(got.tokens, reference.generate(plain, PROMPTS, max_new_tokens=budgets, **PENALTIES[pen]).tokens,
                        f"EAGLE {name} vs reference, {pen}", request.node.nodeid)
    deepest = min(3, spec.num_steps + 1)       # naive EAGLE emits at most 2 per cycle
    assert max(n for lengths in got.accept_lengths for n in lengths) >= deepest, got.accept_lengths


def compare_trace(models, hook, prompts, budgets, spec, kwargs) -> int:
    """Optimized vs reference speculative decoder, cycle by cycle (tests/support/traces.py), up to
    each request's first near-tie; returns the accepted drafts compared."""
    out = specverify.generate(models, prompts, spec=spec, max_new_tokens=budgets, trace=True, **kwargs)
    ref = reference.eagle.generate(models, prompts, spec_num_steps=spec.num_steps, topk=spec.topk,
                                   num_draft_tokens=spec.draft_tokens, max_new_tokens=budgets,
                                   draft_logits_hook=hook, **kwargs)
    stats, compared = compare_traces(out, ref, prompts, budgets, f"{spec} {kwargs}")
    assert len(stats["skipped"]) <= len(prompts) // 2, f"near-ties stopped requests: {stats['skipped']}"
    return sum(sum(1 for j in cycle.accepted if j >= 0) - 1 for _, cycle in compared)


TRACE_CASES = {
    "greedy-chain-f32": ("chain-S3", "float32", "all", SAMPLING["greedy"]),
    "greedy-tree-e4m3fn": ("tree-k2-S3-D6", "float8_e4m3fn", "rep1.3", SAMPLING["greedy"]),
    "sampled-chain-e5m2": ("chain-S3", "float8_e5m2", "freq0.7", dict(temperature=0.3, top_k=20, seed=3)),
    "sampled-tree-f32": ("tree-k2-S3-D6", "float32", "all", dict(temperature=0.3, min_p=0.05, seed=9)),
    "greedy-naive-e4m3fnuz": ("naive-p4", "float8_e4m3fnuz", "all", SAMPLING["greedy"]),
}


@pytest.mark.parametrize("case", list(TRACE_CASES))
def test_eagle_trace_equals_reference_with_penalties(case):
    name, logits_dtype, pen, sampling = TRACE_CASES[case]
    spec = EAGLE_SPECS[name]
    plain = cached_models(compute_dtype="float64", logits_dtype=logits_dtype)
    models = penalty_steered(plain, PROMPTS, BUDGETS, spec, PENALTIES[pen])
    accepted = compare_trace(models, reference_hook(models.draft), PROMPTS, BUDGETS, spec,
                             dict(PENALTIES[pen], **sampling))
    assert accepted > 0, "no draft accepted: the tree-node context was never decisive"


def test_eagle_padded_path_equals_live_path_with_penalties():
    """The padded bucket path (what the CUDA graphs replay; lanes of the pad row) decodes exactly
    as the live-shape path, with the penalty state scattered by every lane."""
    spec = EAGLE_SPECS["tree-k2-S3-D6"]
    plain = cached_models(compute_dtype="float64")
    models = penalty_steered(plain, PROMPTS, BUDGETS, spec, PENALTIES["all"])
    params = SamplingParams(temperature=0.7, top_k=20, **PENALTIES["all"])
    runs = []
    for pad in (False, True):
        dec, reqs = start_decoder(models, spec, params, PROMPTS, BUDGETS, eos=None, pad_batches=pad)
        while dec.running():
            dec.step()
        runs.append(([r.output for r in reqs], dec.traces))
    assert runs[0] == runs[1]
    dec = TargetOnlyDecoder(plain, params, seed=11, eos_token_id=None, pad_batches=True)
    reqs = new_requests(PROMPTS, BUDGETS)
    dec.start(reqs)
    while dec.running():
        dec.step()
    want = reference.generate(plain, PROMPTS, max_new_tokens=BUDGETS, seed=11, temperature=0.7, top_k=20,
                              **PENALTIES["all"]).tokens
    assert [r.output for r in reqs] == want


# -- stochastic losslessness ----------------------------------------------------------------------

ALPHA = 1e-6          # false-positive rate of each chi-square (fixed seeds: reproducible)
DRAWS = 2000
LAW_PROMPT = [17, 250, 3, 99, 41]
LAW_SAMPLING = dict(temperature=0.7, top_k=5)
# Repeats rewarded (r < 1, p < 0) and taxed by count (f > 0): the tiny target rarely repeats a
# token on its own, so penalties that discourage repeats would barely move its law.
LAW_PEN = dict(repetition_penalty=0.6, frequency_penalty=0.5, presence_penalty=-1.0)
LAW_MODELS = dict(compute_dtype="float64", logits_dtype="float32")
RUN_SEED = 20261207


@functools.lru_cache(maxsize=64)
def next_law(context: tuple, pen: tuple) -> dict:
    """The penalized target-only law of the token after `context` (LAW_PROMPT + output so far)."""
    models = cached_models(**LAW_MODELS)
    row = reference.forward_logits(models.config, models.target_weights, list(context))[-1]
    z = reference.convert_logits(models.config, row).dequant
    z = apply_penalties(z, LAW_PROMPT, list(context[len(LAW_PROMPT):]), *pen)
    p = reference.filtered_probs(z, **LAW_SAMPLING)
    return {t: q for t, q in enumerate(p) if q > 0}


def law_of_token(index: int, pen: tuple) -> dict:
    """Exact marginal law of output token `index` (0 = the prefill token), by enumeration."""
    paths = {(): 1.0}
    for _ in range(index):
        paths = {path + (t,): w * q for path, w in paths.items()
                 for t, q in next_law(tuple(LAW_PROMPT) + path, pen).items()}
    law = collections.Counter()
    for path, w in paths.items():
        for t, q in next_law(tuple(LAW_PROMPT) + path, pen).items():
            law[t] += w * q
    return dict(law)


PEN_TUPLE = (LAW_PEN["repetition_penalty"], LAW_PEN["frequency_penalty"], LAW_PEN["presence_penalty"])


LAW_SPECS = {"tree-k2-S2-D4": SpecConfig(num_steps=2, topk=2, num_draft_tokens=4),
             "naive-exact": SpecConfig(algorithm="naive_eagle")}


@pytest.mark.parametrize("name", list(LAW_SPECS))
def test_eagle_sampling_with_penalties_matches_target_law(name):
    """DRAWS requests of one prompt (each its own uniform stream), steered drafts (a k=2 tree; the
    naive chain with exact sampling): output tokens 1 (the first cycle's root row) and 2 (a
    depth-1 node's row when the first draft was accepted: the tree-node context) follow the
    penalized target-only law."""
    spec = LAW_SPECS[name]
    prompts = [LAW_PROMPT] * DRAWS
    models = penalty_steered(cached_models(**LAW_MODELS), prompts, 3, spec, LAW_PEN, agreement=0.7)
    out = specverify.generate(models, prompts, spec=spec, max_new_tokens=3, seed=RUN_SEED, **LAW_SAMPLING, **LAW_PEN)
    for index in (1, 2):
        law = law_of_token(index, PEN_TUPLE)
        plain = law_of_token(index, (1.0, 0.0, 0.0))
        distance = sum(abs(law.get(t, 0.0) - plain.get(t, 0.0)) for t in set(law) | set(plain)) / 2
        assert distance > 0.1, f"token {index}: the penalties barely move the law (TV {distance:.3f})"
        counts = collections.Counter(t[index] for t in out.tokens)
        stat, p_value, df = pooled_chi_square(counts, law, DRAWS)
        assert p_value > ALPHA, (f"token {index}: chi-square {stat:.1f} on {df} df, p = {p_value:.3g} < {ALPHA}; "
                                 f"run seed {RUN_SEED}")
    first = [lengths[0] for lengths in out.accept_lengths]
    assert any(n == 1 for n in first) and any(n >= 2 for n in first), "both rejection and acceptance"
    # Power: the same run without penalties fails the same check.
    plain = specverify.generate(models, prompts, spec=spec, max_new_tokens=3, seed=RUN_SEED, **LAW_SAMPLING)
    counts = collections.Counter(t[2] for t in plain.tokens)
    assert pooled_chi_square(counts, law_of_token(2, PEN_TUPLE), DRAWS)[1] < ALPHA


# -- validation -----------------------------------------------------------------------------------

BAD = [
    (dict(repetition_penalty=0.0), ValueError, r"repetition_penalty must be in \[1e-18, 1e\+18\]"),
    (dict(repetition_penalty=-1.0), ValueError, "repetition_penalty"),
    (dict(repetition_penalty=1e19), ValueError, "repetition_penalty"),
    (dict(repetition_penalty=float("nan")), ValueError, "repetition_penalty"),
    (dict(repetition_penalty=True), TypeError, "repetition_penalty"),
    (dict(frequency_penalty=2.5), ValueError, r"frequency_penalty must be in \[-2, 2\]"),
    (dict(frequency_penalty=float("inf")), ValueError, "frequency_penalty"),
    (dict(frequency_penalty="0.5"), TypeError, "frequency_penalty"),
    (dict(presence_penalty=-2.01), ValueError, r"presence_penalty must be in \[-2, 2\]"),
    (dict(presence_penalty=None), TypeError, "presence_penalty"),
]


@pytest.mark.parametrize("bad,error,match", BAD, ids=[f"{next(iter(b))}={next(iter(b.values()))!r}" for b, _, _ in BAD])
def test_bad_penalties_raise_clear_errors(bad, error, match):
    models = cached_models()
    name = next(iter(bad))
    with pytest.raises(error, match=match):
        specverify.generate(models, [[1, 2, 3]], max_new_tokens=2, **bad)
    with pytest.raises(error, match=match):
        specverify.generate(models, [[1, 2, 3]], max_new_tokens=2, spec=SpecConfig(num_steps=2, topk=1), **bad)
    with pytest.raises(error, match=name):
        SamplingParams(**bad)
    with pytest.raises(ValueError, match=name):          # the reference: ValueError, its own wording
        reference.generate(models, [[1, 2, 3]], max_new_tokens=2, **bad)
    with pytest.raises(ValueError, match=name):
        reference.eagle.generate(models, [[1, 2, 3]], spec_num_steps=2, topk=1, max_new_tokens=2, **bad)


def test_bounds_are_accepted():
    models = cached_models()
    for kw in (dict(repetition_penalty=1e-18), dict(repetition_penalty=1e18), dict(frequency_penalty=-2.0),
               dict(presence_penalty=2), dict(frequency_penalty=2.0, presence_penalty=-2.0)):
        got = specverify.generate(models, [[1, 2, 3]], max_new_tokens=3, **kw).tokens
        assert got == reference.generate(models, [[1, 2, 3]], max_new_tokens=3, **kw).tokens, kw


# -- CUDA: the captured cycles --------------------------------------------------------------------

CAPTURED_SPECS = {"tree-k2-S3-D6": dict(num_steps=3, topk=2, num_draft_tokens=6),
                  "naive": dict(algorithm="naive_eagle")}


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(CAPTURED_SPECS))
@pytest.mark.parametrize("sampling", ["greedy", "t0.7-topk20"])
def test_captured_cycles_with_penalties(sampling, name):
    """On the device, with penalties: the captured speculative cycle and target-only step sync
    only for their readback, and graph replays equal eager runs bit for bit."""
    from tests.test_cuda_graphs import gpu_models, run_under_sync_check

    pen = PENALTIES["all"]
    params = SamplingParams(**pen) if sampling == "greedy" else SamplingParams(temperature=0.7, top_k=20, **pen)
    prompts = ragged_prompts(31, 4, VOCAB, max_len=10)
    spec = SpecConfig(**CAPTURED_SPECS[name])
    models = steered_models(gpu_models(), prompts, 40, agreement=0.7, spec=spec,
                            oracle=penalized_oracle(gpu_models(), prompts, [60] * 4, pen).cuda())
    dec, reqs = start_decoder(models, spec, params, prompts, [6, 40, 40, 40], eos=None, pad_batches=None)
    assert dec.use_graphs and dec.state.requests.penalty is not None
    run_under_sync_check(dec, reqs, "finishes")
    tdec = TargetOnlyDecoder(gpu_models(), params, seed=5, eos_token_id=None, page_size=4)
    treqs = new_requests(prompts, [4, 40, 40, 40])
    tdec.start(treqs)
    assert tdec.use_graphs
    run_under_sync_check(tdec, treqs, "finishes")

    budgets = [3, 9, 17, 30]
    eager_spec = SpecConfig(**CAPTURED_SPECS[name], cuda_graph=False)
    graph, greqs = start_decoder(models, spec, params, prompts, budgets, eos=None, pad_batches=None)
    eager, ereqs = start_decoder(models, eager_spec, params, prompts, budgets, eos=None, pad_batches=None)
    while graph.running() or eager.running():
        graph.step()
        eager.step()
        for g, e in zip(greqs, ereqs):
            if not g.finished:
                assert torch.equal(graph.state.requests.penalty.counts[g.row], eager.state.requests.penalty.counts[e.row])
    assert [r.output for r in greqs] == [r.output for r in ereqs] and graph.traces == eager.traces
