"""Chapter 3 (linear attention): live explorers for the state-vs-cache arithmetic and for the
attention weights of softmax vs ELU+1."""

from __future__ import annotations

import ipywidgets as W

from gpt2k3.book.figures.linear import feature_map_weights, state_vs_cache
from gpt2k3.book.widgets._explorer import Explorer, explorer

__all__ = ["state_explorer", "weights_explorer"]

_STYLE = {"description_width": "initial"}


def state_explorer() -> Explorer:
    """Any head dim, head count, depth, number format and context range: bytes held by a KV
    cache vs a linear state, and the total work of generating N tokens."""
    head_dim = W.IntSlider(value=64, min=8, max=512, step=8, description="head dim D", style=_STYLE)
    n_head = W.IntSlider(value=12, min=1, max=128, description="heads", style=_STYLE)
    n_layer = W.IntSlider(value=12, min=1, max=128, description="layers", style=_STYLE)
    dtype_bytes = W.Dropdown(options=[("float32 (4 B)", 4), ("bf16 / fp16 (2 B)", 2), ("fp8 (1 B)", 1)],
                             value=4, description="numbers", style=_STYLE)
    max_n = W.Dropdown(options=[(f"{2 ** p:,}", 2 ** p) for p in range(10, 25, 2)], value=2 ** 20,
                       description="context up to", style=_STYLE)

    def render(head_dim, n_head, n_layer, dtype_bytes, max_n):
        return state_vs_cache([head_dim], n_layer=n_layer, n_head=n_head, dtype_bytes=dtype_bytes,
                              max_n=max_n)

    return explorer({"head_dim": head_dim, "n_head": n_head, "n_layer": n_layer,
                     "dtype_bytes": dtype_bytes, "max_n": max_n}, render,
                    title="KV cache vs linear state: memory held and total work")


def weights_explorer() -> Explorer:
    """Softmax vs ELU+1 weights on the same random queries and keys: free scale, length, head
    dim and seed."""
    scale = W.FloatLogSlider(value=1.0, base=2, min=-3, max=5, step=0.25, description="scale of q, k",
                             style=_STYLE)
    T = W.IntSlider(value=12, min=2, max=48, description="tokens T", style=_STYLE)
    D = W.IntSlider(value=16, min=1, max=128, description="head dim D", style=_STYLE)
    seed = W.IntSlider(value=0, min=0, max=99, description="seed", style=_STYLE)

    def render(scale, T, D, seed):
        return feature_map_weights(T=T, D=D, scales=[scale], seed=seed)

    return explorer({"scale": scale, "T": T, "D": D, "seed": seed}, render,
                    title="What the ELU+1 feature map does to the attention weights")
