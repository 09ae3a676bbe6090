"""Small display helpers for the notebooks (tables, glued numbers).

``glue`` stores a value for the web book's prose (myst-nb's ``{glue:text}`` role).
myst-nb is a build dependency, not a package dependency: in Colab, where it is not
installed, ``glue`` quietly does nothing and the notebook still runs.
"""

from __future__ import annotations

from typing import Any, Sequence

from IPython.display import Markdown

__all__ = ["glue", "md_table"]


def glue(name: str, value: Any) -> Any:
    """Glue ``value`` under ``name`` for the book's prose (no visible output); return it."""
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
