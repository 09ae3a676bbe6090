"""Every ``Code:`` pointer in ``book/glossary.md`` names something that exists.

A glossary entry tells the reader where a term lives in ``src/gpt2k3``; a pointer that does not
import sends them nowhere. Each entry's ``Code:`` part is a list of backticked names in a few
forms, all resolved here:

- ``gpt2k3.pkg.mod.Name.attr``: import the longest module prefix, then ``getattr`` the rest;
  a call written after it, ``gpt2k3.accounting.count_params(spec).active``, is checked by its
  callee and, where the callee returns a dataclass, by that dataclass's field;
- ``Name.attr``: relative to the module of the entry's previous absolute pointer;
- ``.mod``: a sibling of the previous absolute module (``gpt2k3.ops.linear``, ``.delta``);
- ``keyword=value``: a parameter of the previous pointer's callable (``MLAConfig`` (``rope=False``));
- ``name`` in ``gpt2k3.a``, ``.b``: the bare ``name`` must exist in each module listed after it.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import typing
from pathlib import Path

import pytest

GLOSSARY = Path(__file__).resolve().parents[1] / "book" / "glossary.md"

_TICKS = re.compile(r"`([^`]+)`")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def glossary_entries(text: str) -> dict[str, str]:
    """Map each term of every ``{glossary}`` block to its definition (indented lines)."""
    entries: dict[str, str] = {}
    for block in re.findall(r"```\{glossary\}\n(.*?)```", text, flags=re.S):
        term = None
        for line in block.splitlines():
            if line and not line[0].isspace():
                term = line.strip()
                entries[term] = ""
            elif term is not None:
                entries[term] += " " + line.strip()
    return entries


def code_pointers(definition: str) -> list[str]:
    """The backticked names after ``Code:`` in one definition (empty when it has none)."""
    _, sep, tail = definition.partition("Code:")
    return _TICKS.findall(tail) if sep else []


def resolve_dotted(path: str):
    """Import the longest module prefix of ``path`` and ``getattr`` the remaining names."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as err:
            if err.name is None or not ".".join(parts[:cut]).startswith(err.name):
                raise  # the module exists but fails inside: a real error, not a shorter prefix
            continue
        for name in parts[cut:]:
            obj = _attribute(obj, name)
        return obj
    raise ModuleNotFoundError(path)


def _attribute(obj, name: str):
    """``getattr``, or for a class an attribute its ``__init__`` sets (``MoE.experts``)."""
    if hasattr(obj, name) or not inspect.isclass(obj):
        return getattr(obj, name)  # AttributeError names what is missing
    if dataclasses.is_dataclass(obj) and name in {f.name for f in dataclasses.fields(obj)}:
        return None
    if re.search(rf"\bself\.{name}\s*[:=]", inspect.getsource(obj.__init__)):
        return None  # an instance attribute: it exists, but there is nothing to look inside
    raise AttributeError(f"{obj.__qualname__} has no attribute {name!r}")


def _module_of(path: str) -> str:
    """The module part of an absolute pointer (``gpt2k3.ops.linear.elu1`` -> ``gpt2k3.ops.linear``)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            importlib.import_module(name)
            return name
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError(path)


def _check_call_suffix(obj, suffix: str, pointer: str) -> None:
    """``(args)`` names real keyword parameters; a trailing ``.field`` is a field of the result."""
    match = re.fullmatch(r"\((.*?)\)((?:\.[A-Za-z_]\w*)*)", suffix)
    assert match, f"cannot read the call in {pointer!r}"
    args, fields = match.groups()
    params = inspect.signature(obj).parameters
    for keyword in re.findall(r"([A-Za-z_]\w*)\s*=", args):
        assert keyword in params, f"{pointer!r}: {obj.__qualname__} takes no {keyword!r}"
    if fields:
        result = typing.get_type_hints(obj).get("return")
        assert result is not None and dataclasses.is_dataclass(result), (
            f"{pointer!r}: cannot check {fields!r} without a dataclass return annotation")
        field = fields.split(".")[1]
        assert field in {f.name for f in dataclasses.fields(result)} or isinstance(
            getattr(result, field, None), property), f"{pointer!r}: {result.__name__} has no field {field!r}"


def check_pointers(pointers: list[str]) -> list[str]:
    """Resolve one entry's pointers in order; return the ones that do not resolve, with why."""
    failures = []
    last_path = last_obj = None
    pending: list[str] = []  # bare names waiting for the modules listed after them
    for pointer in pointers:
        try:
            if pointer.startswith("gpt2k3."):
                dotted = _DOTTED.match(pointer).group(0)
                obj = resolve_dotted(dotted)
                if pointer[len(dotted):]:
                    _check_call_suffix(obj, pointer[len(dotted):], pointer)
                for name in pending:
                    getattr(importlib.import_module(_module_of(dotted)), name)
                last_path, last_obj = dotted, obj
            elif pointer.startswith("."):
                assert last_path, f"{pointer!r} has no absolute pointer before it"
                parent = _module_of(last_path).rsplit(".", 1)[0]
                module = importlib.import_module(parent + pointer)
                for name in pending:
                    getattr(module, name)
            elif re.fullmatch(r"[A-Za-z_]\w*\s*=.*", pointer):
                assert last_obj is not None, f"{pointer!r} has no callable before it"
                keyword = pointer.split("=")[0].strip()
                params = inspect.signature(last_obj).parameters
                assert keyword in params, f"{last_path} takes no {keyword!r}"
            elif re.fullmatch(r"[A-Za-z_]\w*", pointer) and last_path is None:
                pending.append(pointer)
            elif _DOTTED.fullmatch(pointer):
                assert last_path, f"{pointer!r} has no absolute pointer before it"
                resolve_dotted(_module_of(last_path) + "." + pointer)
            else:
                raise AssertionError(f"cannot read the pointer {pointer!r}")
        except (ImportError, AttributeError, AssertionError, ValueError, TypeError) as err:
            failures.append(f"{pointer}: {type(err).__name__}: {err}")
    return failures


ENTRIES = glossary_entries(GLOSSARY.read_text(encoding="utf-8"))
WITH_CODE = {term: code_pointers(d) for term, d in ENTRIES.items() if code_pointers(d)}


def test_glossary_is_parsed():
    # Guards the parser itself: if the page's layout changed and nothing was read, the
    # parametrised test below would silently check nothing.
    assert len(ENTRIES) >= 40
    assert len(WITH_CODE) >= 30
    assert sum(map(len, WITH_CODE.values())) >= 40


@pytest.mark.parametrize("term", sorted(WITH_CODE))
def test_code_pointer_imports(term):
    failures = check_pointers(WITH_CODE[term])
    assert not failures, f"glossary entry {term!r}: " + "; ".join(failures)


def test_every_package_name_in_the_glossary_imports():
    # Names in the prose outside ``Code:`` (``gpt2k3.model.generate``, ``...H200.ridge``) too.
    names = sorted({m for d in ENTRIES.values() for m in _TICKS.findall(d)
                    if m.startswith("gpt2k3.")})
    assert names
    failures = [f for name in names for f in check_pointers([name])]
    assert not failures, "; ".join(failures)


@pytest.mark.parametrize("pointers, bad", [
    (["gpt2k3.layers.StateCache"], 1),
    (["gpt2k3.cache.StateCache"], 0),
    (["gpt2k3.accounting.count_params(spec).active"], 0),
    (["gpt2k3.accounting.count_params(spec).no_such_field"], 1),
    (["gpt2k3.layers.mla.MLAConfig", "rope=False"], 0),
    (["gpt2k3.layers.mla.MLAConfig", "no_such_flag=True"], 1),
    (["gpt2k3.layers.moe.MoE.experts"], 0),
    (["gpt2k3.layers.moe.MoE.no_such_part"], 1),
    (["gpt2k3.accounting.Roofline.tpot_s", "Roofline.per_token_s"], 0),
    (["chunkwise", "gpt2k3.ops.linear", ".delta", ".no_such_module"], 1),
])
def test_checker_catches_what_it_should(pointers, bad):
    assert len(check_pointers(pointers)) == bad
