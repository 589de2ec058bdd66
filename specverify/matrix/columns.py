"""The columns of a matrix document: their keys and order, a matrix.json read back and checked,
and the merge of several machines' reports into one."""

from __future__ import annotations

import datetime as _dt
import json
from collections import Counter
from pathlib import Path

from specverify.matrix.errors import OUTCOMES, PROFILE_ORDER, SCHEMA, MatrixError
from specverify.matrix.junit import has_failures
from specverify.matrix.report import render_text, write_reports


def assign_columns(columns: list[dict]) -> None:
    """Column keys (the profile, with [capability] when the run forced a CPU capability;
    base@label where two columns share a base; #2, #3 after a still-equal key), then order them:
    cuda | cuda-emulated | rocm | rocm-emulated | cpu, a profile's capabilities side by side."""
    def base(c):
        return c["profile"] + (f"[{c['cpu_capability']}]" if c.get("capability") else "")

    per_base = Counter(base(c) for c in columns)
    used = Counter()
    for c in columns:
        key = base(c) if per_base[base(c)] == 1 else f"{base(c)}@{c['label']}"
        used[key] += 1
        c["column"] = key if used[key] == 1 else f"{key}#{used[key]}"
    columns.sort(key=lambda c: (PROFILE_ORDER.index(c["profile"]) if c["profile"] in PROFILE_ORDER
                                else len(PROFILE_ORDER), c["label"], c.get("capability", ""), c["column"]))


COLUMN_KEYS = {"profile": str, "label": str, "status": str, "counts": dict, "records": list}
RECORD_KEYS = ("id", "outcome", "feature", "dtype")


def load_report(path: Path) -> dict:
    """A matrix.json, checked: MatrixError naming the file for anything unusable."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise MatrixError(f"{path}: cannot be read ({e.strerror or e})") from None
    except ValueError as e:
        raise MatrixError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(doc, dict) or "schema" not in doc:
        raise MatrixError(f"{path}: not a specverify matrix report (no 'schema' key)")
    if doc["schema"] != SCHEMA:
        raise MatrixError(f"{path}: schema {doc['schema']!r} is not {SCHEMA!r}")
    columns = doc.get("columns")
    if not isinstance(columns, list) or not columns:
        raise MatrixError(f"{path}: 'columns' must be a non-empty list")
    for i, c in enumerate(columns):
        where = f"{path}: columns[{i}]"
        if not isinstance(c, dict):
            raise MatrixError(f"{where} is not an object")
        for key, kind in COLUMN_KEYS.items():
            if not isinstance(c.get(key), kind):
                raise MatrixError(f"{where}: {key!r} missing or not a {kind.__name__}")
        bad_counts = [o for o in OUTCOMES if not isinstance(c["counts"].get(o), int)]
        if bad_counts:
            raise MatrixError(f"{where}: counts lack an int for {bad_counts}")
        for j, r in enumerate(c["records"]):
            if not isinstance(r, dict) or any(not isinstance(r.get(k), str) for k in RECORD_KEYS):
                raise MatrixError(f"{where}: records[{j}] lacks one of {RECORD_KEYS}")
            if r["outcome"] not in OUTCOMES:
                raise MatrixError(f"{where}: records[{j}] has outcome {r['outcome']!r}, not one of {OUTCOMES}")
    return doc


def merge(files: list[Path], out: Path, say=None) -> int:
    say = say or (lambda line: print(line, flush=True))
    docs = [load_report(f) for f in files]
    columns = []
    for f, d in zip(files, docs):
        for c in d["columns"]:
            columns.append({**c, "source": str(f)})
    assign_columns(columns)
    doc = {"schema": SCHEMA, "label": " + ".join(dict.fromkeys(d.get("label", "?") for d in docs)),
           "created": _now(), "sources": [str(f) for f in files],
           "filters": {str(f): d.get("filters") for f, d in zip(files, docs)}, "columns": columns}
    paths = write_reports(doc, out)
    failed = [c["column"] for c in columns if has_failures(c)]
    say(render_text(doc))
    say(f"merged {len(files)} report(s), {len(columns)} column(s): {', '.join(c['column'] for c in columns)}")
    say(f"wrote {', '.join(str(p) for p in paths)}")
    return 1 if failed else 0

def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
