"""DFlash's greedy block verify (docs/semantics.md 6.9): the torch path and the Triton kernel.

Records of the op registry (specverify/conformance/registry/__init__.py)."""

from __future__ import annotations

import torch

import reference
from specverify import ops
from specverify.conformance.registry.core import EXACT, ErrorInput, OpSpec, SampleInput, only


# ---------------------------------------------------------------------------------------------
# DFlash (docs/semantics.md 6.9): the greedy block verify, (correct drafts without the bonus,
# bonus); the torch path and the Triton kernel (interpreted on the CPU)

# Token ids are only compared for equality: nothing floating is read or written.
DFLASH_EDGE_EXEMPT = (("nan", "token ids compared for equality: no floating value is read or written"),
                      ("ulp", "token ids compared for equality: no floating value is read or written"))


def _dflash_sample(name, seed, bs, width, *, vocab=29, tokens=None, runs=None, after="random",
                   index_dtypes=(torch.int64, torch.int64)) -> SampleInput:
    """bs blocks of `width` tokens. target_predict is drawn from [0, vocab) (or from `tokens`, at
    least two). Row b's first runs[b] drafts equal the predictions (runs None: drawn in
    [0, width - 1]); when a draft is left, the next one misses, and the drafts after it are `after`:
    "match" (right again: the run must stop at the miss all the same) or "random". A block of one
    (no draft) gets the root of row b + 1 equal to row b's prediction, so a kernel reading one
    column past its block meets a "match". index_dtypes: of (candidates, target_predict)."""
    gen = torch.Generator().manual_seed(seed)
    pool = torch.arange(vocab) if tokens is None else torch.tensor(tokens, dtype=torch.int64)

    def draw(*shape):
        return pool[torch.randint(0, pool.numel(), shape, generator=gen)]

    pred, cand = draw(bs, width), draw(bs, width)
    runs = torch.randint(0, width, (bs,), generator=gen).tolist() if runs is None else list(runs)
    for b, n in enumerate(runs):
        cand[b, 1:n + 1] = pred[b, :n]
        if n + 1 < width:
            others = pool[pool != pred[b, n]]
            cand[b, n + 1] = others[int(torch.randint(0, others.numel(), (1,), generator=gen))]
            if after == "match":
                cand[b, n + 2:] = pred[b, n + 1:-1]
    if width == 1:
        cand[1:, 0] = pred[:-1, 0]
    c_dt, p_dt = index_dtypes
    return SampleInput(name, {"candidates": cand.to(c_dt), "target_predict": pred.to(p_dt)}, seed)


def _dflash_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        correct, bonus = ops.dflash_correct_drafts_and_bonus(**s.args, impl=which)
        if correct.dtype != torch.int32 or bonus.dtype != torch.int64:
            raise AssertionError(f"dflash_correct_drafts_and_bonus returned {correct.dtype} / {bonus.dtype}, "
                                 f"want int32 / int64")
        return {"correct": correct, "bonus": bonus}
    return impl


def _dflash_ref(s: SampleInput) -> dict:
    a = s.args
    correct, bonus = reference.dflash_correct_drafts_and_bonus(candidates=a["candidates"].tolist(),
                                                               target_predict=a["target_predict"].tolist())
    return {"correct": torch.tensor(correct, dtype=torch.int32), "bonus": torch.tensor(bonus, dtype=torch.int64)}


def _dflash_samples(small: bool):
    i32, i64 = torch.int32, torch.int64

    def samples(dtype: str, seed: int):
        yield _dflash_sample("empty-batch", seed, 0, 4)
        yield _dflash_sample("empty-batch-block1", seed + 1, 0, 1)
        yield _dflash_sample("boundary-block1", seed + 2, 6, 1)
        yield _dflash_sample("boundary-block2-one-draft", seed + 3, 5, 2, runs=[0, 1, 1, 0, 1])
        yield _dflash_sample("boundary-all-correct", seed + 4, 4, 7, runs=[6] * 4)
        yield _dflash_sample("first-draft-wrong-then-match", seed + 5, 4, 6, runs=[0] * 4, after="match")
        yield _dflash_sample("mismatch-then-match", seed + 6, 6, 8, runs=[1, 3, 5, 2, 6, 0], after="match")
        yield _dflash_sample("boundary-tokens-0-and-V-1", seed + 7, 5, 6, tokens=(0, 151935), after="match")
        yield _dflash_sample("boundary-ids-above-int32", seed + 8, 3, 5, tokens=(2**31 - 1, 2**31, 2**40 + 3),
                             runs=[4, 2, 0], after="match")
        # B - 1 = 16 drafts fill the kernel's lanes exactly; 17 spill into a block of 32
        yield _dflash_sample("boundary-drafts-fill-lanes", seed + 9, 3, 17, runs=[16, 15, 7], after="match")
        yield _dflash_sample("boundary-drafts-past-lanes", seed + 10, 3, 18, runs=[17, 16, 0], after="match")
        yield _dflash_sample("int32-inputs", seed + 11, 5, 6, index_dtypes=(i32, i32), after="match")
        yield _dflash_sample("mixed-int32-int64", seed + 12, 4, 5, index_dtypes=(i32, i64))
        yield _dflash_sample("mixed-int64-int32", seed + 13, 4, 5, index_dtypes=(i64, i32), after="match")
        yield _dflash_sample("bs1-block16", seed + 14, 1, 16)
        bs = 13 if small else 64
        yield _dflash_sample(f"large-bs{bs}-block16", seed + 15, bs, 16, vocab=7)
        gen = torch.Generator().manual_seed(seed)
        for i in range(1 if small else 3):
            bs, width, vocab = (int(torch.randint(low, high, (1,), generator=gen)) for low, high in
                                ((1, 9), (1, 12), (2, 40)))
            yield _dflash_sample(f"random-{i}", seed + 20 + i, bs, width, vocab=vocab, after=("random", "match")[i % 2])
    return samples


def _dflash_recipe(dtype: str):
    from hypothesis import strategies as st
    return st.tuples(st.integers(0, 2**16), st.integers(0, 6), st.integers(1, 12), st.integers(2, 30),
                     st.sampled_from(("random", "match")), st.booleans()).map(
        lambda t: _dflash_sample(f"hyp-block{t[2]}", t[0], t[1], t[2], vocab=t[3], after=t[4],
                                 index_dtypes=((torch.int32 if t[5] else torch.int64),) * 2))


def _dflash_errors(which: str):
    base = _dflash_sample("base", 0, 2, 4).args

    def call(**changes):
        return lambda: ops.dflash_correct_drafts_and_bonus(**{**base, **changes}, impl=which)

    def errors():
        cand, pred = base["candidates"], base["target_predict"]
        yield ErrorInput("candidates-list", call(candidates=cand.tolist()), TypeError,
                         "candidates must be a torch.Tensor", "candidates")
        yield ErrorInput("candidates-1d", call(candidates=cand[0]), ValueError, "candidates must be 2-D", "candidates")
        yield ErrorInput("target-predict-3d", call(target_predict=pred[None]), ValueError,
                         "target_predict must be 2-D", "target_predict")
        yield ErrorInput("candidates-float", call(candidates=cand.float()), ValueError,
                         "candidates must be int32 or int64", "candidates")
        yield ErrorInput("target-predict-int16", call(target_predict=pred.to(torch.int16)), ValueError,
                         "target_predict must be int32 or int64", "target_predict")
        yield ErrorInput("width-mismatch", call(target_predict=pred[:, :3]), ValueError,
                         r"target_predict must have candidates' shape \(2, 4\)", "target_predict")
        yield ErrorInput("bs-mismatch", call(target_predict=pred[:1]), ValueError,
                         r"target_predict must have candidates' shape \(2, 4\)", "target_predict")
        yield ErrorInput("block-of-zero", call(candidates=cand[:, :0], target_predict=pred[:, :0]), ValueError,
                         "candidates must have B >= 1 columns", "candidates")
        yield ErrorInput("device-mismatch", call(target_predict=pred.to("meta")), ValueError,
                         "target_predict is on meta", "target_predict")
        yield ErrorInput("candidates-negative", call(candidates=torch.tensor([[3, 1, 2, 0], [4, -1, 2, 2]])),
                         ValueError, "candidates must hold token ids >= 0, got -1", "candidates")
        yield ErrorInput("target-predict-negative", call(target_predict=torch.tensor([[3, 1, -2, 0], [4, 1, 2, 2]])),
                         ValueError, "target_predict must hold token ids >= 0, got -2", "target_predict")
        yield ErrorInput("token-past-vocab", call(candidates=torch.tensor([[3, 1, 2, 0], [4, 1, 2, 2]]),
                                                  target_predict=torch.tensor([[3, 1, 2, 0], [4, 1, 5, 2]]),
                                                  vocab_size=5), ValueError,
                         r"target_predict must hold token ids < vocab_size \(5\), got 5", "target_predict")
        yield ErrorInput("vocab-size-float", call(vocab_size=29.0), TypeError, "vocab_size must be an int",
                         "vocab_size")
        yield ErrorInput("vocab-size-zero", call(vocab_size=0), ValueError, "vocab_size must be >= 1", "vocab_size")
        yield ErrorInput("checked-string", call(checked="yes"), TypeError, "checked must be True, False or None",
                         "checked")
        yield ErrorInput("bad-impl", lambda: ops.dflash_correct_drafts_and_bonus(**base, impl="cuda"), ValueError,
                         "impl must be one of", "impl")
    return errors


RECORDS = (
    OpSpec("dflash_correct_drafts_and_bonus", _dflash_impl("torch"), _dflash_ref, _dflash_samples(False),
           _dflash_recipe, _dflash_errors("torch"), only("float32"), {"correct": EXACT, "bonus": EXACT},
           platform_dependent=False, max_examples=20, edge_exempt=DFLASH_EDGE_EXEMPT),
    OpSpec("dflash_correct_drafts_and_bonus_triton", _dflash_impl("triton"), _dflash_ref, _dflash_samples(True),
           _dflash_recipe, _dflash_errors("triton"), only("float32"), {"correct": EXACT, "bonus": EXACT},
           platform_dependent=False, max_examples=8, edge_exempt=DFLASH_EDGE_EXEMPT),
)
