"""The golden mechanism itself (specverify/golden/, tests/support/golden_catalogue.py): the
store round-trips every leaf kind exactly, a mismatch reports its statistics and writes
`.obtained`, regeneration is byte-deterministic, unused goldens are found and pruned, broken
goldens give errors naming the file and the command that makes them, a reference drift and an
optimized regression each fail `golden check`, other library versions are reported and still
compared, the near-tie cut and the one-sided accept baselines do what they say.

Every test works in a temporary directory: the real golden/ is only read (by the byte-identity
check of a slice of the real catalogue), never written."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from specverify import golden
from specverify.platform import get_profile
from tests.support import golden_catalogue as cat
from specverify.conformance.registry import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
THIS = "tests.meta.test_golden_store"

# ---------------------------------------------------------------------------------------------
# a small synthetic catalogue: FP8 inputs, an exact and a close output, a baseline set


def _syn_build():
    g = torch.Generator().manual_seed(7)
    x = (torch.randn((4, 9), generator=g) * 3).to(torch.float8_e4m3fn)
    return {"x": x, "k": 2, "scale": np.float32(0.5), "note": ("tuple", None)}, {"seed": 7, "dtype": "float8_e4m3fn",
                                                                                "generator": "synthetic randn"}


def _syn_ref(inputs):
    z = inputs["x"].double() * float(inputs["scale"])
    p, index = torch.topk(torch.softmax(z, -1), inputs["k"])
    return {"index": index, "p": p}


def _syn_opt(inputs, profile):
    z = inputs["x"].float() * inputs["scale"]
    p, index = torch.topk(torch.softmax(z, -1), inputs["k"])
    return {"index": index, "p": p}


SYN = golden.GoldenCase("syn/topk/float8_e4m3fn", _syn_build, _syn_ref, _syn_opt, {"index": golden.EXACT,
                                                                                   "p": golden.CLOSE}, "float32")
MEASURED = {"steady": 2.0, "other": 1.5}
BASE = golden.BaselineSet("accept_lengths", tuple(
    golden.AcceptScenario(n, {"what": n}, (lambda name: lambda profile: {"mean": MEASURED[name], "cycles": 10,
                                                                         "tokens": 20})(n))
    for n in MEASURED), 0.05)
SYNTHETIC = [SYN, BASE]


def _environment_build():
    """Inputs that record what the process that made them ran under."""
    seen = torch.tensor([os.environ.get("TRITON_INTERPRET") == "1", torch.get_num_threads()], dtype=torch.int64)
    return {"seen": seen}, {"generator": "the regenerating process's TRITON_INTERPRET and thread count"}


# A catalogue whose golden records the regenerating process's environment: two regens agree only
# if the command sets that environment up itself, whatever its caller had.
ENVIRONMENT = [golden.GoldenCase("syn/environment", _environment_build, lambda inputs: {"seen": inputs["seen"]}, None,
                                 {"seen": golden.EXACT})]

# a slice of the real catalogue, and the real op planted with a drift / a regression
REAL = cat.op_case(REGISTRY["select_draft_topk"], "float32")


def _drift(outputs):
    out = {k: dict(v) for k, v in outputs.items()}
    key = next(k for k, v in out.items() if v["index"].numel())
    out[key]["index"] = out[key]["index"].clone()
    out[key]["index"].view(-1)[0] += 1            # one index off: an exact output
    return out


def _regress(outputs):
    out = {k: dict(v) for k, v in outputs.items()}
    for v in out.values():
        if v["p"] is not None:
            v["p"] = v["p"] * (1 + 1e-3)            # probabilities 0.1 % off: outside float32's tolerance
    return out


DRIFTED = [dataclasses.replace(REAL, reference=lambda inputs: _drift(REAL.reference(inputs)))]
REGRESSED = [dataclasses.replace(REAL, optimized=lambda inputs, profile: _regress(REAL.optimized(inputs, profile)))]
PLAIN = [REAL]


def regen(root, catalogue=SYNTHETIC, **kw) -> golden.RegenReport:
    return golden.regen(catalogue, root, out=open(os.devnull, "w", encoding="utf-8"), **kw)


def tree_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------
# round trip


def _bits(t: torch.Tensor) -> list:
    return t.detach().clone().reshape(-1).view(torch.uint8).tolist()


def same(a, b, path="root") -> None:
    """Exact equality: type, dtype, shape and bits; NaN payloads included; tuple != list."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{path}: {a.dtype} {a.shape} vs {b.dtype} {b.shape}"
        assert _bits(a) == _bits(b), f"{path}: bits differ"
    elif isinstance(a, np.ndarray):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{path}: {a.dtype} {a.shape} vs {b.dtype} {b.shape}"
        assert a.tobytes() == b.tobytes(), f"{path}: bytes differ"
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f"{path}: {a!r} vs {b!r}"
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b), f"{path}: {a!r} vs {b!r}"
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} vs {list(b)}"
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def every_leaf_kind() -> dict:
    codes = torch.arange(256, dtype=torch.uint8)
    fp8 = {name: codes.view(getattr(torch, name)).reshape(16, 16) for name in
           ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")}
    bf16 = torch.tensor([0x7FC1, 0xFFC0, 0x8000, 0x0000, 0x7F80, 0x0001, 0x3F80], dtype=torch.int32).to(torch.int16)
    f32 = torch.tensor([0x7FC00001, 0x7F800001, 0x80000000, 0xFF800000], dtype=torch.int64).to(torch.int32)
    nan64 = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000ABC))[0]
    return {
        **{f"codes-{k}": v for k, v in fp8.items()},
        "bf16-nan-payloads": bf16.view(torch.bfloat16),
        "f32-nan-payloads": f32.view(torch.float32),
        "f16": torch.tensor([-0.0, 65504.0, float("inf")], dtype=torch.float16),
        "f64": torch.tensor([nan64, -0.0, 5e-324], dtype=torch.float64),
        "empty": {d: torch.zeros((0, 3), dtype=getattr(torch, d)) for d in
                  ("float8_e5m2fnuz", "bfloat16", "int64", "bool", "float32")},
        "zero-d": torch.tensor(3.5, dtype=torch.bfloat16),
        "strided": torch.arange(12, dtype=torch.int32).reshape(3, 4).t(),
        "bool": torch.tensor([[True, False]]),
        "uint8": torch.tensor([0, 255], dtype=torch.uint8),
        "np": [np.arange(6, dtype=np.int16).reshape(2, 3), np.array([np.nan, -0.0], dtype=np.float32),
               np.array([1, 2], dtype=">i4"), np.zeros((0,), dtype=np.float64), np.array(True)],
        "np-scalars": (np.int64(-3), np.float32(0.1), np.bool_(False), np.uint16(7)),
        "py": [0, -2**70, 1.5, -0.0, math.inf, -math.inf, nan64, float("nan"), True, False, None, "µ/\"x\"",
               b"\x00\xff", ()],
        7: {(1, 2): "tuple key", 3: [[], {}], "nested": {"deep": (1, [2.0, {"x": torch.ones(2)}])}},
    }


def test_every_leaf_kind_round_trips_exactly(tmp_path):
    tree = every_leaf_kind()
    text, npz = golden.render("rt/all", tree, tree, {"seed": 1, "dtype": "none"}, {}, "float64", golden.environment())
    (tmp_path / "rt").mkdir()
    (tmp_path / "rt/all.json").write_bytes(text)
    (tmp_path / "rt/all.npz").write_bytes(npz)
    g = golden.load_golden(tmp_path, "rt/all")
    want = dict(tree)
    want["strided"] = tree["strided"].contiguous()
    same(g.inputs, want)
    same(g.outputs, want)
    assert g.inputs["codes-float8_e4m3fnuz"].dtype == torch.float8_e4m3fnuz          # not uint8
    assert isinstance(g.inputs["np-scalars"], tuple) and isinstance(g.inputs["py"], list)
    # numpy reads the npz as any npz: fp8 / bfloat16 are their bits
    with np.load(tmp_path / "rt/all.npz") as z:
        assert z["inputs.0"].dtype == np.uint8 and z["inputs.0"].reshape(-1).tolist() == list(range(256))
    text2, npz2 = golden.render("rt/all", tree, tree, {"seed": 1, "dtype": "none"}, {}, "float64",
                                golden.environment())
    assert (text2, npz2) == (text, npz)
    assert text.endswith(b"\n") and b"NaN" not in text and b"Infinity" not in text


def test_unstorable_values_are_refused_with_their_path():
    with pytest.raises(TypeError, match=r"a\.b\[1\]"):
        golden.encode({"a": {"b": [1, object()]}})
    with pytest.raises(TypeError, match="numpy array of dtype object"):
        golden.encode(np.array([None]))


# ---------------------------------------------------------------------------------------------
# comparison, statistics, .obtained


def test_mismatch_statistics_and_obtained_files(tmp_path):
    want = {"index": torch.tensor([[0, 1], [2, 3]]), "p": torch.tensor([1.0, 2.0, 4.0, 0.5], dtype=torch.float64)}
    case = golden.GoldenCase("stats/case", lambda: ({"n": 1}, {"dtype": "float32"}), lambda inputs: want, None,
                             {"index": golden.EXACT, "p": golden.CLOSE}, "float32")
    regen(tmp_path, [case])
    before = tree_files(tmp_path)
    got = {"index": torch.tensor([[0, 7], [2, 9]]), "p": torch.tensor([1.0, 2.1, 4.0, 0.51], dtype=torch.float64)}
    bad = dataclasses.replace(case, reference=lambda inputs: got)
    r = golden.run_side(bad, golden.REFERENCE, tmp_path)
    assert r.status == "mismatch"
    text = r.report()
    assert "index (exact): 2 of 4 values differ; max abs err 6, max rel err 6; " \
           "first (index: got vs want): [0, 1]: 7 vs 1; [1, 1]: 9 vs 3" in text, text
    assert ("p (close, float32 tolerance atol 0.0001 rtol 0.0001): 2 of 4 values differ; max abs err 0.1, "
            "max rel err 0.05; first (index: got vs want): [1]: 2.1 vs 2.0; [3]: 0.51 vs 0.5") in text, text
    assert "2 of 2 output leaves differ" in text
    jpath = tmp_path / "stats/case.reference.obtained.json"
    assert r.obtained == jpath and jpath.exists() and jpath.with_suffix(".npz").exists()
    assert f"obtained outputs written to {jpath}" in text
    assert f"python -m specverify golden regen --root {tmp_path} --filter stats/case" in text
    doc = json.loads(jpath.read_text(encoding="utf-8"))
    arrays = dict(np.load(jpath.with_suffix(".npz")))
    same(golden.decode(doc["outputs"], arrays), got)
    assert doc["obtained"]["side"] == "reference" and len(doc["obtained"]["report"]) == 2
    # the golden itself is untouched; the .obtained files are neither goldens nor unused ones
    after = tree_files(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before
    assert golden.find_unused([case], tmp_path) == []
    with pytest.raises(ValueError, match="obtained"):
        golden.load_golden(tmp_path, "stats/case.reference.obtained")
    # a later match removes the stale .obtained
    assert golden.run_side(case, golden.REFERENCE, tmp_path).ok
    assert not jpath.exists() and not jpath.with_suffix(".npz").exists()


def test_exact_floats_are_bit_equal_and_nan_matches_nan():
    rules = {"x": golden.EXACT}
    nan = float("nan")
    ok = golden.compare({"x": torch.tensor([nan, 1.0])}, {"x": torch.tensor([-nan, 1.0])}, rules=rules,
                        tolerance_dtype="float64")
    assert ok.ok
    zero = golden.compare({"x": torch.tensor([0.0])}, {"x": torch.tensor([-0.0])}, rules=rules,
                          tolerance_dtype="float64")
    assert not zero.ok and "1 of 1 values differ" in zero.message()
    kind = golden.compare({"x": torch.tensor([1])}, {"x": torch.tensor([1.0])}, rules=rules, tolerance_dtype="float64")
    assert not kind.ok and "dtype kind integer" in kind.message()
    shape = golden.compare({"x": torch.zeros(3)}, {"x": torch.zeros(2)}, rules=rules, tolerance_dtype="float64")
    assert not shape.ok and "shape [3], want [2]" in shape.message()
    ints = golden.compare({"x": [1, 2, 3]}, {"x": [1, 2, 4]}, rules=rules, tolerance_dtype="float64")
    assert "[2]: 3 vs 4" in ints.message()


def test_an_output_on_one_side_only_fails():
    want = {"a": torch.ones(2), "b": torch.zeros(2)}
    rules = {"a": golden.EXACT, "b": golden.EXACT}
    extra = golden.compare({**want, "c": torch.ones(1)}, want, rules=rules, tolerance_dtype="float64")
    assert not extra.ok and "c: in the obtained outputs, not in the golden" in extra.message()
    missing = golden.compare({"a": torch.ones(2)}, want, rules=rules, tolerance_dtype="float64")
    assert not missing.ok and "b: in the golden, missing from the obtained outputs" in missing.message()
    nested = golden.compare({"s": [{"a": 1}]}, {"s": [{"a": 1, "b": 2}]}, rules={}, tolerance_dtype="float64")
    assert not nested.ok and "s[0].b" in nested.message()
    # None: the optimized side may decline an output (registry convention), the reference never
    declined = golden.compare({"a": None, "b": torch.zeros(2)}, want, rules=rules, tolerance_dtype="float64",
                              allow_declined=True)
    assert declined.ok and declined.declined == ["a"]
    assert not golden.compare({"a": None, "b": torch.zeros(2)}, want, rules=rules, tolerance_dtype="float64").ok


def test_an_extra_or_missing_output_fails_run_side(tmp_path):
    regen(tmp_path)
    extra = dataclasses.replace(SYN, optimized=lambda i, p: {**_syn_opt(i, p), "kept": torch.ones(1)})
    r = golden.run_side(extra, golden.OPTIMIZED, tmp_path, get_profile("cpu"))
    assert r.status == "mismatch" and "kept: in the obtained outputs, not in the golden" in r.message
    short = dataclasses.replace(SYN, reference=lambda i: {"index": _syn_ref(i)["index"]})
    r = golden.run_side(short, golden.REFERENCE, tmp_path)
    assert r.status == "mismatch" and "p: in the golden, missing from the obtained outputs" in r.message
    declines = dataclasses.replace(SYN, reference=lambda i: {**_syn_ref(i), "p": None})
    assert golden.run_side(declines, golden.REFERENCE, tmp_path).status == "mismatch"


def test_tolerance_comes_from_the_stored_tolerance_dtype(tmp_path):
    """The golden says float32 (its meta dtype says bfloat16): 1e-5 relative passes (float64's
    table entry would fail it), 1e-3 relative fails (bfloat16's entry would pass it)."""
    want = {"p": torch.tensor([0.25, 0.5, 1.0], dtype=torch.float64)}
    case = golden.GoldenCase("tol/case", lambda: ({}, {"dtype": "bfloat16"}), lambda i: want, None,
                             {"p": golden.CLOSE}, "float32")
    regen(tmp_path, [case])
    near = dataclasses.replace(case, reference=lambda i: {"p": want["p"] * (1 + 1e-5)})
    assert golden.run_side(near, golden.REFERENCE, tmp_path).ok
    far = dataclasses.replace(case, reference=lambda i: {"p": want["p"] * (1 + 1e-3)})
    r = golden.run_side(far, golden.REFERENCE, tmp_path)
    assert r.status == "mismatch" and "float32 tolerance" in r.message
    # integers stay exact under a close rule
    ints = golden.compare({"p": torch.tensor([1, 2])}, {"p": torch.tensor([1, 3])}, rules={"p": golden.CLOSE},
                          tolerance_dtype="bfloat16")
    assert not ints.ok
    # the catalogue changing its tolerance dtype makes the golden stale, not silently re-toleranced
    looser = dataclasses.replace(case, tolerance_dtype="bfloat16")
    r = golden.run_side(looser, golden.REFERENCE, tmp_path)
    assert r.status == "stale" and "tolerance dtype float32 stored" in r.message


# ---------------------------------------------------------------------------------------------
# deterministic regeneration


def test_regen_is_byte_deterministic_and_leaves_unchanged_files_alone(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    first = regen(a)
    assert first.created == [SYN.name, f"accept_lengths/{get_profile().name}"]
    regen(b)
    assert tree_files(a) == tree_files(b)
    stamps = {p: p.stat().st_mtime_ns for p in a.rglob("*")}
    again = regen(a)
    assert again.created == [] and again.changed == [] and len(again.unchanged) == 2
    assert {p: p.stat().st_mtime_ns for p in a.rglob("*")} == stamps
    # another process, through the command line: the same bytes
    c = tmp_path / "c"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "specverify.golden", "regen", "--root", str(c), "--catalogue",
                           f"{THIS}:SYNTHETIC"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, encoding="utf-8")
    assert proc.returncode == 0, proc.stderr
    assert "2 created, 0 changed, 0 left alone" in proc.stdout
    assert tree_files(c) == tree_files(a)


def test_regen_sets_up_the_suites_environment_whatever_the_callers(tmp_path):
    """Without a GPU the command runs with the interpreter on (it re-executes itself when the
    caller left TRITON_INTERPRET unset) and one torch thread, as the suite does: a golden that
    records both comes out byte for byte the same from a caller with TRITON_INTERPRET=1 and
    several threads and from one with neither."""
    base = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    callers = {"interpreted": base | {"TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"},
               "bare": {k: v for k, v in base.items() if k not in ("TRITON_INTERPRET", "OMP_NUM_THREADS")}}
    made = {}
    for name, env in callers.items():
        proc = subprocess.run([sys.executable, "-m", "specverify", "golden", "regen", "--root", str(tmp_path / name),
                               "--catalogue", f"{THIS}:ENVIRONMENT"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300, encoding="utf-8")
        assert proc.returncode == 0, proc.stderr
        made[name] = tree_files(tmp_path / name)
    assert made["bare"] == made["interpreted"]
    with np.load(io.BytesIO(made["bare"]["syn/environment.npz"])) as z:
        seen = [z[k] for k in z.files]
    assert len(seen) == 2 and all(a.tolist() == [1, 1] for a in seen), \
        f"the regen ran without the interpreter or with several threads: {[a.tolist() for a in seen]}"


@pytest.mark.parametrize("command", ["check", "list", "regen"])
def test_a_root_that_is_no_directory_is_named(tmp_path, command):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    afile = tmp_path / "afile"
    afile.write_text("", encoding="utf-8")
    roots = [afile] + ([tmp_path / "nowhere"] if command != "regen" else [])    # regen creates a new one
    for root in roots:
        proc = subprocess.run([sys.executable, "-m", "specverify", "golden", command, "--root", str(root)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, encoding="utf-8")
        assert proc.returncode == 2 and f"--root '{root}': not a directory" in proc.stderr, proc.stderr


def test_regen_of_a_real_slice_is_deterministic_and_equals_the_committed_bytes(tmp_path):
    names = ("ops/message_codec/float32", "ops/quantize_fp8/float8_e5m2fnuz",
             "e2e/eagle/k1-s1-d2-p1/float8_e5m2fnuz-x0.37/steer1.0/t0.3-topk20/seed6")
    cases = [c for c in cat.CATALOGUE if c.name in names]
    assert len(cases) == len(names)
    regen(tmp_path / "a", cases)
    regen(tmp_path / "b", cases)
    files = tree_files(tmp_path / "a")
    assert files == tree_files(tmp_path / "b") and len(files) == 2 * len(names)
    running = golden.environment()
    for rel, data in files.items():
        committed = (golden.GOLDEN_DIR / rel).read_bytes()
        if rel.endswith(".json") and json.loads(committed)["made_with"] != running:
            # made elsewhere: everything but made_with is the same
            old, new = json.loads(committed), json.loads(data)
            old.pop("made_with"), new.pop("made_with")
            assert old == new, rel
        else:
            assert committed == data, f"{rel}: regenerated bytes differ from the committed golden"


# ---------------------------------------------------------------------------------------------
# unused goldens


def test_unused_goldens_are_reported_and_pruned(tmp_path):
    regen(tmp_path)
    src_json, src_npz = golden.golden_paths(tmp_path, SYN.name)
    (tmp_path / "old").mkdir()
    (tmp_path / "old/case.json").write_bytes(src_json.read_bytes())
    (tmp_path / "old/case.npz").write_bytes(src_npz.read_bytes())
    (tmp_path / "orphan.npz").write_bytes(src_npz.read_bytes())
    (tmp_path / "accept_lengths/nowhere.json").write_text("{}\n", encoding="utf-8")
    (tmp_path / "README.md").write_text("about these files\n", encoding="utf-8")
    unused = ["accept_lengths/nowhere", "old/case", "orphan"]
    assert golden.find_unused(SYNTHETIC, tmp_path) == unused
    out = tmp_path / "out.txt"
    with open(out, "w", encoding="utf-8") as f:
        report = golden.regen(SYNTHETIC, tmp_path, out=f)
    assert report.unused == unused and report.pruned == []
    assert "unused (no catalogue record uses it; --prune removes it): old/case" in out.read_text(encoding="utf-8")
    assert (tmp_path / "old/case.json").exists()
    assert golden.check(SYNTHETIC, tmp_path, out=open(os.devnull, "w", encoding="utf-8")) == 1      # unused fails a full check
    (tmp_path / "syn/topk/float8_e4m3fn.reference.obtained.json").write_text("{}\n", encoding="utf-8")
    assert golden.find_unused(SYNTHETIC, tmp_path) == unused
    assert golden.main(["regen", "--root", str(tmp_path), "--catalogue", f"{THIS}:SYNTHETIC", "--prune"]) == 0
    assert golden.find_unused(SYNTHETIC, tmp_path) == []
    assert not (tmp_path / "old").exists() or not any((tmp_path / "old").iterdir())
    assert (tmp_path / "syn/topk/float8_e4m3fn.reference.obtained.json").exists()   # never touched
    assert (tmp_path / "README.md").exists()
    assert golden.check(SYNTHETIC, tmp_path, out=open(os.devnull, "w", encoding="utf-8")) == 0


# ---------------------------------------------------------------------------------------------
# broken goldens


def _edit_json(path: Path, edit) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    edit(doc)
    path.write_bytes(golden.dump_json(doc))


def _set_sha(json_path: Path, npz_path: Path) -> None:
    import hashlib
    _edit_json(json_path, lambda d: d["npz"].update(sha256=hashlib.sha256(npz_path.read_bytes()).hexdigest()))


BREAKS = {
    "json-missing": (lambda j, z: j.unlink(), golden.GoldenMissing, "missing"),
    "npz-missing": (lambda j, z: z.unlink(), golden.GoldenMissing, r"missing \(the npz"),
    "json-truncated": (lambda j, z: j.write_bytes(j.read_bytes()[:200]), golden.GoldenCorrupt, "not valid JSON"),
    "npz-truncated": (lambda j, z: z.write_bytes(z.read_bytes()[:300]), golden.GoldenCorrupt,
                      "corrupted, truncated or from another regeneration"),
    "npz-truncated-sha-updated": (lambda j, z: (z.write_bytes(z.read_bytes()[:300]), _set_sha(j, z)),
                                  golden.GoldenCorrupt, "corrupted or truncated npz"),
    "npz-byte-flipped-sha-updated": (lambda j, z: (z.write_bytes(z.read_bytes()[:100] + b"\x55" +
                                                                 z.read_bytes()[101:]), _set_sha(j, z)),
                                     golden.GoldenCorrupt, "corrupted or truncated npz"),
    "field-missing": (lambda j, z: _edit_json(j, lambda d: d.pop("outputs")), golden.GoldenFieldMissing,
                      "field 'outputs' missing"),
    "meta-rules-missing": (lambda j, z: _edit_json(j, lambda d: d["meta"].pop("rules")), golden.GoldenFieldMissing,
                           "field 'meta.rules' missing"),
    "meta-tolerance-not-a-table": (lambda j, z: _edit_json(j, lambda d: d["meta"].update(tolerance="float32")),
                                   golden.GoldenCorrupt, "names no dtype of the tolerance table"),
    "meta-tolerance-unknown-dtype": (lambda j, z: _edit_json(j, lambda d: d["meta"].update(tolerance={"dtype": "int4"})),
                                     golden.GoldenCorrupt, "names no dtype of the tolerance table"),
    "format-version-unknown": (lambda j, z: _edit_json(j, lambda d: d.update(format_version=99)),
                               golden.GoldenVersionUnknown, "format version 99 is unknown"),
    "not-a-golden": (lambda j, z: j.write_text("[1, 2]\n", encoding="utf-8"), golden.GoldenCorrupt, "not a golden object"),
    "other-name": (lambda j, z: _edit_json(j, lambda d: d.update(name="syn/other")), golden.GoldenCorrupt,
                   "holds golden 'syn/other'"),
    "dangling-array": (lambda j, z: _edit_json(j, lambda d: d["outputs"]["$dict"]["p"]["$tensor"].update(
        array="outputs.99")), golden.GoldenCorrupt, "names array 'outputs.99'"),
}


@pytest.mark.parametrize("how", list(BREAKS))
def test_a_broken_golden_names_the_file_and_the_command(tmp_path, how):
    regen(tmp_path)
    jpath, zpath = golden.golden_paths(tmp_path, SYN.name)
    brk, exc, match = BREAKS[how]
    brk(jpath, zpath)
    with pytest.raises(exc, match=match) as info:
        golden.load_golden(tmp_path, SYN.name)
    msg = str(info.value)
    assert str(jpath) in msg or str(zpath) in msg, msg
    assert f"python -m specverify golden regen --root {tmp_path} --filter {SYN.name}" in msg, msg
    r = golden.run_side(SYN, golden.REFERENCE, tmp_path)
    assert r.status in ("missing", "corrupt") and r.message == msg
    lines = tmp_path / "check.txt"
    with open(lines, "w", encoding="utf-8") as f:
        assert golden.check(SYNTHETIC, tmp_path, out=f) == 1
    assert msg in lines.read_text(encoding="utf-8")


def test_the_default_root_command_has_no_root_option():
    assert golden.regen_command("ops/x/float32") == "python -m specverify golden regen --filter ops/x/float32"
    err = golden.GoldenMissing(golden.GOLDEN_DIR / "ops/x/float32.json", "missing", "ops/x/float32")
    assert str(err).endswith("make it with: python -m specverify golden regen --filter ops/x/float32")


# ---------------------------------------------------------------------------------------------
# golden check: a planted reference drift and a planted optimized regression


def _check(tmp_path, catalogue: str, *extra) -> tuple[int, str]:
    from contextlib import redirect_stdout
    import io
    buf = io.StringIO()
    with redirect_stdout(buf):
        code = golden.main(["check", "--root", str(tmp_path), "--catalogue", f"{THIS}:{catalogue}",
                            "--platform", "cpu", *extra])
    return code, buf.getvalue()


def test_planted_reference_drift_and_optimized_regression_fail_check(tmp_path):
    regen(tmp_path, PLAIN)
    code, out = _check(tmp_path, "PLAIN")
    assert code == 0, out
    code, out = _check(tmp_path, "DRIFTED")
    assert code == 1, out
    row = next(line for line in out.splitlines() if line.startswith(REAL.name))
    assert row.split()[1:3] == ["mismatch", "ok"], row
    assert "index (exact): 1 of" in out and "reference.obtained.json" in out
    code, out = _check(tmp_path, "REGRESSED")
    assert code == 1, out
    row = next(line for line in out.splitlines() if line.startswith(REAL.name))
    assert row.split()[1:3] == ["ok", "mismatch"], row
    assert "p (close, float32 tolerance" in out and "optimized-cpu.obtained.json" in out


def test_other_library_versions_are_reported_and_still_compared(tmp_path):
    regen(tmp_path)
    jpath, _ = golden.golden_paths(tmp_path, SYN.name)
    _edit_json(jpath, lambda d: d["made_with"].update(torch="0.0.1-elsewhere", numpy="0.1"))
    lines = tmp_path / "check.txt"
    with open(lines, "w", encoding="utf-8") as f:
        assert golden.check(SYNTHETIC, tmp_path, out=f) == 0
    text = lines.read_text(encoding="utf-8")
    assert f"made with torch 0.0.1-elsewhere, running {torch.__version__} — compared anyway" in text
    assert "made with numpy 0.1" in text
    drifted = [dataclasses.replace(SYN, reference=lambda i: {**_syn_ref(i), "index": _syn_ref(i)["index"] + 1}), BASE]
    with open(lines, "w", encoding="utf-8") as f:
        assert golden.check(drifted, tmp_path, out=f) == 1           # compared, not excused
    assert "compared anyway" in lines.read_text(encoding="utf-8") and "mismatch" in lines.read_text(encoding="utf-8")
    r = regen(tmp_path)                                             # same content: left alone
    assert r.kept_other_versions == [SYN.name] and json.loads(jpath.read_text(encoding="utf-8"))["made_with"]["torch"] != \
        torch.__version__
    assert regen(tmp_path, force=True).changed == [SYN.name]
    assert json.loads(jpath.read_text(encoding="utf-8"))["made_with"] == golden.environment()


def test_command_line_errors_are_exit_2(tmp_path, capsys):
    assert golden.main(["check", "--root", str(tmp_path), "--catalogue", f"{THIS}:SYNTHETIC",
                        "--platform", "bogus"]) == 2
    assert golden.main(["check", "--root", str(tmp_path), "--catalogue", "no.such.module:X"]) == 2
    assert golden.main(["regen", "--root", str(tmp_path), "--catalogue", f"{THIS}:SYNTHETIC",
                        "--filter", "nothing-matches-this"]) == 2
    err = capsys.readouterr().err
    assert "bogus" in err and "no.such.module" in err and "nothing-matches-this" in err
    with pytest.raises(SystemExit) as info:
        golden.main(["check", "--side", "sideways"])
    assert info.value.code == 2
    assert not any(tmp_path.iterdir())
    assert golden.main(["regen", "--root", str(tmp_path), "--catalogue", f"{THIS}:SYNTHETIC", "--filter", "syn/"]) == 0
    assert [p.name for p in tmp_path.rglob("*.json")] == ["float8_e4m3fn.json"]


def test_model_builder_drift_is_reported_as_such():
    case = next(c for c in cat.E2E_CASES if c.name.startswith("e2e/target/p1/float32"))
    inputs = golden.load_golden(golden.GOLDEN_DIR, case.name).inputs
    assert cat.model_drift(inputs) is None
    tampered = dict(inputs, model=dict(inputs["model"], fingerprint="0" * 64))
    assert "model builder drift: build_models('tiny'" in cat.model_drift(tampered)


def _planted_samples(change):
    """select_draft_topk's float32 op golden, its registry samples passed through `change`."""
    op = REGISTRY["select_draft_topk"]
    return cat.op_case(dataclasses.replace(op, samples=lambda dtype, seed: change(list(op.samples(dtype, seed)))),
                       "float32")


def _float_arg(sample):
    return next((k for k, v in sample.args.items()
                 if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel()), None)


def _nudged(samples):
    """The first float of the first sample holding a non-empty float tensor, one ulp up."""
    i = next(i for i, s in enumerate(samples) if _float_arg(s))
    key = _float_arg(samples[i])
    t = samples[i].args[key].clone()
    t.view(-1)[0] = torch.nextafter(t.view(-1)[0], torch.tensor(float("inf"), dtype=t.dtype))
    return samples[:i] + [dataclasses.replace(samples[i], args={**samples[i].args, key: t})] + samples[i + 1:]


def test_an_op_golden_whose_registry_samples_moved_is_a_drift():
    """The stored inputs of an op golden are its registry's samples: a sample the registry adds,
    drops or changes (one ulp of one value, one dtype) since the golden was made is reported as a
    drift naming the sample and the regen command, not compared on the old inputs as if current."""
    assert golden.run_side(PLAIN[0], golden.REFERENCE).status == "ok"

    def first(replace):          # sample 0 with the args replace(its args) gives in place of its own
        return lambda samples: [dataclasses.replace(samples[0], args={**samples[0].args, **replace(samples[0].args)})] \
            + samples[1:]

    plants = {          # what moves -> what the drift says of it
        "one ulp": (_nudged, "values differ"),
        "a sample dropped": (lambda samples: samples[1:], "the registry's samples changed"),
        "a sample added": (lambda samples: samples + samples[:1], "the registry's samples changed"),
        "a dtype": (lambda samples: [dataclasses.replace(s, args={k: v.double() if isinstance(v, torch.Tensor)
                                                                  and v.dtype == torch.float32 else v
                                                                  for k, v in s.args.items()}) for s in samples],
                    '"dtype": "float64"'),
        # the registry's last sample is over MAX_SAMPLE_BYTES (not stored): these move the last stored one
        "the last stored sample dropped": (lambda samples: samples[:-2] + samples[-1:], "the registry's samples changed"),
        "one ulp of the last stored sample": (lambda samples: _nudged(samples[-2::-1])[::-1] + samples[-1:],
                                              "values differ"),
        "a seed": (lambda samples: [dataclasses.replace(samples[0], seed=samples[0].seed + 1)] + samples[1:], "seed"),
        "an int arg made a bool": (first(lambda a: {"topk": bool(a["topk"])}), "topk"),
        "a shape": (first(lambda a: {"logits": a["logits"].reshape(-1)}), "shape"),
    }
    for what, (change, says) in plants.items():
        r = golden.run_side(_planted_samples(change), golden.REFERENCE, write_obtained=False)
        assert r.status == "drift", (what, r.status, r.message)
        assert "the registry's sample" in r.message and "golden regen" in r.message, (what, r.message)
        assert says in r.message, (what, says, r.message)


def test_samples_drift_holds_every_leaf_and_its_dtype():
    """samples_drift on synthetic samples: equal trees (NaN, -0.0, a numpy array, a list of
    tensors, fp8, Python scalars, None) are no drift; each leaf moved alone, in either direction,
    is one: the sign of a zero, an array's dtype, a listed tensor's dtype (same size), an fp8
    flavour holding the same values, a tensor's dtype that is not the last leaf's, an int made a
    bool, None made 0, a NaN's sign, a numpy scalar for a Python one, a tuple for a list, a scalar
    for a tensor."""
    def sample(**over):
        args = {"x": torch.tensor([1.5, -0.0, float("nan")]), "arr": np.arange(3, dtype=np.float32),
                "xs": [torch.zeros(2, dtype=torch.float16), torch.ones(2, dtype=torch.int64)],
                "q": torch.zeros(4, dtype=torch.float8_e4m3fn), "k": 2, "flag": True, "none": None,
                "last": torch.zeros(1, dtype=torch.int32)}
        return {"000:a": {"name": "a", "seed": 1, "args": {**args, **over}}}

    assert cat.samples_drift(sample(), sample()) is None
    moved = {
        "the sign of a zero": {"x": torch.tensor([1.5, 0.0, float("nan")])},
        "an array's dtype": {"arr": np.arange(3, dtype=np.float64)},
        "a listed tensor's dtype": {"xs": [torch.zeros(2, dtype=torch.bfloat16), torch.ones(2, dtype=torch.int64)]},
        "an fp8 flavour": {"q": torch.zeros(4, dtype=torch.float8_e4m3fnuz)},
        "a tensor's dtype": {"x": torch.tensor([1.5, -0.0, float("nan")], dtype=torch.float64)},
        "an int made a bool": {"k": True},
        "None made 0": {"none": 0},
        "a NaN's sign": {"x": torch.tensor([1.5, -0.0, -float("nan")])},
        "a Python int made a numpy one": {"k": np.int64(2)},
        "a list made a tuple": {"xs": (torch.zeros(2, dtype=torch.float16), torch.ones(2, dtype=torch.int64))},
        "a tensor made a Python float": {"last": 0.0},
    }
    for what, over in moved.items():
        assert cat.samples_drift(sample(**over), sample()) is not None, what
        assert cat.samples_drift(sample(), sample(**over)) is not None, what


def test_a_drifted_input_is_its_own_status(tmp_path):
    regen(tmp_path, [SYN])
    planted = dataclasses.replace(SYN, check_inputs=lambda i: "model builder drift: weights changed")
    r = golden.run_side(planted, golden.REFERENCE, tmp_path)
    assert r.status == "drift" and "model builder drift: weights changed" in r.message and "golden regen" in r.message


# ---------------------------------------------------------------------------------------------
# the near-tie cut of end-to-end goldens


def _cycle(n):
    return {"tree_tokens": [n, n + 1], "tree_parents": [-1, 0], "accepted": [0, -1], "emitted": [n]}


WANT = {"tokens": [[5, 1, 2, 3, 4, 9], [7, 1, 2], [8, 8]],
        "accept_lengths": [[2, 3], [2], [1]],
        "trace": [[_cycle(1), _cycle(3)], [_cycle(1)], [_cycle(8)]],
        "first_near_tie": [1, None, -1]}


def _compare_views(got, side):
    g, w, notes = cat.near_tie_views(got, WANT, side)
    return golden.compare(g, w, rules={}, tolerance_dtype="float64"), notes


def _got(changes=None):
    got = {k: [list(r) for r in v] for k, v in WANT.items() if k != "first_near_tie"}
    for (field, r, i), value in (changes or {}).items():
        got[field][r][i] = value
    return got


def test_near_tie_cut_compares_each_request_up_to_its_first_near_tie():
    # request 0: near-tie at cycle 1 -> tokens [:3] (prefill + cycle 0's two), cycle 0 only
    cmp, notes = _compare_views(_got({("tokens", 0, 4): 99, ("trace", 0, 1): _cycle(50)}), golden.OPTIMIZED)
    assert cmp.ok, cmp.message()
    assert notes == ["2 of 3 requests compared only up to their first near-tie (request 0 from cycle 1; request 2 "
                     "from cycle -1)"]
    # request 2: the prefill token itself is a near-tie: nothing of it is compared
    assert _compare_views(_got({("tokens", 2, 0): 99}), golden.OPTIMIZED)[0].ok
    # before the cut, and in a request without a near-tie, every token counts
    assert not _compare_views(_got({("tokens", 0, 2): 99}), golden.OPTIMIZED)[0].ok
    assert not _compare_views(_got({("tokens", 1, 2): 99}), golden.OPTIMIZED)[0].ok
    assert not _compare_views(_got({("accept_lengths", 1, 0): 1}), golden.OPTIMIZED)[0].ok
    assert not _compare_views(_got({("trace", 1, 0): _cycle(60)}), golden.OPTIMIZED)[0].ok
    assert not _compare_views(_got({("trace", 0, 0): _cycle(60)}), golden.OPTIMIZED)[0].ok


def test_near_tie_field_is_compared_on_the_reference_side_only():
    ref = dict(_got(), first_near_tie=[1, None, -1])
    assert _compare_views(ref, golden.REFERENCE)[0].ok
    moved = dict(_got(), first_near_tie=[0, None, -1])
    assert not _compare_views(moved, golden.REFERENCE)[0].ok
    assert not _compare_views(ref, golden.OPTIMIZED)[0].ok        # the optimized side has no such output


# ---------------------------------------------------------------------------------------------
# accept-length baselines


@pytest.mark.parametrize("measured, status", [(2.0, "ok"), (1.9, "ok"), (1.95 * 1.0, "ok"), (1.89, "drop"),
                                              (2.1, "ok"), (2.11, "rise"), (0.0, "drop"), (9.0, "rise")])
def test_accept_judgement_is_one_sided(measured, status):
    got, message = golden.judge_accept("s", 2.0, measured, 0.05)
    assert got == status, message
    if status == "drop":
        assert "dropped below baseline 2.0000" in message and f"{measured:.4f}" in message


def test_accept_baselines_record_the_running_profile_and_fail_only_on_a_drop(tmp_path, monkeypatch):
    profile = get_profile("cpu")
    regen(tmp_path, profile=profile)
    doc = json.loads((tmp_path / "accept_lengths/cpu.json").read_text(encoding="utf-8"))
    assert doc["tolerance"] == 0.05 and doc["profile"] == "cpu" and "one-sided" in doc["rule"]
    assert not (tmp_path / "accept_lengths/rocm-emulated.json").exists()
    steady = BASE.scenarios[0]
    assert golden.check_accept(BASE, steady, profile, tmp_path).status == "ok"
    monkeypatch.setitem(MEASURED, "steady", 1.5)
    r = golden.check_accept(BASE, steady, profile, tmp_path)
    assert r.status == "drop" and not r.ok and "accept_lengths/cpu/steady" in r.message and "2.0000" in r.message
    assert golden.check(SYNTHETIC, tmp_path, profile=profile, out=open(os.devnull, "w", encoding="utf-8")) == 1
    monkeypatch.setitem(MEASURED, "steady", 3.0)
    r = golden.check_accept(BASE, steady, profile, tmp_path)
    assert r.status == "rise" and r.ok
    assert golden.check(SYNTHETIC, tmp_path, profile=profile, out=open(os.devnull, "w", encoding="utf-8")) == 0
    other = golden.check_accept(BASE, steady, get_profile("rocm-emulated"), tmp_path)
    assert other.status == "missing" and "--filter accept_lengths/rocm-emulated --platform rocm-emulated" in \
        other.message


def test_the_accept_tolerance_is_stated_in_the_docs_and_the_files():
    tol = f"{cat.ACCEPT_TOLERANCE:g}"
    assert cat.ACCEPT.tolerance == cat.ACCEPT_TOLERANCE
    assert f"catalogue default {tol}" in " ".join(golden.__doc__.split())
    assert f"tolerance {tol}" in (golden.GOLDEN_DIR / "README.md").read_text(encoding="utf-8")
    files = sorted((golden.GOLDEN_DIR / "accept_lengths").glob("*.json"))
    assert files and all(json.loads(f.read_text(encoding="utf-8"))["tolerance"] == cat.ACCEPT_TOLERANCE for f in files)


def test_a_golden_json_that_does_not_parse_is_not_the_same_file():
    """Regeneration keeps a file whose json differs only in `made_with`; a file that does not
    parse is never 'the same' (found by the first generated-mutant campaign)."""
    from specverify.golden.regenerate import _same_but_versions

    assert _same_but_versions(b'{"a": 1, "made_with": {"torch": "1"}}', b'{"a": 1, "made_with": {"torch": "2"}}')
    assert not _same_but_versions(b'{"a": 1}', b'{"a": 2}')
    assert not _same_but_versions(b"not json", b'{"a": 1}')
    assert not _same_but_versions(b'{"a": 1}', b"\xff\xfe")


def test_list_shows_each_golden_on_disk_and_the_baselines_under_any_filter(capsys, tmp_path):
    """`golden list`: every golden with where it is, and the accept-length baselines whatever the
    filter (they are not goldens a filter selects; found by the first generated-mutant campaign)."""
    from specverify import cli

    assert cli.main(["golden", "list", "--filter", "e2e/target/*"]) == 0
    lines = capsys.readouterr().out.splitlines()
    cases = [ln for ln in lines if ln.startswith("e2e/target/")]
    assert cases and all("[on disk]" in ln for ln in cases), lines
    assert any(ln.startswith("accept_lengths/") for ln in lines), lines
    assert cli.main(["golden", "list", "--root", str(tmp_path), "--filter", "e2e/target/*"]) == 0
    assert all("[MISSING]" in ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("e2e/target/"))


def test_the_optimized_side_runs_on_the_profile_it_is_given(tmp_path):
    """run_side(OPTIMIZED, profile=P) checks on P, not on the running machine's profile (found by
    the first generated-mutant campaign: every test passed the native profile or none)."""
    from specverify.platform import get_profile

    regen(tmp_path)
    for name in ("cuda-emulated", "rocm-emulated"):
        try:
            r = golden.run_side(SYN, golden.OPTIMIZED, tmp_path, get_profile(name))
        except ValueError as e:                     # the case does not apply there: the message says where
            assert name in str(e), str(e)
            continue
        assert r.side == f"optimized-{name}", r.side


def test_a_member_at_the_4gib_offset_is_refused_as_too_large(monkeypatch):
    """A plain zip stores offsets in 32 bits and 0xFFFFFFFF means 'see zip64': a member starting
    exactly there is refused, found by the first generated-mutant campaign. The stream pretends to
    be 4 GiB long (its tell() is shifted) instead of writing 4 GiB."""
    import io
    import types

    from specverify.golden import files

    first = ("a.npy", b"x" * 10)
    shift = 0xFFFFFFFF - (30 + len(first[0]) + len(first[1]))

    class Far(io.BytesIO):
        def tell(self):
            return super().tell() + shift

    monkeypatch.setattr(files, "io", types.SimpleNamespace(BytesIO=Far))
    with pytest.raises(ValueError, match=r"golden npz member b\.npy is too large for a plain zip"):
        files._zip_stored([first, ("b.npy", b"y")])


def test_a_version_difference_is_one_note_under_the_table(tmp_path):
    """A golden made with other library versions is still compared; the difference is reported
    once, as a note under the table, not in its row (found by the first generated-mutant campaign)."""
    regen(tmp_path)
    jpath, _ = golden.golden_paths(tmp_path, SYN.name)
    _edit_json(jpath, lambda d: d["made_with"].update(torch="0.0"))
    report = tmp_path / "check.txt"
    with open(report, "w", encoding="utf-8") as f:
        golden.check(SYNTHETIC, tmp_path, out=f)
    lines = report.read_text(encoding="utf-8").splitlines()
    notes = [ln for ln in lines if ln.startswith("note: made with torch 0.0")]
    assert len(notes) == 1 and notes[0].endswith("compared anyway"), lines
    row = next(ln for ln in lines if ln.startswith(SYN.name))
    assert "compared anyway" not in row, row
