"""The README's Jupyter path, tested as a reader uses it.

A real JupyterLab server (bound to 127.0.0.1, with a token) serves copies of the widget-heavy
chapters; headless Chromium opens each one, checks that opening it does not mark it modified,
runs every cell, and checks that no cell failed, that every plotly figure rendered, that the
MyST roles of the prose were rendered rather than shown as literal text, and that changing one
control of the chapter's live explorer changes what the explorer shows.  The tracked notebooks
are never written: the server's root is a temporary folder.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from book_site import CHROMIUM_ARGS, ROOT, chromium_path

pytestmark = pytest.mark.browser

# chapters with a live explorer that has a dropdown (chapter 2: cache growth; chapter 4: interference)
CHAPTERS = ["02_kv_cache.ipynb", "04_deltanet.ipynb"]

_CELLS_DONE_JS = """() => {
  const dialog = document.querySelector('.jp-Dialog .jp-mod-accept');
  if (dialog) { dialog.click(); return false; }
  const panel = window.jupyterapp.shell.currentWidget;
  if (!panel || !panel.content || !panel.sessionContext.session) return false;
  const kernel = panel.sessionContext.session.kernel;
  const code = panel.content.widgets.filter(c => c.model.type === 'code');
  const failed = code.some(c => c.model.outputs.toJSON().some(o => o.output_type === 'error'));
  return kernel && kernel.status === 'idle' && (failed || code.every(c => c.model.executionCount !== null));
}"""

_SUMMARY_JS = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const code = panel.content.widgets.filter(c => c.model.type === 'code');
  const errors = [];
  let plotly = 0;
  code.forEach((c, i) => {
    const outs = c.model.outputs.toJSON();
    outs.forEach(o => {
      if (o.output_type === 'error') errors.push(`cell ${i}: ${o.ename}: ${o.evalue}`);
      if (o.data && o.data['application/vnd.plotly.v1+json']) plotly += 1;
    });
  });
  const md = panel.content.widgets.filter(c => c.model.type === 'markdown')
    .map(c => c.node.innerText).join('\\n');
  return {errors, plotly, rendered: document.querySelectorAll('.jp-Notebook .js-plotly-plot .main-svg').length,
          rawRoles: (md.match(/\\{(glue|term|cite)[^}]*\\}`/g) || []).slice(0, 5),
          dirty: panel.context.model.dirty};
}"""


def _changed_on_open(model: dict, stored: dict) -> list[str]:
    """What JupyterLab changed in a notebook by opening it, beyond one known, harmless edit:
    plotly's JupyterLab renderer adds a PNG snapshot to every figure it draws (that marks the
    notebook modified, and is plotly's behaviour, not the file's)."""
    def norm_cell(c):
        c = dict(c)
        c["source"] = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        c["metadata"] = {k: v for k, v in c.get("metadata", {}).items() if k != "trusted"}
        if "outputs" in c:
            outs = []
            for o in c["outputs"]:
                o = dict(o)
                if "data" in o and "application/vnd.plotly.v1+json" in o["data"]:
                    o["data"] = {k: v for k, v in o["data"].items() if k != "image/png"}
                if isinstance(o.get("text"), list):
                    o["text"] = "".join(o["text"])
                if "data" in o:
                    o["data"] = {k: "".join(v) if isinstance(v, list) and all(isinstance(x, str) for x in v) else v
                                 for k, v in o["data"].items()}
                outs.append(o)
            c["outputs"] = outs
        return c
    changed = []
    if model.get("metadata") != stored.get("metadata"):
        changed.append("notebook metadata")
    if len(model["cells"]) != len(stored["cells"]):
        return changed + ["number of cells"]
    for i, (a, b) in enumerate(zip(model["cells"], stored["cells"])):
        a, b = norm_cell(a), norm_cell(b)
        changed += [f"cell {i} {k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return changed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server over copies of the chapters; stopped in every case."""
    root = tmp_path_factory.mktemp("lab")
    work = root / "notebooks"
    work.mkdir()
    for name in CHAPTERS:
        shutil.copy(ROOT / "notebooks" / name, work / name)
    settings = root / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    # render every cell (JupyterLab 4 otherwise only renders cells scrolled into view)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(root / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(root / "workspaces"), JUPYTER_CONFIG_DIR=str(root / "config"),
               JUPYTER_RUNTIME_DIR=str(root / "runtime"), PYTHONPATH=str(ROOT / "src"))
    port, token = _free_port(), secrets.token_hex(16)
    log = open(root / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={work}", "--LabApp.expose_app_in_browser=True",
         "--LabApp.news_url=", "--LabApp.extension_manager=readonly", "--ServerApp.port_retries=0",
         *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],
        cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"JupyterLab exited:\n{(root / 'server.log').read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError("JupyterLab did not start within 120 s")
                time.sleep(0.5)
        yield base, token, work
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _say(msg: str) -> None:
    if os.environ.get("LIVE_JUPYTER_DEBUG"):
        with open(os.environ["LIVE_JUPYTER_DEBUG"], "a") as f:
            f.write(f"[live] {time.strftime('%H:%M:%S')} {msg}\n")


def test_chapters_run_live_in_jupyterlab(lab, tmp_path, capsys):
    chromium = chromium_path()
    if chromium is None:
        pytest.fail("Debian chromium is not installed (the README's test command installs it)")
    from playwright.sync_api import sync_playwright

    _say("test started")
    base, token, work = lab
    before = {name: (ROOT / "notebooks" / name).read_bytes() for name in CHAPTERS}
    problems: list[str] = []
    counts = {"notebooks": 0, "figures": 0, "controls_changed": 0}
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=chromium, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000})
        _say("browser up")
        ctx.route("**/*", lambda r: r.continue_() if r.request.url.startswith(
            (base, "data:", "blob:")) else (problems.append(f"request to another site: {r.request.url}"), r.abort()))
        for name in CHAPTERS:
            page = ctx.new_page()
            page.on("pageerror", lambda e, name=name: problems.append(f"{name}: page error {e}"))
            _say(f"{name}: opening")
            # a workspace of its own per chapter, so no other notebook is restored beside it
            page.goto(f"{base}/lab/workspaces/{Path(name).stem}/tree/{name}?token={token}", wait_until="load")
            _say(f"{name}: loaded")
            # a second notebook in the same JupyterLab may ask which kernel to start: accept the
            # preferred one (Python 3 (ipykernel)), as a reader would
            page.wait_for_function("""() => {
                const dialog = document.querySelector('.jp-Dialog .jp-mod-accept');
                if (dialog) { dialog.click(); return false; }
                const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
                return !!(w && w.sessionContext && w.sessionContext.isReady
                          && w.sessionContext.session && w.sessionContext.session.kernel);
            }""", timeout=120_000, polling=500)
            page.wait_for_timeout(1500)
            _say(f"{name}: kernel ready")
            opened = page.evaluate(_SUMMARY_JS)
            changed = _changed_on_open(json.loads(page.evaluate(
                "() => JSON.stringify(window.jupyterapp.shell.currentWidget.context.model.toJSON())")),
                json.loads((work / name).read_text()))
            if changed:
                problems.append(f"{name}: opening the notebook changed it: {changed[:5]}")
            if opened["rawRoles"]:
                problems.append(f"{name}: MyST roles shown as literal text: {opened['rawRoles']}")
            page.evaluate("""async () => {
                const app = window.jupyterapp, panel = app.shell.currentWidget;
                app.shell.activateById(panel.id);
                await app.commands.execute('notebook:clear-all-cell-outputs');
                app.commands.execute('notebook:run-all-cells');  // resolves only when every cell ran
            }""")
            cleared = page.evaluate("() => window.jupyterapp.shell.currentWidget.content.widgets"
                                    ".filter(c => c.model.type === 'code').map(c => c.model.executionCount)")
            if cleared and all(n is not None for n in cleared):
                problems.append(f"{name}: run-all did not start (stored execution counts still shown)")
            try:
                page.wait_for_function(_CELLS_DONE_JS, timeout=240_000, polling=1000)
            except Exception:
                if os.environ.get("LIVE_JUPYTER_DEBUG"):
                    page.screenshot(path=os.environ["LIVE_JUPYTER_DEBUG"] + f".{name}.png", full_page=True)
                raise
            page.wait_for_timeout(2000)  # let the last outputs render
            _say(f"{name}: all cells ran")
            ran = page.evaluate(_SUMMARY_JS)
            problems += [f"{name}: {e}" for e in ran["errors"]]
            if ran["plotly"] == 0 or ran["rendered"] < ran["plotly"]:
                problems.append(f"{name}: {ran['rendered']} of {ran['plotly']} plotly figures rendered")
            counts["notebooks"] += 1
            counts["figures"] += ran["rendered"]
            # the live explorer: its output area holds a plotly figure; change a dropdown
            box = page.locator(".jp-OutputArea-output .widget-vbox").filter(
                has=page.locator(".widget-dropdown select")).last
            box.scroll_into_view_if_needed()
            shown = box.locator(".widget-output")
            page.wait_for_function("(el) => el.querySelector('.main-svg') !== null", arg=shown.element_handle(),
                                   timeout=60_000)
            _say(f"{name}: explorer drawn")
            old = shown.inner_html()
            select = box.locator(".widget-dropdown select").first
            n_options, selected = select.evaluate("(el) => [el.options.length, el.selectedIndex]")
            select.select_option(index=(selected + 1) % n_options)
            try:
                page.wait_for_function("([el, old]) => el.innerHTML !== old",
                                       arg=[shown.element_handle(), old], timeout=60_000)
                counts["controls_changed"] += 1
            except Exception:  # noqa: BLE001 - reported below
                problems.append(f"{name}: changing the explorer's dropdown did not change what it shows")
            page.close()
        ctx.close()
    with capsys.disabled():
        print(f"\n[jupyterlab] notebooks run: {counts['notebooks']}, plotly figures rendered: "
              f"{counts['figures']}, explorer controls changed (output changed): {counts['controls_changed']}")
    for name in CHAPTERS:
        assert (ROOT / "notebooks" / name).read_bytes() == before[name], f"{name} was written"
    assert not problems, "\n".join(problems)
    assert counts["notebooks"] == len(CHAPTERS) and counts["controls_changed"] == len(CHAPTERS)
