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
    # Colab's ipywidgets (the version in tests/data/colab_pip_freeze.txt), as wheels:
    # tests/test_bootstrap.py checks every live explorer under it
    python -m pip download -q --no-deps -d .venv/colab-wheels \
        $(grep -E '^(ipywidgets|ipython-genutils|ipython_genutils)==' tests/data/colab_pip_freeze.txt)
    echo "$want" > .venv/.installed
fi
# Chapter 11's corpus: the King James Bible, printed by Debian's `bible` program (package
# bible-kjv, which pulls in bible-kjv-text).  Installed by debian_install below.
# debian_install COMMAND PACKAGE WHY: install Debian's PACKAGE when COMMAND is missing (test.sh
# uses it too, for chromium).
debian_install() {
    if ! command -v "$1" >/dev/null 2>&1; then
        echo "==> installing Debian's $2 ($3)"
        local SUDO=""
        if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$2" >/dev/null
    fi
}
debian_install bible bible-kjv "the King James Bible, chapter 11's corpus"
# The live panel (book/live.md) runs the book's small models in the reader's browser with
# onnxruntime-web, an npm package pinned by package-lock.json. Its files (about 15 MB, too
# large to commit) are copied with the exported models into book/_static/live, which the site
# serves; the page fetches them only when the reader asks. npm comes from Debian when missing.
debian_install npm npm "the live panel's runtime is an npm package"
lock=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ "$(cat node_modules/.installed 2>/dev/null || true)" != "$lock" ]; then
    echo "==> installing onnxruntime-web (npm ci, pinned by package-lock.json)"
    npm ci --no-audit --no-fund --loglevel=error
    echo "$lock" > node_modules/.installed
fi
python -m gpt2k3.book.live.stage
