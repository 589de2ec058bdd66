"""SGLang's speculative-decoding kernels behind the registry's op interface.

    pytest --pyargs specverify.conformance --sv-impl specverify.conformance.adapters.sglang:IMPL

Every output is computed by SGLang's own code (sglang/kernels/ops/, Triton and torch), imported,
never copied; the adapter only builds the buffers SGLang's callers build and converts layouts.

| registry op | SGLang (sglang/kernels/ops/...) |
|---|---|
| row_argmax, row_argmax_triton | speculative/row_argmax.py `row_argmax` (one function: both records) |
| select_draft_topk (topk == 1) | speculative/topk1.py `draft_topk1_postprocess` |
| draft_tree | speculative/spec_tree.py `sgl_build_tree_kernel_triton` (the tree build only, see below) |
| verify_greedy | speculative/spec_tree.py `verify_tree_greedy_triton` |
| verify_naive (draft_q mode) | speculative/reject_sampling.py `chain_speculative_sampling_triton` |
| dflash_correct_drafts_and_bonus | speculative/dflash.py `compute_dflash_correct_drafts_and_bonus` |
| dflash_correct_drafts_and_bonus_triton | its Triton kernel `_fused_correct_drafts_and_bonus_kernel` |
| mamba_state_scatter | mamba/mamba_state_scatter_triton.py `fused_mamba_state_scatter_with_mask` |
| mamba_state_scatter_triton | its Triton kernel `_fused_mamba_state_scatter_with_mask_kernel` |

On a CPU the Triton kernels run under the Triton interpreter (TRITON_INTERPRET=1, which the
plugin sets before triton is imported when there is no GPU). Two of SGLang's public wrappers
decide by device: `compute_dflash_correct_drafts_and_bonus` runs a torch path for non-CUDA tensors
and `fused_mamba_state_scatter_with_mask` refuses them. So the plain records hold the public
function as SGLang's callers meet it (on a CPU: the dflash torch path; the Mamba scatter reported
unsupported, with SGLang's own refusal), and the `_triton` records hold the Triton kernel itself:
through the public function on CUDA, launched here on a CPU with exactly the wrapper's launch
arguments (marked "the wrapper's launch" below).

Conventions, declared where SGLang's semantics differ from specverify's:
- select_draft_topk: `argmax_nan: nan_ignored`. topk1's kernel replaces NaN by -1e30 before its
  argmax, on purpose (its comment: keep NaN lanes from selecting the masked tail).
- row_argmax declares nothing: its docstring promises `x.argmax(dim=-1)`, torch's rule (the first
  NaN wins). Whether it keeps that promise is what the run finds out.
- verify_naive: SGLang accepts when `coin * q(d) < p(d)` in float32 (strict: "lt", specverify's
  rule written as a product) and only when 0 < q(d) <= 1; nothing to declare: where the product,
  the float32 rounding or the q(d) = 0 rule decide otherwise than specverify's float64 quotient,
  the sample fails and the report shows it.

Loading (never at import time of this module; `load()` or the first op call):
1. SPECVERIFY_SGLANG_ROOT, when set, names a directory holding an extracted `sglang/` tree (the
   wheel's files), or the wheel file itself (its few needed files are extracted once into a
   temporary directory). The cp312 wheel cannot be pip-installed into every Python, but the
   modules used here are plain Python + Triton.
2. Otherwise an installed `sglang`: each module is imported normally (`import sglang...`); where
   that import fails (sglang installed with --no-deps: `import sglang` needs transformers and
   more), the module is loaded from the installed package's files instead, as in 1.
3. Neither: EngineMissing, one line.
Loading from files runs only the module itself: its `sglang.*` imports are answered, for the
duration of its execution only, by the real files where they are plain torch code
(`ops/memory/ptr_table.py`) and by the stand-ins of `_stand_ins()` for the `sglang.srt` runtime
helpers (platform probes and the SM count, none of which the functions used here call).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys
import tempfile
import types
import zipfile
from pathlib import Path

from specverify.conformance.adapters import EngineMissing, Unsupported

ROOT_ENV = "SPECVERIFY_SGLANG_ROOT"

# key -> the module's dotted name in the sglang package
MODULES = {
    "row_argmax": "sglang.kernels.ops.speculative.row_argmax",
    "topk1": "sglang.kernels.ops.speculative.topk1",
    "spec_tree": "sglang.kernels.ops.speculative.spec_tree",
    "reject_sampling": "sglang.kernels.ops.speculative.reject_sampling",
    "dflash": "sglang.kernels.ops.speculative.dflash",
    "mamba": "sglang.kernels.ops.mamba.mamba_state_scatter_triton",
}
# Imported by those modules and loaded from its file too (plain torch: a pointer-table helper).
HELPERS = {"sglang.kernels.ops.memory.ptr_table": "sglang/kernels/ops/memory/ptr_table.py"}
# Loaded modules live under this private name, so that a real `import sglang` later is unaffected.
PRIVATE = "_specverify_sglang"


def _file_of(dotted: str) -> str:
    return dotted.replace(".", "/") + ".py"


# ---------------------------------------------------------------------------------------------
# locating the files and the version


def _version_from_metadata(text: str) -> str | None:
    found = re.search(r"^Version:\s*(\S+)", text, re.MULTILINE)
    return found.group(1) if found else None


def _version_of_tree(root: Path) -> str:
    """The version of an extracted tree: a dist-info beside `sglang/`, or sglang/version.py."""
    for meta in sorted(root.glob("sglang-*.dist-info/METADATA")):
        version = _version_from_metadata(meta.read_text(encoding="utf-8", errors="replace"))
        if version:
            return version
    version_py = root / "sglang" / "version.py"
    if version_py.is_file():
        found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", version_py.read_text(encoding="utf-8"))
        if found:
            return found.group(1)
    return "unknown"


def _extract_wheel(wheel: Path) -> Path:
    """Extract the files this adapter loads (and the dist-info METADATA) from the wheel, once per
    wheel, into a temporary directory; returns the directory holding `sglang/`."""
    stat = wheel.stat()
    target = Path(tempfile.gettempdir()) / f"specverify-sglang-{wheel.stem}-{stat.st_size}"
    if (target / ".complete").is_file():
        return target
    wanted = {_file_of(name) for name in MODULES.values()} | set(HELPERS.values())
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        members = [n for n in names if n in wanted or re.fullmatch(r"sglang-[^/]+\.dist-info/METADATA", n)]
        missing = sorted(wanted - set(members))
        if missing:
            raise EngineMissing(f"{ROOT_ENV}={wheel} is not an sglang wheel with its Triton kernels "
                                f"(missing {missing[0]})")
        # Extract beside the target and rename: concurrent workers never see a half-written tree.
        scratch = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
        zf.extractall(scratch, members)
        (scratch / ".complete").write_text(str(wheel), encoding="utf-8")
        try:
            scratch.rename(target)
        except OSError:               # another process got there first: use its copy
            import shutil
            shutil.rmtree(scratch, ignore_errors=True)
    return target


def _tree_from_env(value: str) -> Path:
    path = Path(value).expanduser()
    if path.is_file() and path.suffix == ".whl":
        return _extract_wheel(path)
    if path.is_dir():
        if not (path / _file_of(MODULES["row_argmax"])).is_file():
            raise EngineMissing(f"{ROOT_ENV}={value} holds no sglang/kernels/ops/ tree "
                                f"(expected {_file_of(MODULES['row_argmax'])} under it)")
        return path
    raise EngineMissing(f"{ROOT_ENV}={value} is neither a directory holding sglang/ nor an sglang wheel")


# ---------------------------------------------------------------------------------------------
# loading a module from its file


def _stand_ins() -> dict[str, types.ModuleType]:
    """The `sglang.srt` names the loaded modules import, as stand-ins (not SGLang code).

    spec_tree.py reads platform probes at import time to pick a backend for its `*_func`
    dispatchers (CUDA JIT, sgl_kernel, NPU): every probe answers False, so it imports none of them.
    The adapter calls only its Triton launchers, which read no probe. mamba_state_scatter_triton.py
    imports the SM count (it sizes the grid of its state-tracking kernels, which are not used here).
    """
    def no() -> bool:
        return False

    def reject_out_of_tree_path(platform, subsystem=""):
        raise RuntimeError(f"specverify's SGLang adapter stands in for sglang.srt.platforms: {subsystem} "
                           f"dispatch is not available here")

    def get_device_core_count(device_id: int = 0) -> int:
        return 0                      # SGLang falls back to its own default (132) on 0

    utils = types.ModuleType("sglang.srt.utils")
    for probe in ("is_cpu", "is_cuda", "is_hip", "is_musa", "is_npu", "is_xpu"):
        setattr(utils, probe, no)
    common = types.ModuleType("sglang.srt.utils.common")
    common.get_device_core_count = get_device_core_count
    platforms = types.ModuleType("sglang.srt.platforms")
    platforms.current_platform = None
    interface = types.ModuleType("sglang.srt.platforms.interface")
    interface.reject_out_of_tree_path = reject_out_of_tree_path
    return {"sglang.srt.utils": utils, "sglang.srt.utils.common": common, "sglang.srt.platforms": platforms,
            "sglang.srt.platforms.interface": interface}


def _exec_file(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module        # Triton resolves a kernel's globals through its module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _answering_sglang_imports(tree: Path):
    """While a module executes, `sglang.*` names it imports resolve to empty package shells, the
    helper files and the stand-ins; every name added to sys.modules is removed afterwards (names
    already there, e.g. a partly importable real sglang, are left alone and used)."""
    provided: dict[str, types.ModuleType] = {}
    for dotted, rel in HELPERS.items():
        name = f"{PRIVATE}.{dotted}"
        provided[dotted] = sys.modules.get(name) or _exec_file(tree / rel, name)
    provided.update(_stand_ins())
    for dotted in list(provided):
        parts = dotted.split(".")
        for i in range(1, len(parts)):
            shell = ".".join(parts[:i])
            if shell not in provided:
                provided[shell] = types.ModuleType(shell)
                provided[shell].__path__ = []           # a package with no files: nothing else imports
    for dotted, module in provided.items():              # `from a.b import c` reads attributes
        parent, _, leaf = dotted.rpartition(".")
        if parent in provided:
            setattr(provided[parent], leaf, module)
    added = [name for name in provided if name not in sys.modules]
    for name in added:
        sys.modules[name] = provided[name]
    try:
        yield
    finally:
        for name in added:
            sys.modules.pop(name, None)


def _load_from_tree(tree: Path, dotted: str) -> types.ModuleType:
    with _answering_sglang_imports(tree):
        return _exec_file(tree / _file_of(dotted), f"{PRIVATE}.{dotted}")


# ---------------------------------------------------------------------------------------------
# the implementation object


class SGLangKernels:
    """SGLang's speculative Triton kernels (see the module docstring for the op map)."""

    conventions: dict = {}
    op_conventions = {"select_draft_topk": {"argmax_nan": "nan_ignored"}}

    def __init__(self):
        self._source: str | None = None        # how the modules were found (for versions())
        self._tree: Path | None = None          # a directory holding sglang/, when loading from files
        self._installed = False
        self._version: str | None = None
        self._modules: dict[str, types.ModuleType] = {}
        self._how: dict[str, str] = {}

    # -- loading --------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        try:
            self._locate()
        except EngineMissing:
            return "sglang (not installed)"
        return f"sglang {self._version}"

    def _locate(self) -> None:
        if self._source is not None:
            return
        root = os.environ.get(ROOT_ENV)
        if root:
            self._tree = _tree_from_env(root)
            self._version = _version_of_tree(self._tree)
            # The file name only: the report should not carry this machine's paths.
            kind = "wheel" if Path(root).suffix == ".whl" else "extracted tree"
            self._source = f"{kind} {Path(root).name} ({ROOT_ENV})"
            return
        spec = importlib.util.find_spec("sglang")       # finds the package without importing it
        if spec is None or not spec.submodule_search_locations:
            raise EngineMissing(f"sglang is not installed (pip install sglang, or set {ROOT_ENV} to its "
                                f"wheel or an extracted sglang/ tree)")
        self._installed = True
        self._tree = Path(list(spec.submodule_search_locations)[0]).parent
        try:
            self._version = importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            self._version = _version_of_tree(self._tree)
        self._source = "installed package"

    def load(self) -> dict:
        """Locate SGLang (EngineMissing when absent) and load every module the ops use."""
        self._locate()
        for key in MODULES:
            self._module(key)
        return dict(self._modules)

    def _module(self, key: str) -> types.ModuleType:
        if key in self._modules:
            return self._modules[key]
        self._locate()
        dotted = MODULES[key]
        module, how = None, "loaded from its file"
        if self._installed:
            try:
                module, how = importlib.import_module(dotted), "imported"
            except Exception as err:      # noqa: BLE001 -- e.g. `import sglang` needing its runtime deps
                how = f"loaded from its file (import failed: {type(err).__name__}: {err})"
        if module is None:
            if not (self._tree / _file_of(dotted)).is_file():
                raise EngineMissing(f"sglang {self._version} at {self._tree} has no {_file_of(dotted)}")
            module = _load_from_tree(self._tree, dotted)
        self._modules[key], self._how[key] = module, how
        return module

    def versions(self) -> dict:
        """sglang's version, where its files came from and how its modules were loaded (the report
        records torch, triton and the interpreter itself)."""
        self._locate()
        hows = set(self._how.values())
        if len(hows) == 1:
            loaded = hows.pop().replace("from its file", "from their files")
        else:
            loaded = "; ".join(f"{MODULES[k].rsplit('.', 1)[1]} {h}" for k, h in sorted(self._how.items()))
        loaded = loaded or "none yet"
        return {"sglang": self._version, "sglang source": self._source, "sglang modules": loaded}

    @staticmethod
    def _launchable(kernel, device) -> None:
        """A Triton kernel launched here on CPU tensors must be an interpreted one."""
        if device.type != "cuda" and type(kernel).__name__ != "InterpretedFunction":
            raise RuntimeError(f"SGLang's Triton kernels on {device} tensors need the Triton interpreter: "
                               f"set TRITON_INTERPRET=1 before triton is imported")

    # -- selection ------------------------------------------------------------------------------

    def row_argmax(self, x):
        import torch
        # SGLang's row_argmax takes float32 rows only (it asserts it): its callers hand it float32
        # logits. Upcasting bf16 / fp16 / fp8 to float32 is exact, and float32 is what the
        # registry's argmax compares (the upcast values).
        out = self._module("row_argmax").row_argmax(x.to(torch.float32).contiguous())
        return {"index": out.view(-1, 1)}           # SGLang: [N] int64; the registry: [N, 1]

    row_argmax_triton = row_argmax                  # SGLang has one row argmax: both records hold it

    def select_draft_topk(self, logits, scale, topk):
        import torch
        if topk != 1:
            raise Unsupported(f"topk={topk}: SGLang's draft kernel draft_topk1_postprocess is the topk == 1 path "
                              f"(topk > 1 is torch.topk in sglang.srt, not a kernel)")
        # The kernel reads float32 / bf16 / fp16 as they are; SGLang never sees FP8 logits, so those
        # are handed over upcast (exact). `scale` is not read: at topk == 1 the index is the argmax of
        # the upcast logits (docs/semantics.md 6.1) and SGLang computes no probability.
        if logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            logits = logits.to(torch.float32)
        # `positions` is SGLang's caller-owned buffer the finalizer advances by one: a scratch here.
        positions = torch.zeros(logits.shape[0], dtype=torch.int64, device=logits.device)
        _, index = self._module("topk1").draft_topk1_postprocess(logits.contiguous(), positions)
        # p: SGLang returns the constant 1.0 (topk == 1 drafting is greedy, its chain probabilities
        # are unused downstream), as specverify's own argmax fast path does: nothing to compare.
        return {"index": index, "p": None}

    # -- draft tree and verify ------------------------------------------------------------------

    def draft_tree(self, dists, roots, seq_lens, topk, steps, d):
        """The tree build of SGLang's EAGLE draft: `sgl_build_tree_kernel_triton` (FULL_MASK, the
        GPU default), fed the kept candidates of the search, its outputs converted to the registry's
        tree fields.

        The search itself (per-step top-k, path scores, the D-1 best) is SGLang's torch code in
        sglang.srt.speculative (spec_utils / eagle_utils, modules importing the whole runtime), not
        a kernel of the wheel: here specverify's own search runs (the one its draft_tree record
        runs), so its outputs `kept_flat` and `tokens` (the root, then the kept candidates' tokens)
        are specverify's and are not compared (None). Everything else is SGLang's kernel's."""
        import torch
        from specverify import ops
        from specverify.spec.eagle import expand_search, finish_search, start_search
        spec_tree = self._module("spec_tree")
        self._launchable(spec_tree.sgl_build_tree_kernel_efficient_triton, roots.device)
        bs, _, vocab = dists[0].shape
        dev = roots.device
        p0, i0 = ops.topk_stable(dists[0][:, 0], topk)
        search = start_search(p0, i0, steps)
        for step in range(1, steps):
            p, idx = ops.topk_stable(dists[step].reshape(bs * topk, vocab), topk)
            expand_search(search, step, p.view(bs, topk, topk), idx.view(bs, topk, topk))
        kept_flat, _, beam_flat = finish_search(search, d)
        # SGLang's inputs, in its layout (eagle_utils.organize_draft_results): the flat candidate
        # index is the same as specverify's (step 0: 0..k-1; step i: k + (i-1)k^2 + parent*k + child);
        # top_scores_index = the kept flat indices, sorted; parent_list = [-1, then the flat index of
        # every beam chosen at steps 0..S-2] (bs, 1 + (S-1)k), empty (bs, 0) when S == 1.
        if steps > 1:
            parent_list = torch.cat([torch.full((bs, 1), -1, dtype=torch.int64, device=dev),
                                     beam_flat.reshape(bs, (steps - 1) * topk).to(torch.int64)], dim=1)
        else:
            parent_list = torch.empty((bs, 0), dtype=torch.int64, device=dev)
        selected = kept_flat.to(torch.int64).contiguous()
        lens = seq_lens.to(torch.int64)
        # The buffers as eagle_utils.build_tree_kernel_efficient allocates them: a FULL_MASK of
        # sum(L) * D + D * D * bs entries filled True, retrieve_* filled -1, positions empty.
        total = int(lens.sum()) * d + d * d * bs
        tree_mask = torch.ones(total, dtype=torch.bool, device=dev)
        retrieve = torch.full((3, bs, d), -1, dtype=torch.int64, device=dev)
        positions = torch.empty(bs * d, dtype=torch.int64, device=dev)
        if bs > 0:
            spec_tree.sgl_build_tree_kernel_triton(parent_list, selected, lens, tree_mask, positions, retrieve[0],
                                                   retrieve[1], retrieve[2], topk, steps, d,
                                                   spec_tree.TreeMaskMode.FULL_MASK)
        index, next_token, next_sibling = retrieve
        # FULL_MASK layout: request b owns D rows of L_b + D entries from offset D*D*b + D*sum(L_<b);
        # row j's columns [0, L_b) are the prefix (left as filled), column L_b + a is draft node a.
        prefix = torch.cumsum(lens, 0) - lens
        base = d * d * torch.arange(bs, device=dev) + d * prefix                        # [bs]
        rows = torch.arange(d, device=dev)
        row_start = base[:, None] + rows[None, :] * (lens[:, None] + d)                 # [bs, D]
        cols = row_start[:, :, None] + lens[:, None, None] + rows[None, None, :]       # [bs, D, D]
        mask = tree_mask[cols]
        # The prefix columns are the caller's (filled True) and no kernel may write them: check it,
        # since the registry's mask has no place to show it.
        prefix_cols = [torch.arange(int(s), int(s) + int(n), device=dev)
                       for s, n in zip(row_start.flatten().tolist(), lens.repeat_interleave(d).tolist())]
        if prefix_cols and not bool(tree_mask[torch.cat(prefix_cols)].all()):
            raise AssertionError("SGLang's tree kernel wrote into the prefix columns of its FULL_MASK")
        return {"tokens": None, "kept_flat": None,
                "parents": self._parents(next_token, next_sibling),
                "positions": positions.view(bs, d),
                "mask": mask,
                "first_child": next_token,                  # retrieve_next_token: the first child
                "next_sibling": next_sibling,
                "flat_index": index}                        # retrieve_index: b * D + j

    @staticmethod
    def _parents(first_child, next_sibling):
        """The parents array the linked form (first child / next sibling) encodes: every node
        reached from p's first child along the sibling links is p's child; -1 elsewhere (the root,
        and orphans, which SGLang links to nothing). At most D links are followed per node."""
        import torch
        bs, d = first_child.shape
        fc, ns = first_child.tolist(), next_sibling.tolist()
        parents = [[-1] * d for _ in range(bs)]
        for b in range(bs):
            for p in range(d):
                c, hops = fc[b][p], 0
                while 0 <= c < d and hops < d:
                    parents[b][c] = p
                    c, hops = ns[b][c], hops + 1
        return torch.tensor(parents, dtype=torch.int64).view(bs, d)

    def verify_greedy(self, tree, logits, steps, probs, coins, final):
        """SGLang's greedy tree verify (`verify_tree_greedy_triton`) with the buffers eagle_utils'
        verify allocates; probs / coins / final are not read by a greedy verify."""
        import torch
        spec_tree = self._module("spec_tree")
        dev = logits.device
        self._launchable(spec_tree.verify_tree_greedy_kernel_triton, dev)
        bs, d, _ = logits.shape
        width = steps + 1
        # target_predict as SGLang's verify computes it: torch.argmax of the target logits,
        # reshaped [bs, D]. The upcast (exact) because torch has no argmax for FP8 tensors.
        target_predict = torch.argmax(logits.to(torch.float32), dim=-1).reshape(bs, d)
        predicts = torch.zeros(bs * d, dtype=torch.int32, device=dev)
        accept_index = torch.full((bs, width), -1, dtype=torch.int32, device=dev)
        accept_num = torch.empty((bs,), dtype=torch.int32, device=dev)
        if bs > 0:
            spec_tree.verify_tree_greedy_triton(predicts, accept_index, accept_num, tree["tokens"].contiguous(),
                                                tree["flat_index"].contiguous(), tree["first_child"].contiguous(),
                                                tree["next_sibling"].contiguous(), target_predict.contiguous())
        return self._chain_outputs(predicts, accept_index, accept_num, d)

    @staticmethod
    def _chain_outputs(predicts, accept_index, accept_num, d):
        """SGLang's verify outputs -> the registry's: accept_index holds global node indices
        (b * D + j) -> node indices j (-1 stays -1); the bonus is what SGLang wrote into
        predicts at the last accepted node (predicts[accept_index[b, num_correct]])."""
        import torch
        bs = accept_index.shape[0]
        dev = accept_index.device
        acc = accept_index.to(torch.int64)
        offset = (d * torch.arange(bs, device=dev))[:, None]
        nodes = torch.where(acc >= 0, acc - offset, acc)
        num = accept_num.to(torch.int64)
        last = acc.gather(1, num.view(bs, 1)).view(bs) if bs else num
        bonus = predicts.to(torch.int64)[last] if bs else num
        return {"accept_nodes": nodes, "num_correct": num, "bonus": bonus}

    @staticmethod
    def _uniform32(u):
        """A float64 uniform of [0, 1) as the float32 at or below it (rounded toward zero)."""
        import torch
        f = u.to(torch.float32)
        return torch.where(f.to(u.dtype) > u, torch.nextafter(f, torch.zeros_like(f)), f)

    def verify_naive(self, probs, draft, coin, final, mode):
        """The chain [root, d] through SGLang's classic chain rejection sampler (the default of
        eagle_utils; block verification is an option it does not take by default).

        In SGLang's layout: candidates [bs, 2] = (root token, d) (the root's token is not read),
        retrieve_index [bs, 2] = (2b, 2b + 1), uniform_samples [bs, 1] = coin, the final uniform
        [bs], target_probs [bs, 2, V] = (p_0, p_1), draft_probs [bs, 1, V] = q.

        The kernel is float32 code: its callers pass float32 (softmax outputs, torch.rand coins)
        and, compiled for CUDA, it refuses float64 (its float32 running sums would change type in
        their loops: a CompilationError). So the registry's float64 values are rounded to float32:
        the probabilities to nearest (what a float32 softmax holds), the uniforms toward zero, so
        that they stay uniforms of [0, 1) as torch.rand draws them (to nearest, a coin one float64
        ulp below 1 would become 1.0, which no float32 uniform is). The shortcut mode (only q(d)
        known, a rejection drawing from p_0) has no form in SGLang's sampler, whose residual is
        always max(p - q, 0)."""
        import torch
        if "draft_q" not in mode:
            raise Unsupported("SGLang's chain sampler needs the draft's distribution q (draft_q); "
                              "the shortcut (draft_p, residual p_0) has no form there")
        reject = self._module("reject_sampling")
        dev = probs.device
        self._launchable(reject.speculative_sampling_classic_kernel, dev)
        bs, _, vocab = probs.shape
        candidates = torch.stack([torch.zeros_like(draft), draft], dim=1).to(torch.int64).contiguous()
        retrieve_index = torch.arange(2 * bs, dtype=torch.int64, device=dev).view(bs, 2)
        next_token = torch.tensor([[1, -1]], dtype=torch.int64, device=dev).expand(bs, 2).contiguous()
        next_sibling = torch.full((bs, 2), -1, dtype=torch.int64, device=dev)    # unused by a chain
        predicts = torch.zeros(2 * bs, dtype=torch.int32, device=dev)
        accept_index = torch.full((bs, 2), -1, dtype=torch.int32, device=dev)
        accept_num = torch.empty((bs,), dtype=torch.int32, device=dev)
        if bs > 0:
            reject.chain_speculative_sampling_triton(
                predicts, accept_index, accept_num, candidates, retrieve_index, next_token, next_sibling,
                self._uniform32(coin).view(bs, 1).contiguous(), self._uniform32(final).contiguous(),
                probs.to(torch.float32).contiguous(), mode["draft_q"].to(torch.float32).view(bs, 1, vocab).contiguous(),
                1.0, 1.0, True)
        return self._chain_outputs(predicts, accept_index, accept_num, 2)

    # -- DFlash ---------------------------------------------------------------------------------

    @staticmethod
    def _refused(err: Exception) -> Unsupported:
        return Unsupported(f"SGLang refuses it: {type(err).__name__}: {err}")

    def dflash_correct_drafts_and_bonus(self, candidates, target_predict):
        """The public function as SGLang's callers meet it: its Triton kernel for CUDA tensors,
        its torch path otherwise. It refuses an empty batch (ValueError): reported unsupported."""
        dflash = self._module("dflash")
        try:
            correct, bonus = dflash.compute_dflash_correct_drafts_and_bonus(candidates=candidates,
                                                                            target_predict=target_predict)
        except ValueError as err:
            if candidates.shape[0] != 0:
                raise
            raise self._refused(err) from None
        return {"correct": correct, "bonus": bonus}

    def dflash_correct_drafts_and_bonus_triton(self, candidates, target_predict):
        """SGLang's Triton kernel: on CUDA through the public function; on a CPU (where the
        function would take its torch path) launched here, interpreted, with the wrapper's launch."""
        import torch
        import triton
        if candidates.device.type == "cuda" or candidates.shape[0] == 0:
            return self.dflash_correct_drafts_and_bonus(candidates, target_predict)   # bs == 0: its refusal
        dflash = self._module("dflash")
        kernel = dflash._fused_correct_drafts_and_bonus_kernel
        self._launchable(kernel, candidates.device)
        bs, block_size = candidates.shape
        # the wrapper's launch (dflash.compute_dflash_correct_drafts_and_bonus, CUDA branch)
        correct = torch.empty(bs, dtype=torch.int32, device=candidates.device)
        bonus = torch.empty(bs, dtype=torch.int64, device=candidates.device)
        kernel[(bs,)](candidates.contiguous(), target_predict.contiguous(), correct, bonus, block_size,
                      BLOCK=triton.next_power_of_2(max(block_size - 1, 1)))
        return {"correct": correct, "bonus": bonus}

    # -- Mamba state commit ---------------------------------------------------------------------

    @staticmethod
    def _with_bits(dst) -> dict:
        import torch
        bits = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
                torch.bfloat16: torch.int16}[dst.dtype]
        return {"dst": dst, "dst_bits": dst.view(bits)}

    def mamba_state_scatter(self, dst, src, dst_indices, step_indices):
        """The public function (it writes dst in place: it gets a copy, so the sample's own dst is
        untouched, and the copy is returned). SGLang refuses non-CUDA/XPU tensors: on a CPU every
        sample it launches for is reported unsupported with its message (an empty batch returns
        before the check, and is compared); mamba_state_scatter_triton runs its kernel there."""
        mamba = self._module("mamba")
        out = dst.clone()
        try:
            mamba.fused_mamba_state_scatter_with_mask(out, src, dst_indices, step_indices)
        except ValueError as err:
            if dst.device.type in ("cuda", "xpu"):
                raise
            raise self._refused(err) from None
        return self._with_bits(out)

    def mamba_state_scatter_triton(self, dst, src, dst_indices, step_indices):
        """SGLang's scatter kernel: on CUDA through the public function; on a CPU launched here,
        interpreted, with the wrapper's launch (int32 indices, src rows 0..bs-1, blocks of 1024)."""
        import torch
        import triton
        if dst.device.type == "cuda":
            return self.mamba_state_scatter(dst, src, dst_indices, step_indices)
        mamba = self._module("mamba")
        kernel = mamba._fused_mamba_state_scatter_with_mask_kernel
        self._launchable(kernel, dst.device)
        out = dst.clone()
        total = step_indices.shape[0]
        if total == 0:                                   # the wrapper returns before launching
            return self._with_bits(out)
        # the wrapper's launch (mamba_state_scatter_triton.fused_mamba_state_scatter_with_mask)
        layers, slots, nodes = out.shape[0], out.shape[1], src.shape[2]
        elem = out.numel() // (layers * slots)
        block = 1024
        src_c = src.contiguous()
        kernel[(total, layers, triton.cdiv(elem, block))](
            src_c, out, dst_indices.to(torch.int32).contiguous(), step_indices.to(torch.int32).contiguous(),
            torch.arange(total, dtype=torch.int32, device=dst.device), elem,
            src_c.stride(0), src_c.stride(1), src_c.stride(2), out.stride(0), out.stride(1),
            src_c.shape[1], nodes, slots, BLOCK_SIZE=block)
        return self._with_bits(out)


IMPL = SGLangKernels()
