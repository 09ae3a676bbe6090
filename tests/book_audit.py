"""Measure the built book in headless Chromium as a reader sees it: every figure's text layout,
sideways scrolling, dark-mode figures, page weight and first paint.

Used by the browser tests in ``tests/test_book.py`` (one browser, one built site) and runnable
on its own over any built site, to compare two builds::

    python tests/book_audit.py _build/html            # prints the counts at 1400 px and 390 px
    python tests/book_audit.py _build/html --json out.json

Figure text elements are the title lines, axis titles, legend entries, slider labels (the
step labels and the current value), annotations (subplot titles are annotations), colour-bar
titles and bars, and tick labels; in the web book a figure's title, legend and slider are
HTML beside the plot (``.pf-text``), measured the same way.  Two elements *collide* when their
boxes overlap by more than a pixel each way (tick labels of one axis with each other included);
one is *cut* when it reaches past the figure's box or the viewport; a panel's tick labels or
axis titles *intrude* when they reach into another panel's plot area.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

WIDTHS = {"desktop": (1400, 900), "phone": (390, 844)}

#: Every figure on the page: its text elements, its plot areas and its box (page coordinates
#: relative to the viewport; the page is scrolled to the figure first by the caller when needed).
FIGURE_TEXT_JS = r"""
() => {
  const figs = [];
  const vw = document.documentElement.clientWidth;
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  // the four corners of an SVG text as drawn (rotated tick labels and axis titles included)
  const quad = e => {
    if (e.tagName !== 'text' || !e.getBBox || !e.getScreenCTM) return null;
    const b = e.getBBox(), m = e.getScreenCTM();
    if (!m || (Math.abs(m.b) < 1e-6 && Math.abs(m.c) < 1e-6)) return null;   // not rotated
    return [[b.x, b.y], [b.x + b.width, b.y], [b.x + b.width, b.y + b.height], [b.x, b.y + b.height]]
      .map(([x, y]) => [m.a * x + m.c * y + m.e, m.b * x + m.d * y + m.f]);
  };
  const visible = e => {
    for (let n = e; n && n.nodeType === 1; n = n.parentElement) {
      const s = getComputedStyle(n);
      if (s.display === 'none' || s.visibility === 'hidden' || +s.opacity === 0) return false;
    }
    const r = e.getBoundingClientRect();
    return r.width > 0.5 && r.height > 0.5 && (e.tagName === 'rect' || (e.textContent || '').trim() !== '');
  };
  document.querySelectorAll('.js-plotly-plot').forEach((gd, index) => {
    const svg = gd.querySelector('svg.main-svg');
    if (!svg || !gd._fullLayout) return;
    const wrap = gd.closest('.pf') || gd;
    const els = [];
    const add = (e, kind, owner, key) => {
      if (!visible(e)) return;
      const cs = getComputedStyle(e);
      // the size drawn: plotly shrinks a bar label that does not fit with a scale() transform
      const m = e.getScreenCTM ? e.getScreenCTM() : null;
      const scale = m ? Math.sqrt(Math.abs(m.a * m.d - m.b * m.c)) : 1;
      els.push({kind, owner, key, text: (e.textContent || '').trim().slice(0, 60), box: box(e), quad: quad(e),
                size: (parseFloat(e.getAttribute('font-size') || cs.fontSize) || 0) * scale});
    };
    let n = 0;
    const lines = (t, kind, owner) => {
      const key = 't' + (n++);
      const parts = t.querySelectorAll('tspan.line');
      if (parts.length) parts.forEach(p => add(p, kind, owner, key)); else add(t, kind, owner, key);
    };
    gd.querySelectorAll('text.gtitle').forEach(t => lines(t, 'title', ''));
    gd.querySelectorAll('g.infolayer > g[class$="title"] > text').forEach(t => {
      const c = t.getAttribute('class') || '';
      if (c !== 'gtitle') lines(t, 'axis-title', c.replace('title', ''));
    });
    gd.querySelectorAll('g.legend text.legendtext').forEach(t => lines(t, 'legend', ''));
    gd.querySelectorAll('g.slider-container text.slider-label').forEach(t =>
      lines(t, t.closest('g.slider-labels') ? 'slider-label' : 'slider-value', ''));
    gd.querySelectorAll('g.annotation text.annotation-text').forEach(t => lines(t, 'annotation', ''));
    gd.querySelectorAll('g.colorbar').forEach((cb, i) => {
      cb.querySelectorAll('g.cbtitle text').forEach(t => lines(t, 'colorbar-title', 'cb' + i));
      cb.querySelectorAll('g.cbaxis text').forEach(t => lines(t, 'colorbar-tick', 'cb' + i));
      cb.querySelectorAll('rect.cbfill').forEach(r => add(r, 'colorbar', 'cb' + i, 'cbfill' + i));
    });
    // numbers printed on the data (bar and point labels): checked for size and cut, not paired
    gd.querySelectorAll('g.trace text.bartext, g.trace g.textpoint text').forEach(t => lines(t, 'value-label', ''));
    gd.querySelectorAll('g.xaxislayer-above > g, g.yaxislayer-above > g').forEach(g => {
      const c = g.getAttribute('class') || '';
      const m = c.match(/^([xy]\d*)tick$/);
      if (m) g.querySelectorAll('text').forEach(t => lines(t, 'tick', m[1]));
    });
    wrap.querySelectorAll('.pf-text').forEach(e => {
      els.push({kind: e.dataset.pfKind || 'html', owner: '', key: 'h' + (n++),
                text: (e.textContent || '').trim().slice(0, 60), box: box(e),
                size: parseFloat(getComputedStyle(e).fontSize) || 0});
    });
    const fl = gd._fullLayout, s = box(svg);
    const plots = Object.entries(fl._plots || {}).map(([id, p]) => ({
      id, x: p.xaxis._id, y: p.yaxis._id,
      box: [s[0] + p.xaxis._offset, s[1] + p.yaxis._offset,
            s[0] + p.xaxis._offset + p.xaxis._length, s[1] + p.yaxis._offset + p.yaxis._length]}));
    figs.push({index, id: gd.id, elements: els, plots, svg: s, wrap: box(wrap), viewport: vw,
               bg: getComputedStyle(svg).backgroundColor, paper: fl.paper_bgcolor,
               plotbg: fl.plot_bgcolor});
  });
  return figs;
}
"""

PAGE_JS = r"""
() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const res = performance.getEntriesByType('resource');
  const fcp = performance.getEntriesByName('first-contentful-paint')[0];
  const blocking = res.filter(r => r.renderBlockingStatus === 'blocking' && r.initiatorType === 'script')
                      .map(r => r.name);
  const bytes = (nav ? nav.decodedBodySize : 0) + res.reduce((a, r) => a + (r.decodedBodySize || 0), 0);
  const js = res.filter(r => /\.js(\?|$)/.test(r.name)).reduce((a, r) => a + (r.decodedBodySize || 0), 0);
  return {scroll: document.documentElement.scrollWidth, client: document.documentElement.clientWidth,
          bytes, js, fcp: fcp ? fcp.startTime : null, blocking,
          resources: res.map(r => [r.name, r.decodedBodySize || 0])};
}
"""

#: Wait until every figure on the page is drawn (plotly.js may load after the page).
FIGURES_DRAWN_JS = """
() => Array.from(document.querySelectorAll('.plotly-graph-div')).every(
  gd => gd._fullLayout && gd.querySelector('svg.main-svg') && !gd.dataset.pfPending)
"""


def _overlap(a, b, tol=1.0) -> bool:
    return min(a[2], b[2]) - max(a[0], b[0]) > tol and min(a[3], b[3]) - max(a[1], b[1]) > tol


def _corners(el) -> list:
    if el.get("quad"):
        return el["quad"]
    x0, y0, x1, y1 = el["box"]
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


def _quads_overlap(p, q, tol=1.0) -> bool:
    """Whether two convex quadrilaterals overlap by more than ``tol`` px (separating axes)."""
    for poly in (p, q):
        for i in range(4):
            (x0, y0), (x1, y1) = poly[i], poly[(i + 1) % 4]
            nx, ny = y0 - y1, x1 - x0
            norm = (nx * nx + ny * ny) ** 0.5 or 1.0
            nx, ny = nx / norm, ny / norm
            a = [nx * x + ny * y for x, y in p]
            b = [nx * x + ny * y for x, y in q]
            if min(max(a), max(b)) - max(min(a), min(b)) <= tol:
                return False
    return True


def _collide(a: dict, b: dict) -> bool:
    if not _overlap(a["box"], b["box"]):
        return False
    if a.get("quad") or b.get("quad"):
        return _quads_overlap(_corners(a), _corners(b))
    return True


#: The kinds of text the web book draws as HTML around the plot (figures.js); the rest is SVG.
HTML_KINDS = ("title", "legend", "slider-value", "slider-label")


@dataclass
class FigureReport:
    page: str
    label: str
    collisions: list = field(default_factory=list)
    cut: list = field(default_factory=list)
    intrusions: list = field(default_factory=list)
    small: list = field(default_factory=list)


def analyse_figure(page: str, label: str, fig: dict, min_font: float = 9.0) -> FigureReport:
    """Collisions, cut elements and panel intrusions of one figure measured by FIGURE_TEXT_JS."""
    rep = FigureReport(page, label)
    els = fig["elements"]
    w, s = fig["wrap"], fig["svg"]
    if s[0] < w[0] - 1 or s[2] > w[2] + 1 or s[2] > fig["viewport"] + 1:
        rep.cut.append(("plot", f"the plot ({s[2] - s[0]:.0f} px) reaches past its figure's box"))
    outer = fig["wrap"]
    lo = max(outer[0], fig["svg"][0]) - 1
    hi_x = min(outer[2], fig["svg"][2]) + 1
    vw = fig["viewport"] + 1
    for i, a in enumerate(els):
        for b in els[i + 1:]:
            if a["key"] == b["key"] or "value-label" in (a["kind"], b["kind"]):
                continue
            if _collide(a, b):
                rep.collisions.append((a["kind"], a["text"], b["kind"], b["text"]))
        x0, y0, x1, y1 = a["box"]
        top, bottom = (outer[1], outer[3]) if a["kind"] in HTML_KINDS else (fig["svg"][1], fig["svg"][3])
        if x0 < lo or x1 > hi_x or x0 < -1 or x1 > vw or y0 < top - 1 or y1 > bottom + 1:
            rep.cut.append((a["kind"], a["text"]))
        if a["kind"] != "colorbar" and 0 < a["size"] < min_font:
            rep.small.append((a["kind"], a["text"], a["size"]))
        if a["kind"] in ("tick", "axis-title") and len(fig["plots"]) > 1:
            for p in fig["plots"]:
                if a["owner"] not in (p["x"], p["y"]) and _overlap(a["box"], p["box"], tol=2.0) \
                        and _collide(a, {"box": p["box"]}):
                    rep.intrusions.append((a["kind"], a["text"], p["id"]))
    return rep


@dataclass
class WidthReport:
    width: int
    figures: list = field(default_factory=list)
    pages: dict = field(default_factory=dict)

    def summary(self) -> dict:
        f = self.figures
        return {
            "width": self.width,
            "figures": len(f),
            "colliding pairs": sum(len(r.collisions) for r in f),
            "colliding pairs, not counting two tick labels": sum(
                sum(1 for c in r.collisions if not (c[0] == c[2] == "tick")) for r in f),
            "figures with collisions": sum(bool(r.collisions) for r in f),
            "cut elements": sum(len(r.cut) for r in f),
            "figures with cut elements": sum(bool(r.cut) for r in f),
            "figures with panel intrusions": sum(bool(r.intrusions) for r in f),
            "text under 9 px": sum(len(r.small) for r in f),
            "pages scrolling sideways": sorted(p for p, v in self.pages.items() if v["scroll"] > v["client"]),
        }


def watch_transfers(ctx, page) -> None:
    """Weigh every page ``page`` opens as a first visit (the browser's cache off): the bytes of
    each response, as Chromium's network layer counts them, go to the page being audited."""
    cdp = ctx.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send("Network.setCacheDisabled", {"cacheDisabled": True})
    cdp._pf_sink = None

    def response(ev):
        if cdp._pf_sink is not None:
            cdp._pf_sink[1][ev["requestId"]] = ev["response"]["url"]

    def finished(ev):
        if cdp._pf_sink is not None:
            sizes, urls = cdp._pf_sink
            sizes.append((urls.get(ev["requestId"], "?"), ev["encodedDataLength"]))

    cdp.on("Network.responseReceived", response)
    cdp.on("Network.loadingFinished", finished)
    page._pf_cdp = cdp


def pages_of(html: Path) -> list[str]:
    return sorted(p.relative_to(html).as_posix() for p in html.rglob("*.html") if "_static" not in p.parts)


def audit_page(page, base: str, rel: str, chapter: str) -> tuple[list[FigureReport], dict, list]:
    """Open ``rel`` on ``page`` (a Playwright page with its viewport set); return the figure
    reports, the page metrics and the raw figure measurements."""
    sizes, urls = [], {}
    cdp = getattr(page, "_pf_cdp", None)
    if cdp is not None:
        cdp._pf_sink = (sizes, urls)
    page.goto(base + rel, wait_until="load")
    page.wait_for_load_state("networkidle")
    # the web book draws a figure when it nears the screen: draw them all, then measure
    page.evaluate("() => window.pfRenderAll ? window.pfRenderAll() : null")
    try:
        page.wait_for_function(FIGURES_DRAWN_JS, timeout=15000)
    except Exception:
        pass
    page.wait_for_timeout(100)
    metrics = page.evaluate(PAGE_JS)
    if cdp is not None:
        # what the page transferred (bytes on the wire; this server does not compress)
        metrics["bytes"] = sum(n for _, n in sizes)
        metrics["js"] = sum(n for u, n in sizes if re.search(r"\.js(\?|$)", u))
        metrics["resources"] = sizes
        cdp._pf_sink = None
    figs = page.evaluate(FIGURE_TEXT_JS)
    reports = [analyse_figure(rel, f"{chapter}.{i + 1}", f) for i, f in enumerate(figs)]
    return reports, metrics, figs


def chapter_of(rel: str) -> str:
    name = Path(rel).stem
    return str(int(name[:2])) if name[:2].isdigit() else name


def audit_site(html: Path, widths=("desktop", "phone"), verbose: bool = False) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from book_site import CHROMIUM_ARGS, chromium_path, serve
    from playwright.sync_api import sync_playwright

    out = {}
    with serve(html) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        for name in widths:
            w, h = WIDTHS[name]
            ctx = browser.new_context(viewport={"width": w, "height": h})
            page = ctx.new_page()
            watch_transfers(ctx, page)
            report = WidthReport(w)
            for rel in pages_of(html):
                figs, metrics, _ = audit_page(page, base, rel, chapter_of(rel))
                report.figures += figs
                report.pages[rel] = metrics
            ctx.close()
            out[name] = report
        browser.close()
    return out


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("html", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    res = audit_site(args.html)
    dump = {}
    for name, rep in res.items():
        s = rep.summary()
        print(f"== {name} ({rep.width} px)")
        for k, v in s.items():
            print(f"  {k}: {v}")
        chapters = {k: v for k, v in rep.pages.items() if k.startswith("notebooks/")}
        mb = [v["bytes"] / 1e6 for v in chapters.values()]
        fcp = [v["fcp"] for v in chapters.values() if v["fcp"] is not None]
        if mb:
            print(f"  chapter page weight: {min(mb):.2f}-{max(mb):.2f} MB "
                  f"(JavaScript {min(v['js'] for v in chapters.values()) / 1e6:.2f}-"
                  f"{max(v['js'] for v in chapters.values()) / 1e6:.2f} MB)")
            print(f"  chapter first contentful paint: {min(fcp):.0f}-{max(fcp):.0f} ms; "
                  f"render-blocking scripts on a chapter page: "
                  f"{max(len(v['blocking']) for v in chapters.values())}")
        if args.verbose:
            for r in rep.figures:
                for kind, items in (("collide", r.collisions), ("cut", r.cut), ("intrude", r.intrusions),
                                    ("small", r.small)):
                    for it in items:
                        print(f"    {r.label:6} {kind:8} {it}")
        dump[name] = {"summary": s, "pages": rep.pages,
                      "figures": [r.__dict__ for r in rep.figures]}
    if args.json:
        args.json.write_text(json.dumps(dump, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
