"""JUnit XML -> one record per test (outcome, feature, dtype, algorithm, message), and the
outcome counts of a column."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from specverify.matrix.errors import NO_DTYPE, OUTCOMES, MatrixError

MESSAGE_CHARS = 2000          # a record's message is cut to this many characters
DETAIL_CHARS = 4000           # and a failure's traceback tail to this many


def _nodeid_from(testcase: ET.Element) -> str:
    classname, name = testcase.get("classname", ""), testcase.get("name", "")
    if not classname:
        return name
    return f"{classname.replace('.', '/')}.py::{name}"


def _cut(text: str | None, limit: int, tail: bool = False) -> str:
    text = text or ""
    if len(text) <= limit:
        return text
    return ("..." + text[-limit:]) if tail else (text[:limit] + "...")


def parse_junit(path: Path) -> list[dict]:
    """One record per testcase: id, outcome (passed / failed / error / skipped / xfailed /
    xpassed), feature, dtype, algorithm, message (and detail for failures), expectation."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as e:
        raise MatrixError(f"{path}: not a readable JUnit XML file ({e})") from None
    records = []
    for case in root.iter("testcase"):
        props = {}
        for prop in case.findall("./properties/property"):
            props.setdefault(prop.get("name"), prop.get("value"))
        children = {child.tag: child for child in case}
        message, detail = None, None
        if "failure" in children:
            outcome, node = "failed", children["failure"]
        elif "error" in children:
            outcome, node = "error", children["error"]
        elif "skipped" in children:
            node = children["skipped"]
            outcome = "xfailed" if node.get("type") == "pytest.xfail" else "skipped"
        else:
            outcome, node = ("xpassed" if props.get("outcome") == "xpassed" else "passed"), None
        if node is not None:
            message = _cut(node.get("message"), MESSAGE_CHARS)
            if outcome in ("failed", "error"):
                detail = _cut(node.text, DETAIL_CHARS, tail=True)
        nodeid = props.get("nodeid") or _nodeid_from(case)
        record = {"id": nodeid, "outcome": outcome,
                  "feature": props.get("feature") or Path(nodeid.split("::")[0]).stem or "-",
                  "dtype": props.get("dtype") or NO_DTYPE, "algorithm": props.get("algorithm") or "-"}
        if message is not None:
            record["message"] = message
        if detail:
            record["detail"] = detail
        if props.get("expectation"):
            record["expectation"] = props["expectation"]
        records.append(record)
    return records


def count(records: list[dict]) -> dict[str, int]:
    c = Counter(r["outcome"] for r in records)
    return {o: c.get(o, 0) for o in OUTCOMES}


def has_failures(column: dict) -> bool:
    counts = column["counts"]
    return bool(counts.get("failed", 0) or counts.get("error", 0) or column.get("status") == "broken")
