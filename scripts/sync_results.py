"""Copy the benchmark results the chapters read into the package, so they travel with it.

    python scripts/sync_results.py           # copy benchmarks/results -> src/gpt2k3/book/results_data
    python scripts/sync_results.py --check   # exit 1 (and say what differs) if the copy is stale

The benchmark scripts write ``benchmarks/results/``; :func:`gpt2k3.book.results.load` reads that
folder in a checkout and falls back to ``gpt2k3/book/results_data`` (package data) anywhere else,
which is how a chapter runs in Colab or any install, offline.  Run this after a benchmark
run; ``tests/test_results.py`` fails while the packaged copy differs from the checkout's.
Copied: every ``*.json`` and ``*.csv`` file, except quick runs (``*quick*``, which
``.gitignore`` keeps out of the repository too).  Packaged files with no source are removed.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "benchmarks" / "results"
TARGET = ROOT / "src" / "gpt2k3" / "book" / "results_data"
SUFFIXES = (".json", ".csv")


def _results(folder: Path) -> dict[str, Path]:
    if not folder.is_dir():
        return {}
    return {p.name: p for p in sorted(folder.iterdir())
            if p.is_file() and p.suffix in SUFFIXES and "quick" not in p.name
            and not p.name.startswith(".")}


def differences(source: Path = SOURCE, target: Path = TARGET) -> list[str]:
    """What differs between ``source`` and its packaged copy ``target`` (empty: in sync)."""
    src, dst = _results(source), _results(target)
    out = [f"missing from the package: {n}" for n in src if n not in dst]
    out += [f"not in benchmarks/results: {n}" for n in dst if n not in src]
    out += [f"differs: {n}" for n in src if n in dst and src[n].read_bytes() != dst[n].read_bytes()]
    return out


def sync(source: Path = SOURCE, target: Path = TARGET) -> list[str]:
    """Make ``target`` a byte-equal copy of ``source``'s results; return what changed."""
    changed = differences(source, target)
    target.mkdir(parents=True, exist_ok=True)
    src, dst = _results(source), _results(target)
    for name, path in dst.items():
        if name not in src:
            path.unlink()
    for name, path in src.items():
        if name not in dst or path.read_bytes() != dst[name].read_bytes():
            shutil.copyfile(path, target / name)
    return changed


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        diff = differences()
        print("\n".join(diff) or f"{TARGET.relative_to(ROOT)} is in sync with benchmarks/results")
        sys.exit(1 if diff else 0)
    if sys.argv[1:]:
        sys.exit(__doc__)
    for line in sync() or ["already in sync"]:
        print(line)
    print(f"{TARGET.relative_to(ROOT)}: {len(_results(TARGET))} results files")
