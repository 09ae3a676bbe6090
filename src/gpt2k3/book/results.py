"""Load benchmark results (``benchmarks/results/*.json|csv``) for the chapters to plot.

The chapters never time anything themselves: benchmark scripts write results files
and the notebooks read them.  :func:`load` looks in two places, in this order:

1. a checkout of the book: the folder holding ``benchmarks/results`` at or above the
   working directory, or the checkout this package is installed from in editable mode.
   Fresh runs and GPU results land there, so they take precedence;
2. the copy that ships inside the package (``gpt2k3/book/results_data``, package data), so that
   every chapter runs wherever the package is installed -- Colab, a reader's own
   environment -- offline, with nothing to download.

``python scripts/sync_results.py`` refreshes the packaged copy from ``benchmarks/results``;
a test fails while the two differ.  A file in neither place is an error, or ``None`` with
``missing_ok=True`` (GPU results, say, exist only where a GPU ran).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from gpt2k3.checks import check_bool

__all__ = ["results_dir", "packaged_dir", "load", "exists"]

_SUBDIR = Path("benchmarks") / "results"
_PACKAGE_DATA = "results_data"


def results_dir() -> Path | None:
    """The local ``benchmarks/results`` folder, or ``None`` outside a checkout.

    Searched at and above the working directory, then in the checkout that holds this
    package's source (``<checkout>/src/gpt2k3``, an editable install).
    """
    here = Path(__file__).resolve()
    bases = [Path.cwd(), *Path.cwd().parents]
    if here.parent.parent.name == "src":  # src layout: <checkout>/src/gpt2k3/results.py
        bases.append(here.parents[2])
    for base in bases:
        if (base / _SUBDIR).is_dir():
            return base / _SUBDIR
    return None


def packaged_dir():
    """The results that ship inside the package (an ``importlib.resources`` traversable)."""
    return resources.files(__package__) / _PACKAGE_DATA


def _check_name(name: Any) -> str:
    if (not isinstance(name, str) or not name or name.startswith(".") or "/" in name
            or "\\" in name or "\0" in name or Path(name).name != name):
        raise ValueError(f"name must be a plain file name in benchmarks/results (no folders), "
                         f"got {name!r}")
    return name


def _find(name: str):
    d = results_dir()
    if d is not None and (d / name).is_file():
        return d / name
    packaged = packaged_dir() / name
    if packaged.is_file():
        return packaged
    return None


def exists(name: str) -> bool:
    """Whether a results file is present, locally or in the package (GPU results exist only
    where a GPU ran).  ``name`` must be a plain file name, as for :func:`load`."""
    return _find(_check_name(name)) is not None


def load(name: str, missing_ok: bool = False) -> Any:
    """Parsed JSON (``.json``) or text (anything else) of ``benchmarks/results/<name>``.

    The local checkout's file takes precedence over the copy shipped in the package.
    """
    check_bool(missing_ok, "missing_ok")
    path = _find(_check_name(name))
    if path is None:
        if missing_ok:
            return None
        raise FileNotFoundError(f"benchmarks/results/{name} not found, neither in a checkout nor "
                                "in the installed package (run the benchmark that writes it)")
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if name.endswith(".json") else text
