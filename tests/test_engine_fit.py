"""Validation and the engine agree on what fits (issue 7, item 10, second sweep).

Right at the boundary of max_context, for target-only and speculative decoding, every page size
(dividing max_context or not, smaller or larger than it) and draft shapes up to topk 16: a call
either raises a clear ValueError that names the bound, or runs and emits exactly the reference's
greedy tokens. Any other exception is a bug (it used to be "size of tensor a (513) must match ...
(512)" for topk >= 4, and an expand error once a sequence passed the last whole page of a
page_size that does not divide max_context).

The sweep runs on the tiny model with a short max_context (same weights; the reference's cost
grows with the context length), so every case reaches the boundary in a few tokens."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

import reference
import specverify
from specverify.engine.speculative import SpecConfig
from specverify.models import DraftHead, Models, TargetModel
from tests.support.allpairs import all_pairs, uncovered_pairs
from tests.support.asserts import assert_tokens_equal
from tests.support.cases import cached_models

CTX = 48
SPECS = [(1, 1, 2), (1, 3, 4), (2, 3, 6), (4, 2, 7), (4, 3, 8), (8, 2, 9), (16, 2, 10), (6, 3, 12)]
PAGE_SIZES = [1, 3, 5, 7, CTX - 1, CTX, CTX + 1, 100]
FACTORS = {
    "spec": SPECS,
    "page_size": PAGE_SIZES,
    "slack": [-1, 0, 1],             # prompt + max_new_tokens (+ draft region + 1) - max_context
    "max_new": [1, 3],
    "bs": [1, 2],                    # bs 2 adds a short request beside the one at the boundary
}
CASES = all_pairs(FACTORS)


@functools.lru_cache(maxsize=4)
def context_models(ctx: int) -> Models:
    """The tiny float64 models with max_context = ctx (the weights do not depend on it)."""
    base = cached_models(compute_dtype="float64")
    cfg = base.config.replace(max_context=ctx)
    target = TargetModel(cfg, base.target_weights, "cpu")
    return dataclasses.replace(base, config=cfg, target=target,
                               draft=DraftHead(cfg, base.draft_weights, target.w, dtype=target.dtype))


def boundary_prompts(models: Models, length: int, bs: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(4000 + length)
    long = torch.randint(0, models.config.vocab_size, (length,), generator=g).tolist()
    return [long, [7, 1, 300]][:bs]


@functools.lru_cache(maxsize=256)
def reference_tokens(ctx: int, prompts: tuple, max_new: int) -> list[list[int]]:
    return reference.generate(context_models(ctx), [list(p) for p in prompts], max_new_tokens=max_new).tokens


def check_fit_or_clear_error(models: Models, prompts, max_new: int, fits: bool, what: str, nodeid: str,
                             **kwargs) -> None:
    try:
        out = specverify.generate(models, prompts, max_new_tokens=max_new, **kwargs)
    except ValueError as e:
        assert not fits, f"{what}: a call that fits was refused: {e}"
        assert "max_context" in str(e) and str(models.config.max_context) in str(e), \
            f"{what}: the error must name max_context and its value: {e}"
        return
    except Exception as e:  # noqa: BLE001 - any other exception is the bug this test exists for
        pytest.fail(f"{what}: {type(e).__name__} inside the engine instead of a result or a "
                    f"ValueError: {e}")
    assert fits, f"{what}: a call past max_context was accepted"
    want = reference_tokens(models.config.max_context, tuple(map(tuple, prompts)), max_new)
    assert_tokens_equal(out.tokens, want, what, nodeid)


def case_id(c: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in c.items()).replace(" ", "").replace("(", "").replace(")", "")


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_speculative_boundary_fits_or_raises(case, request):
    models = context_models(CTX)
    k, s, d = case["spec"]
    spec = SpecConfig(num_steps=s, topk=k, num_draft_tokens=d, page_size=case["page_size"])
    region = max(d, (s - 1) * k)
    length = CTX - case["max_new"] - region - 1 + case["slack"]
    prompts = boundary_prompts(models, length, case["bs"])
    check_fit_or_clear_error(models, prompts, case["max_new"], case["slack"] <= 0, f"speculative {case_id(case)}",
                             request.node.nodeid, spec=spec)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("slack", [-1, 0, 1])
@pytest.mark.parametrize("max_new", [1, 4])
def test_target_only_boundary_fits_or_raises(page_size, slack, max_new, request):
    models = context_models(CTX)
    prompts = boundary_prompts(models, CTX - max_new + slack, 2)
    check_fit_or_clear_error(models, prompts, max_new, slack <= 0, f"target-only page={page_size} slack={slack}",
                             request.node.nodeid, page_size=page_size)


def test_sweep_covers_every_pair():
    assert uncovered_pairs(FACTORS, CASES) == []


def test_topk_up_to_the_vocabulary_runs_and_beyond_is_refused(request):
    """topk == vocab_size is supported (the draft may rank the whole vocabulary); topk above it is
    refused up front with an error naming topk and the vocabulary size."""
    models = cached_models(compute_dtype="float64")
    v = models.config.vocab_size
    prompts = [[1, 2, 3], [300]]
    out = specverify.generate(models, prompts, spec=SpecConfig(topk=v, num_steps=2, num_draft_tokens=3),
                              max_new_tokens=4)
    assert_tokens_equal(out.tokens, reference.generate(models, prompts, max_new_tokens=4).tokens,
                        f"topk={v}", request.node.nodeid)
    with pytest.raises(ValueError, match=rf"spec.topk {v + 1} exceeds the vocabulary size {v}"):
        specverify.generate(models, prompts, spec=SpecConfig(topk=v + 1, num_steps=2, num_draft_tokens=3),
                            max_new_tokens=4)


@pytest.mark.slow
@pytest.mark.parametrize("spec", [(4, 2, 7), (8, 2, 9), (16, 2, 10)], ids=lambda s: f"k{s[0]}-S{s[1]}-D{s[2]}")
@pytest.mark.parametrize("page_size", [1, 5, 300])
def test_issue_boundary_at_full_context(spec, page_size, request):
    """The issue's own cases, at the tiny preset's max_context (the reference costs ~15 s each)."""
    models = cached_models(compute_dtype="float64")
    k, s, d = spec
    ctx, max_new = models.config.max_context, 3
    length = ctx - max_new - max(d, (s - 1) * k) - 1
    prompts = boundary_prompts(models, length, 1)
    out = specverify.generate(models, prompts, spec=SpecConfig(num_steps=s, topk=k, num_draft_tokens=d,
                                                               page_size=page_size), max_new_tokens=max_new)
    assert_tokens_equal(out.tokens, reference.generate(models, prompts, max_new_tokens=max_new).tokens,
                        f"full context {spec} page={page_size}", request.node.nodeid)


def test_the_mtp_models_have_three_heads_by_default():
    """The default MTP draft has three heads: num_steps 3 runs, 4 is refused naming the bound
    (found by the first generated-mutant campaign: nothing pinned the default)."""
    models = specverify.build_models("tiny", compute_dtype="float64")
    assert models.config.mtp_heads == 3 and len(models.mtp) == 3
    specverify.generate(models, [[1, 2, 3]], spec=SpecConfig(algorithm="mtp", num_steps=3), max_new_tokens=2)
    with pytest.raises(ValueError, match=r"num_steps=4 exceeds the models' mtp_heads=3"):
        specverify.generate(models, [[1, 2, 3]], spec=SpecConfig(algorithm="mtp", num_steps=4), max_new_tokens=2)
