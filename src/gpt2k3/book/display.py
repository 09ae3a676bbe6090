"""Small display helpers for the notebooks and figures: code listings, tables, glued numbers,
formatters.

:func:`show_source` renders the exact object a chapter runs, read with ``inspect`` when the cell
executes; :func:`show_diff` shows what one listing changes in another.

The number formatters here are the only ones the figures and widgets use: :func:`fmt_bytes`
(binary units, ``'1.5 KiB'``), :func:`fmt_decimal_bytes` (decimal units, ``'19.3 GB'``),
:func:`fmt_gb` (always gigabytes, ``'0.0157 GB'``) and :func:`fmt_count` (``'47.5B'``), all
at three significant digits; :func:`sig` rounds a number to significant digits.

``glue`` stores a value for the web book's prose (myst-nb's ``{glue:text}`` role).
myst-nb is a build dependency, not a package dependency: in Colab, where it is not
installed, ``glue`` quietly does nothing and the notebook still runs.  A glued sentence that
holds Markdown (a command in backquotes, ``**bold**``) is pasted by ``{glue:text}`` as plain
text -- the markup taken out, never shown as literal backquotes -- and by ``{glue:md}`` as
Markdown; the book's build keeps a ``--`` as two hyphens (``smartquotes_action: qe``).
"""

from __future__ import annotations

import ast
import difflib
import inspect
import math
import numbers
import re
import textwrap
from typing import Any, Sequence

from IPython.display import Markdown

from gpt2k3.checks import check_bool, check_finite_number, check_positive_int, is_real

__all__ = ["glue", "md_table", "bound", "sig", "GLUE_DIGITS", "fmt_bytes", "fmt_decimal_bytes",
           "fmt_gb", "fmt_count", "Listing", "show_source", "show_diff", "source_of"]

#: Significant digits a glued float keeps.  Stored notebook outputs must be the same on
#: every machine; a float32 computation is good to about 7 digits, so nothing glued may
#: carry more than this many (``tests/test_notebook_outputs.py`` enforces it).  Values
#: that are float32 *results* (a loss, a recall error) are rounded further by the chapter,
#: with :func:`sig`, to what survives a change of CPU, thread count or BLAS.
GLUE_DIGITS = 6


def sig(x: float, digits: int = 3) -> float:
    """``x`` rounded to ``digits`` significant digits (0 and non-finite values unchanged)."""
    check_positive_int(digits, "digits")
    if not is_real(x):
        raise TypeError(f"x must be a real number, got {type(x).__name__}")
    x = float(x)
    if x == 0 or not math.isfinite(x):
        return x
    # the correctly rounded decimal with ``digits`` significant digits (as ``%g`` prints it),
    # read back: no float log10 decides the exponent
    return float(f"{x:.{digits - 1}e}")


def _real(name: str, n, nonneg: bool = True) -> float:
    if not is_real(n) or not math.isfinite(n):
        raise ValueError(f"{name} must be a finite number, got {n!r}")
    if nonneg and n < 0:
        raise ValueError(f"{name} must be >= 0, got {n!r}")
    return float(n)


def fmt_bytes(n: float) -> str:
    """``1536 -> '1.5 KiB'``: binary units (B, KiB, ... PiB), three significant digits."""
    n = _real("n", n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} B" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def fmt_decimal_bytes(n: float) -> str:
    """Decimal units: ``'19.3 GB'``, ``'5.63 TB'``, ``'45.1 MB'``, ``'512 B'`` (three
    significant digits)."""
    n = _real("n", n, nonneg=False)
    for div, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if abs(n) >= div:
            return f"{n / div:.3g} {unit}"
    return f"{n:.3g} B"


def fmt_gb(n: float) -> str:
    """Always gigabytes (decimal), three significant digits: ``'1.23 GB'``, ``'0.0157 GB'``."""
    return f"{_real('n', n, nonneg=False) / 1e9:.3g} GB"


def fmt_count(n: float, sign: bool = False) -> str:
    """A count in short form: ``'47.5B'``, ``'2.81T'``, ``'124M'``; with ``sign``, ``'+1.17B'``,
    ``'−4.97M'`` (a true minus sign)."""
    n = _real("n", n, nonneg=False)
    check_bool(sign, "sign")
    mark = ("+" if n > 0 else "−" if n < 0 else "") if sign else ("−" if n < 0 else "")
    a = abs(n)
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if a >= div:
            return f"{mark}{a / div:.3g}{unit}"
    return f"{mark}{a:.0f}"


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
    check_finite_number(tol, "tol", 1)
    if not is_real(difference):
        try:  # a 0-d tensor or NumPy scalar
            difference = float(difference)
        except (TypeError, ValueError):
            raise ValueError(f"difference must be a real number, got {difference!r}") from None
    d = float(difference)
    if not d <= tol:  # also catches NaN
        raise AssertionError(f"{what} {d:.3g} exceeds the tolerance {tol:g}")
    return f"≤ {_tol_text(tol)}"


def _glue_value(value: Any) -> Any:
    if isinstance(value, float) or (isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral)):
        return sig(float(value), GLUE_DIGITS)
    return value


_MARKUP = re.compile(r"`[^`]+`|\*\*[^*]+\*\*|(?<![\w*])\*[^*\s][^*]*\*(?![\w*])")


class GluedMarkdown(str):
    """A glued sentence that holds Markdown: the same string, shown as Markdown by
    ``{glue:md}`` (and by ``{glue}``) and as plain text -- code spans and emphasis without their
    markers -- by ``{glue:text}``, which pastes a value's ``text/plain`` as it is."""

    def _repr_markdown_(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return _MARKUP.sub(lambda m: m.group(0).strip("`*"), str(self))


def _glue_object(value: Any) -> Any:
    """What :func:`glue` hands to myst-nb: a string with Markdown in it as :class:`GluedMarkdown`."""
    if isinstance(value, str) and not isinstance(value, GluedMarkdown) and _MARKUP.search(value):
        return GluedMarkdown(value)
    return value


def glue(name: str, value: Any) -> Any:
    """Glue ``value`` under ``name`` for the book's prose (no visible output); return it.

    Floats are stored with at most :data:`GLUE_DIGITS` significant digits (the stored
    output is compared on every reader's machine); the value returned is the same rounded
    number, so the code and the prose agree.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    value = _glue_value(value)
    try:
        from myst_nb import glue as _glue
    except ImportError:  # running outside the book's environment (e.g. Colab)
        return value
    _glue(name, _glue_object(value), display=False)
    return value


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> Markdown:
    """A Markdown table (rendered by Jupyter and by the web book)."""
    if isinstance(headers, (str, bytes)) or not isinstance(headers, Sequence):
        raise ValueError(f"headers must be a list of column names, got {headers!r}")
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or any(
            isinstance(r, (str, bytes)) or not isinstance(r, Sequence) for r in rows):
        raise ValueError(f"rows must be a list of rows (each a list of cells), got {rows!r}")
    if any(len(r) != len(headers) for r in rows):
        raise ValueError(f"rows must each have {len(headers)} cells (one per header)")

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


# ------------------------------------------------------------------------- the code on the page

class Listing:
    """A code listing read from the package when the cell runs: shown as Markdown (a caption
    and a fenced block, highlighted by the web book, JupyterLab and Colab alike) and as plain
    text (what nbval compares, so a listing goes stale the moment its source changes)."""

    def __init__(self, caption: str, code: str, language: str = "python"):
        self.caption, self.code, self.language = caption, code, language

    @property
    def n_lines(self) -> int:
        return len(self.code.splitlines())

    def _repr_markdown_(self) -> str:
        return f"{self.caption}\n\n```{self.language}\n{self.code}\n```"

    def __repr__(self) -> str:
        return f"{self.caption}\n\n{self.code}"


def _strip_docstrings(code: str) -> str:
    """``code`` with the docstring of every function and class in it removed."""
    tree = ast.parse(code)
    drop: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body \
                and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant) \
                and isinstance(node.body[0].value.value, str):
            drop.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
    return "\n".join(line for i, line in enumerate(code.splitlines(), 1) if i not in drop)


def _package_path(obj) -> str:
    """The file ``obj`` is defined in, from the package root (``gpt2k3/ops/delta.py``): the
    same on every machine, in a checkout or installed."""
    parts = inspect.getsourcefile(obj).replace("\\", "/").split("/")
    return "/".join(parts[len(parts) - 1 - parts[::-1].index("gpt2k3"):])


def source_of(obj) -> tuple[str, str, int, int]:
    """``(dotted name, file, first line, last line)`` of a package function, class or method,
    and its code without docstrings, dedented."""
    obj = inspect.unwrap(obj)
    if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismethod(obj)):
        raise ValueError(f"obj must be a function, method or class, got {type(obj).__name__}")
    obj = getattr(obj, "__func__", obj)
    module = inspect.getmodule(obj)
    if module is None or not module.__name__.startswith("gpt2k3"):
        raise ValueError(f"obj must be defined in the gpt2k3 package, got {obj!r}")
    lines, start = inspect.getsourcelines(obj)
    code = _strip_docstrings(textwrap.dedent("".join(lines))).rstrip()
    return f"{module.__name__}.{obj.__qualname__}", code, start, start + len(lines) - 1


def show_source(obj) -> Listing:
    """The listing of ``obj`` exactly as the package defines it (docstrings left out), captioned
    with its dotted name, file and line numbers."""
    name, code, start, end = source_of(obj)
    path = _package_path(inspect.unwrap(obj))
    return Listing(f"**`{name}`** · `{path}`, lines {start}–{end}", code)


def show_diff(old, new) -> Listing:
    """What changed from listing ``old`` to listing ``new``, as a unified diff with full
    context: the whole of ``new``, its added lines marked ``+`` and the removed ones ``-``."""
    (a, a_code, *_), (b, b_code, *_) = source_of(old), source_of(new)
    a_lines, b_lines = a_code.splitlines(), b_code.splitlines()
    diff = list(difflib.unified_diff(a_lines, b_lines, lineterm="",
                                     n=max(len(a_lines), len(b_lines))))
    body = [line for line in diff[2:] if not line.startswith("@@")]
    return Listing(f"**`{a}`** → **`{b}`**", "\n".join(body), language="diff")
