"""Cached, paged model forward (prefill, decode, chain and tree verify) against the reference's
cache-free float64 forward, for every compute dtype, page size, and dense / hybrid model."""

from __future__ import annotations

import pytest
import torch

import reference
from specverify import build_models, dtypes
from specverify.models import Batch
from tests.support.asserts import assert_close

PROMPTS = [[5, 17, 33, 2, 250, 9], [100, 3, 77, 41, 8, 8, 8, 12, 300, 6, 1], [42]]
TREE_PARENTS = [-1, 0, 0, 1, 1, 2, 3]          # root, two children, grandchildren, a great-grandchild


def depth(parents: list[int], i: int) -> int:
    d = 0
    while parents[i] != -1:
        i, d = parents[i], d + 1
    return d


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """[n, n] bool: node j sees node j' when j' is j or one of its ancestors."""
    n = len(parents)
    mask = torch.zeros((n, n), dtype=torch.bool)
    for j in range(n):
        a = j
        while a != -1:
            mask[j, a] = True
            a = parents[a]
    return mask


def make_batch(rows, kv_lens, token_lists, parents_lists, device) -> Batch:
    """A batch of token trees (a chain is the tree whose parents are j - 1)."""
    bs, q = len(token_lists), max(len(t) for t in token_lists)
    ids = torch.zeros((bs, q), dtype=torch.int64)
    pos = torch.zeros((bs, q), dtype=torch.int64)
    mask = torch.zeros((bs, q, q), dtype=torch.bool)
    par = torch.full((bs, q), -1, dtype=torch.int64)
    for b, (toks, parents) in enumerate(zip(token_lists, parents_lists)):
        n = len(toks)
        ids[b, :n] = torch.tensor(toks)
        pos[b, :n] = torch.tensor([kv_lens[b] + depth(parents, j) for j in range(n)])
        mask[b, :n, :n] = ancestor_mask(parents)
        par[b, :n] = torch.tensor(parents[:1] + [p for p in parents[1:]])
    kv = torch.tensor(kv_lens)
    ql = torch.tensor([len(t) for t in token_lists])
    return Batch(ids.to(device), pos.to(device), torch.tensor(rows).to(device), kv.to(device), ql.to(device),
                 mask.to(device), par.to(device))


def chain(n: int) -> list[int]:
    return list(range(-1, n - 1))


def run(model, cache, rows, kv_lens, token_lists, parents_lists, commit=True):
    for row, kv, toks in zip(rows, kv_lens, token_lists):
        cache.table.reserve(row, kv + len(toks))
    batch = make_batch(rows, kv_lens, token_lists, parents_lists, model.device)
    return model.forward(cache, batch, commit_state=commit)


@pytest.mark.parametrize("hybrid", [False, True], ids=["dense", "hybrid"])
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("compute_dtype", dtypes.COMPUTE_DTYPES)
def test_cached_forward_matches_reference(compute_dtype, page_size, hybrid, request):
    models = build_models("tiny", seed=11, compute_dtype=compute_dtype, hybrid=hybrid, device="cpu")
    cfg, w, model = models.config, models.target_weights, models.target
    cache = model.new_cache(max_requests=4, page_size=page_size)
    rows = [cache.table.alloc_row() for _ in PROMPTS]
    nodeid = request.node.nodeid

    def check(out, b, j, tokens, what):
        ref_logits, ref_hidden = reference.forward(cfg, w, tokens)
        assert_close(out.hidden[b, j], ref_hidden[-1], compute_dtype, f"{what} hidden, request {b}", nodeid)
        assert_close(out.logits[b, j].double(), ref_logits[-1], (compute_dtype, cfg.logits_dtype), f"{what} logits, request {b}", nodeid)

    # Prefill: ragged prompts in one padded batch; every live position is checked.
    out = run(model, cache, rows, [0, 0, 0], PROMPTS, [chain(len(p)) for p in PROMPTS])
    for b, p in enumerate(PROMPTS):
        for j in range(len(p)):
            check(out, b, j, p[:j + 1], f"prefill pos {j}")
    seqs = [list(p) for p in PROMPTS]

    # Two decode steps.
    for step, new in enumerate(([7, 8, 9], [301, 2, 57])):
        out = run(model, cache, rows, [len(s) for s in seqs], [[t] for t in new], [chain(1)] * 3)
        for b, t in enumerate(new):
            seqs[b].append(t)
            check(out, b, 0, seqs[b], f"decode step {step}")

    # Chain verify of ragged lengths, not committed to the recurrent state.
    chains = [[11, 12, 13, 14], [21], [31, 32]]
    out = run(model, cache, rows, [len(s) for s in seqs], chains, [chain(len(c)) for c in chains], commit=False)
    for b, c in enumerate(chains):
        for j in range(len(c)):
            check(out, b, j, seqs[b] + c[:j + 1], f"chain verify node {j}")

    # Tree verify on top of the same prefix (overwrites the chain's cache entries).
    trees = [[60, 61, 62, 63, 64, 65, 66], [70, 71, 72], [80, 81, 82, 83, 84, 85, 86]]
    parents = [TREE_PARENTS, TREE_PARENTS[:3], TREE_PARENTS]
    out = run(model, cache, rows, [len(s) for s in seqs], trees, parents, commit=False)
    for b, (toks, par) in enumerate(zip(trees, parents)):
        ref = reference.tree_node_logits(cfg, w, seqs[b], toks, par)
        assert_close(out.logits[b, :len(toks)].double(), ref, (compute_dtype, cfg.logits_dtype), f"tree verify logits, request {b}",
                     nodeid)


@pytest.mark.bitexact
def test_padding_does_not_touch_live_rows():
    """A request's outputs do not depend on the other requests of its ragged, padded batch: with
    other tokens in the other requests (same lengths, so the same shapes and the same arithmetic)
    its logits are bit for bit the same; alone, in a batch of one, they agree by the float64
    tolerance (other row counts, which a CPU GEMM may round apart)."""
    models = build_models("tiny", seed=3, compute_dtype="float64", device="cpu")
    model = models.target
    vocab = model.config.vocab_size

    def batched(prompts):
        cache = model.new_cache(max_requests=3, page_size=4)
        rows = [cache.table.alloc_row() for _ in prompts]
        return run(model, cache, rows, [0, 0, 0], prompts, [chain(len(p)) for p in prompts]).logits

    others = [[(t * 7 + 3) % vocab for t in p] for p in PROMPTS[:2]] + [PROMPTS[2]]
    assert others[:2] != PROMPTS[:2]
    base, swapped = batched(PROMPTS), batched(others)
    n = len(PROMPTS[2])
    assert torch.equal(base[2, :n], swapped[2, :n]), "request 2's logits depend on the other requests' tokens"
    assert not torch.equal(base[0, :len(PROMPTS[0])], swapped[0, :len(PROMPTS[0])])
    alone_cache = model.new_cache(max_requests=1, page_size=4)
    alone = run(model, alone_cache, [alone_cache.table.alloc_row()], [0], [PROMPTS[2]], [chain(n)]).logits
    assert_close(alone[0, :n], base[2, :n], "float64", "request 2 alone vs in the batch")


def test_slot_table_pages_and_sink():
    models = build_models("tiny", seed=0, device="cpu")
    cache = models.target.new_cache(max_requests=2, page_size=4, num_pages=5)
    table = cache.table
    a, b = table.alloc_row(), table.alloc_row()
    table.reserve(a, 6)                       # two pages
    table.reserve(b, 4)                       # one page
    assert table.num_free_pages == 1          # page 0 is reserved
    slots_a = table.req_to_token[a, :8].tolist()
    assert 0 not in slots_a and len(set(slots_a)) == 8
    assert slots_a[0] % 4 == 0 and slots_a[4] % 4 == 0
    with pytest.raises(RuntimeError, match="needs 2 more pages, 1 are free"):
        table.reserve(b, 12)
    table.shrink(a, 3)
    assert table.num_free_pages == 2 and table.capacity(a) == 4
    assert table.req_to_token[a, 4:8].tolist() == [0, 0, 0, 0]
    table.free_row(a)
    assert table.num_free_pages == 3
    with pytest.raises(ValueError, match="exceeds max_context"):
        table.reserve(b, models.config.max_context + 1)
