"""The reference's MTP (docs/semantics.md 6.10) and DFlash (6.11) drafts, on their own (no
specverify decoder involved): `reference.eagle.generate(algorithm="mtp" | "dflash")`.

- losslessness and the acceptance knob: a draft steered always right (the steering rule of
  tests/support/steering.py, with 6.11's mask-token rule) accepts S drafts per greedy cycle and
  emits exactly `reference.generate`'s target-only greedy tokens; steered always wrong, every cycle
  emits only the bonus, and the tokens are still target-only's;
- the DFlash block is bidirectional: each block row's logits are those of the head run over all
  context rows and all block rows, not a causal prefix of them, and moving the last block row
  changes the first row's logits;
- MTP head i runs with `models.mtp_weights[i]`, over head i's context rows and its own step row only;
- the hook sees what 6.11 says (the mask id, the row's position), the DFlash greedy verify's block
  op is live, and bad arguments are refused.

The reference is slow (float64, cache-free): budgets are short, two or three prompts.
"""

from __future__ import annotations

import pytest
import torch

import reference
from reference import eagle
from tests.support.cases import cached_models
from tests.support.steering import steer_logits

pytestmark = pytest.mark.bitexact

PROMPTS = [[17, 250, 3, 99, 41], [7, 8, 300, 12], [200, 5]]
BUDGETS = [8, 7, 6]
SEED = 11


def oracle_of(models, prompts, budgets, steps) -> torch.Tensor:
    """[R, max_context + 1]: prompt + the reference's target-only greedy continuation (long enough
    for every draft of the run), -1 beyond: the steering oracle."""
    ctx = models.config.max_context
    more = [b + steps + 2 for b in budgets]
    cont = reference.generate(models, prompts, max_new_tokens=more).tokens
    oracle = torch.full((len(prompts), ctx + 1), -1, dtype=torch.int64)
    for r, (p, c) in enumerate(zip(prompts, cont)):
        oracle[r, :len(p) + len(c)] = torch.tensor(list(p) + c)
    return oracle


def steering_hook(models, oracle, agreement: float, seed: int = SEED):
    """The steering rule on reference rows, with 6.11's mask-token rule: a row whose input is the
    mask id V at position p is steered as if its input were the oracle's token at p - 1 at position
    p - 1 (it proposes the oracle's token at p, with the agreement drawn for p)."""
    mask = models.config.vocab_size

    def hook(r, positions, tokens, logits):
        if int(tokens[0]) == mask:
            positions = positions - 1
            tokens = oracle[r, positions]
        return steer_logits(logits, torch.tensor([r]), positions, tokens, oracle, agreement, seed)
    return hook


def run(models, algorithm, *, steps=3, agreement=None, prompts=PROMPTS, budgets=BUDGETS, hook=None, **kw):
    if agreement is not None:
        hook = steering_hook(models, oracle_of(models, prompts, budgets, steps), agreement)
    return reference.eagle.generate(models, prompts, spec_num_steps=steps, max_new_tokens=budgets,
                                    algorithm=algorithm, draft_logits_hook=hook, **kw)


@pytest.mark.parametrize("hybrid", [False, True], ids=["dense", "hybrid"])
@pytest.mark.parametrize("algorithm", ["mtp", "dflash"])
def test_always_right_draft_is_accepted_and_lossless(algorithm, hybrid):
    models = cached_models(compute_dtype="float64", hybrid=hybrid)
    S = 3
    out = run(models, algorithm, steps=S, agreement=1.0)
    assert out.tokens == reference.generate(models, PROMPTS, max_new_tokens=BUDGETS).tokens
    assert sum(len(tr.cycles) - 1 for tr in out.traces) >= len(PROMPTS)   # cycles the budget did not cut
    for r, tr in enumerate(out.traces):
        assert tr.near_ties == [], tr.near_ties
        assert len(tr.cycles) >= 1
        for i, cy in enumerate(tr.cycles):
            assert cy.tree_parents == [-1, 0, 1, 2] and len(cy.tree_tokens) == S + 1
            if i < len(tr.cycles) - 1:                  # the last cycle may be cut by the budget
                assert cy.accepted == [0, 1, 2, 3], (r, i, cy)
                assert cy.emitted == cy.tree_tokens[1:] + [cy.emitted[-1]]
            assert cy.margins["draft_topk"] > 0.0


@pytest.mark.parametrize("algorithm", ["mtp", "dflash"])
def test_always_wrong_draft_emits_only_the_bonus(algorithm):
    models = cached_models(compute_dtype="float64")
    out = run(models, algorithm, steps=2, agreement=0.0)
    assert out.tokens == reference.generate(models, PROMPTS, max_new_tokens=BUDGETS).tokens
    for tr in out.traces:
        assert len(tr.cycles) == len(tr.tokens) - 1
        for cy in tr.cycles:
            assert cy.accepted == [0, -1, -1] and len(cy.emitted) == 1


@pytest.mark.parametrize("algorithm", ["mtp", "dflash"])
def test_sampled_block_drafts_accept_and_reject(algorithm):
    """Sampling at a low temperature with a partly right draft: the chain walk of 6.4 both accepts
    drafts and draws bonuses after rejections; every cycle emits accepted drafts + one token."""
    models = cached_models(compute_dtype="float64")
    out = run(models, algorithm, steps=3, agreement=0.7, temperature=0.3, top_k=20, seed=5)
    depths = [sum(j >= 0 for j in cy.accepted) - 1 for tr in out.traces for cy in tr.cycles]
    assert max(depths) >= 1 and min(depths) == 0, depths
    for tr in out.traces:
        assert tr.tokens == tr.tokens[:1] + [t for cy in tr.cycles for t in cy.emitted]


# -- DFlash: the block is one bidirectional forward -------------------------------------------------

def recorder():
    calls = []

    def hook(r, positions, tokens, logits):
        calls.append((r, int(positions[0]), int(tokens[0]), logits[0].clone()))
        return logits
    return calls, hook


def context(models, seq):
    """The draft-extend rows of seq (root = seq[-1] at n): tokens, features [n, H], positions."""
    _, hidden = reference.forward(models.config, models.target_weights, seq)
    n = len(seq) - 1
    return list(seq[1:]), hidden[:n], list(range(1, n + 1))


def first_cycle_seq(models, prompt):
    first = reference.generate(models, [prompt], max_new_tokens=1).tokens[0]
    return list(prompt) + first


def test_dflash_block_rows_are_bidirectional():
    models = cached_models(compute_dtype="float64")
    cfg, tw, dw = models.config, models.target_weights, models.dflash_weights
    prompt, B = PROMPTS[0], 4
    calls, hook = recorder()
    run(models, "dflash", steps=B - 1, prompts=[prompt], budgets=[2], hook=hook)
    seq = first_cycle_seq(models, prompt)
    n, V = len(seq) - 1, cfg.vocab_size
    assert [(p, t) for _, p, t, _ in calls[:B - 1]] == [(n + i, V) for i in range(1, B)]

    tokens, feats, positions = context(models, seq)
    _, g = reference.eagle.draft_row(cfg, tw, dw, tokens, feats, positions)
    all_tokens = tokens + [V] * (B - 1)
    all_feats = torch.cat([feats, g[None].expand(B - 1, -1)])
    all_pos = positions + [n + i for i in range(1, B)]
    for i in range(1, B):
        got = calls[i - 1][3]
        both_ways, _ = reference.eagle.draft_row(cfg, tw, dw, all_tokens, all_feats, all_pos, query=n - 1 + i)
        causal, _ = reference.eagle.draft_row(cfg, tw, dw, all_tokens[:n + i], all_feats[:n + i], all_pos[:n + i])
        assert torch.equal(got, both_ways), f"block row {i}"
        if i < B - 1:
            assert not torch.allclose(got, causal, rtol=0, atol=1e-9), f"block row {i}: a causal block gives the same"
        else:
            assert torch.equal(causal, got)       # the last row sees everything either way
    # The first block row reads the last one: move the last row (its position, its feature) and
    # the first row's logits move.
    moved_pos = all_pos[:-1] + [all_pos[-1] + 5]
    moved, _ = reference.eagle.draft_row(cfg, tw, dw, all_tokens, all_feats, moved_pos, query=n)
    assert not torch.allclose(moved, calls[0][3], rtol=0, atol=1e-9)
    feats2 = all_feats.clone()
    feats2[-1] = feats2[-1] * 0.5 + 1.0
    moved, _ = reference.eagle.draft_row(cfg, tw, dw, all_tokens, feats2, all_pos, query=n)
    assert not torch.allclose(moved, calls[0][3], rtol=0, atol=1e-9)


def test_dflash_mask_token_embeds_as_mask_embed():
    models = cached_models(compute_dtype="float64")
    cfg, tw, dw = models.config, models.target_weights, models.dflash_weights
    feats = torch.zeros(2, cfg.hidden_size, dtype=torch.float64)
    feats[0, 3] = 1.0
    masked, _ = eagle.draft_row(cfg, tw, dw, [5, cfg.vocab_size], feats, [1, 2])
    # The same row built by hand: mask_embed in place of a token embedding.
    planted = dict(tw, embed=torch.cat([tw["embed"][:cfg.vocab_size - 1], dw["mask_embed"][None]]))
    by_hand, _ = eagle.draft_row(cfg, planted, dw, [5, cfg.vocab_size - 1], feats, [1, 2])
    assert torch.allclose(masked, by_hand, rtol=1e-12, atol=1e-12)
    with pytest.raises(IndexError):      # heads without a mask embedding have no token V
        eagle.draft_row(cfg, tw, models.draft_weights, [5, cfg.vocab_size], feats, [1, 2])


# -- MTP: head i, its own weights, its own context ------------------------------------------------

def test_mtp_head_i_uses_mtp_weights_i():
    models = cached_models(compute_dtype="float64")
    cfg, tw = models.config, models.target_weights
    prompt, S = PROMPTS[1], 3
    calls, hook = recorder()
    out = run(models, "mtp", steps=S, prompts=[prompt], budgets=[2], hook=hook)
    seq = first_cycle_seq(models, prompt)
    n = len(seq) - 1
    drafts = out.traces[0].cycles[0].tree_tokens[1:]
    assert [(p, t) for _, p, t, _ in calls[:S]] == [(n, seq[-1])] + [(n + i, drafts[i - 1]) for i in range(1, S)]

    tokens, feats, positions = context(models, seq)
    want, g = eagle.draft_row(cfg, tw, models.mtp_weights[0], tokens, feats, positions)
    assert torch.equal(calls[0][3], want)
    for i in range(1, S):
        rows = (tokens + [drafts[i - 1]], torch.cat([feats, g[None]]), positions + [n + i])
        want, g_next = eagle.draft_row(cfg, tw, models.mtp_weights[i], *rows)
        assert torch.equal(calls[i][3], want), f"step {i}"
        for j in range(S):            # any other head's weights give other logits
            if j != i:
                other, _ = eagle.draft_row(cfg, tw, models.mtp_weights[j], *rows)
                assert not torch.allclose(other, want, rtol=0, atol=1e-9), (i, j)
        g = g_next
    # The heads really differ in the decode: permuting them changes the drafts' logits.
    swapped = type("M", (), dict(config=cfg, target_weights=tw, draft_weights=models.draft_weights,
                                 mtp_weights=[models.mtp_weights[0], models.mtp_weights[2], models.mtp_weights[1]]))
    calls2, hook2 = recorder()
    run(swapped, "mtp", steps=S, prompts=[prompt], budgets=[2], hook=hook2)
    assert torch.equal(calls2[0][3], calls[0][3])
    assert not torch.allclose(calls2[1][3], calls[1][3], rtol=0, atol=1e-9)


def test_mtp_step_row_sees_only_its_heads_context_and_itself():
    """Step 2 (head 2) does not see step 1's row: the list it runs over is head 2's context rows
    and its own row; with step 1's row added, the logits differ (what a shared-cache bug gives)."""
    models = cached_models(compute_dtype="float64")
    cfg, tw = models.config, models.target_weights
    prompt = PROMPTS[0]
    calls, hook = recorder()
    out = run(models, "mtp", steps=3, prompts=[prompt], budgets=[2], hook=hook)
    seq = first_cycle_seq(models, prompt)
    n = len(seq) - 1
    d1, d2 = out.traces[0].cycles[0].tree_tokens[1:3]
    tokens, feats, positions = context(models, seq)
    _, g0 = eagle.draft_row(cfg, tw, models.mtp_weights[0], tokens, feats, positions)
    _, g1 = eagle.draft_row(cfg, tw, models.mtp_weights[1], tokens + [d1], torch.cat([feats, g0[None]]),
                            positions + [n + 1])
    leaky, _ = eagle.draft_row(cfg, tw, models.mtp_weights[2], tokens + [d1, d2],
                               torch.cat([feats, g0[None], g1[None]]), positions + [n + 1, n + 2])
    assert not torch.allclose(leaky, calls[2][3], rtol=0, atol=1e-9)


# -- the greedy block op, the EAGLE path unchanged, argument checks ---------------------------------

def test_dflash_greedy_verify_cross_checks_the_block_op(monkeypatch):
    models = cached_models(compute_dtype="float64")
    calls = []

    def spy(*, candidates, target_predict):
        calls.append((candidates, target_predict))
        return reference.dflash_correct_drafts_and_bonus(candidates=candidates, target_predict=target_predict)
    monkeypatch.setattr(eagle, "dflash_correct_drafts_and_bonus", spy)
    out = run(models, "dflash", steps=2, agreement=0.7, prompts=PROMPTS[:2], budgets=[6, 6])
    assert len(calls) == sum(len(tr.cycles) for tr in out.traces)
    assert all(len(c[0][0]) == len(c[1][0]) == 3 for c in calls)

    def off_by_one(*, candidates, target_predict):
        correct, bonus = reference.dflash_correct_drafts_and_bonus(candidates=candidates, target_predict=target_predict)
        return [c + 1 for c in correct], bonus
    monkeypatch.setattr(eagle, "dflash_correct_drafts_and_bonus", off_by_one)
    with pytest.raises(RuntimeError, match="dflash verify"):
        run(models, "dflash", steps=2, prompts=PROMPTS[:1], budgets=[3])


def test_draft_row_query_defaults_to_the_last_row():
    models = cached_models(compute_dtype="float64")
    cfg, tw, dw = models.config, models.target_weights, models.draft_weights
    seq = PROMPTS[0] + [9]
    tokens, feats, positions = context(models, seq)
    a = eagle.draft_row(cfg, tw, dw, tokens, feats, positions)
    b = eagle.draft_row(cfg, tw, dw, tokens, feats, positions, query=len(tokens) - 1)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("kwargs, match", [
    (dict(algorithm="medusa"), "algorithm"),
    (dict(algorithm="mtp", topk=2, num_draft_tokens=4), "topk"),
    (dict(algorithm="dflash", topk=2, num_draft_tokens=4), "topk"),
    (dict(algorithm="mtp", spec_num_steps=4), "mtp_heads=3"),
])
def test_bad_arguments_are_refused(kwargs, match):
    models = cached_models(compute_dtype="float64")
    args = dict(spec_num_steps=2, max_new_tokens=3) | kwargs
    with pytest.raises(ValueError, match=match):
        reference.eagle.generate(models, [[1, 2, 3]], **args)


def test_dflash_needs_its_mask_embedding():
    models = cached_models(compute_dtype="float64")
    bare = type("M", (), dict(config=models.config, target_weights=models.target_weights,
                              dflash_weights=dict(models.draft_weights)))
    with pytest.raises(ValueError, match="mask_embed"):
        reference.eagle.generate(bare, [[1, 2, 3]], spec_num_steps=2, max_new_tokens=3, algorithm="dflash")
