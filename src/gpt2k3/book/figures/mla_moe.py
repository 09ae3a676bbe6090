"""Chapter 7 (MLA and MoE): the latent cache against MHA's, routing tokens to experts, and
total against active parameters from GPT-2 to Kimi Linear.

Cache sizes and parameter counts come from :mod:`gpt2k3.accounting`
(:func:`~gpt2k3.accounting.mla_cache_variants`, :func:`~gpt2k3.accounting.kv_cache_bytes`,
:func:`~gpt2k3.accounting.count_params`); the routing figures run the real
:class:`gpt2k3.layers.moe.Router` on toy tokens.
"""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from gpt2k3.accounting import (
    DETAIL_COMPONENTS,
    H200,
    ArchSpec,
    count_params,
    kv_cache_bytes,
    mla_cache_variants,
)
from gpt2k3.archs import DEEPSEEK_V3, GPT2_SMALL, GPT2_XL, KIMI_K2, KIMI_LINEAR_48B
from gpt2k3.book.display import fmt_count, fmt_gb
from gpt2k3.book.figures._style import PALETTE, Step, add_slider, style
from gpt2k3.checks import check_int, is_int
from gpt2k3.layers.moe import MoEConfig, Router

__all__ = ["mla_cache_variants", "mla_cache", "routing_counts", "moe_routing", "moe_balancing",
           "param_components", "H200_MEMORY_BYTES", "PARAM_SPECS", "mla_absorption_schematic",
           "routing_schematic"]

#: Memory of one NVIDIA H200 (:data:`gpt2k3.accounting.H200`, NVIDIA's datasheet): a reference
#: line.
H200_MEMORY_BYTES = H200.memory_bytes

#: The models of :func:`param_components` by default: GPT-2 to Kimi K2, small to large.
PARAM_SPECS = (GPT2_SMALL, GPT2_XL, KIMI_LINEAR_48B, DEEPSEEK_V3, KIMI_K2)


def _finish(fig: go.Figure) -> go.Figure:
    """Keep two-line titles inside the figure (plotly anchors a multi-line title's first line
    at ``title.y``, so without padding its top is clipped)."""
    fig.update_layout(title_pad_t=12)
    return fig


def _label(spec: ArchSpec) -> str:
    """A slider label short enough that five of them fit under a book-width figure."""
    return spec.name.replace(" 48B-A3B", "")


def _log_contexts(max_context: int) -> list[int]:
    ctx, n = [], 1024
    while n <= max_context:
        ctx.append(n)
        n *= 2
    return ctx


def mla_cache(spec: ArchSpec = DEEPSEEK_V3, batches: Sequence[int] = (1, 4, 16, 64, 256),
              max_context: int = 1 << 20, dtype_bytes: float = 2, gqa_kv_heads: int = 8,
              active: int = 0) -> go.Figure:
    """KV-cache bytes of ``spec`` against context (1K to ``max_context`` tokens, log-log) for
    the MLA latent, an MHA cache of the same heads and a GQA cache; a slider over the batch.

    The MLA line is :func:`gpt2k3.accounting.kv_cache_bytes`; the others scale it by the
    per-layer numbers of :func:`mla_cache_variants`.  A dashed line marks one H200's memory.
    """
    batches = list(batches)
    if not batches or any(not is_int(b) or b < 1 for b in batches):
        raise ValueError(f"batches must be positive ints, got {batches!r}")
    check_int(max_context, "max_context", 1024)
    variants = mla_cache_variants(spec, gqa_kv_heads)
    latent = variants["MLA latent"]
    ctx = _log_contexts(max_context)
    fig = go.Figure()
    colors = (PALETTE[0], PALETTE[1], PALETTE[2])
    for (label, numbers), color in zip(variants.items(), colors):
        fig.add_trace(go.Scatter(
            name=f"{label} ({numbers:,} numbers/token/layer)", mode="lines+markers",
            line_color=color, marker_size=5,
            hovertemplate="%{x:,} tokens: %{text}<extra>" + label + "</extra>"))
    fig.add_trace(go.Scatter(name=f"one H200 ({fmt_gb(H200_MEMORY_BYTES)})", mode="lines",
                             x=[ctx[0], ctx[-1]], y=[H200_MEMORY_BYTES / 1e9] * 2,
                             line=dict(color="#555", dash="dash"), hoverinfo="skip"))
    style(fig, title="", x_title="context length (tokens, log scale)",
          y_title="KV cache, all layers (GB, log scale)", height=520)
    fig.update_layout(margin=dict(t=150), legend=dict(y=1.04))
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log", exponentformat="power")
    ref = min(ctx, key=lambda n: abs(n - 131072))
    steps = []
    for b in batches:
        base = [kv_cache_bytes(spec, n, batch=b, dtype_bytes=dtype_bytes) for n in ctx]
        ys = [[v * numbers / latent / 1e9 for v in base] for numbers in variants.values()]
        texts = [[fmt_gb(y * 1e9) for y in row] for row in ys]
        at = ctx.index(ref)
        steps.append(Step(
            label=str(b), data={"x": [ctx] * 3, "y": ys, "text": texts}, traces=[0, 1, 2],
            layout={"title.text": (f"{spec.name}, batch {b}, {dtype_bytes:g} bytes per number: "
                                   f"at {ref:,} tokens<br>the latent cache holds "
                                   f"{texts[0][at]}, an MHA cache of the same heads "
                                   f"{texts[1][at]} ({ys[1][at] / ys[0][at]:.0f}× more)")}))
    return _finish(add_slider(fig, steps, prefix="batch: ", active=active))


def routing_counts(n_experts: int = 16, top_k: int = 2, n_tokens: int = 48, n_embd: int = 32,
                   n_topics: int = 4, balance_steps: int = 0, bias_step: float = 0.01,
                   seed: int = 0) -> dict[str, object]:
    """Route ``n_tokens`` toy tokens through a sigmoid top-``top_k`` router over ``n_experts``.

    Tokens are drawn around ``n_topics`` random centres (token ``n`` belongs to topic
    ``n * n_topics // n_tokens``), so tokens of one topic tend to pick the same experts -- the
    load imbalance a real router must fight.  ``balance_steps`` rounds of DeepSeek-V3's
    auxiliary-loss-free balancing (:meth:`gpt2k3.layers.moe.Router.update_bias` with ``bias_step``) are
    applied on these tokens first.  The router weights and the tokens depend only on ``seed``,
    ``n_experts``, ``n_tokens``, ``n_embd`` and ``n_topics``: changing ``top_k`` or
    ``balance_steps`` re-routes the same tokens.

    Returns ``weights`` (``n_tokens`` rows of ``n_experts`` routing weights, 0 where not
    chosen, each row summing to 1; rounded to 4 decimals, which is all a figure shows and keeps
    stored notebook outputs identical across machines), ``load`` (tokens per expert, summing to
    ``n_tokens * top_k``), ``topic`` (per token), ``mean_load`` and ``max_over_mean``.
    """
    for name, value, lo in (("n_experts", n_experts, 1), ("top_k", top_k, 1),
                            ("n_tokens", n_tokens, 1), ("n_embd", n_embd, 1),
                            ("n_topics", n_topics, 1), ("balance_steps", balance_steps, 0),
                            ("seed", seed, 0)):
        check_int(value, name, lo)
    if top_k > n_experts:
        raise ValueError(f"top_k ({top_k}) must be <= n_experts ({n_experts})")
    if n_topics > n_tokens:
        raise ValueError(f"n_topics ({n_topics}) must be <= n_tokens ({n_tokens})")
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(n_topics, n_embd, generator=gen, dtype=torch.float64)
    topic = torch.arange(n_tokens) * n_topics // n_tokens
    x = centres[topic] + 0.5 * torch.randn(n_tokens, n_embd, generator=gen, dtype=torch.float64)
    router = Router(MoEConfig(n_embd=n_embd, n_routed_experts=n_experts, n_shared_experts=0,
                              top_k=top_k, d_expert=1, score_func="sigmoid")).double()
    with torch.no_grad():
        router.weight.copy_(torch.randn(n_experts, n_embd, generator=gen, dtype=torch.float64)
                            * n_embd ** -0.5)
        for _ in range(balance_steps):
            load = torch.bincount(router(x)[1].flatten(), minlength=n_experts)
            router.update_bias(load, step=bias_step)
        weights = router.assignment(x)
    load = (weights > 0).sum(0)
    mean = n_tokens * top_k / n_experts
    return {"weights": weights.round(decimals=4).tolist(), "load": load.tolist(), "topic": topic.tolist(),
            "mean_load": mean, "max_over_mean": load.max().item() / mean}


def _assignment_points(weights: list[list[float]], topic: list[int]):
    """The chosen (expert, token) pairs of a routing matrix as marker coordinates."""
    xs, ys, ws, texts = [], [], [], []
    for n, row in enumerate(weights):
        for e, w in enumerate(row):
            if w > 0:
                xs.append(e)
                ys.append(n)
                ws.append(w)
                texts.append(f"token {n} (topic {topic[n]}) → expert {e}: weight {w:.2f}")
    return xs, ys, ws, texts


def _routing_figure(runs: list[dict], labels: list[str], titles: list[str], prefix: str,
                    active: int) -> go.Figure:
    """The two-panel routing figure for ``runs`` of :func:`routing_counts`, one slider step
    per run (no slider for a single run)."""
    n_experts = len(runs[0]["load"])
    n_tokens = len(runs[0]["weights"])
    topics = runs[0]["topic"]
    experts = list(range(n_experts))
    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5], horizontal_spacing=0.1)
    fig.add_trace(go.Scatter(
        mode="markers", name="token → expert (darker: larger weight)",
        marker=dict(symbol="square", size=max(3, min(9, 380 // n_tokens)), cmin=0, cmax=1,
                    colorscale=[[0, "#c6dcef"], [1, "#003f6b"]], line_width=0),
        hovertemplate="%{text}<extra></extra>"), 1, 1)
    fig.add_trace(go.Bar(x=experts, name="tokens routed to each expert", textposition="none",
                         hovertemplate="expert %{x}: %{y} tokens<extra></extra>"), 1, 2)
    fig.add_trace(go.Scatter(x=[-0.5, n_experts - 0.5], name="perfectly balanced load",
                             mode="lines", line=dict(color="#555", dash="dash"),
                             hovertemplate="balanced: %{y:.1f} tokens per expert<extra></extra>"),
                  1, 2)
    for n in range(1, n_tokens):  # faint rules between topics
        if topics[n] != topics[n - 1]:
            fig.add_hline(y=n - 0.5, line=dict(color="#bbb", width=1, dash="dot"), row=1, col=1)
    style(fig, title="", x_title="expert", y_title="token (grouped by topic)", height=560)
    fig.update_layout(margin=dict(t=150), legend=dict(y=1.04))
    fig.update_xaxes(range=[-0.7, n_experts - 0.3], dtick=max(1, n_experts // 8), row=1, col=1)
    fig.update_yaxes(range=[n_tokens - 0.5, -0.5], row=1, col=1)
    fig.update_xaxes(title_text="expert", dtick=max(1, n_experts // 8), row=1, col=2)
    fig.update_yaxes(title_text="tokens routed to the expert (load)", rangemode="tozero",
                     row=1, col=2)
    steps = []
    for label, title, run in zip(labels, titles, runs):
        load, mean = run["load"], run["mean_load"]
        xs, ys, ws, texts = _assignment_points(run["weights"], run["topic"])
        steps.append(Step(
            label=label,
            data={"x": [xs, experts, [-0.5, n_experts - 0.5]], "y": [ys, load, [mean, mean]],
                  "marker.color": [ws, PALETTE[1], "#555"],
                  "text": [texts, [str(v) for v in load], ["", ""]]},
            layout={"title.text": (f"{title}<br>busiest expert: {max(load)} tokens, "
                                   f"{run['max_over_mean']:.2f}× the balanced {mean:.1f}; "
                                   f"idle experts: {load.count(0)}")}))
    if len(steps) == 1:
        for attr, values in steps[0].data.items():
            for trace, value in zip(fig.data, values):
                trace[attr] = value
        fig.update_layout(steps[0].layout)
        return _finish(fig)
    return _finish(add_slider(fig, steps, prefix=prefix, active=active))


def moe_routing(top_ks: Sequence[int] = (1, 2, 4, 8), active: int = 1, **routing) -> go.Figure:
    """Which experts each token picks (left: one square per choice, darker = larger weight)
    and the load per expert (right), for the toy router of :func:`routing_counts`; a slider
    over ``top_k``.

    ``routing`` is passed to :func:`routing_counts` (``n_experts``, ``n_tokens``,
    ``balance_steps``, ...).  With a single ``top_k`` there is no slider.
    """
    top_ks = list(top_ks)
    if not top_ks:
        raise ValueError("top_ks must not be empty")
    if "top_k" in routing:
        raise ValueError("pass top_k through top_ks, not as a keyword")
    runs = [routing_counts(top_k=k, **routing) for k in top_ks]
    n_tokens, n_experts = len(runs[0]["weights"]), len(runs[0]["load"])
    titles = [f"top-k = {k}: {n_tokens} tokens × {k} = {n_tokens * k} choices among "
              f"{n_experts} experts" for k in top_ks]
    return _routing_figure(runs, [str(k) for k in top_ks], titles,
                           "routed experts per token (top-k): ", active)


def moe_balancing(rounds: Sequence[int] = (0, 2, 5, 10, 20, 50), top_k: int = 2,
                  active: int = 0, **routing) -> go.Figure:
    """The same routing figure with a slider over rounds of DeepSeek-V3's auxiliary-loss-free
    balancing (:meth:`gpt2k3.layers.moe.Router.update_bias`): the selection bias of overloaded
    experts falls, that of idle ones rises, and the load evens out."""
    rounds = list(rounds)
    if not rounds:
        raise ValueError("rounds must not be empty")
    if "balance_steps" in routing:
        raise ValueError("pass balance_steps through rounds, not as a keyword")
    runs = [routing_counts(top_k=top_k, balance_steps=r, **routing) for r in rounds]
    titles = [f"top-k = {top_k}, after {r} round{'s' if r != 1 else ''} of bias balancing"
              for r in rounds]
    return _routing_figure(runs, [str(r) for r in rounds], titles, "balancing rounds: ", active)


def param_components(specs: Sequence[ArchSpec] = PARAM_SPECS, active: int = 0) -> go.Figure:
    """Total against active parameters: every model of ``specs`` (left) and, for the model the
    slider selects, each component (right); log scales, exact counts on hover."""
    specs = list(specs)
    if not specs:
        raise ValueError("specs must hold at least one ArchSpec")
    counts = [count_params(s) for s in specs]
    names = [s.name for s in specs]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.42, 0.58], horizontal_spacing=0.2)
    for i, (label, attr) in enumerate((("total", "total"), ("active per token", "active"))):
        values = [getattr(c, attr) for c in counts]
        fig.add_trace(go.Bar(
            y=names, x=values, orientation="h", name=label, marker_color=PALETTE[i],
            legendgroup=label, text=[fmt_count(v) for v in values], textposition="outside",
            cliponaxis=False, customdata=[f"{v:,}" for v in values],
            hovertemplate="%{y}: %{customdata} " + label + "<extra></extra>"), 1, 1)
    for i, label in enumerate(("total", "active per token")):
        fig.add_trace(go.Bar(
            y=list(DETAIL_COMPONENTS), orientation="h", name=label, marker_color=PALETTE[i],
            legendgroup=label, showlegend=False, textposition="none",
            hovertemplate="%{y}: %{text} " + label + "<extra></extra>"), 1, 2)
    style(fig, title="", x_title="parameters (log scale)", y_title="", height=560)
    fig.update_layout(barmode="group", margin=dict(t=140, l=150), legend=dict(y=1.04))
    hi = max(c.total for c in counts)
    fig.update_xaxes(type="log", range=[7.5, len(str(hi)) + 0.3], row=1, col=1)
    fig.update_xaxes(type="log", range=[3, len(str(hi)) + 0.3], title_text="parameters (log scale)",
                     row=1, col=2)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=2)
    fig.add_shape(type="rect", xref="x domain", x0=0, x1=1, yref="y", y0=-0.5, y1=0.5,
                  fillcolor="rgba(0,0,0,0.07)", line_width=0, layer="below")

    def values(d):  # a zero (absent component) cannot sit on a log axis: leave the bar out
        return [d[n] if d[n] > 0 else None for n in DETAIL_COMPONENTS]

    steps = []
    for i, (s, c) in enumerate(zip(specs, counts)):
        steps.append(Step(
            label=_label(s), traces=[2, 3],
            data={"x": [values(c.detail), values(c.active_detail)],
                  "text": [[f"{c.detail[n]:,}" for n in DETAIL_COMPONENTS],
                           [f"{c.active_detail[n]:,}" for n in DETAIL_COMPONENTS]]},
            layout={"shapes[0].y0": i - 0.5, "shapes[0].y1": i + 0.5,
                    "title.text": (f"{s.name}: {c.total:,} parameters,<br>{c.active:,} active "
                                   f"per token ({100 * c.active_fraction:.1f}%)")}))
    return _finish(add_slider(fig, steps, prefix="model: ", active=active))


# --------------------------------------------------------------------------- schematics
# Pictures of the two algorithms (not explorables): static matplotlib figures that render as
# a PNG with a caption and alt text (see :mod:`gpt2k3.book.figures.matrices`).

def _box(ax, x, y, w, h, text, colour="#ffffff", edge="#333333", size=10, bold=False):
    from matplotlib.patches import FancyBboxPatch
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                fc=colour, ec=edge, lw=1.2))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size,
            fontweight="bold" if bold else "normal")


def _arrow(ax, start, end, text="", colour="#333333", size=9, offset=(0.0, 0.12)):
    ax.annotate("", xy=end, xytext=start,
                arrowprops=dict(arrowstyle="-|>", color=colour, lw=1.3, shrinkA=2, shrinkB=2))
    if text:
        ax.text((start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1], text,
                ha="center", va="bottom", fontsize=size, color=colour)


def mla_absorption_schematic():
    """MLA's absorbed decode step as boxes and arrows (chapter 7).

    Top lane, the cache: the new token's ``x_t`` is projected down by ``W^{DKV}`` to the latent
    ``c_t`` (and its shared rotary key), appended to the latent cache; nothing per head is
    stored. Middle lane, the query: ``q_h`` is multiplied by ``(W^{UK}_h)^T`` once, so the key
    up-projection is *absorbed into the query* and scores are dot products with the cached
    latents. Bottom lane, the output: the softmax-weighted sum of latents is multiplied by
    ``W^{UV}_h`` once, so the value up-projection is *absorbed into the output*. The shapes
    follow :meth:`gpt2k3.layers.mla.MLA.decode_absorbed`. Returns a PNG figure with ``caption``
    and ``alt``; ``fig.lanes`` names the boxes of each lane, for a test.
    """
    from gpt2k3.book.figures.matrices import PNGFigure
    fig = PNGFigure(figsize=(10.5, 4.6))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 10.5)
    ax.set_ylim(0, 4.6)
    ax.set_axis_off()
    cache_c, abs_c = "#fde7c8", "#d6e6f5"
    # lane 1: what is cached
    ax.text(0.1, 4.3, "cache", fontsize=10, fontweight="bold")
    _box(ax, 0.2, 3.4, 1.0, 0.6, "$x_t$")
    _box(ax, 2.3, 3.4, 1.6, 0.6, "$c_t,\\ k^R_t$")
    _box(ax, 5.0, 3.3, 3.4, 0.8, "latent cache\n$c_1 \\ldots c_t$ (one per token)", cache_c)
    _arrow(ax, (1.2, 3.7), (2.3, 3.7), "$W^{DKV}$")
    _arrow(ax, (3.9, 3.7), (5.0, 3.7), "append")
    # lane 2: the query, with W_UK absorbed
    ax.text(0.1, 2.75, "scores", fontsize=10, fontweight="bold")
    _box(ax, 0.2, 1.9, 1.0, 0.6, "$q_{t,h}$")
    _box(ax, 2.3, 1.9, 1.9, 0.6, "$(W^{UK}_h)^{\\top} q_{t,h}$", abs_c)
    _box(ax, 5.0, 1.9, 3.4, 0.6, "$p_j = \\mathrm{softmax}_j(\\tilde q \\cdot c_j + q^R \\cdot k^R_j)$")
    _arrow(ax, (1.2, 2.2), (2.3, 2.2), "$W^{UK}$ absorbed", colour="#1f5f9e")
    _arrow(ax, (4.2, 2.2), (5.0, 2.2))
    _arrow(ax, (6.7, 3.3), (6.7, 2.5), "  read every $c_j$", offset=(0.75, -0.1))
    # lane 3: the output, with W_UV absorbed
    ax.text(0.1, 1.25, "output", fontsize=10, fontweight="bold")
    _box(ax, 5.0, 0.4, 3.4, 0.6, "$\\sum_j p_j\\, c_j$  (still a latent)")
    _box(ax, 2.3, 0.4, 1.9, 0.6, "$W^{UV}_h \\sum_j p_j c_j$", abs_c)
    _box(ax, 0.2, 0.4, 1.0, 0.6, "$o_{t,h}$")
    _arrow(ax, (6.7, 1.9), (6.7, 1.0))
    _arrow(ax, (5.0, 0.7), (4.2, 0.7), "$W^{UV}$ absorbed", colour="#1f5f9e")
    _arrow(ax, (2.3, 0.7), (1.2, 0.7))
    ax.text(8.6, 3.6, "stored", fontsize=9, color="#9a5b00")
    ax.text(8.6, 2.1, "per head,\nonce per step", fontsize=9, color="#1f5f9e")
    fig.lanes = {"cache": ["x_t", "c_t", "latent cache"],
                 "scores": ["q", "W_UK^T q", "softmax"], "output": ["sum p c", "W_UV", "o"]}
    fig.matrices = {}
    fig.caption = ("MLA's absorbed decode step: the cache holds one latent per token; the key "
                   "up-projection is absorbed into the query and the value up-projection into "
                   "the output, so no past token is ever decompressed")
    fig.alt = ("Three lanes of boxes and arrows. Cache lane: x_t projected by W_DKV to the latent "
               "c_t and rotary key, appended to the latent cache. Scores lane: the query q "
               "multiplied by the transpose of W_UK (absorbed), then softmax over its dot "
               "products with every cached latent. Output lane: the weighted sum of latents, "
               "multiplied by W_UV (absorbed), gives the head's output.")
    return fig


def routing_schematic(n_experts: int = 8, top_k: int = 2, n_embd: int = 16, seed: int = 0):
    """One token through a sigmoid top-``top_k`` router over ``n_experts`` (chapter 7): the
    token, its scores (bars; the chosen ones coloured), the chosen experts and the weighted sum.

    The numbers are those of :class:`gpt2k3.layers.moe.Router` on a random token and random
    router weights from ``seed``: ``fig.scores`` (every expert's score), ``fig.picked`` (the
    top-``top_k`` experts) and ``fig.weights`` (their normalised weights, summing to 1).
    Returns a PNG figure with ``caption`` and ``alt``.
    """
    from matplotlib.patches import Rectangle

    from gpt2k3.book.figures.matrices import PNGFigure
    for name, value, lo in (("n_experts", n_experts, 2), ("top_k", top_k, 1),
                            ("n_embd", n_embd, 1), ("seed", seed, 0)):
        check_int(value, name, lo)
    if top_k >= n_experts:
        raise ValueError(f"top_k ({top_k}) must be < n_experts ({n_experts})")
    gen = torch.Generator().manual_seed(seed)
    router = Router(MoEConfig(n_embd=n_embd, n_routed_experts=n_experts, n_shared_experts=0,
                              top_k=top_k, d_expert=1, score_func="sigmoid")).double()
    with torch.no_grad():
        router.weight.copy_(torch.randn(n_experts, n_embd, generator=gen, dtype=torch.float64)
                            * n_embd ** -0.5)
        x = torch.randn(1, n_embd, generator=gen, dtype=torch.float64)
        scores = router.scores(x)[0]
        weights, picked = router(x)
    scores, weights, picked = scores.tolist(), weights[0].tolist(), picked[0].tolist()
    fig = PNGFigure(figsize=(10.5, 3.6))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 10.5)
    ax.set_ylim(0, 3.6)
    ax.set_axis_off()
    on, off = PALETTE[1] if len(PALETTE) > 1 else "#ff7f0e", "#c8c8c8"
    _box(ax, 0.2, 1.5, 0.9, 0.6, "token\n$x$")
    # scores as bars
    x0, bw, base, top = 1.9, 0.32, 0.5, 2.6
    ax.text(x0, 3.15, "scores $s_e = \\sigma(x \\cdot e_e)$", fontsize=10)
    for e, s in enumerate(scores):
        ax.add_patch(Rectangle(
            (x0 + e * bw, base), bw * 0.8, s * (top - base), fc=on if e in picked else off,
            ec="#555555", lw=0.6))
        ax.text(x0 + e * bw + bw * 0.4, base - 0.2, str(e), ha="center", fontsize=8)
    _arrow(ax, (1.1, 1.8), (x0 - 0.05, 1.8))
    xs = x0 + n_experts * bw + 0.3
    ax.text(xs, 3.15, f"top-{top_k}", fontsize=10)
    ex = xs + 1.3
    ys = [2.4 - i * (1.9 / max(1, top_k - 1)) if top_k > 1 else 1.5 for i in range(top_k)]
    for i, (e, w, y) in enumerate(zip(picked, weights, ys)):
        _box(ax, ex, y - 0.25, 1.3, 0.5, f"expert {e}", "#fde7c8")
        _arrow(ax, (xs, 1.8), (ex, y), f"$g$={w:.2f}", size=8, offset=(0.05, 0.0))
        _arrow(ax, (ex + 1.3, y), (ex + 2.2, 1.8))
    _box(ax, ex + 2.2, 1.5, 1.6, 0.6, "$y = \\sum g_e\\, E_e(x)$", "#d6e6f5")
    ax.text(ex + 2.2, 0.9, "(+ shared experts,\nfor every token)", fontsize=8, color="#555555")
    fig.scores, fig.picked, fig.weights = scores, picked, weights
    fig.matrices = {}
    fig.caption = (f"Routing one token: {n_experts} scores, the top {top_k} experts run, "
                   "and their outputs are summed with the normalised scores as weights")
    fig.alt = (f"A token's {n_experts} router scores as bars, the {top_k} highest coloured "
               f"(experts {', '.join(map(str, picked))}); arrows to those experts only, "
               f"labelled with their weights ({', '.join(f'{w:.2f}' for w in weights)}), "
               "then to one box that sums their outputs.")
    return fig
