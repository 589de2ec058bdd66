"""The KV index list of naive EAGLE's fused verify, read as plain lists (the contract of
`create_draft_kv_indices`, docs/semantics.md 6.6):

- request b (table row rows[b], L = seq_lens[b] tokens cached before the verify) verifies two
  tokens, at positions L and L + 1, each a decode query of its own;
- the token at position L sees cache indices 0..L (its own included), the token at L + 1 sees
  0..L + 1; cache index t lives in slot req_to_token[row][t];
- the queries come in order (request 0's two, then request 1's, ...); their slot lists are
  concatenated into one flat list, and kv_indptr[i] .. kv_indptr[i + 1] bounds query i's part.
"""

from __future__ import annotations


def create_draft_kv_indices(*, req_to_token, rows, seq_lens) -> tuple[list[int], list[int]]:
    """-> (kv_indptr: 2 * bs + 1 ints, kv_indices: the flat slot list). Array-likes in."""
    kv_indptr = [0]
    kv_indices = []
    for b in range(len(seq_lens)):
        table_row = req_to_token[int(rows[b])]
        cached = int(seq_lens[b])
        for position in (cached, cached + 1):          # the last output token, then the draft token
            for t in range(position + 1):              # every cached index up to the query's own
                kv_indices.append(int(table_row[t]))
            kv_indptr.append(len(kv_indices))
    return kv_indptr, kv_indices
