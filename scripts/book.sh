#!/usr/bin/env bash
# Build the web book into _build/html (offline; warnings are errors).
set -euo pipefail
. "$(dirname "$0")/setup_env.sh"
echo "==> building the book"
jupyter-book build . -W -n --keep-going
cat <<MSG

The book is in $(pwd)/_build/html.  To read it:
    python3 -m http.server --directory _build/html 8000
then open http://localhost:8000 in a browser (or open _build/html/index.html directly).
MSG
