"""Chapters 4 and 5 (DeltaNet): interference in a finite state, one delta-rule write taken apart,
the cost of the chunkwise form against its chunk size, and the measured speed.

Every slider step is computed here, when the notebook runs, so the figures work in the static
web book. The numbers come from :mod:`gpt2k3.experiments.memory` and :mod:`gpt2k3.ops.wy`; the measured
speeds from the JSON files ``benchmarks/chunkwise.py`` writes (read with :func:`gpt2k3.book.results.load`).
"""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from gpt2k3.book.figures._style import PALETTE, Step, add_slider, style
from gpt2k3.book.figures.linear import equation_rows
from gpt2k3.checks import check_int, check_number
from gpt2k3.experiments import memory
from gpt2k3.ops.wy import chunkwise_cost

__all__ = [
    "n_grid",
    "interference_curves",
    "interference_by_position",
    "interference_beta",
    "read_erase_write_stages",
    "delta_read_write",
    "chunk_cost",
    "speed_rows",
    "chunkwise_speed",
]

_ADD, _DELTA, _LSQ, _ORTH, _GREY = PALETTE[1], PALETTE[0], PALETTE[2], PALETTE[3], "#888888"

#: The bare additive write of these figures is not chapter 3's linear attention: its keys are
#: zero-mean unit vectors and its read has no normaliser. Chapter 3's ELU+1 features are drawn
#: separately (``ELU1_LABEL``).
ADDITIVE_LABEL = "additive write (unit zero-mean keys, no normaliser)"
ELU1_LABEL = "linear attention of chapter 3 (ELU+1 features, normalised read)"


def _r(x, digits: int = 4):
    """Round a number, or (nested) lists of them, to ``digits`` decimals for the figure's JSON:
    smaller pages, and stored outputs that do not depend on the last bits of a CPU's rounding."""
    if isinstance(x, (list, tuple)):
        return [_r(v, digits) for v in x]
    return round(float(x), digits)


def _ints(xs, name: str, minimum: int) -> list[int]:
    xs = list(xs)
    if not xs:
        raise ValueError(f"{name} must not be empty")
    return [check_int(x, f"each entry of {name}", minimum) for x in xs]


def _beta(b, name: str = "beta") -> float:
    return check_number(b, name, 0, 2, what="a float in [0, 2]")


def n_grid(d: int, points: int = 16) -> list[int]:
    """Numbers of stored pairs from 1 to ``4 d`` for a curve: ``points`` evenly spaced values plus
    ``d`` itself (the capacity of orthogonal keys), sorted and without repeats."""
    d, points = check_int(d, "d", 1), check_int(points, "points", 2)
    grid = {1, d, 4 * d} | {max(1, round(4 * d * i / points)) for i in range(1, points + 1)}
    return sorted(grid)


# --------------------------------------------------------------------------- chapter 4: interference


def _capacity_line(d: int) -> dict:
    return dict(type="line", x0=d, x1=d, y0=0, y1=1, yref="paper",
                line=dict(color=_GREY, dash="dash", width=1))


def _capacity_label(d: int) -> dict:
    return dict(x=d, y=1, yref="paper", text=f"N = D = {d}", showarrow=False,
                xanchor="left", yanchor="top", xshift=4, font=dict(color="#555", size=12))


def interference_curves(ds: Sequence[int] = (8, 16, 32, 64), beta: float = 1.0, trials: int = 8,
                        seed: int = 0, active: int = 1) -> go.Figure:
    """Recall error against the number of stored pairs ``N`` (1 to ``4 D``); a slider over ``D``.

    Traces: the bare additive write (measured, and its ``sqrt((N - 1)/D)`` estimate), the delta
    rule with write strength ``beta``, the least-squares state (the smallest total squared error
    any ``D x D`` state has) -- all with random zero-mean unit keys and no normaliser -- orthogonal
    keys, exact for either rule up to ``N = D``, and last chapter 3's linear attention (ELU+1
    features, read divided by ``q . z``: :func:`gpt2k3.experiments.memory.linear_attention_error_curve`).
    """
    ds = _ints(ds, "ds", 1)
    beta = _beta(beta)
    fig = go.Figure()
    hover = "N = %{x}: mean error %{y:.3f}<extra>%{fullData.name}</extra>"
    fig.add_trace(go.Scatter(name=ADDITIVE_LABEL, mode="lines+markers",
                             line_color=_ADD, hovertemplate=hover))
    fig.add_trace(go.Scatter(name="its estimate √((N−1)/D)", mode="lines",
                             line=dict(color=_ADD, dash="dot"), hovertemplate=hover))
    fig.add_trace(go.Scatter(name=f"delta rule, β = {beta:g}", mode="lines+markers",
                             line_color=_DELTA, hovertemplate=hover))
    fig.add_trace(go.Scatter(name="least-squares state (best in squared error)", mode="lines+markers",
                             line_color=_LSQ, hovertemplate=hover))
    fig.add_trace(go.Scatter(name="orthogonal keys, either rule", mode="markers",
                             marker=dict(color=_ORTH, symbol="diamond", size=8), hovertemplate=hover))
    fig.add_trace(go.Scatter(name=ELU1_LABEL, mode="lines", line=dict(color=_GREY, dash="dash"),
                             hovertemplate=hover))
    style(fig, title="", x_title="stored pairs N", y_title="mean relative recall error |kS − v| / |v|",
          height=520)
    fig.update_layout(margin=dict(t=150), legend=dict(y=1.04))
    steps, top = [], 0.0
    for d in ds:
        ns = n_grid(d)
        orth = [n for n in ns if n <= d]
        curves = [
            memory.error_curve(d, ns, "additive", seed=seed, trials=trials),
            [memory.expected_additive_error(n, d) for n in ns],
            memory.error_curve(d, ns, "delta", beta=beta, seed=seed, trials=trials),
            memory.error_curve(d, ns, "least_squares", seed=seed, trials=trials),
            memory.error_curve(d, orth, "delta", key_kind="orthogonal", beta=1.0, seed=seed,
                               trials=trials),
            memory.linear_attention_error_curve(d, ns, seed=seed, trials=trials),
        ]
        curves = _r(curves)
        top = max(top, *(max(c) for c in curves))
        xs = [ns, ns, ns, ns, orth, ns]
        steps.append(Step(
            label=str(d), data={"x": xs, "y": curves},
            layout={"title.text": (f"D = {d}: a {d}×{d} state holding N pairs<br>"
                                   f"at N = 4D = {4 * d}: additive {curves[0][-1]:.2f}, "
                                   f"delta {curves[2][-1]:.2f}, least squares {curves[3][-1]:.2f}"),
                    "xaxis.range": [0, 4 * d + 1], "shapes": [_capacity_line(d)],
                    "annotations": [_capacity_label(d)]}))
    fig.update_yaxes(range=[-0.05, top * 1.05])
    return add_slider(fig, steps, prefix="head dimension D = ", active=active)


def interference_by_position(d: int = 16, ns: Sequence[int] | None = None, beta: float = 1.0,
                             key_kind: str = "random", trials: int = 16, seed: int = 0,
                             active: int | None = None) -> go.Figure:
    """Which pairs are lost: recall error of each stored pair by the order it was written in.

    One slider step per ``N`` in ``ns`` (default: :func:`n_grid` of ``d``, 1 to ``4 d``).
    Traces: the additive rule, the delta rule with ``beta`` and the least-squares state.
    With a single ``N`` there is no slider (the live explorer uses that).
    """
    d = check_int(d, "d", 1)
    ns = n_grid(d) if ns is None else _ints(ns, "ns", 1)
    beta = _beta(beta)
    if key_kind == "orthogonal" and max(ns) > d:
        raise ValueError(f"orthogonal keys need every N <= d = {d}; got N = {max(ns)}")
    fig = go.Figure()
    names = [ADDITIVE_LABEL, f"delta rule, β = {beta:g}", "least-squares state"]
    for name, color, dash in zip(names, (_ADD, _DELTA, _LSQ), ("solid", "solid", "dot")):
        fig.add_trace(go.Scatter(name=name, mode="lines+markers", line=dict(color=color, dash=dash),
                                 marker_size=5,
                                 hovertemplate="pair %{x} (1 = oldest): error %{y:.3f}"
                                               "<extra>%{fullData.name}</extra>"))
    style(fig, title="", x_title="pair, in the order written (1 = oldest)",
          y_title="relative recall error |kS − v| / |v|", height=500)
    fig.update_layout(margin=dict(t=130), legend=dict(y=1.04))
    keys = "random unit keys" if key_kind == "random" else "orthogonal keys"
    steps, top = [], 1.0
    for n in ns:
        ys = _r([memory.error_by_position(d, n, rule, key_kind=key_kind, beta=beta, seed=seed,
                                          trials=trials)
                 for rule in ("additive", "delta", "least_squares")])
        top = max(top, *(max(y) for y in ys))
        means = [sum(y) / n for y in ys]
        x = list(range(1, n + 1))
        steps.append(Step(
            label=str(n), data={"x": [x, x, x], "y": ys},
            layout={"title.text": (f"N = {n} pairs in a {d}×{d} state ({keys})<br>mean error: "
                                   f"additive {means[0]:.2f}, delta {means[1]:.2f}, "
                                   f"least squares {means[2]:.2f}"),
                    "xaxis.range": [0.5, n + 0.5]}))
    fig.update_yaxes(range=[-0.05, top * 1.05])
    if len(steps) == 1:
        fig.update_layout(steps[0].layout)
        for i, (x, y) in enumerate(zip(steps[0].data["x"], steps[0].data["y"])):
            fig.data[i].x, fig.data[i].y = x, y
        return fig
    if active is None:
        active = ns.index(2 * d) if 2 * d in ns else len(ns) // 2
    return add_slider(fig, steps, prefix="stored pairs N = ", active=active)


def interference_beta(d: int = 16, betas: Sequence[float] = (0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0),
                      trials: int = 8, seed: int = 0, active: int | None = None) -> go.Figure:
    """Recall error against ``N`` for the delta rule at each write strength ``beta`` (a slider),
    with the additive rule and the least-squares state for reference."""
    d = check_int(d, "d", 1)
    betas = [_beta(b, "each entry of betas") for b in betas]
    if not betas:
        raise ValueError("betas must not be empty")
    ns = n_grid(d)
    additive = _r(memory.error_curve(d, ns, "additive", seed=seed, trials=trials))
    lsq = _r(memory.error_curve(d, ns, "least_squares", seed=seed, trials=trials))
    hover = "N = %{x}: mean error %{y:.3f}<extra>%{fullData.name}</extra>"
    fig = go.Figure([
        go.Scatter(x=ns, y=additive, name=ADDITIVE_LABEL, mode="lines",
                   line=dict(color=_ADD), hovertemplate=hover),
        go.Scatter(x=ns, y=lsq, name="least-squares state (best in squared error)", mode="lines",
                   line=dict(color=_LSQ, dash="dot"), hovertemplate=hover),
        go.Scatter(name="delta rule", mode="lines+markers", line_color=_DELTA, hovertemplate=hover),
    ])
    style(fig, title="", x_title="stored pairs N", y_title="mean relative recall error |kS − v| / |v|",
          height=500)
    fig.update_layout(margin=dict(t=130), legend=dict(y=1.04), shapes=[_capacity_line(d)],
                      annotations=[_capacity_label(d)])
    steps, top = [], max(additive)
    for b in betas:
        curve = _r(memory.error_curve(d, ns, "delta", beta=b, seed=seed, trials=trials))
        top = max(top, max(curve))
        steps.append(Step(label=f"{b:g}", data={"y": [curve], "name": [f"delta rule, β = {b:g}"]},
                          traces=[2],
                          layout={"title.text": (f"delta rule with β = {b:g}, D = {d}: one pair reads "
                                                 f"back with error {curve[0]:.2f}, "
                                                 f"{4 * d} pairs with {curve[-1]:.2f}")}))
    fig.data[2].x = ns
    fig.update_yaxes(range=[-0.05, top * 1.05])
    if active is None:
        active = betas.index(1.0) if 1.0 in betas else 0
    return add_slider(fig, steps, prefix="write strength β = ", active=active)


def read_erase_write_stages(d: int = 8, n_stored: int = 4, target: int = 1, beta: float = 1.0,
                            seed: int = 0, rotate: bool = False) -> go.Figure:
    """One delta-rule write, stage by stage (a slider): read the board, erase, write.

    A ``d x d`` state holds ``n_stored`` pairs under orthonormal keys; the token writes a *new*
    value under the key of stored pair ``target`` (counted from 0, like the heatmap rows).
    Left: the state at this stage; middle: the rank-one term this stage adds; right: what the key
    reads, against the old and the new value (and what the additive rule would read after its
    write: old + new).

    The keys are the first ``n_stored`` basis vectors, so that each association is one row of
    the state and the picture reads like a table; ``rotate=True`` uses random orthonormal keys
    instead (the same algebra, the rows mixed).
    """
    d, n_stored = check_int(d, "d", 1), check_int(n_stored, "n_stored", 1)
    if n_stored > d:
        raise ValueError(f"n_stored must be <= d = {d} (orthonormal keys), got {n_stored}")
    target = check_int(target, "target", 0)
    if target >= n_stored:
        raise ValueError(f"target must be in [0, n_stored) = [0, {n_stored}), got {target}")
    beta = _beta(beta)
    gen = torch.Generator().manual_seed(seed)
    if rotate:
        keys = memory.orthogonal_keys(n_stored, d, gen, dtype=torch.float64)
    else:
        keys = torch.eye(d, dtype=torch.float64)[:n_stored]
    values = torch.randn(n_stored, d, generator=gen, dtype=torch.float64)
    S = memory.write_additive(keys, values)  # orthonormal keys: either rule stores them exactly
    k, v_new = keys[target], torch.randn(d, generator=gen, dtype=torch.float64)
    step = memory.read_erase_write(S, k, v_new, beta)
    zero = torch.zeros_like(S)
    rank1_read = torch.outer(k, step.v_old)
    stages = [
        ("1 · the board", step.before, zero, step.v_old,
         f"the state holds {n_stored} pairs; the key of pair {target} reads its old value"),
        ("2 · read", step.before, rank1_read, step.v_old,
         "read the board: v_old = k S (middle: kᵀ v_old, what the key retrieves)"),
        ("3 · erase", step.erased, -beta * rank1_read, step.read_erased,
         "erase: S − β kᵀ v_old; the key now reads (1 − β) v_old"),
        ("4 · write", step.after, beta * torch.outer(k, v_new), step.read_after,
         "write: + β kᵀ v; the key reads (1 − β) v_old + β v"),
    ]
    lim = round(float(max(x.abs().max() for st in stages for x in st[1:3])), 3)
    ylim = round(float(max(torch.cat([step.v_old, v_new, step.v_old + v_new]).abs().max(), 1.0)) * 1.1, 3)
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.09, column_widths=[0.32, 0.32, 0.36],
                        subplot_titles=("state S at this stage", "term added at this stage",
                                        "what key k reads"))
    idx = list(range(d))
    heat = dict(x=idx, y=idx, colorscale="RdBu", zmid=0, zmin=-lim, zmax=lim, xgap=1, ygap=1)
    fig.add_trace(go.Heatmap(**heat, colorbar=dict(x=0.245, len=0.75, thickness=10),
                             hovertemplate="S[%{y}, %{x}] = %{z:.3f}<extra></extra>"), 1, 1)
    fig.add_trace(go.Heatmap(**heat, showscale=False,
                             hovertemplate="term[%{y}, %{x}] = %{z:.3f}<extra></extra>"), 1, 2)
    fig.add_trace(go.Bar(x=idx, name="k · S now", marker_color=_DELTA,
                         hovertemplate="channel %{x}: %{y:.3f}<extra>k · S now</extra>"), 1, 3)
    fig.add_trace(go.Scatter(x=idx, y=_r(step.v_old.tolist()), name="old value", mode="markers",
                             marker=dict(symbol="circle-open", size=10, color=_GREY, line_width=2),
                             hovertemplate="channel %{x}: %{y:.3f}<extra>old value</extra>"), 1, 3)
    fig.add_trace(go.Scatter(x=idx, y=_r(v_new.tolist()), name="new value v", mode="markers",
                             marker=dict(symbol="x", size=9, color=PALETTE[5]),
                             hovertemplate="channel %{x}: %{y:.3f}<extra>new value v</extra>"), 1, 3)
    fig.add_trace(go.Scatter(x=idx, y=_r((step.v_old + v_new).tolist()), name="additive rule after writing",
                             mode="markers", marker=dict(symbol="triangle-up", size=8, color=_ADD),
                             hovertemplate="channel %{x}: %{y:.3f}<extra>additive rule</extra>"), 1, 3)
    style(fig, title="", x_title="value channel", y_title="key channel", height=470)
    fig.update_layout(margin=dict(t=150, l=70), legend=dict(y=1.12), barmode="overlay")
    for col in (1, 2):
        fig.update_xaxes(title_text="value channel", row=1, col=col, dtick=1 if d <= 16 else None)
        fig.update_yaxes(title_text="key channel" if col == 1 else "", autorange="reversed",
                         row=1, col=col, dtick=1 if d <= 16 else None)
    fig.update_xaxes(title_text="value channel", row=1, col=3)
    fig.update_yaxes(title_text="value read", range=[-ylim, ylim], row=1, col=3)
    steps = []
    for label, state, term, read, text in stages:
        err = float((read - v_new).norm() / v_new.norm())
        # "z" updates the two heatmaps, "y" all three traces (the heatmaps' rows stay 0..d-1)
        steps.append(Step(
            label=label, traces=[0, 1, 2],
            data={"z": [_r(state.tolist()), _r(term.tolist())], "y": [idx, idx, _r(read.tolist())]},
            layout={"title.text": f"{text}<br>β = {beta:g}; distance of the read from v: {err:.2f}"}))
    return add_slider(fig, steps, prefix="stage: ", active=len(steps) - 1)


# --------------------------------------------------------------------------- chapter 5: cost


def chunk_cost(T: int = 4096, ds: Sequence[int] = (32, 64, 128, 256),
               chunk_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
               mark: int | None = None, active: int = 1) -> go.Figure:
    """The cost model of :func:`gpt2k3.ops.wy.chunkwise_cost` against the chunk size.

    Left: FLOPs per token and head -- the part independent of the state (batched over chunks),
    the part inside the sequential loop, and the token-by-token form for reference. Right: the
    number of sequential steps. A slider over the head dimension ``d`` (``d_k = d_v``);
    ``mark`` highlights one chunk size (the live explorer uses that).
    """
    T = check_int(T, "T", 1)
    ds = _ints(ds, "ds", 1)
    cs = sorted(set(_ints(chunk_sizes, "chunk_sizes", 1)))
    if mark is not None:
        mark = check_int(mark, "mark", 1)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.13,
                        subplot_titles=("work per token (one head)", "sequential steps"))
    per_tok = "C = %{x}: %{y:,.0f} FLOPs per token<extra>%{fullData.name}</extra>"
    fig.add_trace(go.Scatter(name="chunkwise, total", mode="lines+markers", line_color=_DELTA,
                             hovertemplate=per_tok), 1, 1)
    fig.add_trace(go.Scatter(name="… independent of the state (parallel)", mode="lines",
                             line=dict(color=_DELTA, dash="dot"), hovertemplate=per_tok), 1, 1)
    fig.add_trace(go.Scatter(name="… inside the loop over chunks", mode="lines",
                             line=dict(color=PALETTE[4], dash="dash"), hovertemplate=per_tok), 1, 1)
    fig.add_trace(go.Scatter(name="token by token (recurrent)", mode="lines", line_color=_ADD,
                             hovertemplate=per_tok), 1, 1)
    steps_ck = [chunkwise_cost(T, c, 1).sequential_steps for c in cs]
    fig.add_trace(go.Scatter(x=cs, y=steps_ck, name="chunkwise: T / C", mode="lines+markers",
                             line_color=_DELTA, showlegend=False,
                             hovertemplate="C = %{x}: %{y:,} sequential steps<extra>chunkwise</extra>"),
                  1, 2)
    fig.add_trace(go.Scatter(x=cs, y=[T] * len(cs), name="recurrent: T", mode="lines",
                             line_color=_ADD, showlegend=False,
                             hovertemplate="%{y:,} sequential steps<extra>recurrent</extra>"), 1, 2)
    style(fig, title="", x_title="chunk size C (log scale)", y_title="FLOPs per token (log scale)",
          height=500)
    fig.update_layout(margin=dict(t=170), legend=dict(y=1.1))
    ticks = [c for c in cs if c in (1, 4, 16, 64, 256, 1024, 4096)] or cs
    fig.update_xaxes(type="log", tickvals=ticks, ticktext=[str(c) for c in ticks], tickangle=0)
    fig.update_xaxes(title_text="chunk size C (log scale)", row=1, col=2)
    fig.update_yaxes(type="log", dtick=1, row=1, col=1)
    fig.update_yaxes(title_text="sequential steps (log scale)", type="log", dtick=1, row=1, col=2)
    steps = []
    for d in ds:
        costs = [chunkwise_cost(T, c, d) for c in cs]
        total = [c.flops / T for c in costs]
        par = [c.parallel_flops / T for c in costs]
        seq = [c.sequential_flops / T for c in costs]
        rec = [costs[0].recurrent_flops / T] * len(cs)
        ref = chunkwise_cost(T, mark if mark is not None else 64, d)
        steps.append(Step(
            label=str(d), traces=[0, 1, 2, 3],
            data={"x": [cs] * 4, "y": [total, par, seq, rec]},
            layout={"title.text": (f"T = {T:,}, head dimension {d}: chunks of {ref.chunk_size} cost "
                                   f"{ref.flops_ratio:.2f}× the recurrent FLOPs<br>in "
                                   f"{ref.sequential_steps:,} sequential steps instead of {T:,}")}))
    if len(steps) == 1:
        fig.update_layout(steps[0].layout)
        for i, (x, y) in zip(steps[0].traces, zip(steps[0].data["x"], steps[0].data["y"])):
            fig.data[i].x, fig.data[i].y = x, y
        if mark is not None:  # the chosen chunk size, as a point on each panel
            ref = chunkwise_cost(T, mark, ds[0])
            point = dict(mode="markers", showlegend=False,
                         marker=dict(size=13, color="rgba(0,0,0,0)", line=dict(color="#000", width=2)))
            fig.add_trace(go.Scatter(x=[mark], y=[ref.flops / T], name=f"C = {mark}", **point,
                                     hovertemplate="C = %{x}: %{y:,.0f} FLOPs per token<extra></extra>"),
                          1, 1)
            fig.add_trace(go.Scatter(x=[mark], y=[ref.sequential_steps], name=f"C = {mark}", **point,
                                     hovertemplate="C = %{x}: %{y:,} steps<extra></extra>"), 1, 2)
        return fig
    fig = add_slider(fig, steps, prefix="head dimension d = ", active=active)
    fig.layout.sliders[0].pad.t = 75  # clear the x-axis titles
    return fig


# --------------------------------------------------------------------------- chapter 5: measured


def speed_rows(results: dict, sweep: str = "T") -> list[dict]:
    """The rows of one sweep (``"T"`` or ``"chunk_size"``) of a chunkwise benchmark file."""
    if sweep not in ("T", "chunk_size"):
        raise ValueError(f"sweep must be 'T' or 'chunk_size', got {sweep!r}")
    rows = [r for r in results.get("rows", []) if r.get("sweep") == sweep]
    if not rows:
        raise ValueError(f"results hold no rows of the {sweep!r} sweep")
    return rows


_METHOD_STYLE = {
    "recurrent": ("ours, token by token (recurrent)", _ADD, "solid"),
    "chunkwise": ("ours, chunkwise", _DELTA, "solid"),
    "fla_naive_chunkwise": ("fla's pure-PyTorch chunkwise reference", _LSQ, "dash"),
    "fla_chunk": ("fla's Triton chunk kernel", _LSQ, "solid"),
    "sdpa_causal": ("causal softmax attention (SDPA)", _ORTH, "solid"),
}


def chunkwise_speed(results: dict) -> go.Figure:
    """Measured time against sequence length (left, log-log) and, at the length of the chunk-size
    sweep, against the chunk size (right), from a ``benchmarks/chunkwise.py`` results file."""
    rows = speed_rows(results, "T")
    sweep = speed_rows(results, "chunk_size")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, column_widths=[0.58, 0.42],
                        subplot_titles=("time per call against length",
                                        f"ours at T = {sweep[0]['T']:,}, by chunk size"))
    series: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        series.setdefault((r["method"], r.get("chunk_size") or 0), []).append(r)
    order = list(_METHOD_STYLE)

    def rank(key):  # known methods in a fixed order, then by chunk size
        method, cs = key
        return (order.index(method) if method in order else len(order), cs)

    for i, key in enumerate(sorted(series, key=rank)):
        method, cs = key
        name, color, dash = _METHOD_STYLE.get(method, (method, PALETTE[i % len(PALETTE)], "solid"))
        if cs:
            name = f"{name}, C = {cs}"
        rs = sorted(series[key], key=lambda r: r["T"])
        fig.add_trace(go.Scatter(
            x=[r["T"] for r in rs], y=[1e3 * r["median_s"] for r in rs], name=name,
            mode="lines+markers", line=dict(color=color, dash=dash, width=2),
            marker_symbol=["circle", "square", "diamond", "cross"][i % 4],
            hovertemplate="T = %{x:,}: %{y:.3g} ms<extra>" + name + "</extra>"), 1, 1)
    sweep = sorted(sweep, key=lambda r: r["chunk_size"])
    fig.add_trace(go.Scatter(
        x=[r["chunk_size"] for r in sweep], y=[1e3 * r["median_s"] for r in sweep],
        name="ours, chunkwise, by chunk size", mode="lines+markers", line_color=_DELTA,
        showlegend=False, hovertemplate="C = %{x}: %{y:.3g} ms<extra>ours, chunkwise</extra>"), 1, 2)
    style(fig, title="", x_title="sequence length T (log scale)", y_title="time per call, ms (log scale)",
          height=520)
    machine = results.get("machine", {})
    fig.update_layout(
        margin=dict(t=190), legend=dict(y=1.1),
        title_text=(f"Measured on {machine.get('device_name', 'this machine')} "
                    f"({machine.get('threads', '?')} threads), torch {machine.get('torch', '?')}<br>"
                    f"B = {results['config']['B']}, {results['config']['H']} heads, "
                    f"head dim {results['config']['D']}, median of {results['config']['repeats']} runs"))
    Ts = sorted({r["T"] for r in rows})
    fig.update_xaxes(type="log", tickvals=Ts, ticktext=[f"{T:,}" for T in Ts], tickangle=0, row=1, col=1)
    fig.update_yaxes(type="log", row=1, col=1)
    chunks = [r["chunk_size"] for r in sweep]
    fig.update_xaxes(type="log", tickvals=chunks, ticktext=[str(c) for c in chunks], tickangle=0,
                     title_text="chunk size C (log scale)", row=1, col=2)
    fig.update_yaxes(type="log", title_text="ms (log scale)", row=1, col=2)
    return fig


def delta_read_write(d: int = 4, n: int = 3, beta: float = 1.0, seed: int = 0):
    """The delta rule's write as a picture of small matrices, one equation per row.

    A ``d x d`` state holding ``n - 1`` pairs (random unit keys, standard-normal values, written
    with the delta rule), then one more pair ``(k_t, v_t)`` written with strength ``beta``. Rows:
    read ``k_t S_{t-1} = v_old``; correct ``beta (v_t - v_old) = u_t``; write
    ``S_{t-1} + k_t^T u_t = S_t``; check ``k_t S_t``, which is ``v_t`` for ``beta = 1``. The
    numbers are :func:`gpt2k3.experiments.memory.read_erase_write`'s (tested against
    :func:`gpt2k3.ops.delta.recurrent`); the figure's ``step`` holds that step.
    """
    d, n = check_int(d, "d", 1), check_int(n, "n", 2)
    beta = _beta(beta)
    gen = torch.Generator().manual_seed(check_int(seed, "seed", 0))
    keys = memory.random_unit_keys(n, d, generator=gen, dtype=torch.float64)
    values = torch.randn(n, d, generator=gen, dtype=torch.float64)
    before = memory.write_delta(keys[:-1], values[:-1], beta=beta)
    k, v = keys[-1], values[-1]
    step = memory.read_erase_write(before, k, v, beta)
    u = beta * (v - step.v_old)
    b = f"{beta:g}"
    rows = [("1 read", [("$k_t$", k[None]), ("$S_{t-1}$", before), "=", (r"$v^{\mathrm{old}}_t$", step.v_old[None])]),
            ("2 correct", ["β (", ("$v_t$", v[None]), "−", (r"$v^{\mathrm{old}}_t$", step.v_old[None]), ") =",
                           ("$u_t$", u[None])]),
            ("3 write", [("$S_{t-1}$", before), "+", (r"$k_t^{\top}$", k[None].T), ("$u_t$", u[None]), "=",
                         ("$S_t$", step.after)]),
            ("4 check", [("$k_t$", k[None]), ("$S_t$", step.after), "=", ("$k_t S_t$", step.read_after[None])])]
    fig = equation_rows(
        rows, f"One delta-rule write (β = {b}): read what the key holds, write only the correction",
        alt=(f"Small matrices as coloured cells, four rows. Read: the key row times the {d}×{d} state gives "
             f"the old value. Correct: {b} times the new value minus the old value gives the correction u. "
             f"Write: the state plus the key column times u gives the new state. Check: the key now reads "
             + ("exactly the new value." if beta == 1.0 else f"(1 − {b}) × old + {b} × new.")))
    fig.step = step
    return fig
