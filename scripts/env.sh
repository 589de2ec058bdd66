# Sourced by scripts/run-demo and scripts/run-tests: create or reuse the virtual environment and
# install what specverify needs. Variables: SPECVERIFY_VENV (default .venv), PYTHON (default python3),
# SPECVERIFY_TORCH_INDEX (the CPU wheel index, default PyTorch's own).
# With SPECVERIFY_ENV_FUNCTIONS_ONLY=1 it only defines the functions (the tests call them).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

SPECVERIFY_TORCH_CPU_INDEX=${SPECVERIFY_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}

# sv_report_needs_cuda REPORT: exit 0 when the pip installation report REPORT (`pip install
# --dry-run --report`) would install CUDA packages (nvidia-*: toolkit, cuDNN, NCCL) with torch,
# 1 when it would not, 2 when the report is unreadable or has no torch in it.
sv_report_needs_cuda() {
  "${SV_PYTHON:-python3}" - "$1" <<'PY'
import json, sys
try:
    with open(sys.argv[1]) as f:
        items = json.load(f)["install"]
    names = [i["metadata"]["name"].lower().replace("_", "-") for i in items]
except (OSError, ValueError, KeyError, TypeError) as e:
    print(f"env.sh: unreadable pip report {sys.argv[1]}: {e}", file=sys.stderr)
    sys.exit(2)
if "torch" not in names:
    print(f"env.sh: the pip report installs no torch", file=sys.stderr)
    sys.exit(2)
sys.exit(0 if any(n.startswith("nvidia-") for n in names) else 1)
PY
}

# sv_torch_index_args VENV_PYTHON CONSTRAINTS: print the extra pip arguments that make the torch
# pinned in CONSTRAINTS the CPU build. Nothing when the configured index already serves a torch
# without CUDA packages (or when pip cannot tell: then the plain set-up runs and says why it fails).
sv_torch_index_args() {
  local py=$1 constraints=$2 report
  report=$(mktemp)
  if "$py" -m pip install --dry-run --quiet --ignore-installed --report "$report" -c "$constraints" torch \
      >/dev/null 2>&1; then
    local verdict=0
    SV_PYTHON="$py" sv_report_needs_cuda "$report" || verdict=$?
    if [ "$verdict" = 0 ]; then
      echo "--extra-index-url $SPECVERIFY_TORCH_CPU_INDEX"
    fi
  fi
  rm -f "$report"
}

if [ "${SPECVERIFY_ENV_FUNCTIONS_ONLY:-0}" = 1 ]; then
  return 0 2>/dev/null || exit 0
fi

venv=${SPECVERIFY_VENV:-$root/.venv}
python=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  if "$python" -c "import torch" >/dev/null 2>&1; then
    # This machine already has torch (a GPU build, say): see it from the venv and keep it.
    "$python" -m venv --system-site-packages "$venv"
  else
    "$python" -m venv "$venv"
  fi
fi

# Reinstall only when the project's requirements changed since the last install.
stamp="$venv/.specverify-install"
want=$(cat "$root/pyproject.toml" "$root/constraints/cpu.txt" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  constraint=()
  if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
    constraint=(-c "$root/constraints/cpu.txt")
    # The plain torch wheel of the public index pulls the CUDA toolkit (gigabytes): ask for the
    # CPU build where the configured index would serve that one.
    read -r -a cpu_index <<< "$(sv_torch_index_args "$venv/bin/python" "$root/constraints/cpu.txt")"
    if [ "${#cpu_index[@]}" -gt 0 ]; then
      echo "env.sh: the configured index serves a CUDA torch; installing the CPU build from ${cpu_index[1]}" >&2
      constraint+=("${cpu_index[@]}")
    fi
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${constraint[@]}" -e "$root[test]"
  echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
# The tiny models gain nothing from intra-op threads; xdist workers share the cores instead.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
cd "$root"
