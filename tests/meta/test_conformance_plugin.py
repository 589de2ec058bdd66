"""The installed conformance plugin, run as a user runs it: `pytest --pyargs specverify.conformance
--sv-impl MODULE:OBJECT --sv-report PATH` from a directory outside the repository, in a subprocess.

The numpy example conforms (its law tests included); implementations with one planted bug each
(tests/support/broken_impls.py) are reported failing with their smallest counterexample and a replay
command that re-runs that one sample; a declared convention is a named difference, an undeclared one
a failure whose message names the convention it matches; an absent engine is one skip line; and a
pytest session that does not ask for the plugin is untouched by it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "specverify.conformance.adapters.example:IMPL"
BROKEN = "tests.support.broken_impls"


def _run(tmp_path: Path, args: list[str], name: str = "report") -> tuple[subprocess.CompletedProcess, dict | None]:
    """pytest in tmp_path (outside the repo). The repo is on PYTHONPATH only for tests.support's
    planted bugs; `-p` names the plugin for a run from a tree that is not pip-installed (a no-op
    where the entry point already loaded it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "SPECVERIFY_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    report = tmp_path / name
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "specverify.conformance.plugin", "-p",
                           "no:cacheprovider", "-q", "-rs", "--pyargs", "specverify.conformance",
                           "--sv-report", str(report), *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, encoding="utf-8", timeout=600)
    data = json.loads(Path(f"{report}.json").read_text(encoding="utf-8")) if Path(f"{report}.json").exists() else None
    return proc, data


def _rows(data: dict, **match) -> list[dict]:
    return [r for r in data["results"] if all(r.get(k) == v for k, v in match.items())]


PROBE = """
import importlib.metadata as m
try:
    d = m.distribution("specverify")
except m.PackageNotFoundError:
    print("not installed")
else:
    print(sorted((e.name, e.value) for e in d.entry_points if e.group == "pytest11"))
"""


def test_the_entry_point_is_registered_by_the_install(tmp_path):
    """What pytest sees from a directory outside the repo (no PYTHONPATH): the pip-installed
    distribution's pytest11 entry point, named as the module (conftest.py's pytest_plugins)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                         encoding="utf-8", timeout=60).stdout.strip()
    if out == "not installed":
        pytest.skip("specverify is not pip-installed here (a run from the tree): no entry points to read")
    assert out == str([("specverify.conformance.plugin", "specverify.conformance.plugin")])


def test_the_example_conforms_from_outside_the_repo(tmp_path):
    proc, data = _run(tmp_path, ["--sv-impl", EXAMPLE, "-k", "not test_property"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert data is not None and data["meta"]["engine"] == "example (numpy)"
    verdicts = {r["verdict"] for r in data["results"]}
    assert verdicts <= {"conforms", "law", "skipped"}, verdicts
    assert len(_rows(data, test="differential", verdict="conforms")) >= 12     # 16 on a CUDA box, 31 on a CPU
    laws = _rows(data, test="law")
    assert {r["op"] for r in laws} == {"sample_from_probs", "sample_filtered", "verify_naive"}
    for r in laws:
        assert r["verdict"] == "conforms" and r["draws"] >= 1000 and r["pvalue"] >= r["alpha"] == 1e-6, r
        assert r["alternatives"] and all(a["power"] >= 0.999 for a in r["alternatives"].values()), r
    assert {r["randomness"] for r in _rows(data, test="law", op="verify_naive")} == {"own"}
    skipped = [r["reason"] for r in _rows(data, verdict="skipped")]
    assert any("has no attribute 'draft_tree'" in s for s in skipped), skipped
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "## Law tests" in md and "| verify_naive | reject-often-V6 | own |" in md, md[:2000]


@pytest.mark.parametrize("impl, op, keyword", [
    ("ORDER_BY_PROBS", "select_draft_topk", "test_differential and select_draft_topk and float32"),
    ("LAST_MAXIMAL_INDEX", "row_argmax", "test_differential and row_argmax and float32"),
    ("IGNORES_TOP_P", "sampling_probs", "test_differential and sampling_probs and float32"),
])
def test_a_planted_bug_fails_with_its_counterexample_and_replay(tmp_path, impl, op, keyword):
    proc, data = _run(tmp_path, ["--sv-impl", f"{BROKEN}:{impl}", "-k", keyword])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    [row] = _rows(data, test="differential", op=op)
    assert row["verdict"] == "fails" and row["failing"] and row["counterexample"] and row["replay"], row
    # the counterexample is cut down to the first row of the smallest failing sample that still fails
    assert f"{row['sample']}[row " in row["counterexample"] and f"(one row of {row['sample']}" in row["counterexample"]
    # The replay command re-runs exactly the smallest failing sample, and fails again.
    replay = shlex.split(row["replay"])
    assert replay[:3] == ["python", "-m", "pytest"] and f"--sv-sample={row['sample']}" in replay
    again = subprocess.run([sys.executable, *replay[1:], "-p", "specverify.conformance.plugin", "-p", "no:cacheprovider",
                            "-q", "-s"], cwd=tmp_path, capture_output=True, text=True, encoding="utf-8", timeout=300,
                           env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
                                "PYTHONPATH": str(ROOT)})
    aout = again.stdout + again.stderr
    assert again.returncode == 1 and "1 failed" in aout and "1 of 1 samples fail" in aout, aout[-3000:]


@pytest.mark.parametrize("impl, case", [("IGNORES_TOP_P", "sample_filtered-top-p-V48"),
                                        ("BONUS_FROM_TARGET", "verify_naive-reject-often-V6")])
def test_a_planted_bug_in_an_op_with_its_own_randomness_fails_by_law(tmp_path, impl, case):
    proc, data = _run(tmp_path, ["--sv-impl", f"{BROKEN}:{impl}", "-k", f"test_law and {case}"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    [row] = _rows(data, test="law")
    assert row["verdict"] == "fails" and row["pvalue"] < 1e-6, row
    assert "do not follow the law" in out or "outside the law's support" in out, out[-3000:]


def test_a_declared_convention_is_a_named_difference_with_its_smallest_witness(tmp_path):
    proc, data = _run(tmp_path, ["--sv-impl", f"{BROKEN}:KEEP_TIED_DECLARED", "-k",
                                 "test_differential and sampling_probs and float32"])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    [row] = _rows(data, test="differential", op="sampling_probs")
    assert row["verdict"] == "differs", row
    assert any(d.startswith("topk_ties=keep_tied") for d in row["differences"]), row
    assert row["witnesses"] and row["counterexample"] and "--sv-sample=" in row["replay"], row
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "## Named differences" in md and "smallest counterexample" in md


def test_an_undeclared_convention_fails_and_names_the_convention_it_matches(tmp_path):
    proc, data = _run(tmp_path, ["--sv-impl", f"{BROKEN}:KEEP_TIED_UNDECLARED", "-k",
                                 "test_differential and sampling_probs and float32"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    [row] = _rows(data, test="differential", op="sampling_probs")
    assert row["verdict"] == "fails" and any("topk_ties=keep_tied" in m for m in row["matches"]), row
    assert "(declare it)" in out


def test_an_absent_engine_is_one_skip_line(tmp_path):
    proc, data = _run(tmp_path, ["--sv-impl", f"{BROKEN}:NOT_INSTALLED", "-k", "not test_property"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert re.search(r"no-such-engine is not installed", out), out[-3000:]
    assert data["results"] and all(r["verdict"] == "skipped" for r in data["results"])
    assert "passed" not in out.splitlines()[-1], out.splitlines()[-1]


def test_a_session_that_does_not_ask_is_untouched(tmp_path):
    (tmp_path / "test_plain.py").write_text(
        "import os, sys\n"
        "def test_plain():\n"
        "    assert 'torch' not in sys.modules and 'specverify.conformance.registry' not in sys.modules\n"
        "    assert 'TRITON_INTERPRET' not in os.environ and 'SPECVERIFY_IMPL' not in os.environ\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "SPECVERIFY_")) and k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "specverify.conformance.plugin", "-p",
                           "no:cacheprovider", "-q", "test_plain.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, encoding="utf-8", timeout=120)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, (proc.stdout + proc.stderr)[-2000:]
