"""Chapters 4 and 5 (DeltaNet): a live interference explorer and a live chunk-cost explorer."""

from __future__ import annotations

import ipywidgets as W

from gpt2k3.book.figures.delta import chunk_cost, interference_by_position
from gpt2k3.book.widgets._explorer import Explorer, explorer

__all__ = ["interference_explorer", "chunk_cost_explorer"]

_STYLE = {"description_width": "initial"}


def interference_explorer(d: int = 16, n: int = 32, beta: float = 1.0) -> Explorer:
    """Free ``D``, ``N`` (up to ``4 D``), ``beta`` and the kind of keys: the recall error of every
    stored pair under the additive rule, the delta rule and the least-squares state.

    The ``N`` slider's maximum follows ``4 D``; orthogonal keys need ``N <= D`` (the explorer says
    so instead of drawing).
    """
    d_w = W.IntSlider(value=d, min=2, max=128, description="head dim D", style=_STYLE)
    n_w = W.IntSlider(value=n, min=1, max=4 * d, description="stored pairs N", style=_STYLE)
    beta_w = W.FloatSlider(value=beta, min=0.0, max=2.0, step=0.05, description="write strength β",
                           style=_STYLE)
    keys_w = W.Dropdown(options=[("random unit keys", "random"), ("orthogonal keys", "orthogonal")],
                        value="random", description="keys", style=_STYLE)

    def follow_d(change):
        n_w.max = 4 * change["new"]

    d_w.observe(follow_d, names="value")

    def render(d, n, beta, keys):
        return interference_by_position(d, [n], beta=beta, key_kind=keys, trials=8)

    return explorer({"d": d_w, "n": n_w, "beta": beta_w, "keys": keys_w}, render,
                    title="Interference in a D × D state: which pairs come back?")


def chunk_cost_explorer(T: int = 4096, d: int = 64, chunk_size: int = 64) -> Explorer:
    """Free the sequence length, the head dimension and the chunk size: FLOPs per token and
    sequential steps of the chunkwise form against the token-by-token one (a model, not a
    measurement: see :func:`gpt2k3.ops.wy.chunkwise_cost`)."""
    T_w = W.IntSlider(value=T, min=64, max=65536, step=64, description="tokens T", style=_STYLE)
    d_w = W.IntSlider(value=d, min=16, max=512, step=16, description="head dim d", style=_STYLE)
    c_w = W.SelectionSlider(options=[2**i for i in range(11)], value=chunk_size,
                            description="chunk size C", style=_STYLE)

    def render(T, d, chunk_size):
        return chunk_cost(T, ds=[d], mark=chunk_size)

    return explorer({"T": T_w, "d": d_w, "chunk_size": c_w}, render,
                    title="The cost of the chunkwise form against its chunk size")
