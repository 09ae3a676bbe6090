"""Chapter "What Kimi K3 adds": live explorers for Attention Residuals, the bounded decay, latent
experts and SiTU. Each renders the chapter's figure (:mod:`gpt2k3.book.figures.k3_adds`) for one
setting; every control is bounded, and a range that depends on another control follows it."""

from __future__ import annotations

import ipywidgets as W

from gpt2k3.accounting.k3_mechanisms import SITU_BETA, SITU_LINEAR_BETA
from gpt2k3.archs import KIMI_K3
from gpt2k3.book.figures.k3_adds import (
    attn_res_sources,
    bounded_decay,
    latent_experts,
    situ_vs_swiglu,
)
from gpt2k3.book.widgets._explorer import Explorer, explorer

__all__ = ["attn_res_explorer", "bounded_decay_explorer", "latent_moe_explorer",
           "situ_explorer"]

_STYLE = {"description_width": "initial"}


def attn_res_explorer() -> Explorer:
    """Any depth and block size (up to the depth): the sources each read mixes and how many
    numbers a token keeps, at any width."""
    n_layer = W.IntSlider(value=KIMI_K3.n_layer, min=1, max=128, description="layers",
                          style=_STYLE)
    block = W.IntSlider(value=KIMI_K3.attn_res_block_size, min=1, max=KIMI_K3.n_layer,
                        description="block size (decoder layers)", style=_STYLE)
    n_embd = W.Dropdown(options=[768, 2304, 4096, 7168, 8192], value=KIMI_K3.n_embd,
                         description="n_embd", style=_STYLE)

    def follow(change):
        block.max = change["new"]
        block.value = min(block.value, block.max)

    n_layer.observe(follow, names="value")

    def render(n_layer, block, n_embd):
        sizes = sorted({1, 2, 4, 8, 16, 32, 64, 128, block, n_layer} & set(range(1, n_layer + 1)))
        return attn_res_sources(n_layer, sizes, n_embd=n_embd, active=sizes.index(block))

    return explorer({"n_layer": n_layer, "block": block, "n_embd": n_embd}, render,
                    title="Attention Residuals: the sources of every read")


def bounded_decay_explorer() -> Explorer:
    """K3's bounded decay and Kimi Linear's unbounded one for any A_log, dt_bias and floor."""
    a_log = W.FloatSlider(value=0.0, min=-4.0, max=4.0, step=0.1, description="A_log",
                          style=_STYLE)
    dt_bias = W.FloatSlider(value=0.0, min=-8.0, max=8.0, step=0.25, description="dt_bias",
                            style=_STYLE)
    bound = W.FloatSlider(value=KIMI_K3.kda_gate_lower_bound, min=-20.0, max=-0.25, step=0.25,
                          description="lower bound of g", style=_STYLE)
    span = W.FloatSlider(value=12.0, min=2.0, max=40.0, step=1.0,
                         description="x from −span to +span", style=_STYLE)

    def render(a_log, dt_bias, bound, span):
        return bounded_decay([a_log], dt_bias=dt_bias, lower_bound=bound, x_range=(-span, span))

    return explorer({"a_log": a_log, "dt_bias": dt_bias, "bound": bound, "span": span}, render,
                    title="KDA's decay: Kimi K3's bounded form and Kimi Linear's")


def latent_moe_explorer() -> Explorer:
    """Kimi K3's MoE with any expert count, experts per token (up to the count), expert width
    and latent width (up to ``n_embd``)."""
    experts = W.IntSlider(value=KIMI_K3.n_routed_experts, min=8, max=2048, step=8,
                          description="routed experts", style=_STYLE)
    top_k = W.IntSlider(value=KIMI_K3.top_k, min=1, max=64, description="experts per token",
                        style=_STYLE)
    d_expert = W.IntSlider(value=KIMI_K3.d_expert, min=256, max=8192, step=256,
                           description="expert width", style=_STYLE)
    latent = W.IntSlider(value=KIMI_K3.moe_latent_dim, min=256, max=KIMI_K3.n_embd, step=256,
                         description="latent width", style=_STYLE)

    def follow(change):
        top_k.max = min(64, change["new"])
        top_k.value = min(top_k.value, top_k.max)

    experts.observe(follow, names="value")

    def render(experts, top_k, d_expert, latent):
        spec = KIMI_K3.with_(n_routed_experts=experts, top_k=top_k, d_expert=d_expert)
        return latent_experts(spec, [latent])

    return explorer({"experts": experts, "top_k": top_k, "d_expert": d_expert, "latent": latent},
                    render, title="Latent experts: what a narrower expert width buys")


def situ_explorer() -> Explorer:
    """SiTU's gate clip and up clip, and the range of pre-activations drawn."""
    beta = W.FloatLogSlider(value=SITU_BETA, base=2, min=-2, max=6, step=0.25,
                            description="β (gate clip)", style=_STYLE)
    linear_beta = W.FloatLogSlider(value=SITU_LINEAR_BETA, base=2, min=0, max=8, step=0.25,
                                   description="linear β (up clip)", style=_STYLE)
    span = W.FloatSlider(value=24.0, min=4.0, max=100.0, step=2.0,
                         description="gate up to", style=_STYLE)

    def render(beta, linear_beta, span):
        return situ_vs_swiglu([beta], linear_beta=linear_beta, gate_range=(-8.0, span),
                              up_range=(-4 * linear_beta, 4 * linear_beta))

    return explorer({"beta": beta, "linear_beta": linear_beta, "span": span}, render,
                    title="SiTU-GLU against SwiGLU")
