"""Sphinx / myst-nb build helpers for the web book (never imported by notebooks).

Listed in ``_config.yml`` as a Sphinx extension.  It makes the built site
self-contained and makes plotly figures render in it:

* :class:`PlotlyMimeRenderer` — a myst-nb mime-renderer plugin (entry point group
  ``myst_nb.mime_renderers``).  plotly >= 6 emits only
  ``application/vnd.plotly.v1+json`` inside a kernel, which myst-nb does not render
  by itself.  The plugin turns that JSON into a ``<div>`` with a deterministic id and
  no embedded plotly.js.
* one shared ``_static/plotly.min.js`` (from the installed plotly), loaded only by
  pages that hold a figure;
* MathJax 3 served from ``_static/mathjax`` (the ``django-static-mathjax`` wheel
  ships its ES5 build), so math renders offline;
* sphinx-thebe with Sphinx 7.4 puts its inline configuration script on the page
  twice; duplicates are dropped;
* myst-nb's ipywidgets loader (require.js and the widget manager from a CDN) is
  turned off: live explorers only run in a kernel.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from importlib import resources
from pathlib import Path

PLOTLY_MIME = "application/vnd.plotly.v1+json"
PLOTLY_JS = "plotly.min.js"
MATHJAX_DIR = "mathjax"
MATHJAX_PATH = f"{MATHJAX_DIR}/tex-chtml.js"

__all__ = ["PlotlyMimeRenderer", "plotly_div", "mathjax_source", "setup"]


def plotly_div(figure: dict, key: str) -> str:
    """HTML for one figure: a div with id derived from ``key`` and an inline script that
    draws it with the page's shared plotly.js (``include_plotlyjs=False``)."""
    import plotly.io as pio

    div_id = "plotly-" + hashlib.sha1(key.encode()).hexdigest()[:12]
    return pio.to_html(figure, include_plotlyjs=False, full_html=False, div_id=div_id,
                       validate=False, config={"displaylogo": False, "responsive": True})


class PlotlyMimeRenderer:
    """myst-nb mime renderer for plotly's JSON output (see the module docstring)."""

    mime_priority_overrides = [(builder, PLOTLY_MIME, 1) for builder in ("html", "dirhtml", "singlehtml")]

    @staticmethod
    def handle_mime(renderer, data, inline):
        if inline or data.mime_type != PLOTLY_MIME:
            return None
        from docutils import nodes

        figure = data.content if isinstance(data.content, dict) else json.loads(data.string)
        doc = renderer.renderer.document["source"] if hasattr(renderer, "renderer") else ""
        key = f"{Path(doc).name}:{data.cell_index}:{data.output_index}"
        html = plotly_div(figure, key)
        return [nodes.raw(text=html, format="html", classes=["output", "text_html", "plotly-output"])]


def mathjax_source() -> Path:
    """The directory of MathJax's ES5 build shipped by ``django-static-mathjax``."""
    return Path(str(resources.files("mathjax"))) / "static" / "mathjax" / "es5"


def _config_inited(app, config):
    config.mathjax_path = MATHJAX_PATH
    config.nb_ipywidgets_js = {}


def _page_context(app, pagename, templatename, context, doctree):
    if "plotly-graph-div" in context.get("body", ""):
        app.add_js_file(PLOTLY_JS, priority=200)
    scripts = context.get("script_files")
    if scripts:
        seen, unique = set(), []
        for s in scripts:
            # an inline script is added once with filename None and once with "": same script
            key = (str(getattr(s, "filename", s) or ""), getattr(s, "priority", 0),
                   tuple(sorted((k, str(v)) for k, v in getattr(s, "attributes", {}).items())))
            if key not in seen:
                seen.add(key)
                unique.append(s)
        scripts[:] = unique


def _build_finished(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    import plotly.offline

    static = Path(app.outdir) / "_static"
    static.mkdir(parents=True, exist_ok=True)
    (static / PLOTLY_JS).write_text(plotly.offline.get_plotlyjs(), encoding="utf-8")
    shutil.copytree(mathjax_source(), static / MATHJAX_DIR, dirs_exist_ok=True)


def setup(app):
    app.connect("config-inited", _config_inited, priority=900)
    app.connect("html-page-context", _page_context, priority=900)
    app.connect("build-finished", _build_finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
