"""The conformance report: engine x op x dtype -> conforms / differs (named) / fails, as md and json.

Every conformance test records its verdict in its `user_properties` (specverify.conformance.suite,
laws); the collector gathers them on the xdist controller (or a plain run), adds a `skipped` row
for each test skipped without one (an op the engine lacks, an engine not installed), and writes
PATH.json (every field) and PATH.md (the tables, then each named difference and failure with its
smallest counterexample and the command that replays it).
"""

from __future__ import annotations

import json
import os
import platform as host
from pathlib import Path

VERDICTS = ("conforms", "differs", "fails", "unsupported", "law", "skipped")


class ReportCollector:
    def __init__(self, config, path: str):
        self.config = config
        self.path = Path(path)
        self.rows: list[dict] = []

    def pytest_runtest_logreport(self, report):
        from specverify.conformance.suite import RECORD_KEY
        records = [v for k, v in getattr(report, "user_properties", ()) if k == RECORD_KEY]
        if report.when == "call" or (report.when == "setup" and report.skipped):
            for record in records:
                self.rows.append({**record, "nodeid": report.nodeid})
            if not records and report.failed and ("test_differential" in report.nodeid or "test_law" in report.nodeid):
                lines = str(report.longrepr).strip().splitlines()
                self.rows.append({"nodeid": report.nodeid, "verdict": "fails", "test": "crashed",
                                  "error": lines[-1] if lines else "(no message)"})
            if not records and report.skipped and ("test_differential" in report.nodeid or "test_law" in report.nodeid):
                reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
                self.rows.append({"nodeid": report.nodeid, "verdict": "skipped",
                                  "reason": reason.removeprefix("Skipped: ")})

    def pytest_sessionfinish(self, session):
        from specverify.conformance.plugin import implementation_under_test
        impl = implementation_under_test()
        meta = environment_meta(impl, self.config)
        write(self.path, meta, sorted(self.rows, key=lambda r: r["nodeid"]))


def environment_meta(impl, config) -> dict:
    from specverify import environment
    from specverify.conformance.suite import impl_name
    import torch
    versions = dict(environment.versions())
    if impl is not None and callable(getattr(impl, "versions", None)):
        try:
            versions.update({str(k): str(v) for k, v in impl.versions().items()})
        except Exception as err:           # a report must still be written; say why versions are missing
            versions["adapter versions()"] = f"failed: {err}"
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({host.processor() or host.machine()})"
    return {"engine": impl_name(impl), "impl": os.environ.get("SPECVERIFY_IMPL", "specverify"),
            "device": device, "cuda": torch.version.cuda, "versions": versions,
            "triton_interpret": os.environ.get("TRITON_INTERPRET", ""),
            "command": "pytest " + " ".join(config.invocation_params.args)}


def write(path: Path, meta: dict, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{path}.json").write_text(json.dumps({"meta": meta, "results": rows}, indent=1, default=str) + "\n",
                                    encoding="utf-8")
    Path(f"{path}.md").write_text(markdown(meta, rows), encoding="utf-8")


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(meta: dict, rows: list[dict]) -> str:
    counts = {v: sum(1 for r in rows if r.get("verdict") == v) for v in VERDICTS}
    out = [f"# Conformance report: {meta['engine']}", "",
           f"- implementation: `{meta['impl']}`", f"- device: {meta['device']} (CUDA {meta['cuda']}, "
           f"TRITON_INTERPRET={meta['triton_interpret'] or 'unset'})",
           "- versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
           f"- command: `{meta['command']}`", "",
           "Summary: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n), ""]
    diff = [r for r in rows if r.get("test") == "differential"]
    if diff:
        out += ["## Differential (token for token, floats by the tolerance table)", "",
                "| op | dtype | profile | verdict | samples | detail |", "|---|---|---|---|---|---|"]
        for r in diff:
            detail = ""
            if r["verdict"] == "differs":
                detail = "; ".join(r["differences"]) + f" (seen on {len(r['witnesses'])} samples)"
            elif r["verdict"] == "fails":
                detail = f"fails on {len(r['failing'])}: {', '.join(r['failing'][:6])}"
                if r.get("matches"):
                    detail += f"; matches {' / '.join(r['matches'])}"
            elif r["verdict"] == "law":
                detail = r.get("detail", "")
            if r.get("unsupported"):
                detail += f" ({len(r['unsupported'])} samples unsupported: {next(iter(r['unsupported'].values()))})"
            out.append(f"| {r['op']} | {r['dtype']} | {r['profile']} | **{r['verdict']}** | {r.get('samples', '')} "
                       f"| {_cell(detail)} |")
        out.append("")
    law = [r for r in rows if r.get("test") == "law"]
    if law:
        out += [f"## Law tests (Pearson chi-square at alpha {law[0]['alpha']:g})", "",
                "| op | case | randomness | N | power against (effect size w) | chi-square (df) | p | verdict |",
                "|---|---|---|---|---|---|---|---|"]
        for r in law:
            if r["verdict"] == "unsupported":
                out.append(f"| {r['op']} | {r['case']} | {r['randomness']} | {r['draws']} | | | | "
                           f"**unsupported**: {_cell(r['detail'])} |")
                continue
            alts = "; ".join(f"{k}: {v['power']:.4f} (w {v['w']:.3g})" for k, v in r["alternatives"].items())
            verdict = r["verdict"] + (f": {r['problem']}" if r.get("problem") else "")
            out.append(f"| {r['op']} | {r['case']} | {r['randomness']} | {r['draws']} | {_cell(alts)} | "
                       f"{r['statistic']} ({r['df']}) | {r['pvalue']:.3g} | **{_cell(verdict)}** |")
        out.append("")
    for title, verdict in (("Named differences", "differs"), ("Failures", "fails")):
        found = [r for r in diff if r["verdict"] == verdict]
        if not found:
            continue
        out += [f"## {title}", ""]
        for r in found:
            out += [f"### {r['op']} / {r['dtype']}", ""]
            if verdict == "differs":
                out += [f"- {d}" for d in r["differences"]]
            else:
                out.append(f"- failing samples: {', '.join(r['failing'])}")
                if r.get("matches"):
                    out.append(f"- its outputs match the reference under: {'; '.join(r['matches'])}")
            out += ["", "smallest counterexample:", "", "```", r["counterexample"], r["error"], "```", "",
                    f"replay: `{r['replay']}`", ""]
    skipped = [r for r in rows if r.get("verdict") == "skipped"]
    if skipped:
        out += ["## Skipped", "", "| test | reason |", "|---|---|"]
        out += [f"| {_cell(r['nodeid'].split('::')[-1])} | {_cell(r['reason'])} |" for r in skipped]
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# `python -m specverify conformance diff GOT.json EXPECTED.json`: has an engine's conformance moved?


def verdicts(data: dict) -> dict[str, str]:
    """test id -> verdict (with the named differences and failing samples, which are part of it)."""
    table = {}
    for row in data["results"]:
        key = row["nodeid"].split("::", 1)[-1]
        detail = row.get("differences") or row.get("failing") or ""
        table[key] = f"{row['verdict']}{': ' + ', '.join(detail) if detail else ''}"
    return table


def diff(got: dict, expected: dict) -> list[str]:
    """One line per test whose verdict differs between two reports (or that only one has)."""
    a, b = verdicts(got), verdicts(expected)
    lines = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            lines.append(f"{key}: {a.get(key, '(absent)')}  (expected {b.get(key, '(absent)')})")
    return lines


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="conformance_command", required=True)
    p = sub.add_parser("diff", help="compare the verdicts of two conformance reports (json); exit 1 if any moved")
    p.add_argument("got", type=Path)
    p.add_argument("expected", type=Path)


def command(args) -> int:
    loaded = []
    for which, path in (("got", args.got), ("expected", args.expected)):
        try:
            loaded.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as err:
            print(f"error: {which}: cannot read the report {path}: {err}")
            return 2
    lines = diff(*loaded)
    for line in lines:
        print(line)
    print(f"{len(lines)} verdicts moved" if lines else f"the same {len(verdicts(loaded[0]))} verdicts")
    return 1 if lines else 0
