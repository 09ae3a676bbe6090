r"""Chapter "What Kimi K3 adds": Attention Residuals, the bounded decay, latent experts and SiTU.

Every figure lays out numbers computed elsewhere -- :func:`gpt2k3.models.k3.attn_res_reads`,
:func:`gpt2k3.accounting.kda_log_decay`, :func:`gpt2k3.models.k3.latent_moe_cost`,
:func:`gpt2k3.models.k3.situ_factors` -- in plain float64 arithmetic, so a stored figure is the same
on every machine. Each has a slider whose steps are computed here (the web book has no
kernel); given a single slider value it draws that setting alone, which is what the live
explorers of :mod:`gpt2k3.book.widgets.k3_adds` do.
"""

from __future__ import annotations

import math
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gpt2k3.accounting import ArchSpec, kda_log_decay
from gpt2k3.accounting.k3_mechanisms import (
    SITU_BETA,
    SITU_LINEAR_BETA,
    attn_res_reads,
    latent_moe_break_even,
    latent_moe_cost,
    situ_bound,
    situ_factors,
    swiglu_reference,
)
from gpt2k3.archs import KIMI_K3
from gpt2k3.book.display import fmt_count
from gpt2k3.book.figures._style import PALETTE, Step, add_slider, style
from gpt2k3.checks import check_int, is_int
from gpt2k3.experiments.forgetting import half_life

__all__ = ["attn_res_sources", "bounded_decay", "latent_experts", "situ_vs_swiglu",
           "ATTN_RES_BLOCK_SIZES", "LATENT_DIMS", "SITU_BETAS", "QB_EXAMPLE_SCORES",
           "SIGN_STEPS", "qb_worked_example", "balancing_runs", "steps_to",
           "quantile_balancing", "latent_moe_schematic"]

_BLUE, _ORANGE, _GREEN, _PINK, _GREY = PALETTE[0], PALETTE[1], PALETTE[2], PALETTE[3], "#888888"

#: Block sizes the Attention-Residuals figure steps through (K3's 12 among them).
ATTN_RES_BLOCK_SIZES = (1, 2, 3, 4, 6, 12, 24, 48, 93)
#: Latent widths the latent-experts figure steps through (K3's 3,584 among them).
LATENT_DIMS = (512, 1024, 1792, 2560, 3584, 4608, 5632, 6144, 7168)
#: SiTU gate clips the SiTU figure steps through (K3's 4 among them).
SITU_BETAS = (1.0, 2.0, 4.0, 8.0, 16.0)


def _values(xs, name: str) -> list:
    if isinstance(xs, (str, bytes)) or not hasattr(xs, "__iter__"):
        raise ValueError(f"{name} must be a sequence, got {xs!r}")
    xs = list(xs)
    if not xs:
        raise ValueError(f"{name} must not be empty")
    return xs


def _active(values: list, active, default, name: str) -> int:
    """The index of the step the figure opens on: ``active`` if given, else ``default``'s
    position (the first step if ``default`` is not among ``values``)."""
    if active is None:
        return values.index(default) if default in values else 0
    if not is_int(active) or not 0 <= active < len(values):
        raise ValueError(f"active must be an index into {name} (0..{len(values) - 1}), "
                         f"got {active!r}")
    return active


def _finish(fig: go.Figure, steps: list[Step], prefix: str, active: int) -> go.Figure:
    add_slider(fig, steps, prefix=prefix, active=active)
    if len(steps) == 1:  # one setting (a live explorer): no slider
        fig.layout.sliders = ()
        fig.update_layout(margin=dict(b=60))
    return fig


def _top(fig: go.Figure, top: int) -> go.Figure:
    fig.update_layout(margin=dict(t=top))
    return fig


# ------------------------------------------------------------------- Attention Residuals
def _source_names(n_blocks: int) -> list[str]:
    return ["embedding"] + [f"block {b} (sum)" for b in range(1, n_blocks)] + ["current block"]


def attn_res_sources(n_layer: int = KIMI_K3.n_layer, block_sizes: Sequence[int] = ATTN_RES_BLOCK_SIZES,
                     n_embd: int = KIMI_K3.n_embd, active: int | None = None) -> go.Figure:
    """Which sources each layer's Attention-Residual read mixes, and what the block size trades.

    Left, for the block size the slider picks (in decoder layers, as SGLang's
    ``attn_res_block_size`` counts them): a map of the sources (rows: the embedding, each
    closed block's sum, the running sum of the current block) against the layers (columns; the
    read before each token mixer, then the head's), coloured by the weight an untrained read
    gives each source -- uniform, ``1 / R`` over its ``R`` sources (a zero query). Right, over
    all ``block_sizes``: the widest read (the vectors of ``n_embd`` numbers a token keeps at
    once) and the mean read, against the block size; the dotted line is the slider's. Numbers from
    :func:`gpt2k3.models.k3.attn_res_reads`.
    """
    sizes = _values(block_sizes, "block_sizes")
    reads = [attn_res_reads(n_layer, s) for s in sizes]       # validates n_layer and each size
    n_embd = check_int(n_embd, "n_embd", 1)
    active = _active(sizes, active, KIMI_K3.attn_res_block_size, "block_sizes")
    columns = [str(i + 1) for i in range(n_layer)] + ["head"]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.62, 0.38], horizontal_spacing=0.17)
    fig.add_trace(go.Heatmap(x=columns, colorscale="Blues", zmin=0, zmax=1, showscale=True,
                             colorbar=dict(title="weight", x=0.525, len=0.9, thickness=12),
                             hovertemplate="read before layer %{x}: %{y}, weight %{z:.3g}"
                                           "<extra></extra>", name="sources"), 1, 1)
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    xs = [sizes[i] for i in order]
    for name, values, color in (
            ("widest read (vectors kept per token)", [reads[i].max_sources for i in order], _BLUE),
            ("mean sources per read", [reads[i].mean_sources for i in order], _ORANGE)):
        fig.add_trace(go.Scatter(x=xs, y=values, name=name, mode="lines+markers",
                                 line=dict(color=color),
                                 hovertemplate=f"{name}<br>block size %{{x}}: %{{y:.3g}}"
                                               "<extra></extra>"), 1, 2)
    style(fig, title="", x_title="layer (the read before its token mixer)",
          y_title="source", height=560)
    _top(fig, 150)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_xaxes(title_text="block size (decoder layers per block, log scale)", type="log",
                     row=1, col=2)
    fig.update_yaxes(title_text="sources per read", type="log", row=1, col=2)
    steps = []
    for s, r in zip(sizes, reads):
        names = _source_names(r.n_blocks)
        z = []
        for row in range(r.n_blocks + 1):
            line = []
            for i in range(n_layer + 1):
                closed = i // s + 1 if i < n_layer else r.n_blocks   # snapshots in the bank
                partial = (i % s != 0) if i < n_layer else True
                n = r.attn[i] if i < n_layer else r.final
                available = row < closed or (row == r.n_blocks and partial)
                line.append(1 / n if available else None)
            z.append(line)
        numbers = r.max_sources * n_embd
        # each step restyles the heatmap (z, its rows) and moves the line marking it
        steps.append(Step(
            label=str(s),
            data={"z": [z], "y": [names]}, traces=[0],
            layout={"shapes": [dict(type="line", xref="x2", yref="y2 domain", x0=s, x1=s,
                                    y0=0, y1=1, line=dict(color=_PINK, dash="dot", width=2))],
                    "title.text": (
                f"Attention Residuals over {n_layer} decoder layers in blocks of {s}: "
                f"{r.n_blocks} block{'s' if r.n_blocks != 1 else ''} (the last of "
                f"{r.last_block} layer{'s' if r.last_block != 1 else ''}); the head reads "
                f"{r.n_blocks} snapshot{'s' if r.n_blocks != 1 else ''} and the running sum"
                f"<br>the widest read mixes {r.max_sources} sources = {numbers:,} numbers kept "
                f"per token (a plain residual keeps {n_embd:,}); {r.sources_read:,} sources "
                f"read per token over {len(r.reads)} reads")}))
    return _finish(fig, steps, "block size: ", active)


# ------------------------------------------------------------------- bounded decay
def _grid(lo: float, hi: float, n: int) -> list[float]:
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)]


def bounded_decay(a_logs: Sequence[float] = (-1.0, 0.0, 1.0, 2.0), dt_bias: float = 0.0,
                  lower_bound: float = KIMI_K3.kda_gate_lower_bound,
                  x_range: tuple[float, float] = (-12.0, 12.0), points: int = 121,
                  active: int | None = None) -> go.Figure:
    """K3's bounded KDA decay against Kimi Linear's unbounded one, over the gate pre-activation.

    For each ``A_log`` (the slider) and pre-activations ``x`` in ``x_range``: left, the
    per-step log-decay ``g`` -- K3's ``lower_bound * sigmoid(exp(A_log) (x + dt_bias))``, inside
    ``(lower_bound, 0)``, and Kimi Linear's ``-exp(A_log) softplus(x + dt_bias)``, unbounded
    below (:func:`gpt2k3.accounting.kda_log_decay`); right, the half-life ``ln 2 / -g`` in
    tokens (log scale): K3's can never fall below ``ln 2 / |lower_bound|``.
    """
    a_logs = _values(a_logs, "a_logs")
    for a in a_logs:
        kda_log_decay(0.0, a, 0.0)                              # validates each A_log
    kda_log_decay(0.0, 0.0, dt_bias, lower_bound)               # validates dt_bias, the bound
    if lower_bound is None:
        raise ValueError("lower_bound must be a finite negative number (K3's bound), got None")
    lo, hi = (float(v) for v in x_range) if len(x_range) == 2 else (None, None)
    if lo is None or not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"x_range must be two finite numbers lo < hi, got {x_range!r}")
    points = check_int(points, "points", 2)
    active = _active(a_logs, active, 0.0, "a_logs")
    xs = _grid(lo, hi, points)
    floor_life = half_life(lower_bound)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12)
    curves = (("Kimi K3: bounded", _BLUE, "solid"), ("Kimi Linear: unbounded", _ORANGE, "dash"))
    for col, what in ((1, "log-decay %{y:.3g} per step"), (2, "half-life %{y:.3g} tokens")):
        for name, color, dash in curves:
            fig.add_trace(go.Scatter(x=xs, name=name, mode="lines", showlegend=col == 1,
                                     legendgroup=name, line=dict(color=color, dash=dash),
                                     hovertemplate=f"{name}<br>x = %{{x:.3g}}: {what}"
                                                   "<extra></extra>"), 1, col)
    style(fig, title="", x_title="gate pre-activation x", y_title="log-decay g per step",
          height=500)
    _top(fig, 150)
    fig.update_yaxes(title_text="memory half-life (tokens, log scale)", type="log", row=1, col=2)
    fig.update_xaxes(title_text="gate pre-activation x", row=1, col=2)
    fig.update_yaxes(range=[min(3 * lower_bound, -12.0), 0.5], row=1, col=1)
    fig.add_hline(y=lower_bound, line=dict(color=_GREY, dash="dot"), row=1, col=1,
                  annotation_text=f"K3's floor: g > {lower_bound:g} (keeps > e^{lower_bound:g} "
                                  f"= {math.exp(lower_bound):.2%})",
                  annotation_position="bottom left")
    fig.add_hline(y=floor_life, line=dict(color=_GREY, dash="dot"), row=1, col=2,
                  annotation_text=f"K3's shortest half-life: {floor_life:.3g} tokens",
                  annotation_position="bottom left")
    steps = []
    for a in a_logs:
        k3 = [kda_log_decay(x, a, dt_bias, lower_bound) for x in xs]
        kl = [kda_log_decay(x, a, dt_bias) for x in xs]
        # a decay that underflows to 0 is a memory that never fades: no finite point to plot
        k3_life = [half_life(g) if g < 0 else None for g in k3]
        kl_life = [half_life(g) if g < 0 else None for g in kl]

        def life(t):
            return "never" if t is None else f"{t:.3g} tokens"

        steps.append(Step(
            label=f"{a:g}",
            data={"y": [k3, kl, k3_life, kl_life]},
            layout={"title.text": (
                f"A_log = {a:g}, dt_bias = {dt_bias:g}: at x = {hi:g} Kimi Linear's decay is "
                f"{kl[-1]:.3g} per step (half-life {life(kl_life[-1])}), K3's "
                f"{k3[-1]:.3g}<br>K3 keeps at least e^{lower_bound:g} of a memory per step; "
                f"both forget less and less as x falls (half-life at x = {lo:g}: K3 "
                f"{life(k3_life[0])}, Kimi Linear {life(kl_life[0])})")}))
    return _finish(fig, steps, "A_log: ", active)


# ------------------------------------------------------------------- latent experts
def latent_experts(spec: ArchSpec = KIMI_K3, latent_dims: Sequence[int] = LATENT_DIMS,
                   active: int | None = None) -> go.Figure:
    """Latent experts against full-width ones: one MoE layer's parameters and the whole model's
    cost, as the routed experts' width changes.

    Left, for the latent width the slider picks: one MoE layer's parameters, stored and used
    per token, with latent experts and at full width (``moe_latent_dim = 0``: experts read
    and write ``n_embd`` numbers, no projections). Right, over all ``latent_dims``: total
    parameters, active parameters and decode FLOPs per token as fractions of the full-width
    model; the dotted line is :func:`gpt2k3.models.k3.latent_moe_break_even`, the width above which
    the projections cost a token more than the narrower experts save. Numbers from
    :func:`gpt2k3.models.k3.latent_moe_cost` (:func:`gpt2k3.accounting.count_params`).
    """
    if not isinstance(spec, ArchSpec):
        raise ValueError(f"spec must be an ArchSpec, got {type(spec).__name__}")
    dims = _values(latent_dims, "latent_dims")
    costs = [latent_moe_cost(spec, w) for w in dims]              # validates every width
    if any(w == 0 for w in dims):
        raise ValueError("latent_dims must be positive widths (the full width is drawn anyway)")
    full = latent_moe_cost(spec, 0)
    active = _active(dims, active, spec.moe_latent_dim, "latent_dims")
    w_star = latent_moe_break_even(spec)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.45, 0.55], horizontal_spacing=0.13)
    groups = ["stored", "used per token"]
    fig.add_trace(go.Bar(name="latent experts", x=groups, marker_color=_BLUE,
                         hovertemplate="latent experts, %{x}: %{y:.4s} parameters per MoE layer"
                                       "<extra></extra>"), 1, 1)
    fig.add_trace(go.Bar(name=f"full width ({spec.n_embd:,})", x=groups,
                         y=[full.layer_total, full.layer_active], marker_color=_GREY,
                         hovertemplate="full-width experts, %{x}: %{y:.4s} parameters per MoE "
                                       "layer<extra></extra>"), 1, 1)
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    xs = [dims[i] for i in order]
    for name, attr, color, dash in (("total parameters", "total", _BLUE, "solid"),
                                    ("active parameters", "active", _ORANGE, "solid"),
                                    ("FLOPs per token", "flops_per_token", _GREEN, "dot")):
        fig.add_trace(go.Scatter(
            x=xs, y=[getattr(costs[i], attr) / getattr(full, attr) for i in order], name=name,
            mode="lines+markers", line=dict(color=color, dash=dash, width=3 if dash == "dot" else 2),
            hovertemplate=f"{name}<br>latent width %{{x:,}}: %{{y:.3g}} of full width"
                          "<extra></extra>"), 1, 2)
    fig.add_trace(go.Scatter(name="this latent width", mode="markers",
                             marker=dict(color=_PINK, size=12, symbol="diamond"),
                             hovertemplate="latent width %{x:,}: %{y:.3g} of the full-width "
                                           "FLOPs<extra></extra>"), 1, 2)
    style(fig, title="", x_title="", y_title="parameters of one MoE layer (log scale)",
          height=520)
    _top(fig, 150)
    fig.update_layout(barmode="group")
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_xaxes(title_text="latent width of the routed experts", row=1, col=2)
    fig.update_yaxes(title_text="fraction of the full-width model", row=1, col=2,
                     rangemode="tozero")
    fig.add_hline(y=1, line=dict(color=_GREY, dash="dot"), row=1, col=2)
    fig.add_vline(x=w_star, line=dict(color=_GREY, dash="dot"), row=1, col=2,
                  annotation_text=f"break-even {w_star:,.0f}", annotation_position="top left")
    steps = []
    for w, c in zip(dims, costs):
        steps.append(Step(
            label=f"{w:,}",
            data={"y": [[c.layer_total, c.layer_active], [c.flops_per_token / full.flops_per_token]],
                  "x": [groups, [w]]},
            traces=[0, 5],
            layout={"title.text": (
                f"{spec.name}'s routed experts at width {w:,} (of {spec.n_embd:,}): "
                f"{fmt_count(c.total)} parameters, {fmt_count(c.active)} active, "
                f"{fmt_count(c.flops_per_token)} FLOPs per token<br>at full width: "
                f"{fmt_count(full.total)}, {fmt_count(full.active)} active, "
                f"{fmt_count(full.flops_per_token)} FLOPs per token "
                f"({spec.n_routed_experts} experts, {spec.top_k} per token, width "
                f"{spec.d_expert:,})")}))
    return _finish(fig, steps, "latent width: ", active)


# ------------------------------------------------------------------- SiTU vs SwiGLU
def situ_vs_swiglu(betas: Sequence[float] = SITU_BETAS, linear_beta: float = SITU_LINEAR_BETA,
                   gate_range: tuple[float, float] = (-8.0, 24.0),
                   up_range: tuple[float, float] = (-80.0, 80.0), points: int = 161,
                   active: int | None = None) -> go.Figure:
    """SiTU-GLU's two factors against SwiGLU's, and the bound SiTU puts on their product.

    Left, for the gate clip ``beta`` the slider picks: the gate factor
    ``beta tanh(g / beta) sigmoid(g)`` beside SwiGLU's ``silu(g)``, with its ceiling ``beta``.
    Right: the up factor ``linear_beta tanh(u / linear_beta)`` beside SwiGLU's ``u``. Their
    product never reaches ``beta * linear_beta`` (:func:`gpt2k3.models.k3.situ_bound`); SwiGLU's grows
    without limit. Values from :func:`gpt2k3.models.k3.situ_factors`.
    """
    betas = _values(betas, "betas")
    for b in betas:
        situ_bound(b, linear_beta)                              # validates both clips
    ranges = []
    for name, r in (("gate_range", gate_range), ("up_range", up_range)):
        lo, hi = (float(v) for v in r) if len(r) == 2 else (None, None)
        if lo is None or not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"{name} must be two finite numbers lo < hi, got {r!r}")
        ranges.append((lo, hi))
    points = check_int(points, "points", 2)
    active = _active(betas, active, SITU_BETA, "betas")
    gs, us = _grid(*ranges[0], points), _grid(*ranges[1], points)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12)
    fig.add_trace(go.Scatter(x=gs, y=[swiglu_reference(g, 1.0) for g in gs],
                             name="SwiGLU", mode="lines", line=dict(color=_GREY, dash="dash"),
                             legendgroup="swiglu",
                             hovertemplate="SwiGLU: silu(%{x:.3g}) = %{y:.3g}<extra></extra>"),
                  1, 1)
    fig.add_trace(go.Scatter(x=gs, name="SiTU", mode="lines", line=dict(color=_BLUE),
                             legendgroup="situ",
                             hovertemplate="SiTU gate factor at %{x:.3g}: %{y:.3g}"
                                           "<extra></extra>"), 1, 1)
    fig.add_trace(go.Scatter(x=[gs[0], gs[-1]], name="ceiling β", mode="lines",
                             line=dict(color=_PINK, dash="dot"),
                             hovertemplate="ceiling: %{y:g}<extra></extra>"), 1, 1)
    fig.add_trace(go.Scatter(x=us, y=us, name="SwiGLU", mode="lines", showlegend=False,
                             legendgroup="swiglu", line=dict(color=_GREY, dash="dash"),
                             hovertemplate="SwiGLU: up factor %{y:.3g}<extra></extra>"), 1, 2)
    fig.add_trace(go.Scatter(x=us, y=[situ_factors(0.0, u, 1.0, linear_beta)[1] for u in us],
                             name="SiTU", mode="lines", showlegend=False, legendgroup="situ",
                             line=dict(color=_BLUE),
                             hovertemplate="SiTU up factor at %{x:.3g}: %{y:.3g}"
                                           "<extra></extra>"), 1, 2)
    style(fig, title="", x_title="gate pre-activation g", y_title="gate factor", height=500)
    _top(fig, 150)
    fig.update_xaxes(title_text="up pre-activation u", row=1, col=2)
    fig.update_yaxes(title_text="up factor", row=1, col=2)
    fig.update_yaxes(range=[-2, min(max(betas), ranges[0][1]) + 2], row=1, col=1)
    for y in (linear_beta, -linear_beta):
        fig.add_hline(y=y, line=dict(color=_PINK, dash="dot"), row=1, col=2)
    steps = []
    for b in betas:
        gate = [situ_factors(g, 0.0, b, linear_beta)[0] for g in gs]
        low = min(gate)
        steps.append(Step(
            label=f"{b:g}",
            data={"y": [gate, [b, b]]}, traces=[1, 2],
            layout={"title.text": (
                f"SiTU with β = {b:g}, linear β = {linear_beta:g}: the gate factor stays "
                f"below {b:g} (SwiGLU's silu(g) at g = {gs[-1]:g}: {gs[-1]:.3g}; its least "
                f"value here {low:.3g})<br>the up factor inside ±{linear_beta:g}, so |SiTU| "
                f"< {situ_bound(b, linear_beta):g}; near 0 it is SwiGLU")}))
    return _finish(fig, steps, "β: ", active)


# ------------------------------------------------------------------- Quantile Balancing
#: The worked example of Quantile Balancing (the report's Fig. 5 shape: 8 tokens, 4 experts,
#: k = 1): router scores chosen so that Top-1 routing gives the loads (4, 3, 1, 0), and one
#: Quantile-Balancing update gives (2, 2, 2, 2). The report's own scores are only drawn.
QB_EXAMPLE_SCORES = (
    (0.95, 0.60, 0.40, 0.75),
    (0.90, 0.75, 0.20, 0.55),
    (0.90, 0.30, 0.20, 0.20),
    (0.85, 0.10, 0.80, 0.20),
    (0.50, 0.90, 0.45, 0.05),
    (0.85, 0.90, 0.55, 0.70),
    (0.30, 0.60, 0.10, 0.50),
    (0.60, 0.05, 0.80, 0.30),
)
#: The sign rule's steps the balancing figure's slider steps through (DeepSeek-V3's 0.001 first).
SIGN_STEPS = (0.001, 0.01, 0.03)


def qb_worked_example(scores=QB_EXAMPLE_SCORES, k: int = 1) -> dict:
    """One Quantile-Balancing update on ``scores`` (bias 0): the loads before and after, the
    cutoffs, the margins, the new bias and which tokens changed expert (all float64)."""
    import torch

    from gpt2k3.layers.moe import qb_margins, quantile_bias

    s = torch.tensor(scores, dtype=torch.float64)
    bias = torch.zeros(s.shape[1], dtype=torch.float64)
    margins, rank = qb_margins(s, bias, k)
    new_bias = quantile_bias(s, bias, k)
    before = s.topk(k, dim=-1).indices
    after = (s + new_bias).topk(k, dim=-1).indices
    n = s.shape[1]
    return {"scores": s, "margins": margins, "rank": rank, "bias": new_bias,
            "cutoffs": (s - margins)[:, 0],
            "route_before": before[:, 0].tolist(), "route_after": after[:, 0].tolist(),
            "load_before": torch.bincount(before.flatten(), minlength=n).tolist(),
            "load_after": torch.bincount(after.flatten(), minlength=n).tolist()}


def balancing_runs(n_experts: int = KIMI_K3.n_routed_experts, top_k: int = KIMI_K3.top_k,
                   tokens: int = 1024, steps: int = 12, sign_steps: Sequence[float] = SIGN_STEPS,
                   skew: float = 1.0, seed: int = 0, bins: int | None = None) -> dict:
    """Route a fresh batch of ``tokens`` through a skewed router every step, under Quantile
    Balancing and under the sign rule at each of ``sign_steps``; all rules see the same batches.

    The router's logits are ``skew * u_j + z_ij`` (``u``, ``z`` standard normal: some experts
    start far more attractive than others), scores their sigmoid. Each rule routes the batch
    with its current bias (Top-``top_k`` of ``s + b``), records the batch's max/mean load and
    its dead experts (load 0), then updates the bias from that batch, to be used on the next:
    :func:`gpt2k3.layers.moe.quantile_bias` (or its histogram form with ``bins``), or
    :meth:`gpt2k3.layers.moe.Router.update_bias`. ``floor`` is the max/mean load of an
    unskewed router on a batch of this size: the sampling noise no rule can remove.
    """
    import torch

    from gpt2k3.layers.moe import MoEConfig, Router, quantile_bias, quantile_bias_histogram

    sign_steps = [float(x) for x in _values(sign_steps, "sign_steps")]
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(n_experts, generator=g, dtype=torch.float64)
    cfg = MoEConfig(n_embd=1, n_routed_experts=n_experts, n_shared_experts=0, top_k=top_k,
                    d_expert=1)
    routers = [Router(cfg).double() for _ in sign_steps]
    qb = torch.zeros(n_experts, dtype=torch.float64)
    q = tokens * top_k / n_experts
    names = ["QB"] + [f"sign {x:g}" for x in sign_steps]
    hist = {name: {"max_over_mean": [], "dead": []} for name in names}

    def load(s, b):
        return torch.bincount((s + b).topk(top_k, dim=-1).indices.flatten(), minlength=n_experts)

    for _ in range(steps):
        s = torch.sigmoid(skew * u + torch.randn(tokens, n_experts, generator=g,
                                                 dtype=torch.float64))
        biases = [qb] + [r.e_score_correction_bias for r in routers]
        for name, b in zip(names, biases):
            ld = load(s, b)
            hist[name]["max_over_mean"].append(float(ld.max()) / q)
            hist[name]["dead"].append(int((ld == 0).sum()))
            if name == "QB":
                qb = (quantile_bias(s, b, top_k) if bins is None
                      else quantile_bias_histogram(s, b, top_k, bins))
        for r, x in zip(routers, sign_steps):
            r.update_bias(load(s, r.e_score_correction_bias), x)
    s0 = torch.sigmoid(torch.randn(tokens, n_experts, generator=g, dtype=torch.float64))
    floor = float(load(s0, torch.zeros(n_experts, dtype=torch.float64)).max()) / q
    return {"names": names, "sign_steps": sign_steps, "history": hist, "floor": floor,
            "n_experts": n_experts, "top_k": top_k, "tokens": tokens, "steps": steps,
            "skew": skew}


def steps_to(series: Sequence[float], level: float) -> int | None:
    """The first step (1-based) at which ``series`` is at or below ``level``, else ``None``."""
    return next((i + 1 for i, v in enumerate(series) if v <= level), None)


def quantile_balancing(runs: dict | None = None, active: int | None = None) -> go.Figure:
    """Quantile Balancing against the sign rule on a skewed router (:func:`balancing_runs`).

    Left: the max/mean load of each step's batch (log scale), for QB and for the sign rule at
    the step size the slider picks; the dotted line is an unskewed router's max/mean on a batch
    of this size. Right: the experts that received no token in that batch.
    """
    runs = balancing_runs() if runs is None else runs
    sign = runs["sign_steps"]
    active = _active(sign, active, sign[0], "sign_steps")
    hist = runs["history"]
    xs = list(range(1, runs["steps"] + 1))
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.13)
    for col, key, unit in ((1, "max_over_mean", "max/mean load %{y:.3g}"),
                           (2, "dead", "%{y} idle experts")):
        fig.add_trace(go.Scatter(x=xs, y=hist["QB"][key], name="Quantile Balancing",
                                 mode="lines+markers", line=dict(color=_BLUE),
                                 showlegend=col == 1,
                                 hovertemplate=f"QB, step %{{x}}: {unit}<extra></extra>"), 1, col)
        fig.add_trace(go.Scatter(x=xs, name="sign rule", mode="lines+markers",
                                 line=dict(color=_ORANGE), showlegend=col == 1,
                                 hovertemplate=f"sign rule, step %{{x}}: {unit}<extra></extra>"),
                      1, col)
    fig.add_trace(go.Scatter(x=xs, y=[runs["floor"]] * len(xs), name="unskewed router",
                             mode="lines", line=dict(color=_GREY, dash="dot"),
                             hovertemplate="an unskewed router: max/mean load %{y:.3g}"
                                           "<extra></extra>"), 1, 1)
    style(fig, title="", x_title="step (one fresh batch each)",
          y_title="max/mean load (log scale)", height=500)
    _top(fig, 140)
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_yaxes(title_text="idle experts (no token)", rangemode="tozero", row=1, col=2)
    fig.update_xaxes(title_text="step (one fresh batch each)", row=1, col=2)
    steps = []
    for x, name in zip(sign, runs["names"][1:]):
        steps.append(Step(
            label=f"{x:g}", data={"y": [hist[name]["max_over_mean"], hist[name]["dead"]]},
            traces=[1, 3],
            layout={"title.text": (
                f"{runs['n_experts']} experts, top-{runs['top_k']}, {runs['tokens']:,} tokens a "
                f"batch; after {runs['steps']} steps:<br>max/mean load "
                f"{hist['QB']['max_over_mean'][-1]:.2f} (QB), "
                f"{hist[name]['max_over_mean'][-1]:.2f} (sign rule, step {x:g}); idle experts "
                f"{hist['QB']['dead'][-1]} and {hist[name]['dead'][-1]}")}))
    return _finish(fig, steps, "sign rule's step: ", active)


def latent_moe_schematic(spec: ArchSpec = KIMI_K3) -> go.Figure:
    """A schematic of one latent-MoE layer: the router and the shared experts read the full-width
    token; the routed experts read its down projection, their weighted sum is normalised and
    projected back up once (report section 2.3, Eq. 11). Widths from ``spec``.

    The layer is drawn top to bottom, one box per row except the three readers of ``x``, and every
    label is at most two short lines, so that no two labels meet on a phone's 390 px either."""
    if not isinstance(spec, ArchSpec) or not spec.moe_latent_dim:
        raise ValueError(f"spec must be an ArchSpec with a latent MoE, got {spec!r}")
    d, w, k, n = spec.n_embd, spec.moe_latent_dim, spec.top_k, spec.n_routed_experts
    boxes = [  # (x, y, text, colour): centres on a 10 x 7 canvas
        (5.0, 6.3, f"token x<br>width {d:,}", _GREY),
        (1.6, 5.0, f"router<br>top-{k} of {n}", _ORANGE),
        (5.0, 5.0, f"W↓<br>{d:,} → {w:,}", _BLUE),
        (8.4, 5.0, f"{spec.n_shared_experts} shared<br>width {d:,}", _GREEN),
        (5.0, 3.7, f"{k} experts<br>width {w:,}", _BLUE),
        (5.0, 2.4, "Σ w·E(z)<br>RMSNorm", _BLUE),
        (5.0, 1.1, f"W↑<br>{w:,} → {d:,}", _BLUE),
        (8.4, 1.1, "+", _GREY),
    ]
    arrows = [(0, 1, "bottom", "top"), (0, 2, "bottom", "top"), (0, 3, "bottom", "top"),
              (2, 4, "bottom", "top"), (1, 4, "bottom", "left"), (4, 5, "bottom", "top"),
              (5, 6, "bottom", "top"), (6, 7, "right", "left"), (3, 7, "bottom", "top")]
    fig = go.Figure()

    def half(text):
        return (0.35, 0.35) if text == "+" else (1.35, 0.45)

    for x0, y0, text, color in boxes:
        hx, hy = half(text)
        fig.add_shape(type="rect", x0=x0 - hx, x1=x0 + hx, y0=y0 - hy, y1=y0 + hy,
                      line=dict(color=color, width=2), fillcolor="rgba(0,0,0,0)")
        fig.add_annotation(x=x0, y=y0, text=text, showarrow=False, font=dict(size=11))

    def edge(i, side):
        x0, y0, text, _ = boxes[i]
        hx, hy = half(text)
        return {"right": (x0 + hx, y0), "left": (x0 - hx, y0), "top": (x0, y0 + hy),
                "bottom": (x0, y0 - hy)}[side]

    for a, b, out, into in arrows:
        (xa, ya), (xb, yb) = edge(a, out), edge(b, into)
        fig.add_annotation(x=xb, y=yb, ax=xa, ay=ya, xref="x", yref="y", axref="x", ayref="y",
                           showarrow=True, arrowhead=3, arrowwidth=1.5, arrowcolor="#666",
                           text="")
    style(fig, title="", x_title="", y_title="", height=440)
    fig.update_xaxes(visible=False, range=[0, 10])
    fig.update_yaxes(visible=False, range=[0.4, 7.0], scaleanchor=None)
    fig.update_layout(margin=dict(l=10, r=10, t=50, b=10), showlegend=False,
                      title=dict(text=f"{spec.name}'s MoE layer: only the routed experts are "
                                      f"narrow"))
    return fig
