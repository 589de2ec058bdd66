"""Implementations with one planted bug or one undeclared convention each: the conformance suite
must report them (tests/meta/test_conformance_plugin.py, run from a directory outside the repo).
Test scaffolding: it lives here, never in the installed package."""

from __future__ import annotations

import numpy as np

from specverify.conformance.adapters.example import ExampleImpl, _np, _order, _upcast


class OrderByProbs(ExampleImpl):
    """The seeds' bug class: the top-k of the softmax path ordered by probabilities, not logits."""

    def select_draft_topk(self, logits, scale, topk):
        out = super().select_draft_topk(logits, scale, topk)
        z = (_upcast(logits) * _np(scale.float())).astype(np.float64)
        index = np.array([_order(np.exp(row - row.max()), topk) for row in z], dtype=np.int64)
        return {**out, "index": index.reshape(out["index"].shape)}


class LastMaximalIndex(ExampleImpl):
    """row_argmax answers the LAST maximal index (a reduction that keeps the later of two ties)."""

    def row_argmax(self, x):
        up = _upcast(x)
        flipped = np.array([up.shape[1] - 1 - _order(row[::-1].astype(np.float64), 1) for row in up])
        return {"index": flipped.astype(np.int64).reshape(up.shape[0], 1)}


class IgnoresTopP(ExampleImpl):
    """top_p dropped on the way to the filter (deterministic probabilities and the law op alike)."""

    def sampling_probs(self, logits, scale, temperature, top_k, top_p, min_p):
        return super().sampling_probs(logits, scale, temperature, top_k, 1.0, min_p)


class BonusFromTarget(ExampleImpl):
    """After a rejected draft the bonus is drawn from the target p_0, not from max(p_0 - q, 0)."""

    @staticmethod
    def residual(p0, q):
        return p0


class KeepTiedUndeclared(ExampleImpl):
    """Top-k and top-p cut at a probability value (ties at the cut all kept), not declared."""

    def sampling_probs(self, logits, scale, temperature, top_k, top_p, min_p):
        out = super().sampling_probs(logits, scale, temperature, 0, 1.0, 0.0)["p"]
        rows = []
        for p in out:
            if not np.isnan(p).any():
                if top_k > 0:
                    cut = p[_order(p, top_k)[-1]]
                    p = np.where(p >= cut, p, 0.0)
                    p = p / p.sum()
                if top_p < 1.0:
                    order = _order(p, p.size)
                    before = np.concatenate([[0.0], np.cumsum(p[order])[:-1]])
                    kept = order[(before < top_p) & (p[order] > 0)]
                    cut = p[kept[-1]] if kept.size else p[order[0]]
                    p = np.where(p >= cut, p, 0.0)
                    p = p / p.sum()
                if min_p > 0.0:
                    p = np.where(p >= min_p * p.max(), p, 0.0)
                    p = p / p.sum()
            rows.append(p)
        return {"p": np.array(rows).reshape(out.shape)}


class KeepTiedDeclared(KeepTiedUndeclared):
    """The same, declared: a named difference, not a failure."""

    conventions = {"topk_ties": "keep_tied", "topp_ties": "keep_tied"}


class NotInstalled(ExampleImpl):
    """An adapter whose engine is absent."""

    def load(self):
        from specverify.conformance.adapters import require
        require("no_such_engine_xyz", "no-such-engine")


ORDER_BY_PROBS = OrderByProbs()
LAST_MAXIMAL_INDEX = LastMaximalIndex()
IGNORES_TOP_P = IgnoresTopP()
BONUS_FROM_TARGET = BonusFromTarget()
KEEP_TIED_UNDECLARED = KeepTiedUndeclared()
KEEP_TIED_DECLARED = KeepTiedDeclared()
NOT_INSTALLED = NotInstalled()
