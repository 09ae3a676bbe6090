"""Helpers for the book tests: build the web book, serve it on loopback, drive Chromium."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-quic"]


def build_book(out: Path) -> tuple[Path, str]:
    """Build the book into ``out`` with warnings as errors; return (html dir, log)."""
    exe = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(exe) if exe.exists() else "jupyter-book", "build", str(ROOT), "--path-output", str(out),
           "-W", "-n", "--keep-going"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1800)
    log = proc.stdout + proc.stderr
    if proc.returncode:
        raise AssertionError(f"book build failed ({proc.returncode}):\n{log[-6000:]}")
    return out / "_build" / "html", log


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a browser that drops a connection (a favicon it gave up on) is not a failure


@contextmanager
def serve(directory: Path):
    """Serve ``directory`` on 127.0.0.1 (a free port) for the duration of the block."""
    handler = functools.partial(_Quiet, directory=str(directory))
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def chromium_path() -> str | None:
    return os.environ.get("CHROMIUM") or shutil.which("chromium") or (
        "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
