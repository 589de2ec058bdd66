"""The EAGLE draft head: cached forward consistency and the agreement knob."""

from __future__ import annotations

import pytest
import torch

from specverify import build_models, dtypes
from specverify.models import Batch, chain_mask
from specverify.models.draft import agreement_draw
from tests.support.asserts import assert_close


def draft_batch(rows, kv_lens, tokens, device="cpu") -> Batch:
    bs, q = tokens.shape
    mask, parents = chain_mask(bs, q, device)
    kv = torch.tensor(kv_lens)
    return Batch(tokens, kv[:, None] + torch.arange(q)[None, :], torch.tensor(rows), kv,
                 torch.full((bs,), q), mask, parents, int(kv.max()) + q)


def test_draft_extend_then_decode_equals_one_extend(seed):
    models = build_models("tiny", seed=seed % 1000, compute_dtype="float64", device="cpu")
    cfg = models.config
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (2, 9), generator=g)
    feats = torch.randn((2, 9, cfg.hidden_size), generator=g, dtype=torch.float64)

    whole = models.target.new_cache(max_requests=2)
    rows = [whole.table.alloc_row() for _ in range(2)]
    for r in rows:
        whole.table.reserve(r, 9)
    one = models.draft.forward(whole, draft_batch(rows, [0, 0], tokens), feats)

    steps = models.target.new_cache(max_requests=2)
    rows = [steps.table.alloc_row() for _ in range(2)]
    for r in rows:
        steps.table.reserve(r, 9)
    models.draft.forward(steps, draft_batch(rows, [0, 0], tokens[:, :6]), feats[:, :6])
    for j in range(6, 9):
        out = models.draft.forward(steps, draft_batch(rows, [j, j], tokens[:, j:j + 1]), feats[:, j:j + 1])
        assert_close(out.hidden[:, 0], one.hidden[:, j], "float64", f"draft hidden at {j}")
        assert_close(out.logits[:, 0].double(), one.logits[:, j].double(), ("float64", cfg.logits_dtype),
                     f"draft logits at {j}")


def steered_logits(agreement, logits_dtype, n=512, seed=0):
    models = build_models("tiny", seed=seed, draft_agreement=agreement, logits_dtype=logits_dtype, device="cpu")
    cfg = models.config
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (n, 1), generator=g)
    feats = torch.randn((n, 1, cfg.hidden_size), generator=g)
    oracle = torch.randint(0, cfg.vocab_size, (n, 1), generator=g)
    oracle[:8] = -1                                                   # unknown rows stay as they are
    keys = torch.arange(n)[:, None] * 1000 + 17
    cache = models.target.new_cache(max_requests=n)
    rows = [cache.table.alloc_row() for _ in range(n)]
    for r in rows:
        cache.table.reserve(r, 1)
    batch = draft_batch(rows, [0] * n, tokens)
    out = models.draft.forward(cache, batch, feats, oracle_next=oracle, oracle_keys=keys)
    plain = models.draft.forward(cache, batch, feats)
    return out.logits[:, 0].float(), plain.logits[:, 0].float(), oracle[:, 0]


@pytest.mark.parametrize("logits_dtype", ["float32", "bfloat16", "float8_e4m3fn", "float8_e5m2fnuz"])
def test_always_right_oracle_makes_target_token_the_unique_top(logits_dtype):
    logits, plain, oracle = steered_logits(1.0, logits_dtype)
    known = oracle >= 0
    top = logits.max(-1)
    assert torch.equal(top.indices[known], oracle[known])
    assert ((logits == top.values[:, None]).sum(-1)[known] == 1).all(), "steered token must not tie"
    assert torch.equal(logits[~known], plain[~known])


@pytest.mark.parametrize("logits_dtype", ["float32", "float8_e5m2"])
def test_always_wrong_oracle_never_proposes_target_token(logits_dtype):
    logits, _, oracle = steered_logits(0.0, logits_dtype)
    known = oracle >= 0
    top8 = logits.topk(8, dim=-1).indices
    assert not (top8[known] == oracle[known][:, None]).any()


def test_partial_agreement_rate_follows_knob():
    logits, _, oracle = steered_logits(0.3, "float32", n=2000)
    known = oracle >= 0
    rate = (logits.argmax(-1)[known] == oracle[known]).float().mean().item()
    assert abs(rate - 0.3) < 0.05


def test_agreement_draw_is_deterministic_and_uniform():
    keys = torch.arange(20000)
    a, b = agreement_draw(5, keys), agreement_draw(5, keys)
    assert torch.equal(a, b)
    assert not torch.equal(a, agreement_draw(6, keys))
    assert 0.0 <= a.min() and a.max() < 1.0
    hist = torch.histc(a.float(), bins=10, min=0, max=1)
    assert (hist - 2000).abs().max() < 200


def test_agreement_out_of_range_raises():
    with pytest.raises(ValueError, match=r"draft_agreement must be None or in \[0, 1\]"):
        build_models("tiny", draft_agreement=1.5, device="cpu")


def test_build_models_rejects_unknown_dtypes():
    with pytest.raises(ValueError, match="logits_dtype must be one of"):
        build_models("tiny", logits_dtype="float8_e8m0", device="cpu")
    with pytest.raises(ValueError, match="compute_dtype must be one of"):
        build_models("tiny", compute_dtype="int8", device="cpu")
    with pytest.raises(ValueError, match="preset 'huge' is unknown"):
        build_models("huge", device="cpu")


def test_models_are_deterministic_from_seed():
    a, b, c = (build_models("tiny", seed=s, device="cpu") for s in (4, 4, 5))
    assert all(torch.equal(a.target_weights[k], b.target_weights[k]) for k in a.target_weights)
    assert not torch.equal(a.target_weights["embed"], c.target_weights["embed"])
    assert set(a.target_weights) == set(c.target_weights)
    assert dtypes.dtype_info(a.config.compute_dtype).torch_dtype == a.target.w["embed"].dtype


def test_presets_have_the_promised_sizes():
    from specverify.models import preset_config
    tiny, small = preset_config("tiny"), preset_config("small", hybrid=True)
    assert tiny.vocab_size % 64 != 0, "tiny's vocab is deliberately not a multiple of a kernel block"
    assert small.vocab_size >= 32000 and small.num_layers >= 8
    assert small.layer_kinds.count("recurrent") == 4 and small.is_hybrid and not tiny.is_hybrid
