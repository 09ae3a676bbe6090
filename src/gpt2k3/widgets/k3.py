"""Chapter 9 (K3-scale accounting): a live explorer in which the reader edits every field of an
:class:`~gpt2k3.accounting.ArchSpec` and the serving assumptions, and sees the whole account."""

from __future__ import annotations

import typing
from dataclasses import fields

import ipywidgets as W

from ..accounting import (ATTENTION_KINDS, MLPS, NORMS, POSITIONS, ArchSpec, hybrid_layers,
                          hybrid_spec)
from ..archs import K3_SCALE
from ..figures.k3 import BATCHES, CACHE_DTYPES, CONTEXTS, WEIGHT_DTYPES, k3_dashboard
from ._explorer import Explorer, explorer

__all__ = ["k3_explorer", "spec_controls", "spec_from_controls"]

_STYLE = {"description_width": "initial"}
_CHOICES = {"norm": NORMS, "mlp": MLPS, "position": POSITIONS, "attention": ATTENTION_KINDS}
#: Fields the explorer does not offer: the label and citation, and the KDA layer list, which
#: the schedule control writes.
_SKIP = ("name", "source", "kda_layers")
_SCHEDULES = ([("0:1 (all attention)", 0)] + [(f"{r}:1", r) for r in range(1, 16)]
              + [("all KDA", None)])


def _label(n: int) -> str:
    return f"{n // 1024}K" if n < 1 << 20 else f"{n >> 20}M"


def spec_controls(base: ArchSpec = K3_SCALE) -> dict[str, W.ValueWidget]:
    """One widget per editable field of ``base`` (every field but its name, source and KDA
    layer list), holding its value: a checkbox for a flag, a menu for a choice, a number box
    for a size and a text box for a size that may be ``None``."""
    if not isinstance(base, ArchSpec):
        raise ValueError(f"base must be an ArchSpec, got {type(base).__name__}")
    hints = typing.get_type_hints(ArchSpec)
    out: dict[str, W.ValueWidget] = {}
    for f in fields(ArchSpec):
        if f.name in _SKIP:
            continue
        value, kind = getattr(base, f.name), hints[f.name]
        common = dict(description=f.name, style=_STYLE, layout=W.Layout(width="230px"))
        if f.name in _CHOICES:
            out[f.name] = W.Dropdown(options=list(_CHOICES[f.name]), value=value, **common)
        elif kind is bool:
            out[f.name] = W.Checkbox(value=value, indent=False, **common)
        elif kind is int:
            out[f.name] = W.IntText(value=value, continuous_update=False, **common)
        else:  # int | None: a text box, so that "None" can be typed
            out[f.name] = W.Text(value=str(value), continuous_update=False, **common)
    return out


def spec_from_controls(base: ArchSpec, values: dict, ratio: int | None) -> ArchSpec:
    """``base`` with the fields in ``values`` (as the widgets of :func:`spec_controls` hold
    them) and the KDA layers of a ``ratio``:1 schedule (``None``: every layer).  An impossible
    spec raises ``ValueError`` naming the field."""
    changes = {}
    for name, value in values.items():
        if isinstance(value, str) and name not in _CHOICES:
            text = value.strip()
            if text.lower() in ("", "none"):
                changes[name] = None
            else:
                try:
                    changes[name] = int(text)
                except ValueError:
                    raise ValueError(f"{name} must be an int or None, got {value!r}") from None
        else:
            changes[name] = value
    n_layer = changes.get("n_layer", base.n_layer)
    if not isinstance(n_layer, int) or n_layer < 1:
        raise ValueError(f"n_layer must be a positive int, got {n_layer!r}")
    edited = base.with_(kda_layers=(), **changes)
    return hybrid_spec(edited, ratio).with_(name=f"{base.name} (edited)")


def k3_explorer(base: ArchSpec = K3_SCALE) -> Explorer:
    """Edit any field of ``base`` (K3-scale by default), its KDA : attention schedule, the
    context, the batch, the weight and cache formats and the tensor-parallel degree, and see
    the whole account: parameters, bytes, FLOPs, the roofline and the H200s it needs
    (:func:`gpt2k3.figures.k3_dashboard`)."""
    arch = spec_controls(base)
    # open on base's own schedule when it is one of the menu's (else all attention)
    if base.n_kda_layers == base.n_layer:
        ratio = None
    else:
        ratio = next((r for _, r in _SCHEDULES
                      if r is not None and hybrid_layers(base.n_layer, r) == base.kda_layers), 0)
    serving = {
        "ratio": W.Dropdown(options=_SCHEDULES, value=ratio, description="KDA : attention",
                            style=_STYLE),
        "context": W.SelectionSlider(options=[(_label(n), n) for n in CONTEXTS], value=CONTEXTS[-1],
                                     description="context", style=_STYLE,
                                     continuous_update=False),
        "batch": W.SelectionSlider(options=list(BATCHES), value=1, description="batch",
                                   style=_STYLE, continuous_update=False),
        "weight_dtype": W.ToggleButtons(options=list(WEIGHT_DTYPES), value="bf16",
                                        description="weights", style=_STYLE),
        "cache_dtype": W.ToggleButtons(options=list(CACHE_DTYPES), value="bf16",
                                       description="KV cache", style=_STYLE),
        "tp": W.Dropdown(options=[1, 2, 4, 8], value=8, description="tensor parallel",
                         style=_STYLE),
    }

    def render(ratio, context, batch, weight_dtype, cache_dtype, tp, **values):
        spec = spec_from_controls(base, values, ratio)
        return k3_dashboard(spec, context, batch, weight_dtype, cache_dtype, tp)

    return explorer({**serving, **arch}, render,
                    title=f"Edit {base.name}: every field, the schedule, and how it is served")
