"""A tiny third implementation of three registry ops, in plain numpy: the conformance interface of
tests/support/registry.py, as another engine would plug itself in.

    SPECVERIFY_IMPL=tests.support.example_impl:IMPL python -m pytest tests/test_ops_differential.py

Each op takes the sample's arguments as keywords (tensors arrive as torch tensors on the
profile's device; this example copies them to numpy) and returns a dict of the outputs the
registry record compares. The ops the object lacks (draft_tree, verify_*, ...) are reported as
skipped, naming the attribute.
`BROKEN` is the same object with one planted bug (the top-k of the softmax path ordered by
probabilities, the seed's bug class); tests/meta/test_registry.py shows the suite catches it.
"""

from __future__ import annotations

import numpy as np


def _np(t) -> np.ndarray:
    return t.detach().cpu().numpy()


def _upcast(t) -> np.ndarray:
    return _np(t.float())


def _order(key: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest keys of one row: value descending, index ascending; NaN first."""
    nan = np.isnan(key)
    ranked = np.where(nan, 0.0, key)
    # lexsort sorts by its last key first: NaN flag, then value (descending), then index.
    order = np.lexsort((np.arange(key.size), -ranked, ~nan))
    return order[:k]


def _softmax_limits(z: np.ndarray) -> np.ndarray:
    """Softmax of one row in float64 with section 6.1's limits (±inf maxima, NaN rows)."""
    if np.isnan(z).any():
        return np.full(z.shape, np.nan)
    m = z.max()
    if np.isinf(m):
        hit = (z == m).astype(np.float64)
        return hit / hit.sum()
    e = np.exp(z - m)
    return e / e.sum()


class ExampleImpl:
    """Plain numpy versions of select_draft_topk, sample_from_probs and row_argmax."""

    order_by_probs = False        # the planted bug of BROKEN

    def select_draft_topk(self, logits, scale, topk):
        up = _upcast(logits)                                       # [N, V] float32
        z = (up * _np(scale.float())).astype(np.float64)       # float32 product, then float64
        ps, idx = [], []
        for row_up, row_z in zip(up, z):
            probs = _softmax_limits(row_z)
            index = _order(probs if self.order_by_probs else row_up.astype(np.float64), topk)
            ps.append(probs[index])
            idx.append(index)
        n = up.shape[0]
        return {"index": np.array(idx, dtype=np.int64).reshape(n, topk),
                "p": np.array(ps, dtype=np.float64).reshape(n, topk)}

    def sample_from_probs(self, p, u):
        p, u = _np(p), _np(u)
        out = []
        for row, ui in zip(p, u):
            over = np.nonzero(np.cumsum(row) > ui)[0]
            positive = np.nonzero(row > 0)[0]
            out.append(over[0] if over.size else (positive[-1] if positive.size else -1))
        return {"token": np.array(out, dtype=np.int64)}

    def row_argmax(self, x):
        up = _upcast(x)
        return {"index": np.array([_order(row.astype(np.float64), 1) for row in up],
                                  dtype=np.int64).reshape(up.shape[0], 1)}


class BrokenImpl(ExampleImpl):
    order_by_probs = True


IMPL = ExampleImpl()
BROKEN = BrokenImpl()
