"""The op registry: every op with an optimized and a reference implementation, described once.

One module per op family, each holding its records (`RECORDS`) with their samples, recipes and
error inputs; `core` holds the record types and the machinery they share. REGISTRY is the single
source every differential, property, golden and conformance test expands from.
"""

from __future__ import annotations

from specverify.conformance.registry.core import (  # noqa: F401
    CLOSE, EDGE_KINDS, EXACT, IMPL_ENV, POLICIES, SAMPLE_OPTION, ErrorInput, OpSpec, SampleInput, compare_outputs,
    load_impl, missing_op, on_device, replay_command, run_impl, select_samples, validate_record,
)
from specverify.conformance.registry import (
    attention, dflash, draft_search, emit, layers, protocol, sampling, selection, state_commit, tree_verify,
)

FAMILIES = (selection, tree_verify, draft_search, dflash, sampling, attention, state_commit, protocol, layers, emit)

# The records in the order the tests list them (golden files and test ids name ops, not positions).
ORDER = ("select_draft_topk", "select_draft_topk_triton", "draft_tree", "draft_tree_triton", "expand_beams",
         "expand_beams_triton", "keep_candidates", "keep_candidates_triton", "verify_greedy", "verify_stochastic", "verify_naive", "sampling_probs", "sample_from_probs", "logprob_rows", "quantize_fp8", "convert_logits", "row_argmax", "row_argmax_triton",
         "paged_attention", "paged_attention_triton", "paged_attention_tensor_cores", "create_draft_kv_indices", "create_draft_kv_indices_triton",
         "token_slots", "token_slots_triton", "commit_accepted_kv", "commit_accepted_kv_triton",
         "decode_attention_indexed", "decode_attention_indexed_triton", "mamba_state_scatter",
         "mamba_state_scatter_triton", "message_codec", "dflash_correct_drafts_and_bonus",
         "dflash_correct_drafts_and_bonus_triton", "add_rmsnorm", "add_rmsnorm_triton", "rotary_kv_write",
         "rotary_kv_write_triton", "silu_mul", "silu_mul_triton", "norm_matmul", "norm_matmul_triton", "embed_concat",
         "embed_concat_triton", "emit_tokens", "emit_tokens_triton", "accepted_tokens",
         "accepted_tokens_triton", "draft_plan", "draft_plan_triton", "draft_plan_slots", "draft_plan_slots_triton",
         "chain_verify_rows", "chain_verify_rows_triton", "chain_verify_rows_slots", "chain_verify_rows_slots_triton")


def _assemble() -> dict[str, OpSpec]:
    records = {op.name: op for family in FAMILIES for op in family.RECORDS}
    unlisted = sorted(set(records) - set(ORDER))
    if unlisted or len(records) != len(ORDER):
        raise ValueError(f"registry: ORDER and the families' records disagree (unlisted: {unlisted}, "
                         f"missing: {sorted(set(ORDER) - set(records))})")
    return {name: records[name] for name in ORDER}


REGISTRY: dict[str, OpSpec] = _assemble()
