"""`python -m specverify matrix`: the suite once per platform profile, and one table of
feature x dtype x platform.

    python -m specverify matrix [--profiles P ...] [--dtypes D ...] [--algorithms A ...]
                                [--out DIR] [--label NAME] [--workers N|auto] [--expectations DIR]
                                [--root DIR] [-- PYTEST ARGS ...]
    python -m specverify matrix merge A.json B.json ... [-o DIR]

Each profile is one `python -m pytest -n <workers> -p no:cacheprovider -q --junitxml=...` run in
its own process with `SPECVERIFY_PLATFORM=<profile>` (default: every profile this machine can
run); `--dtypes` / `--algorithms` become the conftest's `--sv-dtypes` / `--sv-algorithms`; the
arguments after `--` go to pytest (default: none, the whole suite as `scripts/run-tests` runs it).
The conftest puts each test's feature, dtype and algorithm into the JUnit XML as properties
(tests/matrix/features.toml) and writes the expectations it applied and the stale ones
(tests/expectations/) to a side file. Progress: a line per profile when it starts, a live count
every few seconds, a summary line when it ends.

Output, in --out (default reports/): matrix.md, matrix.json (everything needed to re-render or
merge), matrix.html (self-contained: inline CSS, no script; green = all passed, red = a failure or
an error, amber = an expected failure, grey = only skipped; a red cell links to its failures),
and per profile junit-<profile>.xml, pytest-<profile>.log, expectations-<profile>.json.

A cell reads passed/failed/skipped/xfailed: `passed` counts xpassed tests too, `failed` counts
errors too (matrix.json keeps all six outcomes apart).

Exit status: 0 when no profile has a failed or errored test and every pytest run ended normally
(exit 0, 1, or 5 = nothing collected); 1 otherwise; 2 on bad arguments or unreadable input.
`merge` joins the matrix.json of several machines into one table (columns ordered cuda |
cuda-emulated | rocm | rocm-emulated | cpu, so a platform's native and emulated columns sit side by
side; a profile that two files carry becomes profile@label) and exits like a run: 1 when the joined
table holds a failure.
"""

# The package's modules, one job each; each imports only those before it in this order:
# errors, junit, report, columns, checks, runner, cli.
from specverify.matrix.errors import ALGORITHMS, NO_DTYPE, OUTCOMES, PROFILE_ORDER, SCHEMA, MatrixError
from specverify.matrix.junit import DETAIL_CHARS, MESSAGE_CHARS, count, has_failures, parse_junit
from specverify.matrix.report import (CSS, cell_class, cell_numbers, cell_text, failures_by_cell, render_html,
                                      render_md, render_text, stale_rows, table, write_reports)
from specverify.matrix.columns import COLUMN_KEYS, RECORD_KEYS, assign_columns, load_report, merge
from specverify.matrix.checks import (check_label, check_names, check_profiles, check_workers, default_root,
                                      device_label)
from specverify.matrix.runner import (DEFAULT_INTERVAL_S, OK_RETURNCODES, PROGRESS_LINE, PROGRESS_PARTIAL,
                                      ProgressCounter, _column, child_env, pytest_command, run, run_profile)
from specverify.matrix.cli import add_arguments, command, main, merge_parser
