"""The web book: builds offline with -W -n, is self-contained, light, and reads at any width.

The build runs once per session (a temporary output folder); the browser tests open every
built page in one headless Debian Chromium, driven by Playwright: at 1400 px (no request
leaves the site, no page error, math renders, no script blocks the first paint, a chapter
page weighs at most 4 MiB, no raw MyST markup is left in the text, every slider moves its
figure from the keyboard, no figure's text collides or is cut) and at 390 px (no page scrolls
sideways, no figure's text collides or is cut, in light mode and then in dark, where no figure
or picture stays on a white card).  At both widths no word or number breaks inside a table
cell: a wide table scrolls in its own box.  Figure layout is measured by ``tests/book_audit.py``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

import book_audit
from book_site import CHROMIUM_ARGS, ROOT, build_book, chromium_path, serve
from gpt2k3.accounting import count_params
from gpt2k3.archs import GPT2_SMALL, K3_TOTAL_PARAMS
from gpt2k3.book import colab
from gpt2k3.book import sphinx as book_sphinx

pytestmark = pytest.mark.book


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    html, log = build_book(tmp_path_factory.mktemp("book"))
    return html, log


@pytest.fixture(scope="module")
def browser(site):
    """One Chromium over the one built site, shared by this module's browser tests:
    ``(base URL, browser)``."""
    chromium = chromium_path()
    if chromium is None:
        pytest.fail("Debian chromium is not installed (the README's test command installs it)")
    from playwright.sync_api import sync_playwright

    html, _ = site
    with serve(html) as base, sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        yield base, b
        b.close()


def _pages(html: Path) -> list[Path]:
    return sorted(p for p in html.rglob("*.html") if "_static" not in p.parts)


def test_build_has_no_warnings_and_every_chapter(site):
    html, log = site
    # the kernel's own notice about its transport is not a build warning
    lines = [ln for ln in log.splitlines() if "Kernel is running over TCP" not in ln]
    assert not [ln for ln in lines if "WARNING" in ln or "ERROR" in ln], log[-4000:]
    toc = (ROOT / "_toc.yml").read_text()
    for doc in re.findall(r"file:\s*(\S+)", toc):
        assert (html / f"{doc}.html").exists(), f"{doc} was not built"
    assert (html / "_static" / book_sphinx.PLOTLY_JS).stat().st_size > 1_000_000
    assert not (html / "_static" / "plotly.min.js").exists()  # the partial bundle only
    assert (html / "_static" / "mathjax" / "tex-chtml.js").exists()


def test_landing_page_numbers_are_computed(site):
    html, _ = site
    page = (html / "book" / "intro.html").read_text()
    gpt2 = count_params(GPT2_SMALL).total
    assert f"{gpt2:,}" in page
    assert f"{int(K3_TOTAL_PARAMS // round(gpt2, -6)):,}" in page
    assert f"{K3_TOTAL_PARAMS / gpt2:,.0f}" in page
    # "is it just scale?": chapter 11's compute multiplier as its file holds it, a multiplier or,
    # when GPT-2 never reached the tiny K3's loss, a lower bound (test_landing_scale_* below)
    from gpt2k3.book.results import load

    sentence = book_sphinx.landing_scale(load("compute_multiplier.json"))
    factors = re.findall(r"\d+\.\d×", sentence)
    assert factors and all(f in page for f in factors), factors
    assert "still running" not in page


# ---------------------------------------------------------------- the landing page's sentence
# These need no built site: they read the sentence book/intro.md glues, for every state of
# benchmarks/results/compute_multiplier.json (a background job adds runs to it).

def _multiplier_file(budgets: dict[int, int], bits: dict[int, float], target_bits=(1.70, 1.69, 1.71)):
    """A compute-multiplier file as benchmarks/compute_multiplier.py writes it: GPT-2's seeds per
    budget (a multiple of chapter 11's bytes) with their validation bits, the tiny K3 at 1x."""
    from gpt2k3.experiments import compute

    per_byte = {"gpt2_fan_in": 1.25, "k3": 1.0}
    runs = [{"model": "k3", "seed": s, "multiple": 1, "tokens": 100, "val_bits": b,
             "compute": 100.0} for s, b in enumerate(target_bits)]
    for m, n in budgets.items():
        runs += [{"model": "gpt2_fan_in", "seed": s, "multiple": m, "tokens": 100 * m,
                  "val_bits": bits[m] + 0.02 * s, "compute": 125.0 * m} for s in range(n)]
    found = compute.multiplier([r for r in runs if r["model"] == "gpt2_fan_in"],
                               [r for r in runs if r["model"] == "k3"])
    return {"baseline": "gpt2_fan_in", "target": "k3", "flops_per_byte": per_byte, "runs": runs,
            **found, "complete": False}


def test_landing_scale_names_a_lower_bound_as_the_largest_budget_trained():
    data = _multiplier_file({1: 3, 2: 1}, {1: 2.0, 2: 1.8})
    assert data["multiplier"] is None
    s = book_sphinx.landing_scale(data)
    assert "GPT-2 with chapter 11's fan-in start" in s
    assert f"has not reached the tiny K3's validation loss at {data['lower_bound']:.1f}×" in s
    assert "the largest budget trained (1 seed)" in s
    assert "about" not in s and "more than" not in s
    two = book_sphinx.landing_scale(_multiplier_file({1: 3, 2: 2}, {1: 2.0, 2: 1.8}))
    assert "the largest budget trained (2 seeds)" in two


def test_landing_scale_gives_a_multiplier_its_seed_band_and_budgets():
    data = _multiplier_file({1: 3, 2: 2, 4: 2}, {1: 2.0, 2: 1.75, 4: 1.5})
    m, (lo, hi) = data["multiplier"], data["band"]
    assert m is not None and lo is not None and hi is not None
    s = book_sphinx.landing_scale(data)
    assert f"needs about {m:.1f}× the tiny K3's training compute" in s
    assert f"({lo:.1f}× to {hi:.1f}× across the seeds)" in s
    assert "1× (3 seeds), 2× (2 seeds) and 4× (2 seeds) the bytes of chapter 11's runs" in s


def test_landing_scale_when_the_worst_seed_never_gets_there():
    # the mean reaches the tiny K3's loss at the largest budget; the worst seed does not
    data = _multiplier_file({1: 2, 2: 2}, {1: 2.0, 2: 1.68})
    assert data["multiplier"] is not None and data["band"][1] is None
    s = book_sphinx.landing_scale(data)
    assert f"about {data['multiplier']:.1f}×" in s
    assert "its worst seed does not get there within the budgets" in s


def test_landing_scale_reads_the_file_as_it_stands():
    from gpt2k3.book.results import load

    cm = load("compute_multiplier.json")
    s = book_sphinx.landing_scale(cm)
    key = cm["multiplier"] if cm.get("multiplier") is not None else cm["lower_bound"]
    assert f"{key:.1f}×" in s
    assert "still running" not in s and "more than" not in s


def test_no_page_references_another_site_for_a_resource(site):
    html, _ = site
    resource = re.compile(r'<(script|img|iframe|source|link)\b[^>]*?(src|href)="(https?:)?//[^"]*"', re.I)
    for page in _pages(html):
        text = page.read_text()
        hits = [m.group(0) for m in resource.finditer(text)
                if not (m.group(1).lower() == "link" and 'rel="stylesheet"' not in m.group(0)
                        and "preload" not in m.group(0))]
        assert not hits, f"{page.relative_to(html)} loads from another site: {hits[:3]}"


def test_plotly_figures_render_as_captioned_figures_drawn_after_the_text(site):
    html, _ = site
    page = (html / "notebooks" / "01_gpt2.html").read_text()
    assert page.count('class="plotly-graph-div pf-plot"') >= 2
    assert page.count('<figure class="pf">') == page.count('class="plotly-graph-div pf-plot"')
    assert "application/vnd.plotly.v1+json" not in page  # rendered, not dumped
    for js in (book_sphinx.PLOTLY_JS, book_sphinx.FIGURES_JS):
        tag = re.search(rf'<script[^>]*src="[^"]*_static/{re.escape(js)}[^"]*"[^>]*>', page).group(0)
        assert "defer" in tag, tag
    head = page.split("</head>")[0]
    assert not re.search(r"<script(?![^>]*data-cfasync)", head), "a script in <head> blocks the first paint"
    assert "fontawesome.js" not in page


def test_the_site_ships_only_the_mathjax_it_loads_and_no_unused_script(site):
    html, _ = site
    mathjax = html / "_static" / "mathjax"
    assert sorted(p.name for p in mathjax.iterdir()) == sorted({f.split("/")[0] for f in book_sphinx.MATHJAX_FILES})
    assert not list((html / "_static" / "scripts").glob("fontawesome.js*"))
    # the live page's runtime and models (_static/live) load only when a reader starts its
    # panel (tests/test_live_browser.py checks that no page fetches them before): kept apart
    live = html / "_static" / "live"
    size = sum(f.stat().st_size for f in html.rglob("*") if f.is_file() and live not in f.parents)
    assert size < 30e6, f"the site is {size / 1e6:.1f} MB"
    live_size = sum(f.stat().st_size for f in live.rglob("*") if f.is_file())
    assert live_size < 15e6, f"the live page's runtime and models are {live_size / 1e6:.1f} MB"
    for page in _pages(html):
        text = page.read_text()
        has_math = 'class="math' in text
        assert has_math == ("tex-chtml.js" in text), f"{page.name}: MathJax {'missing' if has_math else 'without math'}"


def test_launch_buttons_only_on_notebook_pages_and_at_the_versions_tag(site):
    html, _ = site
    for page in _pages(html):
        text = page.read_text()
        rel = page.relative_to(html).as_posix()
        links = re.findall(r'href="(https://(?:colab\.research\.google\.com|mybinder\.org)[^"]*)"', text)
        if rel.startswith("notebooks/"):
            nb = Path(rel).with_suffix(".ipynb").name
            assert colab.colab_notebook_url(nb) in links, (rel, links)
            assert any(u.startswith(f"https://mybinder.org/v2/gh/gpt2k3/gpt2-to-kimi-k3/{colab.TAG}?")
                       and u.endswith(f"notebooks/{nb}") for u in links), links
        else:
            assert not links, f"{rel} has launch buttons: {links}"


def test_the_bibliography_names_entries_as_the_text_cites_them_and_links_them(site):
    html, _ = site
    bib = (html / "book" / "bibliography.html").read_text()
    labels = re.findall(r'<span class="label"><span class="fn-bracket">\[</span>(.*?)<span', bib)
    assert len(labels) > 40 and all(re.fullmatch(r".+, \d{4}[a-z]?", x) for x in labels), labels[:5]
    assert "Vaswani <em>et al.</em>, 2017" in (html / "notebooks" / "01_gpt2.html").read_text()
    assert "Vaswani et al., 2017" in labels
    assert '<a class="reference external" href="https://arxiv.org/abs/1706.03762">arXiv:1706.03762</a>' in bib
    assert 'href="https://github.com/karpathy/nanoGPT"' in bib


def test_pictures_have_a_caption_and_alt_text_not_a_file_name(site):
    html, _ = site
    found = 0
    for page in _pages(html):
        for img in re.findall(r"<img\b[^>]*>", page.read_text()):
            if "_images/" not in img:
                continue
            found += 1
            alt = re.search(r'alt="([^"]*)"', img)
            assert alt and len(alt.group(1)) > 30 and "_images" not in alt.group(1) and not alt.group(1).endswith(".png"), img
    assert found >= 2
    text = (html / "notebooks" / "04_deltanet.html").read_text()
    assert re.search(r'<div class="nb-figure[^"]*">\s*<img alt="[^"]{30,}"[^>]*>\s*'
                     r'<p class="nb-caption">A delta-rule write changes one row of the state</p>', text)


def test_one_search_field_and_no_second_top_bar(site):
    html, _ = site
    for name in ("notebooks/01_gpt2.html", "search.html"):
        text = (html / name).read_text()
        header = re.search(r'<header id="pst-header".*?</header>', text, re.S)
        assert not header or "search-button" not in header.group(0), name


_CAPTION = re.compile(r'<p><strong><code class="docutils literal notranslate"><span class="pre">(gpt2k3\.[\w.]+)'
                      r'</span></code></strong> (·|→) (.*?)</p>\s*<div class="highlight-(\w+) notranslate">'
                      r'<div class="highlight"><pre>', re.S)


def _listing_pages(html: Path) -> dict[str, list[tuple[str, str]]]:
    """Each page's code listings: (object shown, highlight language), in page order."""
    out = {}
    for page in _pages(html):
        found = [(m.group(1), m.group(4)) for m in _CAPTION.finditer(page.read_text())]
        if found:
            out[page.relative_to(html).as_posix()] = found
    return out


def test_listings_render_as_highlighted_code_with_their_caption(site):
    """A show_source / show_diff output is a caption naming the object and a highlighted block
    (Pygments' spans inside), not an escaped Markdown string."""
    html, _ = site
    listings = _listing_pages(html)
    k3 = listings.get("notebooks/12_k3_in_one_sitting.html", [])
    assert len(k3) >= 20 and {lang for _, lang in k3} == {"python"}, k3[:5]
    assert ("gpt2k3.model.GPT.forward", "python") in k3
    for rel, found in listings.items():
        text = (html / rel).read_text()
        assert "```" not in text, f"{rel}: a listing was left as raw Markdown"
        assert all(lang in ("python", "diff") for _, lang in found), (rel, found)
        if any(lang == "diff" for _, lang in found):
            assert '<span class="gi">+' in text or '<span class="gd">-' in text, f"{rel}: a diff is not highlighted"
    css = (html / "_static" / "book.css").read_text()
    assert 'div.cell div.cell_output > div[class^="highlight-"] pre' in css


_LISTING_BOXES_JS = """
() => [document.documentElement.scrollWidth, document.documentElement.clientWidth,
       Array.from(document.querySelectorAll('div.cell_output > div[class^="highlight-"]')).map(box => {
         const pre = box.querySelector('pre'), cap = box.previousElementSibling, s = getComputedStyle(pre);
         const w = document.documentElement.clientWidth + 1;
         return [s.whiteSpace, s.overflowX, box.getBoundingClientRect().right <= w,
                 !cap || cap.getBoundingClientRect().right <= w];
       })]
"""


#: Visible prose of the article (code, listings and math left out) with MyST markup that was
#: not rendered: a role (``{glue:text}`name```), a directive fence, a pair of literal
#: backquotes, an IPython object's repr.
_RAW_MARKUP_JS = r"""
() => {
  const root = document.querySelector('article.bd-article') || document.body;
  const clone = root.cloneNode(true);
  clone.querySelectorAll('pre, code, .highlight, mjx-container, script, style, .pf-spec, .cell_input')
       .forEach(e => e.remove());
  const text = clone.textContent;
  const hits = [];
  for (const re of [/\{[a-z]+(?::[a-z-]+)*\}`[^`]*`/g, /(?:```|:::)\s*\{[a-z-]+\}/g, /`[^`\n]{1,80}`/g,
                    /<IPython\.core\.display\.\w+ object>/g]) {
    (text.match(re) || []).slice(0, 3).forEach(m => hits.push(m));
  }
  return hits;
}
"""

#: What of a page's figures and pictures sits on a light background (in dark mode).
_LIGHT_CARDS_JS = r"""
() => {
  const rgb = c => {
    if (!c) return null;
    let m = c.match(/^#([0-9a-f]{6})$/i);
    if (m) return [0, 2, 4].map(i => parseInt(m[1].slice(i, i + 2), 16)).concat([1]);
    m = c.match(/rgba?\(([^)]+)\)/);
    if (!m) return null;
    const p = m[1].split(',').map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const lum = c => { const p = rgb(c); return !p || p[3] === 0 ? null : (0.2126 * p[0] + 0.7152 * p[1] + 0.0722 * p[2]) / 255; };
  const behind = e => {
    for (let n = e; n && n.nodeType === 1; n = n.parentElement) {
      const l = lum(getComputedStyle(n).backgroundColor);
      if (l !== null) return l;
    }
    return 1;
  };
  const bad = [];
  document.querySelectorAll('.js-plotly-plot').forEach(gd => {
    const fl = gd._fullLayout;
    for (const [what, c] of [['paper', fl.paper_bgcolor], ['plot area', fl.plot_bgcolor]]) {
      const l = lum(c);
      if (l !== null && l > 0.5) bad.push(`${gd.id}: ${what} background ${c}`);
    }
    if (behind(gd) > 0.5) bad.push(`${gd.id}: sits on a light card`);
  });
  document.querySelectorAll('.bd-article img').forEach(img => {
    if (!/_images\//.test(img.getAttribute('src') || '')) return;
    const inverted = getComputedStyle(img).filter.includes('invert');
    const own = lum(getComputedStyle(img).backgroundColor);
    if (!inverted || (own !== null && own > 0.5)) bad.push(`${img.getAttribute('src')}: a white picture`);
  });
  return bad;
}
"""

#: In dark mode: figure labels (annotations) under 4.5:1 contrast on the page, and heatmaps
#: whose colour scale keeps white cells.
_DARK_FIGURE_COLOURS_JS = r"""
() => {
  const lin = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
  const parse = c => {
    if (!c) return null;
    let m = c.match(/^#([0-9a-f]{6})$/i);
    if (m) return [0, 2, 4].map(i => parseInt(m[1].slice(i, i + 2), 16));
    m = c.match(/^#([0-9a-f]{3})$/i);
    if (m) return [...m[1]].map(h => parseInt(h + h, 16));
    m = c.match(/rgba?\(([^)]+)\)/);
    return m ? m[1].split(',').slice(0, 3).map(Number) : null;
  };
  const lum = p => 0.2126 * lin(p[0]) + 0.7152 * lin(p[1]) + 0.0722 * lin(p[2]);
  const page = [20, 24, 30];
  const ratio = p => (Math.max(lum(p), lum(page)) + 0.05) / (Math.min(lum(p), lum(page)) + 0.05);
  const bad = [];
  document.querySelectorAll('.js-plotly-plot').forEach(gd => {
    (gd._fullLayout.annotations || []).forEach(a => {
      const p = parse(a.font.color);
      if (p && a.text && a.visible !== false && ratio(p) < 4.5)
        bad.push(`${gd.id}: label "${a.text.slice(0, 30)}" at ${ratio(p).toFixed(1)}:1`);
    });
    (gd._fullData || []).forEach(t => {
      const cs = t.colorscale || (t.marker && t.marker.colorscale);
      if (t.type === 'heatmap' && Array.isArray(cs) && cs.some(([, c]) => { const p = parse(c); return p && lum(p) > 0.8; }))
        bad.push(`${gd.id}: a heatmap keeps white cells`);
    });
  });
  return bad;
}
"""


#: Words and numbers of table cells that the browser broke inside themselves: each run of
#: non-space characters, cut after any hyphen, dash or bar (where a line may break), must lie
#: on one line.  ``overflow-wrap: anywhere`` on a cell broke "38.7 GB" into "38 .7 G B".
_TABLE_SPLITS_JS = r"""
() => {
  const split = [];
  document.querySelectorAll('.bd-article table').forEach(t => {
    t.querySelectorAll('td, th').forEach(cell => {
      const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
      for (let n = walker.nextNode(); n; n = walker.nextNode()) {
        if (n.parentElement.closest('mjx-container, script, style')) continue;
        const re = /\S+/g;
        let m;
        while ((m = re.exec(n.textContent))) {
          let start = m.index;
          for (const piece of m[0].split(/(?<=[-|\u2010\u2013\u2014])/)) {
            const r = document.createRange();
            r.setStart(n, start);
            r.setEnd(n, start + piece.length);
            start += piece.length;
            const rects = Array.from(r.getClientRects()).filter(x => x.width > 0.5 && x.height > 0.5);
            if (rects.length < 2) continue;
            const firstBottom = Math.min(...rects.map(x => x.bottom));
            if (rects.some(x => x.top >= firstBottom - 1)) split.push(piece);
          }
        }
      }
    });
  });
  return split;
}
"""


def _table_splits(page, rel: str, width: int) -> list[str]:
    split = page.evaluate(_TABLE_SPLITS_JS)
    return [f"{rel} at {width} px: {len(split)} words or numbers break inside a table cell: {split[:5]}"] if split else []


#: A chapter page transfers at most this much (everything it loads, uncompressed): 4 MiB.
MAX_CHAPTER_BYTES = 4 * 1024 * 1024


def _layout_problems(reports, width: int) -> list[str]:
    out = []
    for r in reports:
        for kind, items in (("collide", r.collisions), ("are cut", r.cut), ("reach into another panel", r.intrusions),
                            ("are under 9 px", r.small)):
            if items:
                out.append(f"{r.page} figure {r.label} at {width} px: {len(items)} text elements {kind}: {items[:3]}")
    return out


@pytest.mark.browser
def test_every_page_at_1400_px(site, browser, capsys):
    """Every page opens with no request leaving the site and no error, renders its math, has no
    script blocking the first paint and no raw MyST markup; a chapter page weighs at most
    4 MiB; no figure's text collides or is cut; no word or number breaks inside a table cell;
    every slider moves its figure from the keyboard."""
    html, _ = site
    base, b = browser
    problems: list[str] = []
    opened = moved = figures_seen = math_pages = 0
    weights = {}
    ctx = b.new_context(viewport={"width": 1400, "height": 900})

    def route(r):
        url = r.request.url
        if url.startswith(base) or url.startswith(("data:", "blob:")):
            r.continue_()
        else:
            problems.append(f"request to another site: {url}")
            r.abort()

    ctx.route("**/*", route)
    for rel in book_audit.pages_of(html):
        page = ctx.new_page()
        book_audit.watch_transfers(ctx, page)
        page.on("pageerror", lambda e, rel=rel: problems.append(f"{rel}: page error {e}"))
        page.on("console", lambda m, rel=rel: m.type == "error" and problems.append(
            f"{rel}: console error {m.text}"))
        page.on("requestfailed", lambda r, rel=rel: problems.append(
            f"{rel}: failed request {r.url} ({r.failure})"))
        page.on("response", lambda r, rel=rel: r.status >= 400 and problems.append(
            f"{rel}: HTTP {r.status} for {r.url}"))
        reports, metrics, figs = book_audit.audit_page(page, base, rel, book_audit.chapter_of(rel))
        opened += 1
        if page.locator("div.math, span.math").count():
            # attached, not visible: a page's first math may sit in a collapsed dropdown
            page.wait_for_selector("mjx-container", state="attached", timeout=15000)
            math_pages += 1
        if metrics["blocking"]:
            problems.append(f"{rel}: scripts block the first paint: {metrics['blocking']}")
        if rel.startswith("notebooks/"):
            weights[rel] = metrics["bytes"]
            if metrics["bytes"] > MAX_CHAPTER_BYTES:
                problems.append(f"{rel}: transfers {metrics['bytes'] / 1e6:.2f} MB")
        raw = page.evaluate(_RAW_MARKUP_JS)
        if raw:
            problems.append(f"{rel}: raw MyST markup in the text: {raw}")
        if page.locator(".search-button-field:visible").count() > 1:
            problems.append(f"{rel}: more than one search field is shown")
        problems += _layout_problems(reports, 1400)
        problems += _table_splits(page, rel, 1400)
        for k, fig in enumerate(figs):
            figures_seen += 1
            for i, n in enumerate(page.evaluate(
                    "id => (document.getElementById(id).layout.sliders || []).map(s => s.steps.length)", fig["id"])):
                moved += _move_slider(page, fig["id"], i, n, problems, rel, arrow=(k == 0 and i == 0))
        page.close()
    ctx.close()
    with capsys.disabled():
        print(f"\n[browser 1400 px] pages: {opened}, figures: {figures_seen}, sliders moved: {moved}, "
              f"pages with math: {math_pages}, chapter pages {min(weights.values()) / 1e6:.2f}-"
              f"{max(weights.values()) / 1e6:.2f} MB")
    assert not problems, "\n".join(problems)
    assert opened == len(book_audit.pages_of(html)) and figures_seen >= 40 and moved >= 35 and math_pages >= 1


def _move_slider(page, div_id: str, index: int, n: int, problems: list[str], rel: str,
                 arrow: bool = False) -> int:
    """Move slider ``index`` of figure ``div_id`` from the keyboard (End, or Home when it is at
    the end; with ``arrow`` then one arrow step back); check the plotted data changed and the
    slider's step."""
    slider = page.locator(f"#{div_id}-slider-{index}")
    slider.scroll_into_view_if_needed()
    slider.focus()
    active = page.evaluate(f"id => document.getElementById(id).layout.sliders[{index}].active || 0", div_id)
    moves = [("End", n - 1) if active != n - 1 else ("Home", 0)]
    if arrow:
        moves.append(("ArrowLeft", n - 2) if moves[0][1] == n - 1 else ("ArrowRight", 1))
    for key, target in moves:
        if not 0 <= target < n:
            continue
        before = page.evaluate("id => JSON.stringify(document.getElementById(id).data)", div_id)
        page.keyboard.press(key)
        try:
            page.wait_for_function(
                "([id, before]) => JSON.stringify(document.getElementById(id).data) !== before",
                arg=[div_id, before], timeout=5000)
        except Exception:
            problems.append(f"{rel}: {key} on slider {index} of figure {div_id} did not change the plotted data")
            return 0
        now = page.evaluate(f"id => document.getElementById(id).layout.sliders[{index}].active", div_id)
        if now != target:
            problems.append(f"{rel}: after {key}, slider {index} of {div_id} is at step {now}, expected {target}")
    return 1


@pytest.mark.browser
def test_every_page_at_390_px_in_light_and_dark_mode(site, browser, capsys):
    """On a phone no page scrolls sideways, no word or number breaks inside a table cell (a
    wide table scrolls in its own box), and no figure's text collides, is cut or reaches
    into another panel; switched to dark mode, every figure redraws in the theme's colours,
    neither a figure nor a picture stays on a white card, every figure label reads at 4.5:1
    contrast or better and no heatmap keeps white cells.  In both modes a code listing line
    wider than the column scrolls inside the listing, and neither the listing nor its caption
    reaches past the column."""
    html, _ = site
    base, b = browser
    problems: list[str] = []
    figures_seen = listings = 0
    listing_pages = set(_listing_pages(html))
    assert listing_pages
    ctx = b.new_context(viewport={"width": 390, "height": 844})
    page = ctx.new_page()

    def check_listings(rel, mode):
        scroll, client, boxes = page.evaluate(_LISTING_BOXES_JS)
        bad = [x for x in boxes if x != ["pre", "auto", True, True]]
        if bad:
            problems.append(f"{rel} ({mode}): {len(bad)} listings wrap or overflow the column: {bad[:3]}")
        return len(boxes)

    for rel in book_audit.pages_of(html):
        reports, metrics, figs = book_audit.audit_page(page, base, rel, book_audit.chapter_of(rel))
        figures_seen += len(figs)
        if metrics["scroll"] > metrics["client"]:
            problems.append(f"{rel}: scrolls sideways at 390 px ({metrics['scroll']} > {metrics['client']})")
        problems += _layout_problems(reports, 390)
        problems += _table_splits(page, rel, 390)
        if rel in listing_pages:
            listings += check_listings(rel, "light")
        page.evaluate("document.documentElement.dataset.theme = 'dark'")
        if figs:
            page.wait_for_function(
                "() => Array.from(document.querySelectorAll('.js-plotly-plot')).every(gd => "
                "gd._fullLayout.font.color !== '#24292f')", timeout=10000)
        light = page.evaluate(_LIGHT_CARDS_JS)
        problems += [f"{rel} in dark mode: {x}" for x in light]
        problems += [f"{rel} in dark mode: {x}" for x in page.evaluate(_DARK_FIGURE_COLOURS_JS)]
        if rel in listing_pages:
            check_listings(rel, "dark")
    ctx.close()
    assert listings >= 20
    with capsys.disabled():
        print(f"\n[browser 390 px] figures: {figures_seen}")
    assert not problems, "\n".join(problems)
    assert figures_seen >= 40


@pytest.mark.browser
def test_search_finds_pages_and_its_snippets_are_their_text(site, browser):
    """The search page lists results whose snippets are the page's prose: no theme chrome
    (header buttons, the print-only contents), no raw TeX."""
    base, b = browser
    ctx = b.new_context(viewport={"width": 1400, "height": 900})
    page = ctx.new_page()
    page.goto(base + "search.html?q=associative", wait_until="load")
    page.wait_for_selector("#search-results ul.search li p.context", timeout=20000)
    page.wait_for_function("() => !document.querySelector('#search-progress') || "
                           "!document.querySelector('#search-progress').textContent.includes('Preparing')",
                           timeout=20000)
    snippets = page.eval_on_selector_all("#search-results li p.context", "ps => ps.map(p => p.textContent)")
    ctx.close()
    assert snippets
    for text in snippets:
        assert "\\(" not in text and "\\frac" not in text and "\\mathbf" not in text, text
        assert "Contents" not in text[:40] and ".ipynb" not in text and "Launch" not in text, text


@pytest.mark.parametrize("chapter", ["02_kv_cache", "05_parallel_deltanet"])
def test_an_exercise_solution_opens_from_its_dropdown(site, browser, chapter):
    """A chapter's exercise solutions are collapsed: the answer's dropdown and the solution
    cell's toggle are closed when the page opens, and opening them shows the worked answer
    (its glued numbers rendered, no raw role) and the solution's code."""
    html, _ = site
    base, b = browser
    page = b.new_context(viewport={"width": 1400, "height": 900}).new_page()
    page.goto(f"{base}notebooks/{chapter}.html", wait_until="load")
    dropdowns = page.locator("details.sd-dropdown")
    assert dropdowns.count() >= 3, f"{chapter}: {dropdowns.count()} solution dropdowns"
    first = dropdowns.first
    body = first.locator(".sd-summary-content")
    assert first.get_attribute("open") is None and not body.is_visible()
    first.locator("summary").scroll_into_view_if_needed()
    first.locator("summary").click()
    body.wait_for(state="visible")
    text = body.inner_text()
    assert len(text) > 40 and "{glue" not in text and "{cite" not in text, text[:200]
    # the solution cell before it: collapsed by its hide-cell tag, opened by its toggle
    cells = page.locator("div.cell.tag_hide-cell details.hide")
    assert cells.count() >= 3, f"{chapter}: {cells.count()} collapsed solution cells"
    cell = cells.first
    assert cell.get_attribute("open") is None
    cell.locator("summary").scroll_into_view_if_needed()
    cell.locator("summary").click()
    assert "exercises" in cell.inner_text()
    shots = os.environ.get("BOOK_SHOTS")  # a folder to keep a picture of the open solution in
    if shots:
        first.scroll_into_view_if_needed()
        page.screenshot(path=str(Path(shots) / f"solution_open_{chapter}.png"))
    page.close()
