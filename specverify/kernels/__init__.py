"""Kernels of the speculative ops: Triton kernels with torch fallbacks behind plain wrappers.

Only the wrappers are public; each validates its inputs, allocates the outputs, builds the grid and
launches (or runs the torch fallback). `impl="auto"` takes Triton for CUDA tensors and torch on
the CPU, where Triton only runs interpreted (TRITON_INTERPRET=1).
"""

from specverify.kernels.tree import DraftTree, build_tree, chain_tree, num_candidates
from specverify.kernels.verify import target_predict, verify_greedy, verify_naive, verify_stochastic

__all__ = ["DraftTree", "build_tree", "chain_tree", "num_candidates", "target_predict", "verify_greedy", "verify_naive",
           "verify_stochastic"]
