"""Load benchmark results (``benchmarks/results/*.json|csv``) for the chapters to plot.

The chapters never time anything themselves: benchmark scripts write results files
and the notebooks read them.  :func:`load` finds a file in a checkout of the book (the
folder holding ``benchmarks/results`` above the working directory, or above this
package when it is installed in editable mode); in Colab, where only the package is
installed, it falls back to the file in the book's repository.  Anywhere else a missing
file is an error, or ``None`` with ``missing_ok=True`` (GPU results, say, exist only
where a GPU ran).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .colab import REPO_URL

__all__ = ["results_dir", "load", "exists"]

_SUBDIR = Path("benchmarks") / "results"


def results_dir() -> Path | None:
    """The local ``benchmarks/results`` folder, or ``None`` outside a checkout."""
    for base in (Path.cwd(), *Path.cwd().parents, *Path(__file__).resolve().parents):
        if (base / _SUBDIR).is_dir():
            return base / _SUBDIR
    return None


def exists(name: str) -> bool:
    """Whether a results file is present locally (GPU results exist only where a GPU ran)."""
    d = results_dir()
    return d is not None and (d / name).is_file()


def load(name: str, missing_ok: bool = False) -> Any:
    """Parsed JSON (``.json``) or text (anything else) of ``benchmarks/results/<name>``."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"name must be a plain file name in benchmarks/results, got {name!r}")
    d = results_dir()
    if d is not None and (d / name).is_file():
        text = (d / name).read_text()
    elif "google.colab" in sys.modules:  # pragma: no cover - only in Colab
        from urllib.error import HTTPError
        from urllib.request import urlopen

        raw = REPO_URL.replace("https://github.com/", "https://raw.githubusercontent.com/")
        try:
            with urlopen(f"{raw}/main/{_SUBDIR.as_posix()}/{name}", timeout=30) as r:  # noqa: S310
                text = r.read().decode()
        except HTTPError:
            if missing_ok:
                return None
            raise
    elif missing_ok:
        return None
    else:
        raise FileNotFoundError(f"benchmarks/results/{name} not found (run the benchmark that writes it)")
    return json.loads(text) if name.endswith(".json") else text
