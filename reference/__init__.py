"""The slow, pure reference of specverify: docs/semantics.md read as plain maths.

Independent of `specverify/` by construction (it imports nothing from it; a test enforces
this): float64 throughout, no KV cache, no fusion, no Triton. It gives

- `forward` / `forward_logits` / `tree_node_logits` / `recurrent_states`: the cache-free target model
  (section 1), and the recurrent layers' state after a token list;
- `convert_logits` / `greedy_token`: logits dtypes, FP8 included, and the tie rule (sections 2-3);
- `filtered_probs` / `draw` / `sample_token` / `counter_uniform`: sampling (section 4);
- `generate`: target-only generation (section 5), the output every decoder must reproduce;
- `select_draft_topk` / `topk_order` / `build_tree` / `greedy_verify` / `stochastic_verify` / `naive_verify`:
  the speculative ops (section 6), and `first_token_distribution` / `emitted_path_probability`,
  the exact law of stochastic verify's output;
- `eagle` (`generate_speculative`, `SpecReferenceOutput`, `RequestTrace`, `CycleTrace`, `NearTie`):
  a cache-free speculative decoder that returns its per-cycle trace and flags near-ties, with the
  EAGLE tree draft (section 6.5) and, by `algorithm="mtp"` / `"dflash"`, the MTP chain (one head per
  step, 6.10) and the DFlash bidirectional block (6.11); `eagle.draft_row` is the draft head;
- `naive_eagle` (`naive_eagle.generate`): the same for naive EAGLE (section 6.7), greedy and both
  sampling modes;
- `paged_attention`: attention of new queries over a paged KV cache, by plain loops;
- `create_draft_kv_indices` / `decode_attention_indexed`: naive EAGLE's flat KV index list of the
  fused verify, and decode attention over an explicit slot list per query;
- `mamba_state_scatter`: the Mamba state commit after verify (section 6.8), state after the last
  accepted node copied into the request's slot by plain loops;
- `dflash_correct_drafts_and_bonus`: DFlash's greedy block verify (section 6.9; its sampling
  variant is `stochastic_verify` on a chain);
- `commit_accepted_kv`: the accepted path's K/V moved down after a tree verify (6.16);
- `emit_tokens`: a decode step's EOS / max_new_tokens cut and the request state it moves (6.15);
- `accepted_tokens`: the candidate tokens a verify's accepted path makes, the emit's input in a cycle (6.17);
- `draft_plan`: where a draft phase's extend tokens and draft steps sit (6.18);
- `chain_verify_rows`: the chain each lane of a chain cycle verifies, read from its request row (6.19);
- `legacy_encode` / `legacy_decode` / `packed_header` / `split_header` / `packed_decode`: the
  speculative logprob message read byte by byte (docs/protocol.md).
"""

from reference import eagle, naive_eagle
from reference.attention import commit_accepted_kv, decode_attention_indexed, paged_attention, token_slots
from reference.dflash import dflash_correct_drafts_and_bonus
from reference.emit import accepted_tokens, chain_verify_rows, draft_plan, emit_tokens
from reference.eagle import CycleTrace, NearTie, RequestTrace, SpecReferenceOutput
from reference.eagle import generate as generate_speculative
from reference.generate import ReferenceOutput, TokenLogprob, generate, logprob_record
from reference.layers import add_rmsnorm, embed_concat, norm_matmul, rotary_kv_write, silu_mul
from reference.logits import ConvertedLogits, convert_logits, greedy_token, row_scale
from reference.model import forward, forward_logits, recurrent_states, tree_node_logits
from reference.naive_eagle_kv import create_draft_kv_indices
from reference.protocol import (
    DEFAULT_PROTOCOL_CAPACITY,
    ProtocolCapacity,
    legacy_decode,
    legacy_encode,
    packed_decode,
    packed_header,
    split_header,
)
from reference.sampling import counter_uniform, draw, filtered_probs, sample_token
from reference.spec import (
    RefTree,
    build_tree,
    emitted_path_probability,
    first_token_distribution,
    greedy_verify,
    naive_verify,
    select_draft_topk,
    stochastic_verify,
    topk_order,
)
from reference.state_scatter import mamba_state_scatter

__all__ = [
    "DEFAULT_PROTOCOL_CAPACITY",
    "ConvertedLogits",
    "CycleTrace",
    "NearTie",
    "RequestTrace",
    "SpecReferenceOutput",
    "ProtocolCapacity",
    "RefTree",
    "ReferenceOutput",
    "TokenLogprob",
    "accepted_tokens",
    "add_rmsnorm",
    "build_tree",
    "chain_verify_rows",
    "commit_accepted_kv",
    "convert_logits",
    "counter_uniform",
    "create_draft_kv_indices",
    "decode_attention_indexed",
    "dflash_correct_drafts_and_bonus",
    "draft_plan",
    "draw",
    "embed_concat",
    "emit_tokens",
    "emitted_path_probability",
    "filtered_probs",
    "eagle",
    "first_token_distribution",
    "forward",
    "forward_logits",
    "recurrent_states",
    "generate",
    "generate_speculative",
    "greedy_token",
    "greedy_verify",
    "naive_verify",
    "norm_matmul",
    "legacy_decode",
    "legacy_encode",
    "naive_eagle",
    "logprob_record",
    "mamba_state_scatter",
    "packed_decode",
    "packed_header",
    "paged_attention",
    "rotary_kv_write",
    "row_scale",
    "sample_token",
    "select_draft_topk",
    "silu_mul",
    "split_header",
    "stochastic_verify",
    "token_slots",
    "topk_order",
    "tree_node_logits",
]
