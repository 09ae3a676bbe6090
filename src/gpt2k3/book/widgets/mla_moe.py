"""Chapter 7 (MLA and MoE): live explorers for a mixture-of-experts architecture and for
routing tokens to experts."""

from __future__ import annotations

import ipywidgets as W

from gpt2k3.accounting import ArchSpec, count_params, kv_cache_bytes
from gpt2k3.archs import DEEPSEEK_V3
from gpt2k3.book.display import fmt_gb
from gpt2k3.book.figures.mla_moe import PARAM_SPECS, moe_routing, param_components
from gpt2k3.book.widgets._explorer import Explorer, explorer

__all__ = ["moe_explorer", "routing_explorer"]

_STYLE = {"description_width": "initial"}
_CONTEXTS = [(f"{n // 1024}K" if n < 1 << 20 else f"{n >> 20}M", n)
             for n in (1 << p for p in range(10, 21))]


def moe_explorer(base: ArchSpec = DEEPSEEK_V3) -> Explorer:
    """Edit the experts and the latent of an MoE model (DeepSeek-V3 by default) and watch its
    total and active parameters, beside the published models, and its KV cache.

    ``top_k`` can never exceed the number of routed experts (its slider's maximum follows).
    """
    if not base.is_moe or base.attention != "mla":
        raise ValueError(f"base must be an MoE model with MLA attention, got {base.name!r}")

    def slider(value, lo, hi, step, name):
        return W.IntSlider(value=value, min=lo, max=hi, step=step, description=name,
                           style=_STYLE, continuous_update=False)

    experts = slider(base.n_routed_experts, 8, 1024, 8, "routed experts")
    top_k = slider(base.top_k, 1, min(64, base.n_routed_experts), 1, "top-k")
    shared = slider(base.n_shared_experts, 0, 4, 1, "shared experts")
    d_expert = slider(base.d_expert, 256, 8192, 256, "expert width")
    dense = slider(base.first_k_dense, 0, base.n_layer, 1, "leading dense layers")
    latent = slider(base.kv_lora_rank, 64, 2048, 64, "kv_lora_rank")
    context = W.SelectionSlider(options=_CONTEXTS, value=131072, description="context",
                                style=_STYLE, continuous_update=False)

    def follow(change):
        top_k.max = min(64, change["new"])

    experts.observe(follow, names="value")

    def render(experts, top_k, shared, d_expert, dense, latent, context):
        spec = base.with_(name="your model", n_routed_experts=experts, top_k=top_k,
                          n_shared_experts=shared, d_expert=d_expert, first_k_dense=dense,
                          kv_lora_rank=latent)
        fig = param_components([*PARAM_SPECS, spec], active=len(PARAM_SPECS))
        c = count_params(spec)
        cache = kv_cache_bytes(spec, context, dtype_bytes=2)
        fig.update_layout(title_text=(
            f"your model: {c.total:,} parameters, {c.active:,} active per token "
            f"({100 * c.active_fraction:.1f}%)<br>bf16 KV cache of one {context:,}-token "
            f"sequence: {fmt_gb(cache)}"), margin_t=160)
        return fig

    return explorer({"experts": experts, "top_k": top_k, "shared": shared, "d_expert": d_expert,
                     "dense": dense, "latent": latent, "context": context}, render,
                    title=f"Experts and latent of a {base.name}-shaped model")


def routing_explorer() -> Explorer:
    """Route toy tokens through a top-k router: experts, top-k, tokens, topics, and rounds of
    DeepSeek-V3's bias balancing (see :func:`gpt2k3.book.figures.routing_counts`)."""
    def slider(value, lo, hi, step, name):
        return W.IntSlider(value=value, min=lo, max=hi, step=step, description=name,
                           style=_STYLE, continuous_update=False)

    controls = {"n_experts": slider(16, 2, 64, 1, "experts"),
                "top_k": slider(2, 1, 16, 1, "top-k"),
                "n_tokens": slider(48, 8, 128, 8, "tokens"),
                "n_topics": slider(4, 1, 8, 1, "topics"),
                "balance_steps": slider(0, 0, 50, 1, "balancing rounds"),
                "seed": slider(0, 0, 9, 1, "seed")}
    # top-k can never exceed the number of experts: its range follows that slider
    controls["top_k"].max = min(16, controls["n_experts"].value)

    def follow(change):
        controls["top_k"].max = min(16, change["new"])

    controls["n_experts"].observe(follow, names="value")

    def render(n_experts, top_k, n_tokens, n_topics, balance_steps, seed):
        return moe_routing(top_ks=(top_k,), n_experts=n_experts, n_tokens=n_tokens,
                           n_topics=n_topics, balance_steps=balance_steps, seed=seed)

    return explorer(controls, render, title="Routing tokens to experts")
