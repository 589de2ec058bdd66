"""`python -m specverify mutants generate`: a mutation-testing campaign over generated mutants
(issue 24). It draws `--per-module` sites per module (or per file of `--files`: a change's own
files) from `mutant_generator` with `--seed`, drops
the ones triaged as equivalent, runs each through the zoo harness on its module's slice (data:
`tests/mutants/generated/slices.toml`), re-runs a slice survivor on the whole suite (`-n 2`) while
the `--budget` lasts, and writes the report: score per module (killed / generated, equivalents
apart), the survivors with their triage, the seed, the run time and the machine.

Triage is data, reviewed like code: `tests/mutants/generated/equivalents.toml` holds one
`[[equivalent]]` table per mutant shown equivalent (id, file, target, replacement, reason). An
entry whose target no longer occurs once in its file, or whose id no longer matches its edit, is
stale and reported; a survivor is never dropped silently: it is either killed by a test or listed
there with its reason.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from specverify import mutant_generator as gen
from specverify import mutants as harness

DATA_DIR = Path("tests") / "mutants" / "generated"
SLICES = DATA_DIR / "slices.toml"
EQUIVALENTS = DATA_DIR / "equivalents.toml"
FULL_SUITE = ("tests", "-n", "2")
BUDGET = "budget"          # a mutant the budget left unstarted


# the harness's two details of a pytest that died: before its import guard reported, or after it
# (an exit pytest never gives, as a signal while the interpreter tears down)
_CRASH = re.compile(r"the import guard wrote no report \(pytest exit (-?\d+)\)|pytest exit (-?\d+) \(usage or internal error\)")


def crash_as_kill(res: harness.Result) -> harness.Result:
    """A mutant that makes pytest itself die (a signal from a kernel, an internal or usage error:
    any exit but 0 and 5) is detected by the suite: killed, though the harness refuses it because
    its import guard could not report, or reported and then pytest died (an out-of-bounds store of
    an interpreted kernel that corrupts the heap aborts at teardown). The unmutated slice passes
    (the baseline of the campaign's slices), so the crash is the mutant's."""
    m = _CRASH.match(res.detail or "")
    code = int(m.group(1) or m.group(2)) if m else 0
    if res.status == harness.REFUSED and code not in (0, 5):
        return harness.Result(res.name, harness.KILLED, test=f"(pytest exit {code}: the run crashed)",
                              seconds=res.seconds, detail=res.detail)
    return res


def load_slices(root: Path) -> dict[str, tuple[str, ...]]:
    """module -> the test paths its mutants run (every module of the generator needs one)."""
    data = tomllib.loads((root / SLICES).read_text(encoding="utf-8"))
    slices = {m: tuple(t) for m, t in data.get("slices", {}).items()}
    missing = [m for m in gen.MODULES if m not in slices]
    if missing:
        raise harness.ZooError(f"{SLICES}: no slice for module(s) {', '.join(missing)}")
    return slices


def load_equivalents(root: Path) -> tuple[dict[str, str], list[str]]:
    """(id -> reason of every valid entry, the problems: stale or malformed entries)."""
    path = root / EQUIVALENTS
    if not path.exists():
        return {}, []
    entries = tomllib.loads(path.read_text(encoding="utf-8")).get("equivalent", [])
    valid, problems = {}, []
    for i, e in enumerate(entries, 1):
        keys = {"id", "file", "target", "replacement", "reason"}
        if not isinstance(e, dict) or set(e) != keys or not all(isinstance(e[k], str) and e[k] for k in keys):
            problems.append(f"{EQUIVALENTS} entry #{i}: needs exactly the string fields {sorted(keys)}")
            continue
        file = root / e["file"]
        text = file.read_text(encoding="utf-8") if file.exists() else ""
        site_id = gen.Site(e["file"], 0, "", e["target"], e["replacement"]).ident
        if text.count(e["target"]) != 1:
            problems.append(f"{EQUIVALENTS} entry {e['id']}: stale, its target is no longer once in {e['file']}")
        elif not e["id"].endswith(site_id.rsplit("-", 1)[1]):
            problems.append(f"{EQUIVALENTS} entry {e['id']}: its id does not hash its file, target and replacement")
        else:
            valid[e["id"]] = e["reason"]
    return valid, problems


def campaign_files(files: list[str], root: Path) -> list[str]:
    """--files, checked: each must be a source file the generator mutates (relative to root,
    as `specverify/kernels/tree.py`); returned in their order, without repeats."""
    known = set(gen.source_files(root))
    unknown = [f for f in files if f not in known]
    if unknown:
        raise harness.ZooError(f"--files: not a mutated source file: {', '.join(unknown)} (give paths relative to "
                               f"the repository root, as specverify/kernels/tree.py, under the modules "
                               f"{', '.join(gen.MODULES)})")
    return list(dict.fromkeys(files))


def as_mutant(site: gen.Site, slices: dict[str, tuple[str, ...]], seed: int) -> harness.Mutant:
    return harness.Mutant(name=site.ident, file=site.file, target=site.target, replacement=site.replacement,
                          why=f"{site.operator} at line {site.line}", source=f"generated, seed {seed}",
                          tests=slices[site.module], origin=f"generated (seed {seed})")


def run_campaign(mutants: list[harness.Mutant], root: Path, *, jobs: int, budget_s: float, timeout: float,
                 full_fallback: bool, progress=print) -> dict[str, harness.Result]:
    """Each mutant on its slice, then each slice survivor on the whole suite; nothing starts once
    the budget is spent (those are reported `not run`)."""
    deadline = time.monotonic() + budget_s
    done: dict[str, harness.Result] = {}
    lock = threading.Lock()
    with harness.Workspace(root, jobs) as ws:
        harness.check_imports(ws.copies[0], ws.guard_dir)

        def one(m: harness.Mutant, stage: str) -> None:
            if time.monotonic() > deadline:
                res = harness.Result(m.name, harness.NOT_RUN, detail=BUDGET)
            else:
                res = crash_as_kill(harness.run_mutant(m, ws, timeout))
            with lock:
                done[m.name] = res
                progress(f"[{stage} {len(done)}/{len(mutants)}] {m.name}: {harness._verdict(res)} ({res.seconds:.1f} s)")

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for f in [pool.submit(one, m, "slice") for m in mutants]:
                f.result()
        if full_fallback:
            survivors = [m for m in mutants if done[m.name].status == harness.SURVIVED]
            for m in survivors:
                whole = harness.Mutant(**{**m.__dict__, "tests": FULL_SUITE, "keyword": None})
                del done[m.name]
                one(whole, "suite")
                if done[m.name].status == harness.NOT_RUN:       # the budget ran out: keep the slice verdict
                    done[m.name] = harness.Result(m.name, harness.SURVIVED, detail="slice only (budget)")
    return done


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def report(sites: list[gen.Site], results: dict[str, harness.Result], equivalents: dict[str, str],
           triage_problems: list[str], *, seed: int, per_module: int, seconds: float, command: str,
           machine_name: str | None = None, by_file: bool = False) -> tuple[str, dict]:
    """The markdown report and its json twin (machine_name: where the mutants ran, default this one;
    by_file: the sites were drawn per file (--files), so they are scored per file)."""
    where = machine_name or machine()
    unit = "file" if by_file else "module"
    rows, per = [], {}
    for s in sites:
        r = results.get(s.ident)
        status = "equivalent" if s.ident in equivalents else (r.status if r else harness.NOT_RUN)
        per.setdefault(s.file if by_file else s.module, []).append((s, status, r))
    table = [f"| {unit} | generated | equivalent | killed | survived | not run | score |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    summary = {}
    for module in sorted(per) if by_file else [m for m in gen.MODULES if m in per]:
        got = per[module]
        count = {k: sum(1 for _, st, _ in got if st == k)
                 for k in ("equivalent", harness.KILLED, harness.SURVIVED, harness.NOT_RUN, harness.REFUSED)}
        judged = count[harness.KILLED] + count[harness.SURVIVED]
        score = f"{100 * count[harness.KILLED] / judged:.1f}%" if judged else "-"
        summary[module] = {**count, "generated": len(got), "score": score}
        table.append(f"| {module} | {len(got)} | {count['equivalent']} | {count[harness.KILLED]} | "
                     f"{count[harness.SURVIVED]} | {count[harness.NOT_RUN] + count[harness.REFUSED]} | {score} |")
    for s, status, r in sorted((x for got in per.values() for x in got), key=lambda x: x[0].ident):
        if status in (harness.SURVIVED, "equivalent", harness.REFUSED):
            why = equivalents.get(s.ident, r.detail if r else "")
            rows.append(f"| `{s.ident}` | {status} | `{s.file}:{s.line}` | {_cell(s.target)} | {_cell(s.replacement)} | {why} |")
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# Mutation score: generated mutants, seed {seed}", "",
             f"- Command: `{command}`", f"- Date: {now}", f"- Machine: {where}",
             f"- Seed {seed}, {per_module} sites drawn per {unit} (all of a smaller one), {len(sites)} in all",
             f"- Run time: {seconds:.0f} s", "", f"## Score per {unit}", "",
             "Score = killed / (killed + survived); equivalents (triaged in "
             f"`{EQUIVALENTS.as_posix()}`) and mutants the budget left unrun are apart.", "", *table, "",
             "## Survivors, equivalents and refusals", ""]
    if rows:
        lines += ["| id | status | where | target | replacement | triage / detail |", "|---|---|---|---|---|---|", *rows]
    else:
        lines.append("None.")
    if triage_problems:
        lines += ["", "## Stale or malformed triage entries", "", *[f"- {p}" for p in triage_problems]]
    data = {"seed": seed, "per_module": per_module, "by_file": by_file, "seconds": round(seconds), "machine": where,
            "modules": summary,
            "mutants": [part_record(s, st, r) for got in per.values() for s, st, r in got]}
    return "\n".join(lines) + "\n", data


def part_record(site: gen.Site, status: str, result: harness.Result | None, detail: str | None = None) -> dict:
    """One mutant of a part's json (what `merge` reads back): the site, its status and its run."""
    return {"id": site.ident, "file": site.file, "line": site.line, "operator": site.operator,
            "target": site.target, "replacement": site.replacement, "status": status,
            "test": result.test if result else None,
            "detail": detail if detail is not None else (result.detail if result else ""),
            "seconds": round(result.seconds, 1) if result else 0.0}


def merge(paths: list[Path]) -> tuple[list[gen.Site], dict[str, harness.Result], dict]:
    """The sites and results of several parts' json reports (one campaign run in parts, then re-runs
    of survivors on the slices written for them), in order: a later run replaces an earlier
    survival or a budget's `not run`, and a kill on any slice stands (it witnesses a failing test)."""
    sites, results, meta = [], {}, {"seconds": 0}
    for path in paths:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        machines = meta.setdefault("machines", [])
        if data["machine"] not in machines:
            machines.append(data["machine"])
        meta.update(seed=data["seed"], per_module=data["per_module"], machine="; ".join(machines),
                    by_file=data.get("by_file", False))
        meta["seconds"] += data["seconds"]
        for m in data["mutants"]:
            site = gen.Site(m["file"], m["line"], m["operator"], m["target"], m["replacement"])
            earlier = results.get(site.ident)
            if earlier is not None and (m["status"] == harness.NOT_RUN or earlier.status == harness.KILLED):
                continue           # a part that ran it beats one that did not; a kill on any slice stands
            if earlier is None and site.ident not in {s.ident for s in sites}:
                sites.append(site)
            if m["status"] != "equivalent":
                results[site.ident] = crash_as_kill(harness.Result(site.ident, m["status"], test=m["test"] or "",
                                                                   detail=m["detail"], seconds=m["seconds"]))
    return sites, results, meta


def _cell(text: str) -> str:
    one = " ⏎ ".join(line.strip() for line in text.splitlines())
    return "`" + (one if len(one) <= 90 else one[:87] + "...").replace("|", "\\|").replace("`", "'") + "`"


def command(args) -> int:
    """Generate, run and report; exit 0 when every run mutant is killed or triaged, 1 otherwise,
    2 when the data cannot be used."""
    root = (args.root or harness.default_root()).resolve()
    if args.merge:
        return _merged(args, root)
    try:
        slices = load_slices(root)
        equivalents, problems = load_equivalents(root)
        if args.files and args.modules:
            raise harness.ZooError("--files and --modules: give one (--files draws per file, --modules per module)")
        if args.files:
            files = campaign_files(args.files, root)
            sites = gen.sample_files([s for rel in files for s in gen.sites_of(root, rel)], files, args.per_module,
                                     args.seed)
        else:
            sites = gen.sample(gen.all_sites(root), args.per_module, args.seed)
        if args.modules:
            unknown = sorted(set(args.modules) - set(gen.MODULES))
            if unknown:
                raise harness.ZooError(f"--modules: unknown {', '.join(unknown)}; known: {', '.join(gen.MODULES)}")
            sites = [s for s in sites if s.module in args.modules]
        todo = [as_mutant(s, slices, args.seed) for s in sites if s.ident not in equivalents]
        if args.list:
            for s in sites:
                print(f"{s.ident}  {s.file}:{s.line}  {'[equivalent] ' if s.ident in equivalents else ''}"
                      f"{s.target.strip()[:60]!r} -> {s.replacement.strip()[:60]!r}")
            return 0
        print(f"specverify mutants generate: seed {args.seed}, {len(sites)} sites, {len(sites) - len(todo)} "
              f"triaged equivalent, jobs {args.jobs}, budget {args.budget} min", flush=True)
        start = time.monotonic()
        results = run_campaign(todo, root, jobs=args.jobs, budget_s=args.budget * 60, timeout=args.timeout,
                               full_fallback=not args.no_full_suite, progress=lambda line: print(line, flush=True))
    except (harness.ZooError, harness.ImportLeak, OSError, tomllib.TOMLDecodeError) as e:
        print(f"specverify mutants generate: {e}", file=__import__("sys").stderr)
        return 2
    text, data = report(sites, results, equivalents, problems, seed=args.seed, per_module=args.per_module,
                        seconds=time.monotonic() - start, command=harness_command(args), by_file=bool(args.files))
    print(text)
    if args.report:
        out = Path(args.report)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    bad = [r for r in results.values() if r.status in (harness.SURVIVED, harness.REFUSED)]
    return 1 if bad or problems else 0


def rerun_part(parts: list[Path], ids: list[str], tests: tuple[str, ...], out: Path, root: Path, *, jobs: int,
               timeout: float) -> dict[str, harness.Result]:
    """Re-run the mutants `ids` of the merged `parts` on the slice `tests` (a survivor after the
    tests written for it) and write the results as one more part json, `out`."""
    sites, _, meta = merge(parts)
    chosen = [s for s in sites if s.ident in set(ids)]
    unknown = sorted(set(ids) - {s.ident for s in chosen})
    if unknown:
        raise harness.ZooError(f"--rerun: not in the parts: {', '.join(unknown)}")
    mutants = [as_mutant(s, {s.module: tests}, meta["seed"]) for s in chosen]
    start = time.monotonic()
    res = run_campaign(mutants, root, jobs=jobs, budget_s=float("inf"), timeout=timeout, full_fallback=False,
                       progress=lambda line: print(line, flush=True))
    data = {"seed": meta["seed"], "per_module": meta["per_module"], "by_file": meta["by_file"], "machine": machine(),
            "seconds": round(time.monotonic() - start),
            "mutants": [part_record(s, res[s.ident].status, res[s.ident], f"re-run on {' '.join(tests)}")
                        for s in chosen]}
    out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return res


def _merged(args, root: Path) -> int:
    """--merge PART.json ...: one report over a campaign run in parts (equivalents as triaged now);
    with --rerun ID ... --slice TEST ... --part OUT.json, first re-run those mutants into OUT."""
    if args.rerun:
        if not args.slice or not args.part:
            print("specverify mutants generate: --rerun needs --slice and --part", file=__import__("sys").stderr)
            return 2
        res = rerun_part(args.merge, args.rerun, tuple(args.slice), args.part, root, jobs=args.jobs,
                         timeout=args.timeout)
        print({k: v.status for k, v in res.items()})
        return 0
    sites, results, meta = merge(args.merge)
    equivalents, problems = load_equivalents(root)
    results = {k: v for k, v in results.items() if k not in equivalents}
    text, data = report(sites, results, equivalents, problems, seed=meta["seed"], per_module=meta["per_module"],
                        seconds=meta["seconds"], machine_name=meta["machine"], by_file=meta["by_file"],
                        command="python -m specverify mutants generate --merge " + " ".join(map(str, args.merge)))
    print(text)
    if args.report:
        Path(args.report).write_text(text, encoding="utf-8")
        Path(args.report).with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return 1 if any(r.status in (harness.SURVIVED, harness.REFUSED) for r in results.values()) or problems else 0


def harness_command(args) -> str:
    parts = ["python -m specverify mutants generate", f"--seed {args.seed}", f"--per-module {args.per_module}",
             f"--jobs {args.jobs}", f"--budget {args.budget:g}"]
    if args.modules:
        parts.append("--modules " + " ".join(args.modules))
    if args.files:
        parts.append("--files " + " ".join(args.files))
    if args.no_full_suite:
        parts.append("--no-full-suite")
    if args.report:
        parts.append(f"--report {args.report}")
    return " ".join(parts)
