"""The recurrent-state commit after a verify (docs/semantics.md 6.8), shared by the speculative
cycles: each request keeps the state its recurrent layers reached after its last accepted node,
the recurrent state and the conv window together, and (with a tracking interval) its tracking
slot keeps the state at the last multiple of the interval.

The verify's forward writes the intermediate caches, the state after every node of every lane in
every recurrent layer ([L, bs, D, *state], `ForwardOutput.rec_states`, and the conv windows
`ForwardOutput.conv_states`); the commit scatters each live lane's `step` from them into its
slot-table row with `ops.mamba_state_scatter` (a lane with step -1,
finished or padded, commits nothing). Keyword-only, as every commit API: a step passed as a slot
must not be expressible by position.
"""

from __future__ import annotations

import torch

from specverify.models.kv_cache import StateBuffers
from specverify.ops import mamba_state_scatter


def commit_recurrent_states(*, states: StateBuffers, recurrent: torch.Tensor | None, conv: torch.Tensor | None,
                            rows: torch.Tensor, steps: torch.Tensor, tracking_steps: torch.Tensor | None = None) -> None:
    """states: the cache's state buffers; recurrent / conv: the verify's intermediate caches (layer
    order), the state [L, bs, D, nr, dk, dv] and the conv window [L, bs, D, W-1, C] after every node
    (`ForwardOutput.rec_states` / `conv_states`; None for a model without recurrent layers);
    rows: [bs] int64 each lane's slot-table row; steps: [bs] int64 the node whose state a lane
    commits (topk == 1: accepted count - 1; a tree: the position of its last accepted node), -1 to
    commit nothing; tracking_steps: [bs] int64 the node whose state goes to the lane's tracking
    slot (`tracking_step`), -1 for none; None skips the tracking commit."""
    if recurrent is None:
        return
    commits = [(rows, steps)]
    if tracking_steps is not None:
        commits.append((states.tracking_slot(rows), tracking_steps))
    for dst, src in ((states.stacked, recurrent), (states.conv_stacked, conv)):
        for slots, node in commits:
            mamba_state_scatter(dst=dst, src=src, dst_indices=slots, step_indices=node, checked=False)


def tracking_step(*, path: torch.Tensor, num_correct: torch.Tensor, seq_lens: torch.Tensor, interval: int,
                  live: torch.Tensor) -> torch.Tensor:
    """The node a lane's tracking slot commits: path [bs, W] the accepted nodes (path index i is
    the node whose state covers seq_lens + i + 1 tokens), num_correct [bs] the accepted drafts.
    The last path index i <= num_correct with (seq_lens + i + 1) % interval == 0 names the node;
    -1 where no accepted node ends on a multiple of the interval (the slot keeps its state)."""
    i = num_correct - (seq_lens + num_correct + 1) % interval
    node = path.gather(1, i.clamp(min=0)[:, None])[:, 0]
    return torch.where(live & (i >= 0), node, -1)
