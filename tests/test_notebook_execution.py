"""Executing a chapter never stalls.

Headless clients (nbclient, nbconvert) once stalled on the chapters' live explorers: the
kernel answered in under a second, but the client saw the reply only at its timeout.  The
cause was the explorer drawing into an ``ipywidgets.Output`` with ``with output: display()``:
nbclient mimics a frontend for Output widgets and answers each captured output on the
kernel's shell socket from inside its IOPub handler, and that send could swallow the wake-up
of the pending ``execute_reply`` (see ``gpt2k3.book.widgets._explorer``).  This test runs every
explorer the chapters show, several rounds, and measures, for every cell, the time between
the kernel's reply and the client receiving it.
"""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 4
MAX_LAG_S = 3.0


def explorer_calls() -> list[str]:
    """``name()`` for every explorer a chapter calls with its defaults."""
    names = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                names += re.findall(r"^(\w+_explorer)\(\)\s*$", "".join(cell["source"]), flags=re.M)
    return sorted(set(names))


def test_every_chapter_explorer_is_found():
    calls = explorer_calls()
    assert len(calls) >= 8 and "cache_explorer" in calls and "interference_explorer" in calls


def test_explorer_cells_never_stall_a_headless_client():
    calls = explorer_calls()
    cells = [new_code_cell("import torch\nimport gpt2k3.book.widgets as widgets")]
    for _ in range(ROUNDS):
        cells += [new_code_cell(f"widgets.{name}()") for name in calls]
    nb = new_notebook(cells=cells)
    client = NotebookClient(nb, timeout=120, kernel_name="python3", record_timing=True,
                            store_widget_state=True, resources={"metadata": {"path": str(ROOT)}})
    lags = []
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):
            client.execute_cell(cell, i)
            received = datetime.datetime.now(datetime.timezone.utc)
            replied = datetime.datetime.fromisoformat(
                cell.metadata.execution["shell.execute_reply"].replace("Z", "+00:00"))
            lags.append(((received - replied).total_seconds(), "".join(cell.source)))
            assert not [o for o in cell.outputs if o.output_type == "error"], cell.outputs
    worst = max(lags)
    print(f"\n[execution] {len(lags)} cells, {ROUNDS} rounds of {len(calls)} explorers; "
          f"largest reply-to-receipt lag {worst[0]:.2f} s")
    stalled = [(round(lag, 1), src) for lag, src in lags if lag > MAX_LAG_S]
    assert not stalled, f"the client received these replies late: {stalled}"
