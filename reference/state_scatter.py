"""The Mamba state commit after verify, read as plain loops (the contract of `mamba_state_scatter`,
docs/semantics.md 6.8):

- the state cache dst holds, per layer l and slot s, one state (a nested list of floats);
- the intermediate cache src holds, per layer l, request r (its position in the batch) and draft
  node d, the state after that node;
- request r with step_indices[r] = d >= 0 commits the state after node d into its slot
  dst_indices[r], in every layer; d = -1 commits nothing; no two committing requests share a slot;
- every other slot keeps what it held. Values are copied as they are (NaN, infinities, -0.0 and
  subnormals included): a copy, no arithmetic.
"""

from __future__ import annotations


def _copy(state):
    """A state (nested lists of numbers) copied leaf by leaf, each leaf a float."""
    if isinstance(state, (list, tuple)):
        return [_copy(x) for x in state]
    return float(state)


def mamba_state_scatter(*, dst, src, dst_indices, step_indices) -> list:
    """-> the state cache after the commit, as nested lists [L][S][*state]; the inputs are not
    changed. dst: [L][S][*state], src: [L][bs][D][*state], dst_indices / step_indices: bs ints
    (array-likes, indexed by plain loops)."""
    num_layers = len(dst)
    out = [[_copy(dst[layer][slot]) for slot in range(len(dst[layer]))] for layer in range(num_layers)]
    written = set()
    for r in range(len(step_indices)):
        step = int(step_indices[r])
        if step == -1:
            continue                                   # this request commits nothing
        slot = int(dst_indices[r])
        for layer in range(num_layers):
            num_slots, num_steps = len(dst[layer]), len(src[layer][r])
            if not 0 <= step < num_steps:
                raise ValueError(f"step_indices[{r}] = {step} is not -1 and not a draft node in [0, {num_steps})")
            if not 0 <= slot < num_slots:
                raise ValueError(f"dst_indices[{r}] = {slot} is not a slot in [0, {num_slots})")
            out[layer][slot] = _copy(src[layer][r][step])
        if slot in written:
            raise ValueError(f"dst_indices[{r}] = {slot}: a slot another committing request writes too")
        written.add(slot)
    return out
