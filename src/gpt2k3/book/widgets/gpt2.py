"""Chapter 1 (GPT-2): a live parameter-breakdown explorer."""

from __future__ import annotations

import ipywidgets as W

from gpt2k3.accounting import ArchSpec
from gpt2k3.archs import GPT2_SMALL
from gpt2k3.book.figures import param_breakdown
from gpt2k3.book.widgets._explorer import Explorer, explorer

__all__ = ["param_explorer"]


def param_explorer(base: ArchSpec = GPT2_SMALL) -> Explorer:
    """Free n_layer / n_head / n_embd / vocab: where the parameters of any GPT-2-shaped model live.

    ``n_embd`` moves in steps of ``n_head`` so that it always divides into heads.
    """
    style = {"description_width": "initial"}
    n_layer = W.IntSlider(value=base.n_layer, min=1, max=128, description="n_layer", style=style)
    n_head = W.IntSlider(value=base.n_head, min=1, max=128, description="n_head", style=style)
    n_embd = W.IntSlider(value=base.n_embd, min=base.n_head, max=16384 // base.n_head * base.n_head,
                         step=base.n_head,
                         description="n_embd", style=style)
    vocab = W.IntSlider(value=base.vocab_size, min=256, max=262144, step=1, description="vocab",
                        style=style)
    tied = W.Checkbox(value=base.tied_embeddings, description="tied head")

    def keep_divisible(change):
        h = change["new"]
        # the maximum is a multiple of n_head too, so the slider's own end is a valid model
        top = 16384 // h * h
        if top >= n_embd.max:
            n_embd.max = top
            n_embd.min = h
        else:
            n_embd.min = h
            n_embd.max = top
        n_embd.step = h
        n_embd.value = max(h, round(n_embd.value / h) * h)

    n_head.observe(keep_divisible, names="value")

    def render(n_layer, n_head, n_embd, vocab, tied):
        spec = base.with_(name="your model", n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                          vocab_size=vocab, tied_embeddings=tied)
        return param_breakdown([spec])

    return explorer({"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd, "vocab": vocab,
                     "tied": tied}, render, title="Parameter breakdown of a GPT-2-shaped model")
