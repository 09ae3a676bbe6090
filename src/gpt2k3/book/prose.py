"""How the book's main text reads: sentence length, numbers and asides per page.

The *main text* of a page is the prose a reader follows from top to bottom: its Markdown
less everything that folds away or is not prose -- collapsed blocks (MyST ``dropdown`` and
``toggle`` directives, admonitions with ``:class: dropdown``, HTML ``<details>``), footnote
definitions, tables, code (fenced, inline and code cells), math, headings, captions (figure
and table directives, and a paragraph wholly in italics, as the chapters set their captions),
and HTML comments.  Each list item starts a sentence.  A digit joined to a word by a hyphen
is part of a name (GPT-2), not a number.  Visible admonitions (a ``note``, a
``tip``) stay main text.  A glued value (``{glue:text}`name```) counts as a number.

:func:`measure` gives, for one page, the figures the book holds itself to (design.md §4):
the median words per sentence, the share of sentences over 35 words, numbers per 100 words
and asides (parentheses, dashes) per sentence.  :func:`bookkeeping_cells` and
:func:`visible_nbval_comments` find code a web reader should not see: a visible cell that
only glues values or displays a table of them, and a leftover ``# nbval-ignore-output``
comment (that tag belongs in the cell's metadata).

Run as a script to print the table for some pages::

    python -m gpt2k3.book.prose notebooks/*.ipynb book/intro.md
"""

from __future__ import annotations

import ast
import json
import re
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["ProseMetrics", "main_text", "sentences", "measure", "page_markdown", "page_metrics",
           "bookkeeping_cells", "visible_nbval_comments", "HIDDEN_TAGS", "LIMITS"]

#: The bar a page's main text is held to: (median words per sentence, % of sentences over 35
#: words, numbers per 100 words, asides per sentence), each an upper bound.
LIMITS = {"median_words": 17.0, "long_pct": 10.0, "numbers_per_100_words": 3.0,
          "asides_per_sentence": 0.30}
#: A sentence over this many words is long.
LONG = 35
#: Cell tags that keep a code cell's source off the web page.
HIDDEN_TAGS = frozenset({"remove-input", "remove-cell"})

# A fenced directive: ```{name} args / :::{name} args, its body, and the same fence closing it.
# The opening fence is matched exactly by the closing one, so an outer fence of four
# backquotes holds inner ones of three.
_DIRECTIVE = re.compile(r"^(?P<fence>`{3,}|:{3,})[ \t]*\{(?P<name>[A-Za-z0-9_-]+)\}(?P<args>[^\n]*)\n"
                        r"(?P<body>.*?)^(?P=fence)[ \t]*$", re.M | re.S)
_NOT_PROSE = {"code-cell", "code", "code-block", "sourcecode", "math", "figure", "table",
              "list-table", "csv-table", "glossary", "bibliography", "raw", "eval-rst", "image",
              "literalinclude", "mermaid", "glue:figure", "glue"}
_COLLAPSED = {"dropdown", "toggle"}


def _drop_directives(md: str) -> str:
    def replace(m: re.Match) -> str:
        name, body = m.group("name").lower(), m.group("body")
        options = re.findall(r"^:[A-Za-z-]+:.*$", body, flags=re.M)
        if name in _COLLAPSED or any(o.startswith(":class:") and "dropdown" in o for o in options):
            return "\n"
        if name in _NOT_PROSE:
            return "\n"
        # a visible admonition: its text stays, its options and a title line go
        return "\n" + re.sub(r"^:[A-Za-z-]+:.*$", "", body, flags=re.M) + "\n"

    previous = None
    while previous != md:
        previous, md = md, _DIRECTIVE.sub(replace, md)
    return md


def main_text(md: str) -> str:
    """The main text of Markdown ``md``, with each glued value as the token ``GLUENUM``,
    each inline code span as ``CODE`` and each piece of math as ``MATH``."""
    md = re.sub(r"\A---\n.*?\n---\n", "\n", md, flags=re.S)             # front matter
    md = re.sub(r"<!--.*?-->", " ", md, flags=re.S)                       # comments
    md = _drop_directives(md)
    md = re.sub(r"<details\b.*?</details>", " ", md, flags=re.S | re.I)
    md = re.sub(r"^\[\^[^\]]+\]:.*?(?=\n[ \t]*\n|\Z)", " ", md, flags=re.M | re.S)   # footnote defs
    md = re.sub(r"^(`{3,}|~{3,}).*?^\1[ \t]*$", " ", md, flags=re.M | re.S)          # plain fences
    md = re.sub(r"\$\$.*?\$\$", " MATH ", md, flags=re.S)
    md = re.sub(r"(?<!\\)\$[^$\n]+\$", " MATH ", md)
    md = re.sub(r"^[ \t]*\|.*$", " ", md, flags=re.M)                     # table rows
    md = re.sub(r"^[ \t]*#{1,6} .*$", " ", md, flags=re.M)                # headings
    # captions: a paragraph wholly in italics (*Figure 10.1 -- ...*, *Accuracy (%) at ...*)
    md = re.sub(r"(?:^|\n[ \t]*\n)[ \t]*\*(?!\*)[^\n]*(?:\n(?![ \t]*\n)[^\n]*)*?(?<!\*)\*[ \t]*(?=\n[ \t]*\n|\n?\Z)",
                "\n\n", md)
    # a list item starts a sentence of its own
    md = re.sub(r"^[ \t]*(?:[-*+]|\d+[.)])[ \t]+", "\n\n\u2029", md, flags=re.M)
    md = re.sub(r"^\([A-Za-z0-9_:-]+\)=[ \t]*$", " ", md, flags=re.M)      # (label)= targets
    md = re.sub(r"\[\^[^\]]+\]", "", md)                                  # footnote marks
    md = re.sub(r"\{glue(?::[a-z]+)?\}`[^`]*`", " GLUENUM ", md)
    md = re.sub(r"\{(?:cite(?::[a-z]+)?|term|doc|ref|numref|eq|abbr)\}`([^`<]*)(?:<[^`]*>)?`",
                r" \1 ", md)
    md = re.sub(r"\{math\}`[^`]*`", " MATH ", md)
    md = re.sub(r"`[^`]*`", " CODE ", md)
    md = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", md)                    # links: their text
    return md


def sentences(text: str) -> list[str]:
    """The sentences of main text ``text`` (at least three words each): split after ``.``,
    ``!``, ``?`` or ``:`` where the next word starts with a capital, ``*``, ``(`` or a quote."""
    parts = []
    for item in text.split("\u2029"):                 # list items (see main_text)
        flat = re.sub(r"\s+", " ", item).strip()
        parts += re.split(r"(?<=[.!?:])\s+(?=[A-Z*(\"“])", flat)
    return [p.strip() for p in parts if len(p.split()) >= 3]


@dataclass(frozen=True)
class ProseMetrics:
    """How one page's main text reads."""

    words: int
    sentences: int
    median_words: float
    long_pct: float
    numbers_per_100_words: float
    asides_per_sentence: float

    def over(self) -> dict[str, tuple[float, float]]:
        """The measures above :data:`LIMITS`: ``{name: (value, limit)}``."""
        return {k: (getattr(self, k), v) for k, v in LIMITS.items() if getattr(self, k) > v}


def measure(md: str) -> ProseMetrics:
    """:class:`ProseMetrics` of Markdown ``md``'s main text."""
    text = main_text(md)
    sents = sentences(text)
    lengths = [len(s.split()) for s in sents]
    words = sum(lengths)
    # a digit joined to a word by a hyphen is part of a name (GPT-2), not a number
    numbers = len(re.findall(r"GLUENUM|(?<![\w.])(?<![A-Za-z]-)\d[\d,.]*", text))
    asides = text.count("(") + text.count("—") + len(re.findall(r" -- ", text))
    n = len(sents)
    return ProseMetrics(
        words=words, sentences=n,
        median_words=float(statistics.median(lengths)) if lengths else 0.0,
        long_pct=round(100 * sum(w > LONG for w in lengths) / n, 1) if n else 0.0,
        numbers_per_100_words=round(100 * numbers / words, 2) if words else 0.0,
        asides_per_sentence=round(asides / n, 2) if n else 0.0)


def page_markdown(path: str | Path) -> str:
    """The Markdown of a page: a notebook's Markdown cells joined, or a ``.md`` file's text."""
    path = Path(path)
    if path.suffix == ".ipynb":
        nb = json.loads(path.read_text())
        return "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    return path.read_text()


def page_metrics(path: str | Path) -> ProseMetrics:
    """:func:`measure` of the page at ``path``."""
    return measure(page_markdown(path))


def _code_cells(path: Path) -> list[tuple[int, str, list[str]]]:
    """``(index, source, tags)`` of every code cell of a notebook or MyST ``.md`` page."""
    if path.suffix == ".ipynb":
        nb = json.loads(path.read_text())
        return [(i, "".join(c["source"]), list(c.get("metadata", {}).get("tags", [])))
                for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]
    out = []
    for i, m in enumerate(re.finditer(r"^(`{3,})\{code-cell\}[^\n]*\n(.*?)^\1[ \t]*$", path.read_text(),
                                      flags=re.M | re.S)):
        body = m.group(2)
        tags = re.findall(r"^:tags:\s*\[([^\]]*)\]", body, flags=re.M)
        tags = [t.strip().strip("'\"") for t in tags[0].split(",")] if tags else []
        out.append((i, re.sub(r"^:[A-Za-z-]+:.*\n", "", body, flags=re.M), tags))
    return out


_BOOKKEEPING_CALLS = {"glue", "md_table", "display", "Markdown"}


def _only_bookkeeping(stmt: ast.stmt) -> bool:
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return True
    if isinstance(stmt, ast.For):
        return all(_only_bookkeeping(s) for s in stmt.body + stmt.orelse)
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        f = stmt.value.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        return name in _BOOKKEEPING_CALLS
    return False


def bookkeeping_cells(path: str | Path) -> list[int]:
    """Indices of the visible code cells of a page that only glue values or display a table
    of them (every statement an import, a ``glue(...)``, ``md_table(...)`` or
    ``display(...)`` call, or a loop of those, with at least one ``glue``/``md_table``)."""
    found = []
    for i, source, tags in _code_cells(Path(path)):
        if HIDDEN_TAGS & set(tags):
            continue
        try:
            tree = ast.parse("\n".join(l for l in source.splitlines() if not l.lstrip().startswith(("%", "!"))))
        except SyntaxError:
            continue
        calls = {getattr(n.func, "id", getattr(n.func, "attr", None))
                 for n in ast.walk(tree) if isinstance(n, ast.Call)}
        if tree.body and all(_only_bookkeeping(s) for s in tree.body) and calls & {"glue", "md_table"}:
            found.append(i)
    return found


def visible_nbval_comments(path: str | Path) -> list[int]:
    """Indices of the visible code cells of a page whose source shows an ``nbval-...``
    comment to the reader (the tag belongs in the cell's metadata)."""
    return [i for i, source, tags in _code_cells(Path(path))
            if not HIDDEN_TAGS & set(tags)
            and re.search(r"#.*\bnbval-(?:ignore-output|skip|raises)", source)]


def _main(argv: list[str]) -> int:
    print("page".ljust(30) + "words".rjust(7) + "sents".rjust(7) + "median".rjust(8) + "long%".rjust(7)
          + "num/100w".rjust(10) + "asides".rjust(8) + "  glue-cells  nbval-comments")
    for p in argv:
        m = page_metrics(p)
        flag = " *" if m.over() else ""
        print(Path(p).name[:29].ljust(30) + f"{m.words:7d}{m.sentences:7d}{m.median_words:8.1f}"
              f"{m.long_pct:7.1f}{m.numbers_per_100_words:10.2f}{m.asides_per_sentence:8.2f}"
              f"  {len(bookkeeping_cells(p)):10d}  {len(visible_nbval_comments(p)):13d}{flag}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_main(sys.argv[1:]))
