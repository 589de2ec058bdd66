"""SGLang's speculative-decoding kernels behind the registry's op interface.

    pytest --pyargs specverify.conformance --sv-impl specverify.conformance.adapters.sglang:IMPL

The kernels are SGLang's own (sglang/kernels/ops/, Triton + torch), imported, never copied:
- `row_argmax`, `row_argmax_triton` <- speculative/row_argmax.py `row_argmax` (float32 rows: the
  registry's logits are upcast first, exactly, as SGLang's verify upcasts its logits);
- `select_draft_topk` (topk == 1 only) <- speculative/topk1.py `draft_topk1_postprocess`, the
  topk == 1 fast path of the seeds. It returns p = 1.0 by design (the chain probabilities are unused
  downstream), so only `index` is compared; it reads NaN as -1e30 on purpose (declared:
  `argmax_nan: nan_ignored`);
- `verify_naive` (exact mode, with the draft's q) <- speculative/reject_sampling.py
  `chain_speculative_sampling_triton`, which takes the uniforms as tensors: compared token for token;
- `dflash_correct_drafts_and_bonus` (+ `_triton`) <- speculative/dflash.py
  `compute_dflash_correct_drafts_and_bonus` (its Triton kernel on CUDA, its torch path elsewhere);
- `mamba_state_scatter` (+ `_triton`) <- mamba/mamba_state_scatter_triton.py
  `fused_mamba_state_scatter_with_mask` (CUDA only: unsupported on a CPU).

Loading: an installed `sglang` is used as is. Otherwise SPECVERIFY_SGLANG_ROOT may name a directory
holding an extracted `sglang/kernels/` tree (the cp312 wheel cannot be pip-installed into every
Python, but its Triton modules are plain Python): the modules are then loaded from their files
under empty package shells, with two small stand-ins for the `sglang.srt` helpers they import
(`get_device_core_count`, used to size a grid). Nothing else of SGLang runs.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path


from specverify.conformance.adapters import EngineMissing, Unsupported

ROOT_ENV = "SPECVERIFY_SGLANG_ROOT"
MODULES = {
    "row_argmax": "sglang.kernels.ops.speculative.row_argmax",
    "topk1": "sglang.kernels.ops.speculative.topk1",
    "reject": "sglang.kernels.ops.speculative.reject_sampling",
    "dflash": "sglang.kernels.ops.speculative.dflash",
    "mamba": "sglang.kernels.ops.mamba.mamba_state_scatter_triton",
}
SHELLS = ("sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.speculative",
          "sglang.kernels.ops.mamba", "sglang.kernels.ops.memory")


def _version_from_tree(root: Path) -> str:
    for meta in sorted(root.glob("sglang-*.dist-info/METADATA")):
        for line in meta.read_text(encoding="utf-8").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return "unknown (no dist-info beside the tree)"


def _stand_ins() -> None:
    """The `sglang.srt` helpers the loaded modules import, as small stand-ins (not SGLang code)."""
    def get_device_core_count(device_id: int = 0) -> int:
        import torch
        return torch.cuda.get_device_properties(device_id).multi_processor_count if torch.cuda.is_available() else 1
    for name in ("sglang.srt", "sglang.srt.utils"):
        sys.modules.setdefault(name, types.ModuleType(name))
    common = types.ModuleType("sglang.srt.utils.common")
    common.get_device_core_count = get_device_core_count
    sys.modules.setdefault("sglang.srt.utils.common", common)


def _load_from_tree(root: Path) -> dict:
    if not (root / "sglang/kernels/ops/speculative/row_argmax.py").is_file():
        raise EngineMissing(f"sglang is not installed and {ROOT_ENV}={root} holds no sglang/kernels/ tree")
    for name in SHELLS:            # package shells: the submodules load from their files, no __init__ runs
        if name not in sys.modules:
            shell = types.ModuleType(name)
            shell.__path__ = [str(root / name.replace(".", "/"))]
            sys.modules[name] = shell
    _stand_ins()
    return {key: importlib.import_module(name) for key, name in MODULES.items()}


class SGLangKernels:
    conventions = {}
    op_conventions = {"select_draft_topk": {"argmax_nan": "nan_ignored"}}

    def __init__(self):
        self._modules = None
        self._version = None

    @property
    def name(self) -> str:
        return f"sglang {self._version or '(not loaded)'}"

    def load(self) -> dict:
        if self._modules is None:
            try:
                import sglang  # noqa: F401
                self._modules = {key: importlib.import_module(name) for key, name in MODULES.items()}
                self._version = getattr(sys.modules["sglang"], "__version__", "installed")
            except ImportError:
                root = os.environ.get(ROOT_ENV)
                if not root:
                    raise EngineMissing(f"sglang is not installed (and {ROOT_ENV} names no extracted "
                                        f"sglang/kernels tree)") from None
                self._modules = _load_from_tree(Path(root))
                self._version = _version_from_tree(Path(root))
        return self._modules

    def versions(self) -> dict:
        self.load()
        return {"sglang": self._version}

    # -- selection ------------------------------------------------------------------------------

    def row_argmax(self, x):
        out = self.load()["row_argmax"].row_argmax(x.float().contiguous())
        return {"index": out.view(-1, 1)}

    row_argmax_triton = row_argmax

    def select_draft_topk(self, logits, scale, topk):
        import torch
        if topk != 1:
            raise Unsupported("draft_topk1_postprocess is the topk == 1 path")
        positions = torch.zeros(logits.shape[0], dtype=torch.int64, device=logits.device)
        _, index = self.load()["topk1"].draft_topk1_postprocess(logits.float().contiguous(), positions)
        # p: SGLang returns the constant 1.0 (topk == 1 drafting is greedy; the chain probabilities
        # are unused downstream), not the softmax probability: not comparable, by design.
        return {"index": index.view(-1, 1), "p": None}

    # -- verify ---------------------------------------------------------------------------------

    def verify_naive(self, probs, draft, coin, final, mode):
        """The chain [root, draft]: candidates [bs, 2] (root token 0, then d), global node indices
        2b and 2b + 1, target_probs [bs, 2, V] (p_0, p_1), draft_probs [bs, 1, V] (q)."""
        import torch
        if "draft_q" not in mode:
            raise Unsupported("chain_speculative_sampling_triton needs the draft's distribution (draft_q)")
        bs, _, vocab = probs.shape
        dev = probs.device
        if bs == 0:
            empty = torch.zeros((0,), dtype=torch.int64, device=dev)
            return {"accept_nodes": torch.zeros((0, 2), dtype=torch.int64, device=dev), "num_correct": empty,
                    "bonus": empty}
        candidates = torch.stack([torch.zeros_like(draft), draft], dim=1).to(torch.int64)
        retrive = (torch.arange(2 * bs, device=dev, dtype=torch.int64)).view(bs, 2)
        unused = torch.full((bs, 2), -1, dtype=torch.int64, device=dev)
        predicts = torch.full((2 * bs,), -1, dtype=torch.int32, device=dev)
        accept_index = torch.full((bs, 2), -1, dtype=torch.int32, device=dev)
        accept_num = torch.zeros((bs,), dtype=torch.int32, device=dev)
        self.load()["reject"].chain_speculative_sampling_triton(
            predicts, accept_index, accept_num, candidates, retrive, unused, unused,
            coin.view(bs, 1).contiguous(), final.contiguous(), probs.contiguous(),
            mode["draft_q"].view(bs, 1, vocab).contiguous(), 1.0, 1.0, True)
        local = torch.where(accept_index >= 0, accept_index.to(torch.int64) - retrive[:, :1], -1)
        last = retrive.gather(1, accept_num.to(torch.int64).view(bs, 1)).view(bs)
        return {"accept_nodes": local, "num_correct": accept_num.to(torch.int64),
                "bonus": predicts.to(torch.int64)[last]}

    def dflash_correct_drafts_and_bonus(self, candidates, target_predict):
        correct, bonus = self.load()["dflash"].compute_dflash_correct_drafts_and_bonus(
            candidates=candidates, target_predict=target_predict)
        return {"correct": correct, "bonus": bonus}

    dflash_correct_drafts_and_bonus_triton = dflash_correct_drafts_and_bonus

    # -- state commit ---------------------------------------------------------------------------

    def mamba_state_scatter(self, dst, src, dst_indices, step_indices):
        import torch
        if not dst.is_cuda:
            raise Unsupported("fused_mamba_state_scatter_with_mask runs on CUDA / XPU tensors only")
        out = dst.clone()
        self.load()["mamba"].fused_mamba_state_scatter_with_mask(out, src.contiguous(), dst_indices, step_indices)
        bits = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
                torch.bfloat16: torch.int16}[out.dtype]
        return {"dst": out, "dst_bits": out.view(bits)}

    mamba_state_scatter_triton = mamba_state_scatter


IMPL = SGLangKernels()
