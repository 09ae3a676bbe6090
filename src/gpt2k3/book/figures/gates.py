r"""Chapter 6 (gates): forgetting by age, memory half-life, scalar vs channel-wise decay,
retrieval after distractors, and the cache of a KDA / attention hybrid.

The memory figures run the experiments of :mod:`gpt2k3.experiments.forgetting` (which run the real
gated delta-rule mixer); the hybrid figure lays out :func:`gpt2k3.accounting.hybrid_cache_bytes`.
Plotted numbers are rounded to four significant digits, so a figure stored in a notebook does
not change with the last-bit rounding of another machine's arithmetic.
"""

from __future__ import annotations

import math
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gpt2k3.accounting import (
    STATE_DTYPE_BYTES,
    ArchSpec,
    hybrid_cache_bytes,
    hybrid_spec,
    ratio_label,
)
from gpt2k3.archs import KIMI_LINEAR_48B
from gpt2k3.book.display import fmt_decimal_bytes, sig
from gpt2k3.book.figures._style import PALETTE, Step, add_slider, style
from gpt2k3.checks import check_finite_number, check_int, is_int
from gpt2k3.experiments import forgetting as fg

# hybrid_spec, hybrid_cache_bytes and ratio_label are gpt2k3.accounting's, listed here because
# the chapter's figures are built on them.
__all__ = ["forgetting_by_age", "memory_half_life", "channel_decay", "distractor_retrieval",
           "hybrid_spec", "hybrid_cache_bytes", "hybrid_cache", "ratio_label"]

_BLUE, _ORANGE, _GREEN, _PINK, _GREY = PALETTE[0], PALETTE[1], PALETTE[2], PALETTE[3], "#888888"


def _r(xs, digits: int = 4) -> list[float]:
    """Round to ``digits`` significant digits (stable stored figures; plenty for a plot)."""
    return [sig(x, digits) for x in xs]


def _style(fig: go.Figure, *, top: int, **kw) -> go.Figure:
    """The house style with a top margin of ``top`` pixels: room for a two-line title and a
    legend above the plot."""
    style(fig, title="", **kw)
    fig.update_layout(margin=dict(t=top))
    return fig


def _finish(fig: go.Figure, steps: list[Step], prefix: str, active: int) -> go.Figure:
    """A slider over ``steps`` opening on ``steps[active]`` (a default past the end means the
    last step); with a single step, just that step's view and no slider."""
    if isinstance(active, int) and active >= len(steps):
        active = len(steps) - 1
    add_slider(fig, steps, prefix=prefix, active=active)
    if len(steps) == 1:
        fig.layout.sliders = ()
        fig.update_layout(margin=dict(b=60))
    return fig


def _values(xs, name: str) -> list:
    xs = list(xs)
    if not xs:
        raise ValueError(f"{name} must not be empty")
    return xs


def _log_alpha_label(la: float) -> str:
    return "no gate (α = 1)" if la == 0 else f"log α = {la:g} per token (α = {math.exp(la):.4g})"


# ---------------------------------------------------------------------------- why forget
def forgetting_by_age(d: int = 16, lengths: Sequence[int] = (16, 32, 64, 128, 256),
                      log_alpha: float = -0.05, beta: float = 1.0, trials: int = 64,
                      seed: int = 0, active: int = 2) -> go.Figure:
    """Write ``n`` random pairs into a ``d x d`` state, read each back: error by age, slider over ``n``.

    Four write rules: linear attention (additive) and DeltaNet, each without and with a constant
    gate ``log_alpha`` (see :func:`gpt2k3.experiments.forgetting.recall_by_age`).
    """
    lengths = _values(lengths, "lengths")
    rules = [("additive", 0.0, "linear attention", _ORANGE, "solid"),
             ("additive", log_alpha, "linear attention + gate", _ORANGE, "dash"),
             ("delta", 0.0, "DeltaNet", _BLUE, "solid"),
             ("delta", log_alpha, "Gated DeltaNet", _BLUE, "dash")]
    fig = go.Figure()
    for _, _, name, color, dash in rules:
        fig.add_trace(go.Scatter(name=name, mode="lines", line=dict(color=color, dash=dash),
                                 hovertemplate=f"{name}<br>written %{{x}} tokens before the end: "
                                               "error %{y:.3g}<extra></extra>"))
    _style(fig, top=150, x_title="age of the pair (pairs written after it)",
           y_title="read error |k S − v| / |v|", height=500)
    fig.add_hline(y=1, line=dict(color=_GREY, dash="dot"), annotation_text="empty read (error 1)",
                  annotation_position="top left")
    steps = []
    for n in lengths:
        profiles = [fg.recall_by_age(d, n, rule=rule, beta=beta, log_alpha=la, trials=trials,
                                     seed=seed) for rule, la, *_ in rules]
        steps.append(Step(
            label=str(n),
            data={"x": [p.age for p in profiles], "y": [_r(p.error) for p in profiles]},
            layout={"title.text": (f"{n} random pairs written into a {d}×{d} state (β = {beta:g}); "
                                   f"gate: {_log_alpha_label(log_alpha)}<br>"
                                   f"mean error over all pairs: linear attention "
                                   f"{sum(profiles[0].error) / n:.2f}, DeltaNet "
                                   f"{sum(profiles[2].error) / n:.2f}")}))
    return _finish(fig, steps, "pairs written: ", active)


# ---------------------------------------------------------------------------- half-life
def _log_grid(n: int, points: int = 90) -> list[int]:
    """Distinct integers 1..n spaced evenly on a log axis."""
    return sorted({max(1, min(n, round(math.exp(i * math.log(n) / (points - 1)))))
                   for i in range(points)})


def memory_half_life(log_alphas: Sequence[float] = (0.0, -0.003, -0.01, -0.03, -0.1, -0.3),
                     d: int = 16, beta: float = 0.5, n_tokens: int = 512, trials: int = 48,
                     seed: int = 0, active: int = 2) -> go.Figure:
    """How long one association survives a constant gate, with and without writes after it.

    For each ``log_alpha`` (the slider): the fraction of the value read back after ``t`` more
    tokens when nothing else is written (the gate alone: ``alpha^t``), and when every token
    writes a random pair with strength ``beta`` (measured, and its exact expectation
    ``(alpha (1 - beta/d))^t``); a vertical line marks the gate's half-life ``ln 2 / -log alpha``.
    """
    log_alphas = _values(log_alphas, "log_alphas")
    n_tokens = check_int(n_tokens, "n_tokens", 2)
    grid = _log_grid(n_tokens)
    fig = go.Figure()
    traces = [("nothing written after it (the gate alone)", _GREEN, "solid"),
              ("a random write every token (measured)", _BLUE, "solid"),
              ("a random write every token (expected)", _BLUE, "dot")]
    for name, color, dash in traces:
        fig.add_trace(go.Scatter(name=name, mode="lines", line=dict(color=color, dash=dash),
                                 hovertemplate=f"{name}<br>after %{{x}} tokens: "
                                               "%{y:.3g} of the value comes back<extra></extra>"))
    fig.add_trace(go.Scatter(name="half-life of the gate", mode="lines",
                             line=dict(color=_PINK, dash="dash"),
                             hovertemplate="half-life of the gate: %{x:.3g} tokens<extra></extra>"))
    _style(fig, top=150, x_title="tokens since the association was written (log scale)",
           y_title="fraction of the value recalled", height=500)
    fig.update_xaxes(type="log")
    fig.update_yaxes(range=[-0.05, 1.08])
    fig.add_hline(y=0.5, line=dict(color=_GREY, dash="dot"))
    steps = []
    writes_half = math.log(2) / -math.log1p(-beta / d) if beta > 0 else math.inf
    for la in log_alphas:
        idle = fg.fact_recall(d, n_tokens, log_alpha=la, beta=beta, distractors=False, trials=1,
                              seed=seed)
        busy = fg.fact_recall(d, n_tokens, log_alpha=la, beta=beta, distractors=True,
                              trials=trials, seed=seed)
        expected = fg.expected_signal(grid, d, log_alpha=la, beta=beta)
        h = fg.half_life(la)
        both = math.log(2) / (-la - math.log1p(-beta / d)) if beta > 0 or la < 0 else math.inf
        if math.isinf(h):
            writes = (f"the writes alone halve it every {writes_half:.3g} tokens"
                      if math.isfinite(writes_half) else "and nothing else erases it")
            title = (f"{_log_alpha_label(la)}: with no writes the association never fades;<br>"
                     f"{writes} (d = {d}, β = {beta:g})")
        else:
            title = (f"{_log_alpha_label(la)}: the gate alone halves it every {h:.3g} tokens;<br>"
                     f"with a random write every token (d = {d}, β = {beta:g}): every "
                     f"{both:.3g} tokens")
        line_x = [h, h] if 1 <= h <= n_tokens else [None, None]
        steps.append(Step(
            label=f"{la:g}",
            data={"x": [grid, grid, grid, line_x],
                  "y": [_r(idle.signal[t] for t in grid), _r(busy.signal[t] for t in grid),
                        _r(expected), [0, 1]]},
            layout={"title.text": title}))
    return _finish(fig, steps, "log α per token: ", active)


# ---------------------------------------------------------------------------- channel-wise
def channel_decay(d: int = 16, keeps: Sequence[int] = (2, 4, 8, 12, 14),
                  log_alpha_fast: float = -0.1, n_tokens: int = 128, active: int = 2) -> go.Figure:
    """Scalar vs channel-wise decay: KDA keeps some key channels and forgets the others.

    Slider: how many of the ``d`` channels keep (``alpha = 1``); the others decay by
    ``log_alpha_fast`` per token. Gated DeltaNet gets one scalar gate with the same mean log
    decay. Left: the per-token decay of every channel. Right: two facts, one stored under a key
    in the keeping channels and one under a key in the forgetting channels, read back while no
    further writes happen (so only the gates act).
    """
    keeps = _values(keeps, "keeps")
    for keep in keeps:
        if not is_int(keep) or not 1 <= keep <= d - 1:
            raise ValueError(f"each entry of keeps must be an int in [1, d - 1 = {d - 1}] (both "
                             f"kinds of channel must exist), got {keep!r}")
    check_finite_number(log_alpha_fast, "log_alpha_fast", -1, allow_zero=True)
    if log_alpha_fast == 0:
        raise ValueError("log_alpha_fast must be < 0 (the forgetting channels must forget)")
    fig = make_subplots(rows=1, cols=2, column_widths=[0.38, 0.62], horizontal_spacing=0.12)
    fig.add_trace(go.Bar(name="KDA: α per channel", marker_color=_BLUE,
                         hovertemplate="KDA, channel %{x}: α = %{y:.4g} per token<extra></extra>"),
                  1, 1)
    fig.add_trace(go.Scatter(name="Gated DeltaNet: one α", mode="lines",
                             line=dict(color=_ORANGE, width=3),
                             hovertemplate="Gated DeltaNet: α = %{y:.4g} for every channel"
                                           "<extra></extra>"), 1, 1)
    for name, color, dash in (("KDA: fact in keeping channels", _BLUE, "solid"),
                              ("KDA: fact in forgetting channels", _BLUE, "dash"),
                              ("Gated DeltaNet: either fact", _ORANGE, "solid")):
        fig.add_trace(go.Scatter(name=name, mode="lines", line=dict(color=color, dash=dash),
                                 hovertemplate=f"{name}<br>after %{{x}} tokens: %{{y:.3g}} "
                                               "recalled<extra></extra>"), 1, 2)
    _style(fig, top=150, x_title="key channel (row of the state)",
           y_title="decay per token α", height=520)
    fig.update_yaxes(range=[0, 1.05], row=1, col=1)
    fig.update_xaxes(title_text="tokens since the fact was written", row=1, col=2)
    fig.update_yaxes(title_text="fraction of the value recalled", range=[-0.05, 1.05], row=1, col=2)
    steps = []
    for keep in keeps:
        keep_ch, fast_ch = fg.split_channels(d, keep)
        per_channel = [0.0] * keep + [log_alpha_fast] * (d - keep)
        scalar = sum(per_channel) / d
        curves = [fg.fact_recall(d, n_tokens, log_alpha=per_channel, distractors=False,
                                 fact_channels=keep_ch, trials=1),
                  fg.fact_recall(d, n_tokens, log_alpha=per_channel, distractors=False,
                                 fact_channels=fast_ch, trials=1),
                  fg.fact_recall(d, n_tokens, log_alpha=scalar, distractors=False, trials=1)]
        alphas = [math.exp(la) for la in per_channel]
        steps.append(Step(
            label=str(keep),
            data={"x": [list(range(d)), [-0.5, d - 0.5]] + [c.elapsed for c in curves],
                  "y": [_r(alphas), _r([math.exp(scalar)] * 2)] + [_r(c.signal) for c in curves]},
            layout={"title.text": (f"{keep} of {d} channels keep (α = 1), {d - keep} forget "
                                   f"(α = {math.exp(log_alpha_fast):.3g});<br>Gated DeltaNet with "
                                   f"the same mean log decay: α = {math.exp(scalar):.3g}, "
                                   f"half-life {fg.half_life(scalar):.3g} tokens for every fact")}))
    return _finish(fig, steps, "keeping channels: ", active)


# ---------------------------------------------------------------------------- distractors
def distractor_retrieval(log_alphas: Sequence[float] = (-0.01, -0.03, -0.1, -0.3, -1.0),
                         d: int = 16, keep: int = 8, beta: float = 0.5, n_tokens: int = 96,
                         distractors_in: str = "all", trials: int = 96, seed: int = 0,
                         active: int = 2) -> go.Figure:
    """One fact, then a stream of random distractor writes: DeltaNet vs Gated DeltaNet vs KDA.

    The fact's key lies in the first ``keep`` channels (where a trained KDA head would put what
    it wants to keep); distractor keys are random over all ``d`` channels
    (``distractors_in="all"``) or only over the forgetting ones (``"forgetting"``: what a head
    that routes short-lived content away from its long-lived memory would do), written with
    strength ``beta``. The three mixers see the same stream and differ only in the gate:
    DeltaNet none; KDA ``alpha = 1`` on the ``keep`` channels and ``log_alpha`` (the slider) on
    the others; Gated DeltaNet one scalar with the same mean log decay as KDA's.
    Left: fraction of the fact recalled; right: read error (above 1: junk).
    """
    log_alphas = _values(log_alphas, "log_alphas")
    keep_ch, fast_ch = fg.split_channels(d, keep)
    if not 1 <= keep <= d - 1:
        raise ValueError(f"keep must be in [1, d - 1 = {d - 1}], got {keep}")
    if distractors_in not in ("all", "forgetting"):
        raise ValueError(f"distractors_in must be 'all' or 'forgetting', got {distractors_in!r}")
    dist_ch = None if distractors_in == "all" else fast_ch
    where = "all channels" if distractors_in == "all" else "the forgetting channels only"
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1)
    mixers = [("Gated DeltaNet", _ORANGE, "solid"), ("KDA", _BLUE, "solid"),
              ("DeltaNet", "#000000", "dot")]  # DeltaNet last and dotted: KDA often covers it
    for col, what in ((1, "recalled"), (2, "error")):
        for name, color, dash in mixers:
            fig.add_trace(go.Scatter(name=name, mode="lines", line=dict(color=color, dash=dash),
                                     legendgroup=name, showlegend=col == 1,
                                     hovertemplate=f"{name}<br>after %{{x}} distractors: "
                                                   f"{what} %{{y:.3g}}<extra></extra>"), 1, col)
    _style(fig, top=140, x_title="distractors written after the fact",
           y_title="fraction of the fact recalled", height=500)
    fig.update_yaxes(range=[-0.05, 1.05], row=1, col=1)
    fig.update_xaxes(title_text="distractors written after the fact", row=1, col=2)
    fig.update_yaxes(title_text="read error |k S − v| / |v|", row=1, col=2)
    fig.add_hline(y=1, line=dict(color=_GREY, dash="dot"), row=1, col=2)
    steps = []
    for la in log_alphas:
        per_channel = [0.0] * keep + [la] * (d - keep)
        scalar = sum(per_channel) / d
        kw = dict(beta=beta, distractors=True, fact_channels=keep_ch, distractor_channels=dist_ch,
                  trials=trials, seed=seed)
        curves = [fg.fact_recall(d, n_tokens, log_alpha=g, **kw) for g in (scalar, per_channel, 0.0)]
        x = curves[0].elapsed
        end = {name: c.error[-1] for (name, *_), c in zip(mixers, curves)}
        steps.append(Step(
            label=f"{la:g}",
            data={"x": [x] * 6,
                  "y": [_r(c.signal) for c in curves] + [_r(c.error) for c in curves]},
            layout={"title.text": (f"KDA: {keep} channels keep, {d - keep} decay by log α = {la:g} "
                                   f"per token; Gated DeltaNet: log α = {scalar:.3g} everywhere<br>"
                                   f"distractor keys in {where}; error after {n_tokens} "
                                   f"distractors: DeltaNet "
                                   f"{end['DeltaNet']:.2f}, Gated DeltaNet {end['Gated DeltaNet']:.2f}, "
                                   f"KDA {end['KDA']:.2f}")}))
    return _finish(fig, steps, "log α of the forgetting channels: ", active)


# ---------------------------------------------------------------------------- the hybrid
def _byte_ticks(lo: float, hi: float) -> dict:
    """Log-axis ticks at powers of ten bytes between ``lo`` and ``hi``, labelled in decimal
    units (kB, MB, GB: the units every chapter states memory in)."""
    vals = [10 ** p for p in range(0, 19) if lo <= 10 ** p <= hi]
    return dict(tickvals=vals, ticktext=[fmt_decimal_bytes(v) for v in vals])


def hybrid_cache(spec: ArchSpec = KIMI_LINEAR_48B,
                 ratios: Sequence[int | None] = (0, 1, 2, 3, 5, 7, None),
                 context_len: int = 1 << 20, contexts: Sequence[int] | None = None,
                 cache_dtype_bytes: float = 2, state_dtype_bytes: float = STATE_DTYPE_BYTES,
                 active: int = 3) -> go.Figure:
    """Which layers keep a growing cache, and the bytes at long context, for a ratio slider
    (:func:`gpt2k3.accounting.hybrid_cache_bytes`; ``None`` in ``ratios``: all KDA).

    Left: every layer's memory for one sequence at ``context_len`` tokens (log scale) --
    attention layers hold a KV cache that grows with the context, KDA layers a fixed state.
    Right: total memory against context length, with all-attention for comparison.
    """
    ratios = _values(ratios, "ratios")
    if contexts is None:
        contexts = [1 << p for p in range(10, int(math.log2(context_len)) + 1)]
        if contexts[-1] != context_len:
            contexts.append(context_len)
    contexts = _values(contexts, "contexts")
    fig = make_subplots(rows=1, cols=2, column_widths=[0.52, 0.48], horizontal_spacing=0.17)
    fig.add_trace(go.Bar(name="attention layer: KV cache (grows)", marker_color=_ORANGE,
                         textposition="none", hovertemplate="layer %{x}: attention, %{text} at "
                                       f"{context_len:,} tokens<extra></extra>"), 1, 1)
    fig.add_trace(go.Bar(name="KDA layer: state (fixed)", marker_color=_BLUE,
                         textposition="none", hovertemplate="layer %{x}: KDA, a %{text} state at any length"
                                       "<extra></extra>"), 1, 1)
    base = [hybrid_cache_bytes(spec, 0, n, cache_dtype_bytes, state_dtype_bytes)["total"]
            for n in contexts]
    fig.add_trace(go.Scatter(name="all attention", mode="lines", line=dict(color=_GREY, dash="dash"),
                             x=contexts, y=base, text=[fmt_decimal_bytes(b) for b in base],
                             hovertemplate="all attention, %{x:,} tokens: %{text}<extra></extra>"),
                  1, 2)
    fig.add_trace(go.Scatter(name="this schedule", mode="lines+markers", line=dict(color=_GREEN),
                             hovertemplate="this schedule, %{x:,} tokens: %{text}<extra></extra>"),
                  1, 2)
    _style(fig, top=140, x_title="layer", y_title="memory per layer (log scale)", height=540)
    fig.update_layout(barmode="overlay")
    full = hybrid_cache_bytes(spec, 0, context_len, cache_dtype_bytes, state_dtype_bytes)["total"]
    smallest = min(min(v for v in hybrid_cache_bytes(spec, r, context_len, cache_dtype_bytes,
                                                     state_dtype_bytes)["per_layer"])
                   for r in ratios)
    lo = math.log10(smallest) - 1
    fig.update_yaxes(type="log", range=[lo, math.log10(full / spec.n_layer) + 0.3],
                     **_byte_ticks(10 ** lo, full), row=1, col=1)
    fig.update_xaxes(title_text="context length (tokens, log scale)", type="log", row=1, col=2)
    fig.update_yaxes(title_text="KV cache + states (log scale)", type="log",
                     **_byte_ticks(min(base + [smallest]) / 10, full * 10), row=1, col=2)
    steps = []
    for ratio in ratios:
        b = hybrid_cache_bytes(spec, ratio, context_len, cache_dtype_bytes, state_dtype_bytes)
        attn = [(i + 1, v) for i, (k, v) in enumerate(zip(b["kinds"], b["per_layer"])) if k != "kda"]
        kda = [(i + 1, v) for i, (k, v) in enumerate(zip(b["kinds"], b["per_layer"])) if k == "kda"]
        totals = [hybrid_cache_bytes(spec, ratio, n, cache_dtype_bytes, state_dtype_bytes)["total"]
                  for n in contexts]
        n_attn = len(attn)
        title = (f"{spec.name}, {ratio_label(ratio)}: {n_attn} of {spec.n_layer} layers keep a "
                 f"growing cache<br>at {context_len:,} tokens: {fmt_decimal_bytes(b['total'])} per sequence "
                 f"vs {fmt_decimal_bytes(full)} with attention everywhere "
                 f"({full / b['total']:.3g}× less)")
        steps.append(Step(
            label=ratio_label(ratio),
            data={"x": [[i for i, _ in attn], [i for i, _ in kda], contexts],
                  "y": [[v for _, v in attn], [v for _, v in kda], totals],
                  "text": [[fmt_decimal_bytes(v) for _, v in attn], [fmt_decimal_bytes(v) for _, v in kda],
                           [fmt_decimal_bytes(t) for t in totals]]},
            layout={"title.text": title},
            traces=[0, 1, 3]))
    return _finish(fig, steps, "KDA : attention = ", active)
