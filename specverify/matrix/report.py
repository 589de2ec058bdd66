"""The feature x dtype x platform table of a matrix document, rendered for the terminal, as
markdown and as self-contained HTML, and the three report files written."""

from __future__ import annotations

import html
import json
from collections import Counter
from pathlib import Path

from specverify.matrix.errors import NO_DTYPE, MatrixError
from specverify.matrix.junit import has_failures


def table(doc: dict) -> tuple[list[str], list[tuple[str, str]], dict]:
    """(column keys, rows (feature, dtype), cells {(feature, dtype, column): counts})."""
    columns = [c["column"] for c in doc["columns"]]
    cells: dict[tuple[str, str, str], Counter] = {}
    for c in doc["columns"]:
        for r in c["records"]:
            cells.setdefault((r["feature"], r["dtype"], c["column"]), Counter())[r["outcome"]] += 1
    from specverify.dtypes import DTYPES
    rank = {d: i for i, d in enumerate(DTYPES)}       # rows: features by name, dtypes in registry order
    rows = sorted({(f, d) for f, d, _ in cells},
                  key=lambda fd: (fd[0], fd[1] == NO_DTYPE, rank.get(fd[1], len(rank)), fd[1]))
    return columns, rows, cells


def cell_numbers(counts) -> tuple[int, int, int, int]:
    """(passed incl. xpassed, failed incl. errors, skipped, xfailed)."""
    return (counts.get("passed", 0) + counts.get("xpassed", 0), counts.get("failed", 0) + counts.get("error", 0),
            counts.get("skipped", 0), counts.get("xfailed", 0))


def cell_text(counts) -> str:
    return "/".join(map(str, cell_numbers(counts))) if counts and sum(counts.values()) else ""


def cell_class(counts) -> str:
    """fail (red) > xfail (amber) > pass (green) > skip (grey); none for an empty cell."""
    p, f, s, x = cell_numbers(counts or {})
    return "fail" if f else "xfail" if x else "pass" if p else "skip" if s else "none"


def failures_by_cell(doc: dict) -> dict[tuple[str, str, str], list[dict]]:
    out: dict[tuple[str, str, str], list[dict]] = {}
    for c in doc["columns"]:
        for r in c["records"]:
            if r["outcome"] in ("failed", "error"):
                out.setdefault((r["feature"], r["dtype"], c["column"]), []).append(r)
    return out


def stale_rows(doc: dict) -> list[tuple[str, dict]]:
    return [(c["column"], s) for c in doc["columns"] for s in ((c.get("expectations") or {}).get("stale") or [])]


def _totals(doc) -> dict[str, dict]:
    return {c["column"]: c["counts"] for c in doc["columns"]}


def render_text(doc: dict) -> str:
    """The table for the terminal."""
    columns, rows, cells = table(doc)
    head = ["feature", "dtype", *columns]
    body = [[f, d, *(cell_text(cells.get((f, d, col))) for col in columns)] for f, d in rows]
    body.append(["TOTAL", "", *(cell_text(_totals(doc)[col]) for col in columns)])
    widths = [max(len(str(r[i])) for r in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip() for r in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "cells: passed/failed/skipped/xfailed\n" + "\n".join(lines)


def render_md(doc: dict) -> str:
    columns, rows, cells = table(doc)
    out = [f"# specverify platform matrix: {doc.get('label', '')}", "",
           f"Created {doc.get('created', '?')}. Cells read passed/failed/skipped/xfailed (passed counts xpassed "
           f"tests, failed counts errors); a failing cell is in bold.", "", "## Platforms", "",
           "| column | label | device | CPU capability | torch | triton | numpy | tests | seconds | status | command |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in doc["columns"]:
        n = sum(c["counts"].values())
        status = c["status"] + (f" ({c['note']})" if c.get("note") else "")
        out.append(f"| {c['column']} | {_md(c['label'])} | {_md(c.get('device', '?'))} | {_capability(c)} | "
                   f"{c.get('torch', '?')} | {c.get('triton', '?')} | {c.get('numpy', '?')} | {n} | {c.get('duration_s', '?')} | {_md(status)} | "
                   f"`{_md(c.get('command', ''))}` |")
    out += ["", "## Feature x dtype", "", "| feature | dtype | " + " | ".join(columns) + " |",
            "|---|---|" + "---|" * len(columns)]
    for f, d in rows:
        vals = []
        for col in columns:
            counts = cells.get((f, d, col))
            text = cell_text(counts)
            vals.append(f"**{text}**" if cell_class(counts) == "fail" else text)
        out.append(f"| {_md(f)} | {_md(d)} | " + " | ".join(vals) + " |")
    out.append("| **total** | | " + " | ".join(cell_text(_totals(doc)[col]) for col in columns) + " |")
    out += ["", "## Failures", ""]
    fails = failures_by_cell(doc)
    if not fails:
        out.append("None.")
    for (f, d, col), recs in sorted(fails.items(), key=lambda kv: (columns.index(kv[0][2]), kv[0][:2])):
        out.append(f"### {col}: {f} / {d}")
        out.append("")
        for r in recs:
            out.append(f"- `{_md(r['id'])}` ({r['outcome']}): {_md(_one_line(r.get('message', '')))}")
        out.append("")
    broken = [c for c in doc["columns"] if c["status"] == "broken"]
    for c in broken:
        out.append(f"- **{c['column']}: the pytest run itself failed**: {_md(c.get('note', ''))}")
    out += ["", "## Stale expectations", ""]
    out += _stale_lines(doc, md=True)
    return "\n".join(out) + "\n"


def _stale_lines(doc: dict, md: bool) -> list[str]:
    lines = []
    for c in doc["columns"]:
        e = c.get("expectations")
        if e is None:
            lines.append(f"- {c['column']}: no expectations report")
            continue
        n = len(e.get("entries", []))
        lines.append(f"- {c['column']}: {n} {'entry' if n == 1 else 'entries'} from {e.get('dir') or 'no directory'}"
                     + ("" if e.get("unmatched_checked") else
                        f"; unmatched entries not checked ({e.get('unmatched_note', '')})"))
    rows = stale_rows(doc)
    for col, s in rows:
        tests = f": {', '.join(s.get('tests', [])[:5])}" if s.get("tests") else ""
        text = f"STALE {col}: {s.get('ref')} ({s.get('kind')} `{s.get('test')}`): {s.get('detail')}{tests}"
        lines.append(f"- {_md(text) if md else text}")
    if not rows:
        lines.append("- no stale entry")
    return lines


def _capability(c: dict) -> str:
    """The CPU capability a column ran with; '(forced)' when the run set ATEN_CPU_CAPABILITY."""
    have = c.get("cpu_capability", "?")
    return f"{have} (forced)" if c.get("capability") else have


def _md(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
th,td{border:1px solid #bbb;padding:.25em .6em;text-align:left;font-size:.9em}
th{background:#eee}
td.pass{background:#c8ecc8}
td.fail{background:#f4b4b4;font-weight:bold}
td.xfail{background:#fde3a0}
td.skip{background:#ddd;color:#555}
td.none{background:#fff}
td.num{text-align:right}
pre{white-space:pre-wrap;background:#f6f6f6;padding:.4em;font-size:.8em;max-height:20em;overflow:auto}
code{font-size:.9em}
.legend span{display:inline-block;padding:.1em .6em;margin-right:.4em;border:1px solid #bbb}
"""


def render_html(doc: dict) -> str:
    e = html.escape
    columns, rows, cells = table(doc)
    fails = failures_by_cell(doc)
    anchors = {key: f"fail-{i}" for i, key in enumerate(
        sorted(fails, key=lambda k: (columns.index(k[2]), k[:2])), 1)}
    out = ["<!DOCTYPE html>", "<html><head><meta charset=\"utf-8\">",
           f"<title>specverify matrix: {e(str(doc.get('label', '')))}</title>", f"<style>{CSS}</style>",
           "</head><body>", f"<h1>specverify platform matrix: {e(str(doc.get('label', '')))}</h1>",
           f"<p>Created {e(str(doc.get('created', '?')))}. Cells read passed/failed/skipped/xfailed "
           "(passed counts xpassed tests, failed counts errors).</p>",
           "<p class=\"legend\"><span style=\"background:#c8ecc8\">all passed</span>"
           "<span style=\"background:#f4b4b4\">a failure or error (links to it)</span>"
           "<span style=\"background:#fde3a0\">expected failure</span>"
           "<span style=\"background:#ddd\">only skipped</span></p>",
           "<h2>Platforms</h2><table><tr><th>column</th><th>label</th><th>device</th><th>CPU capability</th>"
           "<th>torch</th><th>triton</th><th>numpy</th>"
           "<th>tests</th><th>seconds</th><th>status</th><th>command</th></tr>"]
    for c in doc["columns"]:
        cls = "fail" if has_failures(c) else "pass"
        note = f" ({c['note']})" if c.get("note") else ""
        out.append(f"<tr><td>{e(c['column'])}</td><td>{e(c['label'])}</td><td>{e(str(c.get('device', '?')))}</td>"
                   f"<td>{e(_capability(c))}</td><td>{e(str(c.get('torch', '?')))}</td>"
                   f"<td>{e(str(c.get('triton', '?')))}</td><td>{e(str(c.get('numpy', '?')))}</td>"
                   f"<td class=\"num\">{sum(c['counts'].values())}</td><td class=\"num\">{c.get('duration_s', '?')}</td>"
                   f"<td class=\"{cls}\">{e(c['status'] + note)}</td><td><code>{e(str(c.get('command', '')))}</code>"
                   "</td></tr>")
    out.append("</table>")
    out.append("<h2>Feature x dtype</h2><table><tr><th>feature</th><th>dtype</th>"
               + "".join(f"<th>{e(col)}</th>" for col in columns) + "</tr>")
    for f, d in rows:
        tds = []
        for col in columns:
            counts = cells.get((f, d, col))
            text = e(cell_text(counts))
            anchor = anchors.get((f, d, col))
            if anchor:
                text = f"<a href=\"#{anchor}\">{text}</a>"
            tds.append(f"<td class=\"{cell_class(counts)}\">{text}</td>")
        out.append(f"<tr><td>{e(f)}</td><td>{e(d)}</td>{''.join(tds)}</tr>")
    out.append("<tr><th>total</th><th></th>" + "".join(
        f"<th>{e(cell_text(_totals(doc)[col]))}</th>" for col in columns) + "</tr></table>")
    out.append("<h2>Failures</h2>")
    if not fails:
        out.append("<p>None.</p>")
    for key, anchor in anchors.items():
        f, d, col = key
        out.append(f"<section id=\"{anchor}\"><h3>{e(col)}: {e(f)} / {e(d)}</h3><ul>")
        for r in fails[key]:
            out.append(f"<li><code>{e(r['id'])}</code> ({e(r['outcome'])}): {e(r.get('message', ''))}"
                       + (f"<pre>{e(r['detail'])}</pre>" if r.get("detail") else "") + "</li>")
        out.append("</ul></section>")
    for c in doc["columns"]:
        if c["status"] == "broken":
            out.append(f"<p class=\"broken\"><b>{e(c['column'])}: the pytest run itself failed</b>: "
                       f"{e(c.get('note', ''))}</p>")
    out.append("<h2>Stale expectations</h2><ul>")
    out += [f"<li>{e(line[2:])}</li>" for line in _stale_lines(doc, md=False)]
    out.append("</ul></body></html>")
    return "\n".join(out) + "\n"


def write_reports(doc: dict, out: Path) -> list[Path]:
    out = Path(out)
    paths = [out / "matrix.md", out / "matrix.json", out / "matrix.html"]
    try:
        out.mkdir(parents=True, exist_ok=True)
        paths[0].write_text(render_md(doc), encoding="utf-8")
        paths[1].write_text(json.dumps(doc, indent=1), encoding="utf-8")
        paths[2].write_text(render_html(doc), encoding="utf-8")
    except OSError as e:
        raise MatrixError(f"{out}: cannot write the reports ({e})") from None
    return paths
