# Sourced by scripts/run-demo and scripts/run-tests: create or reuse the virtual environment and
# install what specverify needs. Variables: SPECVERIFY_VENV (default .venv), PYTHON (default python3).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
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
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${constraint[@]}" -e "$root[test]"
  echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
# The tiny models gain nothing from intra-op threads; xdist workers share the cores instead.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
cd "$root"
