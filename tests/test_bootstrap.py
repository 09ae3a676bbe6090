"""The Colab path fits Colab, and the book's address and version are written in one place.

* The package's requirements are met by Colab's runtime as it is (its published package list,
  vendored in ``tests/data/colab_pip_freeze.txt`` with its source and date), so the bootstrap
  cell upgrades nothing there -- in particular not ipywidgets 7.7.1, the version Colab's
  front end supports.
* Every live explorer builds, and redraws when a control moves, under that ipywidgets 7.7.1
  (installed from its wheel into a throwaway folder put first on ``PYTHONPATH``).
* The repository URL (``gpt2k3.book.colab.REPO_URL``) and the version (``gpt2k3.__version__``)
  have one place; every notebook's first cell, ``_config.yml``'s launch-button settings and the
  README's Colab and install lines agree with it (``scripts/sync_bootstrap.py`` writes them),
  and what the bootstrap installs is the version's tag, never a moving branch.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import unquote

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import gpt2k3
from gpt2k3.book import colab

ROOT = Path(__file__).resolve().parents[1]
COLAB_LIST = ROOT / "tests" / "data" / "colab_pip_freeze.txt"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def colab_packages() -> dict[str, str]:
    """``{canonical name: version}`` from the vendored list (``name==v`` or ``name @ <wheel url>``)."""
    out = {}
    for line in COLAB_LIST.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "==" in line:
            name, version = line.split("==", 1)
        elif " @ " in line:
            name, url = line.split(" @ ", 1)
            m = re.search(r"/[^/]+?-(\d[^-/]*)-[^/]*\.whl$", unquote(url))
            if not m:
                continue
            version = m.group(1)
        else:
            continue
        out[_canonical(name)] = version.strip()
    return out


def colab_python() -> Version:
    m = re.search(r"Python (\d+\.\d+\.\d+)", COLAB_LIST.read_text()[:2000])
    assert m, "the vendored list's header must name Colab's Python"
    return Version(m.group(1))


# ------------------------------------------------------------------------ Colab's package list
def test_the_vendored_list_says_where_and_when_it_is_from():
    head = COLAB_LIST.read_text()[:600]
    assert "googlecolab/backend-info" in head and re.search(r"commit [0-9a-f]{40} \(\d{4}-\d\d-\d\d", head)
    pkgs = colab_packages()
    assert len(pkgs) > 300 and {"torch", "numpy", "ipywidgets", "plotly"} <= set(pkgs)


def test_colab_already_meets_every_requirement_so_the_bootstrap_upgrades_nothing():
    pkgs = colab_packages()
    problems = []
    for r in colab.REQUIREMENTS:
        req = Requirement(r)
        have = pkgs.get(_canonical(req.name))
        if have is None:
            problems.append(f"{req.name}: not in Colab's list")
        elif not req.specifier.contains(Version(have), prereleases=True):
            problems.append(f"{req.name}: Colab has {have}, the package asks for {req.specifier}")
    assert not problems, problems
    assert SpecifierSet(PYPROJECT["project"]["requires-python"]).contains(colab_python())
    # the widget library Colab's front end supports is the one it ships
    assert pkgs["ipywidgets"] == "7.7.1"


def test_requirements_are_pyprojects():
    assert tuple(PYPROJECT["project"]["dependencies"]) == colab.REQUIREMENTS


def _wheels(pins: list[str]) -> Path:
    """A folder holding the wheels of ``pins`` (``name==version``): ``$GPT2K3_WHEELS``, or
    ``colab-wheels`` in this environment (``scripts/setup_env.sh`` fills it); downloaded there
    from the package index the first time."""
    folder = Path(os.environ.get("GPT2K3_WHEELS") or Path(sys.prefix) / "colab-wheels")
    missing = [p for p in pins if not any(folder.glob(
        "{}-{}-*.whl".format(p.split("==")[0].replace("-", "_"), p.split("==")[1])))]
    if missing:
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
                        "--no-input", "-q", "--no-deps", "-d", str(folder), *missing], check=True)
    return folder


def test_every_explorer_builds_and_redraws_under_colabs_ipywidgets(tmp_path):
    pkgs = colab_packages()
    pins = [f"ipywidgets=={pkgs['ipywidgets']}", f"ipython_genutils=={pkgs['ipython-genutils']}"]
    target = tmp_path / "colab-widgets"
    subprocess.run([sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", "--no-input",
                    "install", "-q", "--no-deps", "--no-index", "--find-links", str(_wheels(pins)),
                    "--target", str(target), *pins], check=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(ROOT / "src")]))
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "explorers_check.py")], env=env,
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["ipywidgets"] == pkgs["ipywidgets"]
    from gpt2k3.book import widgets

    names = [n for n in widgets.__all__ if n.endswith("_explorer")]
    assert sorted(report["explorers"]) == sorted(names) and len(names) >= 20
    for name, r in report["explorers"].items():
        assert r["moved"], f"{name}: no control could be moved"
        assert not r["failed"], f"{name}: {r['failed']}"
        assert r["outputs"] == 1 and r["after"] == r["first"], (name, r)


# ------------------------------------------------------------------------ one place
def test_version_and_address_have_one_place():
    assert colab.VERSION == gpt2k3.__version__
    assert colab.TAG == f"v{gpt2k3.__version__}"
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "gpt2k3.__version__"}
    assert colab.PIP_TARGET == f"gpt2k3 @ git+{colab.REPO_URL}@{colab.TAG}"


def test_the_bootstrap_installs_the_versions_tag_and_nothing_else():
    assert colab.BOOTSTRAP.count('"pip", "install"') == 1
    assert f'"{colab.PIP_TARGET}"' in colab.BOOTSTRAP
    installs = re.findall(r"git\+(\S+?)[\"']", colab.BOOTSTRAP)
    assert installs == [f"{colab.REPO_URL}@{colab.TAG}"], installs
    assert all(r in colab.BOOTSTRAP for r in colab.REQUIREMENTS)
    ns = {}
    exec(colab.BOOTSTRAP, ns)  # a no-op outside Colab


def test_launch_buttons_open_the_versions_tag_on_notebook_pages():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["repository"]["url"] == colab.REPO_URL
    assert config["repository"]["branch"] == colab.TAG
    assert colab.colab_notebook_url("01_gpt2.ipynb") == (
        f"https://colab.research.google.com/github/gpt2k3/gpt2-to-kimi-k3/blob/{colab.TAG}/notebooks/01_gpt2.ipynb")
    with pytest.raises(ValueError, match="notebook"):
        colab.colab_notebook_url("book/intro.md")


def test_notebooks_config_and_readme_agree_with_the_one_place():
    """``scripts/sync_bootstrap.py --check``: nothing it writes is out of step (run the script
    without ``--check`` to bring them in step)."""
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "sync_bootstrap.py"), "--check"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr + "\nrun: python scripts/sync_bootstrap.py"
    readme = (ROOT / "README.md").read_text()
    for url in re.findall(r"https://colab\.research\.google\.com/\S+", readme):
        assert f"/blob/{colab.TAG}/" in url, url
    for target in re.findall(r"gpt2k3(?:\[\w+\])?\s+@\s+git\+(\S+?)[\"`]", readme):
        assert target == f"{colab.REPO_URL}@{colab.TAG}", target


def test_sync_rewrites_only_the_first_code_cell(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import sync_bootstrap
    finally:
        sys.path.pop(0)
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# t"]},
                    {"cell_type": "code", "execution_count": 1, "metadata": {}, "outputs": [],
                     "source": ["# old bootstrap\n", "pass"]},
                    {"cell_type": "code", "execution_count": 2, "metadata": {}, "outputs": [],
                     "source": ["x = 1"]}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    text = json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n"
    new = json.loads(sync_bootstrap.notebook_text(text))
    assert "".join(new["cells"][1]["source"]) == colab.BOOTSTRAP
    assert new["cells"][0] == nb["cells"][0] and new["cells"][2] == nb["cells"][2]
    assert sync_bootstrap.notebook_text(sync_bootstrap.notebook_text(text)) == sync_bootstrap.notebook_text(text)
    config = "repository:\n  url: https://example.org/x  # where\n  path_to_book: \"\"\n  branch: main\n\nhtml:\n  a: 1\n"
    out = sync_bootstrap.config_text(config)
    assert f"url: {colab.REPO_URL}  # where" in out and f"branch: {colab.TAG}" in out and out.endswith("html:\n  a: 1\n")
    readme = ('open `https://colab.research.google.com/github/a/b/blob/main/notebooks/x.ipynb` and\n'
              'run `pip install "gpt2k3 @ git+https://github.com/a/b"` or `"gpt2k3[oracles] @\n'
              '  git+https://github.com/a/b@v0.0.1"`: `torch>=1`, `numpy>=1`,\n  `plotly>=5`.')
    out = sync_bootstrap.readme_text(readme)
    assert f"/blob/{colab.TAG}/notebooks/x.ipynb" in out
    assert out.count(f"git+{colab.REPO_URL}@{colab.TAG}") == 2
    assert ", ".join(f"`{r}`" for r in colab.REQUIREMENTS[:2]) + ",\n  " in out
