"""Stored notebook outputs must be the same on every reader's machine.

nbval compares every stored output with a fresh run, so an output that prints float
rounding noise (which differs between CPUs, thread counts and BLAS libraries) makes the
test command fail on somebody else's machine.  These tests keep the rule for every chapter,
including chapters written later:

* no number in a stored output carries more than ``GLUE_DIGITS`` significant digits
  (a float32 computation is good to about 7; what it prints must be less);
* no rounding-level quantity (below 1e-4) is printed as raw digits: it is asserted against
  a tolerance and shown as the bound, ``≤ 1e-5`` (see ``gpt2k3.book.display.bound``);
* code listings (``show_source`` / ``show_diff``) are source, not results: they are left to
  ``tests/test_listings.py``, which compares them with the package;
* only cells whose point is a live, machine-dependent display skip nbval's comparison, and
  each says why in a comment.

The scan covers text, Markdown, HTML, glue values and the numbers inside plotly figures.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpt2k3.book.display import GLUE_DIGITS

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))

# Values that are exact by construction and may carry more digits: (notebook stem, where, why).
# ``where`` is a glue name or "c<cell index>".  Keep this list short and say why each is exact.
ALLOW: dict[tuple[str, str], str] = {
    ("03_linear_attention", "eps"): "the normaliser's epsilon, a constant of the code, not a result",
}

# a code listing (gpt2k3.book.display.show_source / show_diff): source code, whose constants are
# the code's, compared with the package by tests/test_listings.py
_LISTING = re.compile(r"\*\*`[^`]+`\*\* (·|→) ")
_NUMBER = re.compile(r"(?<![\w.])[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?(?![\w.])")
_BOUND_BEFORE = ("≤", "<", "<=")


def significant_digits(literal: str) -> int:
    """Significant digits written in a decimal literal ("0.00120" -> 2, "1.2084e-5" -> 5)."""
    mantissa = re.split(r"[eE]", literal.lstrip("+-"))[0]
    digits = mantissa.replace(".", "").lstrip("0")
    if "." in mantissa:
        digits = digits.rstrip("0") or "0"
    else:
        digits = digits.rstrip("0") or "0"  # an integer's trailing zeros are not precision
    return len(digits)


def _float_problems(text: str) -> list[str]:
    problems = []
    for m in _NUMBER.finditer(text):
        lit = m.group(0)
        is_float = "." in lit or "e" in lit.lower()
        if not is_float:
            continue
        # a group of a thousands-separated integer ("1,024.5" reads as "024.5")
        if m.start() > 0 and text[m.start() - 1] == ",":
            continue
        if text[max(0, m.start() - 6):m.start()].lower() == "arxiv:":
            continue  # an identifier, not a measurement
        if float(lit).is_integer() and abs(float(lit)) < 2**53:
            continue  # a whole number is exact
        if significant_digits(lit) > GLUE_DIGITS:
            problems.append(f"{lit} has more than {GLUE_DIGITS} significant digits")
            continue
        value = abs(float(lit))
        if 0 < value < 1e-4:
            before = text[max(0, m.start() - 3):m.start()]
            if not any(b in before for b in _BOUND_BEFORE):
                problems.append(f"{lit} is rounding-level noise printed as digits (assert it; show the bound)")
    return problems


def _json_float_problems(obj) -> list[str]:
    problems = []
    if isinstance(obj, float):
        if obj.is_integer() and abs(obj) < 2**53:
            return problems  # a whole number is exact
        if significant_digits(repr(obj)) > GLUE_DIGITS:
            problems.append(f"{obj!r} in a figure has more than {GLUE_DIGITS} significant digits")
    elif isinstance(obj, dict):
        for v in obj.values():
            problems += _json_float_problems(v)
    elif isinstance(obj, list):
        for v in obj:
            problems += _json_float_problems(v)
    return problems


def _figure_data(fig: dict) -> list:
    """What a plotly figure plots: trace data, frames and slider steps (not the theme's constants)."""
    if not isinstance(fig, dict):
        return [fig]
    layout = fig.get("layout", {}) if isinstance(fig.get("layout"), dict) else {}
    return [fig.get("data", []), fig.get("frames", []), layout.get("sliders", [])]


def output_problems(nb_path: Path) -> list[str]:
    nb = json.loads(nb_path.read_text())
    found = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        if "nbval-ignore-output" in cell.get("metadata", {}).get("tags", []):
            continue  # not compared by nbval (checked separately below)
        for out in cell.get("outputs", []):
            texts: list[tuple[str, str]] = []
            if out["output_type"] == "stream":
                texts.append((f"c{i}", "".join(out["text"])))
            elif out["output_type"] in ("display_data", "execute_result"):
                md = out["data"].get("text/markdown", "")
                if _LISTING.match("".join(md) if isinstance(md, list) else md):
                    continue
                name = out.get("metadata", {}).get("scrapbook", {}).get("name")
                where = name or f"c{i}"
                for mime, data in out["data"].items():
                    if mime.startswith("image/") or "widget" in mime:
                        continue
                    if mime.endswith("+json") or mime.endswith("/json"):
                        if (nb_path.stem, where) not in ALLOW:
                            found += [f"{nb_path.stem} {where}: {p}" for p in _json_float_problems(_figure_data(data))]
                        continue
                    texts.append((where, "".join(data) if isinstance(data, list) else str(data)))
            for where, text in texts:
                if (nb_path.stem, where) in ALLOW:
                    continue
                found += [f"{nb_path.stem} {where}: {p}" for p in _float_problems(text)]
    return found


def test_significant_digits():
    assert significant_digits("1.2084134817123413") == 17
    assert significant_digits("0.00120") == 2
    assert significant_digits("2.5e-06") == 2
    assert significant_digits("24.7386") == 6
    assert significant_digits("1048576") == 7


def test_the_scan_catches_noise():
    assert _float_problems("stored 1.2084134817123413") != []
    assert _float_problems("| logits | 2.5e-06 |") != []
    assert _float_problems("| logits | ≤ 1e-05 |") == []
    assert _float_problems("exactly 1,048,576 tokens and 24.74 tokens/s") == []
    assert _float_problems("technical report (arXiv:2510.26692)") == []
    assert _json_float_problems({"y": [0.30000000000000004]}) != []
    assert _json_float_problems({"y": [0.3, 12.5]}) == []


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_outputs_are_machine_independent(nb_path):
    problems = output_problems(nb_path)
    assert not problems, "\n".join(problems[:30]) + (f"\n... and {len(problems) - 30} more" if len(problems) > 30 else "")


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.stem)
def test_skipped_cells_say_why(nb_path):
    """A cell nbval does not compare says why: in its metadata (``nbval_skip_reason``), out of
    the reader's way, or in a leading ``# nbval-ignore-output:`` comment of a cell whose code
    the web book hides (``remove-input``). A web reader never sees the comment."""
    nb = json.loads(nb_path.read_text())
    for i, cell in enumerate(nb["cells"]):
        meta = cell.get("metadata", {})
        if "nbval-ignore-output" not in meta.get("tags", []):
            continue
        src = "".join(cell["source"])
        if src.startswith("# nbval-ignore-output:"):
            assert "remove-input" in meta.get("tags", []), (
                f"{nb_path.stem} cell {i} shows its nbval comment to web readers")
        else:
            reason = meta.get("nbval_skip_reason")
            assert isinstance(reason, str) and len(reason.split()) >= 4, (
                f"{nb_path.stem} cell {i} skips nbval's comparison without saying why "
                "(metadata nbval_skip_reason)")


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_as_jupyter_writes_them(nb_path):
    """Opening a chapter in Jupyter must not mark it modified: the file is what nbformat
    writes, and the kernelspec is the one ipykernel installs (JupyterLab rewrites a
    differing display name the moment the kernel starts)."""
    import nbformat
    from ipykernel.kernelspec import get_kernel_dict

    text = nb_path.read_text()
    nb = nbformat.reads(text, as_version=4)
    assert nbformat.writes(nb) + "\n" == text or nbformat.writes(nb) == text
    assert nb.metadata.kernelspec == {"display_name": get_kernel_dict()["display_name"],
                                      "language": "python", "name": "python3"}
    assert all("id" in cell for cell in nb.cells)
