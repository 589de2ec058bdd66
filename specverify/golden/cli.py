"""The command line of `python -m specverify golden`: its arguments, and the command that
dispatches to regen / check / list."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from specverify.golden.catalogue import DEFAULT_CATALOGUE, BaselineSet, GoldenCase, load_catalogue
from specverify.golden.checking import check
from specverify.golden.errors import GOLDEN_DIR, OPTIMIZED, REFERENCE
from specverify.golden.regenerate import regen
from specverify.golden.selection import _baseline_sets, _golden_cases, find_missing, find_unused, matches


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="golden_command", required=True)
    for name, help_text in (("regen", "make the goldens with the reference (and this profile's accept baselines)"),
                            ("check", "hold the reference and the optimized decoder against the goldens"),
                            ("list", "list the catalogue and what is on disk")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--root", default=None, metavar="DIR", help=f"golden directory (default {GOLDEN_DIR})")
        p.add_argument("--catalogue", default=DEFAULT_CATALOGUE, metavar="MODULE:ATTR",
                       help=f"the catalogue (default {DEFAULT_CATALOGUE})")
        p.add_argument("--filter", nargs="+", action="extend", default=[], metavar="PAT",
                       help="only goldens whose name contains PAT (or matches it, a glob with * ? [)")
        p.add_argument("--platform", default=None, help="platform profile (default SPECVERIFY_PLATFORM or native)")
        if name == "regen":
            p.add_argument("--prune", action="store_true", help="remove goldens no catalogue record uses")
            p.add_argument("--force", action="store_true",
                           help="rewrite goldens whose content is unchanged but made with other versions")
        if name == "check":
            p.add_argument("--side", choices=("both", REFERENCE, OPTIMIZED), default="both")


def _interpreter_problem(command_name: str) -> str | None:
    """`check` runs Triton kernels on CPU tensors, and `regen` must run in the environment the
    suite runs in (so that the caller's TRITON_INTERPRET cannot change a golden): without a GPU
    both need TRITON_INTERPRET=1 set before triton is imported (the suite's conftest sets it; the
    command line cannot, since `specverify` imports triton). Started as `python -m ...`, the
    command re-executes itself with it set; otherwise it says what to run."""
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    argv = list(getattr(sys, "orig_argv", []) or [])
    if argv[1:3] in (["-m", "specverify"], ["-m", "specverify.golden"]):
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, *argv[1:]], {**os.environ, "TRITON_INTERPRET": "1"})
    return (f"golden {command_name} on a machine without a GPU needs the Triton interpreter: run it as "
            f"TRITON_INTERPRET=1 python -m specverify golden {command_name}")


def command(args) -> int:
    from specverify.platform import get_profile
    # One intra-op thread: the tiny models gain nothing from more, a CPU shared with other jobs
    # makes OpenMP threads spin (measured: 150 s instead of 10 s for one check), and a fixed
    # thread count keeps float reductions in one order whatever the machine's core count.
    torch.set_num_threads(1)
    # check / list read an existing directory; regen may create one, but not over a file.
    root = Path(args.root) if args.root else GOLDEN_DIR
    if not root.is_dir() and (root.exists() or args.golden_command != "regen"):
        print(f"error: --root {args.root!r}: not a directory", file=sys.stderr)
        return 2
    if args.golden_command in ("check", "regen"):
        problem = _interpreter_problem(args.golden_command)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    try:
        profile = get_profile(args.platform)
        catalogue = load_catalogue(args.catalogue)
    except (TypeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    patterns = list(args.filter or [])
    names = [c.name for c in _golden_cases(catalogue)]
    names += [b.file_name(profile.name) + (f"/{s.name}" if args.golden_command == "check" else "")
              for b in _baseline_sets(catalogue) for s in b.scenarios]
    dead = [p for p in patterns if not any(matches(n, [p]) for n in names)]
    if dead:
        print(f"error: --filter {dead[0]!r} matches no golden of the catalogue (see `python -m specverify golden "
              f"list`)", file=sys.stderr)
        return 2
    if args.golden_command == "regen":
        regen(catalogue, root, patterns=patterns, prune=args.prune, profile=profile, force=args.force)
        return 0
    if args.golden_command == "check":
        return check(catalogue, root, patterns=patterns, profile=profile, sides=args.side)
    for c in catalogue:
        if not matches(c.name, patterns) and not isinstance(c, BaselineSet):
            continue
        if isinstance(c, GoldenCase):
            here = "on disk" if c.name not in find_missing([c], root) else "MISSING"
            print(f"{c.name}  [{here}]  optimized on: "
                  f"{', '.join(p for p in _profile_names() if c.optimized and c.applies(get_profile(p))) or '-'}")
        else:
            have = [p for p in _profile_names(all_known=True) if (root / f"{c.file_name(p)}.json").exists()]
            print(f"{c.name}/<profile>  {len(c.scenarios)} scenarios, tolerance {c.tolerance:g}; recorded for: "
                  f"{', '.join(have) or 'none'}")
    for n in find_unused(catalogue, root):
        print(f"unused: {n}")
    return 0


def _profile_names(all_known: bool = False) -> list[str]:
    from specverify.platform import ALL_PROFILE_NAMES, available_profiles
    return list(ALL_PROFILE_NAMES) if all_known else list(available_profiles())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specverify golden")
    add_arguments(parser)
    return command(parser.parse_args(argv))
