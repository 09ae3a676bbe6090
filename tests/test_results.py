"""Benchmark results travel with the package: gpt2k3.book.results and its packaged copy."""

import importlib.util
import json
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from gpt2k3.book import results

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "benchmarks" / "results"
PACKAGED = ROOT / "src" / "gpt2k3" / "book" / "results_data"


def _sync_script():
    path = ROOT / "scripts" / "sync_results.py"
    spec = importlib.util.spec_from_file_location("sync_results", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_packaged_results_are_a_byte_equal_copy_of_benchmarks_results():
    diff = _sync_script().differences(SOURCE, PACKAGED)
    assert not diff, ("the package's copy of the benchmark results is stale; run "
                      "`python scripts/sync_results.py`:\n" + "\n".join(diff))
    assert sorted(p.name for p in PACKAGED.iterdir()) == sorted(_sync_script()._results(SOURCE))


def test_every_packaged_file_is_declared_package_data():
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["gpt2k3"]
    for p in PACKAGED.iterdir():
        assert any(fnmatch(f"book/results_data/{p.name}", pat) for pat in patterns), p.name


def test_the_package_copy_is_read_outside_a_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(results, "results_dir", lambda: None)  # as in an installed package
    for p in PACKAGED.glob("*.json"):
        assert results.exists(p.name)
        assert results.load(p.name) == json.loads(p.read_text())
    assert not results.exists("no_such_benchmark.json")
    assert results.load("no_such_benchmark.json", missing_ok=True) is None
    with pytest.raises(FileNotFoundError, match="benchmarks/results/no_such_benchmark.json"):
        results.load("no_such_benchmark.json")


def test_a_local_checkout_takes_precedence(tmp_path, monkeypatch):
    name = next(PACKAGED.glob("*.json")).name
    local = tmp_path / "benchmarks" / "results"
    local.mkdir(parents=True)
    (local / name).write_text('{"fresh": true}')
    (local / "only_here.csv").write_text("a,b\n1,2\n")
    monkeypatch.chdir(tmp_path / "benchmarks")  # found above the working directory too
    assert results.results_dir() == local
    assert results.load(name) == {"fresh": True}
    assert results.load("only_here.csv") == "a,b\n1,2\n"
    assert results.exists("only_here.csv")


@pytest.mark.parametrize("name", ["/etc/passwd", "../secrets.json", "..", ".", "", ".hidden.json",
                                  "a/b.json", "a\\b.json", "x.json\0", None, 3, Path("x.json")])
def test_names_must_be_plain_file_names(name):
    with pytest.raises(ValueError, match="plain file name"):
        results.load(name)
    with pytest.raises(ValueError, match="plain file name"):
        results.exists(name)


def test_sync_copies_and_removes(tmp_path):
    sync = _sync_script()
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "a.json").write_text("{}")
    (src / "b.csv").write_text("x\n")
    (src / "c_quick.json").write_text("{}")  # quick runs stay out, as in .gitignore
    (src / "notes.txt").write_text("not a result")
    dst.mkdir()
    (dst / "old.json").write_text("{}")
    assert sync.differences(src, dst)
    sync.sync(src, dst)
    assert sorted(p.name for p in dst.iterdir()) == ["a.json", "b.csv"]
    assert sync.differences(src, dst) == []
    (src / "a.json").write_text('{"changed": 1}')
    assert sync.differences(src, dst) == ["differs: a.json"]
