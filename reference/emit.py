"""The emit of a decode step (docs/semantics.md 6.15), request by request, in plain Python.

Each lane appends its candidate tokens one at a time, as section 5 reads: it stops after the token
that reaches its max_new_tokens or equals the EOS. What the step leaves in the request's row follows
from that: the emitted count grows by what was appended, the finished flag says whether it stopped,
the cached length grows by every candidate (the step cached them all), and the pending token is
the last candidate. A lane whose request already finished appends nothing and changes nothing.
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
