"""Put what the live panel loads where the web book serves it.

``python -m gpt2k3.book.live.stage`` (scripts/setup_env.sh runs it before every build) copies

* onnxruntime-web's WebAssembly build (``npm ci`` installs it, pinned by package-lock.json) into
  ``book/_static/live/ort/``: its script, its loader and its WebAssembly, gzipped (about 15 MB
  inflated, 4 MB as served; too large to commit and rebuilt from the lockfile on any machine);
* the exported models and their manifest (package data, ``gpt2k3/checkpoints/live_*``) into
  ``book/_static/live/models/``.

Both folders are ignored by git; Sphinx copies ``book/_static`` into the site, and the page
fetches them only when the reader presses Generate. :func:`harness` writes a minimal page
around the panel (no book build needed), which the browser test serves.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import sys
from importlib import resources
from pathlib import Path

from gpt2k3.book.live.export import MANIFEST, MODELS, onnx_name

__all__ = ["RUNTIME_FILES", "stage", "harness"]

ROOT = Path(__file__).resolve().parents[4]
STATIC = ROOT / "book" / "_static" / "live"
#: onnxruntime-web's files the panel loads: the wasm-only script and its WebAssembly.
RUNTIME_FILES = ("ort.wasm.min.js", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")


def _runtime_dir(root: Path = ROOT) -> Path:
    return root / "node_modules" / "onnxruntime-web" / "dist"


def stage(dest: Path = STATIC, root: Path = ROOT) -> list[Path]:
    """Copy the runtime and the models into ``dest`` (``ort/`` and ``models/``); returns the
    files written. Raises ``FileNotFoundError`` naming what is missing."""
    dest = Path(dest)
    out = []
    src = _runtime_dir(root)
    missing = [f for f in RUNTIME_FILES if not (src / f).is_file()]
    if missing:
        raise FileNotFoundError(f"onnxruntime-web is not installed ({src}: run `npm ci` in {root})")
    (dest / "ort").mkdir(parents=True, exist_ok=True)
    for f in RUNTIME_FILES:
        if f.endswith(".wasm"):  # served gzipped: the page inflates it (DecompressionStream)
            target = dest / "ort" / (f + ".gz")
            data = (src / f).read_bytes()
            stamp = src / (f + ".gz.sha256")  # beside the source, so the site holds only what it serves
            key = hashlib.sha256(data).hexdigest()
            if not target.is_file() or not stamp.is_file() or stamp.read_text() != key:
                target.write_bytes(gzip.compress(data, 9, mtime=0))
                stamp.write_text(key)
            (dest / "ort" / f).unlink(missing_ok=True)
            out.append(target)
        else:
            out.append(Path(shutil.copy2(src / f, dest / "ort" / f)))
    (dest / "models").mkdir(parents=True, exist_ok=True)
    pkg = resources.files("gpt2k3") / "checkpoints"
    if not (pkg / MANIFEST).is_file():
        raise FileNotFoundError(f"{MANIFEST} is not in the package (run python scripts/export_onnx.py)")
    listed = json.loads((pkg / MANIFEST).read_text())["models"]
    for name in [onnx_name(k) for k in MODELS if k in listed] + [MANIFEST]:
        item = pkg / name
        if not item.is_file():
            raise FileNotFoundError(f"{name} is not in the package (run python scripts/export_onnx.py)")
        target = dest / "models" / name
        target.write_bytes(item.read_bytes())
        out.append(target)
    return out


_HARNESS = """<!DOCTYPE html>
<html lang="en" data-theme="{theme}">
<head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Live panel</title>
<style>
html {{ --pst-color-text-base: #222; --pst-color-background: #fff; --pst-color-surface: #f3f4f5;
       --pst-color-border: #d1d5da; --pst-color-text-muted: #5c6370; --pst-color-primary: #0a7d91; }}
html[data-theme="dark"] {{ --pst-color-text-base: #ced6dd; --pst-color-background: #14181e;
       --pst-color-surface: #29313d; --pst-color-border: #48566b; --pst-color-text-muted: #9ca4af;
       --pst-color-primary: #3fb1c5; }}
body {{ margin: 0 auto; padding: 1rem; max-width: 60rem; font-family: sans-serif;
       background: var(--pst-color-background); color: var(--pst-color-text-base); }}
</style>
<link rel="stylesheet" href="_static/live/live.css">
</head>
<body>
{body}
<script src="_static/live/live.js"></script>
</body></html>
"""


def panel_html() -> str:
    """The panel's HTML (the page, book/live.md, holds the same two boxes)."""
    return ('<div id="live-panel" class="live-box"></div>\n'
            '<div id="live-fallback" hidden><p>The static figures of the cache and the state are in '
            'chapters two and four.</p></div>\n'
            '<div id="live-interference-panel" class="live-box"></div>\n')


def harness(dest: Path, theme: str = "light") -> Path:
    """A minimal site in ``dest``: ``index.html`` with the panel, and ``_static/live`` (the
    panel's script and style, the runtime and the models). Returns the page's path."""
    dest = Path(dest)
    live = dest / "_static" / "live"
    live.mkdir(parents=True, exist_ok=True)
    for f in ("live.js", "live.css"):
        shutil.copy2(STATIC / f, live / f)
    stage(live)
    page = dest / "index.html"
    page.write_text(_HARNESS.format(theme=theme, body=panel_html()))
    return page


if __name__ == "__main__":
    try:
        files = stage()
    except FileNotFoundError as err:
        sys.exit(f"live panel not staged: {err}")
    print(f"staged {len(files)} files of the live panel into {STATIC.relative_to(ROOT)}")
