"""The mutation harness itself (specverify/mutants.py), on tiny synthetic trees and zoos in tmp
dirs: zoo validation, refusal of a target not found exactly once, kills and survivors, the
working tree left alone, and the copy (not an installed package) being what gets imported."""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

import pytest

from specverify import cli, mutants
from specverify.mutants import ImportLeak, ZooError

SOURCE = '''"""A stand-in for the package under test."""


def add(a, b):
    return a + b


def twice(x):
    return x + x


def unused():
    return 1
'''

TESTS = '''from pathlib import Path

import reference
import specverify


def test_add():
    assert specverify.add(2, 3) == 5 == reference.add(2, 3)


def test_imports_come_from_this_tree():
    tree = Path(__file__).resolve().parents[1]
    assert Path(specverify.__file__).resolve().parent.parent == tree
    assert Path(reference.__file__).resolve().parent.parent == tree
'''

MUTANT = '''
[[mutant]]
name = "{name}"
file = "specverify/__init__.py"
target = \'\'\'{target}\'\'\'
replacement = \'\'\'{replacement}\'\'\'
why = "{name}: a planted bug"
source = "tests/meta/test_mutants.py"
tests = ["{tests}"]
'''

KILLED = dict(name="add-subtracts", target="return a + b", replacement="return a - b")
SURVIVES = dict(name="unused-changes", target="return 1", replacement="return 2")


def mutant_toml(*records, tests="tests/test_add.py") -> str:
    return "".join(MUTANT.format(**{"tests": tests, **r}) for r in records)


def make_tree(root: Path, *, zoo: str | None = None, reference: bool = True, tests: str = TESTS) -> Path:
    """A repository in miniature: specverify/, reference/, tests/, conftest.py, pyproject.toml."""
    # specverify.conformance.plugin: the pytest11 entry point of the installed package, which every
    # pytest run in the copy loads; it must resolve inside the copy, as the real tree's does.
    files = {"specverify/__init__.py": SOURCE, "specverify/conformance/__init__.py": "",
             "specverify/conformance/plugin.py": "", "tests/__init__.py": "", "tests/test_add.py": tests,
             "conftest.py": "", "pyproject.toml": "[tool.pytest.ini_options]\ntestpaths = [\"tests\"]\n",
             "tests/mutants/zoo.toml": zoo if zoo is not None else mutant_toml(KILLED, SURVIVES)}
    if reference:
        files["reference/__init__.py"] = "def add(a, b):\n    return a + b\n"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


def run_cli(tree: Path, *extra: str) -> int:
    return cli.main(["mutants", "--root", str(tree), *extra])


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------
# the zoo as data


def test_load_zoo_reads_every_file_in_name_order(tmp_path):
    tree = make_tree(tmp_path, zoo=mutant_toml(SURVIVES))
    (tree / "tests/mutants/a.toml").write_text(mutant_toml(KILLED), encoding="utf-8")
    zoo = mutants.load_zoo(tree / "tests/mutants", tree)
    assert [(m.name, m.origin) for m in zoo] == [("add-subtracts", "tests/mutants/a.toml"),
                                                ("unused-changes", "tests/mutants/zoo.toml")]
    assert zoo[0].slice_args() == ["tests/test_add.py"] and zoo[0].fast is False


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace('why = "add-subtracts: a planted bug"\n', ""), "missing field 'why'"),
    (lambda t: t.replace('source = ', 'sauce = '), "unknown field 'sauce'"),
    (lambda t: t + "fast = \"yes\"\n", "field 'fast' must be a bool, got str"),
    (lambda t: t.replace("specverify/__init__.py", "specverify/nope.py"),
     "file 'specverify/nope.py' does not exist"),
    (lambda t: t.replace("tests/test_add.py", "tests/test_nope.py"),
     "tests entry 'tests/test_nope.py' does not exist"),
    (lambda t: t.replace('tests = ["tests/test_add.py"]', "tests = []"), "field 'tests' is empty"),
    (lambda t: t.replace('name = "add-subtracts"', 'name = "Add_Subtracts"'), "must be kebab-case"),
    (lambda t: t.replace("return a - b", "return a + b"), "replacement equals target"),
    (lambda t: t.replace("specverify/__init__.py", "../outside.py"), "must be a relative path inside"),
    (lambda t: t + 'needs = "tpu"\n', "field 'needs' must be one of ['cuda'], got 'tpu'"),
    (lambda t: t + 'needs = "cuda"\nfast = true\n', "a mutant with 'needs' cannot be fast"),
])
def test_bad_record_is_an_error_naming_the_file_and_the_mutant(tmp_path, edit, message):
    tree = make_tree(tmp_path, zoo=edit(mutant_toml(KILLED)))
    with pytest.raises(ZooError, match="tests/mutants/zoo.toml: mutant") as info:
        mutants.load_zoo(tree / "tests/mutants", tree)
    assert message in str(info.value)
    if "Add_Subtracts" not in str(info.value):
        assert "'add-subtracts' (#1)" in str(info.value)


def test_duplicate_names_across_files_are_rejected(tmp_path):
    tree = make_tree(tmp_path, zoo=mutant_toml(KILLED))
    (tree / "tests/mutants/more.toml").write_text(mutant_toml(SURVIVES, {**KILLED, "replacement": "return b"}), encoding="utf-8")
    with pytest.raises(ZooError, match=r"zoo.toml: mutant 'add-subtracts' \(#1\): duplicate name, already "
                                       r"defined in tests/mutants/more.toml: mutant 'add-subtracts' \(#2\)"):
        mutants.load_zoo(tree / "tests/mutants", tree)


def test_file_without_mutant_tables_and_invalid_toml_are_rejected(tmp_path):
    tree = make_tree(tmp_path, zoo="[other]\nx = 1\n")
    with pytest.raises(ZooError, match=r"zoo.toml: a zoo file holds \[\[mutant\]\] tables and nothing else"):
        mutants.load_zoo(tree / "tests/mutants", tree)
    (tree / "tests/mutants/zoo.toml").write_text("[[mutant]\n", encoding="utf-8")
    with pytest.raises(ZooError, match="zoo.toml: not valid TOML"):
        mutants.load_zoo(tree / "tests/mutants", tree)


def test_selection_by_name_and_fast(tmp_path):
    tree = make_tree(tmp_path, zoo=mutant_toml(KILLED) + "fast = true\n" + mutant_toml(SURVIVES))
    zoo = mutants.load_zoo(tree / "tests/mutants", tree)
    assert [m.name for m in mutants.select(zoo, fast=True)] == ["add-subtracts"]
    assert [m.name for m in mutants.select(zoo, only=["unused-changes"])] == ["unused-changes"]
    with pytest.raises(ZooError, match=r"--only: unknown mutant\(s\) 'nope'; known: add-subtracts, unused-changes"):
        mutants.select(zoo, only=["nope"])
    with pytest.raises(ZooError, match="the selection holds no mutant"):
        mutants.select(zoo, only=["unused-changes"], fast=True)


# ------------------------------------------------------------------------------------------
# targets found exactly once, or refused


@pytest.mark.parametrize("target, count", [("return a * b", 0), ("+ ", 2)])
def test_target_not_found_exactly_once_is_refused(tmp_path, capsys, target, count):
    tree = make_tree(tmp_path, zoo=mutant_toml(dict(name="rotten", target=target, replacement="pass")))
    zoo = mutants.load_zoo(tree / "tests/mutants", tree)
    want = (f"mutant 'rotten': target found {count} times in specverify/__init__.py "
            f"(must be exactly once; from tests/mutants/zoo.toml)")
    assert mutants.target_refusal(zoo[0], SOURCE) == want
    with pytest.raises(ZooError, match=r"target found \d times"):
        mutants.apply(zoo[0], SOURCE)
    assert run_cli(tree) == 1
    out = capsys.readouterr().out
    assert "REFUSED" in out and want in out and "1 refused" in out


def test_list_prints_name_file_why_and_flags_a_rotten_target(tmp_path, capsys):
    tree = make_tree(tmp_path, zoo=mutant_toml(KILLED, dict(name="rotten", target="nowhere", replacement="x")))
    assert run_cli(tree, "--list") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "add-subtracts  specverify/__init__.py  add-subtracts: a planted bug"
    assert lines[1].startswith("rotten  specverify/__init__.py")
    assert "REFUSED: mutant 'rotten': target found 0" in lines[1]


def test_zoo_error_is_exit_2_with_a_one_line_reason(tmp_path, capsys):
    tree = make_tree(tmp_path, zoo=mutant_toml(KILLED).replace("source = ", "sauce = "))
    assert run_cli(tree) == 2
    assert "unknown field 'sauce'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# running mutants


def test_kill_names_the_failing_test_a_survivor_fails_the_run_and_the_tree_is_untouched(tmp_path, capsys):
    tree = make_tree(tmp_path / "repo")
    before = tree_digest(tree)
    md = tmp_path / "kills.md"
    assert run_cli(tree, "--jobs", "2", "--markdown", str(md)) == 1       # one survivor: exit 1
    assert tree_digest(tree) == before                                    # the working tree untouched
    out = capsys.readouterr().out
    assert "add-subtracts: killed by tests/test_add.py::test_add" in out
    table = out[out.index("mutant "):].splitlines()
    assert table[1].split()[:3] == ["add-subtracts", "yes", "tests/test_add.py::test_add"]
    assert table[2].split()[:2] == ["unused-changes", "no"]
    assert "2 mutants: 1 killed, 1 survived, 0 refused" in table[3]
    rows = md.read_text(encoding="utf-8").splitlines()
    assert rows[2].startswith("| `add-subtracts` | yes | `tests/test_add.py::test_add` |")
    assert rows[2].endswith("| add-subtracts: a planted bug |") and "| **no** |" in rows[3]


def test_all_killed_is_exit_0(tmp_path):
    assert run_cli(make_tree(tmp_path, zoo=mutant_toml(KILLED))) == 0


@pytest.mark.parametrize("has_cuda", [False, True], ids=["no-cuda", "cuda"])
def test_a_mutant_that_needs_cuda_runs_only_where_cuda_is(tmp_path, capsys, monkeypatch, has_cuda):
    asked = []
    monkeypatch.setattr(mutants, "device_available", lambda device: asked.append(device) or has_cuda)
    zoo = mutant_toml(KILLED).replace('tests = ["tests/test_add.py"]', 'tests = ["tests/test_add.py"]\nneeds = "cuda"')
    zoo += mutant_toml(dict(KILLED, name="add-multiplies", replacement="return a * b")).replace(
        'tests = ["tests/test_add.py"]', 'tests = ["tests/test_add.py"]\nneeds = "cuda"')
    tree = make_tree(tmp_path, zoo=zoo)
    assert [m.needs for m in mutants.load_zoo(tree / "tests/mutants", tree)] == ["cuda", "cuda"]
    assert run_cli(tree) == 0
    assert asked == ["cuda"], "the device is asked about once per run"
    table = capsys.readouterr().out.split("mutant ", 1)[1].splitlines()
    if has_cuda:
        assert table[1].split()[:2] == ["add-subtracts", "yes"]
        assert "2 mutants: 2 killed, 0 survived, 0 refused;" in table[3]
    else:
        assert table[1].split()[:4] == ["add-subtracts", "not", "run", "needs"]
        assert "2 mutants: 0 killed, 0 survived, 0 refused, 2 not run" in table[3]


def test_device_available_asks_a_child_process():
    import torch
    assert mutants.device_available("cuda") is torch.cuda.is_available()


def test_a_slice_that_never_imports_the_mutated_file_is_reported(tmp_path):
    # A module of its own: every pytest run imports the package itself (the conformance plugin).
    zoo = mutant_toml(SURVIVES).replace('file = "specverify/__init__.py"', 'file = "specverify/extra.py"')
    tree = make_tree(tmp_path, zoo=zoo, tests="def test_nothing():\n    pass\n")
    (tree / "specverify/extra.py").write_text("def unused():\n    return 1\n", encoding="utf-8")
    zoo = mutants.load_zoo(tree / "tests/mutants", tree)
    [res] = mutants.run_zoo(zoo, tree, progress=lambda line: None)
    assert (res.status, res.detail) == ("survived", "the slice never imported the mutated file")


def test_the_copy_is_what_gets_imported(tmp_path):
    # test_imports_come_from_this_tree passes only when specverify and reference come from the copy,
    # not from the editable install of the real project; the baseline runs it unmutated.
    tree = make_tree(tmp_path, zoo=mutant_toml(KILLED))
    zoo = mutants.load_zoo(tree / "tests/mutants", tree)
    [res] = mutants.run_zoo(zoo, tree, baseline=True, progress=lambda line: None)
    assert (res.status, res.test) == ("killed", "tests/test_add.py::test_add")


def test_a_package_resolving_outside_the_copy_is_refused(tmp_path):
    # No reference/ in the tree: `import reference` finds the installed project, outside the copy.
    tree = make_tree(tmp_path, zoo=mutant_toml(KILLED), reference=False)
    zoo = mutants.load_zoo(tree / "tests/mutants", tree)
    with pytest.raises(ImportLeak, match="specverify-mutants-.*copy-0"):
        mutants.run_zoo(zoo, tree, progress=lambda line: None)


def test_a_module_loaded_from_outside_during_the_run_refuses_the_result(tmp_path):
    leak = textwrap.dedent('''
        import sys, types
        import specverify

        def test_add():
            module = types.ModuleType("reference.elsewhere")
            module.__file__ = "/elsewhere/reference/elsewhere.py"
            sys.modules["reference.elsewhere"] = module
            assert specverify.add(2, 3) == 5
    ''')
    tree = make_tree(tmp_path, zoo=mutant_toml(KILLED), tests=leak)
    [res] = mutants.run_zoo(mutants.load_zoo(tree / "tests/mutants", tree), tree, progress=lambda line: None)
    assert res.status == "refused"
    assert res.detail == "imports resolved outside the copy: reference.elsewhere: /elsewhere/reference/elsewhere.py"


def test_a_failing_baseline_refuses_its_mutants(tmp_path):
    tree = make_tree(tmp_path, zoo=mutant_toml(KILLED), tests=TESTS + "\n\ndef test_broken():\n    assert False\n")
    zoo = mutants.load_zoo(tree / "tests/mutants", tree)
    [res] = mutants.run_zoo(zoo, tree, baseline=True, progress=lambda line: None)
    assert res.status == "refused"
    assert res.detail == "baseline failed unmutated: tests/test_add.py::test_broken"


def test_a_hanging_mutant_is_killed_by_timeout(tmp_path):
    tree = make_tree(tmp_path, zoo=mutant_toml(dict(name="hangs", target="return a + b",
                                                    replacement="while True:\n        pass")))
    zoo = mutants.load_zoo(tree / "tests/mutants", tree)
    [res] = mutants.run_zoo(zoo, tree, timeout=3.0, progress=lambda line: None)
    assert res.status == "killed" and res.test.startswith("(timeout after")


def test_first_failure_parses_the_short_summary():
    out = "....F\n=== short test summary info ===\nFAILED tests/t.py::test_x[a - b] - AssertionError: 1 - 2\n"
    assert mutants.first_failure(out) == "tests/t.py::test_x[a - b]"
    assert mutants.first_failure("ERROR tests/t.py - ImportError: no\n") == "tests/t.py"
    assert mutants.first_failure("1 passed in 0.1s\n") is None


def test_cli_rejects_bad_jobs_and_timeout(capsys):
    for bad in (["--jobs", "0"], ["--jobs", "two"], ["--timeout", "nan"], ["--timeout", "-1"]):
        with pytest.raises(SystemExit):
            cli.main(["mutants", *bad])
    err = capsys.readouterr().err
    assert "--jobs must be an int >= 1, got '0'" in err and "got 'two'" in err
    assert "--timeout must be a finite number of seconds > 0" in err


def test_every_shipped_target_still_applies():
    """Every mutant of the shipped zoo plants: its target is in its file exactly once. A target
    that code moved away from would be refused only when someone runs that mutant; this keeps the
    zoo honest at every commit (four had gone stale: three after a refactor of the matrix files,
    one after the greedy verify moved behind _verify_greedy)."""
    root = Path(mutants.__file__).resolve().parents[1]
    zoo = mutants.load_zoo(root / "tests" / "mutants", root)
    stale = [refusal for m in zoo
             if (refusal := mutants.target_refusal(m, (root / m.file).read_text(encoding="utf-8")))]
    assert len(zoo) >= 150 and not stale, "\n".join(stale)
