"""A small third implementation in plain numpy: how an engine plugs itself into the conformance suite.

    pytest --pyargs specverify.conformance --sv-impl specverify.conformance.adapters.example:IMPL

Each op takes the sample's arguments as keywords (tensors arrive as torch tensors on the device;
this example copies them to numpy) and returns a dict of the outputs the registry record compares.
The ops it lacks (draft_tree, verify_greedy, ...) are reported as skipped, naming the attribute.

Two of its ops draw their own random numbers from numpy's generator, as an engine's sampler does:
`sample_filtered` and `verify_naive` declare `randomness: own` and are judged by law (the emitted
distribution against the exact one), not token for token. Everything else follows specverify's
semantics, so the whole run conforms.
"""

from __future__ import annotations

import numpy as np

SEED = 20261125


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
    """Softmax of one row in float64 with the semantics' limits (±inf maxima, NaN rows)."""
    if np.isnan(z).any():
        return np.full(z.shape, np.nan)
    m = z.max()
    if np.isinf(m):
        hit = (z == m).astype(np.float64)
        return hit / hit.sum()
    e = np.exp(z - m)
    return e / e.sum()


def _filter(p: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """Top-k, top-p, min-p of one float64 row, each renormalizing (ties by index)."""
    if np.isnan(p).any():
        return p
    order = _order(p, p.size)
    if top_k > 0:
        p = np.where(np.isin(np.arange(p.size), order[:top_k]), p, 0.0)
        p = p / p.sum()
        order = _order(p, p.size)
    if top_p < 1.0:
        ranked = p[order]
        before = np.concatenate([[0.0], np.cumsum(ranked)[:-1]])
        keep = (before < top_p) & (ranked > 0)
        keep[0] = True
        p = np.where(np.isin(np.arange(p.size), order[keep]), p, 0.0)
        p = p / p.sum()
    if min_p > 0.0:
        p = np.where(p >= min_p * p.max(), p, 0.0)
        p = p / p.sum()
    return p


def _draw(row: np.ndarray, u: float) -> int:
    over = np.nonzero(np.cumsum(row) > u)[0]
    positive = np.nonzero(row > 0)[0]
    return int(over[0] if over.size else (positive[-1] if positive.size else -1))


class ExampleImpl:
    """Plain numpy versions of select_draft_topk, row_argmax, sampling_probs, sample_from_probs,
    and, with their own random numbers, sample_filtered and verify_naive."""

    name = "example (numpy)"
    conventions = {}
    op_conventions = {"sample_filtered": {"randomness": "own"}, "verify_naive": {"randomness": "own"}}

    def __init__(self):
        self.rng = np.random.default_rng(SEED)

    def seed(self, value: int) -> None:
        """Reseed the generator (the law tests call it with the test's seed before drawing)."""
        self.rng = np.random.default_rng([SEED, value])

    def versions(self) -> dict:
        return {"numpy": np.__version__}

    def select_draft_topk(self, logits, scale, topk):
        up = _upcast(logits)                                       # [N, V] float32
        z = (up * _np(scale.float())).astype(np.float64)       # float32 product, then float64
        ps, idx = [], []
        for row_up, row_z in zip(up, z):
            probs = _softmax_limits(row_z)
            index = _order(row_up.astype(np.float64), topk)
            ps.append(probs[index])
            idx.append(index)
        n = up.shape[0]
        return {"index": np.array(idx, dtype=np.int64).reshape(n, topk),
                "p": np.array(ps, dtype=np.float64).reshape(n, topk)}

    def row_argmax(self, x):
        up = _upcast(x)
        return {"index": np.array([_order(row.astype(np.float64), 1) for row in up],
                                  dtype=np.int64).reshape(up.shape[0], 1)}

    def sampling_probs(self, logits, scale, temperature, top_k, top_p, min_p):
        z = _np(logits.double()) * _np(scale.double())
        rows = [np.full(row.shape, np.nan) if (np.isnan(row).any() or (row == np.inf).any() or (row == -np.inf).all())
                else _filter(_softmax_limits(row / temperature), top_k, top_p, min_p) for row in z]
        return {"p": np.array(rows, dtype=np.float64).reshape(z.shape)}

    def sample_from_probs(self, p, u):
        return {"token": np.array([_draw(row, ui) for row, ui in zip(_np(p), _np(u))], dtype=np.int64)}

    def sample_filtered(self, logits, scale, temperature, top_k, top_p, min_p):
        p = self.sampling_probs(logits, scale, temperature, top_k, top_p, min_p)["p"]
        cumulative = np.cumsum(p, axis=1)
        u = self.rng.random(p.shape[0]) * cumulative[:, -1]
        return {"token": (cumulative > u[:, None]).argmax(axis=1).astype(np.int64)}

    @staticmethod
    def residual(p0: np.ndarray, q: np.ndarray) -> np.ndarray:
        """What a rejection draws from: max(p_0 - q, 0) (normalized by the inverse-CDF draw)."""
        return np.maximum(p0 - q, 0.0)

    def verify_naive(self, probs, draft, mode):
        """The chain [root, draft] with the draft's probabilities q: accept d with probability
        min(1, p_0(d) / q(d)); on a rejection draw from max(p_0 - q, 0), else from p_1."""
        if "draft_q" not in mode:
            raise NotImplementedError("the example implements exact sampling (draft_q) only")
        p, d, q = _np(probs), _np(draft), _np(mode["draft_q"])
        rows = np.arange(d.size)
        ratio = p[rows, 0, d] / q[rows, d]
        accepted = self.rng.random(d.size) < ratio
        residual = self.residual(p[:, 0], q)
        source = np.where(accepted[:, None], p[:, 1], residual)
        cumulative = np.cumsum(source, axis=1)
        u = self.rng.random(d.size) * cumulative[:, -1]
        bonus = (cumulative > u[:, None]).argmax(axis=1)
        return {"accept_nodes": np.stack([np.zeros_like(d), np.where(accepted, 1, -1)], axis=1).astype(np.int64),
                "num_correct": accepted.astype(np.int64), "bonus": bonus.astype(np.int64)}


IMPL = ExampleImpl()
