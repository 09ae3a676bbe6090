"""Sphinx / myst-nb build helpers for the web book (never imported by the chapter notebooks).

Listed in ``_config.yml`` as a Sphinx extension.  It makes the built site self-contained,
light and readable at any width:

* :class:`PlotlyMimeRenderer` -- a myst-nb mime-renderer plugin (entry point group
  ``myst_nb.mime_renderers``).  plotly >= 6 emits only ``application/vnd.plotly.v1+json``
  inside a kernel, which myst-nb does not render by itself: the plugin turns that JSON into a
  ``<figure>`` (:func:`figure_html`) -- the figure's title as its caption, an empty plot
  ``<div>`` with a deterministic id and the figure as JSON -- that the site's
  ``_static/figures.js`` draws (see that file: the title, legend and sliders become HTML that
  wraps at any width, panels stack on a phone, colours follow the theme).  It also gives a
  matplotlib PNG whose output metadata carries ``alt`` and ``caption`` (as
  :mod:`gpt2k3.book.figures.matrices` sets them) that alt text and a caption.
* plotly.js is the partial "cartesian" bundle vendored in ``book/_static/vendor`` (the trace
  types the book's figures use; a figure of another type fails the build), loaded with
  ``defer`` by pages that hold a figure, so text paints before it arrives.
* MathJax 3 is served from ``_static/mathjax`` (the ``django-static-mathjax`` wheel ships
  its ES5 build), only the combined TeX/CHTML component and what it loads on demand, and
  only on pages that have math.
* No script blocks the first paint: the theme's scripts move from ``<head>`` to the end of
  the page (:func:`finish_page`), the Font Awesome SVG script is dropped (the theme's CSS
  draws the same icons from its web fonts), and Sphinx's search scripts load only on the
  search page, whose result snippets show a page's text without its chrome or raw TeX
  (``_static/search-snippets.js``).
* pydata-sphinx-theme 0.17 adds a second top bar holding only a search field to
  sphinx-book-theme's layout unless ``navbar_persistent`` is set: it is set empty.
* Launch buttons (Colab, Binder) appear on notebook pages only.
* The bibliography labels each entry as the text cites it ("Vaswani et al., 2017") and
  links its arXiv identifiers and web addresses (:class:`BookBibliographyStyle`).
* sphinx-thebe with Sphinx 7.4 puts its inline configuration script on the page twice;
  duplicates are dropped.  myst-nb's ipywidgets loader (require.js and the widget manager from
  a CDN) is turned off: live explorers only run in a kernel.
* The landing page (``book/intro.md``, executed by the build) glues its answer to "is it just
  scale?" from :func:`landing_scale`, which reads chapter 11's compute multiplier file as it
  stands: a multiplier, or only a lower bound while GPT-2 has not reached the tiny K3's loss.
"""

from __future__ import annotations

import hashlib
import html
import json
import math
import re
import shutil
from importlib import resources
from pathlib import Path

PLOTLY_MIME = "application/vnd.plotly.v1+json"
#: The partial plotly.js bundle, under ``_static`` (vendored in ``book/_static/vendor``).
PLOTLY_JS = "vendor/plotly-cartesian.min.js"
#: Trace types the cartesian bundle registers (its README lists them).
PLOTLY_TRACES = frozenset({"bar", "box", "contour", "heatmap", "histogram", "histogram2d",
                           "histogram2dcontour", "image", "pie", "scatter", "scatterternary",
                           "violin"})
FIGURES_JS = "figures.js"
SEARCH_JS = "search-snippets.js"
MATHJAX_DIR = "mathjax"
MATHJAX_PATH = f"{MATHJAX_DIR}/tex-chtml.js"
#: What ``tex-chtml.js`` loads: its fonts, TeX extensions it loads when a page uses them, and
#: the accessibility explorer its menu can turn on.  Nothing else of MathJax is shipped.
MATHJAX_FILES = ("tex-chtml.js", "output/chtml/fonts/woff-v2", "input/tex/extensions", "a11y", "sre")

__all__ = ["PlotlyMimeRenderer", "figure_html", "SHARED_TEMPLATES", "plotly_js_version", "mathjax_source", "finish_page",
           "BookBibliographyStyle", "landing_scale", "setup"]

_ALLOWED_TAGS = re.compile(r"&lt;(/?)(b|i|em|sup|sub|br)\s*/?&gt;", re.I)


def _safe_html(text) -> str:
    """Plotly's pseudo-HTML (``<br>``, ``<b>``, ``<sup>``, ...) as safe HTML: those tags kept,
    everything else escaped (the same rule as ``figures.js``)."""
    esc = html.escape("" if text is None else str(text), quote=False)
    return _ALLOWED_TAGS.sub(lambda m: f"<{m.group(1)}{m.group(2).lower()}>", esc)


def _title_of(layout: dict) -> str:
    title = layout.get("title")
    return (title.get("text") if isinstance(title, dict) else title) or ""


#: Templates every page shares (``_static/plotly-templates.js``): a figure whose template is
#: one of these names it instead of carrying 6.5 KB of it.
SHARED_TEMPLATES = ("plotly_white",)
TEMPLATES_JS = "plotly-templates.js"


def _shared_templates() -> dict:
    import plotly.io as pio

    return {name: pio.templates[name].to_plotly_json() for name in SHARED_TEMPLATES}


def _share_arrays(spec: dict) -> dict:
    """``spec`` with every list of numbers or strings (longer than 8) that occurs more than once
    -- the same x values in every slider step -- stored once in ``spec["shared"]`` and named
    by ``{"$s": index}`` where it occurs (``figures.js`` puts them back)."""
    counts: dict[str, int] = {}

    def key(x):
        return json.dumps(x, separators=(",", ":"))

    def flat(x):
        return isinstance(x, list) and len(x) > 8 and all(
            v is None or isinstance(v, (int, float, str)) for v in x)

    def count(x):
        if flat(x):
            counts[key(x)] = counts.get(key(x), 0) + 1
        elif isinstance(x, list):
            for v in x:
                count(v)
        elif isinstance(x, dict):
            for v in x.values():
                count(v)

    count(spec)
    table, index = [], {}

    def swap(x):
        if flat(x):
            k = key(x)
            if counts[k] < 2:
                return x
            if k not in index:
                index[k] = len(table)
                table.append(x)
            return {"$s": index[k]}
        if isinstance(x, list):
            return [swap(v) for v in x]
        if isinstance(x, dict):
            return {k: swap(v) for k, v in x.items()}
        return x

    out = swap(spec)
    if table:
        out["shared"] = table
    return out


def figure_html(figure: dict, key: str) -> str:
    """HTML for one figure: a ``<figure class="pf">`` holding the title as its caption, an
    empty plot div whose id is derived from ``key``, and the figure as JSON (a shared template
    named, repeated arrays stored once), drawn by ``_static/figures.js`` once plotly.js has
    loaded."""
    div_id = "plotly-" + hashlib.sha1(key.encode()).hexdigest()[:12]
    layout = dict(figure.get("layout", {}))
    for name, template in _shared_templates().items():
        if layout.get("template") == template:
            layout["template"] = {"$template": name}
    spec = _share_arrays({"data": figure.get("data", []), "layout": layout,
                          "config": {"displaylogo": False}})
    text = json.dumps(spec, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    text = text.replace("</", "<\\/").replace("<!--", "<\\!--")
    height = int(layout.get("height") or 450)
    title = _title_of(layout)
    return (f'<figure class="pf">'
            f'<figcaption class="pf-title pf-text" data-pf-kind="title"{" hidden" if not title else ""}>'
            f'{_safe_html(title)}</figcaption>'
            f'<div id="{div_id}" class="plotly-graph-div pf-plot" style="min-height:{height}px"></div>'
            f'<script type="application/json" class="pf-spec">{text}</script>'
            f'</figure>')


def _trace_types(figure: dict) -> set[str]:
    return {t.get("type", "scatter") for t in figure.get("data", [])}


class PlotlyMimeRenderer:
    """myst-nb mime renderer for plotly's JSON output, and for a PNG with ``alt`` / ``caption``
    in its output metadata (see the module docstring)."""

    mime_priority_overrides = [(builder, PLOTLY_MIME, 1) for builder in ("html", "dirhtml", "singlehtml")]

    @staticmethod
    def handle_mime(renderer, data, inline):
        if inline:
            return None
        if data.mime_type == PLOTLY_MIME:
            return PlotlyMimeRenderer._plotly(renderer, data)
        if data.mime_type == "image/png":
            return PlotlyMimeRenderer._image(renderer, data)
        return None

    @staticmethod
    def _plotly(renderer, data):
        from docutils import nodes

        figure = data.content if isinstance(data.content, dict) else json.loads(data.string)
        doc = renderer.renderer.document["source"] if hasattr(renderer, "renderer") else ""
        missing = _trace_types(figure) - PLOTLY_TRACES
        if missing:
            renderer.logger.warning(f"plotly trace type(s) {sorted(missing)} are not in the site's "
                                    f"partial plotly.js bundle ({PLOTLY_JS})", subtype="mime", line=data.line)
        key = f"{Path(doc).name}:{data.cell_index}:{data.output_index}"
        return [nodes.raw(text=figure_html(figure, key), format="html",
                          classes=["output", "text_html", "plotly-output"])]

    @staticmethod
    def _image(renderer, data):
        from docutils import nodes

        meta = (data.output_metadata or {}).get("image/png", {})
        alt, caption = meta.get("alt"), meta.get("caption")
        if not alt and not caption:
            return None
        image = renderer.render_image(data)[0]
        image["alt"] = str(alt or caption)
        image["classes"] = list(image.get("classes", [])) + ["nb-image"]
        if not caption:
            return [image]
        # a container, not a docutils figure: Sphinx would number it ("Fig. 1") apart from
        # the plotly figures, which are not numbered
        text = nodes.paragraph(str(caption), str(caption), classes=["nb-caption"])
        return [nodes.container("", image, text, classes=["nb-figure"])]


def plotly_js_version(path: Path) -> str:
    """The plotly.js version a bundle's header names (``v4.1.1`` -> ``"4.1.1"``)."""
    head = Path(path).read_text(encoding="utf-8", errors="replace")[:400]
    m = re.search(r"plotly\.js \([^)]*\) v(\d+\.\d+\.\d+)", head)
    if not m:
        raise ValueError(f"{path} does not look like a plotly.js bundle")
    return m.group(1)


def mathjax_source() -> Path:
    """The directory of MathJax's ES5 build shipped by ``django-static-mathjax``."""
    return Path(str(resources.files("mathjax"))) / "static" / "mathjax" / "es5"


# ------------------------------------------------------------------------------ bibliography
def _bibliography_style():
    """The pybtex style the bibliography uses (registered as ``gpt2k3``): pybtex's ``unsrt``
    entries sorted by author, year and title, labelled by author and year as the text cites
    them, with arXiv identifiers and web addresses as links."""
    from pybtex.richtext import HRef, String, Text
    from pybtex.style.formatting import FormattedEntry
    from pybtex.style.formatting.unsrt import Style
    from pybtex.style.labels import BaseLabelStyle

    def plain(latex: str) -> str:
        return Text.from_latex(latex).render_as("text")

    class AuthorYearLabels(BaseLabelStyle):
        """``Vaswani et al., 2017``, ``Hendrycks and Gimpel, 2016``, ``Radford, 2019``: the
        in-text form of sphinxcontrib-bibtex's ``author_year`` references."""

        def format_labels(self, sorted_entries):
            labels = []
            for e in sorted_entries:
                people = e.persons.get("author") or e.persons.get("editor") or []
                last = [plain(" ".join(p.prelast_names + p.last_names)) for p in people]
                if not last:
                    who = plain(e.fields.get("organization") or e.fields.get("institution") or e.key)
                elif len(last) == 1:
                    who = last[0]
                elif len(last) == 2:
                    who = f"{last[0]} and {last[1]}"
                else:
                    who = f"{last[0]} et al."
                labels.append(f"{who}, {e.fields.get('year', 'n.d.')}")
            # works that share author and year: 2024a, 2024b, ... in the list's order
            for label in set(labels):
                same = [i for i, x in enumerate(labels) if x == label]
                if len(same) > 1:
                    for n, i in enumerate(same):
                        labels[i] = label + "abcdefghijklmnopqrstuvwxyz"[n]
            yield from labels

    link = re.compile(r"(arXiv:(\d{4}\.\d{4,5})(v\d+)?)|(https?://[^\s,;()]+[\w/])"
                      r"|((?:github\.com|huggingface\.co|gitlab\.com)/[\w.\-/]+[\w/])")

    def linkify(text):
        if isinstance(text, String):
            parts, pos, s = [], 0, text.value
            for m in link.finditer(s):
                if m.start() > pos:
                    parts.append(String(s[pos:m.start()]))
                if m.group(1):
                    url = f"https://arxiv.org/abs/{m.group(2)}{m.group(3) or ''}"
                elif m.group(4):
                    url = m.group(4)
                else:
                    url = "https://" + m.group(5)
                parts.append(HRef(url, String(m.group(0))))
                pos = m.end()
            if not parts:
                return text
            if pos < len(s):
                parts.append(String(s[pos:]))
            return Text(*parts)
        if isinstance(text, HRef) or not hasattr(text, "parts"):
            return text
        return text._create_similar([linkify(p) for p in text.parts])

    class BookBibliographyStyle(Style):
        default_label_style = AuthorYearLabels
        default_sorting_style = "author_year_title"

        def format_entry(self, label, entry, bib_data=None):
            fe = super().format_entry(label, entry, bib_data=bib_data)
            return FormattedEntry(fe.key, linkify(fe.text), fe.label)

    return BookBibliographyStyle


def __getattr__(name):  # the style class needs pybtex, imported only when a build asks for it
    if name == "BookBibliographyStyle":
        return _bibliography_style()
    raise AttributeError(name)


# ------------------------------------------------------------------------------ the landing page
def _times(x: float) -> str:
    return f"{x:.1f}×"


def _seeds(n: int) -> str:
    return f"{n} seed" if n == 1 else f"{n} seeds"


def landing_scale(data) -> str:
    """The landing page's sentence on chapter 11's compute multiplier, for whatever
    ``data`` (``benchmarks/results/compute_multiplier.json``) holds now.

    With a multiplier: about how many times the tiny K3's training compute GPT-2 with the
    fan-in start needs to reach the tiny K3's validation loss, the band its seeds give, and
    the budgets and seeds it rests on.  With only a lower bound: that GPT-2 has not reached
    that loss at the largest budget trained, as a ratio of the tiny K3's compute, and on how
    many seeds.  The sentence names no other number; the page says beside it why the Kimi K3
    report's factor is not comparable.
    """
    from gpt2k3.book.figures.text_longer import multiplier_facts  # plotly: only when asked

    facts = multiplier_facts(data)
    who = "GPT-2 with chapter 11's fan-in start"
    budgets = facts["budgets"]
    if not facts["reached"]:
        if facts["lower_bound"] is None:
            raise ValueError("data must hold a multiplier or a lower bound")
        return (f"At that small scale, {who} has not reached the tiny K3's validation loss at "
                f"{_times(facts['lower_bound'])} the tiny K3's training compute, the largest "
                f"budget trained ({_seeds(len(budgets[facts['largest']]))}).")
    m = facts["multiplier"]
    lo, hi = facts["band"]
    if lo is not None and hi is not None:
        band = f"{_times(lo)} to {_times(hi)} across the seeds"
    elif lo is not None:
        band = (f"from {_times(lo)} for its best seed; its worst seed does not get there within "
                f"the budgets")
    else:
        band = "the seeds give no band within the budgets"
    runs = ", ".join(f"{k}× ({_seeds(len(s))})" for k, s in budgets.items())
    runs = " and".join(runs.rsplit(",", 1)) if len(budgets) > 1 else runs
    at_first = math.isclose(m, data["curve"][0]["ratio"]) if data.get("curve") else False
    needs = f"at most {_times(m)}" if at_first else f"about {_times(m)}"
    return (f"At that small scale, {who} needs {needs} the tiny K3's training compute to reach "
            f"the tiny K3's validation loss ({band}). That estimate rests on GPT-2 runs trained "
            f"on {runs} the bytes of chapter 11's runs.")


# ------------------------------------------------------------------------------ pages
def _config_inited(app, config):
    config.mathjax_path = MATHJAX_PATH
    config.nb_ipywidgets_js = {}
    # pydata-sphinx-theme 0.17 defaults navbar_persistent to a search field when it is not set,
    # drawing a second top bar above sphinx-book-theme's header: keep the theme's own header.
    config.html_theme_options = dict(config.html_theme_options or {})
    config.html_theme_options.setdefault("navbar_persistent", [])


def _is_math_script(s) -> bool:
    name = str(getattr(s, "filename", s) or "")
    body = str(getattr(s, "attributes", {}).get("body", ""))
    return name.endswith(MATHJAX_PATH) or body.startswith("window.MathJax")


def _page_context(app, pagename, templatename, context, doctree):
    body = context.get("body", "")
    if "pf-spec" in body:
        app.add_js_file(PLOTLY_JS, priority=200, loading_method="defer")
        app.add_js_file(TEMPLATES_JS, priority=201, loading_method="defer")
        app.add_js_file(FIGURES_JS, priority=202, loading_method="defer")
    if pagename == "search":
        app.add_js_file(SEARCH_JS, priority=900, loading_method="defer")
    scripts = context.get("script_files")
    if scripts:
        # MathJax typesets only elements of class "math" here (the page's sections carry
        # mathjax_ignore): a page without one needs no MathJax
        has_math = 'class="math' in body
        seen, unique = set(), []
        for s in scripts:
            if not has_math and _is_math_script(s):
                continue
            # an inline script is added once with filename None and once with "": same script
            key = (str(getattr(s, "filename", s) or ""), getattr(s, "priority", 0),
                   tuple(sorted((k, str(v)) for k, v in getattr(s, "attributes", {}).items())))
            if key not in seen:
                seen.add(key)
                unique.append(s)
        scripts[:] = unique
    # Colab and Binder open notebooks: the launch buttons belong on pages built from an .ipynb
    if context.get("page_source_suffix") != ".ipynb" and "header_buttons" in context:
        context["header_buttons"] = [b for b in context["header_buttons"]
                                     if b.get("label") != "launch-buttons"]


_SCRIPT = re.compile(r"<script\b[^>]*>.*?</script>\s*", re.S | re.I)
_SEARCH_SCRIPTS = ("_static/searchtools.js", "_static/language_data.js", "searchindex.js")


def finish_page(text: str, pagename: str) -> str:
    """A written page with no script blocking its first paint: every script of ``<head>`` but
    the theme's mode switch moves, in order, to the end of ``<body>``; the Font Awesome SVG
    script goes (the CSS draws the icons); Sphinx's search scripts stay only on the search page."""
    head_end = text.find("</head>")
    body_end = text.rfind("</body>")
    if head_end < 0 or body_end < 0:
        return text
    head, rest = text[:head_end], text[head_end:]
    moved = []

    def take(m):
        tag = m.group(0)
        opening = tag[:tag.find(">") + 1]
        if "data-cfasync" in opening:      # sets light/dark before the first paint: stays
            return tag
        if "fontawesome.js" in opening:
            return ""
        if pagename != "search" and any(s in opening for s in _SEARCH_SCRIPTS):
            return ""
        moved.append(tag.strip())
        return ""

    head = _SCRIPT.sub(take, head)
    if pagename != "search":
        rest = re.sub(r'<script[^>]*(?:searchtools\.js|language_data\.js|searchindex\.js)[^>]*>\s*</script>\s*',
                      "", rest)
    body_end = rest.rfind("</body>")
    return head + rest[:body_end] + "\n".join(moved) + "\n" + rest[body_end:]


def _copy_mathjax(static: Path) -> None:
    src, dst = mathjax_source(), static / MATHJAX_DIR
    if dst.exists():
        shutil.rmtree(dst)
    for rel in MATHJAX_FILES:
        s, d = src / rel, dst / rel
        d.parent.mkdir(parents=True, exist_ok=True)
        if s.is_dir():
            shutil.copytree(s, d)
        else:
            shutil.copy2(s, d)


#: The theme's icon fonts (Font Awesome 6, drawn by pydata-sphinx-theme's CSS) as the site
#: serves them: cut to the icons its pages use (``ICONS_CSS`` points the families at the cuts).
ICON_FONTS = {("Font Awesome 6 Free", 900): "fa-solid-900.ttf",
              ("Font Awesome 6 Free", 400): "fa-regular-400.ttf",
              ("Font Awesome 6 Brands", 400): "fa-brands-400.ttf"}
ICONS_CSS = "icons.css"
_FA_DIR = "vendor/fontawesome/webfonts"


_ICON_RULE = re.compile(r"([^{}]+)\{content:\s*\"\\([0-9a-fA-F]+)\"\}?")


def _icon_codepoints(css: str, names: set[str]) -> set[int]:
    """The icon code points a stylesheet uses: those its icon classes give the classes
    ``names`` (``.fa-bars:before{content:"\\f0c9"}``), and every other private-use code point
    it writes (an admonition's icon, ``--pst-icon-admonition-note: "\\f05a"``)."""
    points = set()
    for selectors, code in _ICON_RULE.findall(css):
        classes = re.findall(r"\.(fa-[a-z0-9-]+):+before", selectors)
        if classes and any(m in names for m in classes):
            points.add(int(code, 16))
    rest = re.sub(r"[^{}]*\.fa-[a-z0-9-]+:+before[^{}]*\{content:\s*\"\\[0-9a-fA-F]+\"\}?", "", css)
    for code in re.findall(r"\\([0-9a-fA-F]{4,5})\b", rest):
        if 0xE000 <= int(code, 16) <= 0xF8FF:
            points.add(int(code, 16))
    points.update(ord(ch) for ch in rest if 0xE000 <= ord(ch) <= 0xF8FF)  # written as characters
    return points


def _subset_icon_fonts(out: Path) -> None:
    """Cut the icon fonts to the icons the site uses: every ``fa-*`` class in a page or in
    one of the theme's scripts (which switch a few icons), written as WOFF next to the
    theme's fonts, and ``_static/icons.css`` pointing the font families at them.  The theme's
    full fonts (275 KB a page) are then never fetched; an icon the cut lacks would fall back
    to them, never to a blank."""
    from fontTools import subset

    static = out / "_static"
    fonts = static / _FA_DIR
    theme_css = static / "styles" / "pydata-sphinx-theme.css"
    if not fonts.is_dir() or not theme_css.exists():
        return
    names = set()
    for f in list(out.rglob("*.html")) + list((static / "scripts").glob("*.js")) + list(static.glob("*.js")):
        names |= set(re.findall(r"\bfa-[a-z0-9-]+", f.read_text(encoding="utf-8", errors="replace")))
    points = set()
    for css in list(static.glob("*.css")) + list((static / "styles").glob("*.css")):
        if css.name != ICONS_CSS:
            points |= _icon_codepoints(css.read_text(encoding="utf-8", errors="replace"), names)
    rules = []
    for (family, weight), ttf in ICON_FONTS.items():
        src = fonts / ttf
        if not src.exists():
            continue
        opts = subset.Options()
        opts.flavor = "woff"          # zlib: no brotli needed
        opts.notdef_outline = True
        font = subset.load_font(str(src), opts)
        cmap = set(font.getBestCmap() or {})
        keep = points & cmap
        if not keep:
            continue
        sub = subset.Subsetter(opts)
        sub.populate(unicodes=sorted(keep))
        sub.subset(font)
        cut = src.with_name(src.stem + "-site.woff")
        subset.save_font(font, str(cut), opts)
        rules.append(f'@font-face {{ font-family: "{family}"; font-style: normal; font-weight: {weight}; '
                     f'font-display: block; src: url("{_FA_DIR}/{cut.name}") format("woff"); '
                     f'unicode-range: {", ".join(f"U+{p:X}" for p in sorted(keep))}; }}')
    (static / ICONS_CSS).write_text(
        "/* Written by gpt2k3.book.sphinx: the theme's icon fonts cut to the icons the site uses. */\n"
        + "\n".join(rules) + "\n", encoding="utf-8")


def _check_plotly_bundle(app, static: Path) -> None:
    from sphinx.util import logging

    import plotly.offline

    bundle = static / PLOTLY_JS
    if not bundle.exists():
        logging.getLogger(__name__).warning(f"the partial plotly.js bundle {PLOTLY_JS} is missing")
        return
    want = plotly.offline.get_plotlyjs_version()
    got = plotly_js_version(bundle)
    if got != want:
        logging.getLogger(__name__).warning(
            f"{PLOTLY_JS} is plotly.js {got} but the installed plotly draws with {want}: "
            f"vendor plotly.js-cartesian-dist-min@{want} into book/_static/vendor")


def _build_finished(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    static = out / "_static"
    static.mkdir(parents=True, exist_ok=True)
    _check_plotly_bundle(app, static)
    (static / TEMPLATES_JS).write_text(
        "window.pfTemplates = " + json.dumps(_shared_templates(), separators=(",", ":")) + ";\n",
        encoding="utf-8")
    _copy_mathjax(static)
    _subset_icon_fonts(out)
    # the Font Awesome SVG script no page loads any more (see finish_page)
    for f in (static / "scripts").glob("fontawesome.js*"):
        f.unlink()
    for page in out.rglob("*.html"):
        if "_static" in page.relative_to(out).parts:
            continue
        pagename = page.relative_to(out).with_suffix("").as_posix()
        text = page.read_text(encoding="utf-8")
        new = finish_page(text, pagename)
        if new != text:
            page.write_text(new, encoding="utf-8")


def setup(app):
    import pybtex.plugin

    pybtex.plugin.register_plugin("pybtex.style.formatting", "gpt2k3", _bibliography_style())
    app.add_css_file(ICONS_CSS, priority=900)
    app.connect("config-inited", _config_inited, priority=900)
    app.connect("html-page-context", _page_context, priority=900)
    app.connect("build-finished", _build_finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "2"}
