"""Small display helpers for the notebooks (tables, glued numbers).

``glue`` stores a value for the web book's prose (myst-nb's ``{glue:text}`` role).
myst-nb is a build dependency, not a package dependency: in Colab, where it is not
installed, ``glue`` quietly does nothing and the notebook still runs.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

from IPython.display import Markdown

__all__ = ["glue", "md_table", "bound", "sig", "GLUE_DIGITS"]

#: Significant digits a glued float keeps.  Stored notebook outputs must be the same on
#: every machine; a float32 computation is good to about 7 digits, so nothing glued may
#: carry more than this many (``tests/test_notebook_outputs.py`` enforces it).  Values
#: that are float32 *results* (a loss, a recall error) are rounded further by the chapter,
#: with :func:`sig`, to what survives a change of CPU, thread count or BLAS.
GLUE_DIGITS = 6


def sig(x: float, digits: int = 3) -> float:
    """``x`` rounded to ``digits`` significant digits (0 and non-finite values unchanged)."""
    if isinstance(digits, bool) or not isinstance(digits, int) or digits < 1:
        raise ValueError(f"digits must be a positive int, got {digits!r}")
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"x must be a real number, got {type(x).__name__}")
    x = float(x)
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


def _tol_text(tol: float) -> str:
    mantissa, exponent = f"{tol:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def bound(difference: Any, tol: float, what: str = "difference") -> str:
    """Check a rounding-level ``difference`` against ``tol`` and return the bound it proves.

    Float rounding noise differs between CPUs, thread counts and BLAS libraries, so a
    chapter never shows its digits: it asserts the difference is within ``tol`` (raising
    ``AssertionError`` otherwise, so a real regression stops the notebook) and shows
    ``"≤ 1e-5"``, which holds on every machine.
    """
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not (0 < tol < math.inf):
        raise ValueError(f"tol must be a positive finite number, got {tol!r}")
    d = float(difference)
    if not d <= tol:  # also catches NaN
        raise AssertionError(f"{what} {d:.3g} exceeds the tolerance {tol:g}")
    return f"≤ {_tol_text(tol)}"


def _glue_value(value: Any) -> Any:
    if isinstance(value, float) or (isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral)):
        return sig(float(value), GLUE_DIGITS)
    return value


def glue(name: str, value: Any) -> Any:
    """Glue ``value`` under ``name`` for the book's prose (no visible output); return it.

    Floats are stored with at most :data:`GLUE_DIGITS` significant digits (the stored
    output is compared on every reader's machine); the value returned is the same rounded
    number, so the code and the prose agree.
    """
    value = _glue_value(value)
    try:
        from myst_nb import glue as _glue
    except ImportError:  # running outside the book's environment (e.g. Colab)
        return value
    _glue(name, value, display=False)
    return value


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> Markdown:
    """A Markdown table (rendered by Jupyter and by the web book)."""
    if any(len(r) != len(headers) for r in rows):
        raise ValueError(f"every row must have {len(headers)} cells (one per header)")

    def cell(x):
        if isinstance(x, bool):
            return str(x)
        if isinstance(x, int):
            return f"{x:,}"
        if isinstance(x, float):
            return f"{x:,.4g}"
        if isinstance(x, tuple):
            return " × ".join(str(v) for v in x)
        return str(x).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(x) for x in r) + " |" for r in rows]
    return Markdown("\n".join(lines))
