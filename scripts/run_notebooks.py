"""Re-execute chapter notebooks in place so their stored outputs are current.

    python scripts/run_notebooks.py                 # every notebook in notebooks/
    python scripts/run_notebooks.py notebooks/01_gpt2.ipynb

nbval (run by the test command) fails when a stored output no longer matches what
the code produces; run this after changing a notebook or the code it calls.
Widget state is dropped after the run: the web book shows no live widgets, and stored state
would make myst-nb load the widget manager from a CDN.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def run(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}},
                   store_widget_state=True).execute()
    elapsed = time.perf_counter() - start
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    return elapsed


if __name__ == "__main__":
    paths = [Path(p) for p in sys.argv[1:]] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    for p in paths:
        print(f"{p}: executed in {run(p):.1f} s", flush=True)
