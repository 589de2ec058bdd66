"""The generated mutants (issue 24, specverify/mutant_generator.py and mutation_campaign.py): each
standard operator makes the mutant it names and nothing in docstrings, strings, annotations or
imports; every site of the tree plants exactly once and compiles; sampling is a function of the
seed; the triage file reports stale entries; and a small deterministic subset of generated mutants
is killed by the suite (the CI subset, like the zoo's `fast` mutants)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from specverify import mutant_generator as gen
from specverify import mutants as harness
from specverify import mutation_campaign as campaign

ROOT = Path(__file__).resolve().parents[2]

SAMPLE = '''\
"""A module docstring with 1 < 2 and x[-1]."""
import os

LIMIT: int = 8


def f(a: int, b: "list[int]" = None) -> int:
    """A function docstring: a and b."""
    if a < b[-1] and not a == 0:
        raise ValueError(f"a {a + 1} is out of range")
    total = a * 2 + 1.5
    total -= 1
    b.append_(total)
    return g(a, b)
'''


def sample_sites(tmp_path: Path) -> list[gen.Site]:
    (tmp_path / "specverify").mkdir()
    (tmp_path / "specverify" / "ops.py").write_text(SAMPLE, encoding="utf-8")
    return gen.sites_of(tmp_path, "specverify/ops.py")


def edits(sites, operator) -> set[tuple[str, str]]:
    return {(s.target.strip(), s.replacement.strip()) for s in sites if s.operator == operator}


def test_each_operator_makes_its_mutant(tmp_path):
    sites = sample_sites(tmp_path)
    cond = "if a < b[-1] and not a == 0:"
    assert (cond, "if a <= b[-1] and not a == 0:") in edits(sites, "relational")
    assert (cond, "if a < b[-1] and not a != 0:") in edits(sites, "relational")
    assert (cond, "if a < b[0] and not a == 0:") in edits(sites, "index")
    assert {(cond, "if a < b[-1] or not a == 0:"), (cond, "if (a < b[-1]):"), (cond, "if (not a == 0):")} \
        <= edits(sites, "boolean")
    assert (cond, "if a < b[-1] and (a == 0):") in edits(sites, "not")
    assert ("total = a * 2 + 1.5", "total = a * 2 - 1.5") in edits(sites, "arithmetic")
    assert ("total = a * 2 + 1.5", "total = a / 2 + 1.5") in edits(sites, "arithmetic")
    assert ("total -= 1", "total += 1") in edits(sites, "arithmetic")
    consts = edits(sites, "constant")
    assert {("total = a * 2 + 1.5", "total = a * 3 + 1.5"), ("total = a * 2 + 1.5", "total = a * 1 + 1.5"),
            ("total -= 1", "total -= 0"), ("if a < b[-1] and not a == 0:", "if a < b[-1] and not a == 1:"),
            ("LIMIT: int = 8", "LIMIT: int = 9")} <= consts
    assert ("total = a * 2 + 1.5", f"total = a * 2 + {1.5 * (1 + 1e-9)!r}") in consts
    assert ("return g(a, b)", "return g(b, a)") in edits(sites, "swap-args")
    assert ("return g(a, b)", "return None") in edits(sites, "return-constant")
    removed = {t for t, r in edits(sites, "remove-statement")}
    assert {"total = a * 2 + 1.5", "total -= 1", "b.append_(total)", "LIMIT: int = 8"} <= removed
    assert any(t.startswith("raise ValueError") for t in removed)


def test_strings_annotations_imports_and_docstrings_are_never_mutated(tmp_path):
    for s in sample_sites(tmp_path):
        changed = s.target != s.replacement
        assert changed
        assert "docstring" not in s.target, s
        assert "import os" not in s.target, s
        if s.target.strip().startswith("def f("):
            pytest.fail(f"a signature (annotation / default) line was mutated: {s}")
        if "raise ValueError" in s.target:
            assert s.operator == "remove-statement", f"the f-string message was mutated: {s}"


def test_every_site_of_the_tree_plants_once_and_compiles():
    sites = gen.all_sites(ROOT)
    assert len(sites) > 2000
    assert {s.operator for s in sites} == {"relational", "arithmetic", "constant", "index", "boolean", "not",
                                           "swap-args", "remove-statement", "return-constant"}
    assert {s.module for s in sites} == set(gen.MODULES)
    assert len({s.ident for s in sites}) == len(sites), "two sites share an id"
    texts = {}
    for s in gen.sample(sites, 25, seed=11):
        text = texts.setdefault(s.file, (ROOT / s.file).read_text(encoding="utf-8"))
        assert text.count(s.target) == 1, s.ident
        compile(text.replace(s.target, s.replacement, 1), s.file, "exec")
    assert not any(s.file.startswith(("specverify/conformance", "specverify/mutant")) for s in sites)


def test_sampling_is_a_function_of_the_seed():
    sites = gen.all_sites(ROOT)
    a, b, c = (gen.sample(sites, 5, seed) for seed in (3, 3, 4))
    assert [s.ident for s in a] == [s.ident for s in b] != [s.ident for s in c]
    per_module = {m: sum(1 for s in a if s.module == m) for m in gen.MODULES}
    assert all(n == 5 for n in per_module.values()), per_module


def test_sampling_per_file_draws_from_each_named_file():
    """--files: `per_file` sites of each file (all of a smaller one), none of another file, in the
    order the files are named (a repeat counts once), a function of the seed; the module draw is
    the same with or without it."""
    sites = gen.all_sites(ROOT)
    files = ["specverify/kernels/order.py", "specverify/kernels/rounding.py", "specverify/kernels/order.py"]
    pools = {f: [s for s in sites if s.file == f] for f in files}
    assert len(pools[files[0]]) > 7 and 0 < len(pools[files[1]])
    a, b, c = (gen.sample_files(sites, files, 7, seed) for seed in (3, 3, 4))
    assert [s.ident for s in a] == [s.ident for s in b] != [s.ident for s in c]
    assert sum(s.file == files[0] for s in a) == 7 and {s.file for s in a} == set(files)
    small = gen.sample_files(sites, [files[1]], len(pools[files[1]]) + 1, 3)
    assert sorted(s.ident for s in small) == sorted(s.ident for s in pools[files[1]])
    assert a == sorted(a, key=lambda s: (s.file, s.line, s.ident))
    import random
    rng = random.Random(3)
    first = rng.sample(pools[files[0]], 7)                   # the named order decides which draw comes first
    assert {s.ident for s in a if s.file == files[0]} == {s.ident for s in first}


def test_campaign_files_are_checked_against_the_mutated_sources():
    assert campaign.campaign_files(["specverify/kernels/order.py", "specverify/ops.py", "specverify/kernels/order.py"],
                                   ROOT) == ["specverify/kernels/order.py", "specverify/ops.py"]
    for bad in ("specverify/kernels/nope.py", "kernels/order.py", "specverify/mutant_generator.py",
                str(ROOT / "specverify/ops.py")):
        with pytest.raises(harness.ZooError, match=f"--files: not a mutated source file: {bad}"):
            campaign.campaign_files(["specverify/ops.py", bad], ROOT)


def test_a_campaign_takes_files_or_modules_not_both(capsys):
    import argparse
    parser = argparse.ArgumentParser()
    harness.add_arguments(parser)
    args = parser.parse_args(["generate", "--files", "specverify/kernels/order.py", "--modules", "kernels", "--list"])
    assert campaign.command(args) == 2
    assert "--files and --modules: give one" in capsys.readouterr().err
    args = parser.parse_args(["generate", "--files", "specverify/kernels/rounding.py", "--per-module", "2",
                              "--seed", "9", "--list"])
    assert campaign.command(args) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    drawn = gen.sample_files(gen.sites_of(ROOT, "specverify/kernels/rounding.py"),
                             ["specverify/kernels/rounding.py"], 2, 9)
    assert listed == [s.ident for s in drawn] and len(listed) == 2
    assert "--files specverify/kernels/rounding.py" in campaign.harness_command(args)


def test_a_campaign_over_files_reports_per_file(tmp_path, monkeypatch):
    """The command's own report (no mutant run: the harness is replaced by one that kills all)."""
    import argparse
    parser = argparse.ArgumentParser()
    harness.add_arguments(parser)
    killed = lambda todo, *a, **k: {m.name: harness.Result(m.name, harness.KILLED) for m in todo}
    monkeypatch.setattr(campaign, "run_campaign", killed)
    out = tmp_path / "r.md"
    args = parser.parse_args(["generate", "--files", "specverify/kernels/rounding.py", "specverify/kernels/order.py",
                              "--per-module", "2", "--report", str(out)])
    assert campaign.command(args) == 0
    data = __import__("json").loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    assert data["by_file"] is True
    assert {f: row["killed"] for f, row in data["modules"].items()} == \
        {"specverify/kernels/order.py": 2, "specverify/kernels/rounding.py": 2}
    assert "## Score per file" in out.read_text(encoding="utf-8")


def test_slices_cover_every_module_and_name_real_tests():
    slices = campaign.load_slices(ROOT)
    assert set(slices) >= set(gen.MODULES)
    for module, tests in slices.items():
        for t in tests:
            assert (ROOT / t).exists(), f"{module}: slice names {t}, which does not exist"


def test_triage_reports_stale_and_mismatched_entries(tmp_path):
    sites = sample_sites(tmp_path)
    ok, other = sites[0], sites[1]
    data = tmp_path / campaign.EQUIVALENTS
    data.parent.mkdir(parents=True)
    entry = '[[equivalent]]\nid = "{id}"\nfile = "{file}"\ntarget = \'\'\'{t}\'\'\'\nreplacement = \'\'\'{r}\'\'\'\nreason = "{why}"\n'
    data.write_text("".join([
        entry.format(id=ok.ident, file=ok.file, t=ok.target, r=ok.replacement, why="same value"),
        entry.format(id="gen-ops-ops-l1-constant-00000000", file=ok.file, t="gone = 1", r="gone = 0", why="stale"),
        entry.format(id=ok.ident, file=other.file, t=other.target, r=other.replacement, why="wrong id"),
    ]), encoding="utf-8")
    valid, problems = campaign.load_equivalents(tmp_path)
    assert valid == {ok.ident: "same value"}
    assert len(problems) == 2
    assert "stale" in problems[0] and "does not hash" in problems[1]


def test_the_shipped_triage_file_is_current():
    valid, problems = campaign.load_equivalents(ROOT)
    assert not problems, problems


# The CI subset: generated mutants from a fixed seed whose slices are a few seconds, run by the
# harness in a copy of the tree; each must be killed.
SUBSET = {
    ("specverify/validation.py", "if value not in allowed:", "if value in allowed:"): ("tests/test_engine_fit.py",),
    ("specverify/protocol/output.py", "if r.status != \"running\":", "if r.status == 'running':"):
        ("tests/test_output_processor.py",),
}


def test_a_generated_subset_is_killed():
    sites = {(s.file, s.target.strip(), s.replacement.strip()): s for s in gen.all_sites(ROOT)}
    chosen = []
    for key, tests in SUBSET.items():
        assert key in sites, f"the subset's site {key} is no longer generated"
        s = sites[key]
        chosen.append(harness.Mutant(name=s.ident, file=s.file, target=s.target, replacement=s.replacement,
                                     why=s.operator, source="CI subset", tests=tests))
    results = campaign.run_campaign(chosen, ROOT, jobs=1, budget_s=600, timeout=300, full_fallback=False,
                                    progress=lambda line: None)
    assert [results[m.name].status for m in chosen] == [harness.KILLED] * len(chosen), \
        {m.name: (results[m.name].status, results[m.name].detail) for m in chosen}


def test_the_report_scores_each_module_apart_from_equivalents(tmp_path):
    sites = sample_sites(tmp_path)[:4]
    results = {sites[0].ident: harness.Result(sites[0].ident, harness.KILLED),
               sites[1].ident: harness.Result(sites[1].ident, harness.SURVIVED),
               sites[3].ident: harness.Result(sites[3].ident, harness.NOT_RUN, detail=campaign.BUDGET)}
    text, data = campaign.report(sites, results, {sites[2].ident: "same value either way"}, [], seed=5,
                                 per_module=4, seconds=12.0, command="cmd")
    row = data["modules"]["ops"]
    assert (row["generated"], row["killed"], row["survived"], row["equivalent"], row["not run"], row["score"]) == \
        (4, 1, 1, 1, 1, "50.0%")
    assert "same value either way" in text and sites[1].ident in text and "seed 5" in text
    assert textwrap.dedent(text).count("| ops | 4 | 1 | 1 | 1 | 1 | 50.0% |") == 1


def test_a_campaign_over_files_is_scored_per_file(tmp_path):
    sites = sample_sites(tmp_path)[:3]
    other = gen.Site("specverify/kernels/order.py", 3, "constant", "k = 1", "k = 2")
    results = {sites[0].ident: harness.Result(sites[0].ident, harness.KILLED),
               sites[1].ident: harness.Result(sites[1].ident, harness.SURVIVED),
               other.ident: harness.Result(other.ident, harness.KILLED)}
    text, data = campaign.report([*sites, other], results, {}, [], seed=5, per_module=3, seconds=1.0,
                                 command="cmd", by_file=True)
    assert set(data["modules"]) == {"specverify/ops.py", "specverify/kernels/order.py"} and data["by_file"]
    assert data["modules"]["specverify/ops.py"]["score"] == "50.0%"
    assert "| file | generated |" in text and "3 sites drawn per file" in text and "## Score per file" in text
    assert text.index("| specverify/kernels/order.py | 1 |") < text.index("| specverify/ops.py | 3 |")
    part = tmp_path / "part.json"
    part.write_text(__import__("json").dumps({**data, "machine": "m"}), encoding="utf-8")
    assert campaign.merge([part])[2]["by_file"] is True


def test_a_run_that_dies_is_a_kill_whenever_it_died():
    """pytest killed by a signal or ending in an internal error, before its import guard reported
    or after: killed (the unmutated slice passes). An import leak, an exit 0 and an empty slice stay
    refused."""
    def refused(detail):
        return campaign.crash_as_kill(harness.Result("m", harness.REFUSED, detail=detail))
    for detail, code in (("the import guard wrote no report (pytest exit -11): Fatal Python error", -11),
                         ("pytest exit -6 (usage or internal error): File \"x\", line 286 in _console_main", -6),
                         ("pytest exit 3 (usage or internal error): INTERNALERROR", 3)):
        res = refused(detail)
        assert (res.status, res.test) == (harness.KILLED, f"(pytest exit {code}: the run crashed)"), detail
    for detail in ("the import guard wrote no report (pytest exit 0): ", "the import guard wrote no report "
                   "(pytest exit 5): ", "imports resolved outside the copy: /x (pytest exit -6 (usage or internal "
                   "error))", "the slice collected no tests (check its tests and keyword)"):
        assert refused(detail).status == harness.REFUSED, detail
    survived = harness.Result("m", harness.SURVIVED, detail="pytest exit -6 (usage or internal error): x")
    assert campaign.crash_as_kill(survived) is survived


def test_an_edit_compiles_with_the_top_level_statements_it_touches():
    """The compile check of a site compiles the top-level statements the edit's lines touch, whole:
    an edit that empties a function's body or puts a `return` at module level is no site, an edit
    that keeps the statement valid is one."""
    text = "import os\n\n\n@staticmethod\ndef f(a):\n    return a\n\n\nX = f(1)\n"
    lines = text.splitlines(keepends=True)
    units = gen._top_level_spans(ast.parse(text))
    assert units == [(0, 0), (3, 5), (8, 8)]
    assert gen._compiles("m.py", lines, units, 5, 5, "    return a\n", "    return a + 1\n")
    assert not gen._compiles("m.py", lines, units, 5, 5, "    return a\n", "")          # def f(a): with no body
    assert not gen._compiles("m.py", lines, units, 5, 5, "    return a\n", "    return a +\n")
    assert not gen._compiles("m.py", lines, units, 8, 8, "X = f(1)\n", "return f(1)\n")  # return outside a function
    assert gen._compiles("m.py", lines, units, 8, 8, "X = f(1)\n", "X = f(2)\n")


def test_an_edit_across_top_level_statements_compiles_with_all_it_touches():
    """A target widened across statements (one's last line, the blank lines between, the next
    one's decorator) is compiled with every statement it touches, whole, and the lines between;
    a target that is only the head of a block is compiled with the rest of its statement."""
    text = "def f(a):\n    return a\n\n\n@staticmethod\ndef g(b):\n    if b:\n        return b\n    return 0\n"
    lines = text.splitlines(keepends=True)
    units = gen._top_level_spans(ast.parse(text))
    assert units == [(0, 1), (4, 8)]
    across = "".join(lines[1:5])                         # f's last line .. g's decorator
    assert gen._compiles("m.py", lines, units, 1, 4, across, across.replace("return a", "return a + 1"))
    assert not gen._compiles("m.py", lines, units, 1, 4, across, across.replace("return a", "return a +"))
    assert gen._compiles("m.py", lines, units, 6, 6, lines[6], "    if not b:\n")     # `if b:` alone
    above = "".join(lines[2:9])                          # from the blank lines above g's decorator
    assert not gen._compiles("m.py", lines, units, 2, 8, above, above.replace("return 0", "return 0 +"))


def test_a_widened_site_is_compiled_whole():
    """A repeated statement widened upward into the blank line above its function: the compile
    check of `_site` covers the whole widened target, so a broken edit there is no site."""
    text = "def f(a):\n    return a\n\n\ndef f(a):\n    return a\n"
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    units = gen._top_level_spans(tree)
    node = tree.body[1].body[0]                          # the second `return a`
    site = gen._site("m.py", text, lines, units, node, "return-constant", "return None")
    assert (site.target, site.replacement) == ("\ndef f(a):\n    return a", "\ndef f(a):\n    return None")
    assert gen._site("m.py", text, lines, units, node, "return-constant", "return a +") is None
