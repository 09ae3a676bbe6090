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

__all__ = ["Explorer", "explorer", "param_explorer"]


class Explorer(W.VBox):
    """An ipywidgets box: controls on top, the rendered figure below.

    ``current`` holds what is shown now: the object ``render`` returned, or the
    message of the ``ValueError`` it raised (an explorer never shows a stale or
    broken figure).
    """

    def __init__(self, controls: Mapping[str, W.ValueWidget], render: Callable[..., object],
                 title: str = ""):
        self.controls = dict(controls)
        self.render = render
        self.output = W.Output()
        self.current: object = None
        header = [W.HTML(f"<b>{title}</b>")] if title else []
        row = W.HBox(list(self.controls.values()), layout=W.Layout(flex_flow="row wrap"))
        super().__init__([*header, row, self.output])
        for w in self.controls.values():
            w.observe(self.redraw, names="value")
        self.redraw()

    def redraw(self, _change=None) -> None:
        values = {name: w.value for name, w in self.controls.items()}
        try:
            self.current = self.render(**values)
        except ValueError as err:
            self.current = W.HTML(f"<b>Not a valid setting:</b> {err}")
        with self.output:
            self.output.clear_output(wait=True)
            display(self.current)


def explorer(controls: Mapping[str, W.ValueWidget], render: Callable[..., object],
             title: str = "") -> Explorer:
    """Controls on top, the output of ``render(**values)`` below, redrawn on every change."""
    return Explorer(controls, render, title)


def param_explorer(base: ArchSpec = GPT2_SMALL) -> Explorer:
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
