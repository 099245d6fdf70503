#!/usr/bin/env bash
# Creates benchmarks/.peers-venv (Python 3.12) with the peer Shapley estimators that
# benchmarks/bench_estimators.py measures side by side with fedsv's: shapiq and pyDVL.
#
# Usage: benchmarks/peers/setup_peers.sh [PYTHON3.12]
#   PYTHON3.12 defaults to $PEERS_PYTHON, else python3.12 on PATH, else pyenv's 3.12.1.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$(cd "$here/.." && pwd)/.peers-venv"

is_312() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; }

python="${1:-${PEERS_PYTHON:-}}"
if [[ -z "$python" ]]; then
    # The first candidate that runs and is >= 3.12 (a pyenv shim can exist and still fail to run).
    for candidate in python3.13 python3.12 /root/.pyenv/versions/3.12.1/bin/python3.12; do
        if command -v "$candidate" >/dev/null 2>&1 && is_312 "$candidate"; then
            python="$candidate"
            break
        fi
    done
    if [[ -z "$python" ]]; then
        echo "setup_peers.sh: no Python >= 3.12 found; pass one as the first argument" >&2
        exit 1
    fi
fi
if ! is_312 "$python"; then
    echo "setup_peers.sh: $python does not run or is older than 3.12 (shapiq needs >= 3.12)" >&2
    exit 1
fi

if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -r "$here/requirements.txt"
"$venv/bin/python" - <<'PY'
from importlib.metadata import PackageNotFoundError, version

for name in ("shapiq", "pydvl", "numpy", "xgboost-cpu", "xgboost"):
    try:
        print(f"{name} {version(name)}")
    except PackageNotFoundError:
        pass
PY
echo "peers venv ready: $venv"
