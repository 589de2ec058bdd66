"""Tree build and verify kernels (docs/semantics.md 6.2-6.4): Triton == torch == values on paper.

Every expected value below was derived by hand from the contract; the derivation sits beside it.
Flat indices for k = 2: step 0 -> 0, 1; step 1 -> 2 + 2p + c (beam 0: 2, 3; beam 1: 4, 5);
step 2 -> 6 + 2p + c (beam 0: 6, 7; beam 1: 8, 9). For k = 3, S = 2: step 0 -> 0..2,
step 1 -> 3 + 3p + c.

On a machine without a GPU the Triton kernels run under TRITON_INTERPRET=1 (set by conftest.py);
with a GPU every tensor goes to it and the kernels run natively.
"""

from __future__ import annotations

import math

import pytest
import torch

from specverify.kernels.launch import check_launchable

from specverify.kernels import DraftTree, build_tree, chain_tree, target_predict, verify_greedy, verify_stochastic
from specverify.kernels import tree as tree_mod

pytestmark = [pytest.mark.kernels, pytest.mark.bitexact]

DEV = "cuda" if torch.cuda.is_available() else "cpu"
IMPLS = ["torch", "triton"]


def t(x, dtype=torch.int64):
    return torch.tensor(x, dtype=dtype, device=DEV)


def f64(x):
    return t(x, torch.float64)


def below(x: float) -> float:
    """The largest float64 under x."""
    return math.nextafter(x, -math.inf)


def assert_tree(tree: DraftTree, expected: dict, what: str = "") -> None:
    for name, want in expected.items():
        got = getattr(tree, name)
        if name == "mask":
            got = got.to(torch.int64)
        assert got.tolist() == want, f"{what} {name}: got {got.tolist()}, expected {want}"


def assert_same_tree(a: DraftTree, b: DraftTree, what: str) -> None:
    for name in ("tokens", "parents", "positions", "mask", "first_child", "next_sibling", "flat_index"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), f"{what}: {name} differs\n{x.tolist()}\n{y.tolist()}"


# --------------------------------------------------------------------------------------------
# Hand-built trees

# Batch of two with different L. beam_flat (both): step 0 beams [0, 1]; step 1 beams [4, 2].
# Request 0, kept [0, 1, 4, 6]: nodes 1..4 hold flats 0, 1, 4, 6.
#   flat 0, 1: step 0 -> root.  flat 4: step 1, p = (2 % 4) // 2 = 1 -> beam flat 1 = node 2.
#   flat 6: step 2, p = 0 -> step-1 beam 0 = flat 4 = node 3.   A chain 0-2-3-4 plus leaf 1.
# Request 1, kept [0, 2, 3, 6]: flat 2, 3: step 1, p = 0 -> flat 0 = node 1.
#   flat 6: step 2, p = 0 -> flat 4, not kept: node 4 is an orphan (parent -1, depth 1).
CASE_AB = dict(
    args=dict(root_tokens=[100, 200], kept_flat=[[0, 1, 4, 6], [0, 2, 3, 6]],
              kept_tokens=[[11, 12, 13, 14], [21, 22, 23, 24]],
              beam_flat=[[[0, 1], [4, 2]], [[0, 1], [4, 2]]], seq_lens=[7, 3]),
    topk=2, num_steps=3,
    expected=dict(
        tokens=[[100, 11, 12, 13, 14], [200, 21, 22, 23, 24]],
        parents=[[-1, 0, 0, 2, 3], [-1, 0, 1, 1, -1]],
        positions=[[7, 8, 8, 9, 10], [3, 4, 5, 5, 4]],
        mask=[[[1, 0, 0, 0, 0],
               [1, 1, 0, 0, 0],
               [1, 0, 1, 0, 0],
               [1, 0, 1, 1, 0],
               [1, 0, 1, 1, 1]],
              [[1, 0, 0, 0, 0],
               [1, 1, 0, 0, 0],
               [1, 1, 1, 0, 0],
               [1, 1, 0, 1, 0],
               [1, 0, 0, 0, 1]]],
        first_child=[[1, -1, 3, 4, -1], [1, 2, -1, -1, -1]],
        next_sibling=[[-1, 2, -1, -1, -1], [-1, -1, 3, -1, -1]],
        flat_index=[[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]],
    ),
)

# k = 3, S = 2, D = 6 (not a power of two). kept [0, 2, 3, 5, 10]:
#   flat 0, 2 -> root; flat 3 (p 0), 5 (p 0) -> flat 0 = node 1; flat 10: (7 % 9) // 3 = 2 -> flat 2 = node 2.
CASE_K3 = dict(
    args=dict(root_tokens=[5], kept_flat=[[0, 2, 3, 5, 10]], kept_tokens=[[50, 52, 53, 55, 60]],
              beam_flat=[[[0, 1, 2]]], seq_lens=[11]),
    topk=3, num_steps=2,
    expected=dict(
        tokens=[[5, 50, 52, 53, 55, 60]],
        parents=[[-1, 0, 0, 1, 1, 2]],
        positions=[[11, 12, 12, 13, 13, 13]],
        mask=[[[1, 0, 0, 0, 0, 0],
               [1, 1, 0, 0, 0, 0],
               [1, 0, 1, 0, 0, 0],
               [1, 1, 0, 1, 0, 0],
               [1, 1, 0, 0, 1, 0],
               [1, 0, 1, 0, 0, 1]]],
        first_child=[[1, 3, 5, -1, -1, -1]],
        next_sibling=[[-1, 2, -1, 4, -1, -1]],
        flat_index=[[0, 1, 2, 3, 4, 5]],
    ),
)

# A child of an orphan (unreachable from real scores, reachable by hand). beam_flat step 1 = [2, 4].
# kept [2, 6]: flat 2 (step 1, p 0 -> flat 0, not kept) is an orphan; flat 6 (step 2, p 0 -> flat 2)
# is node 1's child: parent 1, ancestors {2, 1} plus the root, depth 2.
CASE_NESTED_ORPHAN = dict(
    args=dict(root_tokens=[9], kept_flat=[[2, 6]], kept_tokens=[[30, 31]],
              beam_flat=[[[0, 1], [2, 4]]], seq_lens=[4]),
    topk=2, num_steps=3,
    expected=dict(
        tokens=[[9, 30, 31]], parents=[[-1, -1, 1]], positions=[[4, 5, 6]],
        mask=[[[1, 0, 0], [1, 1, 0], [1, 1, 1]]],
        first_child=[[-1, 2, -1]], next_sibling=[[-1, -1, -1]], flat_index=[[0, 1, 2]],
    ),
)

# S = 1: no beam_flat columns, every candidate hangs off the root. D = 3 of k = 3 candidates.
CASE_ONE_STEP = dict(
    args=dict(root_tokens=[1, 2], kept_flat=[[0, 2], [1, 2]], kept_tokens=[[7, 8], [9, 10]],
              beam_flat=[], seq_lens=[0, 5]),
    topk=3, num_steps=1,
    expected=dict(
        tokens=[[1, 7, 8], [2, 9, 10]], parents=[[-1, 0, 0], [-1, 0, 0]], positions=[[0, 1, 1], [5, 6, 6]],
        mask=[[[1, 0, 0], [1, 1, 0], [1, 0, 1]], [[1, 0, 0], [1, 1, 0], [1, 0, 1]]],
        first_child=[[1, -1, -1], [1, -1, -1]], next_sibling=[[-1, 2, -1], [-1, 2, -1]],
        flat_index=[[0, 1, 2], [3, 4, 5]],
    ),
)

# topk == 1, S = 3: candidates 0, 1, 2 (one per step), beams [0], [1]: a chain, D = 4.
CASE_CHAIN = dict(
    args=dict(root_tokens=[40, 41], kept_flat=[[0, 1, 2], [0, 1, 2]], kept_tokens=[[1, 2, 3], [4, 5, 6]],
              beam_flat=[[[0], [1]], [[0], [1]]], seq_lens=[2, 6]),
    topk=1, num_steps=3,
    expected=dict(
        tokens=[[40, 1, 2, 3], [41, 4, 5, 6]], parents=[[-1, 0, 1, 2], [-1, 0, 1, 2]],
        positions=[[2, 3, 4, 5], [6, 7, 8, 9]],
        mask=[[[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]] * 2,
        first_child=[[1, 2, 3, -1], [1, 2, 3, -1]], next_sibling=[[-1] * 4, [-1] * 4],
        flat_index=[[0, 1, 2, 3], [4, 5, 6, 7]],
    ),
)

HAND_CASES = {"ab": CASE_AB, "k3": CASE_K3, "nested_orphan": CASE_NESTED_ORPHAN, "one_step": CASE_ONE_STEP,
              "chain": CASE_CHAIN}


def build(case: dict, impl: str = "torch") -> DraftTree:
    a, k, steps = case["args"], case["topk"], case["num_steps"]
    beam_flat = t(a["beam_flat"]).reshape(len(a["root_tokens"]), max(steps - 1, 0), k)
    return build_tree(t(a["root_tokens"]), t(a["kept_flat"]), t(a["kept_tokens"]), beam_flat,
                      t(a["seq_lens"]), topk=k, num_steps=steps, impl=impl)


@pytest.mark.parametrize("impl", IMPLS + ["auto"])
@pytest.mark.parametrize("name", list(HAND_CASES))
def test_build_tree_hand(name, impl):
    case = HAND_CASES[name]
    tree = build(case, impl)
    assert_tree(tree, case["expected"], f"{name}/{impl}")
    assert tree.mask.dtype == torch.bool and tree.tokens.dtype == torch.int64
    assert tree.bs == len(case["args"]["root_tokens"])
    assert tree.num_draft_tokens == len(case["args"]["kept_flat"][0]) + 1


def test_chain_tree_matches_build_tree():
    a = CASE_CHAIN["args"]
    chain = chain_tree(t(a["root_tokens"]), t(a["kept_tokens"]), t(a["seq_lens"]))
    assert_tree(chain, CASE_CHAIN["expected"], "chain_tree")


@pytest.mark.parametrize("impl", IMPLS)
def test_build_tree_root_only_and_empty_batch(impl):
    empty_beams = torch.empty((2, 0, 2), dtype=torch.int64, device=DEV)
    tree = build_tree(t([3, 4]), t([[], []]), t([[], []]), empty_beams, t([1, 2]), topk=2, num_steps=1, impl=impl)
    assert_tree(tree, dict(tokens=[[3], [4]], parents=[[-1], [-1]], positions=[[1], [2]], mask=[[[1]], [[1]]],
                           first_child=[[-1], [-1]], next_sibling=[[-1], [-1]], flat_index=[[0], [1]]))
    none = build_tree(t([]), t([[]] * 0).reshape(0, 2), t([]).reshape(0, 2),
                      torch.empty((0, 1, 2), dtype=torch.int64, device=DEV), t([]),
                      topk=2, num_steps=2, impl=impl)
    assert none.tokens.shape == (0, 3) and none.mask.shape == (0, 3, 3)


@pytest.mark.parametrize("impl", IMPLS)
def test_build_tree_unvalidated_inputs_stay_in_bounds(impl):
    # Inside a graph capture nothing checks values. Out-of-range flats (-1, 10, 99 of 10 candidates)
    # become orphans instead of reading past beam_flat; a beam pointing nowhere orphans its children.
    builder = tree_mod._build_tree_triton if impl == "triton" else tree_mod._build_tree_torch
    tree = builder(t([1]), t([[-1, 0, 2, 10, 99]]), t([[3, 4, 5, 6, 7]]), t([[[0, 1], [-7, 1000]]]), t([2]),
                   2, 3)
    assert tree.parents.tolist() == [[-1, -1, 0, 2, -1, -1]]
    assert tree.positions.tolist() == [[2, 3, 3, 4, 3, 3]]
    tree = builder(t([1]), t([[0, 7]]), t([[3, 4]]), t([[[0, 1], [-7, 1000]]]), t([2]), 2, 3)
    assert tree.parents.tolist() == [[-1, 0, -1]]


# --------------------------------------------------------------------------------------------
# Random trees: Triton == torch, and the structural invariants


def draft_from_scores(bs: int, k: int, steps: int, d: int, gen: torch.Generator, vocab: int = 50):
    """Kept candidates and beams by the rules of section 6.2, from random draft probabilities."""
    kept_flat, kept_tokens, beam_flat = [], [], []
    for _ in range(bs):
        p0 = torch.rand(k, generator=gen).sort(descending=True).values
        scores = {c: p0[c] for c in range(k)}
        beams, beam_score, beam_rows = list(range(k)), [p0[c] for c in range(k)], [list(range(k))]
        for i in range(1, steps):
            cands = []
            for p in range(k):
                q = torch.rand(k, generator=gen).sort(descending=True).values
                for c in range(k):
                    flat = k + (i - 1) * k * k + p * k + c
                    s = (beam_score[p].float() * q[c].float()).item()
                    scores[flat] = torch.tensor(s)
                    cands.append((-s, flat))
            best = sorted(cands)[:k]
            beams = [flat for _, flat in best]
            beam_score = [scores[flat] for flat in beams]
            if i < steps - 1:
                beam_rows.append(beams)
        ranked = sorted(scores, key=lambda fl: (-scores[fl].item(), fl))[: d - 1]
        kept_flat.append(sorted(ranked))
        kept_tokens.append(torch.randint(0, vocab, (d - 1,), generator=gen).tolist())
        beam_flat.append(beam_rows[: max(steps - 1, 0)])
    return t(kept_flat), t(kept_tokens), t(beam_flat).reshape(bs, max(steps - 1, 0), k)


def arbitrary_kept(bs: int, k: int, steps: int, d: int, gen: torch.Generator, vocab: int = 50):
    """Any sorted kept set and any in-range beams: orphans and children of orphans included."""
    count = tree_mod.num_candidates(k, steps)
    kept_flat = torch.stack([torch.randperm(count, generator=gen)[: d - 1].sort().values for _ in range(bs)])
    beam_flat = torch.empty((bs, max(steps - 1, 0), k), dtype=torch.int64)
    for i in range(steps - 1):
        lo, hi = (0, k) if i == 0 else (k + (i - 1) * k * k, k + i * k * k)
        beam_flat[:, i] = torch.arange(k) if i == 0 else torch.randint(lo, hi, (bs, k), generator=gen)
    kept_tokens = torch.randint(0, vocab, (bs, d - 1), generator=gen)
    return kept_flat.to(DEV), kept_tokens.to(DEV), beam_flat.to(DEV)


def check_invariants(tree: DraftTree, seq_lens: torch.Tensor) -> None:
    parents, d = tree.parents.cpu(), tree.num_draft_tokens
    node = torch.arange(d)
    assert (parents < node).all(), "a parent must precede its child"
    mask = tree.mask.cpu()
    assert mask[:, :, 0].all() and mask[:, node, node].all()
    depth = tree.positions.cpu() - seq_lens.cpu()[:, None]
    assert (depth[:, 0] == 0).all() and (depth[:, 1:] >= 1).all()
    assert (mask[:, :, 1:].sum(-1) == depth).all(), "depth = non-root nodes a node sees"
    for b in range(tree.bs):                      # linked form == parents
        for j in range(d):
            kids = [m for m in range(d) if parents[b, m] == j]
            got, c = [], tree.first_child[b, j].item()
            while c != -1:
                got.append(c)
                c = tree.next_sibling[b, c].item()
            assert got == kids, f"request {b} node {j}: linked children {got}, parents say {kids}"


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k,steps,d", [(2, 3, 5), (3, 3, 7), (2, 4, 8), (1, 4, 5), (4, 1, 4), (3, 2, 3)])
def test_build_tree_random_triton_equals_torch(k, steps, d, seed):
    gen = torch.Generator().manual_seed(1000 * seed + 10 * k + d)
    bs = 3
    seq_lens = torch.randint(0, 20, (bs,), generator=gen).to(DEV)
    roots = torch.randint(0, 50, (bs,), generator=gen).to(DEV)
    for source in (draft_from_scores, arbitrary_kept):
        if source is arbitrary_kept and k == 1:
            continue
        kept_flat, kept_tokens, beam_flat = source(bs, k, steps, d, gen)
        args = (roots, kept_flat, kept_tokens, beam_flat, seq_lens)
        a = build_tree(*args, topk=k, num_steps=steps, impl="torch")
        b = build_tree(*args, topk=k, num_steps=steps, impl="triton")
        assert_same_tree(a, b, f"{source.__name__} k={k} S={steps} D={d} seed={seed}")
        check_invariants(a, seq_lens)
        if source is draft_from_scores:
            assert (a.parents[:, 1:] >= 0).all(), "well-ordered scores never leave an orphan"
        if k == 1:
            assert_same_tree(a, chain_tree(roots, kept_tokens, seq_lens), "chain")


# --------------------------------------------------------------------------------------------
# Greedy verify (6.3). Tree "ab" request 0: root -> {1, 2}, 2 -> 3 -> 4; tokens 11, 12, 13, 14.
# Row j of target_predict is the target's next token after node j.

GREEDY_CASES = {
    # root predicts 12 (node 2, the second sibling), 2 predicts 13, 3 predicts 14, 4 predicts 99.
    "all_accepted": ([12, 0, 13, 14, 99], [0, 2, 3, 4], 3, 99),
    "first_mismatch": ([50, 0, 13, 14, 99], [0, -1, -1, -1], 0, 50),
    "mid_mismatch": ([12, 0, 77, 14, 99], [0, 2, -1, -1], 1, 77),
    "first_sibling_leaf": ([11, 5, 13, 14, 99], [0, 1, -1, -1], 1, 5),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", list(GREEDY_CASES))
def test_verify_greedy_hand(name, impl):
    predict, accept, n, bonus = GREEDY_CASES[name]
    tree = build(CASE_AB)
    # Request 1 (orphan node 4, token 24): the root predicts 24, which only the orphan carries.
    got = verify_greedy(tree, t([predict, [24, 0, 0, 0, 0]]), num_steps=3, impl=impl)
    assert [x.tolist() for x in got] == [[accept, [0, -1, -1, -1]], [n, 0], [bonus, 24]]


@pytest.mark.parametrize("impl", IMPLS)
def test_verify_greedy_orphan_and_first_match(impl):
    tree = build(CASE_AB)
    # Request 1: root -> 1 (21) -> {2 (22), 3 (23)}; orphan 4 (24). Node 1 predicts 24: the orphan's
    # token, but it is nobody's child, so the walk stops at node 1.
    got = verify_greedy(tree, t([[12, 0, 13, 14, 99], [21, 24, 0, 0, 0]]), num_steps=3, impl=impl)
    assert [x.tolist() for x in got] == [[[0, 2, 3, 4], [0, 1, -1, -1]], [3, 1], [99, 24]]
    # k3 tree: siblings 3 and 4 (children of 1) carry the same token; the first in sibling order wins.
    k3 = build(CASE_K3)
    tokens = k3.tokens.clone()
    tokens[0, 4] = tokens[0, 3]
    dup = DraftTree(tokens, k3.parents, k3.positions, k3.mask, k3.first_child, k3.next_sibling, k3.flat_index)
    got = verify_greedy(dup, t([[50, 53, 0, 8, 9, 0]]), num_steps=2, impl=impl)
    assert [x.tolist() for x in got] == [[[0, 1, 3]], [2], [8]]
    # The nested-orphan tree: nothing hangs off the root, whatever the target says.
    got = verify_greedy(build(CASE_NESTED_ORPHAN), t([[30, 31, 0]]), num_steps=3, impl=impl)
    assert [x.tolist() for x in got] == [[[0, -1, -1, -1]], [0], [30]]


@pytest.mark.parametrize("impl", IMPLS)
def test_verify_greedy_chain(impl):
    tree = build(CASE_CHAIN)          # request 0: 1, 2, 3; request 1: 4, 5, 6
    got = verify_greedy(tree, t([[1, 2, 3, 4], [4, 9, 6, 7]]), num_steps=3, impl=impl)
    assert [x.tolist() for x in got] == [[[0, 1, 2, 3], [0, 1, -1, -1]], [3, 1], [4, 9]]


@pytest.mark.parametrize("impl", IMPLS)
def test_verify_greedy_stops_at_num_steps(impl):
    # The "ab" tree is 3 deep; verified with S = 1 the walk stops after one accepted node and the
    # bonus is the prediction there (node 2 predicts 13), accept_nodes is S + 1 = 2 wide.
    got = verify_greedy(build(CASE_AB), t([[12, 0, 13, 14, 99], [21, 24, 0, 0, 0]]), num_steps=1, impl=impl)
    assert [x.tolist() for x in got] == [[[0, 2], [0, 1]], [1, 1], [13, 24]]


@pytest.mark.parametrize("seed", range(6))
def test_verify_greedy_random_triton_equals_torch(seed):
    gen = torch.Generator().manual_seed(seed)
    k, steps, d, bs, vocab = [(2, 3, 6, 4, 3), (3, 3, 8, 4, 4), (1, 5, 6, 3, 2)][seed % 3]
    source = draft_from_scores if seed < 3 else arbitrary_kept
    if k == 1:
        source = draft_from_scores
    kept_flat, kept_tokens, beam_flat = source(bs, k, steps, d, gen, vocab)
    seq_lens = torch.randint(0, 9, (bs,), generator=gen).to(DEV)
    tree = build_tree(t([0] * bs), kept_flat, kept_tokens, beam_flat, seq_lens, topk=k, num_steps=steps)
    for _ in range(5):
        predict = torch.randint(0, vocab, (bs, d), generator=gen).to(DEV)
        a = verify_greedy(tree, predict, num_steps=steps, impl="torch")
        b = verify_greedy(tree, predict, num_steps=steps, impl="triton")
        for x, y, what in zip(a, b, ("accept_nodes", "num_correct", "bonus")):
            assert torch.equal(x, y), f"{what}: torch {x.tolist()} triton {y.tolist()}"
        # The path is a parent chain and every accepted token is the prediction at its parent.
        for r in range(bs):
            path = [j for j in a[0][r].tolist() if j >= 0]
            assert len(path) == a[1][r].item() + 1
            for par, ch in zip(path, path[1:]):
                assert tree.parents[r, ch].item() == par
                assert tree.tokens[r, ch].item() == predict[r, par].item()
            assert a[2][r].item() == predict[r, path[-1]].item()


# --------------------------------------------------------------------------------------------
# Stochastic verify (6.4). Tree "ab" request 0, tokens 1, 2, 3, 4 over V = 8:
# root -> {1 (token 1), 2 (token 2)}, 2 -> 3 (token 3) -> 4 (token 4).

V = 8


def probs_ab(**rows):
    """[1, 5, V] with the given rows (node index -> list), zeros elsewhere."""
    p = torch.zeros((1, 5, V), dtype=torch.float64)
    for key, row in rows.items():
        p[0, int(key[1:])] = torch.tensor(row, dtype=torch.float64)
    return p.to(DEV)


def tree_ab_tokens(tokens, case=CASE_AB, request=0):
    tree = build(case)
    sl = slice(request, request + 1)
    return DraftTree(t([tokens]), tree.parents[sl], tree.positions[sl], tree.mask[sl], tree.first_child[sl],
                     tree.next_sibling[sl], tree.flat_index[sl])


ROOT = [0.125, 0.25, 0.5, 0.125, 0, 0, 0, 0]      # children's tokens 1, 2 hold 0.25 and 0.5
LEAF1 = [0.25, 0, 0, 0.25, 0.5, 0, 0, 0]          # cumulative 0.25, 0.25, 0.25, 0.5, 1.0


def stochastic(probs, coins, final, tokens=(0, 1, 2, 3, 4), case=CASE_AB, request=0, num_steps=3):
    """Both implementations of the walk on one request; they must agree, the result is returned."""
    tree = tree_ab_tokens(list(tokens), case, request)
    results = [[x.tolist()[0] for x in verify_stochastic(tree, probs, f64([coins]), f64([final]),
                                                         num_steps=num_steps, impl=impl)]
               for impl in IMPLS]
    assert results[0] == results[1], f"torch {results[0]} != triton {results[1]}"
    return results[0]


def test_stochastic_strict_acceptance_boundary():
    p = probs_ab(n0=ROOT, n1=LEAF1)
    # u just below acc = 0.25 at node 1: accepted; node 1 is a leaf: bonus from its full row.
    # final 0.5: threshold 0.5 * 1.0, first cumulative > 0.5 is index 4.
    assert stochastic(p, [below(0.25), 0, 0, 0, 0], 0.5) == [[0, 1, -1, -1], 1, 4]
    # final just below 0.5: cumulative 0.5 at index 3 already exceeds it.
    assert stochastic(p, [below(0.25), 0, 0, 0, 0], below(0.5)) == [[0, 1, -1, -1], 1, 3]
    # u == 0.25: not < 0.25, node 1 rejected; acc = 0.75 at node 2: accepted. Node 2's row is all
    # zero: its child (token 3) is rejected (coin 0.75 vs acc 0) and the residual has no mass, so the
    # bonus falls back to V - 1.
    assert stochastic(p, [0.25, 0, 0.75, 0, 0], 0.3) == [[0, 2, -1, -1], 1, V - 1]


def test_stochastic_residual_after_rejecting_siblings():
    p = probs_ab(n0=ROOT)
    # u = 0.75: node 1 (acc 0.25) and node 2 (acc 0.75, not strictly above) both rejected. Residual at
    # the root: [0.125, 0, 0, 0.125, 0...] (sum 0.25). final 0.5 -> threshold 0.125: cumulative 0.125
    # at index 0 does not exceed it, 0.25 at index 3 does.
    assert stochastic(p, [0.75, 0, 0, 0, 0], 0.5) == [[0, -1, -1, -1], 0, 3]
    assert stochastic(p, [0.75, 0, 0, 0, 0], below(0.5)) == [[0, -1, -1, -1], 0, 0]
    assert stochastic(p, [0.75, 0, 0, 0, 0], 0.0) == [[0, -1, -1, -1], 0, 0]
    # Without the zeroing, final 0.5 would pick token 2 (cumulative 0.875 > 0.5); with final just
    # below 1 the threshold is just below 0.25 and index 3 (the last with residual left) is first over.
    assert stochastic(p, [0.75, 0, 0, 0, 0], below(1.0)) == [[0, -1, -1, -1], 0, 3]


def test_stochastic_full_path_bonus_from_leaf():
    p = probs_ab(n0=ROOT, n2=[0, 0, 0, 0.5, 0.5, 0, 0, 0], n3=[0, 0, 0, 0, 1.0, 0, 0, 0],
                 n4=[0, 0, 0, 0, 0, 0, 0.5, 0.5])
    # root u 0.5: node 1 acc 0.25 no, node 2 acc 0.75 yes; coins[2] 0.25 < p2[3] = 0.5: node 3;
    # coins[3] 0.9 < 1.0: node 4 (depth S). Bonus from node 4's full row: 0.5 * 1.0 -> index 7.
    assert stochastic(p, [0.5, 0.99, 0.25, 0.9, 0.99], 0.5) == [[0, 2, 3, 4], 3, 7]
    assert stochastic(p, [0.5, 0.99, 0.25, 0.9, 0.99], below(0.5)) == [[0, 2, 3, 4], 3, 6]
    # coins[3] at 0.9 but p3[4] = 0.875: rejected at node 3; residual = p3 without token 4.
    p3 = [0, 0, 0, 0.125, 0.875, 0, 0, 0]
    p = probs_ab(n0=ROOT, n2=[0, 0, 0, 0.5, 0.5, 0, 0, 0], n3=p3)
    assert stochastic(p, [0.5, 0.99, 0.25, 0.9, 0.0], 0.0) == [[0, 2, 3, -1], 2, 3]


def test_stochastic_stops_at_num_steps():
    # With S = 1 the walk stops at node 2 after one acceptance: its children are never visited, so
    # nothing is zeroed and the bonus comes from node 2's full row (final 0.25 -> 0.25 * 1.0, first
    # cumulative above it is index 3, node 3's token).
    p = probs_ab(n0=ROOT, n2=[0, 0, 0, 0.5, 0.5, 0, 0, 0])
    assert stochastic(p, [0.5, 0, 0.9, 0, 0], 0.25, num_steps=1) == [[0, 2], 1, 3]


def test_stochastic_sum_is_the_running_sum():
    # sum(residual) is the left-to-right sum, the last value of the cumulative sum the draw walks.
    # Leaf row [1, 2^-53 x 15]: the running sum stays 1.0, so with final just below 1 the threshold
    # is just below 1.0 and index 0 is drawn. A pairwise sum (1 + 15 * 2^-53) would put the
    # threshold above every cumulative value and fall back to the last positive index, 15.
    # CPU tensors and the torch walk: torch's CPU cumsum is the left-to-right sum. (CUDA's cumsum is
    # a parallel scan whose values differ from it by a few ulps; on this row it draws 14.)
    probs = torch.zeros((1, 5, 16), dtype=torch.float64)
    probs[0, 0, 1] = 1.0                             # the root accepts node 1 (token 1), a leaf
    probs[0, 1] = torch.tensor([1.0] + [2.0 ** -53] * 15, dtype=torch.float64)
    tree = build(CASE_AB)
    tree = DraftTree(*(getattr(tree, f)[:1].cpu() for f in ("tokens", "parents", "positions", "mask", "first_child",
                                                         "next_sibling", "flat_index")))
    tree.tokens[0] = torch.arange(5)
    got = verify_stochastic(tree, probs, torch.tensor([[0.5, 0, 0, 0, 0]], dtype=torch.float64),
                            torch.tensor([below(1.0)], dtype=torch.float64), num_steps=3, impl="torch")
    assert [x.tolist()[0] for x in got] == [[0, 1, -1, -1], 1, 0]


def test_stochastic_orphan_never_accepted():
    # Request 1 of "ab": root -> 1 -> {2, 3}; node 4 is an orphan. Tokens 1, 2, 3, 4.
    p = probs_ab(n0=[0, 0.25, 0, 0, 0.75, 0, 0, 0])
    # u 0.5 against node 1 (acc 0.25): rejected; the orphan is not the root's child even though its
    # token carries the rest of the mass. Residual [0, 0, 0, 0, 0.75, ...] -> token 4.
    assert stochastic(p, [0.5, 0, 0, 0, 0], 0.3, request=1) == [[0, -1, -1, -1], 0, 4]


def test_stochastic_batch_and_chain():
    # Chain case, two requests at once, with their own coins and final uniforms.
    tree = build(CASE_CHAIN)                          # tokens 1, 2, 3 and 4, 5, 6
    p = torch.zeros((2, 4, V), dtype=torch.float64)
    p[0, 0, 1] = p[0, 1, 2] = p[0, 2, 3] = 1.0        # request 0 accepts everything (coins < 1)
    p[0, 3, 7] = 1.0
    p[1, 0, 4], p[1, 0, 0] = 0.5, 0.5                 # request 1: coin 0.5 rejects node 1 (acc 0.5)
    for impl in IMPLS:
        got = verify_stochastic(tree, p.to(DEV), f64([[0.9, 0.9, 0.9, 0.9], [0.5, 0, 0, 0]]), f64([0.1, 0.7]),
                                num_steps=3, impl=impl)
        assert [x.tolist() for x in got] == [[[0, 1, 2, 3], [0, -1, -1, -1]], [3, 0], [7, 0]], impl


@pytest.mark.parametrize("seed", range(6))
def test_verify_stochastic_random_triton_equals_torch(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    k, steps, d, bs, vocab = [(2, 3, 6, 4, 3), (3, 3, 8, 4, 5), (1, 5, 6, 3, 2)][seed % 3]
    source = arbitrary_kept if seed >= 3 and k > 1 else draft_from_scores
    kept_flat, kept_tokens, beam_flat = source(bs, k, steps, d, gen, vocab)
    tree = build_tree(t([0] * bs), kept_flat, kept_tokens, beam_flat, t([5] * bs), topk=k, num_steps=steps)
    for trial in range(4):
        # Coarse probabilities (multiples of 1/8, some zero) and coins on the same grid make exact
        # ties between u and acc frequent.
        probs = torch.randint(0, 3, (bs, d, vocab), generator=gen).to(torch.float64)
        probs = (probs / probs.sum(-1, keepdim=True).clamp(min=1)).to(DEV)
        coins = (torch.randint(0, 8, (bs, d), generator=gen) / 8).to(torch.float64).to(DEV)
        final = torch.rand(bs, generator=gen, dtype=torch.float64).to(DEV)
        a = verify_stochastic(tree, probs, coins, final, num_steps=steps, impl="torch")
        b = verify_stochastic(tree, probs, coins, final, num_steps=steps, impl="triton")
        for x, y, what in zip(a, b, ("accept_nodes", "num_correct", "bonus")):
            assert torch.equal(x, y), f"trial {trial} {what}: torch {x.tolist()} triton {y.tolist()}"
        for r in range(bs):                  # an accepted path is a parent chain from the root
            path = [j for j in a[0][r].tolist() if j >= 0]
            assert path[0] == 0 and len(path) == a[1][r].item() + 1
            assert all(tree.parents[r, ch].item() == par for par, ch in zip(path, path[1:]))


# --------------------------------------------------------------------------------------------
# target_predict (the tie contract)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn,
                                   torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz])
def test_target_predict_first_max(dtype):
    logits = torch.tensor([[[1.0, 3.0, 3.0, 2.0], [4.0, 4.0, 4.0, 4.0]],
                           [[-1.0, -2.0, -1.0, -8.0], [0.0, 0.5, 2.0, 2.0]]]).to(dtype)
    assert target_predict(logits.to(DEV)).tolist() == [[1, 0], [0, 2]]
    assert target_predict(logits.to(DEV)).dtype == torch.int64


# --------------------------------------------------------------------------------------------
# Validation


def ab_args(**override):
    a = {k: t(v) for k, v in CASE_AB["args"].items()}
    a.update(override)
    return a


BUILD_ERRORS = {
    "kept_flat dtype": (dict(kept_flat=t([[0, 1, 4, 6], [0, 2, 3, 6]], torch.int32)), {}, "kept_flat"),
    "kept_tokens shape": (dict(kept_tokens=t([[11, 12, 13], [21, 22, 23]])), {}, "kept_tokens"),
    "root_tokens shape": (dict(root_tokens=t([1, 2, 3])), {}, "root_tokens"),
    "beam_flat shape": (dict(beam_flat=t([[[0, 1]], [[0, 1]]])), {}, "beam_flat"),
    "seq_lens device": (dict(seq_lens=torch.tensor([7, 3], device="meta")), {}, "seq_lens"),
    "kept_flat range": (dict(kept_flat=t([[0, 1, 4, 10], [0, 2, 3, 6]])), {}, "kept_flat"),
    "kept_flat negative": (dict(kept_flat=t([[-1, 1, 4, 6], [0, 2, 3, 6]])), {}, "kept_flat"),
    "kept_flat order": (dict(kept_flat=t([[0, 4, 1, 6], [0, 2, 3, 6]])), {}, "kept_flat"),
    "kept_flat duplicate": (dict(kept_flat=t([[0, 1, 1, 6], [0, 2, 3, 6]])), {}, "kept_flat"),
    "beam step 0": (dict(beam_flat=t([[[1, 0], [4, 2]], [[0, 1], [4, 2]]])), {}, "beam_flat"),
    "beam range": (dict(beam_flat=t([[[0, 1], [6, 2]], [[0, 1], [4, 2]]])), {}, "beam_flat"),
    "too many kept": ({}, dict(num_steps=1), "kept_flat"),
    "topk": ({}, dict(topk=0), "topk"),
    "num_steps": ({}, dict(num_steps=0), "num_steps"),
    "impl": ({}, dict(impl="cuda"), "impl"),
}


@pytest.mark.parametrize("name", list(BUILD_ERRORS))
def test_build_tree_errors(name):
    override, kwargs, word = BUILD_ERRORS[name]
    kw = dict(topk=2, num_steps=3)
    kw.update(kwargs)
    a = ab_args(**override)
    if "num_steps" in kwargs and kwargs["num_steps"] == 1:
        a["beam_flat"] = torch.empty((2, 0, 2), dtype=torch.int64, device=DEV)
    with pytest.raises(ValueError, match=word):
        build_tree(**a, **kw)


def test_build_tree_topk1_needs_chain_width():
    with pytest.raises(ValueError, match="topk == 1"):
        build_tree(t([0]), t([[0, 1]]), t([[5, 6]]), t([[[0], [1]]]), t([0]), topk=1, num_steps=3)


def test_verify_errors():
    tree = build(CASE_AB)
    with pytest.raises(ValueError, match="target_predict"):
        verify_greedy(tree, t([[1, 2, 3, 4]] * 2), num_steps=3)
    with pytest.raises(ValueError, match="target_predict"):
        verify_greedy(tree, t([[1, 2, 3, 4, 5]] * 2, torch.int32), num_steps=3)
    with pytest.raises(ValueError, match="num_steps"):
        verify_greedy(tree, t([[1, 2, 3, 4, 5]] * 2), num_steps=0)
    with pytest.raises(ValueError, match="tree"):
        verify_greedy("tree", t([[1, 2, 3, 4, 5]] * 2), num_steps=3)
    probs = torch.full((2, 5, 32), 1 / 32, dtype=torch.float64, device=DEV)
    coins, final = f64([[0.5] * 5] * 2), f64([0.5, 0.5])
    verify_stochastic(tree, probs, coins, final, num_steps=3)                 # well-formed: no error
    with pytest.raises(ValueError, match="target_probs"):
        verify_stochastic(tree, probs.float(), coins, final, num_steps=3)
    with pytest.raises(ValueError, match="coins"):
        verify_stochastic(tree, probs, f64([[0.5] * 5, [0.5, 0.5, 1.0, 0.5, 0.5]]), final, num_steps=3)
    with pytest.raises(ValueError, match="final"):
        verify_stochastic(tree, probs, coins, f64([0.5, -0.1]), num_steps=3)
    with pytest.raises(ValueError, match="tokens"):                         # token 11.. >= V = 8
        verify_stochastic(tree, probs[:, :, :8].contiguous(), coins, final, num_steps=3)
    with pytest.raises(ValueError, match="logits"):
        target_predict(torch.zeros((2, 5), device=DEV))
    with pytest.raises(ValueError, match="registry"):
        target_predict(torch.zeros((2, 5, 3), dtype=torch.int32, device=DEV))


def test_triton_without_interpreter_is_a_clear_error():
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        check_launchable(object(), torch.device("cpu"))
    if torch.cuda.is_available() and type(tree_mod._build_tree_kernel).__name__ != "InterpretedFunction":
        a = {k: v.cpu() for k, v in ab_args().items()}
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
            build_tree(**a, topk=2, num_steps=3, impl="triton")


# --------------------------------------------------------------------------------------------
# CUDA graphs: capture once, replay on new inputs, equal to eager


@pytest.mark.cuda
def test_cuda_graph_replay_equals_eager():
    gen = torch.Generator().manual_seed(7)
    bs, k, steps, d, vocab = 4, 3, 4, 11, 6

    def fresh():
        kept_flat, kept_tokens, beam_flat = draft_from_scores(bs, k, steps, d, gen, vocab)
        return dict(root=torch.randint(0, vocab, (bs,), generator=gen).to(DEV), kept_flat=kept_flat,
                    kept_tokens=kept_tokens, beam_flat=beam_flat,
                    seq_lens=torch.randint(0, 30, (bs,), generator=gen).to(DEV),
                    predict=torch.randint(0, vocab, (bs, d), generator=gen).to(DEV),
                    probs=torch.softmax(torch.randn(bs, d, vocab, generator=gen, dtype=torch.float64), -1).to(DEV),
                    coins=torch.rand(bs, d, generator=gen, dtype=torch.float64).to(DEV),
                    final=torch.rand(bs, generator=gen, dtype=torch.float64).to(DEV))

    def step(x):
        tree = build_tree(x["root"], x["kept_flat"], x["kept_tokens"], x["beam_flat"], x["seq_lens"],
                          topk=k, num_steps=steps, impl="triton")
        torch_tree = build_tree(x["root"], x["kept_flat"], x["kept_tokens"], x["beam_flat"], x["seq_lens"],
                                topk=k, num_steps=steps, impl="torch")
        outs = [getattr(tree, n) for n in ("tokens", "parents", "positions", "mask", "first_child",
                                           "next_sibling", "flat_index")]
        outs += [getattr(torch_tree, n) for n in ("parents", "positions", "mask")]
        outs += list(verify_greedy(tree, x["predict"], num_steps=steps, impl="triton"))
        outs += list(verify_greedy(tree, x["predict"], num_steps=steps, impl="torch"))
        outs += list(verify_stochastic(tree, x["probs"], x["coins"], x["final"], num_steps=steps, impl="triton"))
        outs += list(verify_stochastic(tree, x["probs"], x["coins"], x["final"], num_steps=steps, impl="torch"))
        return outs

    static = fresh()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(static)
    for trial in range(3):
        new = fresh()
        for name, value in new.items():
            static[name].copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        eager = step(new)
        for i, (a, b) in enumerate(zip(captured, eager)):
            assert torch.equal(a, b), f"trial {trial}: output {i} differs between replay and eager"


@pytest.mark.parametrize("k", [2, 3])
def test_a_one_step_tree_has_no_beam_rows(k):
    """S = 1: the tree is the root and its k children, there is no beam step to record, so the
    search returns an empty [bs, 0, k] beam table (the device state's shape for S = 1), the
    children in flat order and their tokens (found by the first generated-mutant campaign)."""
    from specverify.spec.eagle import finish_search, start_search

    p0 = torch.tensor([[0.5, 0.3, 0.2][:k], [0.6, 0.25, 0.15][:k]])
    idx0 = torch.tensor([[7, 3, 9][:k], [1, 2, 4][:k]])
    kept_flat, kept_tokens, beam_flat = finish_search(start_search(p0, idx0, 1), k + 1)
    assert beam_flat.shape == (2, 0, k) and beam_flat.dtype == torch.int64
    assert kept_flat.tolist() == [list(range(k))] * 2
    assert kept_tokens.tolist() == idx0.tolist()


def test_stochastic_verify_refuses_probs_that_are_not_a_tensor():
    tree = chain_tree(torch.tensor([5]), torch.tensor([[1, 2]]), torch.tensor([3]))
    coins = torch.zeros((1, 3), dtype=torch.float64)
    with pytest.raises(ValueError, match=r"target_probs must be a 3-D tensor \[bs, D, V\]"):
        verify_stochastic(tree, [[[0.5, 0.5]] * 3], coins, torch.zeros(1, dtype=torch.float64), num_steps=2)
