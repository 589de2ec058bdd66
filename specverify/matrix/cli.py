"""The command line of `python -m specverify matrix`: its arguments, the `merge` sub-command's,
and the command that hands them to a run or a merge (exit 2 on a MatrixError)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specverify.matrix.columns import merge
from specverify.matrix.errors import MatrixError
from specverify.matrix.runner import DEFAULT_INTERVAL_S, run


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Run the suite once per platform profile and write feature x dtype x platform tables "
                     "(md, json, html). `matrix merge A.json B.json ... [-o DIR]` joins the matrix.json "
                     "of several machines.")
    p.add_argument("--profiles", nargs="+", metavar="PROFILE",
                   help="platform profiles to run (default: every profile this machine can run)")
    p.add_argument("--dtypes", nargs="+", metavar="DTYPE",
                   help="only tests of these dtypes (names of specverify.dtypes; '-' = tests without a dtype; "
                        "space- or comma-separated)")
    p.add_argument("--algorithms", nargs="+", metavar="ALGO", help="only tests of these algorithms: eagle naive_eagle target -")
    p.add_argument("--capabilities", nargs="+", metavar="CAP",
                   help="CPU instruction sets to run each profile under (ATEN_CPU_CAPABILITY values: native default "
                        "avx2 avx512 ...; 'native' = this machine's own); one column per profile and capability "
                        "(default: one run, keeping the caller's ATEN_CPU_CAPABILITY)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default: reports/)")
    p.add_argument("--label", default=None, help="machine label in matrix.json (default: the device: 'cpu' or "
                                                 "the GPU name)")
    p.add_argument("--workers", default="auto", help="pytest-xdist -n value: auto or an int >= 0 (default auto)")
    p.add_argument("--expectations", type=Path, default=None,
                   help="expectations directory (default: the conftest's, ROOT/tests/expectations)")
    p.add_argument("--root", type=Path, default=None, help="directory pytest runs in (default: this repository)")
    p.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, metavar="S",
                   help=f"seconds between progress lines (default {DEFAULT_INTERVAL_S:g})")
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="-- PYTEST_ARGS | merge FILE ...",
                   help="pytest arguments after `--`; or `merge A.json B.json ... [-o DIR]`")


def merge_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specverify matrix merge",
                                description="join the matrix.json reports of several machines into one table")
    p.add_argument("files", nargs="+", type=Path, metavar="MATRIX_JSON")
    p.add_argument("-o", "--out", type=Path, default=Path("reports", "merged"),
                   help="output directory (default: reports/merged)")
    return p


def command(args) -> int:
    rest = list(args.rest or [])
    try:
        for option, values in (("--profiles", args.profiles), ("--dtypes", args.dtypes),
                               ("--algorithms", args.algorithms), ("--capabilities", args.capabilities)):
            if values and "merge" in values:     # nargs="+" swallowed the sub-command
                raise MatrixError(f"{option} took 'merge' as a name: `matrix merge A.json B.json [-o DIR]` comes "
                                  f"right after `matrix`, without run options")
        if rest and rest[0] == "merge":
            given = [flag for flag, value in (("--profiles", args.profiles), ("--dtypes", args.dtypes),
                                              ("--algorithms", args.algorithms), ("--out", args.out),
                                              ("--capabilities", args.capabilities),
                                              ("--label", args.label), ("--expectations", args.expectations),
                                              ("--root", args.root)) if value is not None]
            if args.workers != "auto":
                given.append("--workers")
            if given:
                raise MatrixError(f"{', '.join(given)} belong to a matrix run, not to `matrix merge` "
                                  f"(its options: -o DIR)")
            margs = merge_parser().parse_args(rest[1:])
            return merge(margs.files, margs.out)
        if rest and rest[0] == "--":
            rest = rest[1:]
        return run(profiles=args.profiles, dtypes=args.dtypes, algorithms=args.algorithms,
                   out=args.out or Path("reports"), label=args.label, workers=args.workers,
                   expectations=args.expectations, root=args.root, pytest_args=rest, interval=args.interval,
                   capabilities=args.capabilities)
    except MatrixError as e:
        print(f"specverify matrix: error: {e}", file=sys.stderr)
        return 2


def main(argv=None) -> int:
    """`python -m specverify.matrix ...`: the same command without the rest of the CLI."""
    p = argparse.ArgumentParser(prog="python -m specverify matrix")
    add_arguments(p)
    return command(p.parse_args(argv))
