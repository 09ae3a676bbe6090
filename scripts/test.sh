#!/usr/bin/env bash
# Run every test: unit, property and oracle tests, nbval on every notebook, the
# book build and the browser test (headless Debian chromium, installed if missing).
set -euo pipefail
. "$(dirname "$0")/setup_env.sh"
debian_install chromium chromium "for the browser tests"
echo "==> running the tests"
python -m pytest tests notebooks --nbval --nbval-current-env \
    --nbval-sanitize-with tests/nbval_sanitize.cfg --durations=30 "$@"
# The stored outputs must not depend on the machine that made them.  Re-run every notebook
# under another numeric environment: MKL's compatibility code path, one thread, and
# PyTorch's non-vectorised CPU kernels.  Float noise printed as digits fails here.
echo "==> nbval again under another numeric environment (MKL_CBWR=COMPATIBLE, 1 thread, ATEN_CPU_CAPABILITY=default)"
MKL_CBWR=COMPATIBLE OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 ATEN_CPU_CAPABILITY=default \
    python -m pytest notebooks --nbval --nbval-current-env \
    --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider -q
