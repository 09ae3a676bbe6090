r"""Chapter 3 (linear attention): the seed's non-causal prefill, state vs cache, the measured
crossover, and what the ELU+1 feature map does to the attention weights.

Besides the figure builders this module holds the small pieces of arithmetic the chapter and
``benchmarks/crossover.py`` share, so both compute them the same way and the tests cover them:

* :func:`state_vs_cache_counts` -- bytes held and multiply-adds of a KV cache, a linear state and
  no cache at all, as closed forms in ``N`` and ``D``;
* :func:`first_crossing` / :func:`crossover_n` -- where one measured curve overtakes another;
* :func:`generation_totals` -- the total time to generate ``N`` tokens from per-step times
  measured at a few context lengths;
* :func:`speedup_rows` -- the "thousand-fold" comparison, from one results file.

:func:`state_read_write` is a schematic, not an explorable: the write ``S += k^T v`` and the read
``q S`` drawn as small matrices with real numbers, a static picture beside the equation.
:func:`equation_rows` draws such pictures (chapter 4's :func:`gpt2k3.book.figures.delta_read_write`
uses it too).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from matplotlib.patches import Rectangle as _Rect
from plotly.subplots import make_subplots

from gpt2k3.book.figures._style import PALETTE, Step, add_slider, style
from gpt2k3.book.figures.matrices import PNGFigure
from gpt2k3.checks import check_int, check_positive_float
from gpt2k3.seed import seed_prefill
from gpt2k3.ops import linear as _linear

__all__ = [
    "prefill_leak", "seed_prefill_leak",
    "state_vs_cache_counts", "state_vs_cache",
    "feature_map_weights_data", "feature_map_weights",
    "first_crossing", "crossover_n", "generation_totals", "speedup_rows", "measured_crossover",
    "equation_rows", "state_read_write",
]


def _round(xs, sig: int = 6) -> list[float]:
    """Floats rounded to ``sig`` significant digits: plenty for a plot, and the stored figure
    does not change with the last-bit rounding of another CPU's kernels."""
    return [float(f"{x:.{sig}g}") for x in xs]


def fmt_bytes(n: float) -> str:
    """``1536 -> '1.5 KiB'``: binary units, three significant digits."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def fmt_seconds(s: float) -> str:
    """``0.0123 -> '12.3 ms'``."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if s >= scale or unit == "ns":
            return f"{s / scale:.3g} {unit}"
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------------------------
# 1. the seed's one-shot prefill sees the future
# ---------------------------------------------------------------------------------------------


def prefill_leak(T: int = 8, D: int = 16, changed: int = 4, seed: int = 0) -> dict[str, list]:
    """Change the key and value of token ``changed`` and measure how every output moves.

    One head, float64, random features (``elu1`` of Gaussian projections). Returns, per
    position ``t``, ``max |o_t(after) - o_t(before)|`` for the causal chunkwise form
    (``"ours"``, chunk size 4) and for :func:`gpt2k3.seed.seed_prefill` (``"seed"``).
    A causal form leaves every position before ``changed`` exactly unchanged.
    """
    T, D = check_int(T, "T", 2), check_int(D, "D", 1)
    changed = check_int(changed, "changed", 0)
    if changed >= T:
        raise ValueError(f"changed must be a position in [0, {T}), got {changed}")
    g = torch.Generator().manual_seed(seed)
    q, k = (_linear.elu1(torch.randn(1, 1, T, D, generator=g, dtype=torch.float64)) for _ in range(2))
    v = torch.randn(1, 1, T, D, generator=g, dtype=torch.float64)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, changed] = _linear.elu1(torch.randn(D, generator=g, dtype=torch.float64))
    v2[:, :, changed] = torch.randn(D, generator=g, dtype=torch.float64)

    def moved(before, after):
        return _round((after - before).abs().amax(dim=(0, 1, 3)).tolist())

    ours = moved(_linear.chunkwise(q, k, v, chunk_size=4)[0], _linear.chunkwise(q, k2, v2, chunk_size=4)[0])
    seed_ = moved(seed_prefill(q, k, v)[0], seed_prefill(q, k2, v2)[0])
    return {"position": list(range(T)), "ours": ours, "seed": seed_}


def seed_prefill_leak(T: int = 8, D: int = 16, seed: int = 0, active: int | None = None) -> go.Figure:
    """Bars: how far each position's output moves when one later token changes, for the seed's
    one-shot prefill and for the causal form; a slider over which token changes."""
    T = check_int(T, "T", 2)
    choices = list(range(1, T))
    active = len(choices) - 1 if active is None else active
    fig = go.Figure([
        go.Bar(name="seed's one-shot prefill", marker_color=PALETTE[5],
               hovertemplate="position %{x}: output moved by %{y:.3g}<extra>seed's prefill</extra>"),
        go.Bar(name="causal forms (ours)", marker_color=PALETTE[0],
               hovertemplate="position %{x}: output moved by %{y:.3g}<extra>causal</extra>"),
    ])
    style(fig, title="", x_title="position t (token index)",
          y_title="max |change of output o_t|", height=460)
    fig.update_layout(barmode="group", margin=dict(t=120))
    fig.update_xaxes(dtick=1)
    steps = []
    for j in choices:
        d = prefill_leak(T, D, j, seed)
        steps.append(Step(
            label=str(j),
            data={"x": [d["position"], d["position"]], "y": [d["seed"], d["ours"]]},
            layout={"title.text": (f"Token {j} changed: position 0 moves by {d['seed'][0]:.3g} "
                                   f"(seed's prefill)<br>and by {d['ours'][0]:g} in the causal form, "
                                   f"where 0–{j - 1} must not move")}))
    return add_slider(fig, steps, prefix="token changed: ", active=active)


# ---------------------------------------------------------------------------------------------
# 2. what is held and what is computed: closed forms
# ---------------------------------------------------------------------------------------------


def state_vs_cache_counts(n, head_dim: int, n_layer: int = 1, n_head: int = 1,
                          dtype_bytes: int = 4) -> dict[str, np.ndarray]:
    r"""Memory and work of decoding, per sequence, as closed forms in the context length ``n``.

    With ``D = head_dim`` and a factor ``L H`` for layers and heads:

    * bytes held: KV cache ``2 n D``, linear state ``D^2 + D`` (``S`` and ``z``) numbers;
    * multiply-adds of one decode step at context ``n``: softmax with a KV cache ``2 n D``
      (scores ``q k_j`` and the weighted sum of ``v_j``; the exponentials are not counted),
      linear state ``2 D (D + 1)`` (write ``k^T v`` and ``k``, read ``q S`` and ``q z``);
    * multiply-adds to generate ``n`` tokens (steps at contexts ``1..n``): KV cache
      ``sum 2 m D = n (n + 1) D`` -- O(n^2 D); state ``2 n D (D + 1)`` -- O(n D^2); no cache,
      where step ``m`` recomputes attention for all ``m`` positions,
      ``sum m (m + 1) D = n (n + 1) (n + 2) D / 3`` -- O(n^3 D).

    ``n`` may be an int or an array of ints >= 1. Returns float arrays (exact up to 2^53).
    """
    D = check_int(head_dim, "head_dim", 1)
    f = check_int(n_layer, "n_layer", 1) * check_int(n_head, "n_head", 1)
    b = check_int(dtype_bytes, "dtype_bytes", 1)
    n = np.asarray(n, dtype=np.float64)
    if n.size == 0 or np.any(n < 1) or np.any(n != np.floor(n)):
        raise ValueError("n must be one or more integers >= 1")
    one = np.ones_like(n)
    return {
        "n": n,
        "kv_bytes": f * b * 2.0 * n * D,
        "state_bytes": f * b * (D * D + D) * one,
        "kv_step_macs": f * 2.0 * n * D,
        "state_step_macs": f * 2.0 * D * (D + 1) * one,
        "kv_total_macs": f * n * (n + 1) * D,
        "state_total_macs": f * 2.0 * n * D * (D + 1),
        "no_cache_total_macs": f * n * (n + 1) * (n + 2) * D / 3.0,
    }


def _log_grid(max_n: int, points: int = 97) -> list[int]:
    return sorted({int(round(x)) for x in np.logspace(0, math.log10(max_n), points)} | {1, max_n})


def state_vs_cache(head_dims: Sequence[int] = (32, 64, 128, 256), n_layer: int = 12, n_head: int = 12,
                   dtype_bytes: int = 4, max_n: int = 2 ** 20, active: int = 1) -> go.Figure:
    """Left: bytes held at context ``N`` (KV cache vs state). Right: multiply-adds to generate
    ``N`` tokens (no cache, KV cache, state). Log-log; a slider over the head dim ``D``."""
    head_dims = [check_int(d, "head_dims entries", 1) for d in head_dims]
    if not head_dims:
        raise ValueError("head_dims must hold at least one head dimension")
    max_n = check_int(max_n, "max_n", 2)
    ns = _log_grid(max_n)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.16,
                        subplot_titles=("memory held at context N", "total work to generate N tokens"))
    traces = [  # (column, legend group, name, colour, dash)
        (1, "kv", "KV cache", PALETTE[1], "solid"),
        (1, "state", "linear state (S, z)", PALETTE[0], "solid"),
        (2, "nc", "no cache (recompute)", PALETTE[5], "dot"),
        (2, "kv", "KV cache", PALETTE[1], "solid"),
        (2, "state", "linear state (S, z)", PALETTE[0], "solid"),
    ]
    seen = set()
    for col, group, name, color, dash in traces:
        unit = "" if col == 1 else " multiply-adds"
        fig.add_trace(go.Scatter(name=name, mode="lines", line=dict(color=color, dash=dash, width=2.5),
                                 legendgroup=group, showlegend=group not in seen,
                                 hovertemplate=f"N=%{{x:,}}: %{{text}}{unit}<extra>{name}</extra>"),
                      1, col)
        seen.add(group)
    style(fig, title="", x_title="context length N (tokens)", y_title="bytes (log scale)", height=540)
    fig.update_layout(margin=dict(t=175), legend=dict(y=1.13))
    fig.update_xaxes(type="log", dtick=1)
    fig.update_yaxes(type="log", exponentformat="power")
    fig.update_xaxes(title_text="tokens generated N", row=1, col=2)
    fig.update_yaxes(title_text="multiply-adds (log scale)", row=1, col=2)
    steps = []
    for D in head_dims:
        c = state_vs_cache_counts(ns, D, n_layer, n_head, dtype_bytes)
        texts = [[fmt_bytes(x) for x in c["kv_bytes"]], [fmt_bytes(x) for x in c["state_bytes"]],
                 *[[f"{x:.3g}" for x in c[key]]
                   for key in ("no_cache_total_macs", "kv_total_macs", "state_total_macs")]]
        ys = [c["kv_bytes"], c["state_bytes"], c["no_cache_total_macs"], c["kv_total_macs"],
              c["state_total_macs"]]
        title = (f"D = {D}, {n_layer} layers × {n_head} heads, {dtype_bytes}-byte numbers: "
                 f"state {fmt_bytes(c['state_bytes'][0])}<br>cache larger from N = {math.ceil((D + 1) / 2)}, "
                 f"more total work past N = {2 * D + 1}<br>at N = {max_n:,} the cache holds "
                 f"{c['kv_bytes'][-1] / c['state_bytes'][-1]:,.0f}× the state")
        steps.append(Step(label=str(D), data={"x": [ns] * 5, "y": [y.tolist() for y in ys], "text": texts},
                          layout={"title.text": title}))
    if len(steps) == 1:
        s = steps[0]
        for i, tr in enumerate(fig.data):
            for attr, values in s.data.items():
                tr[attr] = values[i]
        fig.update_layout(title_text=s.layout["title.text"])
        return fig
    return add_slider(fig, steps, prefix="head dim D: ", active=active)


# ---------------------------------------------------------------------------------------------
# 3. softmax vs ELU+1 weights on the same queries and keys
# ---------------------------------------------------------------------------------------------


def feature_map_weights_data(q: torch.Tensor, k: torch.Tensor, scale: float = 1.0) -> dict[str, torch.Tensor]:
    r"""Causal attention weights of softmax and of ELU+1 for the same ``q``, ``k`` ``(T, D)``.

    Both see the projections scaled by ``scale`` (how large the projections are, i.e. how
    peaked the scores can get): softmax weighs key ``s`` by ``exp(c^2 q_t k_s / sqrt(D))``,
    linear attention by ``elu1(c q_t) . elu1(c k_s)``; each row is normalised over ``s <= t``.
    Returns ``{"softmax", "linear"}`` as ``(T, T)`` float64 tensors, zero above the diagonal.
    """
    for name, x in (("q", q), ("k", k)):
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise ValueError(f"{name} must be a (T, D) tensor, got {getattr(x, 'shape', type(x))}")
    if q.shape != k.shape:
        raise ValueError(f"k must have the shape of q {tuple(q.shape)}, got {tuple(k.shape)}")
    scale = check_positive_float(scale, "scale")
    q, k = q.double() * scale, k.double() * scale
    T, D = q.shape
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    soft = (q @ k.T / math.sqrt(D)).masked_fill(future, -math.inf).softmax(-1)
    a = (_linear.elu1(q) @ _linear.elu1(k).T).masked_fill(future, 0.0)
    return {"softmax": soft, "linear": a / a.sum(-1, keepdim=True)}


def _sharpness(w: torch.Tensor) -> tuple[float, float]:
    """For the last row (the query that sees every key): top weight and effective number of keys
    ``1 / sum w^2`` (1 for one-hot, T for uniform)."""
    last = w[-1]
    return float(last.max()), float(1.0 / (last ** 2).sum())


def feature_map_weights(T: int = 12, D: int = 16, scales: Sequence[float] = (0.25, 0.5, 1, 2, 4, 8, 16),
                        seed: int = 0, active: int = 2) -> go.Figure:
    """Heatmaps of causal attention weights, softmax (left) vs ELU+1 (right), for the same random
    queries and keys; a slider over the scale of the projections (how peaked the scores are)."""
    T, D = check_int(T, "T", 2), check_int(D, "D", 1)
    scales = list(scales)
    if not scales:
        raise ValueError("scales must hold at least one value")
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(T, D, generator=g, dtype=torch.float64) for _ in range(2))
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("softmax: exp(q·k/√D)", "linear: elu1(q)·elu1(k)"))
    for col, name in ((1, "softmax"), (2, "ELU+1")):
        fig.add_trace(go.Heatmap(zmin=0, zmax=1, colorscale="Blues", showscale=(col == 2),
                                 colorbar=dict(title="weight", len=0.8),
                                 hovertemplate=("query %{y}, key %{x}: weight %{z:.3f}"
                                                f"<extra>{name}</extra>")),
                      1, col)
    style(fig, title="", x_title="key position s", y_title="query position t", height=500)
    fig.update_layout(margin=dict(t=150))
    fig.update_xaxes(title_text="key position s", row=1, col=2, dtick=2)
    fig.update_xaxes(dtick=2, row=1, col=1)
    fig.update_yaxes(autorange="reversed", dtick=2)
    fig.update_yaxes(title_text="query position t", row=1, col=2)

    def grid(w):
        return [_round(w[t, :t + 1].tolist()) + [None] * (T - t - 1) for t in range(T)]

    steps = []
    for c in scales:
        w = feature_map_weights_data(q, k, c)
        (ms, es), (ml, el) = _sharpness(w["softmax"]), _sharpness(w["linear"])
        steps.append(Step(
            label=f"{c:g}",
            data={"z": [grid(w["softmax"]), grid(w["linear"])]},
            layout={"title.text": (f"q, k × {c:g}; the last query sees all {T} keys:<br>"
                                   f"top weight {ms:.2f} (softmax) vs {ml:.2f} (ELU+1), "
                                   f"effective keys 1/Σw² {es:.1f} vs {el:.1f}")}))
    if len(steps) == 1:
        fig.data[0].z, fig.data[1].z = steps[0].data["z"]
        fig.update_layout(title_text=steps[0].layout["title.text"])
        return fig
    return add_slider(fig, steps, prefix="scale of q and k: ", active=active)


# ---------------------------------------------------------------------------------------------
# 4. measured: crossover and totals (shared with benchmarks/crossover.py)
# ---------------------------------------------------------------------------------------------


def _as_curve(ns, ys, what: str) -> tuple[np.ndarray, np.ndarray]:
    ns, ys = np.asarray(ns, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    if ns.ndim != 1 or ns.shape != ys.shape or ns.size == 0:
        raise ValueError(f"ns and {what} must be 1-d sequences of the same non-zero length, "
                         f"got {ns.shape} and {ys.shape}")
    if np.any(ns < 1) or np.any(np.diff(ns) <= 0):
        raise ValueError("ns must be strictly increasing context lengths >= 1")
    if not np.all(np.isfinite(ys)) or np.any(ys <= 0):
        raise ValueError(f"{what} must be finite and > 0")
    return ns, ys


def first_crossing(ns, ratio, threshold: float = 1.0) -> float | None:
    """The ``N`` at which ``ratio`` rises above ``threshold`` for good (log-log interpolated).

    ``ratio`` is measured at increasing ``ns``. Returns ``ns[0]`` if it is above everywhere,
    ``None`` if its last value is not above (no crossing within the range), otherwise the point
    between the last grid point at or below the threshold and the next one where the
    interpolated ``log ratio`` equals ``log threshold``.
    """
    ns, r = _as_curve(ns, ratio, "ratio")
    if not threshold > 0:
        raise ValueError(f"threshold must be > 0, got {threshold!r}")
    above = r > threshold
    if above.all():
        return float(ns[0])
    if not above[-1]:
        return None
    i = int(np.nonzero(~above)[0][-1])
    x0, x1 = math.log(ns[i]), math.log(ns[i + 1])
    y0, y1 = math.log(r[i] / threshold), math.log(r[i + 1] / threshold)
    return float(math.exp(x0 + (0.0 - y0) * (x1 - x0) / (y1 - y0)))


def crossover_n(ns, t_kv, t_state) -> float | None:
    """Context length where a decode step with the state becomes faster than one with the KV
    cache and stays faster: :func:`first_crossing` of ``t_kv / t_state`` at 1."""
    ns, a = _as_curve(ns, t_kv, "t_kv")
    _, b = _as_curve(ns, t_state, "t_state")
    return first_crossing(ns, a / b, 1.0)


def generation_totals(ns, step_s, lengths, fit_points: int | None = None) -> tuple[list[float], list[bool]]:
    """Total seconds to generate ``N`` tokens, for each ``N`` in ``lengths``, from per-step times.

    Generating ``N`` tokens takes one decode step at each context ``n = 1..N``, so the total is
    ``sum_{n=1}^{N} t(n)``. ``t`` is measured at a few ``ns`` and interpolated linearly in
    log-log between them (a power law between neighbours); below ``ns[0]`` it is ``t(ns[0])``.
    Beyond ``ns[-1]`` it is extrapolated: with ``fit_points`` set, by the least-squares power
    law through the last ``fit_points`` measurements; without, by holding the last value.

    Returns ``(totals, extrapolated)``: ``extrapolated[i]`` says whether ``lengths[i]`` needed
    step times beyond the measured range.
    """
    ns, ts = _as_curve(ns, step_s, "step_s")
    lengths = [check_int(n, "lengths entries", 1) for n in lengths]
    if not lengths:
        raise ValueError("lengths must hold at least one N")
    top = max(lengths)
    n = np.arange(1, top + 1, dtype=np.float64)
    t = np.exp(np.interp(np.log(n), np.log(ns), np.log(ts)))
    beyond = n > ns[-1]
    if beyond.any() and fit_points is not None:
        m = check_int(fit_points, "fit_points", 2)
        if ns.size < m:
            raise ValueError(f"fit_points={m} needs at least {m} measured points, got {ns.size}")
        slope, icpt = np.polyfit(np.log(ns[-m:]), np.log(ts[-m:]), 1)
        t[beyond] = np.exp(icpt + slope * np.log(n[beyond]))
    cum = np.cumsum(t)
    return [float(cum[N - 1]) for N in lengths], [bool(N > ns[-1]) for N in lengths]


def _check_result(result: dict, head_dim) -> dict:
    if not isinstance(result, dict) or "head_dims" not in result:
        raise ValueError("result must be a benchmarks/crossover.py results dict (with 'head_dims')")
    key = str(head_dim)
    if key not in result["head_dims"]:
        raise ValueError(f"head_dim must be one of {sorted(result['head_dims'], key=int)}, got {head_dim!r}")
    return result["head_dims"][key]


def speedup_rows(result: dict, head_dim: int, lengths: Sequence[int] | None = None) -> list[dict]:
    """The "thousand-fold speedup" from one results file: per generation length ``N``, the total
    attention time of each method and the state's speedup over each.

    ``block_vs_kv`` adds to both sides the rest of a GPT-2-style block (projections, MLP,
    LayerNorms), ``N`` times its measured per-token time: the speedup of a whole layer.
    """
    r = _check_result(result, head_dim)
    tot = r["totals"]
    lengths = list(tot["n"]) if lengths is None else list(lengths)
    idx = {n: i for i, n in enumerate(tot["n"])}
    rows = []
    for N in lengths:
        if N not in idx:
            raise ValueError(f"lengths must be among the measured totals {tot['n']}, got {N!r}")
        i = idx[N]
        nc, kv, st = tot["no_cache_s"][i], tot["kv_cache_s"][i], tot["state_s"][i]
        rest = N * r["rest_of_block_s"]
        rows.append({"n": N, "no_cache_s": nc, "no_cache_extrapolated": tot["no_cache_extrapolated"][i],
                     "kv_cache_s": kv, "state_s": st, "vs_no_cache": nc / st, "vs_kv_cache": kv / st,
                     "block_vs_kv": (kv + rest) / (st + rest)})
    return rows


def measured_crossover(results: dict | Sequence[dict], active: int = 0) -> go.Figure:
    """Measured decode cost from ``benchmarks/crossover.py`` results.

    Left: seconds per decode step against context ``N`` (KV cache, linear state, and the
    cacheless baseline where measured), with the crossover marked. Right: total seconds to
    generate ``N`` tokens; the cacheless total is dashed where it is extrapolated. A slider
    over head dims (and devices, when several results files are passed).
    """
    results = [results] if isinstance(results, dict) else list(results)
    if not results:
        raise ValueError("results must hold at least one results dict")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.16,
                        subplot_titles=("time per decode step", "time to generate N tokens"))
    spec = [  # (column, legend group, name, colour, dash, markers)
        (1, "kv", "KV cache", PALETTE[1], "solid", True),
        (1, "state", "linear state", PALETTE[0], "solid", True),
        (1, "nc", "no cache", PALETTE[5], "dot", True),
        (1, "cross", "crossover", "#555555", "dash", False),
        (2, "nc", "no cache", PALETTE[5], "dot", False),
        (2, "ext", "no cache, extrapolated", PALETTE[5], "dash", False),
        (2, "kv", "KV cache", PALETTE[1], "solid", False),
        (2, "state", "linear state", PALETTE[0], "solid", False),
    ]
    seen = set()
    for col, group, name, color, dash, marker in spec:
        fig.add_trace(go.Scatter(
            name=name, mode="lines+markers" if marker else "lines",
            line=dict(color=color, dash=dash, width=2), marker=dict(size=5),
            legendgroup=group, showlegend=group not in seen,
            hovertemplate=f"N=%{{x:,}}: %{{text}}<extra>{name}</extra>"), 1, col)
        seen.add(group)
    style(fig, title="", x_title="context length N (tokens)", y_title="seconds (log scale)", height=560)
    fig.update_layout(margin=dict(t=200), legend=dict(y=1.12))
    fig.update_xaxes(type="log", dtick=1)
    fig.update_yaxes(type="log", exponentformat="power")
    fig.update_xaxes(title_text="tokens generated N", row=1, col=2)
    steps = []
    for res in results:
        device = res.get("config", {}).get("device", "cpu")
        for D in sorted(res["head_dims"], key=int):
            r = res["head_dims"][D]
            dec, nc, tot = r["decode"], r["no_cache"], r["totals"]
            c = r["crossover_n"]
            lo = min(min(dec["state_s"]), min(dec["kv_cache_s"]))
            hi = max(max(dec["kv_cache_s"]), max(nc["step_s"]) if nc["step_s"] else 0)
            ext = tot["no_cache_extrapolated"]
            last_measured = max([i for i, e in enumerate(ext) if not e], default=-1)
            meas_x = tot["n"][:last_measured + 1]
            ext_x = tot["n"][max(last_measured, 0):]

            def sel(xs, ys, xs_sel):
                return [y for x, y in zip(xs, ys) if x in set(xs_sel)]

            xs = [dec["n"], dec["n"], nc["n"], [c, c] if c else [], meas_x, ext_x, tot["n"], tot["n"]]
            ys = [dec["kv_cache_s"], dec["state_s"], nc["step_s"], [lo, hi] if c else [],
                  sel(tot["n"], tot["no_cache_s"], meas_x), sel(tot["n"], tot["no_cache_s"], ext_x),
                  tot["kv_cache_s"], tot["state_s"]]
            texts = [[fmt_seconds(y) for y in yy] for yy in ys]
            if c:
                texts[3] = [f"crossover N ≈ {c:,.0f}"] * 2
            n_last = dec["n"][-1]
            kv_last, st_last = dec["kv_cache_s"][-1], dec["state_s"][-1]
            cross = (f"the state is faster from N ≈ {c:,.0f} on" if c
                     else "the state is not faster anywhere in this range")
            label = f"D={D}" if len(results) == 1 else f"{device}, D={D}"
            title = (f"{res['machine'].get('gpu') or res['machine']['cpu']} ({device}), "
                     f"{res['config']['n_head']} heads × D = {D}, {res['config']['dtype']}"
                     f"{', quick run' if res.get('quick') else ''}<br>{cross}; "
                     f"at N = {n_last:,} a step takes<br>{fmt_seconds(kv_last)} with the KV cache, "
                     f"{fmt_seconds(st_last)} with the state ({kv_last / st_last:,.0f}×)")
            steps.append(Step(label=label, data={"x": xs, "y": ys, "text": texts},
                              layout={"title.text": title}))
    if len(steps) == 1:
        for i, tr in enumerate(fig.data):
            for attr, values in steps[0].data.items():
                tr[attr] = values[i]
        fig.update_layout(title_text=steps[0].layout["title.text"])
        return fig
    return add_slider(fig, steps, prefix="", active=active)


# --------------------------------------------------------------------------- schematics


def equation_rows(rows, caption: str, alt: str, cell: float = 0.32) -> PNGFigure:
    """Draw equations whose terms are small matrices, one equation per row.

    ``rows`` is a list of ``(title, items)``; an item is a string (an operator or a word, drawn
    as text) or a ``(label, matrix)`` pair, a 2-D tensor drawn cell by cell on one diverging
    colour scale shared by the whole figure (0 is white) under its TeX ``label``. A row vector is
    ``1 x D``, a column ``D x 1``. Returns a PNG figure whose ``matrices`` hold every drawn matrix
    by label, ``caption`` the caption and ``alt`` the description (see
    :mod:`gpt2k3.book.figures.matrices`).
    """
    mats = {}
    for _, items in rows:
        for item in items:
            if not isinstance(item, str):
                label, m = item
                m = torch.as_tensor(m).detach().double().cpu()
                if m.dim() != 2:
                    raise ValueError(f"each matrix must be 2-D, got {label!r} of shape {tuple(m.shape)}")
                mats[label] = m
    if not mats:
        raise ValueError("rows must hold at least one matrix")
    lim = max(float(m.abs().max()) for m in mats.values()) or 1.0
    gap, title_w = 0.5, 2.6

    def width(item):
        return mats[item[0]].shape[1] if not isinstance(item, str) else 0.3 * max(1, len(item)) + 0.3

    heights = [max((mats[i[0]].shape[0] for i in items if not isinstance(i, str)), default=1) + 1.6
               for _, items in rows]
    widths = [title_w + sum(width(i) + gap for i in items) for _, items in rows]
    W, H = max(widths), sum(heights)
    fig = PNGFigure(figsize=(W * cell, H * cell))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, W)
    ax.set_ylim(H, 0)
    ax.set_axis_off()
    top = 0.0
    for (title, items), h in zip(rows, heights):
        mid = top + (h - 0.6) / 2
        ax.text(0.1, mid, title, ha="left", va="center", fontsize=11, fontweight="bold")
        x = title_w
        for item in items:
            w = width(item)
            if isinstance(item, str):
                ax.text(x + w / 2, mid, item, ha="center", va="center", fontsize=13)
            else:
                label, m = item[0], mats[item[0]]
                r, c = m.shape
                y0 = mid - r / 2
                ax.imshow(m.numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest",
                          extent=(x, x + c, y0 + r, y0))
                ax.add_patch(_Rect((x, y0), c, r, fill=False, lw=1.0, ec="#333333"))
                ax.text(x + c / 2, y0 + r + 0.15, label, ha="center", va="top", fontsize=10)
            x += w + gap
        top += h
    fig.matrices = mats
    fig.caption, fig.alt = caption, alt
    return fig


def state_read_write(d: int = 4, n: int = 3, seed: int = 0) -> PNGFigure:
    """Linear attention's state, written and read, as a picture of small matrices.

    ``n`` pairs with ELU+1 keys of dimension ``d`` (standard-normal before the feature map) and
    standard-normal values. Top row, the write of the last pair: ``S_{t-1} + k_t^T v_t = S_t``
    (a column times a row). Bottom row, the read with the first pair's key: ``k_1 S_t`` divided by
    ``k_1 . z_t`` equals ``sum_j w_j v_j`` with ``w_j = k_1 . k_j / k_1 . z_t``, every ``w_j``
    positive because every feature is: each stored pair leaks into the read. The numbers are
    those of :func:`gpt2k3.ops.linear.recurrent` (tested); the weights are ``fig.weights``.
    """
    d, n = check_int(d, "d", 1), check_int(n, "n", 2)
    gen = torch.Generator().manual_seed(check_int(seed, "seed", 0))
    k = _linear.elu1(torch.randn(n, d, generator=gen, dtype=torch.float64))
    v = torch.randn(n, d, generator=gen, dtype=torch.float64)
    before = k[:-1].T @ v[:-1]
    S, z = k.T @ v, k.sum(0)
    q = k[0]
    w = (k @ q) / (q @ z)
    o = (q @ S) / (q @ z)
    terms = []
    for j in range(n):
        terms += [("+ " if j else "") + f"{w[j].item():.2f}", (f"$v_{j + 1}$", v[j:j + 1])]
    rows = [("write", [("$S_{t-1}$", before), "+", ("$k_t^{\\top}$", k[-1:].T), (r"$v_t$", v[-1:]),
                       "=", ("$S_t$", S)]),
            ("read", [(r"$q_t = k_1$", q[None]), ("$S_t$", S), "/ q·z =", ("$o_t$", o[None])]),
            ("returns", [("$o_t$", o[None]), "=", *terms])]
    fig = equation_rows(
        rows, "Linear attention's state: a write adds kᵀv, a read returns every value",
        alt=(f"Small matrices as coloured cells. Top: a {d}×{d} state plus a key column times a value row "
             f"equals the new state. Bottom: reading with the first key returns a {d}-entry row equal to "
             f"a weighted sum of all {n} stored values, every weight positive: "
             + ", ".join(f"{x:.2f}" for x in w.tolist()) + "."))
    fig.weights = w
    return fig
