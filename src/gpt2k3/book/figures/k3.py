"""Chapter 9 (Kimi K3 accounting): memory, bytes, FLOPs and time per token of the published
Kimi K3 (``gpt2k3.archs.KIMI_K3``, 2.78T parameters), how many H200s it needs, Kimi Linear's
published claims checked against the roofline, and the road from GPT-2 in one table.

Every number comes from :mod:`gpt2k3.accounting`; this module arranges them.  The data
helpers (:func:`hybrid_speedups`, :func:`claims_rows`, :func:`what_changed_rows`,
:func:`summary_rows`) return plain values the notebook tabulates and the tests check; the
figure builders put one slider on each (ratio, context, batch, weight format, cache format)
so that every slider works in the static book.  Every builder defaults to ``KIMI_K3``; the
weight formats are :data:`gpt2k3.accounting.serving.WEIGHT_FORMATS`' (``"mxfp4"``: the
released checkpoint's MXFP4 routed experts, bf16 elsewhere).
"""

from __future__ import annotations

import math
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gpt2k3 import accounting
from gpt2k3.accounting import (
    H200,
    ArchSpec,
    Hardware,
    count_params,
    decode_bytes,
    decode_bytes_per_token,
    devices_needed,
    dtype_bytes,
    full_attention,
    hybrid_spec,
    memory_per_sequence,
    ratio_label,
    roofline,
    serving_memory,
)
from gpt2k3.accounting.serving import weight_format
from gpt2k3.archs import KIMI_K3, KIMI_LINEAR_48B, KIMI_LINEAR_CLAIMS
from gpt2k3.book.display import fmt_decimal_bytes
from gpt2k3.book.figures._style import PALETTE, Step, add_slider, style
from gpt2k3.book.figures.k3_tables import (
    BATCHES,
    CACHE_DTYPES,
    CONTEXTS,
    RATIOS,
    STATE_BYTES,
    UNIFORM_WEIGHT_DTYPES,
    WEIGHT_DTYPES,
    dtype_choice,
    hybrid_speedups,
    round4,
    summary_rows,
    weight_choice,
)
from gpt2k3.book.figures.mla_moe import PARAM_SPECS, param_components
from gpt2k3.checks import is_int

# full_attention is gpt2k3.accounting's, listed here because the chapter's figures are built on it.
__all__ = ["full_attention", "k3_params", "k3_hybrid", "k3_batching", "k3_roofline", "k3_devices", "kimi_linear_check", "k3_dashboard"]


_HYBRID, _FULL, _GREY = PALETTE[0], PALETTE[5], "#666666"


def _positive_ints(name: str, xs) -> list[int]:
    xs = list(xs)
    if not xs or any(not is_int(x) or x < 1 for x in xs):
        raise ValueError(f"{name} must be a non-empty sequence of positive ints, got {xs!r}")
    return xs


def _finish(fig: go.Figure, steps: list[Step], prefix: str, active: int,
            pad_top: int = 55) -> go.Figure:
    """The slider, and a two-line title centred 40 px below the figure's top edge (anchored
    at its top, plotly pushes the first line of a multi-line title out of the figure)."""
    add_slider(fig, steps, prefix=prefix, active=active, pad_top=pad_top)
    fig.update_layout(title=dict(yanchor="middle", y=1 - 40 / fig.layout.height))
    return fig


# ---------------------------------------------------------------------------- figures
def k3_params(specs: Sequence[ArchSpec] = (*PARAM_SPECS, KIMI_K3),
              active: int = -1) -> go.Figure:
    """Total against active parameters from GPT-2 to Kimi K3: chapter 7's
    :func:`gpt2k3.book.figures.param_components` with Kimi K3 added, opening on the last model
    (``active=-1``), its two-line title kept inside the figure."""
    specs = list(specs)
    if not specs:
        raise ValueError("specs must hold at least one ArchSpec")
    fig = param_components(specs, active=active % len(specs))
    fig.update_layout(title=dict(yanchor="middle", y=1 - 40 / fig.layout.height, pad_t=0))
    return fig


def k3_hybrid(spec: ArchSpec = KIMI_K3, ratios: Sequence[int | None] = RATIOS,
              cache_dtype: str = "bf16", active: int = 3) -> go.Figure:
    """Kimi K3 under other layer schedules, a slider over the KDA : attention ratio (0:1 to
    15:1, and all KDA; 3:1 is K3's own).  Left: memory one sequence keeps against context; right: bytes a decode step
    reads per token at batch 1 -- each for this schedule and for attention everywhere."""
    ratios = list(ratios)
    if not ratios:
        raise ValueError("ratios must not be empty")
    cb = dtype_choice("cache_dtype", cache_dtype, CACHE_DTYPES)
    ctx = list(CONTEXTS)
    full = full_attention(spec)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.17)
    for col, what in ((1, "memory per sequence"), (2, "bytes read per token")):
        fig.add_trace(go.Scatter(name="this schedule", legendgroup="h", showlegend=col == 1,
                                 mode="lines+markers", line_color=_HYBRID, marker_size=5,
                                 hovertemplate="%{x:,} tokens: %{text}<extra>" + what
                                               + "</extra>"), 1, col)
        y = ([memory_per_sequence(full, n, cb, STATE_BYTES) / 1e9 for n in ctx] if col == 1 else
             [decode_bytes_per_token(full, n, 1, 2, cb, STATE_BYTES) / 1e9 for n in ctx])
        fig.add_trace(go.Scatter(name="attention in every layer", legendgroup="f",
                                 showlegend=col == 1, mode="lines",
                                 line=dict(color=_FULL, dash="dash"), x=ctx, y=[round4(v) for v in y],
                                 text=[fmt_decimal_bytes(v * 1e9) for v in y],
                                 hovertemplate="%{x:,} tokens: %{text}<extra>all attention, "
                                               + what + "</extra>"), 1, col)
    style(fig, title="", x_title="context length (tokens, log scale)",
          y_title="KV cache + state, one sequence (GB, log)", height=520)
    fig.update_xaxes(type="log", title_text="context length (tokens, log scale)")
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text="read per token, batch 1 (GB, log)", row=1, col=2)
    fig.update_layout(margin=dict(t=150), legend=dict(y=1.04))
    steps = []
    base = memory_per_sequence(full, ctx[-1], cb, STATE_BYTES)
    for ratio in ratios:
        s = hybrid_spec(spec, ratio)
        c = count_params(s)
        mem = [memory_per_sequence(s, n, cb, STATE_BYTES) for n in ctx]
        read = [decode_bytes_per_token(s, n, 1, 2, cb, STATE_BYTES) for n in ctx]
        steps.append(Step(
            label=ratio_label(ratio).replace("all attention", "0:1"), traces=[0, 2],
            data={"x": [ctx, ctx], "y": [[round4(v / 1e9) for v in mem], [round4(v / 1e9) for v in read]],
                  "text": [[fmt_decimal_bytes(v) for v in mem], [fmt_decimal_bytes(v) for v in read]]},
            layout={"title.text": (
                f"{spec.name}, {ratio_label(ratio)}: {s.n_attention_layers} attention + "
                f"{s.n_kda_layers} KDA layers; {c.total / 1e12:.4g}T parameters, "
                f"{c.active / 1e9:.3g}B active<br>at {ctx[-1]:,} tokens a sequence keeps "
                f"{fmt_decimal_bytes(mem[-1])}, {100 * (1 - mem[-1] / base):.1f}% less than all attention")}))
    return _finish(fig, steps, "KDA : attention = ", active)


def k3_batching(spec: ArchSpec = KIMI_K3, contexts: Sequence[int] = CONTEXTS,
                batches: Sequence[int] = BATCHES, weight_dtype: str = "bf16",
                cache_dtype: str = "bf16", hardware: Hardware = H200,
                active: int = 7) -> go.Figure:
    """Bytes read per output token against batch size, a slider over context length: the
    weights (shared by the batch, but more experts wake up as it grows) and each sequence's
    cache and state, for ``spec`` and, as a total, its all-attention variant.  Hover for the
    roofline time on one device."""
    contexts = _positive_ints("contexts", contexts)
    batches = _positive_ints("batches", batches)
    wb = dtype_choice("weight_dtype", weight_dtype, UNIFORM_WEIGHT_DTYPES)
    cb = dtype_choice("cache_dtype", cache_dtype, CACHE_DTYPES)
    full = full_attention(spec)
    names = ("weights, per token", "KV cache + state, per token", "total")
    fig = go.Figure()
    for name, color, dash in zip(names, (PALETTE[2], PALETTE[1], _HYBRID), ("dot", "dot", None)):
        fig.add_trace(go.Scatter(name=f"{spec.name}: {name}", mode="lines+markers",
                                 line=dict(color=color, dash=dash), marker_size=5,
                                 hovertemplate="batch %{x}: %{text}<extra>" + name + "</extra>"))
    fig.add_trace(go.Scatter(name="attention in every layer: total", mode="lines",
                             line=dict(color=_FULL, dash="dash"),
                             hovertemplate="batch %{x}: %{text}<extra>all attention</extra>"))
    style(fig, title="", x_title="batch (sequences decoded together, log scale)",
          y_title="bytes read per output token (GB, log scale)", height=520)
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    fig.update_layout(margin=dict(t=150), legend=dict(y=1.04))

    def ms(total_bytes):
        return f"{fmt_decimal_bytes(total_bytes)} = {1e3 * total_bytes / hardware.bandwidth:.3g} ms of one " \
               f"{hardware.name}'s bandwidth"

    steps = []
    for n in contexts:
        step = [decode_bytes(spec, n, b, wb, cb, STATE_BYTES) for b in batches]
        w = [d.weights_per_token for d in step]
        per_seq = step[0].per_sequence
        tot = [d.per_token for d in step]
        tot_f = [decode_bytes_per_token(full, n, b, wb, cb, STATE_BYTES) for b in batches]
        ys = [w, [per_seq] * len(batches), tot, tot_f]
        cross = next((b for b, v in zip(batches, w) if v < per_seq), None)
        where = (f"cache outweighs weights from batch {cross}" if cross else
                 f"weights outweigh cache up to batch {batches[-1]}")
        steps.append(Step(
            label=f"{n // 1024}K" if n < 1 << 20 else f"{n >> 20}M",
            data={"x": [batches] * 4, "y": [[round4(v / 1e9) for v in y] for y in ys],
                  "text": [[ms(v) for v in y] for y in ys]},
            layout={"title.text": (
                f"{spec.name} at {n:,} tokens ({weight_dtype}, {cache_dtype} cache): {where}"
                f"<br>per token: {fmt_decimal_bytes(tot[0])} at batch 1, {fmt_decimal_bytes(tot[-1])} at batch "
                f"{batches[-1]}; all attention: {fmt_decimal_bytes(tot_f[0])} and {fmt_decimal_bytes(tot_f[-1])}")}))
    return _finish(fig, steps, "context length: ", min(active, len(steps) - 1))


def k3_roofline(spec: ArchSpec = KIMI_K3, batches: Sequence[int] = (1, 8, 64, 256, 1024),
                contexts: Sequence[int] = CONTEXTS, weight_dtype: str = "bf16",
                cache_dtype: str = "bf16", hardware: Hardware = H200,
                active: int = 0) -> go.Figure:
    """The roofline per output token against context, a slider over the batch: time to move
    the bytes and time to do the FLOPs on one device, for ``spec`` and its all-attention
    variant.  The larger of each pair is the prediction; ``n`` devices in perfect parallel
    divide both by ``n``."""
    batches = _positive_ints("batches", batches)
    contexts = _positive_ints("contexts", contexts)
    wb, eb = weight_choice("weight_dtype", weight_dtype, WEIGHT_DTYPES)
    cb = dtype_choice("cache_dtype", cache_dtype, CACHE_DTYPES)
    full = full_attention(spec)
    fig = go.Figure()
    for who, color in ((spec.name, _HYBRID), ("attention in every layer", _FULL)):
        for what, dash in (("bytes / bandwidth", None), ("FLOPs / peak", "dot")):
            fig.add_trace(go.Scatter(name=f"{who}: {what}", mode="lines+markers",
                                     line=dict(color=color, dash=dash), marker_size=5,
                                     hovertemplate="%{x:,} tokens: %{y:.3g} ms<extra>" + who
                                                   + ", " + what + "</extra>"))
    style(fig, title="", x_title="context length (tokens, log scale)",
          y_title=f"step time / batch on one {hardware.name} (ms per output token, log scale)", height=540)
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    fig.update_layout(margin=dict(t=170), legend=dict(y=1.04))
    steps = []
    for b in batches:
        ys, bounds = [], []
        for s in (spec, full):
            roofs = [roofline(s, n, b, hardware, 1, wb, cb, STATE_BYTES, True, eb)
                     for n in contexts]
            ys += [[round4(1e3 * r.memory_s / b) for r in roofs],
                   [round4(1e3 * r.compute_s / b) for r in roofs]]
            bounds.append(roofs[-1])
        h, f = bounds
        slow = roofline(spec, contexts[-1], b, accounting.H200_MEASURED, 1, wb, cb, STATE_BYTES,
                        True, eb)
        steps.append(Step(
            label=str(b), data={"x": [contexts] * 4, "y": ys},
            layout={"title.text": (
                f"{spec.name}, batch {b}, on one {hardware.name} "
                f"({hardware.bandwidth / 1e12:.1f} TB/s, {hardware.peak_flops / 1e12:.0f} "
                f"TFLOP/s)<br>at {contexts[-1]:,} tokens: {1e3 * h.per_token_s:.3g} ms per "
                f"token ({h.bound}-bound; {1e3 * slow.per_token_s:.3g} ms at the measured "
                f"{accounting.H200_MEASURED.bandwidth / 1e12:.2f} TB/s); all attention "
                f"{1e3 * f.per_token_s:.3g} ms ({f.per_token_s / h.per_token_s:.2f}×)")}))
    return _finish(fig, steps, "batch: ", min(active, len(steps) - 1))


def k3_devices(spec: ArchSpec = KIMI_K3, weight_dtypes: Sequence[str] = WEIGHT_DTYPES,
               batches: Sequence[int] = (1, 8, 64, 256), contexts: Sequence[int] = CONTEXTS,
               cache_dtype: str = "bf16", hardware: Hardware = H200,
               active: int = 0) -> go.Figure:
    """How many devices hold the weights and every sequence's cache and state (pooled memory,
    :func:`gpt2k3.accounting.devices_needed`), against context, for a few batch sizes; solid
    for ``spec``, dashed for attention in every layer.  A slider over the weight format."""
    dtypes = list(weight_dtypes)
    if not dtypes:
        raise ValueError("weight_dtypes must not be empty")
    for d in dtypes:
        weight_choice("weight_dtypes", d, WEIGHT_DTYPES)
    batches = _positive_ints("batches", batches)
    contexts = _positive_ints("contexts", contexts)
    cb = dtype_choice("cache_dtype", cache_dtype, CACHE_DTYPES)
    full = full_attention(spec)
    fig = go.Figure()
    for who, s, dash in ((spec.name, spec, None), ("attention in every layer", full, "dash")):
        for i, b in enumerate(batches):
            fig.add_trace(go.Scatter(
                name=f"{who}, batch {b}", mode="lines", line=dict(color=PALETTE[i], dash=dash),
                legendgroup=who, hovertemplate="%{x:,} tokens: %{y:,} " + hardware.name
                                                + "s<extra>" + f"{who}, batch {b}</extra>"))
    fig.add_trace(go.Scatter(name="weights alone", mode="lines", line=dict(color=_GREY, width=1),
                             x=[contexts[0], contexts[-1]],
                             hovertemplate="weights alone: %{y:,}<extra></extra>"))
    style(fig, title="", x_title="context length (tokens, log scale)",
          y_title=f"{hardware.name}s needed ({hardware.memory_bytes / 1e9:.0f} GB each, log)",
          height=560)
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    fig.update_layout(margin=dict(t=190), legend=dict(y=1.04))
    steps = []
    for d in dtypes:
        wb, eb = weight_format(d)
        ys = [[devices_needed(s, n, b, hardware, wb, cb, STATE_BYTES, eb) for n in contexts]
              for s in (spec, full) for b in batches]
        alone = devices_needed(spec, 0, 0, hardware, wb, cb, STATE_BYTES, eb)
        weights = serving_memory(spec, 0, 0, wb, expert_bytes=eb)["weights"]
        i64 = batches.index(64) if 64 in batches else len(batches) - 1
        steps.append(Step(
            label=d, data={"x": [contexts] * (2 * len(batches)) + [[contexts[0], contexts[-1]]],
                           "y": ys + [[alone, alone]]},
            layout={"title.text": (
                f"{spec.name}, weights in {d}: {fmt_decimal_bytes(weights)}, {alone} {hardware.name}s "
                f"before any cache<br>batch {batches[i64]} at {contexts[-1]:,} tokens: "
                f"{ys[i64][-1]} (machines of {hardware.per_machine}: "
                f"{math.ceil(ys[i64][-1] / hardware.per_machine)}); attention everywhere: "
                f"{ys[len(batches) + i64][-1]}")}))
    return _finish(fig, steps, "weight format: ", min(active, len(steps) - 1))


def kimi_linear_check(spec: ArchSpec = KIMI_LINEAR_48B, cache_dtypes: Sequence[str] = CACHE_DTYPES,
                      contexts: Sequence[int] = tuple(1 << p for p in range(12, 21)),
                      n_devices: Sequence[int] = (1, 8), hardware: Hardware = H200,
                      active: int = 0) -> go.Figure:
    """Kimi Linear's published decoding speedups against the roofline's, over context, with a
    slider over the KV-cache format, under both readings of time per output token.  Step time
    over batch (throughput): each model at its memory-limited batch on one and on eight
    devices, and its ceiling (the all-MLA model at batch 1 against the hybrid with its
    weights free).  Per request (TPOT, the step time): both models at the batch the all-MLA
    one holds, on each device count, and its ceiling, the ratio of the bytes each sequence
    reads.  Batch 1 is the same under both.  The published points are drawn at 1M tokens.
    Traces: batch 1, the memory-limited lines, the throughput ceiling, the equal-batch lines,
    the per-request ceiling, then the two published markers."""
    dtypes = list(cache_dtypes)
    if not dtypes:
        raise ValueError("cache_dtypes must not be empty")
    for d in dtypes:
        dtype_choice("cache_dtypes", d, CACHE_DTYPES)
    contexts = _positive_ints("contexts", contexts)
    n_devices = _positive_ints("n_devices", n_devices)
    claims = KIMI_LINEAR_CLAIMS
    short = hardware.name.replace("NVIDIA ", "")
    fig = go.Figure()
    fig.add_trace(go.Scatter(name="roofline, batch 1", mode="lines+markers", line_color=_HYBRID,
                             hovertemplate="%{x:,} tokens: %{y:.2f}×<extra>batch 1</extra>"))
    for i, n in enumerate(n_devices):
        where = f"{n} {short}" + ("s" if n > 1 else "")
        fig.add_trace(go.Scatter(
            name=f"roofline, memory-limited, {where}", mode="lines+markers",
            line_color=PALETTE[2 + i], hovertemplate="%{x:,} tokens: %{y:.2f}× (%{text})<extra>"
                                                     + where + "</extra>"))
    fig.add_trace(go.Scatter(name="ceiling (weights free)", mode="lines",
                             line=dict(color=_GREY, dash="dash"),
                             hovertemplate="%{x:,} tokens: at most %{y:.2f}×<extra></extra>"))
    for i, n in enumerate(n_devices):
        where = f"{n} {short}" + ("s" if n > 1 else "")
        fig.add_trace(go.Scatter(
            name=f"per-request TPOT, equal batch, {where}", mode="lines+markers",
            line=dict(color=PALETTE[2 + i], dash="dot"), marker_symbol="square",
            hovertemplate="%{x:,} tokens: %{y:.2f}× (%{text})<extra>per request, "
                          + where + "</extra>"))
    fig.add_trace(go.Scatter(name="per-request ceiling (bytes per sequence)", mode="lines",
                             line=dict(color=_GREY, dash="dot"),
                             hovertemplate="%{x:,} tokens: at most %{y:.2f}× per request"
                                           "<extra></extra>"))
    lo, hi = claims["batch1_speedup"]
    ctx = claims["context"]
    fig.add_trace(go.Scatter(
        name=f"published {claims['tpot_speedup']}×", mode="markers",
        x=[ctx], y=[claims["tpot_speedup"]], marker=dict(symbol="star", size=16, color=_FULL),
        hovertemplate=(f"published at 1M: {claims['tpot_ms']['MLA']} ms vs "
                       f"{claims['tpot_ms']['Kimi Linear']} ms per token, "
                       f"{claims['tpot_speedup']}×<extra></extra>")))
    fig.add_trace(go.Scatter(
        name=f"published {lo}–{hi}×, batch 1", mode="markers", x=[ctx],
        y=[(lo + hi) / 2], marker=dict(symbol="diamond", size=12, color=PALETTE[3]),
        error_y=dict(type="data", array=[(hi - lo) / 2], visible=True),
        hovertemplate=f"published at batch 1: about {lo}–{hi}×<extra></extra>"))
    style(fig, title="", x_title="context length (tokens, log scale)",
          y_title="speedup per output token over full MLA (×)", height=540)
    fig.update_xaxes(type="log")
    fig.update_yaxes(range=[0, 8])
    fig.update_layout(margin=dict(t=170), legend=dict(y=1.04))
    steps = []
    for d in dtypes:
        cb = dtype_bytes("cache_dtypes", d)
        runs = {n: [hybrid_speedups(spec, c, hardware, n, cache_bytes=cb) for c in contexts]
                for n in n_devices}
        first = runs[n_devices[0]]
        ys = [[round4(r["batch1"]) for r in first]]
        texts = [[""] * len(contexts)]
        for n in n_devices:
            ys.append([round4(r["memory_limited"]) if r["memory_limited"] else None for r in runs[n]])
            texts.append([f"batches {r['batch']['hybrid']} vs {r['batch']['full']}"
                          for r in runs[n]])
        ys.append([round4(r["ceiling"]) for r in first])
        texts.append([""] * len(contexts))
        for n in n_devices:
            ys.append([round4(r["per_request"]) if r["per_request"] else None for r in runs[n]])
            texts.append([f"both at batch {r['equal_batch']}" for r in runs[n]])
        ys.append([round4(r["per_request_ceiling"]) for r in first])
        texts.append([""] * len(contexts))
        at = first[-1]
        last = runs[n_devices[-1]][-1]

        def x(v):
            return f"{v:.2f}×" if v else "no batch"

        k = 2 * len(n_devices) + 3
        steps.append(Step(
            label=d, traces=list(range(k)),
            data={"x": [contexts] * k, "y": ys, "text": texts},
            layout={"title.text": (
                f"{spec.name} vs full MLA, {d} cache, {contexts[-1]:,} tokens: "
                f"roofline {at['batch1']:.2f}× at batch 1; step/batch {x(at['memory_limited'])} "
                f"({x(last['memory_limited'])} on {n_devices[-1]}),<br>at most "
                f"{at['ceiling']:.2f}×; per request {x(last['per_request'])} on "
                f"{n_devices[-1]}, at most {at['per_request_ceiling']:.2f}×; published "
                f"{claims['tpot_speedup']}×")}))
    return _finish(fig, steps, "KV-cache format: ", min(active, len(steps) - 1))


def k3_dashboard(spec: ArchSpec = KIMI_K3, context_len: int = 1 << 20, batch: int = 1,
                 weight_dtype: str = "bf16", cache_dtype: str = "bf16", tp: int = 8,
                 hardware: Hardware = H200) -> go.Figure:
    """One figure with everything :func:`summary_rows` accounts for ``spec`` (a table), and
    the roofline per output token against batch at ``context_len`` for ``spec`` and its
    all-attention variant, the chosen batch marked.  The live explorer's view."""
    rows = summary_rows(spec, context_len, batch, weight_dtype, cache_dtype, tp, hardware)
    wb, eb = weight_choice("weight_dtype", weight_dtype, WEIGHT_DTYPES)
    cb = dtype_choice("cache_dtype", cache_dtype, CACHE_DTYPES)
    fig = make_subplots(rows=2, cols=1, row_heights=[0.45, 0.55], vertical_spacing=0.06,
                        specs=[[{"type": "table"}], [{"type": "xy"}]])
    fig.add_trace(go.Table(
        columnwidth=[0.42, 0.58],
        header=dict(values=["quantity", "value"], align="left", fill_color="#e8eef5"),
        cells=dict(values=[[r[0] for r in rows], [r[1] for r in rows]], align="left",
                   height=24)), 1, 1)
    batches = sorted({*BATCHES, batch})
    variants = [(spec.name, spec, _HYBRID)]
    if spec.kda_layers:
        variants.append(("attention in every layer", full_attention(spec), _FULL))
    for who, s, color in variants:
        y = [1e3 * roofline(s, context_len, b, hardware, 1, wb, cb, STATE_BYTES, True,
                            eb).per_token_s
             for b in batches]
        fig.add_trace(go.Scatter(x=batches, y=y, name=who, mode="lines", line_color=color,
                                 hovertemplate="batch %{x}: %{y:.3g} ms<extra>" + who
                                               + "</extra>"), 2, 1)
    mark = 1e3 * roofline(spec, context_len, batch, hardware, 1, wb, cb, STATE_BYTES, True,
                          eb).per_token_s
    fig.add_trace(go.Scatter(x=[batch], y=[mark], mode="markers", name=f"batch {batch}",
                             marker=dict(size=12, color=_HYBRID, symbol="circle-open"),
                             hovertemplate="batch %{x}: %{y:.3g} ms<extra></extra>"), 2, 1)
    style(fig, title=(f"{spec.name} at {context_len:,} tokens, batch {batch}, {weight_dtype} "
                      f"weights, {cache_dtype} cache"),
          x_title="batch (log scale)",
          y_title=f"{hardware.name}-ms per output token (log)", height=940)
    fig.update_xaxes(type="log", row=2, col=1)
    fig.update_yaxes(type="log", row=2, col=1)
    fig.update_layout(margin=dict(t=70),
                      legend=dict(y=fig.layout.yaxis.domain[1] + 0.005, yanchor="bottom"))
    return fig
