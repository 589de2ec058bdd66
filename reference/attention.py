"""Attention of new queries over a paged KV cache, read as plain maths (float64, one loop per
request, head, query and key). The contract of `paged_attention`:

- request b holds cache indices t < L_b = kv_lens[b] + region + q_lens[b]; index t lives in slot
  req_to_token[rows[b]][t] of k_cache / v_cache ([slots][kv_head][dim]);
- query lane j < q_lens[b] of head h reads kv head h // (num_heads // num_kv_heads) and sees every
  t < kv_lens[b] and t = kv_lens[b] + r for r < region + q_lens[b] with tree_mask[b][j][r];
- its output is sum_t w_t v_t with w the softmax of scale * <q, k_t> over the keys it sees
  (scale default 1 / sqrt(dim)); a padded lane, or a query that sees no key, is all zeros.

And of `token_slots` (the slot each new token writes): token t < num_tokens of request b sits at
cache index i = kv_lens[b] + region + t, read at min(i, last cell of the row); a token with
t >= q_lens[b] (padding) writes the sink slot instead.

And of `decode_attention_indexed`: query i (of q [N][num_heads][dim]) sees the slots
kv_indices[kv_indptr[i]], ..., kv_indices[kv_indptr[i + 1] - 1], in that order, and nothing else;
the same softmax-weighted sum, and zeros for an empty list.
"""

from __future__ import annotations

import math

import numpy as np


def paged_attention(*, q, k_cache, v_cache, req_to_token, rows, kv_lens, q_lens, tree_mask, region=0,
                    scale=None) -> np.ndarray:
    """-> float64 array [N, Q, num_heads, dim]. Array-likes in; values read as float64."""
    q = np.asarray(q, dtype=np.float64)
    keys = np.asarray(k_cache, dtype=np.float64)
    values = np.asarray(v_cache, dtype=np.float64)
    table = np.asarray(req_to_token)
    mask = np.asarray(tree_mask, dtype=bool)
    n, nq, nh, dim = q.shape
    group = nh // keys.shape[1]
    scale = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    out = np.zeros((n, nq, nh, dim), dtype=np.float64)
    for b in range(n):
        prefix, live_q = int(kv_lens[b]), int(q_lens[b])
        slots_of = table[int(rows[b])]
        for j in range(live_q):
            visible = list(range(prefix))
            visible += [prefix + r for r in range(region + live_q) if mask[b][j][r]]
            if not visible:
                continue
            for h in range(nh):
                kvh = h // group
                scores = []
                for t in visible:
                    slot = int(slots_of[t])
                    dot = 0.0
                    for d in range(dim):
                        dot += q[b, j, h, d] * keys[slot, kvh, d]
                    scores.append(scale * dot)
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                for w, t in zip(weights, visible):
                    out[b, j, h] += (w / total) * values[int(slots_of[t]), kvh]
    return out


def _attend(query, slots, keys, values, kvh, scale) -> np.ndarray:
    """sum_t w_t v_t over `slots`, w the softmax of scale * <query, k_t> (float64, loops)."""
    scores = []
    for slot in slots:
        dot = 0.0
        for d in range(len(query)):
            dot += query[d] * keys[slot, kvh, d]
        scores.append(scale * dot)
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    out = np.zeros(len(query), dtype=np.float64)
    for w, slot in zip(weights, slots):
        out += (w / total) * values[slot, kvh]
    return out


def decode_attention_indexed(q, k_cache, v_cache, kv_indptr, kv_indices, *, scale) -> np.ndarray:
    """-> float64 array [N, num_heads, dim]. Array-likes in; values read as float64."""
    q = np.asarray(q, dtype=np.float64)
    keys = np.asarray(k_cache, dtype=np.float64)
    values = np.asarray(v_cache, dtype=np.float64)
    n, nh, dim = q.shape
    group = nh // keys.shape[1]
    out = np.zeros((n, nh, dim), dtype=np.float64)
    for i in range(n):
        slots = [int(kv_indices[p]) for p in range(int(kv_indptr[i]), int(kv_indptr[i + 1]))]
        if not slots:
            continue
        for h in range(nh):
            out[i, h] = _attend(q[i, h], slots, keys, values, h // group, float(scale))
    return out


def token_slots(*, req_to_token, rows, kv_lens, q_lens, num_tokens: int, region: int = 0, sink: int = 0) -> list:
    """-> [bs][num_tokens] ints: the slot each new token of each request writes."""
    table = [list(map(int, r)) for r in np.asarray(req_to_token).tolist()]
    out = []
    for row, kv, ql in zip(np.asarray(rows).tolist(), np.asarray(kv_lens).tolist(), np.asarray(q_lens).tolist()):
        cells = table[row]
        out.append([cells[min(kv + region + t, len(cells) - 1)] if t < ql else sink for t in range(num_tokens)])
    return out


def commit_accepted_kv(*, kv, req_to_token, rows, seq_lens, accept, live, sink: int = 0) -> list:
    """-> kv after the commit, as nested lists [P][slots][...]: for every live lane and every depth
    j of its accepted path (accept[b][j] >= 0), each plane's slot at index seq_lens[b] + j takes
    what the slot at seq_lens[b] + accept[b][j] held before any move (indices clamped to the row's
    last cell). `sink`: the slot padding writes, which a live move never names (the op refuses
    that); unused here."""
    before = np.asarray(kv).tolist()
    after = np.asarray(kv).tolist()
    table = [list(map(int, r)) for r in np.asarray(req_to_token).tolist()]
    for row, n, path, on in zip(np.asarray(rows).tolist(), np.asarray(seq_lens).tolist(), np.asarray(accept).tolist(),
                                np.asarray(live).tolist()):
        if not on:
            continue
        cells = table[row]
        for j, node in enumerate(path):
            if node < 0:
                continue
            src, dst = cells[min(n + node, len(cells) - 1)], cells[min(n + j, len(cells) - 1)]
            for p in range(len(after)):
                after[p][dst] = before[p][src]
    return after
