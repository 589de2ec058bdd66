"""Expected failures and skips as data (tests/expectations/, tests/matrix/expectations.py): the
files are validated, an entry applies under its own profile only, an xfail is strict and narrow
(its `raises`), and stale entries are reported (an xfail whose test passed; an entry no test
takes, when the whole suite is collected), end to end on a sample suite that carries the real
conftest; the --sv-dtypes / --sv-algorithms rule (end to end: tests/meta/test_matrix.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from specverify import matrix
from specverify.dtypes import DTYPES
from tests.matrix import conditions as C
from tests.matrix import expectations as E

ROOT = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def entry_toml(**fields) -> str:
    return "[[expect]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in fields.items())


# ---------------------------------------------------------------------------------------------
# the data files


def test_shipped_files_validate_and_name_only_profiles():
    directory = ROOT / "tests" / "expectations"
    names = sorted(p.stem for p in directory.glob("*.toml"))
    assert names == sorted([*E.PROFILE_NAMES, E.ALL]), names
    entries = E.load_dir(directory, DTYPES, ROOT)
    assert all(e.file.startswith("tests/expectations/") for e in entries)


GOOD = dict(test="tests/test_x.py::test_y", kind="xfail", reason="tracked in issue 9", raises="ValueError")
BAD_FILES = {
    "unknown-key": (entry_toml(**GOOD, platform="rocm"), r"cpu\.toml \[\[expect\]\] #1: unknown key\(s\) \['platform'\]"),
    "missing-reason": (entry_toml(test="t", kind="skip"), r"#1: missing key 'reason'"),
    "empty-reason": (entry_toml(test="t", kind="skip", reason="  "), r"#1: reason is empty"),
    "xfail-without-raises": (entry_toml(test="t", kind="xfail", reason="r"), r"#1: an xfail must name the exception"),
    "unknown-exception": (entry_toml(**{**GOOD, "raises": "NoSuchError"}), r"#1: raises 'NoSuchError' is neither"),
    "not-an-exception": (entry_toml(**{**GOOD, "raises": "os.path"}), r"#1: raises 'os\.path' is neither"),
    "raises-on-skip": (entry_toml(test="t", kind="skip", reason="r", raises="ValueError"),
                       r"#1: raises applies to kind = \"xfail\" only"),
    "unknown-kind": (entry_toml(test="t", kind="maybe", reason="r"), r"#1: kind 'maybe' is not one of"),
    "empty-test": (entry_toml(test="", kind="skip", reason="r"), r"#1: test \(a node-id prefix\) is empty"),
    "unknown-dtype": (entry_toml(**GOOD, dtype="float12"), r"#1: dtype 'float12' is not a registered dtype"),
    "unknown-condition": (entry_toml(**GOOD, when="sunny"), r"#1: when 'sunny' is not a known condition"),
    "wrong-type": (entry_toml(**{**GOOD, "reason": 3}), r"#1: reason must be a string"),
    "second-entry": (entry_toml(**GOOD) + entry_toml(test="t", kind="skip"), r"cpu\.toml \[\[expect\]\] #2: missing"),
    "not-toml": ("[[expect]\ntest = ", r"cpu\.toml: not valid TOML"),
    "top-level-key": ('profile = "cpu"\n', r"cpu\.toml: unknown top-level key\(s\) \['profile'\]"),
}


@pytest.mark.parametrize("text, message", BAD_FILES.values(), ids=list(BAD_FILES))
def test_bad_files_are_refused_naming_file_and_entry(tmp_path, text, message):
    write(tmp_path / "cpu.toml", text)
    with pytest.raises(E.ExpectationError, match=message):
        E.load_dir(tmp_path, DTYPES, tmp_path)


def test_unknown_profile_file_name_is_refused(tmp_path):
    write(tmp_path / "cpu.toml", entry_toml(**GOOD))
    write(tmp_path / "rocm_emulated.toml", "")
    with pytest.raises(E.ExpectationError, match=r"rocm_emulated\.toml: unknown expectations file"):
        E.load_dir(tmp_path, DTYPES, tmp_path)
    with pytest.raises(E.ExpectationError, match="does not exist"):
        E.load_dir(tmp_path / "nowhere", DTYPES, tmp_path)


def test_exceptions_resolve_from_builtins_and_dotted_paths():
    from specverify.platform import ProfileUnavailable
    assert E.resolve_exception("AssertionError") is AssertionError
    assert E.resolve_exception("builtins.KeyError") is KeyError
    assert E.resolve_exception("specverify.platform.ProfileUnavailable") is ProfileUnavailable
    for bad in ("len", "no_such_module.Error", "specverify.platform.get_profile"):
        with pytest.raises(ValueError, match="neither"):
            E.resolve_exception(bad)


def _entries(tmp_path) -> list[E.Entry]:
    write(tmp_path / "cpu.toml", entry_toml(test="t.py::test_a", kind="skip", reason="cpu a")
          + entry_toml(test="t.py::test_b", kind="xfail", reason="cpu b", raises="KeyError", dtype="float16"))
    write(tmp_path / "all.toml", entry_toml(test="t.py::test_a", kind="skip", reason="all a")
          + entry_toml(test="t.py::test_c", kind="skip", reason="all c"))
    write(tmp_path / "rocm-emulated.toml", entry_toml(test="t.py::test_", kind="skip", reason="rocm only"))
    return E.load_dir(tmp_path, DTYPES, tmp_path)


def test_an_entry_applies_under_its_own_profile_only(tmp_path):
    entries = _entries(tmp_path)
    cpu = E.for_profile(entries, "cpu")
    assert [e.ref for e in cpu] == ["cpu.toml #1", "cpu.toml #2", "all.toml #1", "all.toml #2"]
    rocm = E.for_profile(entries, "rocm-emulated")
    assert [e.ref for e in rocm] == ["rocm-emulated.toml #1", "all.toml #1", "all.toml #2"]
    assert E.for_profile(entries, "cuda") == [e for e in entries if e.scope == "all"]


def test_a_conditional_entry_applies_only_where_its_condition_holds(tmp_path):
    name = next(iter(C.CONDITIONS))
    write(tmp_path / "all.toml", entry_toml(test="t.py::test_a", kind="skip", reason="always")
          + entry_toml(test="t.py::test_b", kind="skip", reason="sometimes", when=name))
    entries = E.load_dir(tmp_path, DTYPES, tmp_path)
    assert entries[1].when == name and entries[1].as_dict()["when"] == name
    assert [e.ref for e in E.for_profile(entries, "cpu", holds=lambda n: True)] == ["all.toml #1", "all.toml #2"]
    inactive = E.for_profile(entries, "cpu", holds=lambda n: False)
    assert [e.ref for e in inactive] == ["all.toml #1"]
    # An inactive entry is never judged stale, though nothing matched it.
    assert E.stale(inactive, E.match(inactive, [("t.py::test_a", "-")]), True, {}) == []


def test_the_loop_bound_condition_is_probed(monkeypatch):
    """The condition runs a kernel; where the versions say how it must come out, it does."""
    from specverify import environment
    name = "triton-interpreter-rejects-runtime-loop-bounds"
    triton_at, numpy_at = environment.release(environment.triton_version())[:2], environment.release(np.__version__)[:2]
    if triton_at <= (3, 6) and numpy_at >= (2, 4):
        assert C.holds(name) is (os.environ.get("TRITON_INTERPRET") == "1")
    if triton_at >= (3, 9) or numpy_at < (2, 4):
        assert C.holds(name) is False
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert C.CONDITIONS[name]() is False           # compiled Triton has no such limit


def test_first_matching_entry_wins_and_dtype_restricts(tmp_path):
    cpu = E.for_profile(_entries(tmp_path), "cpu")
    items = [("t.py::test_a[x]", "-"), ("t.py::test_b[float16]", "float16"), ("t.py::test_b[float32]", "float32"),
             ("t.py::test_d", "-")]
    m = E.match(cpu, items)
    assert {n: e.ref for n, e in m.applied.items()} == {"t.py::test_a[x]": "cpu.toml #1",
                                                         "t.py::test_b[float16]": "cpu.toml #2"}
    assert m.applied["t.py::test_b[float16]"].raises is KeyError
    assert m.applied["t.py::test_a[x]"].tagged_reason == "[cpu.toml #1] cpu a"
    stale = E.stale(cpu, m, True, {})
    assert [(s["ref"], s["why"]) for s in stale] == [("all.toml #1", "unmatched"), ("all.toml #2", "unmatched")]
    assert "takes an earlier entry (cpu.toml #1)" in stale[0]["detail"]
    assert stale[1]["detail"] == "matches no collected test"
    # A narrowed collection cannot judge unmatched entries; a passing xfail is stale anyway.
    assert E.stale(cpu, m, False, {}) == []
    passed = E.stale(cpu, m, False, {"cpu.toml #2": ["t.py::test_b[float16]"]})
    assert [(s["ref"], s["why"], s["tests"]) for s in passed] == [("cpu.toml #2", "passed", ["t.py::test_b[float16]"])]


@pytest.mark.parametrize("args, narrowing, whole", [
    ([], [], True), (["tests"], [], True), (["."], [], True), (["tests/"], [], True),
    (["tests/test_platform.py"], [], False), (["tests::x"], [], False), (["tests", "tests/meta"], [], False),
    ([], ["--ignore"], False),
])
def test_whole_suite_rule(args, narrowing, whole):
    got, why = E.whole_suite(args, ROOT, ROOT, ["tests"], narrowing)
    assert got is whole
    assert (why == "") is whole


# ---------------------------------------------------------------------------------------------
# end to end: a sample suite under the real conftest

SAMPLE = '''
import pytest

def test_pass(): pass

def test_fail(): assert 0, "planted failure"

def test_value_error(): raise ValueError("the expected one")

def test_key_error(): raise KeyError("not the expected one")

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dtype(dtype): pass

@pytest.mark.parametrize("algorithm", ["eagle-chain", "target-only"])
def test_algo(algorithm): pass

@pytest.fixture
def broken(): raise RuntimeError("setup broke")

def test_setup_error(broken): pass

@pytest.mark.xfail(reason="a decorator, non-strict")
def test_xpassed_nonstrict(): pass
'''
FEATURES = '''
[features]
"test_sample.py" = { feature = "sample", algorithm = "-" }
"test_sample.py::test_algo" = { feature = "algo", algorithm = "eagle" }
'''
CPU = (entry_toml(test="test_sample.py::test_value_error", kind="xfail", reason="raises as expected", raises="ValueError")
       + entry_toml(test="test_sample.py::test_key_error", kind="xfail", reason="wrong exception", raises="ValueError")
       + entry_toml(test="test_sample.py::test_dtype", kind="skip", reason="no bf16 here", dtype="bfloat16")
       + entry_toml(test="test_sample.py::test_pass", kind="xfail", reason="stale: it passes", raises="AssertionError")
       + entry_toml(test="test_sample.py::test_gone", kind="skip", reason="stale: no such test")
       + entry_toml(test="test_sample.py::test_value_e", kind="skip", reason="stale: shadowed"))
ROCM = entry_toml(test="test_sample.py::test_fail", kind="skip", reason="rocm-emulated only")
ALL = entry_toml(test="test_sample.py::test_algo[target", kind="skip", reason="every profile")

# (outcome, feature, dtype, algorithm, expectation) per test of a full run under the cpu profile
EXPECTED = {
    "test_sample.py::test_pass": ("failed", "sample", "-", "-", "expect/cpu.toml #4"),
    "test_sample.py::test_fail": ("failed", "sample", "-", "-", None),
    "test_sample.py::test_value_error": ("xfailed", "sample", "-", "-", "expect/cpu.toml #1"),
    "test_sample.py::test_key_error": ("failed", "sample", "-", "-", "expect/cpu.toml #2"),
    "test_sample.py::test_dtype[float32]": ("passed", "sample", "float32", "-", None),
    "test_sample.py::test_dtype[bfloat16]": ("skipped", "sample", "bfloat16", "-", "expect/cpu.toml #3"),
    "test_sample.py::test_algo[eagle-chain]": ("passed", "algo", "-", "eagle", None),
    "test_sample.py::test_algo[target-only]": ("skipped", "algo", "-", "target", "expect/all.toml #1"),
    "test_sample.py::test_setup_error": ("error", "sample", "-", "-", None),
    "test_sample.py::test_xpassed_nonstrict": ("xpassed", "sample", "-", "-", None),
}


@pytest.fixture
def sample_suite(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("SPECVERIFY_PLATFORM", "cpu")       # the cpu profile exists on every machine
    monkeypatch.delenv("SPECVERIFY_EXPECTATIONS", raising=False)
    pytester.makeconftest((ROOT / "conftest.py").read_text(encoding="utf-8"))
    pytester.makepyfile(test_sample=SAMPLE)
    root = pytester.path
    write(root / "tests" / "matrix" / "features.toml", FEATURES)
    write(root / "expect" / "cpu.toml", CPU)
    write(root / "expect" / "rocm-emulated.toml", ROCM)
    write(root / "expect" / "all.toml", ALL)
    return pytester


def test_expectations_applied_and_stale_reported_under_xdist(sample_suite):
    """The whole (sample) suite under one xdist worker: every entry of cpu.toml and all.toml applies
    as written, rocm-emulated.toml does not, the three stale entries are reported in the terminal
    and the side file, and the JUnit XML carries outcome, classification and entry per test.
    -k deselects the test of entry #3 after matching: #3 still counts as used, not stale."""
    root = sample_suite.path
    result = sample_suite.runpytest_subprocess("-n", "1", "-p", "no:cacheprovider", "-rs", "--sv-expectations",
                                               "expect", "--sv-expectations-report", "stale.json",
                                               "--junitxml", "junit.xml", "-k", "not bfloat16")
    result.assert_outcomes(passed=2, failed=3, skipped=1, xfailed=1, xpassed=1, errors=1)   # xdist: no deselected count
    out = result.stdout.str()
    assert "[XPASS(strict)] [expect/cpu.toml #4] stale: it passes" in out
    assert "KeyError: 'not the expected one'" in out
    result.stdout.fnmatch_lines(["*specverify expectations*", "profile cpu: 7 entries from expect, applied to 5 test(s)",
                                 "STALE expect/cpu.toml #4 (xfail 'test_sample.py::test_pass'): the expected failure "
                                 "did not happen*test_sample.py::test_pass",
                                 "STALE expect/cpu.toml #5 (skip 'test_sample.py::test_gone'): matches no collected test",
                                 "STALE expect/cpu.toml #6 *takes an earlier entry (expect/cpu.toml #1)",
                                 "*[[]expect/all.toml #1[]] every profile*"])
    assert "rocm-emulated only" not in out and "not checked" not in out
    report = json.loads((root / "stale.json").read_text(encoding="utf-8"))
    assert report["profile"] == "cpu" and report["unmatched_checked"] is True
    assert [(s["ref"], s["why"]) for s in report["stale"]] == [
        ("expect/cpu.toml #4", "passed"), ("expect/cpu.toml #5", "unmatched"), ("expect/cpu.toml #6", "unmatched")]
    assert {e["ref"]: e["applied"] for e in report["entries"]} == {
        "expect/cpu.toml #1": 1, "expect/cpu.toml #2": 1, "expect/cpu.toml #3": 1, "expect/cpu.toml #4": 1,
        "expect/cpu.toml #5": 0, "expect/cpu.toml #6": 0, "expect/all.toml #1": 1}
    # The matrix reads the same JUnit XML back: outcome, classification, entry.
    records = {r["id"]: r for r in matrix.parse_junit(root / "junit.xml")}
    got = {i: (r["outcome"], r["feature"], r["dtype"], r["algorithm"], r.get("expectation")) for i, r in records.items()}
    assert got == {k: v for k, v in EXPECTED.items() if "bfloat16" not in k}
    assert records["test_sample.py::test_fail"]["message"].startswith("AssertionError: planted failure")
    assert "RuntimeError: setup broke" in records["test_sample.py::test_setup_error"]["message"]
    assert records["test_sample.py::test_value_error"]["message"] == "[expect/cpu.toml #1] raises as expected"


class FakeConfig:
    """What the conftest's MatrixPlugin.from_config reads of a pytest config."""

    def __init__(self, rootpath: Path, **options):
        self.rootpath = rootpath
        self.options = {"--sv-dtypes": None, "--sv-algorithms": None, "--sv-expectations": None, **options}

    def getoption(self, name):
        return self.options[name]


@pytest.mark.parametrize("options, message", [
    ({"--sv-expectations": "expect"}, r"rocm\.toml \[\[expect\]\] #1: an xfail must name the exception"),
    ({"--sv-dtypes": "float32,float12"}, r"--sv-dtypes: unknown name\(s\) \['float12'\]"),
    ({"--sv-dtypes": "float32,"}, r"--sv-dtypes='float32,': expected a comma-separated list"),
    ({"--sv-algorithms": "medusa"}, r"--sv-algorithms: unknown name\(s\) \['medusa'\]"),
    ({"--sv-expectations": "missing"}, r"missing: the expectations directory does not exist"),
])
def test_the_conftest_refuses_bad_data_and_filters_as_usage_errors(tmp_path, monkeypatch, options, message):
    """Another profile's file is validated too: a typo in rocm.toml stops a cpu run at configure."""
    from tests.matrix import plugin as matrix_plugin
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECVERIFY_PLATFORM", "cpu")
    write(tmp_path / "expect" / "cpu.toml", CPU)
    write(tmp_path / "expect" / "rocm.toml", entry_toml(test="x", kind="xfail", reason="no raises"))
    with pytest.raises(pytest.UsageError, match=message):
        matrix_plugin.MatrixPlugin.from_config(FakeConfig(tmp_path, **options))


def test_the_conftest_loads_the_default_directory_and_the_env_override(tmp_path, monkeypatch):
    from tests.matrix import plugin as matrix_plugin
    monkeypatch.setenv("SPECVERIFY_PLATFORM", "cpu")
    monkeypatch.delenv(matrix_plugin.EXPECTATIONS_ENV, raising=False)
    assert matrix_plugin.MatrixPlugin.from_config(FakeConfig(tmp_path)).expect_dir is None   # no tests/expectations here
    write(tmp_path / "tests" / "expectations" / "cpu.toml", CPU)
    plugin = matrix_plugin.MatrixPlugin.from_config(FakeConfig(tmp_path))
    assert [e.ref for e in plugin.entries][:2] == ["tests/expectations/cpu.toml #1", "tests/expectations/cpu.toml #2"]
    write(tmp_path / "other" / "all.toml", ALL)
    monkeypatch.setenv(matrix_plugin.EXPECTATIONS_ENV, str(tmp_path / "other"))
    assert [e.ref for e in matrix_plugin.MatrixPlugin.from_config(FakeConfig(tmp_path)).entries] == ["other/all.toml #1"]


@pytest.mark.parametrize("dtype, algorithm, dtypes, algorithms, kept", [
    ("float32", "eagle", None, None, True),
    ("float32", "eagle", {"float32"}, None, True),
    ("-", "eagle", {"float32"}, None, False),          # '-' must be listed to keep dtype-less tests
    ("-", "eagle", {"float32", "-"}, None, True),
    ("bfloat16", "-", {"float32", "-"}, None, False),
    ("float32", "target", None, {"eagle"}, False),
    ("float32", "-", {"float32"}, {"eagle", "-"}, True),
])
def test_filter_rule(dtype, algorithm, dtypes, algorithms, kept):
    from tests.matrix.classify import keep
    assert keep(dtype, algorithm, dtypes and frozenset(dtypes), algorithms and frozenset(algorithms)) is kept
