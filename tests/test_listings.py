"""The code on the page: every listing a notebook stores is the package's current source.

A listing is a ``text/markdown`` output written by :func:`gpt2k3.book.display.show_source`
(caption ``**`dotted.name`** · `path`, lines a–b`` and a fenced ``python`` block) or by
:func:`~gpt2k3.book.display.show_diff` (caption ``**`old`** → **`new`**`` and a fenced ``diff``
block). Each stored one is parsed, its names resolved in the package and the listing computed
again: a stale listing, or one naming something the package no longer has, fails here (and in
nbval), with the notebook and the name in the message.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
from pathlib import Path

import pytest

from gpt2k3.book.display import show_diff, show_source, source_of
from gpt2k3.book.reading import resolve, trace

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CHAPTERS = [p for p in NOTEBOOKS if re.match(r"(0[1-9]|1[01])_", p.name)]
MAX_LINES = 40

LOOKS_LIKE = re.compile(r"\*\*`[^`]+`\*\* (·|→) ")
SOURCE = re.compile(r"\*\*`(?P<name>[\w.]+)`\*\* · `(?P<path>[^`]+)`, lines (?P<a>\d+)–(?P<b>\d+)"
                    r"\n\n```python\n(?P<code>.*)\n```", re.S)
DIFF = re.compile(r"\*\*`(?P<old>[\w.]+)`\*\* → \*\*`(?P<new>[\w.]+)`\*\*\n\n```diff\n(?P<code>.*)\n```",
                  re.S)


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else value


def listings(path: Path) -> list[str]:
    """The stored listing outputs (Markdown text) of a notebook, in order."""
    out = []
    for cell in json.loads(path.read_text())["cells"]:
        for o in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            md = o.get("data", {}).get("text/markdown")
            if md is not None and LOOKS_LIKE.match(_text(md)):
                out.append(_text(md))
    return out


ALL = [(p, i, md) for p in NOTEBOOKS for i, md in enumerate(listings(p))]


def _id(item):
    path, i, md = item
    return f"{path.stem}:{i}:" + "->".join(re.findall(r"\*\*`([\w.]+)`\*\*", md.split("\n", 1)[0]))


def _resolve(name: str, where: str):
    try:
        return resolve(name)
    except ValueError:
        pytest.fail(f"{where} shows {name}, which the package does not have (renamed or removed?)")


@pytest.mark.parametrize("item", ALL, ids=[_id(x) for x in ALL])
def test_stored_listing_is_current(item):
    path, _, md = item
    where = path.name
    if (m := SOURCE.fullmatch(md)) is not None:
        fresh = show_source(_resolve(m["name"], where))._repr_markdown_()
    elif (m := DIFF.fullmatch(md)) is not None:
        fresh = show_diff(_resolve(m["old"], where), _resolve(m["new"], where))._repr_markdown_()
    else:
        pytest.fail(f"{where}: an output looks like a listing but does not parse: {md[:120]!r}")
    assert md == fresh, f"{where}: the stored listing of {md.splitlines()[0]} is stale; re-run the notebook"


def _too_long(code: str) -> list[str]:
    """The functions of a listing (each method of a class) longer than MAX_LINES lines."""
    tree = ast.parse(code)
    units = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            units += [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            units.append(node)
    bad = []
    for n in units:
        first = min([n.lineno] + [d.lineno for d in n.decorator_list])
        if n.end_lineno - first + 1 > MAX_LINES:
            bad.append(f"{n.name} ({n.end_lineno - first + 1} lines)")
    return bad


@pytest.mark.parametrize("item", ALL, ids=[_id(x) for x in ALL])
def test_shown_functions_are_short(item):
    path, _, md = item
    if (m := SOURCE.fullmatch(md)) is not None:
        code = m["code"]
    elif (m := DIFF.fullmatch(md)) is not None:  # the new listing: every line not removed
        code = "\n".join(line[1:] for line in m["code"].splitlines() if not line.startswith("-"))
    else:
        pytest.skip("does not parse (reported by test_stored_listing_is_current)")
    assert not _too_long(code), f"{path.name}: shown functions over {MAX_LINES} lines: {_too_long(code)}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_chapter_shows_code(path):
    assert listings(path), f"{path.name} shows no listing of the code it runs (show_source / show_diff)"


# ------------------------------------------------------------------- show_source and show_diff

def test_show_source_drops_docstrings_and_keeps_inspects_lines():
    from gpt2k3.ops import delta
    listing = show_source(delta.recurrent)
    m = SOURCE.fullmatch(listing._repr_markdown_())
    assert m is not None and m["name"] == "gpt2k3.ops.delta.recurrent"
    lines, start = inspect.getsourcelines(delta.recurrent)
    assert (int(m["a"]), int(m["b"])) == (start, start + len(lines) - 1)
    assert m["path"] == "gpt2k3/ops/delta.py"
    doc = inspect.getdoc(delta.recurrent).splitlines()[0]
    assert doc not in listing.code and '"""' not in listing.code
    func = ast.parse(listing.code).body[0]
    assert ast.get_docstring(func) is None and func.name == "recurrent"
    # the code lines are the source lines less the docstring's
    doc_node = ast.parse("".join(lines)).body[0].body[0]
    assert listing.n_lines == len(lines) - (doc_node.end_lineno - doc_node.lineno + 1)
    assert repr(listing).startswith(listing.caption)


def test_show_source_methods_classes_and_decorated_functions():
    from gpt2k3.cache import KVCache
    from gpt2k3.config import GPTConfig
    from gpt2k3.model import GPT, generate
    model = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=1, n_embd=8))
    bound, plain = show_source(model.forward), show_source(GPT.forward)
    assert bound.caption == plain.caption and bound.code == plain.code
    assert plain.caption.startswith("**`gpt2k3.model.GPT.forward`** · `gpt2k3/model.py`, lines ")
    assert plain.code.startswith(("def forward(", "@checked(check_forward)\ndef forward("))  # dedented
    lines, start = inspect.getsourcelines(inspect.unwrap(generate))
    assert show_source(generate).caption.endswith(f"lines {start}–{start + len(lines) - 1}")
    cls = show_source(KVCache)
    assert cls.code.startswith("class KVCache") and ast.get_docstring(ast.parse(cls.code).body[0]) is None
    for m in ast.parse(cls.code).body[0].body:
        if isinstance(m, ast.FunctionDef):
            assert ast.get_docstring(m) is None
    assert not Path(SOURCE.fullmatch(cls._repr_markdown_())["path"]).is_absolute()


def test_show_diff_marks_what_changed():
    from gpt2k3.ops import delta, gated_delta
    old, new = source_of(delta.recurrent)[1], source_of(gated_delta.recurrent)[1]
    listing = show_diff(delta.recurrent, gated_delta.recurrent)
    m = DIFF.fullmatch(listing._repr_markdown_())
    assert m is not None and listing.language == "diff"
    assert (m["old"], m["new"]) == ("gpt2k3.ops.delta.recurrent", "gpt2k3.ops.gated_delta.recurrent")
    body = listing.code.splitlines()
    assert all(line[:1] in " +-" for line in body) and not any(l.startswith(("@@", "---", "+++")) for l in body)
    assert [l[1:] for l in body if not l.startswith("-")] == new.splitlines()  # full context
    assert [l[1:] for l in body if not l.startswith("+")] == old.splitlines()
    assert any(l.startswith("+") for l in body) and any(l.startswith("-") for l in body)
    same = show_diff(delta.recurrent, delta.recurrent).code.splitlines()
    assert same == [] or all(l.startswith(" ") for l in same)


@pytest.mark.parametrize("bad", [42, "gpt2k3.model.GPT", print, len, Path.exists],
                         ids=["int", "str", "builtin", "builtin2", "not-package"])
def test_bad_input_names_obj(bad):
    with pytest.raises(ValueError, match="obj"):
        show_source(bad)
    with pytest.raises(ValueError, match="obj"):
        show_diff(bad, resolve("gpt2k3.model.generate"))
    with pytest.raises(ValueError, match="obj"):
        show_diff(resolve("gpt2k3.model.generate"), bad)


def test_resolve_refuses_missing_names():
    with pytest.raises(ValueError, match="dotted"):
        resolve("gpt2k3.model.NoSuchThing")
    with pytest.raises(ValueError, match="dotted"):
        resolve("torch.nn.Linear")


def test_trace_collects_package_code_in_call_order():
    import torch
    from gpt2k3.config import GPTConfig
    from gpt2k3.model import GPT
    model = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=1, n_embd=8))
    out, pieces = trace(model, torch.zeros(1, 3, dtype=torch.long))
    assert out.shape == (1, 3, 16)
    names = [p.name for p in pieces]
    # the door (gpt2k3.checks.checked) runs its check first, then the body
    assert names[:2] == ["gpt2k3.checks.checked", "gpt2k3.model.check_forward"]
    assert "gpt2k3.model.GPT.forward" in names
    assert len(names) == len(set(names))
    assert not any(n.startswith("gpt2k3.book") for n in names)
    for p in pieces:
        if p.obj is not None:
            assert p.listing().n_lines == p.code_lines
            assert p.lines == len(inspect.getsourcelines(p.obj)[0])
    assert any(p.validation for p in pieces) and any(not p.validation for p in pieces)


def test_reading_paths_script_measures_and_skips_missing_names():
    import importlib.util
    spec = importlib.util.spec_from_file_location("reading_paths", ROOT / "scripts" / "reading_paths.py")
    rp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rp)
    row = rp.measure_entry("DeltaNet token loop", "gpt2k3.ops.delta.recurrent", rp.delta_recurrent)
    assert "skipped" not in row, row
    assert row["total"] == row["code"] + row["docstring"] + row["validation"] > 0
    assert row["units"] == len(row["pieces"]) and row["files"] >= 1
    assert row["pieces"][0]["name"] == "gpt2k3.ops.delta.recurrent"

    def missing():
        return rp.attr("gpt2k3.ops.delta", "no_such_function"), (), {}
    row = rp.measure_entry("gone", "gpt2k3.ops.delta.no_such_function", missing)
    assert "no_such_function" in row["skipped"]
    stats = rp.package_stats()
    assert stats["total_lines"] == sum(stats["lines_per_folder"].values())
    assert stats["validation_lines"] >= stats["checks_py_lines"] > 0 and stats["public_names"] > 0
    assert "| entry point |" in rp.markdown([row], stats)
