"""Chapter 9 (Kimi K3 accounting): a live explorer in which the reader edits every field of an
:class:`~gpt2k3.accounting.ArchSpec` (Kimi K3's by default) and the serving assumptions, and
sees the whole account.

Every control is bounded (:data:`FIELD_BOUNDS`): a number box clamps what is typed to its
range, and a text box (a size that may be ``None``) that holds a number outside it shows the
error naming the field, so no setting can ask for a model too large to count in an instant
(a depth of 10^12 would build a layer list of 10^12 entries).
"""

from __future__ import annotations

import math
import typing
from dataclasses import fields

import ipywidgets as W

from gpt2k3.accounting import (
    ATTENTION_KINDS,
    MLPS,
    NORMS,
    POSITIONS,
    ArchSpec,
    hybrid_layers,
    hybrid_spec,
)
from gpt2k3.archs import KIMI_K3
from gpt2k3.book.figures.k3_tables import (
    BATCHES,
    CACHE_DTYPES,
    CONTEXTS,
    WEIGHT_DTYPES,
)
from gpt2k3.book.figures.k3 import k3_dashboard
from gpt2k3.book.widgets._explorer import Explorer, explorer
from gpt2k3.checks import check_bool, check_positive_int, is_real

__all__ = ["k3_explorer", "spec_controls", "spec_from_controls", "FIELD_BOUNDS"]

_STYLE = {"description_width": "initial"}
_CHOICES = {"norm": NORMS, "mlp": MLPS, "position": POSITIONS, "attention": ATTENTION_KINDS}
#: Fields the explorer does not offer: the label and citation, and the KDA layer list, which
#: the schedule control writes.
_SKIP = ("name", "source", "kda_layers")
_SCHEDULES = ([("0:1 (all attention)", 0)] + [(f"{r}:1", r) for r in range(1, 16)]
              + [("all KDA", None)])

#: ``(least, most)`` value of every numeric field the explorer offers: wide enough for any
#: published model (Kimi K3 sits well inside every range), small enough that every count,
#: schedule and plan is computed at once.
FIELD_BOUNDS: dict[str, tuple[float, float]] = {
    "vocab_size": (1, 1 << 21), "n_layer": (1, 512), "n_embd": (1, 1 << 16),
    "n_head": (1, 1024), "d_ff": (1, 1 << 20), "max_positions": (0, 1 << 24),
    "n_kv_head": (1, 1024), "d_head": (1, 4096), "q_lora_rank": (1, 1 << 16),
    "kv_lora_rank": (0, 1 << 16), "qk_nope_head_dim": (0, 4096), "qk_rope_head_dim": (0, 4096),
    "v_head_dim": (0, 4096), "kda_n_head": (0, 1024), "kda_head_dim": (0, 4096),
    "kda_conv_kernel": (0, 64), "n_routed_experts": (0, 1 << 16), "n_shared_experts": (0, 64),
    "top_k": (0, 1024), "d_expert": (0, 1 << 20), "first_k_dense": (0, 512),
    "moe_latent_dim": (0, 1 << 16), "attn_res_block_size": (0, 512),
    "kda_gate_lower_bound": (-100.0, -1e-3),
}


def _label(n: int) -> str:
    return f"{n // 1024}K" if n < 1 << 20 else f"{n >> 20}M"


def _offered(base: ArchSpec) -> list[str]:
    """The fields of ``base`` the explorer offers (the vision tower only if it has one)."""
    return [f.name for f in fields(ArchSpec)
            if f.name not in _SKIP and not (f.name == "vision" and base.vision is None)]


def spec_controls(base: ArchSpec = KIMI_K3) -> dict[str, W.ValueWidget]:
    """One widget per editable field of ``base`` (every field but its name, source and KDA
    layer list; the vision tower only when ``base`` has one), holding its value: a checkbox
    for a flag (and for the vision tower: kept or dropped), a menu for a choice, a bounded
    number box for a size (:data:`FIELD_BOUNDS`) and a text box for a size or bound that may
    be ``None``."""
    if not isinstance(base, ArchSpec):
        raise ValueError(f"base must be an ArchSpec, got {type(base).__name__}")
    hints = typing.get_type_hints(ArchSpec)
    out: dict[str, W.ValueWidget] = {}
    for name in _offered(base):
        value, kind = getattr(base, name), hints[name]
        common = dict(description=name, style=_STYLE, layout=W.Layout(width="230px"))
        if name in _CHOICES:
            out[name] = W.Dropdown(options=list(_CHOICES[name]), value=value, **common)
        elif name == "vision":
            out[name] = W.Checkbox(value=True, indent=False, **common)
        elif kind is bool:
            out[name] = W.Checkbox(value=value, indent=False, **common)
        elif kind is int:
            lo, hi = FIELD_BOUNDS[name]
            out[name] = W.BoundedIntText(value=value, min=lo, max=hi, continuous_update=False,
                                         **common)
        else:  # int | None, float | None: a text box, so that "None" can be typed
            out[name] = W.Text(value=str(value), continuous_update=False, **common)
    return out


def _parse(name: str, value, base: ArchSpec):
    """The field value a control holds, checked against :data:`FIELD_BOUNDS`."""
    if name == "vision":
        check_bool(value, "vision")
        return base.vision if value else None
    if isinstance(value, str) and name not in _CHOICES:
        text = value.strip()
        if text.lower() in ("", "none"):
            return None
        kind = float if name == "kda_gate_lower_bound" else int
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(f"{name} must be {'a number' if kind is float else 'an int'} or "
                             f"None, got {text!r}") from None
    if name in FIELD_BOUNDS and is_real(value):
        lo, hi = FIELD_BOUNDS[name]
        if not (isinstance(value, int) or math.isfinite(value)) or not lo <= value <= hi:
            raise ValueError(f"{name} must be in [{lo:g}, {hi:g}] in this explorer, got {value!r}")
    return value


def spec_from_controls(base: ArchSpec, values: dict, ratio: int | None) -> ArchSpec:
    """``base`` with the fields in ``values`` (as the widgets of :func:`spec_controls` hold
    them) and the KDA layers of a ``ratio``:1 schedule (``None``: every layer).  A value
    outside :data:`FIELD_BOUNDS` or an impossible spec raises ``ValueError`` naming the
    field."""
    if not isinstance(base, ArchSpec):
        raise ValueError(f"base must be an ArchSpec, got {type(base).__name__}")
    changes = {name: _parse(name, value, base) for name, value in values.items()}
    n_layer = changes.get("n_layer", base.n_layer)
    check_positive_int(n_layer, "n_layer")
    edited = base.with_(kda_layers=(), **changes)
    return hybrid_spec(edited, ratio).with_(name=f"{base.name} (edited)")


def k3_explorer(base: ArchSpec = KIMI_K3) -> Explorer:
    """Edit any field of ``base`` (Kimi K3 by default), its KDA : attention schedule, the
    context, the batch, the weight format (bf16, fp8, or the released checkpoint's MXFP4
    experts) and the cache format and the tensor-parallel degree, and see the whole account:
    parameters, bytes, FLOPs, the roofline and the H200s it needs
    (:func:`gpt2k3.book.figures.k3_dashboard`).  Every control is bounded."""
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
