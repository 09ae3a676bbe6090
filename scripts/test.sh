#!/usr/bin/env bash
# Run every test: unit, property and oracle tests, nbval on every notebook, the
# book build and the browser test (headless Debian chromium, installed if missing).
set -euo pipefail
. "$(dirname "$0")/setup_env.sh"
if ! command -v chromium >/dev/null 2>&1; then
    echo "==> installing Debian's chromium for the browser test"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
echo "==> running the tests"
python -m pytest tests notebooks --nbval --nbval-current-env \
    --nbval-sanitize-with tests/nbval_sanitize.cfg --durations=10 "$@"
