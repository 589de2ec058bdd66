"""The emit of a decode step (docs/semantics.md 6.15), request by request, in plain Python.

Each lane appends its candidate tokens one at a time, as section 5 reads: it stops after the token
that reaches its max_new_tokens or equals the EOS. What the step leaves in the request's row follows
from that: the emitted count grows by what was appended, the finished flag says whether it stopped,
the cached length grows by every candidate (the step cached them all), and the pending token is
the last candidate. A lane whose request already finished appends nothing and changes nothing.

In a speculative cycle the candidates come from the verify (6.17): the drafts on the accepted path,
read off the tree one by one, then the bonus token; the draft phase after it runs where 6.18 says.
"""

from __future__ import annotations


def emit_tokens(*, produced, count, rows, seq_len, pending, emitted, budget, finished, eos_token_id) -> dict:
    """produced: per lane a list of candidate tokens, count[b] of them real; rows: each lane's
    request-state row; seq_len, pending, emitted, budget, finished: the state, one entry per row.
    -> {"head": per lane the appended tokens padded with -1 to the width, then taken and finished
    (0 / 1); "taken"; "finished"; and the state after the step: "seq_len", "pending", "emitted",
    "finished_rows"}."""
    seq_len, pending, emitted, finished_rows = list(seq_len), list(pending), list(emitted), list(finished)
    head, taken_out, done_out = [], [], []
    for tokens, c, r in zip(produced, count, rows):
        width = len(tokens)
        appended = []
        stopped = bool(finished_rows[r])
        if not stopped:
            for t in tokens[:c]:
                appended.append(t)
                if emitted[r] + len(appended) >= budget[r] or t == eos_token_id:
                    stopped = True
                    break
            emitted[r] += len(appended)
            finished_rows[r] = stopped
            seq_len[r] += c
            pending[r] = tokens[c - 1]
        head.append(appended + [-1] * (width - len(appended)) + [len(appended), int(stopped)])
        taken_out.append(len(appended))
        done_out.append(stopped)
    return {"head": head, "taken": taken_out, "finished": done_out, "seq_len": seq_len, "pending": pending,
            "emitted": emitted, "finished_rows": finished_rows}


def accepted_tokens(*, tree_tokens, accept, num_correct, bonus) -> dict:
    """tree_tokens: per lane its tree's tokens (node 0 the root); accept: per lane the accepted
    nodes, root first; num_correct: per lane how many drafts were accepted; bonus: per lane the
    token after them. -> {"produced": per lane the accepted drafts' tokens, the bonus, then 0 up to
    the width of accept; "count": per lane the drafts plus the bonus}."""
    produced, count = [], []
    for tokens, path, n, extra in zip(tree_tokens, accept, num_correct, bonus):
        width = len(path)
        row = [tokens[path[depth]] for depth in range(1, n + 1)]
        row.append(extra)
        produced.append(row + [0] * (width - len(row)))
        count.append(len(row))
    return {"produced": produced, "count": count}


def draft_plan(*, q_lens, kv_lens, finished, width, num_steps, req_to_token=None, rows=None, ahead_tokens=None,
               sink=0) -> dict:
    """Where a draft phase's tokens sit (6.18), per lane: a finished lane drafts nothing; the
    others run their q_lens new tokens, token j (every one of the width columns, padding too) at
    position kv_lens + 1 + j; the last live one is the root, at position kv_lens + q_lens, in row
    q_lens - 1 (row 0 when there is none); the draft steps sit right after the root, one position
    each. -> {"q_lens", "positions", "last", "root", "ahead", "live"} as lists; with the slot table
    req_to_token (rows: each lane's row of it) also "slots", the cell of draft index kv_lens + j for
    each extend token that runs (`sink` for the others), and "ahead_slots", the cells of the
    ahead_tokens (default num_steps) indices from the root's on, on a live lane (`sink` on a
    finished one): an index past the row reads its last cell."""
    out = {"q_lens": [], "positions": [], "last": [], "root": [], "ahead": [], "live": []}
    if req_to_token is not None:
        out.update(slots=[], ahead_slots=[])
        count = num_steps if ahead_tokens is None else ahead_tokens
    for b, (q, kv, done) in enumerate(zip(q_lens, kv_lens, finished)):
        runs = 0 if done else q
        root = kv + runs
        out["q_lens"].append(runs)
        out["positions"].append([kv + 1 + j for j in range(width)])
        out["last"].append(runs - 1 if runs > 0 else 0)
        out["root"].append(root)
        out["ahead"].append([root + step for step in range(1, num_steps + 1)])
        out["live"].append(0 if done else 1)
        if req_to_token is None:
            continue
        cells = list(req_to_token[rows[b]])
        cell = lambda index: int(cells[min(index, len(cells) - 1)])     # noqa: E731
        out["slots"].append([cell(kv + j) if j < runs else sink for j in range(width)])
        out["ahead_slots"].append([sink if done else cell(root + i) for i in range(count)])
    return out


def chain_verify_rows(*, rows, seq_len, pending, finished, req_id, drafts, req_to_token=None, sink=0) -> dict:
    """The chain each lane verifies (6.19), read from its request row r: the root (the row's
    pending token) then the row's drafts, node j at position seq_len[r] + j, all of them live
    unless the request finished. -> {"tokens", "positions", "seq_lens", "req_ids", "live",
    "q_lens"} as lists; with the slot table req_to_token also "slots": node j's cell of row r at
    cache index seq_len[r] + j (the row's last cell past its end) on a live lane, `sink` on a
    finished one."""
    out = {"tokens": [], "positions": [], "seq_lens": [], "req_ids": [], "live": [], "q_lens": []}
    if req_to_token is not None:
        out["slots"] = []
    for r in rows:
        chain = [pending[r]] + list(drafts[r])
        alive = not finished[r]
        out["tokens"].append(chain)
        out["positions"].append([seq_len[r] + j for j in range(len(chain))])
        out["seq_lens"].append(seq_len[r])
        out["req_ids"].append(req_id[r])
        out["live"].append(alive)
        out["q_lens"].append(len(chain) if alive else 0)
        if req_to_token is not None:
            cells = list(req_to_token[r])
            out["slots"].append([int(cells[min(seq_len[r] + j, len(cells) - 1)]) if alive else sink
                                 for j in range(len(chain))])
    return out
