"""The web book: builds offline with -W -n, is self-contained, and every slider works.

The build runs once per session (a temporary output folder); the browser test
opens every built page in headless Debian Chromium, driven by Playwright.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from book_site import CHROMIUM_ARGS, ROOT, build_book, chromium_path, serve
from gpt2k3.accounting import count_params
from gpt2k3.archs import GPT2_SMALL, K3_TOTAL_PARAMS

pytestmark = pytest.mark.book


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    html, log = build_book(tmp_path_factory.mktemp("book"))
    return html, log


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
    assert (html / "_static" / "plotly.min.js").stat().st_size > 1_000_000
    assert (html / "_static" / "mathjax" / "tex-chtml.js").exists()


def test_landing_page_numbers_are_computed(site):
    html, _ = site
    page = (html / "book" / "intro.html").read_text()
    gpt2 = count_params(GPT2_SMALL).total
    assert f"{gpt2:,}" in page
    assert f"{int(K3_TOTAL_PARAMS // round(gpt2, -6)):,}" in page
    assert f"{K3_TOTAL_PARAMS / gpt2:,.0f}" in page


def test_no_page_references_another_site_for_a_resource(site):
    html, _ = site
    resource = re.compile(r'<(script|img|iframe|source|link)\b[^>]*?(src|href)="(https?:)?//[^"]*"', re.I)
    for page in _pages(html):
        text = page.read_text()
        hits = [m.group(0) for m in resource.finditer(text)
                if not (m.group(1).lower() == "link" and 'rel="stylesheet"' not in m.group(0)
                        and "preload" not in m.group(0))]
        assert not hits, f"{page.relative_to(html)} loads from another site: {hits[:3]}"


def test_plotly_figures_render_as_divs(site):
    html, _ = site
    page = (html / "notebooks" / "01_gpt2.html").read_text()
    assert page.count('class="plotly-graph-div"') >= 2
    assert "_static/plotly.min.js" in page
    assert "application/vnd.plotly.v1+json" not in page  # rendered, not dumped


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


@pytest.mark.browser
@pytest.mark.parametrize("mode", ["light", "dark"])
def test_listings_scroll_in_their_own_box_on_a_phone(site, tmp_path, mode):
    """At 390 px a listing line wider than the column scrolls inside the listing, and neither
    the listing nor its caption reaches past the column; in light and dark mode alike. The
    page of listings alone ("Kimi K3 in one sitting") never scrolls sideways."""
    chromium = chromium_path()
    if chromium is None:
        pytest.fail("Debian chromium is not installed (the README's test command installs it)")
    from playwright.sync_api import sync_playwright

    html, _ = site
    pages = sorted(_listing_pages(html))
    assert pages
    problems = []
    with serve(html) as base, sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=chromium, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 390, "height": 844})
        page = ctx.new_page()
        for rel in pages:
            page.goto(base + rel, wait_until="load")
            page.evaluate(f"document.documentElement.dataset.theme = '{mode}'")
            scroll, client, boxes = page.evaluate(_LISTING_BOXES_JS)
            if rel.endswith("12_k3_in_one_sitting.html") and scroll > client:
                problems.append(f"{rel}: the page scrolls sideways at 390 px ({scroll} > {client})")
            bad = [b for b in boxes if b != ["pre", "auto", True, True]]
            if bad:
                problems.append(f"{rel}: {len(bad)} listings wrap or overflow the column: {bad[:3]}")
        ctx.close()
    assert not problems, "\n".join(problems)


_FIGURES_JS = """
() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => ({
  id: gd.id, sliders: (gd.layout.sliders || []).map(s => ({n: s.steps.length, active: s.active || 0}))
}))
"""


@pytest.mark.browser
def test_every_page_renders_and_every_slider_moves_its_figure(site, tmp_path, capsys):
    chromium = chromium_path()
    if chromium is None:
        pytest.fail("Debian chromium is not installed (the README's test command installs it)")
    from playwright.sync_api import sync_playwright

    html, _ = site
    pages = _pages(html)
    problems: list[str] = []
    opened = moved = figures_seen = math_pages = 0
    with serve(html) as base, sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=chromium, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900})

        def route(r):
            url = r.request.url
            if url.startswith(base) or url.startswith(("data:", "blob:")):
                r.continue_()
            else:
                problems.append(f"request to another site: {url}")
                r.abort()

        ctx.route("**/*", route)
        for path in pages:
            rel = path.relative_to(html).as_posix()
            page = ctx.new_page()
            page.on("pageerror", lambda e, rel=rel: problems.append(f"{rel}: page error {e}"))
            page.on("console", lambda m, rel=rel: m.type == "error" and problems.append(
                f"{rel}: console error {m.text}"))
            page.on("requestfailed", lambda r, rel=rel: problems.append(
                f"{rel}: failed request {r.url} ({r.failure})"))
            page.on("response", lambda r, rel=rel: r.status >= 400 and problems.append(
                f"{rel}: HTTP {r.status} for {r.url}"))
            page.goto(base + rel, wait_until="load")
            page.wait_for_load_state("networkidle")
            opened += 1
            if page.locator("div.math, span.math").count():
                page.wait_for_selector("mjx-container", timeout=15000)
                math_pages += 1
            for fig in page.evaluate(_FIGURES_JS):
                figures_seen += 1
                for i, slider in enumerate(fig["sliders"]):
                    moved += _move_slider(page, fig["id"], i, slider, problems, rel)
            page.close()
        ctx.close()
    with capsys.disabled():
        print(f"\n[browser] pages opened: {opened}, figures: {figures_seen}, sliders moved: {moved}, "
              f"pages with rendered math: {math_pages}")
    assert not problems, "\n".join(problems)
    assert opened == len(pages) and moved >= 2 and math_pages >= 1


def _move_slider(page, div_id: str, index: int, slider: dict, problems: list[str], rel: str) -> int:
    """Click slider ``index`` of figure ``div_id`` at another step; check the data changed."""
    target = slider["n"] - 1 if slider["active"] != slider["n"] - 1 else 0
    gd = page.locator(f"#{div_id}")
    group = gd.locator(".slider-container").nth(index)
    tick = group.locator(".slider-tick-rect").nth(target)
    rail = group.locator(".slider-rail-touch-rect")
    rail.scroll_into_view_if_needed()
    before = page.evaluate("id => JSON.stringify(document.getElementById(id).data)", div_id)
    t, r = tick.bounding_box(), rail.bounding_box()
    page.mouse.click(t["x"] + t["width"] / 2, r["y"] + r["height"] / 2)
    try:
        page.wait_for_function(
            "([id, before]) => JSON.stringify(document.getElementById(id).data) !== before",
            arg=[div_id, before], timeout=5000)
    except Exception:
        problems.append(f"{rel}: slider {index} of figure {div_id} did not change the plotted data")
        return 0
    active = page.evaluate(f"id => document.getElementById(id).layout.sliders[{index}].active", div_id)
    if active != target:
        problems.append(f"{rel}: slider {index} of {div_id} is at step {active}, expected {target}")
    return 1
