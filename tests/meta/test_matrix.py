"""`specverify matrix` (specverify/matrix/): end to end on a small filter of the real suite (a
clean run exits 0; a planted failure in one profile exits 1 and shows in that column only, with
md / json / html written and the counts equal to the JUnit XML), merge of several machines'
reports (native and emulated columns side by side, same-profile columns labelled), malformed
input and bad arguments (exit 2, one line naming them), the table's cells and colours, and the
classification of tests into feature / dtype / algorithm (tests/matrix/)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest
import torch

from specverify import matrix
from specverify.dtypes import DTYPES
from specverify.environment import capability_in_a_fresh_process
from specverify.platform import ALL_PROFILE_NAMES, available_profiles
from tests.matrix import classify as C

ROOT = Path(__file__).resolve().parents[2]
SLICE = ["tests/test_platform.py", "tests/test_dtypes.py::test_fnuz_rules", "-k",
         "resolve or frozen or cpu_profile_policies or fnuz"]


def junit_counts(path: Path) -> Counter:
    """Outcome counts read straight from a JUnit XML file, independently of matrix.parse_junit."""
    counts = Counter()
    for case in ET.parse(path).getroot().iter("testcase"):
        tags = {child.tag: child for child in case}
        if "failure" in tags:
            counts["failed"] += 1
        elif "error" in tags:
            counts["error"] += 1
        elif "skipped" in tags:
            counts["xfailed" if tags["skipped"].get("type") == "pytest.xfail" else "skipped"] += 1
        else:
            counts["passed"] += 1
    return counts


def run_matrix(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = matrix.main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


# ---------------------------------------------------------------------------------------------
# end to end


def test_planted_failure_in_one_profile_exits_1_and_shows_in_its_column_only(tmp_path, capsys, monkeypatch):
    """rocm-emulated runs first and sits first in the table; its expectations plant an xfail on a
    test that passes (XPASS(strict): a failure) and a skip. cpu runs the same slice clean. (Under
    the machine's own CPU capability: a caller's ATEN_CPU_CAPABILITY, kept by the matrix, would
    key the columns cpu[avx2], ...; tests/meta/test_matrix.py's capability tests cover that.)"""
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    expect = tmp_path / "expect"
    expect.mkdir()
    (expect / "rocm-emulated.toml").write_text(
        '[[expect]]\ntest = "tests/test_platform.py::test_resolve"\nkind = "xfail"\nreason = "planted"\n'
        'raises = "AssertionError"\n'
        '[[expect]]\ntest = "tests/test_platform.py::test_profiles_are_frozen"\nkind = "skip"\nreason = "planted"\n', encoding="utf-8")
    out = tmp_path / "reports"
    rc, stdout, _ = run_matrix(["--profiles", "rocm-emulated", "cpu", "--workers", "0", "--out", str(out),
                                "--expectations", str(expect), "--label", "box-a", "--", *SLICE], capsys)
    assert rc == 1, stdout[-3000:]
    # progress: a line when each profile starts and when it ends
    assert re.search(r"^\[1/2\] rocm-emulated: SPECVERIFY_PLATFORM=rocm-emulated python -m pytest -n 0 ", stdout, re.M)
    assert re.search(r"^\[2/2\] cpu: passed in [\d.]+ s: 5 passed, 0 failed", stdout, re.M), stdout
    assert "FAILED: rocm-emulated" in stdout
    for name in ("matrix.md", "matrix.json", "matrix.html", "junit-cpu.xml", "junit-rocm-emulated.xml",
                 "pytest-cpu.log", "expectations-rocm-emulated.json"):
        assert (out / name).is_file(), name
    doc = json.loads((out / "matrix.json").read_text(encoding="utf-8"))
    assert doc["schema"] == matrix.SCHEMA and doc["label"] == "box-a"
    assert [c["column"] for c in doc["columns"]] == ["rocm-emulated", "cpu"]
    cols = {c["profile"]: c for c in doc["columns"]}
    for profile, col in cols.items():
        want = junit_counts(out / f"junit-{profile}.xml")
        assert {k: v for k, v in col["counts"].items() if v} == dict(want), profile
        assert col["torch"] == torch.__version__ and col["device"] == "cpu" and col["duration_s"] > 0
        assert col["command"].startswith(f"SPECVERIFY_PLATFORM={profile} python -m pytest")
    assert cols["rocm-emulated"]["counts"] == dict(passed=3, failed=1, error=0, skipped=1, xfailed=0, xpassed=0)
    assert cols["cpu"]["counts"] == dict(passed=5, failed=0, error=0, skipped=0, xfailed=0, xpassed=0)
    rows = {(r["id"], r["feature"], r["dtype"], r["algorithm"]) for r in cols["cpu"]["records"]}
    assert ("tests/test_dtypes.py::test_fnuz_rules[float8_e5m2fnuz]", "dtypes", "float8_e5m2fnuz", "-") in rows
    assert cols["rocm-emulated"]["status"] == "failed" and cols["cpu"]["status"] == "passed"
    failed = [r for r in cols["rocm-emulated"]["records"] if r["outcome"] == "failed"]
    assert [(r["id"], r["feature"], r["dtype"], r["algorithm"], r["expectation"]) for r in failed] == [
        ("tests/test_platform.py::test_resolve", "platform", "-", "-", f"{expect}/rocm-emulated.toml #1")]
    assert "XPASS(strict)" in failed[0]["message"]
    stale = cols["rocm-emulated"]["expectations"]["stale"]
    assert [(s["ref"], s["why"]) for s in stale] == [(f"{expect}/rocm-emulated.toml #1", "passed")]
    assert cols["cpu"]["expectations"]["entries"] == [] and cols["cpu"]["expectations"]["stale"] == []
    # a slice of the suite cannot judge unmatched entries: the report says so
    assert cols["cpu"]["expectations"]["unmatched_checked"] is False
    assert "narrowed to 'tests/test_platform.py'" in cols["cpu"]["expectations"]["unmatched_note"]
    # md: the table, the failure and the stale entry
    md = (out / "matrix.md").read_text(encoding="utf-8")
    assert "| platform | - | **1/1/1/0** | 3/0/0/0 |" in md
    assert "| dtypes | float8_e4m3fnuz | 1/0/0/0 | 1/0/0/0 |" in md
    assert "tests/test_platform.py::test_resolve" in md and "STALE rocm-emulated" in md
    # html: the red cell links to the anchor that lists the failure
    page = (out / "matrix.html").read_text(encoding="utf-8")
    m = re.search(r'<td class="fail"><a href="#([\w-]+)">1/1/1/0</a></td><td class="pass">3/0/0/0</td>', page)
    assert m, page[:3000]
    section = page.split(f'<section id="{m.group(1)}">')[1].split("</section>")[0]
    assert "tests/test_platform.py::test_resolve" in section and "XPASS(strict)" in section
    # the real report merges (schema round trip); the same profile twice gets profile@label columns
    assert matrix.merge([out / "matrix.json", out / "matrix.json"], tmp_path / "merged", say=lambda line: None) == 1
    merged = json.loads((tmp_path / "merged" / "matrix.json").read_text(encoding="utf-8"))
    assert [c["column"] for c in merged["columns"]] == ["rocm-emulated@box-a", "rocm-emulated@box-a#2",
                                                        "cpu@box-a", "cpu@box-a#2"]


def test_clean_run_exits_0_and_the_filters_select_rows(tmp_path, capsys):
    """--dtypes float8_e5m2fnuz --algorithms - on a slice of three tests: only the e5m2fnuz one is
    left (test_resolve has no dtype, and '-' is not listed; the e4m3fnuz one is another dtype)."""
    out = tmp_path / "r"
    rc, stdout, _ = run_matrix(["--profiles", "cuda-emulated", "--workers", "0", "--out", str(out), "--algorithms", "-",
                                "--dtypes", "float8_e5m2fnuz", "--", "tests/test_platform.py",
                                "tests/test_dtypes.py::test_fnuz_rules", "-k", "resolve or fnuz"], capsys)
    assert rc == 0, stdout[-3000:]
    doc = json.loads((out / "matrix.json").read_text(encoding="utf-8"))
    (col,) = doc["columns"]
    assert col["status"] == "passed" and col["counts"]["passed"] == 1 == sum(col["counts"].values())
    assert [r["id"] for r in col["records"]] == ["tests/test_dtypes.py::test_fnuz_rules[float8_e5m2fnuz]"]
    assert "--sv-dtypes=float8_e5m2fnuz" in col["command"] and "--sv-algorithms=-" in col["command"]
    assert doc["filters"]["dtypes"] == ["float8_e5m2fnuz"] and doc["filters"]["algorithms"] == ["-"]
    assert "| dtypes | float8_e5m2fnuz | 1/0/0/0 |" in (out / "matrix.md").read_text(encoding="utf-8")
    assert "no failures" in stdout


# ---------------------------------------------------------------------------------------------
# merge, on synthetic reports


def record(test: str, outcome: str, feature: str = "spec-e2e", dtype: str = "float32", **extra) -> dict:
    return {"id": test, "outcome": outcome, "feature": feature, "dtype": dtype, "algorithm": "eagle", **extra}


def column(profile: str, label: str, records: list[dict]) -> dict:
    counts = {o: sum(r["outcome"] == o for r in records) for o in matrix.OUTCOMES}
    failed = counts["failed"] or counts["error"]
    return {"column": profile, "profile": profile, "label": label, "status": "failed" if failed else "passed",
            "counts": counts, "records": records, "expectations": {"entries": [], "stale": [],
                                                                     "unmatched_checked": True}}


def report(label: str, columns: list[dict]) -> dict:
    return {"schema": matrix.SCHEMA, "label": label, "columns": columns}


def dump(path: Path, doc) -> Path:
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc, encoding="utf-8")
    return path


OK = [record("t::a", "passed"), record("t::b", "skipped"), record("t::c", "passed", dtype="float8_e4m3fn")]


def test_merge_puts_native_and_emulated_side_by_side(tmp_path, capsys):
    a = dump(tmp_path / "cuda.json", report("H100", [column("cpu", "H100", OK), column("cuda", "H100", OK),
                                                     column("cuda-emulated", "H100", OK)]))
    b = dump(tmp_path / "rocm.json", report("MI300X", [column("rocm-emulated", "MI300X", OK),
                                                       column("rocm", "MI300X", OK), column("cpu", "MI300X", OK)]))
    assert matrix.main(["merge", str(a), str(b), "-o", str(tmp_path / "m")]) == 0
    doc = json.loads((tmp_path / "m" / "matrix.json").read_text(encoding="utf-8"))
    assert [c["column"] for c in doc["columns"]] == ["cuda", "cuda-emulated", "rocm", "rocm-emulated", "cpu@H100",
                                                     "cpu@MI300X"]
    assert doc["sources"] == [str(a), str(b)] and doc["schema"] == matrix.SCHEMA
    assert [c["source"] for c in doc["columns"]] == [str(a), str(a), str(b), str(b), str(a), str(b)]
    md = (tmp_path / "m" / "matrix.md").read_text(encoding="utf-8")
    assert "| feature | dtype | cuda | cuda-emulated | rocm | rocm-emulated | cpu@H100 | cpu@MI300X |" in md
    assert "| spec-e2e | float32 | 1/0/1/0 | 1/0/1/0 | 1/0/1/0 | 1/0/1/0 | 1/0/1/0 | 1/0/1/0 |" in md
    assert (tmp_path / "m" / "matrix.html").is_file()
    assert "merged 2 report(s), 6 column(s)" in capsys.readouterr().out
    # a merged report merges again, and a failure in any column makes the merge exit 1
    bad = dump(tmp_path / "bad.json", report("B200", [column("cuda", "B200", [record("t::a", "failed",
                                                                                     message="boom")])]))
    assert matrix.main(["merge", str(tmp_path / "m" / "matrix.json"), str(bad), "-o", str(tmp_path / "m2")]) == 1
    doc2 = json.loads((tmp_path / "m2" / "matrix.json").read_text(encoding="utf-8"))
    assert [c["column"] for c in doc2["columns"]][:3] == ["cuda@B200", "cuda@H100", "cuda-emulated"]


MALFORMED = {
    "not-json": ("{", "not valid JSON"),
    "no-schema": ({"columns": []}, "not a specverify matrix report"),
    "wrong-schema": ({"schema": "specverify-matrix/0", "columns": []}, "schema 'specverify-matrix/0' is not"),
    "no-columns": ({"schema": matrix.SCHEMA, "columns": []}, "'columns' must be a non-empty list"),
    "column-without-counts": ({"schema": matrix.SCHEMA, "columns": [{"profile": "cpu", "label": "x", "status": "passed",
                                                                      "records": []}]},
                              r"columns\[0\]: 'counts' missing"),
    "bad-outcome": (report("x", [column("cpu", "x", [record("t::a", "exploded")])]),
                    r"columns\[0\]: records\[0\] has outcome 'exploded'"),
}


@pytest.mark.parametrize("content, message", MALFORMED.values(), ids=list(MALFORMED))
def test_merge_refuses_malformed_input_naming_the_file(tmp_path, capsys, content, message):
    good = dump(tmp_path / "good.json", report("x", [column("cpu", "x", OK)]))
    bad = dump(tmp_path / "bad.json", content)
    assert matrix.main(["merge", str(good), str(bad), "-o", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert re.search(rf"^specverify matrix: error: {re.escape(str(bad))}: .*{message}", err), err
    assert not (tmp_path / "m").exists()
    assert matrix.main(["merge", str(tmp_path / "absent.json")]) == 2
    assert "absent.json: cannot be read" in capsys.readouterr().err


def test_cpu_capabilities_are_a_column_axis(tmp_path, capsys):
    """--capabilities native default: one column per capability, the forced one keyed cpu[default]
    and run with ATEN_CPU_CAPABILITY=default (the child records what it ran under, and the reports
    print it); the native one keeps the plain key."""
    native = capability_in_a_fresh_process(None)         # the machine's own (this process may run under another)
    caps = ["native", "default"] if native != "default" else ["native"]
    out = tmp_path / "reports"
    rc, stdout, _ = run_matrix(["--profiles", "cpu", "--capabilities", *caps, "--workers", "0", "--out", str(out),
                                "--", "tests/test_platform.py", "-k", "resolve"], capsys)
    assert rc == 0, stdout[-3000:]
    doc = json.loads((out / "matrix.json").read_text(encoding="utf-8"))
    cols = {c["column"]: c for c in doc["columns"]}
    want = {"cpu": native} | ({"cpu[default]": "default"} if len(caps) == 2 else {})
    assert {k: c["cpu_capability"] for k, c in cols.items()} == want
    for key, col in cols.items():
        assert col["expectations"]["environment"]["cpu_capability"] == want[key]
        assert col["counts"]["passed"] > 0 and col["status"] == "passed"
        assert col["numpy"] and col["triton"]
    if len(caps) == 2:
        assert cols["cpu[default]"]["command"].startswith("SPECVERIFY_PLATFORM=cpu ATEN_CPU_CAPABILITY=default ")
        assert (out / "junit-cpu-default.xml").is_file() and (out / f"junit-cpu-{native}.xml").is_file()
        assert "| cpu[default] | " in (out / "matrix.md").read_text(encoding="utf-8")
        assert "default (forced)" in (out / "matrix.md").read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# arguments

UNAVAILABLE = next(p for p in ("cuda", "rocm") if p not in available_profiles())
BAD_ARGS = {
    "unknown-profile": (["--profiles", "cpu", "tpu"], r"--profiles: unknown profile 'tpu'; choose from cpu, cuda"),
    "unavailable-profile": (["--profiles", UNAVAILABLE], rf"--profiles: profile '{UNAVAILABLE}' cannot run on this "
                                                         rf"machine: .*available here: "),
    "profile-twice": (["--profiles", "cpu", "cpu"], r"'cpu' is listed twice"),
    "unknown-dtype": (["--dtypes", "float32,float12"], r"--dtypes: unknown name\(s\) 'float12'"),
    "unknown-algorithm": (["--algorithms", "medusa"], r"--algorithms: unknown name\(s\) 'medusa'; choose from eagle"),
    "bad-workers": (["--workers", "-1"], r"--workers: expected 'auto' or an int >= 0, got '-1'"),
    "label-with-at": (["--label", "a@b"], r"--label: 'a@b' must be .* without '@'"),
    "run-option-on-merge": (["--label", "x", "merge", "a.json"], r"--label belong to a matrix run"),
    "merge-after-profiles": (["--profiles", "cpu", "merge", "a.json"], r"--profiles took 'merge' as a name"),
    "expectations-missing": (["--expectations", "/nonexistent/dir"], r"--expectations: /nonexistent/dir is not a dir"),
    "unknown-capability": (["--capabilities", "avx9000"], r"--capabilities: torch does not run 'avx9000' here"),
    "capability-twice": (["--capabilities", "native", "native"], r"--capabilities: 'native' runs .* list it once"),
}


@pytest.mark.parametrize("argv, message", BAD_ARGS.values(), ids=list(BAD_ARGS))
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, argv, message):
    assert matrix.main([*argv, "--out", str(tmp_path / "r")] if "merge" not in argv else argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and re.search(message, err), err
    assert not (tmp_path / "r").exists()


def test_the_cli_wires_matrix_and_merge(tmp_path, capsys):
    from specverify import cli
    a = dump(tmp_path / "a.json", report("x", [column("cpu", "x", OK)]))
    assert cli.main(["matrix", "merge", str(a), "-o", str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / "matrix.md").is_file()
    assert cli.main(["matrix", "--profiles", "bogus"]) == 2
    assert "unknown profile 'bogus'" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# cells, colours, progress


@pytest.mark.parametrize("counts, text, css", [
    ({"passed": 3, "skipped": 1}, "3/0/1/0", "pass"),
    ({"passed": 3, "failed": 1, "xfailed": 1}, "3/1/0/1", "fail"),
    ({"passed": 1, "error": 2}, "1/2/0/0", "fail"),
    ({"passed": 2, "xfailed": 1}, "2/0/0/1", "xfail"),
    ({"skipped": 4}, "0/0/4/0", "skip"),
    ({"xpassed": 1, "passed": 1}, "2/0/0/0", "pass"),
    ({}, "", "none"),
])
def test_cell_text_and_colour(counts, text, css):
    assert matrix.cell_text(Counter(counts)) == text
    assert matrix.cell_class(Counter(counts)) == css


def test_html_is_self_contained_and_every_failing_cell_links_to_its_failures():
    doc = report("x", [column("cpu", "x", [record("t::a", "failed", message="boom <b>"), record("t::b", "xfailed"),
                                           record("t::c", "error", feature="protocol", dtype="-", message="setup")]),
                       column("rocm-emulated", "x", [record("t::a", "passed"), record("t::b", "skipped")])])
    matrix.assign_columns(doc["columns"])
    page = matrix.render_html(doc)
    assert "<script" not in page and "<link" not in page and "src=" not in page and "http" not in page
    assert "boom &lt;b&gt;" in page and "boom <b>" not in page
    links = re.findall(r'<td class="fail"><a href="#([\w-]+)">', page)
    assert len(links) == 2
    for anchor in links:
        assert f'<section id="{anchor}">' in page
    assert '<td class="pass">1/0/1/0</td>' in page            # rocm-emulated: t::a passed, t::b skipped
    # anchors follow the column order, then (feature, dtype): protocol/- first, spec-e2e/float32 second
    assert '<td class="fail"><a href="#fail-2">0/1/0/1</a></td>' in page
    assert re.search(r'<section id="fail-1"><h3>cpu: protocol / -</h3><ul>\s*<li><code>t::c</code> \(error\): setup',
                     page)


def test_junit_without_properties_and_collection_errors(tmp_path):
    path = dump(tmp_path / "j.xml", """<?xml version="1.0"?><testsuites><testsuite>
        <testcase classname="tests.test_x" name="test_a[1]"/>
        <testcase classname="tests.test_x" name="test_b"><skipped type="pytest.xfail" message="known"/></testcase>
        <testcase classname="tests.test_x" name="test_c"><failure message="bad">trace</failure>
          <error message="teardown">more</error></testcase>
        <testcase classname="" name="tests.test_broken"><error message="collection failure">ImportError</error></testcase>
        </testsuite></testsuites>""")
    got = [(r["id"], r["outcome"], r["feature"]) for r in matrix.parse_junit(path)]
    assert got == [("tests/test_x.py::test_a[1]", "passed", "test_x"), ("tests/test_x.py::test_b", "xfailed", "test_x"),
                   ("tests/test_x.py::test_c", "failed", "test_x"), ("tests.test_broken", "error", "tests")]
    with pytest.raises(matrix.MatrixError, match="not a readable JUnit XML"):
        matrix.parse_junit(dump(tmp_path / "broken.xml", "<testsuites>"))


def test_progress_counter_counts_progress_lines_only():
    c = matrix.ProgressCounter()
    c.feed("============ test session starts ====\nplatform linux -- Python 3.11.7, pytest...\n"
           "bringing up nodes...\n..F.")
    assert c.counts() == (4, 1)
    c.feed("s.xE                 [ 40%]\n...")
    assert c.counts() == (11, 2)
    c.feed("\nE   assert 0 == 1\n... 3 passed in 0.2s\n")
    assert c.counts() == (11, 2)


def test_a_run_without_junit_or_with_a_crash_is_broken(tmp_path):
    prof = available_profiles()["cpu"]
    log = dump(tmp_path / "pytest-cpu.log", "ERROR: usage: something wrong\n")
    col = matrix._column("cpu", "x", prof, {}, "cmd", 4, 1.0, tmp_path / "none.xml", tmp_path / "none.json", log)
    assert col["status"] == "broken" and "pytest exited 4" in col["note"] and "something wrong" in col["note"]
    assert matrix.has_failures(col)
    junit = dump(tmp_path / "j.xml", '<testsuites><testsuite><testcase classname="t" name="a"/></testsuite></testsuites>')
    col = matrix._column("cpu", "x", prof, {}, "cmd", 1, 1.0, junit, tmp_path / "none.json", log)
    assert col["status"] == "broken" and "holds no failure" in col["note"]
    col = matrix._column("cpu", "x", prof, {}, "cmd", 0, 1.0, junit, tmp_path / "none.json", log)
    assert col["status"] == "passed" and not matrix.has_failures(col)


def test_a_column_with_errors_only_has_failed(tmp_path):
    """A run whose only problems are errors (a fixture or collection error, no failed assertion)
    is a failed column, and the matrix counts it as failing (found by the first generated-mutant
    campaign: every failing column of the tests also held a failed test)."""
    prof = available_profiles()["cpu"]
    log = dump(tmp_path / "pytest-cpu.log", "1 error\n")
    junit = dump(tmp_path / "j.xml", '<testsuites><testsuite><testcase classname="t" name="a">'
                                     '<error message="fixture broke"/></testcase></testsuite></testsuites>')
    col = matrix._column("cpu", "x", prof, {}, "cmd", 1, 1.0, junit, tmp_path / "none.json", log)
    assert col["status"] == "failed" and col["counts"]["error"] == 1 and col["counts"]["failed"] == 0
    assert matrix.has_failures(col)
    assert matrix.has_failures({"counts": {"error": 1}}) and not matrix.has_failures({"counts": {"passed": 2}})


# ---------------------------------------------------------------------------------------------
# classification (tests/matrix/classify.py, tests/matrix/features.toml)


FMAP = C.load_features(ROOT / "tests" / "matrix" / "features.toml")


def test_every_test_file_is_mapped_and_every_entry_names_a_file():
    files = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py"))
    unmapped = [f for f in files if FMAP.lookup(f + "::test_x") is None]
    assert not unmapped, f"tests/matrix/features.toml does not map {unmapped}"
    missing = [e.prefix for e in FMAP.entries if not (ROOT / e.prefix.split("::")[0]).is_file()]
    assert not missing, f"tests/matrix/features.toml maps files that do not exist: {missing}"


class FakeOp:
    def __init__(self, name):
        self.name = name


REGISTRY = {"row_argmax": None, "row_argmax_triton": None, "select_draft_topk": None}
KNOWN = {
    "ops-differential": ("tests/test_ops_differential.py::test_differential[select_draft_topk-rocm-emulated-float32]",
                         {"op": FakeOp("select_draft_topk"), "profile": object(), "dtype": "float32"}, "",
                         ("select_draft_topk", "float32", "-")),
    "ops-error-input-longest-name": ("tests/test_ops_differential.py::test_error_inputs[row_argmax_triton-empty]",
                                     {"error": object()}, "row_argmax_triton-empty", ("row_argmax_triton", "-", "-")),
    "spec-e2e-case-dict": ("tests/test_spec_e2e.py::test_greedy_lossless_pairwise[topk=1-...]",
                           {"case": {"topk": 1, "logits_dtype": "float8_e4m3fnuz", "bs": 3}}, "",
                           ("spec-e2e", "float8_e4m3fnuz", "eagle")),
    "logprobs-algorithm-param": ("tests/test_logprobs_e2e.py::test_logprobs_match_reference[float32-target-only-greedy-1]",
                                 {"logits_dtype": "float32", "algorithm": "target-only", "mode": "greedy", "n": 1}, "",
                                 ("logprobs", "float32", "target")),
    "logprobs-eagle": ("tests/test_logprobs_e2e.py::test_speculative_and_target_only_logprobs_agree[eagle-tree]",
                       {"algorithm": "eagle-tree"}, "", ("logprobs", "-", "eagle")),
    "longest-prefix": ("tests/test_engine_fit.py::test_target_only_boundary_fits_or_raises[1--1-1]",
                       {"page_size": 1}, "", ("engine-fit", "-", "target")),
    "torch-dtype-param": ("tests/test_draft_head.py::test_steer_logits_follows_the_rule[0.0-dtype0]",
                          {"agreement": 0.0, "dtype": torch.bfloat16}, "", ("draft-head", "bfloat16", "eagle")),
    "logits-before-dtype": ("tests/test_generate.py::test_x[a]", {"dtype": "float16", "logits_dtype": "float8_e5m2"},
                            "", ("generate", "float8_e5m2", "target")),
    "any-str-dtype": ("tests/test_model_forward.py::test_x[bfloat16]", {"compute_dtype": "bfloat16", "page_size": 4},
                      "", ("model-forward", "bfloat16", "-")),
    "fp8-format-param": ("tests/test_dtypes.py::test_fnuz_rules[float8_e5m2fnuz]", {"fmt": "float8_e5m2fnuz"}, "",
                         ("dtypes", "float8_e5m2fnuz", "-")),
    "unmapped-file": ("tests/test_brand_new.py::test_y", {"name": "float33"}, "", ("test_brand_new", "-", "-")),
}


@pytest.mark.parametrize("nodeid, params, param_id, want", KNOWN.values(), ids=list(KNOWN))
def test_classification_of_known_ids(nodeid, params, param_id, want):
    assert C.classify(nodeid, params, FMAP, DTYPES, param_id, REGISTRY) == want


BAD_MAPS = {
    "bad-algorithm": ('[features]\n"tests/a.py" = { feature = "a", algorithm = "medusa" }\n', r"algorithm 'medusa'"),
    "unknown-key": ('[features]\n"tests/a.py" = { feature = "a", algorithm = "-", owner = "me" }\n',
                    r"unknown key\(s\) \['owner'\]"),
    "missing-feature": ('[features]\n"tests/a.py" = { algorithm = "-" }\n', r"missing key 'feature'"),
    "per-op-not-bool": ('[features]\n"tests/a.py" = { feature = "a", algorithm = "-", per_op = "yes" }\n',
                        r"per_op must be a bool"),
    "top-level": ('[feature]\n', r"unknown top-level key\(s\) \['feature'\]"),
}


@pytest.mark.parametrize("text, message", BAD_MAPS.values(), ids=list(BAD_MAPS))
def test_a_malformed_feature_map_is_refused(tmp_path, text, message):
    with pytest.raises(C.FeatureMapError, match=rf"features\.toml.*{message}"):
        C.load_features(dump(tmp_path / "features.toml", text))


def test_dtype_and_algorithm_choices_are_checked():
    assert C.parse_filter("--sv-dtypes", "float32, -", [*DTYPES, "-"]) == {"float32", "-"}
    assert C.parse_filter("--sv-dtypes", None, DTYPES) is None
    with pytest.raises(ValueError, match="unknown name"):
        C.parse_filter("--sv-algorithms", "eagle,medusa", C.ALGORITHMS)
    assert set(ALL_PROFILE_NAMES) == set(matrix.PROFILE_ORDER)
    assert matrix.check_names("--dtypes", ["float32,bfloat16", "float32"], [*DTYPES]) == ["float32", "bfloat16"]


def test_profiles_option_with_no_name_is_refused():
    from specverify.matrix.checks import check_profiles

    with pytest.raises(matrix.MatrixError, match=r"^--profiles: no profile named$"):
        check_profiles([" , "])


def test_a_record_that_is_not_an_object_is_refused_by_name(tmp_path):
    doc = report("x", [column("cpu", "x", [record("t::a", "passed")])])
    doc["columns"][0]["records"][0] = 5
    path = tmp_path / "matrix.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(matrix.MatrixError, match=r"columns\[0\]: records\[0\] lacks one of"):
        matrix.load_report(path)


def test_the_terminal_table_has_its_rule_under_the_header():
    text = matrix.render_text(report("x", [column("cpu", "x", [record("t::a", "passed")])]))
    lines = text.splitlines()
    assert lines[0] == "cells: passed/failed/skipped/xfailed"
    assert lines[1].split() == ["feature", "dtype", "cpu"]
    assert set(lines[2].replace(" ", "")) == {"-"}
    assert lines[-1].split()[0] == "TOTAL"


def test_a_long_failure_message_is_cut_at_its_limit(tmp_path):
    from specverify.matrix.junit import parse_junit

    long = "x" * 2500
    junit = dump(tmp_path / "j.xml", f'<testsuites><testsuite><testcase classname="t" name="a">'
                                     f'<failure message="{long}"/></testcase></testsuite></testsuites>')
    [rec] = parse_junit(junit)
    assert rec["message"] == "x" * 2000 + "..."


def test_only_a_broken_column_is_reported_as_a_failed_run():
    ok = column("cpu", "x", [record("t::a", "passed")])
    broken = dict(column("rocm-emulated", "x", []), status="broken", note="pytest exited 4")
    page = matrix.render_html(report("x", [ok, broken]))
    assert page.count("the pytest run itself failed") == 1
    assert "rocm-emulated: the pytest run itself failed</b>: pytest exited 4" in page


@pytest.mark.parametrize("argv, passed", [
    (["--", "-k", "generate"], ["-k", "generate"]),
    (["--", "--", "-x"], ["--", "-x"]),
])
def test_pytest_arguments_reach_the_run_with_the_separator_dropped(monkeypatch, argv, passed):
    """Everything after the matrix options goes to pytest; a leading `--` is only a separator."""
    import specverify.matrix.cli as mcli
    from specverify import cli

    seen = {}
    monkeypatch.setattr(mcli, "run", lambda **kw: seen.update(kw) or 0)
    assert cli.main(["matrix", "--profiles", "cpu", *argv]) == 0
    assert seen["pytest_args"] == passed


def test_the_inherited_cpu_capability_is_kept(monkeypatch):
    from specverify.matrix.checks import check_capabilities

    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    [(value, used)] = check_capabilities(None)
    assert (value, used) == ("default", "default")


def test_a_run_reports_through_the_callers_say(monkeypatch, tmp_path):
    """What a run has to say goes to the caller's `say`, not to stdout (found by the first
    generated-mutant campaign); the pytest child is replaced by a crash so nothing runs."""
    import specverify.matrix.runner as runner

    monkeypatch.setattr(runner, "run_profile", lambda *a, **k: (4, 0.1))
    lines = []
    rc = runner.run(profiles=["cpu"], dtypes=None, algorithms=None, out=tmp_path, label="x", workers="1",
                    expectations=None, root=ROOT, pytest_args=[], say=lines.append)
    assert rc == 1 and lines and any("cpu" in line for line in lines), lines


def test_a_column_records_the_capability_its_run_used(monkeypatch, tmp_path):
    """The child's own record of its CPU capability is what the column keeps; one that differs from
    the probe made before the run marks the column broken (found by the first generated-mutant
    campaign). The child is replaced by one that writes a JUnit file and an expectations sidecar."""
    import specverify.matrix.runner as runner

    def child(profile, cmd, root, log, interval, say, capability=None):
        dump(tmp_path / "junit-cpu.xml", '<testsuites><testsuite><testcase classname="t" name="a"/></testsuite>'
                                         '</testsuites>')
        (tmp_path / "expectations-cpu.json").write_text(json.dumps({"environment": {"cpu_capability": "zzz"}}),
                                                         encoding="utf-8")
        log.write_text("1 passed\n", encoding="utf-8")
        return 0, 0.1

    monkeypatch.setattr(runner, "run_profile", child)
    runner.run(profiles=["cpu"], dtypes=None, algorithms=None, out=tmp_path, label="x", workers="1",
               expectations=None, root=ROOT, pytest_args=[], say=lambda line: None)
    [col] = json.loads((tmp_path / "matrix.json").read_text(encoding="utf-8"))["columns"]
    assert col["cpu_capability"] == "zzz" and col["status"] == "broken", col
    assert "the run used CPU capability 'zzz'" in col["note"]
