"""Chapter 2 (the KV cache): a live explorer of what a decode step reads."""

from __future__ import annotations

import ipywidgets as W

from gpt2k3.accounting import DTYPE_BYTES
from gpt2k3.book.figures.kv_cache import decode_step_bytes, registered_specs
from gpt2k3.book.widgets._explorer import Explorer, explorer

__all__ = ["cache_explorer"]


def cache_explorer() -> Explorer:
    """Any model of :mod:`gpt2k3.archs`, any context from 1 to 1M tokens, any batch and
    number formats: the bytes a decode step reads from weights and from the KV cache."""
    specs = {s.name: s for s in registered_specs()}
    style = {"description_width": "initial"}
    model = W.SelectMultiple(options=list(specs), value=tuple(specs)[:4], description="models",
                             rows=min(6, len(specs)), style=style)
    context = W.SelectionSlider(options=[2 ** i for i in range(21)], value=4096,
                                description="context", style=style)
    batch = W.IntSlider(value=1, min=1, max=512, description="batch", style=style)
    wdtype = W.Dropdown(options=list(DTYPE_BYTES), value="bf16", description="weights", style=style)
    cdtype = W.Dropdown(options=list(DTYPE_BYTES), value="bf16", description="KV cache", style=style)

    def render(model, context, batch, wdtype, cdtype):
        if not model:
            raise ValueError("choose at least one model")
        return decode_step_bytes([specs[m] for m in model], contexts=[context], batch=batch,
                                 weight_dtype=wdtype, cache_dtype=cdtype)

    return explorer({"model": model, "context": context, "batch": batch, "wdtype": wdtype,
                     "cdtype": cdtype}, render, title="What one decode step reads")
