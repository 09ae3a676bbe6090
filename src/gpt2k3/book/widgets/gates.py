"""Chapter 6 (gates): live explorers for memory half-life, retrieval after distractors, and the
cache of a KDA / attention hybrid. Each renders the chapter's figure for one setting."""

from __future__ import annotations

import ipywidgets as W

from gpt2k3.archs import KIMI_LINEAR_48B
from gpt2k3.book.figures.gates import (
    distractor_retrieval,
    hybrid_cache,
    memory_half_life,
)
from gpt2k3.book.widgets._explorer import Explorer, explorer
from gpt2k3.experiments.forgetting import log_alpha_for_half_life

__all__ = ["half_life_explorer", "retrieval_explorer", "hybrid_explorer"]

_STYLE = {"description_width": "initial"}


def half_life_explorer() -> Explorer:
    """Any gate half-life, head dim, write strength and stream length: how long one association
    survives the gate alone, and the gate plus a random write on every token."""
    half = W.FloatLogSlider(value=64, base=2, min=0, max=14, step=0.25,
                            description="half-life of the gate (tokens)", style=_STYLE)
    no_gate = W.Checkbox(value=False, description="no gate (α = 1)")
    # d and the stream are bounded so that every setting redraws in under 2 s on a 2-core CPU
    d = W.IntSlider(value=16, min=2, max=32, description="head dim d", style=_STYLE)
    beta = W.FloatSlider(value=0.5, min=0.0, max=1.0, step=0.05, description="write strength β",
                         style=_STYLE)
    n_tokens = W.Dropdown(options=[256, 512, 1024, 2048], value=1024,
                          description="tokens after it", style=_STYLE)

    def render(half, no_gate, d, beta, n_tokens):
        la = 0.0 if no_gate else log_alpha_for_half_life(half)
        return memory_half_life([la], d=d, beta=beta, n_tokens=n_tokens, trials=32)

    return explorer({"half": half, "no_gate": no_gate, "d": d, "beta": beta, "n_tokens": n_tokens},
                    render, title="Memory half-life: the gate's clock and the writes' clock")


def retrieval_explorer() -> Explorer:
    """DeltaNet vs Gated DeltaNet vs KDA on one fact followed by distractors: free head dim,
    keeping channels, decay of the others, write strength, and where distractor keys live."""
    d = W.IntSlider(value=16, min=2, max=48, description="head dim d", style=_STYLE)
    keep = W.IntSlider(value=8, min=1, max=15, description="KDA channels that keep", style=_STYLE)
    decay = W.FloatLogSlider(value=0.1, base=10, min=-3, max=1, step=0.1,
                             description="−log α of the others", style=_STYLE)
    beta = W.FloatSlider(value=0.5, min=0.05, max=1.0, step=0.05, description="write strength β",
                         style=_STYLE)
    n_tokens = W.IntSlider(value=96, min=8, max=512, step=8, description="distractors",
                           style=_STYLE)
    where = W.Dropdown(options=[("all channels", "all"), ("forgetting channels only", "forgetting")],
                       value="all", description="distractor keys in", style=_STYLE)

    def keep_in_range(change):
        keep.max = change["new"] - 1
        keep.value = min(keep.value, keep.max)

    d.observe(keep_in_range, names="value")

    def render(d, keep, decay, beta, n_tokens, where):
        return distractor_retrieval([-decay], d=d, keep=keep, beta=beta, n_tokens=n_tokens,
                                    distractors_in=where, trials=48)

    return explorer({"d": d, "keep": keep, "decay": decay, "beta": beta, "n_tokens": n_tokens,
                     "where": where}, render,
                    title="One fact, then distractors: DeltaNet, Gated DeltaNet, KDA")


def hybrid_explorer() -> Explorer:
    """Kimi Linear's layers with any depth, KDA : attention ratio, context length and state
    precision: which layers keep a growing cache, and the bytes per sequence."""
    n_layer = W.IntSlider(value=KIMI_LINEAR_48B.n_layer, min=1, max=128, description="layers",
                          style=_STYLE)
    ratio = W.IntSlider(value=3, min=0, max=31, description="KDA layers per attention layer",
                        style=_STYLE)
    all_kda = W.Checkbox(value=False, description="all KDA (no attention)")
    context = W.Dropdown(options=[(f"{2 ** p:,}", 2 ** p) for p in range(12, 27, 2)], value=2 ** 20,
                         description="context (tokens)", style=_STYLE)
    state_bytes = W.Dropdown(options=[("float32 (4 B)", 4), ("bf16 (2 B)", 2)], value=4,
                             description="state numbers", style=_STYLE)

    def render(n_layer, ratio, all_kda, context, state_bytes):
        spec = KIMI_LINEAR_48B.with_(n_layer=n_layer, kda_layers=(),
                                     first_k_dense=min(KIMI_LINEAR_48B.first_k_dense, n_layer))
        return hybrid_cache(spec, ratios=[None if all_kda else ratio], context_len=context,
                            state_dtype_bytes=state_bytes)

    return explorer({"n_layer": n_layer, "ratio": ratio, "all_kda": all_kda, "context": context,
                     "state_bytes": state_bytes}, render,
                    title="A KDA / attention hybrid: which layers grow, and how much memory")
