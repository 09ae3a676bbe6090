"""The web book's build helpers (gpt2k3.book.sphinx), checked without building the book.

The partial plotly.js bundle matches the plotly the figures are drawn with and holds every
trace type they use; a figure's HTML carries its JSON safely and compactly; a page's scripts
leave ``<head>`` so none blocks the first paint; the bibliography labels entries as the text
cites them and links their addresses; the icon-font cut keeps every icon a stylesheet names.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import plotly.graph_objects as go
import plotly.offline
import pytest

from gpt2k3.book import sphinx as site

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / "book" / "_static" / site.PLOTLY_JS
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _figures():
    for nb in NOTEBOOKS:
        for cell in json.loads(nb.read_text())["cells"]:
            for out in cell.get("outputs", []):
                fig = out.get("data", {}).get(site.PLOTLY_MIME)
                if fig:
                    yield nb.name, fig


def test_the_vendored_bundle_is_the_plotly_js_the_figures_are_drawn_with():
    assert site.plotly_js_version(BUNDLE) == plotly.offline.get_plotlyjs_version()
    assert 1_000_000 < BUNDLE.stat().st_size < 2_000_000  # the partial bundle, not the 4.8 MB one
    assert (BUNDLE.parent / "plotly-cartesian.LICENSE").exists()


def test_every_figure_uses_only_trace_types_the_bundle_has():
    figures = list(_figures())
    assert len(figures) >= 40
    used = {t.get("type", "scatter") for _, fig in figures for t in fig["data"]}
    assert used <= site.PLOTLY_TRACES, used - site.PLOTLY_TRACES
    text = BUNDLE.read_text(encoding="utf-8", errors="replace")
    for kind in used:  # each registers its module by name in the bundle
        assert re.search(rf'moduleType:"trace",name:"{kind}"', text), kind


def _spec(html: str) -> dict:
    return json.loads(re.search(r'<script type="application/json" class="pf-spec">(.*?)</script>',
                                html, re.S).group(1))


def _resolve(spec):
    shared = spec.get("shared", [])

    def walk(x):
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, dict):
            if set(x) == {"$s"}:
                return shared[x["$s"]]
            return {k: walk(v) for k, v in x.items()}
        return x
    return walk({k: v for k, v in spec.items() if k != "shared"})


def test_figure_html_is_a_captioned_figure_whose_json_cannot_end_its_script():
    xs = list(range(20))
    fig = go.Figure([go.Scatter(x=xs, y=xs, name="</script><b>a</b>"), go.Scatter(x=xs, y=[1] * 20)])
    fig.update_layout(title_text="A <b>bold</b><br>title <img src=x>", template="plotly_white",
                      sliders=[dict(steps=[dict(method="update", label="1", args=[{"x": [xs]}])])])
    html = site.figure_html(fig.to_plotly_json(), "page:1:0")
    assert html.startswith('<figure class="pf">') and html.endswith("</figure>")
    assert '<figcaption class="pf-title pf-text" data-pf-kind="title">A <b>bold</b><br>title &lt;img src=x&gt;' in html
    assert html.count("</script>") == 1 and "<\\/script>" in html
    assert re.search(r'<div id="plotly-[0-9a-f]{12}" class="plotly-graph-div pf-plot"', html)
    assert html == site.figure_html(fig.to_plotly_json(), "page:1:0")  # deterministic
    spec = _spec(html)
    assert spec["layout"]["template"] == {"$template": "plotly_white"}  # shared, not repeated
    assert len(spec["shared"]) == 1  # the x values, stored once
    back = _resolve(spec)
    assert back["data"][0]["x"] == xs and back["layout"]["sliders"][0]["steps"][0]["args"][0]["x"] == [xs]


_PAGE = """<!DOCTYPE html><html><head>
<script data-cfasync="false">document.documentElement.dataset.mode = "light";</script>
<link rel="stylesheet" href="a.css" />
<script defer src="_static/scripts/fontawesome.js?digest=1"></script>
<script src="_static/documentation_options.js"></script>
<script>DOCUMENTATION_OPTIONS.pagename = 'x';</script>
<script defer="defer" src="_static/mathjax/tex-chtml.js"></script>
<script src="_static/searchtools.js"></script>
<script src="searchindex.js"></script>
</head><body><p>text</p>
<script defer src="_static/scripts/bootstrap.js"></script>
</body></html>"""


def test_no_script_is_left_in_head_to_block_the_first_paint():
    out = site.finish_page(_PAGE, "notebooks/01_gpt2")
    head, body = out.split("</head>")
    assert "data-cfasync" in head and "<script" not in head.replace('<script data-cfasync="false">', "")
    assert "fontawesome.js" not in out and "searchtools.js" not in out and "searchindex.js" not in out
    order = [m.group(0) for m in re.finditer(r"documentation_options|DOCUMENTATION_OPTIONS\.pagename|tex-chtml", body)]
    assert order == ["documentation_options", "DOCUMENTATION_OPTIONS.pagename", "tex-chtml"]
    assert body.index("tex-chtml") < body.index("</body>")
    search = site.finish_page(_PAGE, "search")
    assert "searchtools.js" in search.split("</head>")[1] and "searchindex.js" in search


def test_bibliography_labels_are_author_and_year_with_links():
    from pybtex.database import parse_string

    bib = parse_string("""
@article{a, title={One}, author={Vaswani, Ashish and Shazeer, Noam and Parmar, Niki}, year={2017},
         journal={arXiv preprint arXiv:1706.03762}}
@article{b, title={Two}, author={Hendrycks, Dan and Gimpel, Kevin}, year={2016}, journal={J}}
@misc{c, title={Three}, author={Karpathy, Andrej}, year={2022}, howpublished={Software, github.com/karpathy/nanoGPT}}
@misc{d, title={Four}, author={Karpathy, Andrej}, year={2022}, note={x}}
""", "bibtex")
    style = site._bibliography_style()()
    entries = {e.key: e for e in style.format_entries(bib.entries.values())}
    labels = {k: e.label for k, e in entries.items()}
    assert labels["a"] == "Vaswani et al., 2017" and labels["b"] == "Hendrycks and Gimpel, 2016"
    assert {labels["c"], labels["d"]} == {"Karpathy, 2022a", "Karpathy, 2022b"}
    html = {k: e.text.render_as("html") for k, e in entries.items()}
    assert '<a href="https://arxiv.org/abs/1706.03762">arXiv:1706.03762</a>' in html["a"]
    assert '<a href="https://github.com/karpathy/nanoGPT">github.com/karpathy/nanoGPT</a>' in html["c"]


def test_the_icon_cut_keeps_the_classes_used_and_the_icons_written_as_characters():
    css = ('.fa-bars:before{content:"\\f0c9"}.fa-a:before,.fa-list:before{content:"\\f03a"}'
           '.fa-unused:before{content:"\\f000"}html{--pst-icon-info:"\uf05a"}.x:after{content:"\\f107"}')
    assert site._icon_codepoints(css, {"fa-bars", "fa-list"}) == {0xF0C9, 0xF03A, 0xF05A, 0xF107}
