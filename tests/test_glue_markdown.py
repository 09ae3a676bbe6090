"""A glued sentence renders as a sentence: no literal backquotes, no `--` turned into a dash.

``{glue:text}`` pastes a value's ``text/plain`` as it is, and docutils' SmartQuotes turns a
``--`` in pasted text into an en dash: a glued ``"run `bench.py --device cuda`"`` used to show
its backquotes and an en dash.  ``display.glue`` now gives such a sentence a plain-text form
without markup (and its Markdown for ``{glue:md}``), and the book builds with
``smartquotes_action: qe`` (quotes and ellipses only).  The build test renders a small
notebook with the book's own settings and looks at the HTML.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpt2k3.book import display

ROOT = Path(__file__).resolve().parents[1]
SENTENCE = "Time it on a GPU with `python benchmarks/chunkwise.py --device cuda` and **rerun** it."


def _bundle(value):
    from IPython.core.formatters import format_display_data

    return format_display_data(display._glue_object(value))[0]


def test_a_sentence_with_markdown_is_glued_as_markdown_and_as_plain_text():
    data = _bundle(SENTENCE)
    assert data["text/markdown"] == SENTENCE
    assert data["text/plain"] == ("Time it on a GPU with python benchmarks/chunkwise.py --device cuda "
                                  "and rerun it.")
    assert display.glue("sentence", SENTENCE) == SENTENCE  # the code gets the string back


def test_plain_values_are_glued_as_before():
    assert _bundle("1, 8 and 64") == {"text/plain": "'1, 8 and 64'"}
    assert _bundle(3)["text/plain"] == "3" and "text/markdown" not in _bundle(2.5)
    assert _bundle("a * b and c * d") == {"text/plain": "'a * b and c * d'"}  # not emphasis


@pytest.mark.book
def test_glued_markdown_renders_without_backquotes_or_dashes(tmp_path):
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]["config"]
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(
        "extensions = ['myst_nb']\nnb_execution_mode = 'off'\n"
        f"smartquotes_action = {config['smartquotes_action']!r}\n"
        "myst_enable_extensions = ['colon_fence']\nhtml_theme = 'basic'\n")
    plain, markdown = _bundle(SENTENCE)["text/plain"], SENTENCE
    glue_out = {"output_type": "display_data", "metadata": {"scrapbook": {
        "name": "cmd", "mime_prefix": "application/papermill.record/"}},
        "data": {"application/papermill.record/text/plain": plain,
                 "application/papermill.record/text/markdown": markdown}}
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}},
          "cells": [{"cell_type": "markdown", "metadata": {}, "source": "# Glue"},
                    {"cell_type": "code", "metadata": {}, "execution_count": 1, "outputs": [glue_out],
                     "source": "glue('cmd', SENTENCE)"},
                    {"cell_type": "markdown", "metadata": {},
                     "source": "Text: {glue:text}`cmd`\n\nMarkdown: {glue:md}`cmd`\n"}]}
    (src / "index.ipynb").write_text(json.dumps(nb))
    out = tmp_path / "html"
    run = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", str(src), str(out)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    html = (out / "index.html").read_text()
    text = html.split("Text:", 1)[1].split("Markdown:", 1)[0]
    md = html.split("Markdown:", 1)[1].split("</p>", 1)[0]
    assert "--device" in text and "–" not in text and "`" not in text and "**" not in text
    assert '<code class="docutils literal notranslate">' in md and "--device" in md and "`" not in md
    assert "<strong>rerun</strong>" in md
