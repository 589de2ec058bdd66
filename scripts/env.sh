# Sourced by scripts/run-demo, scripts/run-matrix and scripts/run-tests: create or reuse the virtual
# environment and install what specverify needs. Variables: SPECVERIFY_VENV (default .venv), PYTHON
# (default python3), SPECVERIFY_TORCH_INDEX (the CPU wheel index, default PyTorch's own).
# sv_oldest_triton (called by scripts/run-tests) makes the second environment: the oldest supported
# triton (constraints/oldest-triton.txt) in a folder that goes first on PYTHONPATH.
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

# sv_outside_supported_range PY: print one line per library (torch, triton) that interpreter PY
# already has outside the supported ranges of specverify/environment.py; nothing when all fit.
sv_outside_supported_range() {
  "$1" - "$root/specverify/environment.py" <<'PY'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("sv_environment", sys.argv[1])
env = importlib.util.module_from_spec(spec)
spec.loader.exec_module(env)
for line in env.unsupported_versions():
    print(line)
PY
}

# sv_oldest_triton VENV: install the triton pinned in constraints/oldest-triton.txt into
# VENV/oldest-triton (no dependencies: the venv's torch and numpy stay) unless it is there
# already, and print that folder. Put first on PYTHONPATH, it makes `import triton` the oldest
# supported one while everything else is the venv's.
sv_oldest_triton() {
  local venv=$1 pin dir stamp
  pin=$(grep -v '^#' "$root/constraints/oldest-triton.txt" | grep -m1 .)
  dir="$venv/oldest-triton"
  stamp="$dir/.specverify-pin"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$pin" ]; then
    rm -rf "$dir"
    echo "env.sh: installing $pin into $dir (the oldest supported triton)" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --target "$dir" "$pin" >&2
    echo "$pin" > "$stamp"
  fi
  echo "$dir"
}

# sv_conformance_wheel VENV: download the engine wheel pinned in constraints/conformance.txt (no
# dependencies; tagged for CPython 3.12 on x86-64 Linux, whatever runs this) into VENV/wheels
# unless it is there already, and print its path.
sv_conformance_wheel() {
  local venv=$1 pin dir name version found
  pin=$(grep -v '^#' "$root/constraints/conformance.txt" | grep -m1 .)
  name=${pin%%==*}
  version=${pin##*==}
  dir="$venv/wheels"
  found=$(ls "$dir/$name-$version-"*.whl 2>/dev/null | head -1)
  if [ -z "$found" ]; then
    echo "env.sh: downloading the $pin wheel into $dir (conformance of its kernels)" >&2
    "$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
      --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64 -d "$dir" "$pin" >&2
    found=$(ls "$dir/$name-$version-"*.whl 2>/dev/null | head -1)
  fi
  [ -n "$found" ] && echo "$found"
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
  if "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
    # An existing torch (or triton) is kept, never replaced: one outside the supported range is
    # refused here, before pip would swap it for another.
    outside=$(sv_outside_supported_range "$venv/bin/python")
    if [ -n "$outside" ]; then
      echo "env.sh: $outside (in $venv/bin/python); install a supported one there, or point PYTHON at" \
           "another interpreter" >&2
      exit 1
    fi
  else
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
