"""Chapter "What Kimi K3 adds": a live explorer of Quantile Balancing against the sign rule.

It renders the chapter's figure (:func:`gpt2k3.book.figures.k3_adds.quantile_balancing`) for
one setting, recomputing the runs (:func:`gpt2k3.book.figures.k3_adds.balancing_runs`) at any
router shape, batch size, skew and sign-rule step."""

from __future__ import annotations

import ipywidgets as W

from gpt2k3.archs import KIMI_K3
from gpt2k3.book.figures.k3_adds import balancing_runs, quantile_balancing
from gpt2k3.book.widgets._explorer import Explorer, explorer

__all__ = ["balancing_explorer"]

_STYLE = {"description_width": "initial"}


def balancing_explorer() -> Explorer:
    """Any expert count, experts per token (below the count), batch size, skew, number of steps
    and sign-rule step; the top-k follows the expert count."""
    experts = W.IntSlider(value=KIMI_K3.n_routed_experts, min=8, max=1024, step=8,
                          description="routed experts", style=_STYLE)
    top_k = W.IntSlider(value=KIMI_K3.top_k, min=1, max=64, description="experts per token",
                        style=_STYLE)
    tokens = W.IntSlider(value=1024, min=128, max=8192, step=128, description="tokens per batch",
                         style=_STYLE)
    steps = W.IntSlider(value=12, min=2, max=40, description="steps", style=_STYLE)
    skew = W.FloatSlider(value=1.0, min=0.0, max=3.0, step=0.1, description="skew",
                         style=_STYLE)
    sign_step = W.FloatLogSlider(value=1e-3, base=10, min=-4, max=-1, step=0.25,
                                 description="sign rule's step", style=_STYLE)

    def follow(change):
        top_k.max = min(64, change["new"] - 1)
        top_k.value = min(top_k.value, top_k.max)

    experts.observe(follow, names="value")

    def render(experts, top_k, tokens, steps, skew, sign_step):
        runs = balancing_runs(experts, top_k, tokens, steps, [sign_step], skew)
        return quantile_balancing(runs)

    return explorer({"experts": experts, "top_k": top_k, "tokens": tokens, "steps": steps,
                     "skew": skew, "sign_step": sign_step}, render,
                    title="Quantile Balancing against the sign rule")
