"""DFlash's greedy verify (docs/semantics.md 6.9) read as plain loops.

A block of B tokens per request: column 0 the root (the last verified token), columns 1..B-1 the
drafts. Walk the drafts in order; draft j (column j + 1) is accepted while it equals the target's
prediction after column j, and the walk stops at the first one that does not. The bonus is the
prediction after the last accepted column. `correct` counts the accepted drafts, without the bonus:
the request emits correct + 1 tokens.

The sampling variant is not here: it is the chain case of stochastic verify (`spec.stochastic_verify`
with parents [-1, 0, 1, ..., B-2]).
"""

from __future__ import annotations


def _rows(name: str, rows) -> list[list[int]]:
    out = []
    for i, row in enumerate(rows):
        row = list(row)
        for value in row:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name}[{i}] must hold ints (token ids), got {type(value).__name__}")
        out.append(row)
    return out


def dflash_correct_drafts_and_bonus(*, candidates, target_predict) -> tuple[list[int], list[int]]:
    """candidates, target_predict: bs rows of B ints each (B >= 1, the same B in every row and in
    both). Returns (correct [bs], bonus [bs]): per request the number of accepted drafts and the
    target's token after the last accepted column."""
    cand = _rows("candidates", candidates)
    pred = _rows("target_predict", target_predict)
    if len(cand) != len(pred):
        raise ValueError(f"candidates has {len(cand)} rows, target_predict {len(pred)}: one row per request each")
    correct, bonus = [], []
    for b in range(len(cand)):
        width = len(cand[b])
        if width < 1 or len(pred[b]) != width:
            raise ValueError(f"row {b}: candidates has {width} tokens, target_predict {len(pred[b])}; "
                             f"both need the same B >= 1")
        n = 0                                   # drafts accepted so far
        while n + 1 < width and cand[b][n + 1] == pred[b][n]:
            n += 1
        correct.append(n)
        bonus.append(pred[b][n])
    return correct, bonus
