"""The EAGLE draft head (cached forward consistency, compute/deliver split), the engine's request ids,
and the test-side steering wrapper of tests/support/steering.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specverify import build_models, dtypes
from specverify.models import Batch, chain_mask
from specverify.models.kv_cache import SINK_SLOT
from tests.support.asserts import assert_close
from tests.support.cases import cached_models
from tests.support.steering import (PEAK_MARGIN, STEER_BLOCK, SteeredDraft, agreement_draw, follows_oracle, lookahead,
                                    oracle_of_outputs, oracle_sequences, steer_logits, steer_logits_fused,
                                    steered_models, steering_plan)

pytestmark = pytest.mark.bitexact


def draft_batch(rows, kv_lens, tokens, device="cpu") -> Batch:
    bs, q = tokens.shape
    mask, parents = chain_mask(bs, q, device)
    kv = torch.tensor(kv_lens)
    return Batch(tokens, kv[:, None] + torch.arange(q)[None, :], torch.tensor(rows), kv,
                 torch.full((bs,), q), mask, parents)


def batch_on(batch: Batch, dev) -> Batch:
    """The batch with every tensor field moved to dev."""
    return dataclasses.replace(batch, **{f.name: getattr(batch, f.name).to(dev) for f in dataclasses.fields(batch)
                                         if torch.is_tensor(getattr(batch, f.name))})


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


def assert_write_kv_writes_the_forwards_kv(models, draft, seed: int, dev, shared_with=None) -> None:
    """`draft.write_kv` writes the K/V `draft.forward` writes, bit for bit, into the head's own
    draft layer only: runs from one random cache (nothing, the forward, write_kv, and write_kv
    given the context `shared_with.context_input` made, as MTP's heads 1.. share one) over 3
    requests at other positions with padded lanes; the sink slot is left out of the exact
    comparison (every padded token's K/V lands there, the last write the device's choice)."""
    cfg = models.config
    g = torch.Generator().manual_seed(seed)
    bs, q = 3, 4
    tokens = torch.randint(0, cfg.vocab_size, (bs, q), generator=g)
    feats = (torch.randn((bs, q, cfg.hidden_size), generator=g, dtype=torch.float64) * 3).to(draft.w["fc"].dtype)

    def run(call):
        cache = models.target.new_cache(max_requests=bs, draft_layers=len(models.mtp))
        rows = [cache.table.alloc_row() for _ in range(bs)]
        for r in rows:
            cache.table.reserve(r, 3 + q)
        cache.table.flush()
        cache.kv.stacked.normal_(generator=torch.Generator(dev).manual_seed(1))
        cache.draft_kv.stacked.normal_(generator=torch.Generator(dev).manual_seed(2))
        batch = draft_batch(rows, [2, 0, 3], tokens)
        batch.q_lens = torch.tensor([q, q - 2, 1])                       # padded lanes write the sink
        batch = batch_on(batch, dev)
        table = cache.table.req_to_token.clone()
        call(cache, batch, feats.to(dev))
        assert torch.equal(cache.table.req_to_token, table)
        return cache.draft_kv.stacked.cpu(), cache.kv.stacked.cpu()

    untouched, target_kv = run(lambda cache, batch, f: None)
    whole, whole_target = run(lambda cache, batch, f: draft.forward(cache, batch, f))
    only, only_target = run(lambda cache, batch, f: draft.write_kv(cache, batch, f))
    kept = torch.arange(whole.shape[1]) != SINK_SLOT
    assert not torch.equal(whole[:, kept], untouched[:, kept]), "the forward must write some K/V"
    assert torch.equal(only[:, kept], whole[:, kept]), "write_kv writes the forward's K/V, bit for bit"
    assert not torch.equal(only[:, SINK_SLOT], untouched[:, SINK_SLOT]), "the padded tokens write the sink"
    assert torch.equal(only_target, target_kv) and torch.equal(whole_target, target_kv)
    if shared_with is not None:
        shared, shared_target = run(lambda cache, batch, f: draft.write_kv(
            cache, batch, f, context=shared_with.context_input(cache, batch, f)))
        assert torch.equal(shared[:, kept], whole[:, kept]), "write_kv from a shared context writes the forward's K/V"
        assert torch.equal(shared_target, target_kv)


@pytest.mark.parametrize("compute_dtype", ["float64", "bfloat16"])
@pytest.mark.parametrize("head", ["draft", "mtp1"])
def test_write_kv_writes_the_forwards_kv_and_nothing_else(compute_dtype, head, seed):
    """`write_kv` (an MTP head's context rows: no attention, MLP or lm_head) writes the K/V the
    whole forward writes, bit for bit (the same kernels on the same shapes), into the head's own
    draft layer only: every other draft layer, the target's K/V and the slot table stay as they
    were. Rows with padding (q_lens < q) write the sink as the forward does; positions differ per
    row. On a GPU the fused rotary kernel writes, on the CPU the torch path (the fused path on the
    CPU: tests/test_fused_layers.py)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    models = build_models("tiny", seed=seed % 1000, compute_dtype=compute_dtype, device=dev)
    draft, other = (models.draft, models.mtp[0]) if head == "draft" else (models.mtp[1], models.mtp[2])
    assert_write_kv_writes_the_forwards_kv(models, draft, seed, dev, shared_with=other)


def one_request_of_three_tokens():
    """(tiny float32 models on the CPU, a cache with a draft layer for every MTP head, a draft batch
    of one request's 3 new tokens at position 0, their features [1, 3, H]): a shared context's
    test case."""
    models = build_models("tiny", seed=3, compute_dtype="float32", device="cpu")
    cache = models.target.new_cache(max_requests=1, draft_layers=len(models.mtp))
    row = cache.table.alloc_row()
    cache.table.reserve(row, 4)
    batch = draft_batch([row], [0], torch.tensor([[1, 2, 3]]))
    return models, cache, batch, torch.ones((1, 3, models.config.hidden_size))


@pytest.mark.parametrize("maker", ["dflash", "rope_theta", "max_context", "head_dim", "another_target"])
def test_write_kv_refuses_a_context_of_another_embedding_or_rotary_table(maker):
    """A shared context is the concat of one embedding and the plan of one rotary table: a head
    given one made by the DFlash head (its embedding has the mask row), by a head of another RoPE
    table (each field of the key: base, length, head size) or by a head on another target's
    embedding of the same shape refuses it, naming the argument."""
    from specverify.models.weights import draft_weights
    models, cache, batch, feats = one_request_of_three_tokens()
    cfg = models.config
    head = type(models.mtp[0])

    def other(**changes):
        c = dataclasses.replace(cfg, **changes)
        w = draft_weights(c, 3) if "head_dim" in changes else models.mtp_weights[0]
        return head(c, w, models.target.w, dtype=torch.float32)

    makers = {"dflash": lambda: models.dflash,
              "rope_theta": lambda: other(rope_theta=cfg.rope_theta * 2),
              "max_context": lambda: other(max_context=cfg.max_context // 2),
              "head_dim": lambda: other(head_dim=cfg.head_dim // 2),
              "another_target": lambda: head(cfg, models.mtp_weights[0],
                                             build_models("tiny", seed=4, compute_dtype="float32", device="cpu").target.w,
                                             dtype=torch.float32)}
    made_by = makers[maker]()
    assert made_by.embed.shape == models.mtp[1].embed.shape or maker == "dflash"
    context = made_by.context_input(cache, batch, feats)
    with pytest.raises(ValueError, match="context: made by a head with another embedding or rotary table"):
        models.mtp[1].write_kv(cache, batch, feats, context=context)


def test_write_kv_refuses_a_context_of_another_batch_shape():
    """A context made for 3 new tokens a request, given with a batch of 2: refused by name (its
    rows would be written at the other batch's slots)."""
    models, cache, three, feats = one_request_of_three_tokens()
    two = draft_batch(three.rows.tolist(), [0], torch.tensor([[1, 2]]))
    context = models.mtp[1].context_input(cache, three, feats)
    with pytest.raises(ValueError, match=r"context: made for \(1, 3\) new tokens \(bs, q\), this batch has \(1, 2\)"):
        models.mtp[2].write_kv(cache, two, feats[:, :2], context=context)


def test_write_kv_given_a_context_makes_no_concat_or_plan(monkeypatch):
    """What a shared context saves: `write_kv(context=...)` runs no embedding concat and no
    attention plan of its own (MTP's heads 1.. make one of each between them), and a default
    `write_kv` makes one of each."""
    from specverify.models import draft as draft_module
    from specverify.models import layers as layers_module
    models, cache, batch, feats = one_request_of_three_tokens()
    context = models.mtp[1].context_input(cache, batch, feats)
    calls = []
    for module, name in ((draft_module, "embed_concat_impl"), (layers_module, "plan_attention")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    for head in models.mtp[1:]:
        head.write_kv(cache, batch, feats, context=context)
    assert calls == [], f"write_kv given a context made its own: {calls}"
    models.mtp[1].write_kv(cache, batch, feats)
    assert sorted(calls) == ["embed_concat_impl", "plan_attention"]


def steered_logits(agreement, logits_dtype, n=512, seed=0):
    """n one-token requests (request i = row i at position 0) through a SteeredDraft whose oracle
    puts row i on the path (oracle[i, 0] == its token) except the first 8 rows (next token
    unknown) and the next 8 (oracle[i, 0] is another token)."""
    models = build_models("tiny", seed=seed, logits_dtype=logits_dtype, device="cpu")
    cfg = models.config
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (n, 1), generator=g)
    feats = torch.randn((n, 1, cfg.hidden_size), generator=g)
    target = torch.randint(0, cfg.vocab_size, (n,), generator=g)
    oracle = torch.full((n, cfg.max_context + 1), -1, dtype=torch.int64)
    oracle[:, 0] = tokens[:, 0]
    oracle[8:16, 0] = (tokens[8:16, 0] + 1) % cfg.vocab_size           # off the path: left alone
    oracle[8:, 1] = target[8:]                                          # rows 0..7: next unknown
    draft = SteeredDraft(models.draft, oracle, agreement, seed)
    cache = models.target.new_cache(max_requests=n)
    rows = [cache.table.alloc_row() for _ in range(n)]
    for r in rows:
        cache.table.reserve(r, 1)
    batch = draft_batch(rows, [0] * n, tokens)
    batch.req_ids = torch.arange(n)
    out = draft.forward(cache, batch, feats)
    plain = models.draft.forward(cache, batch, feats)
    known = torch.zeros(n, dtype=torch.bool)
    known[16:] = True
    return out.logits[:, 0].float(), plain.logits[:, 0].float(), target, known


@pytest.mark.parametrize("logits_dtype", ["float32", "bfloat16", "float8_e4m3fn", "float8_e5m2fnuz"])
def test_always_right_draft_makes_target_token_the_unique_top(logits_dtype):
    logits, plain, target, known = steered_logits(1.0, logits_dtype)
    top = logits.max(-1)
    assert torch.equal(top.indices[known], target[known])
    assert ((logits == top.values[:, None]).sum(-1)[known] == 1).all(), "steered token must not tie"
    assert torch.equal(logits[~known], plain[~known]), "rows off the oracle path must be unchanged"


@pytest.mark.parametrize("logits_dtype", ["float32", "float8_e5m2"])
def test_always_wrong_draft_never_proposes_target_token(logits_dtype):
    logits, plain, target, known = steered_logits(0.0, logits_dtype)
    top8 = logits.topk(8, dim=-1).indices
    assert not (top8[known] == target[known][:, None]).any()
    assert torch.equal(logits[~known], plain[~known])


def test_partial_agreement_rate_follows_knob():
    logits, _, target, known = steered_logits(0.3, "float32", n=2000)
    rate = (logits.argmax(-1)[known] == target[known]).float().mean().item()
    assert abs(rate - 0.3) < 0.05


def test_agreement_draw_is_deterministic_and_uniform():
    keys = torch.arange(20000)
    a, b = agreement_draw(5, keys), agreement_draw(5, keys)
    assert torch.equal(a, b)
    assert not torch.equal(a, agreement_draw(6, keys))
    assert 0.0 <= a.min() and a.max() < 1.0
    hist = torch.histc(a.float(), bins=10, min=0, max=1)
    assert (hist - 2000).abs().max() < 200


def steer_by_the_rule(logits, req_ids, positions, tokens, oracle, agreement, seed):
    """The rule of tests/support/steering.py, row by row in plain Python."""
    ctx = oracle.shape[1] - 1
    out = logits.clone()
    for b in range(logits.shape[0]):
        for j in range(logits.shape[1]):
            r, p, tau = int(req_ids[b]), int(positions[b, j]), int(tokens[b, j])
            if not 0 <= p < ctx or int(oracle[r, p]) != tau or int(oracle[r, p + 1]) < 0:
                continue
            u = agreement_draw(seed, torch.tensor(r * (ctx + 1) + p + 1)).item()
            nxt = int(oracle[r, p + 1])
            out[b, j, nxt] = logits[b, j].max() + PEAK_MARGIN if u < agreement else float("-inf")
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("agreement", [0.0, 0.4, 1.0])
def test_steer_logits_follows_the_rule(dtype, agreement, seed):
    """Tensor implementation == the row-by-row rule, on every compute dtype, including rows off the
    path, rows whose next token is unknown and positions at the max_context boundary."""
    g = torch.Generator().manual_seed(seed)
    bs, q, v, ctx, reqs = 6, 5, 11, 12, 4
    oracle = torch.randint(0, v, (reqs, ctx + 1), generator=g)
    oracle[:, -1] = -1
    oracle[1, 7:] = -1                                                  # request 1 known up to 6
    req_ids = torch.randint(0, reqs, (bs,), generator=g)
    positions = torch.randint(0, ctx + 1, (bs, q), generator=g)
    positions[0, :] = torch.tensor([ctx - 1, ctx, 0, 6, 7])
    req_ids[0] = 1
    tokens = oracle[req_ids[:, None], positions]                        # on the path ...
    flip = torch.rand((bs, q), generator=g) < 0.3
    tokens = torch.where(flip, (tokens + 1) % v, tokens).clamp(min=0)   # ... except some
    logits = torch.randn((bs, q, v), generator=g).to(dtype)
    got = steer_logits(logits, req_ids, positions, tokens, oracle, agreement, seed % 1000)
    want = steer_by_the_rule(logits, req_ids, positions, tokens, oracle, agreement, seed % 1000)
    assert got.dtype == dtype
    assert torch.equal(got, want)
    assert not torch.equal(got, logits), "the sample must steer some row"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [11, STEER_BLOCK + 904])
@pytest.mark.parametrize("per_row_ids", [False, True])
def test_fused_steering_equals_the_tensor_rule(dtype, vocab, per_row_ids, seed):
    """The one-kernel steering (what a steered draft runs on a GPU; interpreted here) == `steer_logits`
    bit for bit, on a copy and in place: rows on and off the path, DFlash block rows (input token V),
    positions at both ends of the context, a NaN row, an all -inf row, a row whose maximum is tied,
    ids per lane or per row, a vocabulary past one kernel block, and inputs with strides of their
    own. The copy leaves its input alone; in place needs contiguous logits."""
    g = torch.Generator().manual_seed(seed)
    bs, q, ctx, reqs = 5, 4, 12, 3
    oracle = torch.randint(0, vocab, (reqs, ctx + 1), generator=g)
    oracle[:, -1] = -1
    oracle[2, 6:] = -1
    req_ids = torch.randint(0, reqs, (bs, q) if per_row_ids else (bs,), generator=g)
    positions = torch.randint(0, ctx + 1, (bs, q), generator=g)
    positions[0] = torch.tensor([ctx - 1, ctx, 0, 5])
    lane_ids = req_ids if per_row_ids else req_ids[:, None].expand(bs, q)
    tokens = oracle[lane_ids, positions].clamp(min=0)
    tokens[1, :2] = vocab                                              # DFlash block rows
    tokens[2, 0] = (tokens[2, 0] + 1) % vocab                          # off the path
    logits = (torch.randn((bs, q, vocab), generator=g) * 4).to(dtype)
    logits[3, 0, 5] = float("nan")
    logits[3, 1] = float("-inf")
    logits[3, 2, :2] = logits[3, 2].max() + 1                          # a tied maximum
    dev = "cuda" if torch.cuda.is_available() else "cpu"              # the kernel compiled, or interpreted
    oracle, req_ids, positions, tokens, logits = (t.to(dev) for t in (oracle, req_ids, positions, tokens, logits))
    # Each input through its own strides: tokens column-major, logits rows of a wider buffer.
    tokens = tokens.t().contiguous().t()
    logits = torch.cat([logits, torch.full_like(logits[..., :3], 7.0)], -1)[..., :vocab]
    assert tokens.stride() != positions.stride() and logits.stride(1) == vocab + 3
    before = logits.clone()
    for agreement in (0.0, 0.6, 1.0):
        plan = steering_plan(oracle, agreement, seed % 1000)
        want = steer_logits(logits, req_ids, positions, tokens, oracle, agreement, seed % 1000, plan=plan)
        got = steer_logits_fused(logits, req_ids, positions, tokens, oracle, plan)
        assert got.dtype == dtype and got.shape == logits.shape
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(logits, before, rtol=0, atol=0, equal_nan=True)    # the copy's input is kept
        if agreement > 0:
            assert not torch.equal(got.nan_to_num(), logits.nan_to_num()), "the sample must steer some row"
        mine = logits.contiguous()
        assert mine.data_ptr() != logits.data_ptr()
        copied = steer_logits_fused(mine, req_ids, positions, tokens, oracle, plan)      # contiguous: still a copy
        assert copied.data_ptr() != mine.data_ptr()
        torch.testing.assert_close(mine, before, rtol=0, atol=0, equal_nan=True)
        inplace = steer_logits_fused(mine, req_ids, positions, tokens, oracle, plan, in_place=True)
        assert inplace.data_ptr() == mine.data_ptr()
        torch.testing.assert_close(mine, want, rtol=0, atol=0, equal_nan=True)
    with pytest.raises(ValueError, match=r"in_place=True\) needs contiguous logits"):
        steer_logits_fused(logits, req_ids, positions, tokens, oracle, plan, in_place=True)
    flat = steer_logits_fused(logits[0], req_ids[0] if per_row_ids else req_ids[:1].expand(q), positions[0],
                              tokens[0], oracle, plan)                 # [n] positions: one row per token
    torch.testing.assert_close(flat, steer_logits(logits[0], req_ids[0] if per_row_ids else req_ids[:1].expand(q),
                                                  positions[0], tokens[0], oracle, 1.0, seed % 1000, plan=plan),
                               rtol=0, atol=0, equal_nan=True)


def test_fused_steering_sees_the_last_column_and_a_nan_in_any_block(seed):
    """A vocabulary one past a kernel block, every row on the path and agreeing: the row whose
    maximum sits in the last column (the max pass's last, one-entry block), a row with a NaN in its
    first block and one with a NaN in its last (the peak is NaN either way), and logits that are dense but not contiguous (the copy must be
    contiguous). The fused steering equals the tensor rule bit for bit, on a copy and in place."""
    g = torch.Generator().manual_seed(seed)
    vocab, bs, q, ctx = STEER_BLOCK + 1, 2, 3, 9
    oracle = torch.randint(0, vocab, (bs, ctx + 1), generator=g)
    oracle[:, -1] = -1
    positions = torch.randint(0, ctx - 1, (bs, q), generator=g)
    req_ids = torch.arange(bs)
    tokens = oracle[req_ids[:, None], positions]
    logits = torch.randn((q, bs, vocab), generator=g).transpose(0, 1)   # [bs, q, V], dense, not contiguous
    logits[0, 0, vocab - 1] = 50.0                                     # the maximum in the last column
    logits[0, 1, 5] = float("nan")                                     # a NaN in the first block
    logits[1, 2, vocab - 1] = float("nan")                             # and one in the last
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    oracle, req_ids, positions, tokens, logits = (t.to(dev) for t in (oracle, req_ids, positions, tokens, logits))
    assert not logits.is_contiguous()
    plan = steering_plan(oracle, 1.0, seed % 1000)
    want = steer_logits(logits, req_ids, positions, tokens, oracle, 1.0, seed % 1000, plan=plan)
    steered = want.flatten(0, 1)
    assert steered[0].max() == 58.0 and steered[1].isnan().sum() == 2 and steered[5].isnan().sum() == 2, \
        "the cases must be on the path"
    got = steer_logits_fused(logits, req_ids, positions, tokens, oracle, plan)
    assert got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    mine = logits.contiguous()
    steer_logits_fused(mine, req_ids, positions, tokens, oracle, plan, in_place=True)
    torch.testing.assert_close(mine, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("vocab", [2 * STEER_BLOCK, 2 * STEER_BLOCK + 1])
def test_fused_steering_merges_many_blocks_of_negative_logits(vocab, seed):
    """A vocabulary of whole blocks and one of three blocks (the merge's block span padded to 4),
    log-probability-like logits (all negative, so a padded part read as 0 would win), the row
    maximum in the last column, at the end of a full block, and a NaN in the last block: the fused
    steering equals the tensor rule bit for bit."""
    g = torch.Generator().manual_seed(seed)
    bs, q, ctx = 2, 3, 9
    oracle = torch.randint(0, vocab, (bs, ctx + 1), generator=g)
    oracle[:, -1] = -1
    positions = torch.randint(0, ctx - 1, (bs, q), generator=g)
    req_ids = torch.arange(bs)
    tokens = oracle[req_ids[:, None], positions]
    logits = torch.randn((bs, q, vocab), generator=g) - 100.0
    logits[0, 0, vocab - 1] = -50.0                                    # the maximum in the last column
    logits[1, 0, 2 * STEER_BLOCK - 1] = -40.0                          # at the end of the second block
    logits[1, 2, vocab - 1] = float("nan")                             # a NaN in the last block
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    oracle, req_ids, positions, tokens, logits = (t.to(dev) for t in (oracle, req_ids, positions, tokens, logits))
    plan = steering_plan(oracle, 1.0, seed % 1000)
    want = steer_logits(logits, req_ids, positions, tokens, oracle, 1.0, seed % 1000, plan=plan)
    assert want.flatten(0, 1)[5].isnan().sum() == 2 and want[0, 0].max() == -42.0, "the cases must be on the path"
    got = steer_logits_fused(logits, req_ids, positions, tokens, oracle, plan)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("per_row_ids", [False, True])
def test_fused_steering_of_one_lane_per_request_is_the_rule_on_those_lanes(per_row_ids, seed):
    """`lanes` (a draft head's forward `at`: logits [bs, 1, V] of lane lanes[b] of [bs, q] rows):
    the kernel's rows equal the tensor rule on positions / tokens gathered at the lanes, bit for
    bit, with lanes at both ends and in the middle, one lane off the path and one a DFlash block
    row. A kernel that took lane b % q, lane 0 or the first request's lane would steer another
    token into some row."""
    g = torch.Generator().manual_seed(seed)
    vocab, bs, q, ctx, reqs = 37, 6, 4, 30, 3
    oracle = torch.randint(0, vocab, (reqs, ctx + 1), generator=g)
    oracle[:, -1] = -1
    req_ids = torch.randint(0, reqs, (bs, q) if per_row_ids else (bs,), generator=g)
    lane_ids = req_ids if per_row_ids else req_ids[:, None].expand(bs, q)
    positions = 1 + torch.randperm(ctx - 2, generator=g)[:bs * q].view(bs, q)   # distinct, each next token known
    tokens = oracle[lane_ids, positions]
    lanes = torch.tensor([3, 0, 2, 1, 3, 2])
    tokens[4, 3] = (tokens[4, 3] + 1) % vocab                              # request 4's lane: off the path
    tokens[5, 2] = vocab                                                   # request 5's lane: a DFlash block row
    logits = (torch.randn((bs, 1, vocab), generator=g) * 3).float()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    oracle, req_ids, positions, tokens, logits, lanes = (t.to(dev) for t in (oracle, req_ids, positions, tokens,
                                                                             logits, lanes))
    at = lanes[:, None]
    rows_ids = req_ids.gather(1, at) if per_row_ids else req_ids
    plan = steering_plan(oracle, 1.0, seed % 1000)
    want = steer_logits(logits, rows_ids, positions.gather(1, at), tokens.gather(1, at), oracle, 1.0, seed % 1000,
                        plan=plan)
    got = steer_logits_fused(logits, req_ids, positions, tokens, oracle, plan, lanes=lanes)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    steered = (want != logits).any(-1)[:, 0]
    assert steered[:4].all() and not steered[4] and steered[5], "lanes 0-3 and the block row steer, lane 4 not"
    mine = logits.clone()
    steer_logits_fused(mine, req_ids, positions, tokens, oracle, plan, in_place=True, lanes=lanes)
    torch.testing.assert_close(mine, want, rtol=0, atol=0)
    strided = torch.stack([lanes, lanes.flip(0)], 1)[:, 0]                 # the lanes through a stride of 2
    assert strided.stride(0) == 2
    torch.testing.assert_close(steer_logits_fused(logits, req_ids, positions, tokens, oracle, plan, lanes=strided),
                               want, rtol=0, atol=0)
    for bad in (lanes.int(), lanes[:5], lanes[:, None]):
        with pytest.raises(ValueError, match=r"lanes must be int64 \[6\] with logits \[6, 1, V\]"):
            steer_logits_fused(logits, req_ids, positions, tokens, oracle, plan, lanes=bad)
    with pytest.raises(ValueError, match=r"lanes must be int64 \[6\] with logits \[6, 1, V\]"):
        steer_logits_fused(logits.expand(-1, 2, -1), req_ids, positions, tokens, oracle, plan, lanes=lanes)


@pytest.mark.parametrize("logits_dtype", ["float32", "float8_e4m3fn"])
def test_forward_at_one_lane_per_request_returns_that_lanes_rows(logits_dtype, seed):
    """`forward(..., at=lanes)` (what a draft-extend runs: only its root's row is read) returns
    the rows of lane at[b] of the whole forward: logits, their scale and the hidden state, within
    the tolerance table (the lm_head's matmul has another shape), and writes every live lane's
    K/V, bit for bit as the whole forward. Steered, the rows are the steered whole forward's, by the
    tensor rule and by the kernel (interpreted on the CPU, compiled on a GPU)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    models = build_models("tiny", seed=seed % 1000, compute_dtype="float64", logits_dtype=logits_dtype, device=dev)
    cfg = models.config
    g = torch.Generator().manual_seed(seed)
    bs, q = 3, 4
    tokens = torch.randint(0, cfg.vocab_size, (bs, q), generator=g)
    feats = torch.randn((bs, q, cfg.hidden_size), generator=g, dtype=torch.float64)
    at = torch.tensor([q - 1, 0, 2])

    def run(draft, lanes):
        cache = models.target.new_cache(max_requests=bs)
        rows = [cache.table.alloc_row() for _ in range(bs)]
        for r in rows:
            cache.table.reserve(r, 2 + q)
        cache.table.flush()
        batch = draft_batch(rows, [2, 1, 2], tokens)
        batch.req_ids = torch.arange(bs)
        batch = batch_on(batch, dev)
        out = draft.forward(cache, batch, feats.to(dev), at=None if lanes is None else lanes.to(dev))
        return dataclasses.replace(out, **{f.name: getattr(out, f.name).cpu() for f in dataclasses.fields(out)
                                           if torch.is_tensor(getattr(out, f.name))}), cache.draft_kv.stacked.cpu()

    whole, kv_whole = run(models.draft, None)
    one, kv_one = run(models.draft, at)
    assert one.logits.shape == (bs, 1, cfg.vocab_size) and one.hidden.shape == (bs, 1, cfg.hidden_size)
    assert torch.equal(kv_one, kv_whole) and kv_one.count_nonzero() > 0, "every lane's K/V is written"
    ar = torch.arange(bs)
    assert_close(one.hidden[:, 0], whole.hidden[ar, at], "float64", "hidden at the lanes")
    assert_close(one.logits[:, 0].double() * one.scale[:, 0].double(),
                 whole.logits[ar, at].double() * whole.scale[ar, at].double(), ("float64", logits_dtype),
                 "dequantized logits at the lanes")
    oracle = torch.full((bs, cfg.max_context + 1), -1, dtype=torch.int64)
    for b in range(bs):
        oracle[b, 2 - (b == 1):2 - (b == 1) + q] = tokens[b]
        oracle[b, 2 - (b == 1) + q] = (tokens[b, -1] + 5) % cfg.vocab_size
    # The tensor rule (the CPU's) and the kernel (a GPU's, interpreted here), each against the
    # tensor rule's whole forward.
    s_whole = run(SteeredDraft(models.draft, oracle, 1.0, seed, fused=False), None)[0]
    want = s_whole.logits[ar, at].double() * s_whole.scale[ar, at].double()
    for fused in (False, True):
        s_one = run(SteeredDraft(models.draft, oracle, 1.0, seed, fused=fused), at)[0]
        assert_close(s_one.logits[:, 0].double() * s_one.scale[:, 0].double(), want, ("float64", logits_dtype),
                     f"steered logits at the lanes (fused={fused})")
        assert torch.equal(s_one.logits[:, 0].float().argmax(-1), oracle[ar, at + torch.tensor([3, 2, 3])]), \
            f"each lane proposes the oracle's next token (fused={fused})"
    for bad in (at.int(), at[:2], at[:, None]):
        with pytest.raises(ValueError, match=r"at must be an int64 \[3\] tensor"):
            run(models.draft, bad)


def test_a_run_that_left_its_oracle_is_steered_by_its_own_tokens():
    """The benchmarks' remedy for a pre-run whose greedy tokens a run does not reproduce (a target
    that rounds with its row count; bench_device_cycle.run_on_path). Here the pre-run is made to
    leave at each request's second new token: a run steered by it leaves it there and its drafts go
    unsteered. Steered by the run's own tokens (`oracle_of_outputs`) the same run stays on its
    oracle and accepts as a run steered by the true pre-run does, cycle for cycle."""
    import specverify
    models = cached_models()
    cfg, spec, new = models.config, specverify.SpecConfig(num_steps=3, topk=1), 12
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist() for n in (5, 9, 3)]
    true = oracle_sequences(models, prompts, lookahead(models, prompts, new, spec))
    drifted = true.clone()
    for r, p in enumerate(prompts):             # from the second new token on, another continuation
        tail = true[r, len(p) + 1:]
        drifted[r, len(p) + 1:] = torch.where(tail >= 0, (tail + 1) % cfg.vocab_size, tail)

    def run(oracle):
        steered = steered_models(models, prompts, new, agreement=0.7, spec=spec, oracle=oracle)
        out = specverify.generate(steered, prompts, max_new_tokens=new, spec=spec)
        return out.tokens, out.accept_lengths

    tokens, lost = run(drifted)
    want_tokens, want_accept = run(true)
    assert tokens == want_tokens, "steering moves no token (lossless)"
    assert follows_oracle(true, prompts, tokens) and not follows_oracle(drifted, prompts, tokens)
    assert sum(map(sum, want_accept)) / sum(map(len, want_accept)) > 1.5 > \
        sum(map(sum, lost)) / sum(map(len, lost)), "the drifted oracle leaves its drafts unsteered"
    own = oracle_of_outputs(drifted, prompts, tokens)
    for r, (p, t) in enumerate(zip(prompts, tokens)):
        assert own[r, :len(p) + len(t)].tolist() == list(p) + list(t), f"row {r}: prompt + output"
        assert (own[r, len(p) + len(t):] == -1).all(), f"row {r}: -1 past the output"
    assert torch.equal(own, oracle_of_outputs(true, prompts, tokens)), "whatever the rows held before"
    again, accept = run(own)
    assert again == tokens and follows_oracle(own, prompts, again)
    assert accept == want_accept, "steered by its own tokens the run accepts as under the true pre-run"
    # Only the rows of the outputs change.
    assert torch.equal(oracle_of_outputs(true, prompts, tokens[:1])[1:], true[1:])
    with pytest.raises(ValueError, match=r"outputs: 4 of them, for an oracle of 3 rows"):
        oracle_of_outputs(true, prompts + [[1]], tokens + [[2]])
    with pytest.raises(ValueError, match=r"outputs\[0\]: prompt \+ output is .* tokens, the oracle holds at most"):
        oracle_of_outputs(true, prompts, [[0] * cfg.max_context] + tokens[1:])


def test_steering_rejects_bad_arguments():
    models = cached_models()
    oracle = torch.full((1, models.config.max_context + 1), -1, dtype=torch.int64)
    for bad in (1.5, -0.1, float("nan"), True, "0.5", None):
        with pytest.raises(ValueError, match=r"agreement must be a number in \[0, 1\]"):
            SteeredDraft(models.draft, oracle, bad, 0)
    with pytest.raises(ValueError, match="oracle must be an int64"):
        SteeredDraft(models.draft, oracle.float(), 0.5, 0)
    draft = SteeredDraft(models.draft, oracle, 0.5, 0)
    cache = models.target.new_cache(max_requests=1)
    row = cache.table.alloc_row()
    cache.table.reserve(row, 1)
    batch = draft_batch([row], [0], torch.tensor([[3]]))                  # no req_ids
    with pytest.raises(ValueError, match="SteeredDraft needs Batch.req_ids"):
        draft.forward(cache, batch, torch.zeros((1, 1, models.config.hidden_size)))


def test_forward_is_compute_then_deliver(seed):
    models = build_models("tiny", seed=seed % 1000, logits_dtype="float8_e4m3fn", device="cpu")
    cfg = models.config
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (2, 3), generator=g)
    feats = torch.randn((2, 3, cfg.hidden_size), generator=g)
    cache = models.target.new_cache(max_requests=2)
    rows = [cache.table.alloc_row() for _ in range(2)]
    for r in rows:
        cache.table.reserve(r, 3)
    out = models.draft.forward(cache, draft_batch(rows, [0, 0], tokens), feats)
    logits, hidden = models.draft.compute_logits(cache, draft_batch(rows, [0, 0], tokens), feats)
    again = models.draft.deliver(logits, hidden)
    assert logits.dtype == models.target.dtype and out.logits.dtype == torch.float8_e4m3fn
    assert torch.equal(out.logits.view(torch.uint8), again.logits.view(torch.uint8))
    assert torch.equal(out.scale, again.scale) and torch.equal(out.hidden, again.hidden)


class RecordingDraft:
    """Wraps a draft model and records each call's request ids, slot-table rows and live rows."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def forward(self, cache, batch, features, *, at=None):
        self.calls.append((batch.req_ids.clone(), batch.rows.clone(), batch.q_lens.clone()))
        return self.inner.forward(cache, batch, features, at=at)


@pytest.mark.parametrize("static", [False, True], ids=["live-shapes", "padded-buckets"])
def test_engine_passes_request_ids_in_every_draft_call(static):
    from specverify.engine.requests import new_requests
    from specverify.engine.sampling import SamplingParams
    from specverify.engine.speculative import SpecConfig, SpecDecoder

    plain = cached_models(compute_dtype="float64")
    recorder = RecordingDraft(plain.draft)
    models = dataclasses.replace(plain, draft=recorder)
    spec = SpecConfig(num_steps=3, topk=2, num_draft_tokens=5)
    reqs = new_requests([[5, 6, 7], [1], [9, 9], [4, 3, 2, 1], [8]], [3, 9, 6, 7, 2])
    dec = SpecDecoder(models, spec, SamplingParams(), seed=0, eos_token_id=None, pad_batches=static)
    dec.start(reqs)
    while dec.running():
        dec.step()
    index_of_row = {r.row: r.index for r in reqs}
    assert len(recorder.calls) >= 2 * spec.num_steps
    for req_ids, rows, _ in recorder.calls:
        assert req_ids is not None and req_ids.dtype == torch.int64 and req_ids.shape == rows.shape
        want = [index_of_row.get(row, 0) for row in rows.tolist()]          # pad rows: request 0
        assert req_ids.tolist() == want
        assert any(row == dec.pad_row for row in rows.tolist()) <= static


def test_engine_holds_no_steering_code():
    """Issue 7 item 2.3: no oracle, agreement knob or steering inside specverify/ (identifiers)."""
    import ast
    import pathlib

    import specverify

    root = pathlib.Path(specverify.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [getattr(node, a) for a in ("id", "attr", "arg", "name") if isinstance(getattr(node, a, None), str)]
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 40:
                names.append(node.value)
            found += [f"{path.relative_to(root.parent)}:{node.lineno} {n}" for n in names
                      if any(w in n.lower() for w in ("oracle", "agreement", "steer"))]
    assert found == []


def test_build_models_rejects_unknown_dtypes():
    with pytest.raises(ValueError, match="logits_dtype must be one of"):
        build_models("tiny", logits_dtype="float8_e8m0", device="cpu")
    with pytest.raises(ValueError, match="compute_dtype must be one of"):
        build_models("tiny", compute_dtype="int8", device="cpu")
    with pytest.raises(ValueError, match=r"preset 'huge' is unknown|preset must be one of .*'huge'"):
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


def test_own_tokens_oracle_helpers_at_their_edges():
    """`oracle_of_outputs` / `follows_oracle` on a small hand-made oracle: a new tensor (the pre-run's
    oracle, shared by the benchmark's other runs, is left as it was), the last column never written
    (a prompt + output of exactly the row's width is refused, one shorter fits), more outputs than
    prompts refused, and a run is on its oracle only when every row's every token is."""
    oracle = torch.arange(4 * 8, dtype=torch.int64).reshape(4, 8) % 7
    before = oracle.clone()
    prompts, outputs = [[1, 2], [3], [4, 5, 6]], [[9, 9, 9], [8, 8], [7]]
    own = oracle_of_outputs(oracle, prompts, outputs)
    assert torch.equal(oracle, before) and own.data_ptr() != oracle.data_ptr(), "a new tensor; the input untouched"
    assert own[0].tolist() == [1, 2, 9, 9, 9, -1, -1, -1] and torch.equal(own[3], oracle[3])
    assert follows_oracle(own, prompts, outputs)
    for r in range(3):                   # one row off at its last token, the others on: not on the oracle
        off = [list(t) for t in outputs]
        off[r][-1] += 1
        assert not follows_oracle(own, prompts, off), f"row {r}'s last token"
    fits = oracle_of_outputs(oracle, [[1] * 3], [[2] * 4])           # 7 tokens: the last column stays -1
    assert fits[0, 7] == -1
    with pytest.raises(ValueError, match=r"outputs\[0\]: prompt \+ output is 8 tokens, the oracle holds at most 7"):
        oracle_of_outputs(oracle, [[1] * 3], [[2] * 5])
    with pytest.raises(ValueError, match=r"outputs: 3 of them, for an oracle of 4 rows and 2 prompts"):
        oracle_of_outputs(oracle, prompts[:2], outputs)
