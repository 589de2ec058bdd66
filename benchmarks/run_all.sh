#!/usr/bin/env bash
# Run every benchmark on this machine's GPU; results go to ${OUT:-benchmarks/results}.
#
#   bash benchmarks/run_all.sh              # full runs (a few minutes on an H100)
#   bash benchmarks/run_all.sh --quick      # extra arguments go to every script
#   OUT=/tmp/bench bash benchmarks/run_all.sh
#
# Every script runs even if one fails; the exit status is non-zero when any did.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
PYTHON="${PYTHON:-python3}"
OUT_DIR="${OUT:-benchmarks/results}"
mkdir -p "$OUT_DIR"

status=0
for script in bench_draft_select bench_device_cycle bench_naive_eagle bench_state_scatter bench_hybrid bench_serving; do
    echo "== $script"
    if ! "$PYTHON" "benchmarks/$script.py" --out "$OUT_DIR" "$@"; then
        echo "== $script exited non-zero" >&2
        status=1
    fi
done
echo "== results in $OUT_DIR"
exit $status
