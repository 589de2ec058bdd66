"""What both benchmark scripts share: the device check, the results header, markdown tables.

Benchmarks measure; they never gate correctness (the test suite does that). A script that finds
a wrong answer while timing still writes its table and then exits non-zero, so the numbers are
kept and the problem is not missed.
"""

from __future__ import annotations

import argparse

import datetime
import importlib.metadata
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent       # the repository root
DEFAULT_OUT = ROOT / "benchmarks" / "results"

# `python3 benchmarks/<script>.py` puts benchmarks/ on sys.path, not the root; make the repo's
# specverify importable without PYTHONPATH=. as well.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


def base_parser(doc: str, *, quick_help: str, smoke_help: str) -> argparse.ArgumentParser:
    """The options every benchmark has: --out, --quick, --cpu-smoke."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="directory for the results file (default benchmarks/results; "
                                  "with --cpu-smoke, nothing is written unless --out is given)")
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--cpu-smoke", action="store_true", help=smoke_help)
    return ap


def require_cuda(script: str) -> None:
    """Exit with a clear message when there is no CUDA (or ROCm) device."""
    if not torch.cuda.is_available():
        sys.exit(f"{script}: no CUDA device (torch.cuda.is_available() is False; torch "
                 f"{torch.__version__}). Run it on a GPU machine, or pass --cpu-smoke to check "
                 f"the script itself on the CPU with tiny sizes and no CUDA graphs.")


def device_and_preset(args, script: str) -> tuple[str, str]:
    """("cuda", "small") for a GPU run (exits when there is no GPU), ("cpu", "tiny") for --cpu-smoke."""
    if args.cpu_smoke:
        return "cpu", "tiny"
    require_cuda(script)
    return "cuda", "small"


def device_name(cpu_smoke: bool) -> str:
    return "cpu-smoke" if cpu_smoke else torch.cuda.get_device_name()


def slug(name: str) -> str:
    """"NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _version(*dists: str) -> str:
    for d in dists:
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            pass
    return "not installed"


def _git_commit() -> str:
    """$BENCH_COMMIT when set (for a tree copied without its .git), else HEAD of the checkout."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"] + " (from $BENCH_COMMIT)"
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=10)
        if rev.returncode != 0:
            return "unknown (no git checkout)"
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return rev.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown (git not available)"


def command_line() -> str:
    """The command that ran this script, as one could paste it again."""
    prefix = "PYTHONPATH=. " if os.environ.get("PYTHONPATH") else ""
    return prefix + "python3 " + " ".join(shlex.quote(a) for a in sys.argv)


def header(title: str, cpu_smoke: bool, settings: dict[str, object]) -> list[str]:
    """Markdown lines naming the device, versions, date, command and the run's settings."""
    if cpu_smoke:
        device = "CPU (--cpu-smoke: tiny sizes, no CUDA graphs; these numbers mean nothing)"
        accel = "no accelerator"
    else:
        props = torch.cuda.get_device_properties(0)
        device = f"{torch.cuda.get_device_name()} ({props.total_memory / 2**30:.0f} GiB)"
        accel = f"HIP {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# {title}",
        "",
        f"- Device: {device}",
        f"- torch {torch.__version__}, triton {_version('triton', 'pytorch-triton', 'pytorch-triton-rocm')}, "
        f"{accel}, Python {sys.version.split()[0]}",
        f"- Date: {now}",
        f"- Commit: {_git_commit()}",
        f"- Command: `{command_line()}`",
    ]
    lines += [f"- {k}: {v}" for k, v in settings.items()]
    return lines + [""]


def table(columns: list[str], rows: list[list[object]]) -> list[str]:
    """A markdown table; numbers are expected to be formatted already."""
    out = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def write_results(lines: list[str], out_dir: Path | None, stem: str, cpu_smoke: bool) -> None:
    """Print the report; write it to <out_dir>/<stem>-<device slug>.md when out_dir is set."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out_dir is None:
        print("(--cpu-smoke without --out: nothing written)")
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem}-{slug(device_name(cpu_smoke))}.md"
    path.write_text(text)
    print(f"wrote {path}")


def out_dir(arg: str | None, cpu_smoke: bool) -> Path | None:
    """--out, else benchmarks/results; a CPU smoke run writes only where --out says."""
    if arg is not None:
        return Path(arg)
    return None if cpu_smoke else DEFAULT_OUT


# Peak HBM bandwidth by device name (spec sheets), first match wins: the unit of "fraction of peak".
PEAKS = (("H200", 4.8, "H200"), ("H100 PCIE", 2.0, "H100 PCIe"), ("H100 NVL", 3.9, "H100 NVL"),
         ("H100", 3.35, "H100 SXM"))


def peak_bandwidth(name: str, override: float | None) -> tuple[float | None, str]:
    """(TB/s, where the figure comes from) for the device; None where unknown."""
    if override is not None:
        return override, "--peak-tbps"
    upper = name.upper()
    for key, tbps, label in PEAKS:
        if key in upper:
            return tbps, f"{label} spec sheet"
    return None, f"unknown device {name!r}: no peak figure (pass --peak-tbps)"


CAPTURES_NOTE = ("captures = CUDA-graph buckets captured before timing (the batch's bucket and every smaller one) "
                 "and their time; prefill and captures are not in any figure above.")


def closing_lines(aims: list[str], cpu_smoke: bool, errors: list[str]) -> list[str]:
    """A report's end: the aims' verdicts, the --cpu-smoke caveat, the errors of failed runs."""
    out = ["", "## Aims", ""] + aims
    if cpu_smoke:
        out += ["", "(--cpu-smoke: the verdicts above only show that the report is assembled; CPU times mean nothing.)"]
    if errors:
        out += ["", "Errors (the first line of each):", ""] + errors
    return out


def add_decode_options(ap: argparse.ArgumentParser, *, tokens: tuple[int, int, int], batches: tuple[tuple, tuple, tuple],
                       agreement: float, sync_steps: tuple[int, int]) -> None:
    """The options of the decode benchmarks (new tokens, batch sizes, steering, warm-up, seed).
    tokens / batches: the defaults (full, --quick, --cpu-smoke); sync_steps: (full, --cpu-smoke)."""
    def listed(b):
        return ",".join(map(str, b))
    ap.add_argument("--max-new-tokens", type=int,
                    help=f"new tokens per request (default {tokens[0]}; {tokens[1]} --quick; {tokens[2]} --cpu-smoke)")
    ap.add_argument("--batches", help=f"comma-separated batch sizes (default {listed(batches[0])}; "
                                      f"{listed(batches[1])} --quick; {listed(batches[2])} --cpu-smoke)")
    ap.add_argument("--agreement", type=float, default=agreement, help=f"steered draft agreement (default {agreement:g})")
    ap.add_argument("--warmup", type=int, help="untimed steps after the capture (default 2; 1 --cpu-smoke)")
    ap.add_argument("--sync-steps", type=int, help=f"steps counted under the sync debug mode (default "
                                                   f"{sync_steps[0]}; {sync_steps[1]} --cpu-smoke)")
    ap.add_argument("--seed", type=int, default=0, help="model and prompt seed")
    ap.set_defaults(_decode_defaults=(tokens, batches, sync_steps))


def resolve_decode_options(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fill in the defaults of `add_decode_options` for this run's mode and check the values."""
    (tokens, batches, sync_steps) = args._decode_defaults
    mode = 2 if args.cpu_smoke else 1 if args.quick else 0
    args.max_new_tokens = args.max_new_tokens or tokens[mode]
    args.batches = tuple(int(b) for b in args.batches.split(",")) if args.batches else batches[mode]
    args.warmup = (1 if args.cpu_smoke else 2) if args.warmup is None else args.warmup
    args.sync_steps = sync_steps[1 if args.cpu_smoke else 0] if args.sync_steps is None else args.sync_steps
    if min(args.max_new_tokens, *args.batches) < 1 or min(args.warmup, args.sync_steps) < 0:
        ap.error("sizes must be >= 1 (--warmup / --sync-steps >= 0)")
    if not 0.0 <= args.agreement <= 1.0:
        ap.error(f"--agreement must be in [0, 1], got {args.agreement}")


def comma_choices(ap: argparse.ArgumentParser, option: str, value: str, allowed) -> tuple[str, ...]:
    """A comma-separated option's names, each one of `allowed` (else an argparse error naming them)."""
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    unknown = sorted(set(names) - set(allowed))
    if not names or unknown:
        ap.error(f"{option} takes names among {', '.join(allowed)}; got {', '.join(unknown) or 'nothing'}")
    return names


def step_timing(args) -> str:
    """The "Timing" setting of the decode benchmarks (driven by `bench_device_cycle.drive`)."""
    return (f"per `step()`, CUDA events (host clock on the CPU); after the captures, {args.warmup} untimed "
            f"warm-up step(s) and {args.sync_steps} sync-counting step(s), every remaining step timed")


def graph_ms(fn, reps: int = 20) -> float:
    """ms of one call of fn, replayed from a CUDA graph of `reps` calls (launch gaps included, as
    in a captured decode step)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (5 * reps)
