"""Every chapter ends with an Exercises section: 3-5 exercises, each marked with one of the
three kinds, each followed by a solution cell the reader can run (collapsed in the web book by
the ``hide-cell`` tag) and a solution the web book collapses into a dropdown.

The solutions' stated results are checked by one test per chapter, ``test_exercises_chNN.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("[01][0-9]_*.ipynb"))
KINDS = ("predict, then check", "derive", "change the code")
HEADING = re.compile(r"^### Exercise (\d+)\.(\d+) · (.+?)\s*$", re.M)
PENDING: dict[str, str] = {}  # chapters whose Exercises section is not placed yet, with what is left


def exercise_cells(path: Path):
    """The cells after the chapter's ``## Exercises`` heading."""
    cells = json.loads(path.read_text())["cells"]
    start = [i for i, c in enumerate(cells)
             if c["cell_type"] == "markdown" and re.search(r"^## Exercises\s*$", "".join(c["source"]), re.M)]
    assert len(start) == 1, f"{path.name}: expected one '## Exercises' heading, found {len(start)}"
    return cells[start[0]:]


def test_every_chapter_is_checked():
    assert len(CHAPTERS) == 12


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.xfail(reason=PENDING[p.stem], strict=False))
                                  if p.stem in PENDING else p for p in CHAPTERS], ids=lambda p: p.stem)
def test_chapter_ends_with_exercises_of_every_kind(path):
    cells = exercise_cells(path)
    chapter = int(path.name[:2])
    found = []  # (number, kind, index of the heading cell)
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "markdown":
            for m in HEADING.finditer("".join(cell["source"])):
                found.append((int(m.group(1)), int(m.group(2)), m.group(3), i))
    assert 3 <= len(found) <= 5, f"{path.name}: {len(found)} exercises, expected 3 to 5"
    assert [f[0] for f in found] == [chapter] * len(found), f"{path.name}: exercises numbered {found}"
    assert [f[1] for f in found] == list(range(1, len(found) + 1)), f"{path.name}: numbering {found}"
    assert {f[2] for f in found} <= set(KINDS), f"{path.name}: unknown kinds {[f[2] for f in found]}"
    assert {f[2] for f in found} == set(KINDS), f"{path.name}: not every kind is used"
    bounds = [f[3] for f in found] + [len(cells)]
    for (num, k, kind, start), end in zip(found, bounds[1:]):
        body = cells[start + 1:end]
        code = [c for c in body if c["cell_type"] == "code"]
        assert code, f"exercise {num}.{k}: no solution cell"
        assert all("hide-cell" in c["metadata"].get("tags", []) for c in code), \
            f"exercise {num}.{k}: a solution cell is not tagged hide-cell"
        assert any("exercises" in "".join(c["source"]) for c in code), \
            f"exercise {num}.{k}: the solution cell does not use gpt2k3.book.exercises"
        text = "".join("".join(c["source"]) for c in body if c["cell_type"] == "markdown")
        assert re.search(r"^:::+\{dropdown\} Solution", text, re.M), \
            f"exercise {num}.{k}: no ':::{{dropdown}} Solution' block"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_has_its_solution_test(path):
    assert (ROOT / "tests" / f"test_exercises_ch{path.name[:2]}.py").exists()
