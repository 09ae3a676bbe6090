"""Every chapter runs wherever the package is installed -- the Colab path, proven offline.

The ``installed`` test does what a reader's environment (or Colab's bootstrap cell) does:
it builds ``gpt2k3`` as a wheel from a copy of the source, installs it **non-editably** into
a throwaway virtual environment outside the checkout, and executes every chapter notebook
(a copy) with nbclient, in a kernel of that environment, from a temporary working directory
outside the checkout -- with ``transformers`` and ``fla`` not importable.  Any error fails.

How the throwaway environment is made, and why:

* ``python -m venv --without-pip`` on the base interpreter.  ``--system-site-packages``
  cannot be used: it exposes the *base* interpreter's site-packages, which have no torch
  here, not this virtual environment's.
* Its site-packages gets a symbolic link to every top-level file and folder (per each
  distribution's ``RECORD``) of exactly the distributions a reader would have: the closure
  of ``pyproject.toml``'s declared dependencies, plus ``ipykernel`` (the Jupyter kernel) and
  ``torch``, as installed here.  Nothing is downloaded or copied (torch is reused as it is),
  and nothing else is visible: not the editable ``gpt2k3``, not ``transformers`` or ``fla``
  (``importlib.util.find_spec`` returns ``None`` for them, as in a fresh install), not the
  book's build tools (myst-nb, sphinx, PyYAML).  So a chapter that needs an undeclared
  package fails here, as it would for a reader.  (Prepending an install folder to
  ``PYTHONPATH`` over this environment would hide the editable package but leave every
  other installed library importable, and a finder that blocks ``transformers`` would
  make ``find_spec`` raise instead of answering ``None``.)
* The wheel is built by ``pip wheel --no-deps --no-build-isolation --no-index`` with this
  environment's setuptools and installed by ``pip --python <env> install --no-deps
  --no-index``: no network.
* A check cell put before each copied notebook asserts where it runs: that
  interpreter, ``gpt2k3`` from the throwaway site-packages, no local ``benchmarks/results``
  (the results come from the package data), ``transformers`` and ``fla`` not importable.

The other tests here are quick: the optional oracles without ``transformers``, and the
Colab bootstrap's statement of what it installs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from gpt2k3 import oracles
from gpt2k3.archs import GPT2_SMALL, KIMI_LINEAR_48B
from gpt2k3.book.colab import BOOTSTRAP, REQUIREMENTS

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: Never visible in the throwaway environment: the optional oracles.
HIDDEN = {"transformers", "fla-core", "flash-linear-attention", "einops"}
KERNEL = "gpt2k3-installed"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


# --------------------------------------------------------------------------- optional oracles
@pytest.fixture
def no_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` fail


def test_oracles_return_none_and_say_so_in_one_line_without_transformers(no_transformers, capsys):
    assert not oracles.available("transformers")
    assert oracles.hf_param_count(KIMI_LINEAR_48B) is None
    assert oracles.hf_param_counts([GPT2_SMALL, KIMI_LINEAR_48B]) is None
    assert oracles.hf_meta_model(GPT2_SMALL) is None
    assert oracles.hf_config(GPT2_SMALL) is None
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    for line in lines:
        assert line.startswith("Skipped ") and "transformers is not installed" in line
        assert line.endswith('To run it: pip install "gpt2k3[oracles]"')


def test_oracles_refuse_bad_specs_with_or_without_transformers(no_transformers):
    with pytest.raises(ValueError, match="ArchSpec"):
        oracles.hf_meta_model("gpt2")
    with pytest.raises(ValueError, match="transformers config"):
        oracles.hf_param_counts([GPT2_SMALL.with_(mlp="swiglu")])


def test_oracles_skip_a_transformers_older_than_the_tested_one(monkeypatch, capsys):
    import types

    old = types.ModuleType("transformers")
    old.__version__ = "5.15.0"
    monkeypatch.setitem(sys.modules, "transformers", old)
    assert oracles.hf_param_count(GPT2_SMALL) is None
    assert "transformers 5.15.0 is older than" in capsys.readouterr().out


def test_archs_holds_data_only():
    """Published configurations are data; the transformers helpers live in gpt2k3.oracles."""
    from gpt2k3 import archs

    assert not hasattr(archs, "hf_meta_model") and not hasattr(archs, "hf_config")


def test_oracles_extra_is_declared():
    extra = PYPROJECT["project"]["optional-dependencies"]["oracles"]
    assert {re.split(r"[<>=!~ ;\[]", r)[0] for r in extra} == {"transformers", "fla-core", "einops"}
    assert f">={oracles.MIN_TRANSFORMERS}" in next(r for r in extra if r.startswith("transformers"))


# --------------------------------------------------------------------------- Colab bootstrap
def test_bootstrap_states_what_it_installs():
    assert tuple(PYPROJECT["project"]["dependencies"]) == REQUIREMENTS
    assert all(r in BOOTSTRAP for r in REQUIREMENTS)
    assert BOOTSTRAP.count('"pip", "install"') == 1


# --------------------------------------------------------------------------- the installed package
def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(roots: list[str]) -> dict[str, metadata.Distribution]:
    """The installed distributions ``roots`` (requirement strings) need, recursively."""
    from packaging.requirements import Requirement

    found: dict[str, metadata.Distribution] = {}
    todo = [(Requirement(r), "") for r in roots]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = _canonical(req.name)
        if name in found:
            continue
        dist = metadata.distribution(req.name)
        found[name] = dist
        for sub in dist.requires or []:
            sub_req = Requirement(sub)
            for ex in ("", *req.extras):
                if sub_req.marker is None or sub_req.marker.evaluate({"extra": ex}):
                    todo.append((sub_req, ex))
                    break
    return found


def _link_distributions(dists: dict[str, metadata.Distribution], site: Path) -> int:
    """Link each distribution's top-level files and folders into ``site``; return how many."""
    n = 0
    for name, dist in dists.items():
        if dist.files is None:
            raise RuntimeError(f"{name} has no RECORD: cannot tell its files")
        tops = {f.parts[0] for f in dist.files if f.parts and f.parts[0] != ".."}
        for top in sorted(tops):
            src, dst = Path(dist.locate_file(top)), site / top
            if src.exists() and not dst.exists():
                dst.symlink_to(src, target_is_directory=src.is_dir())
                n += 1
    return n


def _check_cell(env: Path, site: Path) -> str:
    return f"""\
import importlib.util, sys
import gpt2k3
from gpt2k3.book import results
assert sys.prefix == {str(env)!r}, sys.prefix
assert gpt2k3.__file__.startswith({str(site)!r}), gpt2k3.__file__
assert results.results_dir() is None, results.results_dir()
assert importlib.util.find_spec("transformers") is None
assert importlib.util.find_spec("fla") is None"""


def _make_environment(tmp: Path) -> tuple[Path, Path]:
    """A throwaway venv with the wheel of gpt2k3 installed; returns (env, site-packages)."""
    source = tmp / "source"
    shutil.copytree(ROOT / "src", source / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    run = dict(check=True, capture_output=True, text=True)
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(tmp / "wheel"), str(source)], **run)
    (wheel,) = (tmp / "wheel").glob("gpt2k3-*.whl")

    env = tmp / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], **run)
    python = env / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([str(python), "-c", purelib], **run).stdout.strip())
    roots = [*PYPROJECT["project"]["dependencies"], "ipykernel", "torch"]
    dists = _closure(roots)
    assert not HIDDEN & set(dists), f"the declared closure pulls in {HIDDEN & set(dists)}"
    assert "gpt2k3" not in dists
    _link_distributions(dists, site)
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", "--no-index",
                    str(wheel)], **run)
    return env, site


@pytest.mark.installed
def test_every_chapter_runs_from_the_installed_package(tmp_path_factory, monkeypatch):
    import nbformat
    from nbclient import NotebookClient
    from traitlets.config import Config
    from nbclient.exceptions import CellExecutionError

    tmp = tmp_path_factory.mktemp("installed")
    assert not tmp.resolve().is_relative_to(ROOT), "the throwaway environment must be outside"
    start = time.perf_counter()
    try:
        env, site = _make_environment(tmp)
    except subprocess.CalledProcessError as err:
        pytest.fail(f"{' '.join(map(str, err.cmd))} failed:\n{err.stdout}\n{err.stderr}")
    # the packaged results and nothing of the checkout
    assert sorted(p.name for p in (site / "gpt2k3" / "book" / "results_data").iterdir()), "no results_data"
    assert not any(p.name.startswith("__editable__") for p in site.iterdir())

    # a kernel of the throwaway environment, found by name through JUPYTER_PATH
    kernels = tmp / "jupyter" / "kernels" / KERNEL
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(env / "bin" / "python"), "-m", "ipykernel_launcher",
                 "-f", "{connection_file}"],
        "display_name": "gpt2k3, installed", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp / "jupyter"))
    for var in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE"):
        monkeypatch.delenv(var, raising=False)
    setup = time.perf_counter() - start

    work = tmp / "work"
    work.mkdir()
    # Kernels talk over Unix sockets, not TCP: on a shared machine other Jupyter processes
    # race for the same free TCP ports (a kernel client then waits for replies that never come).
    ipc = Path(tempfile.mkdtemp(prefix="gpt2k3-ipc-"))  # short: socket paths have a length limit
    timings, failures, skipped_lines = {}, [], {}
    for i, path in enumerate(NOTEBOOKS):
        copy = work / path.name
        shutil.copy(path, copy)
        nb = nbformat.read(copy, as_version=4)
        nb.cells.insert(0, nbformat.v4.new_code_cell(_check_cell(env, site)))
        t0 = time.perf_counter()
        try:
            # a chapter runs in well under 60 s; a cell that takes 300 s is a hang
            ipc_config = Config(KernelManager={"transport": "ipc", "ip": str(ipc / f"k{i}")})
            NotebookClient(nb, kernel_name=KERNEL, timeout=300, shutdown_kernel="immediate",
                           config=ipc_config,
                           resources={"metadata": {"path": str(work)}}).execute()
        except CellExecutionError as err:
            failures.append(f"{path.name}: {_ANSI.sub('', str(err))[-1500:]}")
        except Exception as err:  # noqa: BLE001 - a dead kernel, a timeout: report and go on
            failures.append(f"{path.name}: {type(err).__name__}: {err}")
        timings[path.name] = time.perf_counter() - t0
        print(f"{path.name}: {timings[path.name]:.0f} s", file=sys.stderr, flush=True)
        nbformat.write(nb, copy)
        text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                       for o in c.get("outputs", []) if o.get("output_type") == "stream")
        skipped_lines[path.name] = [ln for ln in text.splitlines() if ln.startswith("Skipped ")]
    shutil.rmtree(ipc, ignore_errors=True)

    report = (f"set-up {setup:.0f} s; " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items())
              + f"; total {time.perf_counter() - start:.0f} s")
    print(report)
    assert not failures, f"{len(failures)} of {len(NOTEBOOKS)} chapters failed ({report}):\n\n" + \
        "\n\n".join(failures)
    # a chapter that calls an optional oracle says in one line that it was skipped
    for path in NOTEBOOKS:
        if "oracles." in path.read_text():
            assert skipped_lines[path.name], f"{path.name} skipped an oracle without saying so"
            assert all('pip install "gpt2k3[oracles]"' in ln for ln in skipped_lines[path.name])
