"""Live explorers for Jupyter and Colab: ipywidgets controls that recompute anything.

Each function returns an ipywidgets box.  They reuse the figure builders of
:mod:`gpt2k3.figures` (so the live and static views are the same figure) and the
accounting of :mod:`gpt2k3.accounting`.  In the static web book a kernel is
missing, so the notebooks hide these outputs there and say how to run them.
"""

from __future__ import annotations

from typing import Callable, Mapping

import ipywidgets as W
from IPython.display import display

from .accounting import ArchSpec
from .archs import GPT2_SMALL
from .figures import param_breakdown

__all__ = ["explorer", "param_explorer"]


def explorer(controls: Mapping[str, W.ValueWidget], render: Callable[..., object],
             title: str = "") -> W.VBox:
    """Controls on top, the output of ``render(**values)`` below, redrawn on every change.

    A ``ValueError`` raised by ``render`` is shown as a message instead of a figure,
    so an explorer never shows a stale or broken figure.
    """
    out = W.Output()

    def redraw(_change=None):
        values = {name: w.value for name, w in controls.items()}
        with out:
            out.clear_output(wait=True)
            try:
                display(render(**values))
            except ValueError as err:
                display(W.HTML(f"<b>Not a valid setting:</b> {err}"))

    for w in controls.values():
        w.observe(redraw, names="value")
    redraw()
    header = [W.HTML(f"<b>{title}</b>")] if title else []
    return W.VBox([*header, W.HBox(list(controls.values()), layout=W.Layout(flex_flow="row wrap")), out])


def param_explorer(base: ArchSpec = GPT2_SMALL) -> W.VBox:
    """Free n_layer / n_head / n_embd / vocab: where the parameters of any GPT-2-shaped model live.

    ``n_embd`` moves in steps of ``n_head`` so that it always divides into heads.
    """
    style = {"description_width": "initial"}
    n_layer = W.IntSlider(value=base.n_layer, min=1, max=128, description="n_layer", style=style)
    n_head = W.IntSlider(value=base.n_head, min=1, max=128, description="n_head", style=style)
    n_embd = W.IntSlider(value=base.d_model, min=base.n_head, max=16384, step=base.n_head,
                         description="n_embd", style=style)
    vocab = W.IntSlider(value=base.vocab_size, min=256, max=262144, step=1, description="vocab",
                        style=style)
    tied = W.Checkbox(value=base.tied_embeddings, description="tied head")

    def keep_divisible(change):
        h = change["new"]
        n_embd.min = h
        n_embd.step = h
        n_embd.value = max(h, round(n_embd.value / h) * h)

    n_head.observe(keep_divisible, names="value")

    def render(n_layer, n_head, n_embd, vocab, tied):
        spec = base.with_(name="your model", n_layer=n_layer, n_head=n_head, d_model=n_embd,
                          vocab_size=vocab, tied_embeddings=tied)
        return param_breakdown([spec])

    return explorer({"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd, "vocab": vocab,
                     "tied": tied}, render, title="Parameter breakdown of a GPT-2-shaped model")
