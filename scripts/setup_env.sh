# Sourced by book.sh and test.sh: create or reuse .venv and install the pinned
# requirements (only when requirements.txt or pyproject.toml changed since the
# last install).  Needs nothing but python3.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "==> creating .venv"
    "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
want=$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv/.installed 2>/dev/null || true)" != "$want" ]; then
    echo "==> installing requirements into .venv (first run: a few minutes)"
    python -m pip install -q --upgrade pip
    python -m pip install -q -r requirements.txt
    echo "$want" > .venv/.installed
fi
