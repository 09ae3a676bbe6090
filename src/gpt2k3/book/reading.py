"""Reading paths: which of the package's code one concrete call runs, and how many lines it is.

:func:`trace` runs a call under :func:`sys.setprofile` and collects every function and method of
``gpt2k3`` that executes (``gpt2k3.book`` left out: it is the book's machinery, not the model),
in the order each is first entered. Each becomes a :class:`Piece`: the object itself (what
:func:`gpt2k3.book.display.show_source` shows), its file and lines, and its line counts split
into code, docstring and validation. A nested function, lambda or comprehension counts as part
of the function it is written in: that is where a reader finds it.

The page "Kimi K3 in one sitting" (``notebooks/12_k3_in_one_sitting.ipynb``) and
``scripts/reading_paths.py`` are built on it.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import gpt2k3
from gpt2k3.book.display import Listing, show_source, source_of

__all__ = ["Piece", "trace", "summarize", "is_validation", "compare", "side_by_side", "resolve",
           "mechanism", "CHUNKED_SOLVE"]

PACKAGE_DIR = Path(gpt2k3.__file__).resolve().parent
_EXCLUDED = (PACKAGE_DIR / "book",)


def is_validation(module: str, qualname: str) -> bool:
    """Code whose job is checking arguments: all of ``gpt2k3.checks``, and any function or
    method named ``check_*`` / ``_check*`` elsewhere."""
    leaf = qualname.rsplit(".", 1)[-1]
    return module == "gpt2k3.checks" or leaf.startswith(("check_", "_check"))


@dataclass(frozen=True)
class Piece:
    """One function or method a traced call ran."""

    name: str           # dotted: module.qualname
    module: str
    qualname: str
    obj: Any            # the function / class show_source can show; None if not reachable
    path: str           # package-relative, 'gpt2k3/model.py'
    start: int
    end: int
    lines: int          # source lines, docstring included (inspect.getsourcelines)
    code_lines: int     # the lines show_source shows (docstrings dropped)
    validation: bool

    @property
    def doc_lines(self) -> int:
        return self.lines - self.code_lines

    @property
    def file(self) -> str:
        return self.path

    def listing(self) -> Listing:
        if self.obj is None:
            raise ValueError(f"{self.name} cannot be reached by name, so it has no listing")
        return show_source(self.obj)


def _in_package(filename: str) -> bool:
    try:
        p = Path(filename).resolve()
    except (OSError, ValueError):
        return False
    return p.is_relative_to(PACKAGE_DIR) and not any(p.is_relative_to(e) for e in _EXCLUDED)


def _resolve(module: str, qualname: str) -> Any:
    """The function or class ``module.qualname`` names, unwrapped; None if not reachable."""
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        if obj is None:
            return None
        try:
            obj = inspect.getattr_static(obj, part)
        except AttributeError:
            return None
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        elif isinstance(obj, property):
            obj = obj.fget
        elif hasattr(obj, "func") and type(obj).__name__ == "cached_property":
            obj = obj.func
    if obj is None or not (inspect.isfunction(obj) or inspect.isclass(obj)):
        obj = inspect.unwrap(obj) if callable(obj) else None
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            return None
    return inspect.unwrap(obj)


def resolve(dotted: str) -> Any:
    """The package function, class or method a listing's caption names (``gpt2k3.model.GPT.forward``);
    ``ValueError`` naming ``dotted`` if the package has no such object."""
    if not isinstance(dotted, str) or not dotted.startswith("gpt2k3"):
        raise ValueError(f"dotted must be a dotted name in gpt2k3, got {dotted!r}")
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            importlib.import_module(module)
        except ImportError:
            continue
        obj = _resolve(module, ".".join(parts[i:])) if i < len(parts) else None
        if obj is not None:
            return obj
        break
    raise ValueError(f"dotted names nothing in the package: {dotted!r}")


def _piece(module: str, qualname: str, code) -> Piece | None:
    obj = _resolve(module, qualname)
    target = obj if obj is not None else code
    try:
        lines, start = inspect.getsourcelines(target)
    except (OSError, TypeError):
        return None
    path = "/".join(Path(code.co_filename).resolve().relative_to(PACKAGE_DIR.parent).parts)
    if obj is not None:
        try:
            code_lines = len(source_of(obj)[1].splitlines())
        except (ValueError, SyntaxError):
            code_lines = len(lines)
    else:
        code_lines = len(lines)
    return Piece(name=f"{module}.{qualname}", module=module, qualname=qualname, obj=obj,
                 path=path, start=start, end=start + len(lines) - 1, lines=len(lines),
                 code_lines=code_lines, validation=is_validation(module, qualname))


def trace(fn: Callable, *args, **kwargs) -> tuple[Any, list[Piece]]:
    """Run ``fn(*args, **kwargs)``; return its result and the package's functions it ran, in
    first-call order (each once)."""
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {fn!r}")
    seen: dict[Any, None] = {}
    order: list[tuple[str, str, Any]] = []
    keys: set[tuple[str, str]] = set()

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code in seen:
            return
        seen[code] = None
        if not _in_package(code.co_filename):
            return
        module = frame.f_globals.get("__name__", "")
        # a nested function, lambda or comprehension belongs to the function around it
        qualname = code.co_qualname.split(".<", 1)[0]
        if qualname.startswith("<") or (module, qualname) in keys:
            return
        keys.add((module, qualname))
        order.append((module, qualname, code))

    old = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = fn(*args, **kwargs)
    finally:
        sys.setprofile(old)
    pieces = [p for p in (_piece(*o) for o in order) if p is not None]
    # a nested unit whose lines the enclosing one already holds is counted once
    kept: list[Piece] = []
    for p in pieces:
        if not any(q is not p and q.path == p.path and q.start <= p.start and p.end <= q.end
                   and (q.start, q.end) != (p.start, p.end) for q in pieces):
            kept.append(p)
    return result, kept


def summarize(pieces: Sequence[Piece]) -> dict[str, int]:
    """Total source lines of ``pieces`` and their split: ``code`` + ``docstring`` (of the
    non-validation pieces) + ``validation`` (all lines of validation pieces) = ``total``."""
    val = sum(p.lines for p in pieces if p.validation)
    doc = sum(p.doc_lines for p in pieces if not p.validation)
    total = sum(p.lines for p in pieces)
    return {"total": total, "code": total - val - doc, "docstring": doc, "validation": val,
            "shown": sum(p.code_lines for p in pieces), "units": len(pieces),
            "files": len({p.path for p in pieces})}


#: Which mechanism a traced piece belongs to, by the first prefix of its dotted name that matches.
MECHANISMS = (
    ("gpt2k3.ops.chunks.", "KDA: chunked solve"), ("gpt2k3.ops.gated_delta.", "KDA: chunked solve"),
    ("gpt2k3.layers.deltanet.", "KDA"), ("gpt2k3.layers.conv.", "KDA: short convolution"),
    ("gpt2k3.layers.mla.", "MLA"), ("gpt2k3.layers.moe.", "MoE"),
    ("gpt2k3.layers.residual.", "Attention Residuals"), ("gpt2k3.ops.depth.", "Attention Residuals"),
    ("gpt2k3.layers.mlp.", "SiTU-GLU"), ("gpt2k3.layers.norms.", "norms"),
    ("gpt2k3.cache.", "caches"), ("gpt2k3.model.", "model and decoding loop"),
)

#: The prefixes of the pieces that make KDA's prefill parallel: the chunked solve.
CHUNKED_SOLVE = ("gpt2k3.ops.chunks.", "gpt2k3.ops.gated_delta.chunkwise")


def mechanism(name: str) -> str:
    """The mechanism the piece called ``name`` (dotted) belongs to, for a signpost; ``"other"``."""
    return next((label for prefix, label in MECHANISMS if name.startswith(prefix)), "other")


def compare(a: Iterable[Piece], b: Iterable[Piece]) -> list[tuple[Piece, bool, bool]]:
    """Every piece of ``a`` or ``b`` once, ``b``'s order first then ``a``'s leftovers, with
    whether ``a`` and ``b`` run it: ``(piece, in_a, in_b)``."""
    a, b = list(a), list(b)
    in_a, in_b = {p.name for p in a}, {p.name for p in b}
    rows = [(p, p.name in in_a, True) for p in b]
    rows += [(p, True, False) for p in a if p.name not in in_b]
    return rows


def side_by_side(a: Sequence[Piece], b: Sequence[Piece], names: tuple[str, str] = ("GPT-2", "K3")):
    """The numbers and the table of chapter 12: ``a`` (GPT-2's trace) beside ``b`` (K3's).

    Returns ``(numbers, headers, rows)``. Lines are the lines a listing shows (docstrings
    dropped); units, lines and files count the mechanism pieces, ``*_check_*`` the validation. The mechanism pieces come one per row, in ``b``'s first-call order and then
    ``a``'s leftovers; the validation pieces are summed into one row at the end, then the total.
    """
    both = compare(a, b)
    mech = [(p, x, y) for p, x, y in both if not p.validation]
    checks = [(p, x, y) for p, x, y in both if p.validation]

    def lines(rows, keep):
        return sum(p.code_lines for p, x, y in rows if keep(x, y))

    numbers = {
        "a_units": sum(1 for p in a if not p.validation), "b_units": sum(1 for p in b if not p.validation),
        "a_lines": lines(mech, lambda x, y: x), "b_lines": lines(mech, lambda x, y: y),
        "a_check_lines": lines(checks, lambda x, y: x), "b_check_lines": lines(checks, lambda x, y: y),
        "a_check_units": sum(1 for p in a if p.validation),
        "b_check_units": sum(1 for p in b if p.validation),
        "shared_units": sum(1 for _, x, y in mech if x and y),
        "shared_lines": lines(mech, lambda x, y: x and y),
        "b_only_units": sum(1 for _, x, y in mech if y and not x),
        "b_only_lines": lines(mech, lambda x, y: y and not x),
        "a_only_units": sum(1 for _, x, y in mech if x and not y),
        "a_only_lines": lines(mech, lambda x, y: x and not y),
        "a_files": len({p.path for p in a if not p.validation}),
        "b_files": len({p.path for p in b if not p.validation}),
    }
    mark = {True: "✓", False: ""}
    headers = ["piece", "lines", names[0], names[1]]
    rows = [[f"`{p.qualname}`", p.code_lines, mark[x], mark[y]] for p, x, y in mech]
    rows.append([f"checks ({len(checks)} pieces across both; {names[1]}'s {numbers['b_check_units']} "
                 f"are listed at the end)", lines(checks, lambda x, y: True),
                 numbers["a_check_lines"], numbers["b_check_lines"]])
    rows.append(["**lines of code, checks excluded**", "", numbers["a_lines"], numbers["b_lines"]])
    return numbers, headers, rows
