"""reference.spec (docs/semantics.md, section 6) against hand-built facts, independent of specverify.

Trees, masks and links are derived on paper in the comments beside each case; stochastic verify
is proved lossless by exact enumeration (first_token_distribution / emitted_path_probability)
and checked by a seeded Monte Carlo chi-square test.
Re-run one test: python -m pytest tests/test_reference_spec.py -q -p no:cacheprovider -k NAME
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from specverify.conformance.stats import chi_square_pvalue, upper_gamma_q  # noqa: F401
from hypothesis import given, settings
from hypothesis import strategies as st

import reference
from reference.logits import greedy_token
from reference.spec import (
    build_tree,
    children_of,
    emitted_path_probability,
    first_token_distribution,
    greedy_verify,
    select_draft_topk,
    stochastic_verify,
    topk_order,
)

# Seeded (derandomized); the number of examples comes from the loaded hypothesis profile.
SETTINGS = settings(deadline=None, derandomize=True)
T, F = True, False


def below(x: float) -> float:
    """The largest float64 below x."""
    return float(np.nextafter(x, -np.inf))


# ---------------------------------------------------------------------------------------------
# 6.1 topk order and draft selection


def test_topk_order_value_descending_index_ascending():
    values = np.array([1.0, 3.0, 3.0, 2.0, 3.0, 2.0], dtype=np.float32)
    assert topk_order(values, 1) == [1]
    assert topk_order(values, 3) == [1, 2, 4]
    assert topk_order(values, 6) == [1, 2, 4, 3, 5, 0]


def test_topk_order_signed_zero_ties_and_infinities():
    values = np.array([-np.inf, -0.0, 0.0, np.inf, -0.0, np.inf], dtype=np.float32)
    assert topk_order(values, 6) == [3, 5, 1, 2, 4, 0]  # -0.0 == +0.0: a tie, broken by index


def test_topk_order_ranks_nan_first_like_greedy_token():
    values = np.array([1.0, np.nan, 5.0, np.nan], dtype=np.float32)
    assert topk_order(values, 4) == [1, 3, 2, 0]
    assert topk_order(values, 1)[0] == greedy_token(values)


@pytest.mark.parametrize("k", [0, 4, 1.0, True])
def test_topk_order_rejects_bad_k(k):
    with pytest.raises(ValueError, match="k: must be an int in"):
        topk_order([1.0, 2.0, 3.0], k)


def test_select_draft_topk_orders_by_upcast_and_softmaxes_dequant():
    upcast = np.array([1.0, 2.0, 2.0, 0.5], dtype=np.float32)
    dequant = upcast.astype(np.float64) * 0.25  # an FP8-like scale
    p, index = select_draft_topk(upcast, 3, dequant)
    assert index == [1, 2, 0]
    e = [math.exp(0.25 * x) for x in (1.0, 2.0, 2.0, 0.5)]
    assert p == pytest.approx([e[1] / sum(e), e[2] / sum(e), e[0] / sum(e)], rel=1e-14)
    p_all, _ = select_draft_topk(upcast, 4, dequant)
    assert sum(p_all) == pytest.approx(1.0, abs=1e-15)


def test_select_draft_topk_topk1_is_greedy_token():
    upcast = np.array([0.0, 7.0, -1.0, 7.0], dtype=np.float32)
    _p, index = select_draft_topk(upcast, 1, upcast.astype(np.float64))
    assert index == [greedy_token(upcast)] == [1]


# ---------------------------------------------------------------------------------------------
# 6.2 draft tree


def dists(*steps) -> list[np.ndarray]:
    """step_dists from nested lists: steps[i] is [bs][beams_i][V]."""
    return [np.array(s, dtype=np.float32) for s in steps]


# Two requests, k = 2, S = 2, V = 5.
#
# Request 0.  step 0: [.1 .5 .05 .3 .05] -> top-2 tokens 1 (.5), 3 (.3): flat 0 (tok 1, .5), flat 1 (tok 3, .3).
#   step 1, row 0 = beam flat 0: [.6 0 .2 .2 0] -> tok 0 (.6), then the .2 tie: tok 2 (index asc) ->
#     flat 2 (tok 0, .5*.6 = .3 exactly the float32 .3: halving is exact), flat 3 (tok 2, .1);
#   row 1 = beam flat 1: [.25 .25 .25 .25 0] -> tok 0, tok 1 -> flat 4 (tok 0, .075), flat 5 (tok 1, .075).
#   scores by flat: [.5 .3 .3 .1 .075 .075]. D = 4 keeps the 3 best: flat 0, flat 1 (the .3 tie: flat 1 < 2), flat 2.
#   nodes: 1 = flat 0 (tok 1, parent root), 2 = flat 1 (tok 3, root),
#   3 = flat 2 (tok 0, parent beam 0 of step 0 = flat 0 = node 1).
#   parents [-1 0 0 1]; L = 7: positions [7 8 8 9]; root's children 1, 2; node 1's child 3.
# Request 1.  step 0: [.5 .4 .05 .05 0] -> flat 0 (tok 0, .5), flat 1 (tok 1, .4).
#   row 0: [.1 .1 .1 .1 .6] -> tok 4 (.6), tok 0 (.1, the .1 tie) -> flat 2 (.3), flat 3 (.05);
#   row 1: [0 0 .9 .1 0] -> tok 2, tok 3 -> flat 4 (.36), flat 5 (.04).
#   the 3 best: flat 0 (.5), flat 1 (.4), flat 4 (.36) -> nodes 1 = flat 0 (tok 0, root), 2 = flat 1 (tok 1, root),
#   3 = flat 4 (tok 2, beam 1 of step 0 = flat 1 = node 2). parents [-1 0 0 2]; L = 3: positions [3 4 4 5].
TWO_STEP = dists(
    [[[0.1, 0.5, 0.05, 0.3, 0.05]], [[0.5, 0.4, 0.05, 0.05, 0.0]]],
    [[[0.6, 0.0, 0.2, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25, 0.0]],
     [[0.1, 0.1, 0.1, 0.1, 0.6], [0.0, 0.0, 0.9, 0.1, 0.0]]],
)


def test_build_tree_two_steps_k2():
    t0, t1 = build_tree(TWO_STEP, [11, 12], [7, 3], topk=2, num_steps=2, num_draft_tokens=4)

    assert t0.kept_flat == [0, 1, 2]
    assert t0.beam_flat == [[0, 1]]
    assert t0.tokens == [11, 1, 3, 0]
    assert t0.parents == [-1, 0, 0, 1]
    assert t0.positions == [7, 8, 8, 9]
    assert t0.mask == [[T, F, F, F],
                       [T, T, F, F],
                       [T, F, T, F],
                       [T, T, F, T]]
    assert t0.first_child == [1, 3, -1, -1]
    assert t0.next_sibling == [-1, 2, -1, -1]
    assert t0.flat_index == [0, 1, 2, 3]

    assert t1.kept_flat == [0, 1, 4]
    assert t1.tokens == [12, 0, 1, 2]
    assert t1.parents == [-1, 0, 0, 2]
    assert t1.positions == [3, 4, 4, 5]
    assert t1.mask == [[T, F, F, F],
                       [T, T, F, F],
                       [T, F, T, F],
                       [T, F, T, T]]
    assert t1.first_child == [1, -1, 3, -1]
    assert t1.next_sibling == [-1, 2, -1, -1]
    assert t1.flat_index == [4, 5, 6, 7]


def test_build_tree_two_steps_k2_one_more_node():
    # Request 0 with D = 5 also keeps flat 3 (tok 2, .1, parent flat 0 = node 1) as node 4:
    # node 1's children are 3, 4 (ascending), so next_sibling[3] = 4.
    t0 = build_tree(TWO_STEP, [11, 12], [7, 3], topk=2, num_steps=2, num_draft_tokens=5)[0]
    assert t0.kept_flat == [0, 1, 2, 3]
    assert t0.tokens == [11, 1, 3, 0, 2]
    assert t0.parents == [-1, 0, 0, 1, 1]
    assert t0.positions == [7, 8, 8, 9, 9]
    assert t0.mask[4] == [T, T, F, F, T]
    assert t0.first_child == [1, 3, -1, -1, -1]
    assert t0.next_sibling == [-1, 2, -1, 4, -1]


def test_build_tree_three_steps_rows_follow_beam_rank_not_flat_order():
    # k = 2, S = 3, V = 4, D = 7, L = 10.
    # step 0: [.6 .4 0 0] -> flat 0 (tok 0, .6), flat 1 (tok 1, .4).
    # step 1: row 0 (flat 0): [0 0 .5 .5] -> flat 2 (tok 2, .3), flat 3 (tok 3, .3), an exact tie;
    #         row 1 (flat 1): [1 0 0 0]   -> flat 4 (tok 0, .4), flat 5 (tok 1, 0: the 0-tie, index asc).
    #   beams of step 1 by (score desc, flat asc): flat 4 (.4), flat 2 (.3, before flat 3) -> beam_flat [4, 2].
    # step 2: row 0 is beam 0 = flat 4: [.1 .2 .3 .4] -> flat 6 (tok 3, .16), flat 7 (tok 2, .12);
    #         row 1 is beam 1 = flat 2: [.9 .1 0 0]   -> flat 8 (tok 0, .27), flat 9 (tok 1, .03).
    # scores by flat: [.6 .4 .3 .3 .4 0 .16 .12 .27 .03]; the 6 best: flat 0, 1, 4 (the .4 tie: 1 < 4), 2, 3, 8.
    # nodes by flat: 1 = f0 (tok 0, root), 2 = f1 (tok 1, root), 3 = f2 (tok 2, parent f0 = node 1),
    #   4 = f3 (tok 3, node 1), 5 = f4 (tok 0, parent f1 = node 2), 6 = f8 (tok 0, parent f2 = node 3).
    steps = dists(
        [[[0.6, 0.4, 0.0, 0.0]]],
        [[[0.0, 0.0, 0.5, 0.5], [1.0, 0.0, 0.0, 0.0]]],
        [[[0.1, 0.2, 0.3, 0.4], [0.9, 0.1, 0.0, 0.0]]],
    )
    (t,) = build_tree(steps, [3], [10], topk=2, num_steps=3, num_draft_tokens=7)
    assert t.beam_flat == [[0, 1], [4, 2]]
    assert t.kept_flat == [0, 1, 2, 3, 4, 8]
    assert t.tokens == [3, 0, 1, 2, 3, 0, 0]
    assert t.parents == [-1, 0, 0, 1, 1, 2, 3]
    assert t.positions == [10, 11, 11, 12, 12, 12, 13]
    assert t.mask == [[T, F, F, F, F, F, F],
                      [T, T, F, F, F, F, F],
                      [T, F, T, F, F, F, F],
                      [T, T, F, T, F, F, F],
                      [T, T, F, F, T, F, F],
                      [T, F, T, F, F, T, F],
                      [T, T, F, T, F, F, T]]
    assert t.first_child == [1, 3, 5, 6, -1, -1, -1]
    assert t.next_sibling == [-1, 2, -1, 4, -1, -1, -1]
    assert t.flat_index == list(range(7))


def test_build_tree_orphan_from_a_child_outscoring_its_parent():
    # With normalized distributions a child never outranks its parent (its score is <= the
    # parent's and its flat index is larger). An unnormalized row (4.0) makes one do so:
    # step 0: [.5 .3 .2] -> flat 0 (tok 0, .5), flat 1 (tok 1, .3);
    # step 1: row 0: [.1 .1 .1] -> flat 2, 3 (.05); row 1: [4 0 0] -> flat 4 (tok 0, 1.2), flat 5 (tok 1, 0).
    # D = 3 keeps the 2 best: flat 4 (1.2), flat 0 (.5); sorted [0, 4]. Node 2 = flat 4: its parent
    # beam flat 1 was not kept -> orphan: parent -1, position L + 1, sees the root and itself, no links.
    steps = dists([[[0.5, 0.3, 0.2]]], [[[0.1, 0.1, 0.1], [4.0, 0.0, 0.0]]])
    (t,) = build_tree(steps, [2], [5], topk=2, num_steps=2, num_draft_tokens=3)
    assert t.kept_flat == [0, 4]
    assert t.tokens == [2, 0, 0]
    assert t.parents == [-1, 0, -1]
    assert t.positions == [5, 6, 6]
    assert t.mask == [[T, F, F], [T, T, F], [T, F, T]]
    assert t.first_child == [1, -1, -1]
    assert t.next_sibling == [-1, -1, -1]


def test_build_tree_topk1_is_a_chain():
    # k = 1, S = 3, D = 4: every step's argmax (first maximal index: the .4 tie gives token 0).
    steps = dists([[[0.4, 0.4, 0.2]], [[0.1, 0.1, 0.8]]],
                  [[[0.2, 0.7, 0.1]], [[0.5, 0.25, 0.25]]],
                  [[[0.3, 0.3, 0.4]], [[0.0, 1.0, 0.0]]])
    t0, t1 = build_tree(steps, [1, 2], [4, 0], topk=1, num_steps=3, num_draft_tokens=4)
    assert t0.tokens == [1, 0, 1, 2]
    assert t1.tokens == [2, 2, 0, 1]
    for t, L in ((t0, 4), (t1, 0)):
        assert t.parents == [-1, 0, 1, 2]
        assert t.positions == [L, L + 1, L + 2, L + 3]
        assert t.mask == [[j <= i for j in range(4)] for i in range(4)]
        assert t.first_child == [1, 2, 3, -1]
        assert t.next_sibling == [-1, -1, -1, -1]
    assert t1.flat_index == [4, 5, 6, 7]


@pytest.mark.parametrize(
    "steps_shape, kwargs, match",
    [
        ([(1, 1, 5), (1, 2, 5)], dict(topk=2, num_steps=2, num_draft_tokens=8),
         r"num_draft_tokens: D - 1 = 7 exceeds .* = 6"),
        ([(1, 1, 5), (1, 1, 5), (1, 1, 5)], dict(topk=1, num_steps=3, num_draft_tokens=3),
         r"num_draft_tokens: topk == 1 requires num_draft_tokens == num_steps \+ 1 = 4"),
        ([(1, 1, 5)], dict(topk=2, num_steps=2, num_draft_tokens=3), r"step_dists: expected num_steps = 2"),
        ([(1, 1, 5), (1, 3, 5)], dict(topk=2, num_steps=2, num_draft_tokens=3), r"step_dists\[1\]: expected shape"),
        ([(1, 1, 2), (1, 3, 2)], dict(topk=3, num_steps=2, num_draft_tokens=3), r"topk: must be <= vocab size V = 2"),
        ([(1, 1, 5)], dict(topk=0, num_steps=1, num_draft_tokens=2), r"topk: must be an int >= 1"),
        ([(1, 1, 5)], dict(topk=2, num_steps=1, num_draft_tokens=1), r"num_draft_tokens: must be an int >= 2"),
    ],
)
def test_build_tree_rejects_bad_arguments(steps_shape, kwargs, match):
    steps = [np.full(shape, 0.2, dtype=np.float32) for shape in steps_shape]
    with pytest.raises(ValueError, match=match):
        build_tree(steps, [0], [0], **kwargs)


def test_build_tree_rejects_float64_distributions_and_bad_batch_lists():
    steps = [np.full((2, 1, 4), 0.25)]
    with pytest.raises(ValueError, match=r"step_dists\[0\]: expected float32"):
        build_tree(steps, [0, 0], [0, 0], topk=1, num_steps=1, num_draft_tokens=2)
    steps = [np.full((2, 1, 4), 0.25, dtype=np.float32)]
    with pytest.raises(ValueError, match=r"seq_lens: expected bs = 2"):
        build_tree(steps, [0, 0], [0], topk=1, num_steps=1, num_draft_tokens=2)


# ---------------------------------------------------------------------------------------------
# 6.3 greedy verify
#
# The tree of the three-step case: tokens [3 0 1 2 3 0 0], parents [-1 0 0 1 1 2 3], S = 3.
# children: root -> 1 (tok 0), 2 (tok 1); node 1 -> 3 (tok 2), 4 (tok 3); node 2 -> 5 (tok 0); node 3 -> 6 (tok 0).
TREE_TOKENS = [3, 0, 1, 2, 3, 0, 0]
TREE_PARENTS = [-1, 0, 0, 1, 1, 2, 3]


def rows_with_argmax(predict: list[int], V: int) -> np.ndarray:
    """[D, V] float32 rows whose greedy token is predict[j] (the other entries tie at 0)."""
    rows = np.zeros((len(predict), V), dtype=np.float32)
    for j, t in enumerate(predict):
        rows[j, t] = 1.0
    return rows


@pytest.mark.parametrize(
    "predict, expected",
    [
        ([0, 2, 3, 0, 3, 3, 1], ([0, 1, 3, 6], 3, 1)),  # all S accepted: 0 -> 1 -> 3 -> 6, bonus predict[6]
        ([2, 2, 3, 0, 3, 3, 1], ([0, -1, -1, -1], 0, 2)),  # root predicts 2: no root child has it
        ([0, 1, 3, 0, 3, 3, 1], ([0, 1, -1, -1], 1, 1)),  # mismatch below node 1 (children tok 2, 3)
        ([1, 2, 0, 0, 3, 3, 1], ([0, 2, 5, -1], 2, 3)),  # the root's second child, then its leaf child 5
        ([0, 3, 3, 0, 2, 3, 1], ([0, 1, 4, -1], 2, 2)),  # node 1's second child 4 (a leaf), bonus predict[4]
    ],
    ids=["perfect", "first-mismatch", "mid-mismatch", "second-sibling-root", "second-sibling-depth2"],
)
def test_greedy_verify_walks(predict, expected):
    nodes, n, bonus = expected
    assert greedy_verify(TREE_TOKENS, TREE_PARENTS, rows_with_argmax(predict, 4), num_steps=3) == (nodes, n, bonus)


def test_greedy_verify_uses_the_first_maximal_index():
    rows = rows_with_argmax([0, 0, 0, 0, 0, 0, 0], 4)
    rows[0] = [0.5, 2.0, 2.0, 1.0]  # tie between tokens 1 and 2: token 1 -> node 2
    assert greedy_verify(TREE_TOKENS, TREE_PARENTS, rows, num_steps=3) == ([0, 2, 5, -1], 2, 0)


def test_greedy_verify_stops_at_depth_S():
    tokens, parents = [0, 1, 2, 3, 0], [-1, 0, 1, 2, 3]  # a chain deeper than S = 2
    rows = rows_with_argmax([1, 2, 3, 0, 1], 4)  # every node matches
    assert greedy_verify(tokens, parents, rows, num_steps=2) == ([0, 1, 2], 2, 3)
    assert greedy_verify(tokens, parents, rows, num_steps=4) == ([0, 1, 2, 3, 4], 4, 1)


def test_greedy_verify_never_accepts_an_orphan():
    # node 2 (tok 2) is an orphan and node 3 its child: neither is anybody's accepted child.
    tokens, parents = [0, 1, 2, 3], [-1, 0, -1, 2]
    assert children_of(parents) == [[1], [], [3], []]
    assert greedy_verify(tokens, parents, rows_with_argmax([2, 0, 3, 0], 4), num_steps=2) == ([0, -1, -1], 0, 2)
    assert greedy_verify(tokens, parents, rows_with_argmax([1, 3, 3, 0], 4), num_steps=2) == ([0, 1, -1], 1, 3)


def test_greedy_verify_rejects_a_bad_tree():
    with pytest.raises(ValueError, match="parents: node 0 is the root"):
        greedy_verify([0, 1], [0, 0], rows_with_argmax([0, 0], 2), num_steps=1)
    with pytest.raises(ValueError, match=r"parents\[1\]: must be -1 or another node"):
        greedy_verify([0, 1], [-1, 5], rows_with_argmax([0, 0], 2), num_steps=1)
    with pytest.raises(ValueError, match=r"target_upcast: expected shape \[D=2"):
        greedy_verify([0, 1], [-1, 0], rows_with_argmax([0], 2), num_steps=1)


# ---------------------------------------------------------------------------------------------
# 6.4 stochastic verify, by hand
#
# tokens [3 0 1 2], parents [-1 0 0 1], S = 2: root -> 1 (tok 0), 2 (tok 1); node 1 -> 3 (tok 2).
# Dyadic probabilities, so every cumulative boundary is exact:
#   root: acc after node 1 = P0[0] = .25, after node 2 = .25 + P0[1] = .75; residual [0 0 .125 .125].
#   node 1: acc after node 3 = P1[2] = .5; residual [.5 0 0 0].
S_TOKENS = [3, 0, 1, 2]
S_PARENTS = [-1, 0, 0, 1]
S_PROBS = [
    [0.25, 0.5, 0.125, 0.125],
    [0.5, 0.0, 0.5, 0.0],
    [0.5, 0.25, 0.125, 0.125],
    [0.125, 0.125, 0.25, 0.5],
]


def sverify(u0, u1=0.0, u2=0.0, u3=0.0, final=0.0):
    return stochastic_verify(S_TOKENS, S_PARENTS, S_PROBS, [u0, u1, u2, u3], final, num_steps=2)


def test_stochastic_verify_cumulative_boundaries_are_strict():
    assert sverify(0.0)[0][1] == 1
    assert sverify(below(0.25))[0][1] == 1  # just below .25: node 1
    assert sverify(0.25)[0][1] == 2  # at .25: u < acc fails for node 1; node 2 (acc .75)
    assert sverify(below(0.75))[0][1] == 2
    assert sverify(0.75)[0][1] == -1  # at .75: no child; bonus from the root's residual
    assert sverify(0.99)[0][1] == -1


def test_stochastic_verify_accepts_to_depth_S_then_draws_from_the_full_target():
    # u0 < .25 -> node 1; coins[1] = .4 < .5 -> node 3 (depth 2 = S); bonus from the whole row 3
    # [.125 .125 .25 .5] with final .2: cumsum .125, .25 > .2 -> token 1.
    assert sverify(0.1, u1=0.4, final=0.2) == ([0, 1, 3], 2, 1)
    assert sverify(0.1, u1=0.4, final=below(0.5)) == ([0, 1, 3], 2, 2)
    assert sverify(0.1, u1=0.4, final=0.5) == ([0, 1, 3], 2, 3)  # cumsum .5 is not > .5


def test_stochastic_verify_leaf_bonus_uses_its_own_full_row():
    # u0 = .25 rejects node 1 (tok 0) and accepts node 2, a leaf at depth 1 < S. The bonus comes
    # from row 2 unchanged: token 0 (rejected at the root) keeps its .5 there.
    assert sverify(0.25, final=0.1) == ([0, 2, -1], 1, 0)
    assert sverify(0.25, final=0.6) == ([0, 2, -1], 1, 1)


def test_stochastic_verify_residual_after_rejections():
    # At the root: both children rejected; residual [0 0 .125 .125], sum .25, threshold final * .25.
    assert sverify(0.8, final=below(0.5)) == ([0, -1, -1], 0, 2)
    assert sverify(0.8, final=0.5) == ([0, -1, -1], 0, 3)  # .125 is not > .125
    assert sverify(0.8, final=below(1.0)) == ([0, -1, -1], 0, 3)
    # At node 1: coins[1] = .5 rejects node 3 (tok 2, acc .5); residual [.5 0 0 0] -> token 0 always.
    assert sverify(0.1, u1=0.5, final=0.0) == ([0, 1, -1], 1, 0)
    assert sverify(0.1, u1=0.5, final=below(1.0)) == ([0, 1, -1], 1, 0)


def test_stochastic_verify_uses_the_coin_of_the_accepted_node():
    # The three-step tree, uniform rows over V = 4. u0 = .3 rejects node 1 (tok 0, acc .25) and
    # accepts node 2 (tok 1, acc .5). Node 2's child is node 5 (tok 0, acc .25): its coin is
    # coins[2] (node 2's index), not coins[1] (the depth). coins[2] = .1 accepts node 5 (a leaf).
    probs = [[0.25] * 4] * len(TREE_TOKENS)
    coins = [0.3, 0.9, 0.1, 0.9, 0.9, 0.9, 0.9]
    assert stochastic_verify(TREE_TOKENS, TREE_PARENTS, probs, coins, 0.0, num_steps=3) == ([0, 2, 5, -1], 2, 0)
    coins = [0.3, 0.1, 0.9, 0.9, 0.9, 0.9, 0.9]  # now node 2's coin rejects node 5: bonus from [.25 0 .25 .25]
    assert stochastic_verify(TREE_TOKENS, TREE_PARENTS, probs, coins, 0.0, num_steps=3) == ([0, 2, -1, -1], 1, 1)


def test_stochastic_verify_orphans_are_never_accepted():
    # node 2 (tok 2) is an orphan, node 3 its child; the root's only child is node 1 (tok 1).
    tokens, parents = [0, 1, 2, 3], [-1, 0, -1, 2]
    probs = [[0.0, 0.5, 0.5, 0.0], [0.25] * 4, [0.25] * 4, [0.25] * 4]
    for u0 in np.linspace(0.0, below(1.0), 41):
        nodes, n, bonus = stochastic_verify(tokens, parents, probs, [u0, 0.1, 0.0, 0.0], 0.3, num_steps=2)
        assert 2 not in nodes and 3 not in nodes
        if u0 >= 0.5:
            assert (nodes, n, bonus) == ([0, -1, -1], 0, 2)  # the orphan's token comes only as a bonus


def test_stochastic_verify_rejects_bad_uniforms_and_empty_residuals():
    with pytest.raises(ValueError, match="final: a uniform must be in"):
        sverify(0.1, final=1.0)
    with pytest.raises(ValueError, match=r"coins\[0\]: a uniform must be in"):
        sverify(-0.5)
    # children cover all the mass, but the row sums to .5 < u: nothing left to draw
    with pytest.raises(ValueError, match="the residual at node 0 has no positive mass"):
        stochastic_verify([0, 1], [-1, 0], [[0.0, 0.5], [0.5, 0.5]], [0.7, 0.0], 0.5, num_steps=1)


# ---------------------------------------------------------------------------------------------
# losslessness, exactly


def random_case(seed: int):
    """A random tree (distinct sibling tokens, some orphans, depth <= S) with target rows."""
    rng = np.random.default_rng(seed)
    V = int(rng.integers(2, 7))
    S = int(rng.integers(1, 4))
    D = int(rng.integers(2, 9))
    tokens, parents, depth = [int(rng.integers(V))], [-1], [0]
    for j in range(1, D):
        hosts = [n for n in range(j) if depth[n] < S]
        parent = int(rng.choice(hosts)) if rng.random() > 0.15 else -1
        used = {tokens[c] for c in range(1, j) if parents[c] == parent} if parent != -1 else set()
        free = [t for t in range(V) if t not in used]
        if not free:
            parent, free = -1, list(range(V))
        tokens.append(int(rng.choice(free)))
        parents.append(parent)
        depth.append(1 if parent == -1 else depth[parent] + 1)
    probs = []
    for _ in range(D):
        row = rng.dirichlet(np.ones(V))
        row = row * (rng.random(V) < 0.75)
        if row.sum() == 0:
            row[int(rng.integers(V))] = 1.0
        probs.append([float(x) for x in row / row.sum()])
    return tokens, parents, probs, S


def reachable_paths(tokens, parents, S):
    """{node: its accepted-token path from the root} for every node verify can reach (depth <= S)."""
    children = children_of(parents)
    paths = {0: []}
    frontier = [0]
    while frontier:
        n = frontier.pop()
        if len(paths[n]) < S:
            for c in children[n]:
                paths[c] = paths[n] + [tokens[c]]
                frontier.append(c)
    return paths


@given(seed=st.integers(0, 2**32 - 1))
@SETTINGS
def test_first_token_distribution_is_the_target(seed):
    tokens, parents, probs, _S = random_case(seed)
    assert first_token_distribution(tokens, parents, probs) == pytest.approx(probs[0], abs=1e-12)


@given(seed=st.integers(0, 2**32 - 1))
@SETTINGS
def test_every_emitted_prefix_has_its_target_probability(seed):
    # Target-only sampling emits path(j) + [t] with probability prod(path) * P_j[t] for every
    # reachable node j; the speculative step must give that prefix the same total mass.
    tokens, parents, probs, S = random_case(seed)
    V = len(probs[0])
    paths = reachable_paths(tokens, parents, S)
    law = {}
    for path in paths.values():  # every emission of nonzero probability is a node's path + a bonus
        for t in range(V):
            e = tuple(path + [t])
            law[e] = emitted_path_probability(tokens, parents, probs, list(e), num_steps=S)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    for j, path in paths.items():
        reach = 1.0
        node = j
        while node != 0:
            reach = reach * probs[parents[node]][tokens[node]]
            node = parents[node]
        for t in range(V):
            prefix = tuple(path + [t])
            mass = sum(p for e, p in law.items() if e[:len(prefix)] == prefix)
            assert mass == pytest.approx(reach * probs[j][t], abs=1e-12), (j, t)


def test_exact_law_detects_a_scheme_that_is_not_lossless():
    # Two siblings with the same token: the walk counts its mass twice, so token 1 comes with
    # probability 1 instead of .5 (build_tree never makes this; the checker must see it).
    dist = first_token_distribution([0, 1, 1], [-1, 0, 0], [[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])
    assert dist == pytest.approx([0.0, 1.0])


def test_emitted_path_probability_by_hand():
    # The hand tree above: emit [0, 2, 1] = accept node 1 (.25), node 3 (.5), bonus 1 from row 3 (.125).
    assert emitted_path_probability(S_TOKENS, S_PARENTS, S_PROBS, [0, 2, 1], num_steps=2) == 0.25 * 0.5 * 0.125
    # emit [3] = no root child (1 - .75), then 3 from the residual (.125 / .25)
    assert emitted_path_probability(S_TOKENS, S_PARENTS, S_PROBS, [3], num_steps=2) == 0.25 * 0.5
    # emit [0, 2] as a bonus at node 1: token 2 is node 3's and was rejected -> impossible
    assert emitted_path_probability(S_TOKENS, S_PARENTS, S_PROBS, [0, 2], num_steps=2) == 0.0


# ---------------------------------------------------------------------------------------------
# losslessness, by Monte Carlo

MC_DRAWS = 20_000
ALPHA = 1e-6


def monte_carlo_case():
    """The three-step tree over V = 6, with a fixed root row and seeded random deeper rows."""
    rng = np.random.default_rng(1234)
    probs = [[0.3, 0.25, 0.2, 0.1, 0.1, 0.05]]
    probs += [[float(x) for x in rng.dirichlet(np.ones(6))] for _ in range(len(TREE_TOKENS) - 1)]
    return TREE_TOKENS, TREE_PARENTS, probs, 3


def test_stochastic_verify_first_token_passes_chi_square():
    tokens, parents, probs, S = monte_carlo_case()
    rng = np.random.default_rng(2024)
    coins = rng.random((MC_DRAWS, len(tokens)))
    final = rng.random(MC_DRAWS)
    first_counts = [0] * 6
    emission_counts = {}
    for r in range(MC_DRAWS):
        nodes, n, bonus = stochastic_verify(tokens, parents, probs, list(coins[r]), final[r], num_steps=S)
        emitted = tuple([tokens[j] for j in nodes[1:n + 1]] + [bonus])
        first_counts[emitted[0]] += 1
        emission_counts[emitted] = emission_counts.get(emitted, 0) + 1

    # first token against the target row
    stat, pvalue, df = chi_square_pvalue(first_counts, [MC_DRAWS * p for p in probs[0]])
    assert pvalue > ALPHA, f"first-token chi-square {stat:.2f} on {df} df, p = {pvalue:.3g}: {first_counts}"

    # whole emissions against the exact law (cells with expected count < 5 pooled into one)
    law = {}
    for path in reachable_paths(tokens, parents, S).values():
        for t in range(6):
            e = tuple(path + [t])
            law[e] = emitted_path_probability(tokens, parents, probs, list(e), num_steps=S)
    assert set(emission_counts) <= {e for e, p in law.items() if p > 0}
    observed, expected, pooled_o, pooled_e = [], [], 0, 0.0
    for e, p in sorted(law.items()):
        if MC_DRAWS * p >= 5:
            observed.append(emission_counts.get(e, 0))
            expected.append(MC_DRAWS * p)
        else:
            pooled_o += emission_counts.get(e, 0)
            pooled_e += MC_DRAWS * p
    if pooled_e > 0:
        observed.append(pooled_o)
        expected.append(pooled_e)
    stat, pvalue, df = chi_square_pvalue(observed, expected)
    assert pvalue > ALPHA, f"emission chi-square {stat:.2f} on {df} df, p = {pvalue:.3g}"


def test_public_names_are_exported():
    for name in ("RefTree", "build_tree", "emitted_path_probability", "first_token_distribution",
                 "greedy_verify", "select_draft_topk", "stochastic_verify", "topk_order"):
        assert name in reference.__all__ and hasattr(reference, name)
