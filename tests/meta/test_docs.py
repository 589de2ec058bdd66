"""The docs stand alone: README.md and docs/*.md cite no file outside the repository, and every
relative link they make points at a file that exists in it. docs/mutants.md's kill table lists
every mutant of the zoo, once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Files that exist only next to the repository (the design notes, the shared seed folder) or on
# one machine: a reader of the repository cannot follow them.
OUTSIDE = [
    (re.compile(r"\bDESIGN\.md\b"), "DESIGN.md lives outside the repository"),
    (re.compile(r"\bshared/seeds\b"), "the shared seed folder is outside the repository"),
    (re.compile(r"/work/"), "an absolute path of one machine"),
    (re.compile(r"(?<![\w/])/(?:home|tmp|Users)/"), "an absolute path of one machine"),
]
# A relative path that climbs (../): fine from docs/ into the repository (../tests/...), not out of it.
CLIMB = re.compile(r"(?<![\w.])((?:\.\./)+[^\s)`'\"\]]*)")
CLIMB_WHY = "a path that climbs out of the repository (../)"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def outside_citations(line: str, folder: Path) -> list[str]:
    """Why `line` of a document in `folder` cites something outside the repository (none: [])."""
    found = [why for pattern, why in OUTSIDE if pattern.search(line)]
    for target in CLIMB.findall(line):
        path = (folder / target).resolve()
        if path != ROOT and ROOT not in path.parents:
            found.append(CLIMB_WHY)
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_cites_nothing_outside_the_repo(doc):
    text = doc.read_text(encoding="utf-8")
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for why in outside_citations(line, doc.parent):
            found.append(f"{doc.relative_to(ROOT)}:{number}: {why}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repo(doc):
    missing = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path = (doc.parent / target).resolve()
        if ROOT not in path.parents and path != ROOT or not path.exists():
            missing.append(target)
    assert not missing, f"{doc.relative_to(ROOT)} links to {missing}"


def test_the_checks_can_fail(tmp_path):
    """The patterns catch what they are for (so the tests above can fail)."""
    bad = "see DESIGN.md invariant 6 and ../shared/seeds/003 or /work/main/x"
    assert len(set(outside_citations(bad, ROOT))) == 4
    assert outside_citations("[zoo](../../tests/mutants/README.md)", ROOT / "docs") == [CLIMB_WHY]
    for fine in ("tests/mutants/README.md and docs/protocol.md", "[zoo](../tests/mutants/README.md)"):
        assert not outside_citations(fine, ROOT / "docs")
    assert kill_table_problems(["a", "b"], "| `a` | yes | t | 1.0 | w |\n| `c` | **no** | t | 1.0 | w |\n") == [
        "no row for b", "a row for c, which the zoo does not hold", "c: killed is '**no**'"]


# docs/mutants.md: the kill table, one row per mutant of tests/mutants/*.toml.
MUTANTS_DOC = ROOT / "docs" / "mutants.md"
ROW = re.compile(r"^\| `([a-z0-9-]+)` \| ([^|]*) \|", re.M)


def kill_table_problems(zoo: list[str], text: str) -> list[str]:
    rows = ROW.findall(text)
    named = [name for name, _ in rows]
    problems = [f"no row for {name}" for name in zoo if name not in named]
    problems += [f"a row for {name}, which the zoo does not hold" for name in named if name not in zoo]
    problems += [f"{name}: {named.count(name)} rows" for name in sorted(set(named)) if named.count(name) > 1]
    problems += [f"{name}: killed is {killed.strip()!r}" for name, killed in rows
                 if killed.strip() != "yes" and not killed.strip().startswith("not run here; killed on")]
    return problems


def test_the_kill_table_lists_every_mutant():
    """Every mutant of the zoo has one row in docs/mutants.md's kill table, killed (or killed on the
    device it needs), and no row names a mutant the zoo lost. A new mutant's row comes from
    `python -m specverify mutants --only NAME --markdown FILE`."""
    from specverify import mutants

    zoo = [m.name for m in mutants.load_zoo(ROOT / "tests" / "mutants", ROOT)]
    problems = kill_table_problems(zoo, MUTANTS_DOC.read_text(encoding="utf-8"))
    rowless = [p.removeprefix("no row for ") for p in problems if p.startswith("no row for ")]
    hint = f"\nrows for the new ones: python -m specverify mutants --only {' '.join(rowless)} --markdown FILE" if rowless else ""
    assert not problems, "docs/mutants.md's kill table:\n" + "\n".join(problems) + hint
