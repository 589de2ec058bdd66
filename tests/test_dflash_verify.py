"""DFlash's verify (`ops.dflash_correct_drafts_and_bonus`, docs/semantics.md 6.9).

The registry records (specverify/conformance/registry/) hold the torch path and the Triton kernel
against `reference.dflash_correct_drafts_and_bonus` on named samples; this file adds what a record
cannot say: values on paper (with the "renamed count" trap: `correct` counts accepted drafts
WITHOUT the bonus, a cycle emits correct + 1 tokens), a block of one read from a wider buffer (a
kernel reading past the block would meet a match there), strided and int32 inputs, every
argument error, the `checked=` modes, the keyword-only call, and the sampling variant: the
existing stochastic verify on a chain of B nodes, which is DFlash's sampling verify.

On a machine without a GPU the Triton kernel runs under TRITON_INTERPRET=1 (set by conftest.py).
"""

from __future__ import annotations

import pytest
import torch

import reference
from specverify import ops
from specverify.kernels import chain_tree, verify_stochastic

pytestmark = pytest.mark.kernels

DEV = "cuda" if torch.cuda.is_available() else "cpu"
IMPLS = ["torch", "triton"]


def t(x, dtype=torch.int64):
    return torch.tensor(x, dtype=dtype, device=DEV)


def run(cand, pred, impl, **kw):
    correct, bonus = ops.dflash_correct_drafts_and_bonus(candidates=cand, target_predict=pred, impl=impl, **kw)
    assert correct.dtype == torch.int32 and bonus.dtype == torch.int64, (correct.dtype, bonus.dtype)
    assert correct.shape == bonus.shape == (cand.shape[0],)
    assert correct.device == bonus.device == cand.device
    return correct.tolist(), bonus.tolist()


def ref(cand, pred):
    return reference.dflash_correct_drafts_and_bonus(candidates=cand.tolist(), target_predict=pred.tolist())


# ---------------------------------------------------------------------------------------------
# values on paper

# B = 4: column 0 the root, drafts in columns 1..3; draft j (column j + 1) is compared with the
# prediction after column j, target_predict[:, j]. Predictions [7, 8, 9, 4] in every row.
HAND_CAND = [[5, 7, 8, 9],     # 7 == 7, 8 == 8, 9 == 9: all 3 drafts right -> correct 3, bonus pred[3] = 4
             [5, 1, 8, 9],     # 1 != 7: the run is 0 although drafts 2, 3 match -> correct 0, bonus pred[0] = 7
             [5, 7, 2, 9],     # 7 == 7, 2 != 8 (9 == 9 after the miss does not count) -> 1, bonus pred[1] = 8
             [5, 7, 8, 3],     # 7, 8 right, 3 != 9 -> correct 2, bonus pred[2] = 9
             [0, 7, 8, 9]]     # the root takes no part in the comparison -> correct 3, bonus 4
HAND_PRED = [[7, 8, 9, 4]] * 5
HAND_CORRECT = [3, 0, 1, 2, 3]
HAND_BONUS = [4, 7, 8, 9, 4]


@pytest.mark.parametrize("impl", IMPLS)
def test_hand_example(impl):
    assert run(t(HAND_CAND), t(HAND_PRED), impl) == (HAND_CORRECT, HAND_BONUS)
    assert ref(t(HAND_CAND), t(HAND_PRED)) == (HAND_CORRECT, HAND_BONUS)


@pytest.mark.parametrize("impl", IMPLS)
def test_correct_excludes_the_bonus(impl):
    # The renamed count: `correct` is the number of accepted DRAFT tokens. Row 0 accepts all 3
    # drafts of a block of 4 and emits 4 tokens (3 drafts + the bonus): correct is 3, never 4.
    # Row 1 accepts nothing and still emits one token, the bonus: correct 0, not 1.
    correct, bonus = run(t(HAND_CAND), t(HAND_PRED), impl)
    assert correct[0] == 3 and correct[1] == 0
    for b, (n, x) in enumerate(zip(correct, bonus)):
        emitted = HAND_CAND[b][1:n + 1] + [x]          # the accepted drafts, then the bonus
        assert len(emitted) == n + 1
        # In greedy verify every emitted token is the target's own prediction.
        assert emitted == HAND_PRED[b][:n + 1], (b, emitted)


@pytest.mark.parametrize("impl", IMPLS)
def test_block_of_one(impl):
    # B = 1: no draft. correct 0 and bonus target_predict[b, 0], whatever the root.
    assert run(t([[3], [3], [0]]), t([[3], [9], [5]]), impl) == ([0, 0, 0], [3, 9, 5])
    # The block as column 0 of a wider buffer (strides (2, 1)): the column past the block holds
    # exactly the "next draft" a kernel reading past its block would compare, and it matches.
    cand_full, pred_full = t([[5, 7], [6, 8]]), t([[7, 9], [8, 3]])
    cand, pred = cand_full[:, :1], pred_full[:, :1]
    assert cand.stride() == (2, 1)
    assert run(cand, pred, impl) == ([0, 0], [7, 8])


@pytest.mark.parametrize("impl", IMPLS)
def test_block_of_two_and_empty_batch(impl):
    # B = 2: one draft, correct is 0 or 1; bonus pred[:, correct].
    assert run(t([[1, 4], [1, 5]]), t([[4, 6], [4, 6]]), impl) == ([1, 0], [6, 4])
    for width in (1, 4):
        empty = torch.zeros((0, width), dtype=torch.int64, device=DEV)
        assert run(empty, empty.to(torch.int32), impl) == ([], [])


@pytest.mark.parametrize("impl", IMPLS)
def test_run_stops_at_the_first_mismatch(impl):
    # Every draft after the first miss matches again; none of them counts.
    pred = t([[2, 3, 4, 5, 6, 7, 8, 9]] * 3)
    cand = t([[1, 2, 3, 0, 5, 6, 7, 8],              # drafts 0, 1 right, draft 2 (0 != 4) misses -> 2
              [1, 0, 3, 4, 5, 6, 7, 8],              # draft 0 misses -> 0
              [1, 2, 3, 4, 5, 6, 7, 0]])             # only the last draft misses -> 6, bonus pred[6] = 8
    assert run(cand, pred, impl) == ([2, 0, 6], [4, 2, 8])


@pytest.mark.parametrize("impl", IMPLS)
def test_large_token_ids_and_int32(impl):
    big = [2**31 - 1, 2**31, 2**40 + 3]          # int64 ids past int32: no truncation anywhere
    cand, pred = t([[0, big[0], big[1], 7]]), t([[big[0], big[1], big[2], big[2]]])
    assert run(cand, pred, impl) == ([2], [big[2]])
    i32 = t(HAND_CAND, torch.int32), t(HAND_PRED, torch.int32)
    assert run(*i32, impl) == (HAND_CORRECT, HAND_BONUS)
    assert run(i32[0], t(HAND_PRED), impl) == (HAND_CORRECT, HAND_BONUS)    # mixed int32 / int64


# ---------------------------------------------------------------------------------------------
# triton == torch == reference


def _random_block(gen, bs, width, vocab):
    pred = torch.randint(0, vocab, (bs, width), generator=gen)
    cand = torch.randint(0, vocab, (bs, width), generator=gen)
    runs = torch.randint(0, width, (bs,), generator=gen)
    for b in range(bs):                            # plant a leading run, then random tokens
        cand[b, 1:int(runs[b]) + 1] = pred[b, :int(runs[b])]
    return cand, pred


@pytest.mark.parametrize("seed", range(3))
def test_random_triton_equals_torch_equals_reference(seed):
    gen = torch.Generator().manual_seed(31 + seed)
    for width in (1, 2, 5, 16, 17, 33):
        bs = int(torch.randint(1, 7, (1,), generator=gen))
        cand, pred = _random_block(gen, bs, width, vocab=3)
        want = ref(cand, pred)
        for impl in IMPLS:
            assert run(cand.to(DEV), pred.to(DEV), impl) == want, (impl, width)


@pytest.mark.parametrize("impl", IMPLS)
def test_strided_inputs(impl):
    gen = torch.Generator().manual_seed(5)
    cand, pred = _random_block(gen, 6, 9, vocab=2)
    want = ref(cand[::2, 1::2], pred[::2, :8:2])
    # Every other row and column of the buffers: non-unit strides on both axes, and a transposed view.
    assert run(cand.to(DEV)[::2, 1::2], pred.to(DEV)[::2, :8:2], impl) == want
    assert run(cand.T.contiguous().T.to(DEV), pred.to(DEV), impl) == ref(cand, pred)


def test_auto_picks_the_device_path():
    cand, pred = t(HAND_CAND), t(HAND_PRED)
    assert run(cand, pred, "auto") == (HAND_CORRECT, HAND_BONUS)


# ---------------------------------------------------------------------------------------------
# errors, checked=, keyword-only

BASE_C, BASE_P = [[3, 1, 2, 0], [4, 1, 2, 2]], [[1, 2, 0, 6], [1, 2, 5, 8]]


def _errors():
    c, p = t(BASE_C), t(BASE_P)
    yield "candidates-list", dict(candidates=BASE_C), TypeError, "candidates must be a torch.Tensor"
    yield "target-predict-list", dict(target_predict=BASE_P), TypeError, "target_predict must be a torch.Tensor"
    yield "candidates-1d", dict(candidates=c[0]), ValueError, "candidates must be 2-D"
    yield "target-predict-3d", dict(target_predict=p[None]), ValueError, "target_predict must be 2-D"
    yield "candidates-float", dict(candidates=c.double()), ValueError, "candidates must be int32 or int64"
    yield "candidates-uint8", dict(candidates=c.to(torch.uint8)), ValueError, "candidates must be int32 or int64"
    yield "target-predict-int16", dict(target_predict=p.to(torch.int16)), ValueError, \
        "target_predict must be int32 or int64"
    yield "target-predict-bool", dict(target_predict=p > 1), ValueError, "target_predict must be int32 or int64"
    yield "width-mismatch", dict(target_predict=p[:, :3]), ValueError, r"target_predict must have candidates' shape"
    yield "bs-mismatch", dict(target_predict=p[:1]), ValueError, r"target_predict must have candidates' shape"
    yield "block-of-zero", dict(candidates=c[:, :0], target_predict=p[:, :0]), ValueError, \
        "candidates must have B >= 1"
    yield "device-mismatch", dict(target_predict=p.to("meta")), ValueError, "target_predict is on meta"
    yield "candidates-negative", dict(candidates=t([[3, 1, 2, 0], [-4, 1, 2, 2]]), checked=True), ValueError, \
        "candidates must hold token ids >= 0, got -4"
    yield "target-predict-negative", dict(target_predict=t([[1, -2, 0, 6], [1, 2, 5, 8]]), checked=True), \
        ValueError, "target_predict must hold token ids >= 0, got -2"
    yield "candidates-past-vocab", dict(vocab_size=4, checked=True), ValueError, \
        r"candidates must hold token ids < vocab_size \(4\), got 4"
    yield "target-predict-past-vocab", dict(vocab_size=5, checked=True), ValueError, \
        r"target_predict must hold token ids < vocab_size \(5\), got 8"
    yield "vocab-size-float", dict(vocab_size=9.0), TypeError, "vocab_size must be an int"
    yield "vocab-size-bool", dict(vocab_size=True), TypeError, "vocab_size must be an int"
    yield "vocab-size-zero", dict(vocab_size=0), ValueError, "vocab_size must be >= 1"
    yield "checked-string", dict(checked="yes"), TypeError, "checked must be True, False or None"
    yield "bad-impl", dict(impl="cuda"), ValueError, "impl must be one of"


ERRORS = list(_errors())


@pytest.mark.parametrize("changes,exc,match", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_errors_name_the_argument(changes, exc, match):
    args = {"candidates": t(BASE_C), "target_predict": t(BASE_P), "impl": "torch", **changes}
    with pytest.raises(exc, match=match):
        ops.dflash_correct_drafts_and_bonus(**args)


def test_keyword_only():
    with pytest.raises(TypeError, match="positional"):
        ops.dflash_correct_drafts_and_bonus(t(BASE_C), t(BASE_P))


def test_checked_modes(monkeypatch):
    neg_c, neg_p = torch.tensor([[-1, 2, 3]]), torch.tensor([[2, 3, -5]])       # CPU tensors
    with pytest.raises(ValueError, match="candidates must hold token ids >= 0"):
        ops.dflash_correct_drafts_and_bonus(candidates=neg_c, target_predict=neg_p)           # None: on for CPU
    # checked=False skips the value check; the comparison itself needs no valid ids.
    got = ops.dflash_correct_drafts_and_bonus(candidates=neg_c, target_predict=neg_p, checked=False)
    assert [x.tolist() for x in got] == [[2], [-5]]
    # Inside a CUDA-graph capture the check never runs, even when asked for (no host read there).
    monkeypatch.setattr(ops, "capturing", lambda device=None: True)
    got = ops.dflash_correct_drafts_and_bonus(candidates=neg_c, target_predict=neg_p, checked=True)
    assert [x.tolist() for x in got] == [[2], [-5]]
    # An empty batch has no value to check.
    monkeypatch.undo()
    empty = torch.zeros((0, 3), dtype=torch.int64)
    assert [x.tolist() for x in ops.dflash_correct_drafts_and_bonus(candidates=empty, target_predict=empty,
                                                                     vocab_size=1, checked=True)] == [[], []]


# ---------------------------------------------------------------------------------------------
# The sampling variant: stochastic verify (6.4) on a chain of B nodes


def dflash_sampling_verify(cand, target_probs, coins, final, impl):
    """DFlash's sampling verify as the existing ops run it: the block is the chain root -> draft 1
    -> ... -> draft B-1 (`chain_tree`), verified by `verify_stochastic`. A block of one is a chain
    without a child: num_steps 1 (the op's minimum), and nothing can be accepted."""
    width = cand.shape[1]
    tree = chain_tree(cand[:, 0], cand[:, 1:], torch.zeros(cand.shape[0], dtype=torch.int64, device=cand.device))
    return verify_stochastic(tree, target_probs, coins, final, num_steps=max(width - 1, 1), impl=impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_sampling_variant_is_stochastic_verify_on_a_chain(impl):
    gen = torch.Generator().manual_seed(11)
    vocab, bs = 4, 5
    for width in (1, 2, 4, 7):
        parents = list(range(-1, width - 1))
        for trial in range(3):
            # Coarse probabilities (multiples of 1/8 after normalising, zeros frequent) and coins on
            # the same grid: exact ties u == acc occur; drafts are drawn from the same small vocab.
            probs = torch.randint(0, 3, (bs, width, vocab), generator=gen).to(torch.float64)
            probs[..., 0] += probs.sum(-1) == 0                          # no empty row
            probs = probs / probs.sum(-1, keepdim=True)
            cand = torch.randint(0, vocab, (bs, width), generator=gen)
            coins = (torch.randint(0, 8, (bs, width), generator=gen) / 8).to(torch.float64)
            final = torch.rand(bs, generator=gen, dtype=torch.float64)
            accept, n, bonus = dflash_sampling_verify(cand.to(DEV), probs.to(DEV), coins.to(DEV), final.to(DEV), impl)
            for b in range(bs):
                want = reference.stochastic_verify(cand[b].tolist(), parents, probs[b].numpy(), coins[b].tolist(),
                                                   float(final[b]), num_steps=max(width - 1, 1))
                got = (accept[b].tolist(), int(n[b]), int(bonus[b]))
                assert got == want, f"B={width} trial {trial} request {b}: got {got}, reference {want}"
                assert want[1] <= width - 1                              # accepted drafts, bonus excluded


@pytest.mark.parametrize("impl", IMPLS)
def test_sampling_variant_at_one_hot_targets_is_the_greedy_verify(impl):
    # Target distributions one-hot at target_predict: a draft is accepted iff it equals the
    # prediction (u < 1 or u < 0), and the bonus is the prediction: any coins give the greedy op's answer.
    gen = torch.Generator().manual_seed(3)
    vocab, bs, width = 3, 6, 5
    cand, pred = _random_block(gen, bs, width, vocab)
    probs = torch.nn.functional.one_hot(pred, vocab).to(torch.float64)
    coins, final = torch.rand(bs, width, generator=gen, dtype=torch.float64), torch.rand(bs, generator=gen,
                                                                                          dtype=torch.float64)
    _, n, bonus = dflash_sampling_verify(cand.to(DEV), probs.to(DEV), coins.to(DEV), final.to(DEV), impl)
    correct, greedy_bonus = run(cand.to(DEV), pred.to(DEV), impl)
    assert n.tolist() == correct and bonus.tolist() == greedy_bonus


def test_a_bool_vocab_size_is_refused():
    """True is an int to Python, not a vocabulary size (found by the first generated-mutant campaign)."""
    c = torch.tensor([[1, 2, 3]])
    with pytest.raises(TypeError, match=r"vocab_size must be an int >= 1 or None, got bool"):
        ops.dflash_correct_drafts_and_bonus(candidates=c, target_predict=c, vocab_size=True)
