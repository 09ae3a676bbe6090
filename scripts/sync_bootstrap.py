"""Write the book's address and version everywhere they appear, from their one place.

The repository URL is ``gpt2k3.book.colab.REPO_URL`` and the version ``gpt2k3.__version__``
(the bootstrap installs, and the launch buttons open, the tag ``v<version>``).  This script
rewrites, from them:

* the first code cell of every ``notebooks/*.ipynb`` -- the Colab bootstrap,
  ``gpt2k3.book.colab.BOOTSTRAP`` (nothing else of a notebook changes; no outputs change);
* ``_config.yml``'s ``repository.url`` and ``repository.branch`` (the launch buttons link to
  ``<url>/blob/<tag>/notebooks/<notebook>.ipynb`` on Colab and Binder);
* the README's Colab links (``https://colab.research.google.com/github/<owner>/<repo>/blob/<ref>/``),
  its pip install lines (``"gpt2k3 @ git+<url>"``, ``"gpt2k3[oracles] @ git+<url>"``, each
  given ``@<tag>``) and its list of the package's requirements (the backquoted run that
  starts with ``torch>=``).

    python scripts/sync_bootstrap.py           # rewrite what disagrees, say what changed
    python scripts/sync_bootstrap.py --check   # change nothing; exit 1 if anything disagrees

``tests/test_bootstrap.py`` runs the check.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpt2k3.book.colab import BOOTSTRAP, COLAB_URL, PIP_TARGET, REPO_URL, REQUIREMENTS, TAG  # noqa: E402


def notebook_text(text: str) -> str:
    """A notebook's JSON text with its first code cell set to :data:`BOOTSTRAP`, written as
    nbformat writes it (so nothing else of the file changes)."""
    nb = json.loads(text)
    cell = next((c for c in nb["cells"] if c["cell_type"] == "code"), None)
    if cell is None:
        raise ValueError("a chapter notebook must have a code cell for the bootstrap")
    source = BOOTSTRAP.splitlines(keepends=True)
    if "".join(cell["source"]) == BOOTSTRAP:
        return text
    cell["source"] = source
    return json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def config_text(text: str) -> str:
    """``_config.yml`` with ``repository.url`` and ``repository.branch`` set (comments kept)."""
    block = re.search(r"^repository:\n((?:[ \t]+.*\n?)*)", text, re.M)
    if not block:
        raise ValueError("_config.yml has no repository: section")
    body = block.group(1)
    for key, value in (("url", REPO_URL), ("branch", TAG)):
        line = re.compile(rf"^([ \t]+){key}:[^\n#]*?(\s*#.*)?$", re.M)
        if line.search(body):
            body = line.sub(lambda m: f"{m.group(1)}{key}: {value}{m.group(2) or ''}", body, count=1)
        else:
            body = body.rstrip("\n") + f"\n  {key}: {value}\n"
    return text[:block.start(1)] + body + text[block.end(1):]


_COLAB = re.compile(r"https://colab\.research\.google\.com/github/[\w.-]+/[\w.-]+/blob/[\w.-]+/")
_PIP = re.compile(r"(gpt2k3(?:\[[\w,]+\])?\s+@\s+git\+)https://github\.com/[\w.-]+/[\w.-]+?(?:\.git)?(?:@[\w.-]+)?(?=[\"'`\s])")
_REQ = r"`[A-Za-z][\w.-]*[<>=!~]=?[^`]*`"
_REQS = re.compile(rf"`torch[<>=!~][^`]*`(?:,\s+(?:and\s+)?{_REQ})+")


def _requirement_list(m: re.Match) -> str:
    """The backquoted requirements, in step with REQUIREMENTS, wrapped where the old list was."""
    seps = re.findall(r",\s+(?:and\s+)?", m.group(0))
    new = [f"`{r}`" for r in REQUIREMENTS]
    out = new[0]
    for i, item in enumerate(new[1:]):
        out += (seps[i] if i < len(seps) else ", ") + item
    return out


def readme_text(text: str) -> str:
    """The README with its Colab links, install lines and requirement list in step."""
    owner_repo = REPO_URL.removeprefix("https://github.com/")
    text = _COLAB.sub(f"{COLAB_URL}/github/{owner_repo}/blob/{TAG}/", text)
    text = _PIP.sub(lambda m: m.group(1) + PIP_TARGET.split(" @ git+", 1)[1], text)
    return _REQS.sub(_requirement_list, text)


def plan(root: Path = ROOT) -> dict[Path, tuple[str, str]]:
    """``{path: (old text, new text)}`` for every file this script writes."""
    out = {}
    for nb in sorted((root / "notebooks").glob("*.ipynb")):
        old = nb.read_text(encoding="utf-8")
        out[nb] = (old, notebook_text(old))
    for path, fix in ((root / "_config.yml", config_text), (root / "README.md", readme_text)):
        old = path.read_text(encoding="utf-8")
        out[path] = (old, fix(old))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file disagrees")
    args = ap.parse_args(argv)
    stale = [(p, new) for p, (old, new) in plan().items() if old != new]
    for path, new in stale:
        rel = path.relative_to(ROOT)
        if args.check:
            print(f"out of step: {rel}")
        else:
            path.write_text(new, encoding="utf-8")
            print(f"rewrote {rel}")
    if not stale:
        print(f"in step: {REPO_URL} at {TAG} everywhere")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
