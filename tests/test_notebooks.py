"""House rules for the chapter notebooks (their outputs are checked by nbval)."""

import json
import re
from pathlib import Path

import pytest
import yaml

from gpt2k3.book.colab import BOOTSTRAP, REPO_URL

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _code_cells(path):
    nb = json.loads(path.read_text())
    return nb, [c for c in nb["cells"] if c["cell_type"] == "code"]


def test_there_are_notebooks_and_all_are_in_the_toc():
    assert NOTEBOOKS
    toc = (ROOT / "_toc.yml").read_text()
    for nb in NOTEBOOKS:
        assert f"notebooks/{nb.stem}" in toc, f"{nb.name} is not in _toc.yml"


def test_repo_url_matches_config():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["repository"]["url"] == REPO_URL


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_house_rules(path):
    nb, cells = _code_cells(path)
    assert "".join(cells[0]["source"]) == BOOTSTRAP, "first code cell must be the Colab bootstrap"
    assert "widgets" not in nb["metadata"], "stored widget state makes the book load a CDN"
    assert all(c.get("outputs") is not None for c in cells)
    assert any(c["outputs"] for c in cells), "stored without outputs"
    for c in cells:
        src = "".join(c["source"])
        assert not re.search(r"^(class|def) \w+", src, re.M), "logic belongs in src/gpt2k3"
        tags = c.get("metadata", {}).get("tags", [])
        if "widgets import" in src or "_explorer(" in src:
            assert "remove-output" in tags and "nbval-ignore-output" in tags


def test_bootstrap_is_a_no_op_outside_colab():
    ns = {}
    exec(BOOTSTRAP, ns)  # must not try to install anything here
