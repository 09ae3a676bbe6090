"""Chapter 2 (the KV cache): cache growth, what a decode step reads, the cache-bound
crossover, and the measured decode speed against its roofline.

Every byte comes from :mod:`gpt2k3.accounting`: a decode step's bytes are
:func:`gpt2k3.accounting.weight_and_cache_bytes` (the one model of
:func:`gpt2k3.accounting.decode_bytes`, so a batch of a mixture-of-experts model wakes more
experts), the crossover :func:`gpt2k3.accounting.cache_bound_context`, and where the
cache-growth figure's cache line crosses the weights
:func:`gpt2k3.accounting.decode.weights_cache_crossing`; the measured figures read
``benchmarks/results/decode_*.json``.  This module lays them out.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import plotly.graph_objects as go

from gpt2k3 import archs
from gpt2k3.accounting import (
    STATE_DTYPE_BYTES,
    ArchSpec,
    cache_bound_context,
    count_params,
    dtype_bytes,
    kv_cache_bytes,
    state_bytes,
    weight_and_cache_bytes,
)
from gpt2k3.accounting.decode import weights_cache_crossing
from gpt2k3.book.display import fmt_bytes
from gpt2k3.book.figures._style import PALETTE, Step, add_slider, style
from gpt2k3.checks import check_positive_int, is_int

__all__ = ["registered_specs", "weight_and_cache_bytes", "cache_growth", "decode_step_bytes",
           "cache_bound_crossover", "decode_speed", "decode_roofline", "concat_vs_preallocated",
           "log_grid", "kv_cache_schematic"]


def registered_specs() -> list[ArchSpec]:
    """Every :class:`ArchSpec` published in :mod:`gpt2k3.archs`, in the order listed there."""
    seen, out = set(), []
    for name in archs.__all__:
        spec = getattr(archs, name)
        if isinstance(spec, ArchSpec) and spec.name not in seen:
            seen.add(spec.name)
            out.append(spec)
    return out


def log_grid(lo: int, hi: int, per_decade: int = 4) -> list[int]:
    """Distinct integers from ``lo`` to ``hi`` spaced evenly on a log axis (ends included)."""
    if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
        raise ValueError(f"need integers 1 <= lo <= hi, got lo={lo!r}, hi={hi!r}")
    n = max(2, int(round(math.log10(hi / lo) * per_decade)) + 1) if hi > lo else 1
    pts = sorted({round(lo * (hi / lo) ** (i / max(n - 1, 1))) for i in range(n)} | {lo, hi})
    return pts


def cache_growth(specs: Sequence[ArchSpec] | None = None, batches: Sequence[int] = (1, 8, 64),
                 dtype: str = "bf16", max_context: int = 1 << 20, active: int = 0) -> go.Figure:
    """KV-cache bytes (plus any fixed linear-attention state, float32) against context length
    (1 to ``max_context``) for a few batch sizes, next to the bytes of the model's weights; a
    slider over models.  Each title gives the exact context at which the batch-1 line crosses
    the weights (:func:`gpt2k3.accounting.decode.weights_cache_crossing`, to the nearest
    token), not a point of the plotted grid."""
    specs = list(specs) if specs is not None else registered_specs()
    if not specs:
        raise ValueError("specs must hold at least one ArchSpec")
    nbytes = dtype_bytes("dtype", dtype)
    if not batches or any(not is_int(b) or b < 1 for b in batches):
        raise ValueError(f"batches must be positive ints, got {batches!r}")
    ctx = log_grid(1, max_context)
    fig = go.Figure()
    for i, b in enumerate(batches):
        fig.add_trace(go.Scatter(name=f"KV cache, batch {b}", mode="lines", line_color=PALETTE[i % 6],
                                 hovertemplate="context %{x:,}: %{text}<extra>batch " + str(b) + "</extra>"))
    fig.add_trace(go.Scatter(name="weights", mode="lines", line=dict(color="#555", dash="dash"),
                             hovertemplate="weights: %{text}<extra></extra>"))
    fig.update_yaxes(exponentformat="SI", ticksuffix="B")  # 100 GB, not "100B"
    style(fig, title="", x_title="context length (tokens, log scale)", y_title="bytes (log scale)",
          height=480)
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    steps = []
    for spec in specs:
        ys, texts = [], []
        for b in batches:
            fixed = state_bytes(spec, b, STATE_DTYPE_BYTES)
            y = [kv_cache_bytes(spec, n, b, nbytes) + fixed for n in ctx]
            ys.append(y)
            texts.append([fmt_bytes(v) for v in y])
        total_w = count_params(spec).total * nbytes
        ys.append([total_w] * len(ctx))
        texts.append([fmt_bytes(total_w)] * len(ctx))
        cross = weights_cache_crossing(spec, 1, nbytes, nbytes)
        where = (f"batch-1 cache outweighs the weights beyond {cross:,.0f} tokens"
                 if cross <= ctx[-1] else
                 "batch-1 cache stays below the weights up to this context")
        steps.append(Step(label=spec.name, data={"x": [ctx] * len(ys), "y": ys, "text": texts},
                          layout={"title.text": f"{spec.name}, {dtype} cache:<br>{where}"}))
    return add_slider(fig, steps, prefix="model: ", active=active)


def decode_step_bytes(specs: Sequence[ArchSpec] | None = None,
                      contexts: Sequence[int] = (1, 256, 4096, 32768, 131072, 1 << 20),
                      batch: int = 1, weight_dtype: str = "bf16", cache_dtype: str = "bf16",
                      active: int = 0) -> go.Figure:
    """What one decode step of ``batch`` sequences reads, per model: the weights (read once for
    the batch, with the experts the batch wakes up) against every sequence's KV cache and
    state (:func:`gpt2k3.accounting.weight_and_cache_bytes`), log scale; a slider over context
    length.  With a single context there is no slider."""
    specs = list(specs) if specs is not None else registered_specs()
    contexts = list(contexts)
    if not specs or not contexts:
        raise ValueError("specs and contexts must not be empty")
    wb = dtype_bytes("weight_dtype", weight_dtype)
    cb = dtype_bytes("cache_dtype", cache_dtype)
    check_positive_int(batch, "batch")
    names = [s.name for s in specs]
    fig = go.Figure([
        go.Bar(name="weights read", x=names, marker_color=PALETTE[0],
               hovertemplate="%{x}: weights %{text}<extra></extra>"),
        go.Bar(name="KV cache (and state) read", x=names, marker_color=PALETTE[1],
               hovertemplate="%{x}: KV cache and state %{text}<extra></extra>"),
    ])
    style(fig, title="", x_title="", y_title="bytes read per decode step (log scale)", height=520)
    fig.update_yaxes(exponentformat="SI", ticksuffix="B")  # 100 GB, not "100B"
    fig.update_yaxes(type="log")
    fig.update_layout(barmode="group")
    steps = []
    for n in contexts:
        pairs = [weight_and_cache_bytes(s, n, batch, wb, cb) for s in specs]
        w, c = [p[0] for p in pairs], [p[1] for p in pairs]
        bound = [s.name for s, (a, b) in zip(specs, pairs) if b > a]
        title = (f"Context {n:,}, batch {batch}: cache-bound —<br>" + ", ".join(bound)) if bound else \
            f"Context {n:,}, batch {batch}:<br>every model reads more weights than cache"
        steps.append(Step(label=f"{n:,}", data={"y": [w, c], "text": [[fmt_bytes(v) for v in w],
                                                                        [fmt_bytes(v) for v in c]]},
                          layout={"title.text": title}))
    if len(steps) == 1:
        for i, (y, t) in enumerate(zip(steps[0].data["y"], steps[0].data["text"])):
            fig.data[i].y, fig.data[i].text = y, t
        fig.update_layout(steps[0].layout)
        return fig
    return add_slider(fig, steps, prefix="context length: ", active=active, pad_top=90)


def cache_bound_crossover(specs: Sequence[ArchSpec] | None = None,
                          batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
                          weight_dtype: str = "bf16", cache_dtypes: Sequence[str] = ("fp32", "bf16", "fp8"),
                          active: int = 1) -> go.Figure:
    """The context length at which a decode step reads as many cache (and state) bytes as
    weight bytes, against batch size, per model (:func:`gpt2k3.accounting.cache_bound_context`:
    a dense model's line falls as ``1/B``, a mixture of experts' more slowly, because a larger
    batch wakes more experts); a slider over the cache's number format."""
    specs = list(specs) if specs is not None else registered_specs()
    if not specs:
        raise ValueError("specs must hold at least one ArchSpec")
    wb = dtype_bytes("weight_dtype", weight_dtype)
    cbs = [dtype_bytes("cache_dtypes", d) for d in cache_dtypes]
    batches = list(batches)
    if not batches or any(not is_int(b) or b < 1 for b in batches):
        raise ValueError(f"batches must be positive ints, got {batches!r}")
    fig = go.Figure([go.Scatter(name=s.name, mode="lines+markers", line_color=PALETTE[i % len(PALETTE)],
                                hovertemplate="batch %{x}: cache-bound beyond %{y:,.0f} tokens"
                                              "<extra>" + s.name + "</extra>")
                     for i, s in enumerate(specs)])
    style(fig, title="", x_title="batch size (sequences decoded together, log scale)",
          y_title="crossover context length (tokens, log scale)", height=480)
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    steps = []
    for d, cb in zip(cache_dtypes, cbs):
        ys = []
        for s in specs:
            n = [cache_bound_context(s, b, wb, cb) for b in batches]
            ys.append([v if math.isfinite(v) and v > 0 else None for v in n])
        steps.append(Step(label=d, data={"x": [batches] * len(specs), "y": ys},
                          layout={"title.text": f"Weights in {weight_dtype}, KV cache in {d}:<br>"
                                                f"above its line, a model's decode step is cache-bound"}))
    return add_slider(fig, steps, prefix="cache format: ", active=min(active, len(steps) - 1))


def decode_speed(result: Mapping) -> go.Figure:
    """Measured tokens/s of the decoders (from ``benchmarks/results/decode_*.json``): the four
    of the chapter and, where the run has it, the fast decoder; against the bandwidth estimate
    (bytes per step over a plain sum's read bandwidth: a yardstick, not a ceiling)."""
    tps = dict(result["tokens_per_s"])
    if "fast_decoder" in result:
        tps["fast decoder"] = result["fast_decoder"]["tokens_per_s"]
    names = list(tps)
    fig = go.Figure(go.Bar(x=names, y=[tps[n] for n in names], marker_color=PALETTE[0],
                           text=[f"{tps[n]:.1f}" for n in names], textposition="outside",
                           hovertemplate="%{x}: %{y:.2f} tokens/s<extra></extra>", name="measured"))
    bound = result["bandwidth_bound_tokens_per_s"]
    fig.add_hline(y=bound, line_dash="dash", line_color=PALETTE[5],
                  annotation_text=f"bandwidth estimate {bound:.1f} tokens/s", annotation_position="top left")
    m = result["machine"]
    style(fig, title=f"GPT-2 small, batch 1, {result['config']['dtype']}, {m['torch_threads']} threads "
                     f"on {m.get('gpu', m['cpu'])}", x_title="decoder", y_title="tokens per second")
    fig.update_yaxes(range=[0, 1.2 * max(bound, max(tps.values()))])
    return fig


def decode_roofline(results: Mapping[str, Mapping]) -> go.Figure:
    """Measured time of one decode step against context, next to bytes moved / bandwidth,
    for each device with results (keys are device labels)."""
    if not results:
        raise ValueError("results must hold at least one device's benchmark")
    fig = go.Figure()
    for i, (label, r) in enumerate(results.items()):
        rows = r["step_vs_context"]
        x = [row["context"] for row in rows]
        fig.add_trace(go.Scatter(x=x, y=[1e3 * row["seconds"] for row in rows], mode="markers",
                                 marker=dict(size=9, color=PALETTE[2 * i]), name=f"measured, {label}",
                                 hovertemplate="N=%{x:,}: %{y:.2f} ms<extra>measured</extra>"))
        fig.add_trace(go.Scatter(x=x, y=[1e3 * row["roofline_seconds"] for row in rows], mode="lines",
                                 line=dict(color=PALETTE[2 * i], dash="dot"),
                                 name=f"roofline, {label} "
                                      f"({r['read_bandwidth_bytes_per_s'] / 1e9:.0f} GB/s)",
                                 hovertemplate="N=%{x:,}: %{y:.2f} ms<extra>bytes / bandwidth</extra>"))
    style(fig, title="One decode step of a GPT-2-small-shaped model against a filled KV cache",
          x_title="cached context N (tokens, log scale)", y_title="time per decode step (ms, log scale)")
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return fig


def concat_vs_preallocated(result: Mapping) -> go.Figure:
    """The long-context sweep of ``benchmarks/decode.py --concat-sweep`` (a
    ``decode_concat_*.json`` result): measured time of one decode step with the concatenating
    and the preallocated cache against the cached context (markers; the hover gives the
    ratio measured side by side), beside what each step's bytes -- weights and cache traffic,
    :func:`gpt2k3.accounting.decode.decode_cache_traffic` -- take at the measured read
    bandwidth (dotted)."""
    rows = result.get("rows") if isinstance(result, Mapping) else None
    if not rows:
        raise ValueError("result must be a decode_concat_*.json result with at least one row")
    kinds = ("preallocated cache", "concatenating cache")
    x = [row["context"] for row in rows]
    fig = go.Figure()
    for i, kind in enumerate(kinds):
        color = PALETTE[0] if i == 0 else PALETTE[5]
        fig.add_trace(go.Scatter(
            x=x, y=[1e3 * row["seconds_per_step"][kind] for row in rows], mode="lines+markers",
            marker=dict(size=9, color=color), line=dict(color=color), name=f"{kind}, measured",
            customdata=[[row["ratio"], row["traffic_ratio"]] for row in rows],
            hovertemplate=("N=%{x:,}: %{y:.1f} ms per step; concatenating / preallocated "
                           "%{customdata[0]:.1f}x measured, %{customdata[1]:.2f}x in cache bytes"
                           "<extra>" + kind + "</extra>")))
        fig.add_trace(go.Scatter(
            x=x, y=[1e3 * row["roofline_seconds"][kind] for row in rows], mode="lines",
            line=dict(color=color, dash="dot"), name=f"{kind}, bytes / bandwidth",
            hovertemplate="N=%{x:,}: %{y:.2f} ms<extra>bytes / bandwidth</extra>"))
    m, model = result["machine"], result["model"]
    style(fig, title=(f"{model['n_layer']} layers × {model['n_embd']} wide, vocabulary "
                      f"{model['vocab_size']}, {result['config']['dtype']}, "
                      f"{m['torch_threads']} thread(s) on {m.get('gpu', m['cpu'])}"),
          x_title="cached context N (tokens, log scale)",
          y_title="time per decode step (ms, log scale)")
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return fig


def kv_cache_schematic(max_len: int = 10, prompt_len: int = 4, n_steps: int = 4,
                       active: int = 0) -> go.Figure:
    """The KV cache's write and read, as a picture: one layer's K and V buffers of ``max_len``
    slots (orange: written this step; grey: cached, never copied; white: empty; triangles: the
    slots this step's queries read); a slider walks through the prefill (``prompt_len`` tokens written at once) and
    ``n_steps`` one-token decode steps. Each step writes its new keys and values at
    ``length .. length + t - 1`` (orange) and its queries read every filled slot (the row below);
    nothing cached is copied (grey)."""
    for name, value in (("max_len", max_len), ("prompt_len", prompt_len), ("n_steps", n_steps)):
        check_positive_int(value, name)
    if prompt_len + n_steps > max_len:
        raise ValueError(f"prompt_len + n_steps must be at most max_len={max_len}, got "
                         f"{prompt_len + n_steps}")
    EMPTY, CACHED, NEW, READ = "#f2f2f2", "#9aa7b8", PALETTE[1], PALETTE[0]
    pos = list(range(max_len))
    fig = go.Figure()
    for row in ("K", "V"):
        fig.add_trace(go.Scatter(x=pos, y=[row] * max_len, mode="markers+text", text=[str(i) for i in pos],
                                 marker=dict(symbol="square", size=22, line=dict(color="#666", width=1)),
                                 textfont=dict(size=10), hoverinfo="skip", showlegend=False))
    fig.add_trace(go.Scatter(x=[], y=[], mode="markers", name="read by this step's queries",
                             marker=dict(symbol="triangle-up", size=16, color=READ),
                             hoverinfo="skip", showlegend=False))
    style(fig, title="", x_title="", y_title="", height=340)
    fig.update_yaxes(categoryorder="array", categoryarray=["read", "V", "K"], showgrid=False,
                     showline=False)
    fig.update_xaxes(range=[-0.7, max_len - 0.3], showgrid=False, dtick=1, showticklabels=False)
    fig.update_layout(showlegend=False, margin=dict(t=110))  # the caption names the colours
    steps = []
    for i in range(n_steps + 1):
        start, t = (0, prompt_len) if i == 0 else (prompt_len + i - 1, 1)
        colors = [CACHED if j < start else NEW if j < start + t else EMPTY for j in pos]
        read = list(range(start + t))
        what = (f"prefill: {t} tokens write slots 0–{t - 1},<br>each reads the slots up to its own"
                if i == 0 else f"decode step {i}: 1 token writes slot {start},<br>"
                f"its query reads slots 0–{start}")
        steps.append(Step(label="prefill" if i == 0 else str(i),
                          data={"marker.color": [colors, colors, READ],
                                "x": [pos, pos, read], "y": [["K"] * max_len, ["V"] * max_len,
                                                           ["read"] * len(read)]},
                          traces=[0, 1, 2],
                          layout={"title.text": f"{what}<br>length {start} → {start + t}"}))
    return add_slider(fig, steps, prefix="step: ", active=active)
