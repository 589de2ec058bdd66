"""The docs stand alone: README.md and docs/*.md cite no file outside the repository, and every
relative link they make points at a file that exists in it."""

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
    (re.compile(r"(?<![\w.])\.\./"), "a path that climbs out of the repository (../)"),
    (re.compile(r"\bshared/seeds\b"), "the shared seed folder is outside the repository"),
    (re.compile(r"/work/"), "an absolute path of one machine"),
    (re.compile(r"(?<![\w/])/(?:home|tmp|Users)/"), "an absolute path of one machine"),
]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_cites_nothing_outside_the_repo(doc):
    text = doc.read_text(encoding="utf-8")
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, why in OUTSIDE:
            if pattern.search(line):
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
    hits = {why for pattern, why in OUTSIDE if pattern.search(bad)}
    assert len(hits) == 4
    assert not any(p.search("tests/mutants/README.md and docs/protocol.md") for p, _ in OUTSIDE)
