#!/usr/bin/env python
"""Reading paths: how many lines a reader must read to follow one call through the package.

Each entry point is run once on a tiny input under :func:`gpt2k3.book.reading.trace`, which
records every ``gpt2k3`` function and method that executes (``gpt2k3.book`` excluded) -- for
the GPT-2 forward, the KV-cached decode step and the absorbed MLA step the constructors too,
since a reader reads them -- and
counts its source lines (``inspect.getsourcelines``), split into code, docstring and
validation (``gpt2k3.checks`` and anything named ``check_*`` / ``_check*``).  An entry point
whose function or class is missing from the package is skipped with a note.

Also measured, from the source files (no import needed): lines per folder, the largest
module, the number of public names (``__all__`` entries) and the validation lines.

    python scripts/reading_paths.py [--json benchmarks/results/reading_paths.json] [--md FILE]
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import sys
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpt2k3.book.reading import summarize, trace  # noqa: E402

PKG = ROOT / "src" / "gpt2k3"
B, H, T, DK, DV = 1, 2, 8, 4, 4


class Missing(Exception):
    """An entry point's function or class is not in the package (renamed or removed)."""


def attr(module: str, name: str):
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        raise Missing(f"module {module} not importable ({e})") from None
    for part in name.split("."):
        if not hasattr(obj, part):
            raise Missing(f"{module}.{name} does not exist")
        obj = getattr(obj, part)
    return obj


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _qkv_beta():
    g = _gen()
    q = torch.nn.functional.normalize(torch.randn(B, H, T, DK, generator=g), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, H, T, DK, generator=g), dim=-1)
    v = torch.randn(B, H, T, DV, generator=g)
    beta = torch.rand(B, H, T, generator=g)
    return q, k, v, beta


def _log_decay():
    return -torch.nn.functional.softplus(torch.randn(B, H, T, DK, generator=_gen(1)))


def _small_config(**kw):
    GPTConfig = attr("gpt2k3.config", "GPTConfig")
    return GPTConfig(**{**dict(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=16), **kw})


# --------------------------------------------------------------------------- entry points
# each returns (callable, args, kwargs) to trace; building the inputs is not traced

def gpt2_forward():
    cls, config = attr("gpt2k3.model", "GPT2"), _small_config()

    def build_and_run(idx):  # the constructors are on the path: a reader reads them too
        return cls(config).eval()(idx)
    return build_and_run, (torch.zeros(1, T, dtype=torch.long),), {}


def kv_decode():
    cls, generate, config = attr("gpt2k3.model", "GPT"), attr("gpt2k3.model", "generate"), _small_config()

    def build_and_decode(idx):
        model = cls(config).eval()
        return generate(model, idx, 1, temperature=0, cache=model.new_cache(1, 2))
    return build_and_decode, (torch.zeros(1, 1, dtype=torch.long),), {}


def delta_recurrent():
    return attr("gpt2k3.ops.delta", "recurrent"), _qkv_beta(), {}


def delta_chunkwise():
    return attr("gpt2k3.ops.delta", "chunkwise"), _qkv_beta(), {"chunk_size": 4}


def delta_chunkwise_reference():
    return attr("gpt2k3.ops.delta", "chunkwise_reference"), _qkv_beta(), {"chunk_size": 4}


def kda_recurrent():
    return attr("gpt2k3.ops.gated_delta", "recurrent"), (*_qkv_beta(), _log_decay()), {}


def kda_chunkwise():
    return attr("gpt2k3.ops.gated_delta", "chunkwise"), (*_qkv_beta(), _log_decay()), \
        {"chunk_size": 4}


def kda_layer():
    layer = attr("gpt2k3.layers.deltanet", "KDA")(_small_config(n_embd=16, n_head=2)).eval()
    return layer, (torch.randn(1, T, 16, generator=_gen()),), {}


def _absorbed(cls_name: str):
    cls = attr("gpt2k3.layers.mla", cls_name)
    names = [n for n in dir(cls) if "absorb" in n.lower() and callable(getattr(cls, n, None))]
    names.sort(key=lambda n: ("decode" not in n, n))
    if not names:
        raise Missing(f"no absorbed-decode method on gpt2k3.layers.mla.{cls_name}")
    cfg = attr("gpt2k3.layers.mla", "MLAConfig")(
        n_embd=32, n_heads=4, q_lora_rank=12, kv_lora_rank=10, qk_nope_head_dim=6,
        qk_rope_head_dim=4, v_head_dim=5, max_len=16)
    torch.manual_seed(0)
    x = torch.randn(1, 32, generator=_gen())

    def build_and_decode(x_t):  # constructor, cache and one absorbed step, from an empty cache
        mla = cls(cfg).eval()
        return getattr(mla, names[0])(x_t, mla.new_cache(1))
    return build_and_decode, (x,), {}, names[0]


def mla_absorbed():
    return _absorbed("MLA")


def _generate(model_fn):
    model = model_fn()
    return attr("gpt2k3.model", "generate"), (model, torch.zeros(1, 4, dtype=torch.long), 2), \
        {"temperature": 0}


def gpt2_generate():
    return _generate(lambda: attr("gpt2k3.model", "GPT")(_small_config()))


def k3_generate():
    return _generate(lambda: attr("gpt2k3.models.k3", "tiny_k3")(_small_config(n_embd=32)))


ENTRY_POINTS = [
    ("GPT-2 forward", "gpt2k3.model.GPT2(GPTConfig)(idx)", gpt2_forward),
    ("KV-cached decode step", "gpt2k3.model.generate (1 prompt token, 1 new, cache given)",
     kv_decode),
    ("DeltaNet token loop", "gpt2k3.ops.delta.recurrent", delta_recurrent),
    ("DeltaNet chunkwise", "gpt2k3.ops.delta.chunkwise", delta_chunkwise),
    ("DeltaNet chunkwise reference", "gpt2k3.ops.delta.chunkwise_reference",
     delta_chunkwise_reference),
    ("KDA recurrent", "gpt2k3.ops.gated_delta.recurrent (g: B,H,T,Dk)", kda_recurrent),
    ("KDA chunkwise", "gpt2k3.ops.gated_delta.chunkwise (g: B,H,T,Dk)", kda_chunkwise),
    ("KDA layer", "gpt2k3.layers.deltanet.KDA forward", kda_layer),
    ("MLA absorbed decode", "gpt2k3.layers.mla.MLA", mla_absorbed),
    ("GPT-2 prefill + 1 decode step", "generate(GPT, 4 tokens, 2 new)", gpt2_generate),
    ("Kimi K3 prefill + 1 decode step", "generate(tiny_k3, 4 tokens, 2 new)", k3_generate),
]


#: The reading paths the clean-bodies issue sets targets for.
FOUR_PATHS = ("GPT-2 forward", "KV-cached decode step", "DeltaNet token loop", "MLA absorbed decode")


def _body_first(fn, pieces):
    """An entry that is a checked door (``gpt2k3.checks.checked``) runs its checks before its
    body, so the trace starts with the door and its checks, all counted as validation; list the
    body first, then them, so a row's first piece is the entry point itself."""
    if not (hasattr(fn, "__wrapped__") and hasattr(fn, "check")):
        return pieces
    first = next((i for i, p in enumerate(pieces) if not p.validation), 0)
    return [pieces[first]] + pieces[:first] + pieces[first + 1:]


def measure_entry(label, where, build) -> dict:
    row = {"entry": label, "call": where}
    try:
        built = build()
        fn, args, kwargs = built[:3]
        if len(built) > 3:
            row["call"] = f"{where}.{built[3]}"
        with torch.no_grad():
            _, pieces = trace(fn, *args, **kwargs)
    except Missing as e:
        row["skipped"] = str(e)
        return row
    except Exception as e:  # a changed signature: note it, measure the rest
        row["skipped"] = f"{type(e).__name__}: {e}"
        return row
    row.update(summarize(pieces))
    pieces = _body_first(fn, pieces)
    row["pieces"] = [{"name": p.name, "path": p.path, "lines": p.lines,
                      "code_lines": p.code_lines, "validation": p.validation} for p in pieces]
    return row


# --------------------------------------------------------------------------- the package

def _checks_elsewhere(tree: ast.AST) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.name.startswith(("check_", "_check")):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out.append((node.name, node.end_lineno - first + 1))
    return out


def package_stats() -> dict:
    per_folder: Counter = Counter()
    modules = {}
    public = 0
    validation = 0
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        text = path.read_text()
        n = len(text.splitlines())
        modules[str(Path("gpt2k3") / rel)] = n
        per_folder[rel.parts[0] + "/" if len(rel.parts) > 1 else "(top level)"] += n
        tree = ast.parse(text)
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and \
                        isinstance(node.value, (ast.List, ast.Tuple)):
                    public += len(node.value.elts)
        if rel == Path("checks.py"):
            validation += n
        else:
            validation += sum(k for _, k in _checks_elsewhere(tree))
    largest = max(modules, key=modules.get)
    return {"total_lines": sum(modules.values()), "lines_per_folder": dict(sorted(per_folder.items())),
            "modules": len(modules), "largest_module": {"path": largest, "lines": modules[largest]},
            "public_names": public, "validation_lines": validation,
            "checks_py_lines": modules.get("gpt2k3/checks.py", 0)}


def markdown(rows, stats) -> str:
    out = ["| entry point | call | lines | code | docstring | validation | units | files |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    notes = []
    for r in rows:
        if "skipped" in r:
            out.append(f"| {r['entry']} | `{r['call']}` | — | — | — | — | — | — |")
            notes.append(f"- {r['entry']}: skipped ({r['skipped']})")
        else:
            out.append(f"| {r['entry']} | `{r['call']}` | {r['total']} | {r['code']} | "
                       f"{r['docstring']} | {r['validation']} | {r['units']} | {r['files']} |")
    out += [""] + notes + ([""] if notes else [])
    out += ["| package | |", "|---|---:|", f"| lines (all .py) | {stats['total_lines']} |",
            f"| modules | {stats['modules']} |"]
    out += [f"| lines in {k} | {v} |" for k, v in stats["lines_per_folder"].items()]
    out += [f"| largest module | {stats['largest_module']['path']} ({stats['largest_module']['lines']}) |",
            f"| public names (`__all__` entries) | {stats['public_names']} |",
            f"| validation lines (checks.py {stats['checks_py_lines']} + check_* elsewhere) | "
            f"{stats['validation_lines']} |"]
    if "four_paths" in stats:
        f = stats["four_paths"]
        out.append(f"| validation on the four paths ({', '.join(FOUR_PATHS)}) | "
                   f"{f['validation']} of {f['lines']} ({f['validation_share']:.0%}) |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "reading_paths.json"),
                    help="where to write the JSON ('' for nowhere)")
    ap.add_argument("--md", default="", help="also write the markdown table to this file")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    rows = [measure_entry(*e) for e in ENTRY_POINTS]
    stats = package_stats()
    four = [r for r in rows if r["entry"] in FOUR_PATHS and "skipped" not in r]
    if four:  # the share of validation on the four reading paths the clean-bodies issue names
        stats["four_paths"] = {"lines": sum(r["total"] for r in four),
                               "validation": sum(r["validation"] for r in four)}
        stats["four_paths"]["validation_share"] = round(
            stats["four_paths"]["validation"] / stats["four_paths"]["lines"], 3)
    md = markdown(rows, stats)
    print(md)
    if a.md:
        Path(a.md).write_text(md + "\n")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"entry_points": rows, "package": stats}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
