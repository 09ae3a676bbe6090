"""The live panel (book/live.md) in headless Chromium: each model writes, greedy, the bytes
PyTorch's ``generate`` writes; the bytes it holds equal the accounting's; nothing leaves
127.0.0.1; and the page's first load fetches no runtime or model file.

Two sites are tested: a minimal page around the panel that the test builds itself
(:func:`gpt2k3.book.live.stage.harness`: no book build needed), and the built book's page when
``_build/html`` holds one (skipped otherwise). Models the package does not ship are skipped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from book_site import CHROMIUM_ARGS, ROOT, chromium_path, serve

playwright = pytest.importorskip("playwright.sync_api")

from gpt2k3.book.live import export as ex  # noqa: E402
from gpt2k3.book.live import stage  # noqa: E402
from gpt2k3.model import generate  # noqa: E402

pytestmark = pytest.mark.browser
PROMPT = "And it came to pass, when "
N_NEW = 32
LAZY = re.compile(r"/_static/live/(ort|models)/")


def _models() -> dict:
    from importlib import resources
    path = resources.files("gpt2k3") / "checkpoints" / ex.MANIFEST
    return json.loads(path.read_text())["models"] if path.is_file() else {}


@pytest.fixture(scope="module")
def chromium():
    exe = chromium_path()
    if exe is None:
        pytest.skip("no Chromium (scripts/test.sh installs Debian's chromium)")
    with playwright.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def harness_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("live_site")
    try:
        stage.harness(site)
    except FileNotFoundError as err:
        pytest.skip(str(err))
    return site, "index.html"


@pytest.fixture(scope="module")
def book_site():
    html = ROOT / "_build" / "html"
    if not (html / "book" / "live.html").is_file() or not (html / "_static" / "live" / "ort").is_dir():
        pytest.skip("no built book with the live panel in _build/html (bash scripts/book.sh)")
    return html, "book/live.html"


def _run(browser, site, width: int, key: str, *, theme: str = "light", shot: str | None = None):
    root, page_path = site
    with serve(root) as base:
        page = browser.new_page(viewport={"width": width, "height": 900})
        requests = []
        page.on("request", lambda r: requests.append(r.url))
        page.goto(base + page_path)
        page.evaluate(f"document.documentElement.setAttribute('data-theme', '{theme}')")
        page.wait_for_selector("#live-go")
        first = list(requests)
        page.fill("#live-prompt", PROMPT)
        page.select_option("#live-model", key)
        page.select_option("#live-mode", "greedy")
        page.fill("#live-count", str(N_NEW))
        page.locator("#live-go").scroll_into_view_if_needed()
        page.click("#live-go")
        if shot:
            page.wait_for_function("(document.querySelector('#live-output').dataset.ids || '').split(',').length >= 8",
                                   timeout=120000)
            page.screenshot(path=shot, full_page=True)
        page.wait_for_selector('#live-status[data-state="done"], #live-status[data-state="error"]',
                               timeout=120000)
        result = page.evaluate("""() => ({
            status: document.querySelector('#live-status').textContent,
            ids: document.querySelector('#live-output').dataset.ids || '',
            tokens: +document.querySelector('#live-memory').dataset.tokens,
            measured: +document.querySelector('#live-memory').dataset.measured,
            accounting: +document.querySelector('#live-memory').dataset.accounting,
            firstMs: +document.querySelector('#live-stats').dataset.firstMs,
            tps: +document.querySelector('#live-stats').dataset.tps,
            downloaded: JSON.parse(document.querySelector('#live-status').dataset.downloaded || '{}'),
            overflow: document.documentElement.scrollWidth > window.innerWidth + 1})""")
        page.close()
    return first, requests, base, result


@pytest.mark.parametrize("width", [1400, 390])
@pytest.mark.parametrize("key", list(ex.MODELS))
def test_panel_writes_the_pytorch_greedy_bytes_and_holds_the_accounted_bytes(chromium, harness_site, key, width):
    entry = _models().get(key)
    if entry is None:
        pytest.skip(f"{key} is not exported (python scripts/export_onnx.py --only {key})")
    if width == 390 and key != list(_models())[-1]:
        pytest.skip("one model at 390 px keeps the suite short (the layout is the same)")
    first, requests, base, got = _run(chromium, harness_site, width, key)
    assert got["status"].startswith("Done"), got["status"]
    model, _ = ex.load_panel_model(key)
    prompt = list(PROMPT.encode())
    want = generate(model, torch.tensor([prompt]), N_NEW, temperature=0)[0, len(prompt):].tolist()
    assert [int(x) for x in got["ids"].split(",")] == want
    acc = entry["accounting"]
    assert got["tokens"] == len(prompt) + N_NEW - 1
    assert got["measured"] == got["accounting"] == acc["fixed"] + acc["per_token"] * got["tokens"]
    assert not [u for u in first if LAZY.search(u)], "the first load fetched the runtime or a model"
    assert all(u.startswith(base) for u in requests), [u for u in requests if not u.startswith(base)]
    assert entry["file"] in got["downloaded"] and "ort-wasm-simd-threaded.wasm.gz" in got["downloaded"]
    assert not got["overflow"], f"the page scrolls sideways at {width} px"


def test_interference_demo_stores_the_newest_pair_and_beats_the_additive_rule(chromium, harness_site):
    root, page_path = harness_site
    with serve(root) as base:
        page = chromium.new_page(viewport={"width": 390, "height": 800})
        page.goto(base + page_path)
        out = page.locator("#live-interference")
        page.locator("#live-n").fill("1")
        assert float(out.get_attribute("data-additive")) < 1e-9
        assert float(out.get_attribute("data-delta")) < 1e-9
        page.locator("#live-n").fill("12")
        page.locator("#live-d").fill("16")
        assert float(out.get_attribute("data-delta")) < float(out.get_attribute("data-additive"))
        page.close()


def test_built_book_page(chromium, book_site):
    key = next(iter(_models()), None)
    if key is None:
        pytest.skip("no exported model")
    first, requests, base, got = _run(chromium, book_site, 1400, key)
    assert got["status"].startswith("Done"), got["status"]
    assert not [u for u in first if LAZY.search(u)]
    assert all(u.startswith(base) for u in requests)
    acc = _models()[key]["accounting"]
    assert got["measured"] == acc["fixed"] + acc["per_token"] * got["tokens"]


def test_without_webassembly_the_page_says_so_and_shows_the_static_figures(chromium, harness_site):
    root, page_path = harness_site
    with serve(root) as base:
        page = chromium.new_page(viewport={"width": 390, "height": 800})
        page.add_init_script("delete window.WebAssembly")
        page.goto(base + page_path)
        page.wait_for_selector("#live-panel .live-status")
        assert "no WebAssembly" in page.inner_text("#live-panel")
        assert page.locator("#live-fallback").is_visible()
        assert page.locator("#live-go").count() == 0
        page.close()
