"""The recurrent-state commit after a verify (docs/semantics.md 6.8), shared by the speculative
cycles: each request keeps the state its recurrent layers reached after its last accepted node.

The verify leaves, per recurrent layer, the state after every node of every lane
([bs, D, *state], `ForwardOutput.rec_states`); the commit stacks them into the intermediate cache
[L, bs, D, *state] and scatters each live lane's `step` into its slot-table row with
`ops.mamba_state_scatter` (a lane with step -1, finished or padded, commits nothing). Keyword-only,
as every commit API: a step passed as a slot must not be expressible by position.
"""

from __future__ import annotations

import torch

from specverify.models.kv_cache import StateBuffers
from specverify.ops import mamba_state_scatter


def commit_recurrent_states(*, states: StateBuffers, intermediate: list[torch.Tensor], rows: torch.Tensor,
                            steps: torch.Tensor) -> None:
    """states: the cache's state buffers ([L, rows, *state]); intermediate: per recurrent layer
    [bs, D, *state]; rows: [bs] int64 each lane's slot-table row; steps: [bs] int64 the node whose
    state a lane commits (topk == 1: accepted count - 1; a tree: the position of its last accepted
    node), -1 to commit nothing."""
    if not intermediate:
        return
    src = torch.stack(intermediate).to(states.stacked.dtype)
    mamba_state_scatter(dst=states.stacked, src=src, dst_indices=rows, step_indices=steps, checked=False)
