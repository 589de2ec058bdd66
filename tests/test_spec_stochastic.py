"""Stochastic losslessness end to end: speculative sampling emits tokens distributed exactly as
target-only sampling.

The exact law of the first speculative tokens is computed from the reference's float64 forward
and sampling rules; the speculative decoder's samples (one request per sample, each with its own
uniform stream) are held against it with Pearson's chi-square. Each test's false-positive rate is
ALPHA = 1e-6 (the seeds are fixed, so a pass or a failure is reproducible)."""

from __future__ import annotations

import collections
import functools

import pytest

import reference
import specverify
from specverify.engine.speculative import SpecConfig
from tests.support.cases import cached_models, steered_cached_models
from specverify.conformance.stats import pooled_chi_square

pytestmark = pytest.mark.e2e

ALPHA = 1e-6
DRAWS = 3000
PROMPT = [17, 250, 3, 99, 41]
PARAMS = dict(temperature=0.7, top_k=5)


@functools.lru_cache(maxsize=8)
def next_law(models_key: tuple, context: tuple) -> dict:
    """The target's sampling distribution of the next token after `context` (nonzero cells)."""
    models = cached_models(**dict(models_key))
    row = reference.forward_logits(models.config, models.target_weights, list(context))[-1]
    p = reference.filtered_probs(reference.convert_logits(models.config, row).dequant, **PARAMS)
    return {t: q for t, q in enumerate(p) if q > 0}


def law_of_token(models_key: tuple, index: int) -> dict:
    """Exact marginal law of output token `index` (0 = the prefill token), by enumeration."""
    paths = {(): 1.0}
    for _ in range(index):
        paths = {path + (t,): w * q for path, w in paths.items()
                 for t, q in next_law(models_key, tuple(PROMPT) + path).items()}
    law = collections.Counter()
    for path, w in paths.items():
        for t, q in next_law(models_key, tuple(PROMPT) + path).items():
            law[t] += w * q
    return dict(law)


SPECS = {
    "chain-S2": (SpecConfig(num_steps=2, topk=1), 0.7),
    "tree-k2-S2-D4": (SpecConfig(num_steps=2, topk=2, num_draft_tokens=4), 0.7),
    "always-wrong-tree": (SpecConfig(num_steps=3, topk=2, num_draft_tokens=5), 0.0),
}
RUN_SEED = 20261121


def models_key(agreement: float) -> tuple:
    """Build arguments of the models. The target law does not depend on the draft: `agreement`
    steers only the draft (steered_cached_models), so every agreement shares one key."""
    return (("compute_dtype", "float64"), ("logits_dtype", "float8_e4m3fn"))


@functools.lru_cache(maxsize=4)
def speculative_run(name: str):
    """DRAWS independent requests of one prompt (each request has its own uniform stream)."""
    spec, agreement = SPECS[name]
    models = steered_cached_models(agreement, [PROMPT] * DRAWS, 3, spec, **dict(models_key(agreement)))
    return specverify.generate(models, [PROMPT] * DRAWS, spec=spec, max_new_tokens=3, seed=RUN_SEED, **PARAMS)


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("index", [1, 2])
def test_speculative_sampling_matches_target_law(name, index):
    out = speculative_run(name)
    counts = collections.Counter(t[index] for t in out.tokens)
    stat, p_value, df = pooled_chi_square(counts, law_of_token(models_key(SPECS[name][1]), index), DRAWS)
    assert p_value > ALPHA, (f"{name} token {index}: chi-square {stat:.1f} on {df} df, p = {p_value:.3g} "
                             f"< {ALPHA}; run seed {RUN_SEED}")
    # The case must exercise both acceptance and rejection of drafts (always-wrong: rejection only).
    steps = [n for lengths in out.accept_lengths for n in lengths[:1]]
    assert any(n == 1 for n in steps)
    if SPECS[name][1] > 0:
        assert any(n > 1 for n in steps)


def test_a_biased_sampler_fails_the_same_check():
    """The check has power: drawing from the target at temperature 1.0 instead of 0.7 fails."""
    key = models_key(0.7)
    models = steered_cached_models(0.7, [PROMPT] * DRAWS, 3, SpecConfig(num_steps=2, topk=1), **dict(key))
    out = specverify.generate(models, [PROMPT] * DRAWS, spec=SpecConfig(num_steps=2, topk=1), max_new_tokens=3,
                              seed=RUN_SEED, temperature=1.0, top_k=5)
    counts = collections.Counter(t[1] for t in out.tokens)
    _, p_value, _ = pooled_chi_square(counts, law_of_token(key, 1), DRAWS)
    assert p_value < ALPHA


def test_speculative_sampling_is_reproducible_and_seeded():
    spec = SpecConfig(num_steps=2, topk=2, num_draft_tokens=4)
    models = steered_cached_models(0.7, [PROMPT] * 4, 8, spec, compute_dtype="float64")
    a = specverify.generate(models, [PROMPT] * 4, spec=spec, max_new_tokens=8, seed=3, **PARAMS).tokens
    b = specverify.generate(models, [PROMPT] * 4, spec=spec, max_new_tokens=8, seed=3, **PARAMS).tokens
    c = specverify.generate(models, [PROMPT] * 4, spec=spec, max_new_tokens=8, seed=4, **PARAMS).tokens
    assert a == b and a != c


# ------------------------------------------------------------------------------------------------
# Filters other than top-k, and FP8 scales != 1 (static and per row), end to end. One speculative
# run per case; the marginal of output token 1 (the first speculative cycle's first token: an
# accepted draft or the bonus) against its exact law. False-positive rate ALPHA = 1e-6 per test.

FILTER_DRAWS = 1500
FILTER_CASES = {
    "top_p-e4m3fn-static0.37": (dict(logits_dtype="float8_e4m3fn", logits_scale=0.37),
                                dict(temperature=0.8, top_p=0.85), SpecConfig(num_steps=2, topk=2, num_draft_tokens=4)),
    "min_p-e5m2-per_row": (dict(logits_dtype="float8_e5m2", logits_scale_mode="per_row"),
                           dict(temperature=1.0, min_p=0.1), SpecConfig(num_steps=2, topk=1)),
}


@functools.lru_cache(maxsize=16)
def filtered_next_law(case_name: str, context: tuple) -> dict:
    build, params, _ = FILTER_CASES[case_name]
    models = cached_models(compute_dtype="float64", **build)
    row = reference.forward_logits(models.config, models.target_weights, list(context))[-1]
    p = reference.filtered_probs(reference.convert_logits(models.config, row).dequant, **params)
    return {t: q for t, q in enumerate(p) if q > 0}


@pytest.mark.parametrize("case_name", list(FILTER_CASES))
def test_speculative_sampling_with_top_p_min_p_and_scales(case_name):
    """Token 1's law under top-p (static FP8 scale 0.37) and min-p (per-row FP8 scales): the exact
    law sums token 0's law times the next-token law; the speculative decoder's FILTER_DRAWS
    requests must fit it (false-positive rate ALPHA = 1e-6), and the run must accept drafts."""
    build, params, spec = FILTER_CASES[case_name]
    prompts = [PROMPT] * FILTER_DRAWS
    models = steered_cached_models(0.7, prompts, 3, spec, compute_dtype="float64", **build)
    assert models.config.logits_scale != 1.0 or models.config.logits_scale_mode == "per_row"
    out = specverify.generate(models, prompts, spec=spec, max_new_tokens=3, seed=RUN_SEED, **params)
    law = collections.Counter()
    for t0, q0 in filtered_next_law(case_name, tuple(PROMPT)).items():
        for t1, q1 in filtered_next_law(case_name, tuple(PROMPT) + (t0,)).items():
            law[t1] += q0 * q1
    counts = collections.Counter(t[1] for t in out.tokens)
    stat, p_value, df = pooled_chi_square(counts, dict(law), FILTER_DRAWS)
    assert p_value > ALPHA, (f"{case_name}: chi-square {stat:.1f} on {df} df, p = {p_value:.3g} < {ALPHA}; "
                             f"run seed {RUN_SEED}")
    steps = [lengths[0] for lengths in out.accept_lengths if lengths]
    assert any(n > 1 for n in steps) and any(n == 1 for n in steps), "both acceptance and rejection"
