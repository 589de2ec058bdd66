"""Golden regeneration is a pure function of the catalogue and the library versions (issue 21):
`python -m specverify golden regen` must write the same bytes whatever the CPU's instruction set,
and whatever else of the process must not reach a golden.

Each run regenerates the whole catalogue with `specverify.golden.regen` (what the command calls:
every op golden's build() and reference outputs, the e2e goldens, this profile's accept-length
baselines, rendered by `specverify.golden.files.render`) into an empty directory, in a subprocess
with OMP_NUM_THREADS=1, one torch thread (as the command), TRITON_INTERPRET=1 and no GPU visible
(the cpu profile on every machine):

- `default`: ATEN_CPU_CAPABILITY=default (torch's CPU kernels without SIMD) and numpy's dispatched
  SIMD paths off (NPY_DISABLE_CPU_FEATURES): what a machine without AVX makes;
- the machine's own instruction set (torch picks it when ATEN_CPU_CAPABILITY is unset) and, on an
  x86 machine above avx2, avx2 too;
- `perturbed`: the default instruction set again, with what must never reach an input changed:
  uninitialized memory holds NaN / INT_MAX (torch.use_deterministic_algorithms with
  fill_uninitialized_memory: a generator that reads torch.empty differs), every kernel tuning
  constant (`*BLOCK*` ints of specverify.kernels) is doubled before the catalogue is imported (a
  shape taken from a kernel's block size differs), another PYTHONHASHSEED (an order taken from a
  set of strings differs).

Every run is held against `default` file for file, byte for byte; a difference names the first
differing golden, the array or JSON field, where it sits in the golden's tree, and its first
differing value. The fix is in the generator (specverify/conformance/strategies.py: integer draws, exact
arithmetic, one rounding to the dtype), never in golden/.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.golden

ROOT = Path(__file__).resolve().parents[2]
X86_ORDER = ("default", "avx2", "avx512")       # ATEN_CPU_CAPABILITY names, lowest first
TIMEOUT_S = 300
PERTURBED = "perturbed"
DEFAULT = "default"


# ---------------------------------------------------------------------------------------------
# the subprocess side


def _perturb() -> list[str]:
    """Change what no golden may depend on; run before the catalogue is imported."""
    import importlib
    import pkgutil

    import torch

    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True     # torch.empty: NaN, integers INT_MAX
    import specverify.kernels as kernels
    changed = []
    for info in sorted(pkgutil.iter_modules(kernels.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{kernels.__name__}.{info.name}")
        for name, value in sorted(vars(module).items()):
            if "BLOCK" in name and name.isupper() and isinstance(value, int) and not isinstance(value, bool):
                setattr(module, name, 2 * value)
                changed.append(f"{info.name}.{name} {value} -> {2 * value}")
    return changed


def _worker(root: str, perturb: bool) -> None:
    """Regenerate the whole catalogue into `root`; print one JSON line about the run."""
    changed = _perturb() if perturb else []
    import torch

    torch.set_num_threads(1)
    from specverify.golden import load_catalogue, regen

    start = time.perf_counter()
    report = regen(load_catalogue(), root, out=io.StringIO())
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability().lower(), "perturbed": changed,
                      "created": len(report.created), "seconds": round(time.perf_counter() - start, 2)}))


# ---------------------------------------------------------------------------------------------
# the test side


def _numpy_dispatch() -> str:
    """numpy's dispatched SIMD targets this machine runs (NPY_DISABLE_CPU_FEATURES turns them off)."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:          # another numpy layout: leave its dispatch alone
        return ""
    return " ".join(f for f in __cpu_dispatch__ if __cpu_features__.get(f))


def _env(capability: str | None, *, hash_seed: str, numpy_baseline: bool) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "PYTHONHASHSEED", "NPY_DISABLE_CPU_FEATURES", "ATEN_CPU_CAPABILITY",
                                "SPECVERIFY_PLATFORM"))}
    # The CPU profile on any machine (a GPU box too): what is compared is the CPU's instruction set.
    env.update(OMP_NUM_THREADS="1", TRITON_INTERPRET="1", PYTHONHASHSEED=hash_seed, PYTHONDONTWRITEBYTECODE="1",
               CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    if capability is not None:
        env["ATEN_CPU_CAPABILITY"] = capability
    if numpy_baseline and _numpy_dispatch():
        env["NPY_DISABLE_CPU_FEATURES"] = _numpy_dispatch()
    return env


@functools.lru_cache(maxsize=None)
def _tmp() -> Path:
    path = Path(tempfile.mkdtemp(prefix="sv-golden-portability-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@functools.lru_cache(maxsize=None)
def _run(name: str) -> tuple[Path, dict, str]:
    """(golden directory, the worker's JSON line, a description) of one named run."""
    if name == DEFAULT:
        capability, perturb, env = "default", False, _env("default", hash_seed="0", numpy_baseline=True)
    elif name == PERTURBED:
        capability, perturb, env = "default", True, _env("default", hash_seed="12345", numpy_baseline=True)
    elif name == "native":
        capability, perturb, env = None, False, _env(None, hash_seed="0", numpy_baseline=False)
    else:
        capability, perturb, env = name, False, _env(name, hash_seed="0", numpy_baseline=False)
    root = _tmp() / name
    cmd = [sys.executable, "-c", f"from tests.meta.test_golden_portability import _worker; "
                                 f"_worker({str(root)!r}, {perturb!r})"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, encoding="utf-8")
    if proc.returncode != 0:
        raise AssertionError(f"golden regeneration run {name!r} failed (exit {proc.returncode}):\n"
                             f"{(proc.stdout + proc.stderr)[-4000:]}")
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    if capability is not None and info["capability"] != capability:
        raise AssertionError(f"run {name!r} asked for ATEN_CPU_CAPABILITY={capability} but torch's kernels used "
                             f"{info['capability']!r}: the comparison would prove nothing")
    what = f"ATEN_CPU_CAPABILITY={info['capability']}"
    if env.get("NPY_DISABLE_CPU_FEATURES"):
        what += f", numpy SIMD off ({env['NPY_DISABLE_CPU_FEATURES']})"
    if perturb:
        what += (f", uninitialized memory NaN-filled, PYTHONHASHSEED {env['PYTHONHASHSEED']}, kernel constants "
                 f"{'; '.join(info['perturbed']) or 'none found'}")
    return root, info, f"{name} ({what})"


def _runs(names: list[str]) -> dict[str, tuple[Path, dict, str]]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:     # a 2-core box: two at a time
        return dict(zip(names, pool.map(_run, names)))


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _tree_paths(node, path: tuple[str, ...] = (), out: dict | None = None) -> dict[str, str]:
    """npz member name -> where in the golden's JSON tree the array sits."""
    out = {} if out is None else out
    if isinstance(node, dict):
        if isinstance(node.get("array"), str):
            out[node["array"]] = " / ".join(path) or "(root)"
        for key, value in node.items():
            if key != "order":
                _tree_paths(value, path if key.startswith("$") else (*path, key), out)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _tree_paths(value, (*path, f"[{i}]"), out)
    return out


def _first_json_difference(a, b, path: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{path}/{key}: present in one run only"
            found = _first_json_difference(a[key], b[key], f"{path}/{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            found = _first_json_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{path}: {json.dumps(a)[:120]} vs {json.dumps(b)[:120]}"


def _members(data: bytes) -> dict[str, np.ndarray]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {i.filename.removesuffix(".npy"): np.lib.format.read_array(io.BytesIO(z.read(i)), allow_pickle=False)
                for i in z.infolist()}


def _array_difference(x: np.ndarray, y: np.ndarray) -> str:
    if x.dtype != y.dtype or x.shape != y.shape:
        return f"{x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"
    bx, by = x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8)
    differ = np.nonzero((bx != by).reshape(-1, x.itemsize).any(axis=1))[0]
    at = np.unravel_index(int(differ[0]), x.shape) if x.ndim else ()
    return (f"{len(differ)} of {x.size} values differ in their bits, the first at {tuple(int(i) for i in at)}: "
            f"{x[at].item()!r} vs {y[at].item()!r}")


def _explain(name: str, a: dict[str, bytes], b: dict[str, bytes]) -> str:
    """The first difference inside golden `name` (its .json and .npz in two runs)."""
    ja, jb, za, zb = a.get(f"{name}.json"), b.get(f"{name}.json"), a.get(f"{name}.npz"), b.get(f"{name}.npz")
    if za is not None and zb is not None and za != zb:
        ma, mb = _members(za), _members(zb)
        where = _tree_paths(json.loads(ja)) if ja else {}
        for member in list(ma) + [m for m in mb if m not in ma]:
            if member not in ma or member not in mb:
                return f"array {member} made in one run only"
            if ma[member].tobytes() != mb[member].tobytes() or ma[member].shape != mb[member].shape:
                return (f"array {member} ({where.get(member, '?')}): "
                        f"{_array_difference(ma[member], mb[member])}")
    if ja is not None and jb is not None and ja != jb:
        found = _first_json_difference(json.loads(ja), json.loads(jb))
        return f"JSON field {found}" if found else "JSON bytes (same content, other layout)"
    return "its files differ"


def _difference(base: tuple[Path, dict, str], other: tuple[Path, dict, str]) -> str | None:
    a, b = _files(base[0]), _files(other[0])
    goldens = sorted({f.rsplit(".", 1)[0] for f in (*a, *b)})
    differ = [g for g in goldens if any(a.get(f"{g}.{s}") != b.get(f"{g}.{s}") for s in ("json", "npz"))]
    if not differ:
        return None
    first = differ[0]
    only = [f"{g} (made in one run only)" for g in differ if not all(f"{g}.json" in d for d in (a, b))]
    return (f"{len(differ)} of {len(goldens)} goldens differ between {base[2]} and {other[2]}: "
            f"{', '.join(differ[:8])}{' ...' if len(differ) > 8 else ''}\n"
            f"  first: golden {first}: {_explain(first, a, b)}\n"
            + (f"  {'; '.join(only)}\n" if only else "")
            + "  a golden must be a pure function of the catalogue and the library versions: build its inputs "
              "from integer draws and exact arithmetic, rounded once to the dtype (specverify/conformance/strategies.py), "
              "never from torch.randn / rand / softmax / exp in float, uninitialized memory or a kernel constant")


def _instruction_sets() -> list[str]:
    """The runs to hold against `default`: the machine's own instruction set, and avx2 below avx512."""
    from specverify.environment import capability_in_a_fresh_process   # not at import: _worker imports this module
    native = capability_in_a_fresh_process(None)
    if native == DEFAULT:
        pytest.skip("torch's CPU kernels have no SIMD instruction set on this machine (get_cpu_capability() is "
                    "'default'): no other instruction set to compare the default run with")
    below = [c for c in X86_ORDER[1:X86_ORDER.index(native)]] if native in X86_ORDER else []
    return ["native", *below]


def test_regen_is_independent_of_the_instruction_set():
    others = _instruction_sets()
    runs = _runs([DEFAULT, *others])
    problems = [d for d in (_difference(runs[DEFAULT], runs[o]) for o in others) if d]
    assert runs[DEFAULT][1]["created"] > 0, "the default run made no golden"
    assert not problems, "\n".join(problems)


def test_regen_is_independent_of_uninitialized_memory_kernel_constants_and_hash_seed():
    runs = _runs([DEFAULT, PERTURBED])
    assert runs[PERTURBED][1]["perturbed"], "no kernel constant was perturbed: the run proves less than it says"
    problem = _difference(runs[DEFAULT], runs[PERTURBED])
    assert problem is None, problem


def test_the_comparison_names_the_golden_the_array_and_the_value(tmp_path):
    """The report itself: a planted one-bit change in one array is found and located."""
    from specverify.golden import render
    import torch

    inputs = {"000:probe": {"args": {"x": torch.tensor([1.0, 2.0, 3.0])}}}
    for run, value in (("a", 2.0), ("b", float(np.nextafter(np.float32(2.0), np.float32(3.0))))):
        text, npz = render("ops/probe/float32", {**inputs, "000:probe": {"args": {"x": torch.tensor([1.0, value, 3.0])}}},
                           {"out": torch.tensor([0])}, {}, {}, "float32", {})
        (tmp_path / run / "ops/probe").mkdir(parents=True)
        (tmp_path / run / "ops/probe/float32.json").write_bytes(text)
        (tmp_path / run / "ops/probe/float32.npz").write_bytes(npz)
    message = _difference((tmp_path / "a", {}, "run a"), (tmp_path / "b", {}, "run b"))
    assert message is not None
    assert "1 of 1 goldens differ between run a and run b: ops/probe/float32" in message, message
    assert ("array inputs.0 (inputs / 000:probe / args / x): 1 of 3 values differ in their bits, the first at (1,): "
            "2.0 vs 2.000000238418579") in message, message
    assert _difference((tmp_path / "a", {}, "run a"), (tmp_path / "a", {}, "run a")) is None
