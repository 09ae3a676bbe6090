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
    STATE_DTYPE_BYTES,
    ArchSpec,
    Hardware,
    count_params,
    decode_bytes,
    decode_bytes_per_token,
    devices_needed,
    dtype_bytes,
    full_attention,
    hybrid_spec,
    kv_cache_bytes,
    memory_per_sequence,
    plan_roofline,
    ratio_label,
    roofline,
    roofline_band,
    serving_memory,
    serving_plan,
)
from gpt2k3.accounting.serving import WEIGHT_FORMATS, weight_format
from gpt2k3.archs import KIMI_K3, KIMI_LINEAR_48B, KIMI_LINEAR_CLAIMS, gpt2_to_k3_steps
from gpt2k3.book.display import fmt_count, fmt_decimal_bytes, sig
from gpt2k3.book.figures._style import PALETTE, Step, add_slider, style
from gpt2k3.book.figures.mla_moe import PARAM_SPECS, param_components

# full_attention is gpt2k3.accounting's and fmt_count gpt2k3.book.display's, listed here because the
# chapter's tables are built on them.
__all__ = ["CONTEXTS", "BATCHES", "RATIOS", "WEIGHT_DTYPES", "UNIFORM_WEIGHT_DTYPES",
           "CACHE_DTYPES", "STATE_BYTES",
           "fmt_count", "full_attention", "hybrid_speedups", "claims_rows",
           "what_changed_rows", "what_changed_table", "summary_rows", "plan_rows", "k3_params",
           "k3_hybrid", "k3_batching", "k3_roofline", "k3_devices", "kimi_linear_check",
           "k3_dashboard"]

#: Context lengths of the figures: 1K to 1M tokens, doubling.
CONTEXTS = tuple(1 << p for p in range(10, 21))
#: Batch sizes of the figures: 1 to 1,024 sequences, doubling.
BATCHES = tuple(1 << p for p in range(0, 11))
#: KDA : attention ratios of the hybrid slider: 0:1 (all attention) to 15:1, and all KDA.
RATIOS = (*range(16), None)
#: Weight formats the sliders offer (:data:`gpt2k3.accounting.serving.WEIGHT_FORMATS`):
#: every weight in bf16 or fp8, or the released checkpoint's layout (``"mxfp4"``).
WEIGHT_DTYPES = ("bf16", "fp8", "mxfp4")
#: The formats that store every weight alike (what a bytes-per-token split into weights and
#: cache, :func:`k3_batching`, can take).
UNIFORM_WEIGHT_DTYPES = tuple(k for k in WEIGHT_DTYPES if WEIGHT_FORMATS[k][1] is None)
#: KV-cache formats (bytes per number in ``DTYPE_BYTES``).
CACHE_DTYPES = ("bf16", "fp8")
#: Bytes per number of a KDA state: float32, as the recurrent kernels keep it
#: (:data:`gpt2k3.accounting.STATE_DTYPE_BYTES`).
STATE_BYTES = STATE_DTYPE_BYTES

_HYBRID, _FULL, _GREY = PALETTE[0], PALETTE[5], "#666666"


def _r(x: float, digits: int = 4) -> float:
    """Round to ``digits`` significant digits (stable stored figures; plenty for a plot)."""
    return sig(x, digits)


def _dtype(name: str, value: str, allowed: Sequence[str]) -> float:
    return dtype_bytes(name, value, allowed)


def _weights(name: str, value: str, allowed: Sequence[str]) -> tuple[float, float | None]:
    """``(weight_bytes, expert_bytes)`` of a weight format, ``ValueError`` naming ``name``."""
    try:
        return weight_format(value, allowed)
    except ValueError:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}") from None


def _positive_ints(name: str, xs) -> list[int]:
    xs = list(xs)
    if not xs or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in xs):
        raise ValueError(f"{name} must be a non-empty sequence of positive ints, got {xs!r}")
    return xs


def _finish(fig: go.Figure, steps: list[Step], prefix: str, active: int,
            pad_top: int = 55) -> go.Figure:
    """The slider, and a two-line title centred 40 px below the figure's top edge (anchored
    at its top, plotly pushes the first line of a multi-line title out of the figure)."""
    add_slider(fig, steps, prefix=prefix, active=active, pad_top=pad_top)
    fig.update_layout(title=dict(yanchor="middle", y=1 - 40 / fig.layout.height))
    return fig


# ---------------------------------------------------------------------------- data
def hybrid_speedups(spec: ArchSpec = KIMI_LINEAR_48B, context_len: int = 1 << 20,
                    hardware: Hardware = H200, n_devices: int = 1, weight_bytes: float = 2,
                    cache_bytes: float = 2, state_dtype_bytes: float = STATE_BYTES,
                    expert_bytes: float | None = None) -> dict:
    """:func:`gpt2k3.accounting.hybrid_speedups`, with chapter 9's model (Kimi Linear 48B-A3B)
    and context (a million tokens) as defaults."""
    return accounting.hybrid_speedups(spec, context_len, hardware, n_devices, weight_bytes,
                                      cache_bytes, state_dtype_bytes, expert_bytes)


def _verdict(computed: float, lo: float, hi: float, tolerance: float = 0.0) -> str:
    if lo - tolerance <= computed <= hi + tolerance:
        return "agrees"
    return "roofline higher" if computed > hi else "roofline lower"


def claims_rows(spec: ArchSpec = KIMI_LINEAR_48B, context_len: int | None = None,
                hardware: Hardware = H200, n_devices: Sequence[int] = (1, 8),
                cache_bytes: float = 2) -> list[list[str]]:
    """Kimi Linear's published claims beside what the accounting computes for ``spec`` against
    its all-MLA variant: ``[claim, published, computed, verdict]`` rows.  Both readings of time per
    output token (:func:`gpt2k3.accounting.serving.tpot_readings`) are checked: per request (the
    step time) at a batch both models hold, against the published 6.3× TPOT; and per output
    token of the deployment (step time over batch, the inverse of throughput) at each model's
    own memory-limited batch, against the published "up to 6×" decoding throughput.  The verdict
    says whether the computed value falls in the published range (the KV-cache share within
    one percentage point), or on which side of it."""
    c = KIMI_LINEAR_CLAIMS
    context_len = c["context"] if context_len is None else context_len
    runs = {n: hybrid_speedups(spec, context_len, hardware, n, cache_bytes=cache_bytes)
            for n in n_devices}
    first = runs[n_devices[0]]
    lo, hi = c["batch1_speedup"]
    tpot = c["tpot_ms"]
    cut = c["kv_cache_reduction"]
    published = f"{c['tpot_speedup']}× ({tpot['MLA']} vs {tpot['Kimi Linear']} ms)"
    # the deployment's time per token is the inverse of throughput: its claim is "up to 6x"
    throughput = f"up to {c['throughput_speedup']:g}× (decoding throughput)"
    rows = [["KV cache cut by the hybrid", f"up to {100 * cut:.0f}%",
             f"{100 * first['kv_reduction']:.1f}% ({spec.n_attention_layers} of {spec.n_layer} "
             f"layers keep a cache; {100 * first['memory_reduction']:.1f}% with the KDA states)",
             _verdict(first["kv_reduction"], cut, cut, 0.01)],
            ["speedup at batch 1 (both readings)", f"about {lo}–{hi}×",
             f"{first['batch1']:.2f}×", _verdict(first["batch1"], lo, hi)]]
    for n, run in runs.items():
        where = f"{n} {hardware.name}" + ("s" if n > 1 else "")
        if run["per_request"]:
            computed = (f"{run['per_request']:.2f}× (both at batch {run['equal_batch']}; at most "
                        f"{run['per_request_ceiling']:.2f}× at any equal batch)")
            verdict = _verdict(run["per_request"], c["tpot_speedup"], c["tpot_speedup"], 0.05)
        else:
            computed, verdict = f"no batch fits on {where}", "—"
        rows.append([f"TPOT per request, equal batches, {where}", published, computed, verdict])
    for n, run in runs.items():
        where = f"{n} {hardware.name}" + ("s" if n > 1 else "")
        b = run["batch"]
        if run["memory_limited"]:
            computed = (f"{run['memory_limited']:.2f}× (batches {b['hybrid']} and {b['full']}; "
                        f"at most {run['ceiling']:.2f}× with the weights free)")
            verdict = _verdict(run["memory_limited"], c["throughput_speedup"],
                               c["throughput_speedup"], 0.05)
        else:
            computed, verdict = f"no batch fits on {where}", "—"
        rows.append([f"time per output token of the deployment (step / batch), memory-limited "
                     f"batches, {where}", throughput, computed, verdict])
    return rows


def what_changed_rows(context_len: int = 1 << 20, cache_bytes: float = 2,
                      weight_bytes: float = 2, exact: bool = False) -> list[list]:
    """One row per step of :func:`gpt2k3.archs.gpt2_to_k3_steps`: ``[change, what,
    total parameters, change in total (0 for the first), active parameters, KV numbers per
    token, memory of one sequence at context_len (GB), bytes read per token at batch 1
    (GB)]``.  The last two are rounded to four digits unless ``exact``."""
    rows, before = [], None
    for change, what, spec in gpt2_to_k3_steps():
        c = count_params(spec)
        kv_per_token = kv_cache_bytes(spec, 1, 1, 1)
        seq = memory_per_sequence(spec, context_len, cache_bytes, STATE_BYTES) / 1e9
        read = decode_bytes_per_token(spec, context_len, 1, weight_bytes, cache_bytes,
                                      STATE_BYTES) / 1e9
        delta = 0 if before is None else c.total - before
        rows.append([change, what, c.total, delta, c.active, kv_per_token,
                     seq if exact else _r(seq), read if exact else _r(read)])
        before = c.total
    return rows


def summary_rows(spec: ArchSpec = KIMI_K3, context_len: int = 1 << 20, batch: int = 1,
                 weight_dtype: str = "bf16", cache_dtype: str = "bf16", tp: int = 8,
                 hardware: Hardware = H200) -> list[list[str]]:
    """Everything the chapter accounts for ``spec``, as ``[quantity, value]`` rows: parameters,
    weight bytes, cache and state, bytes and FLOPs per token, the roofline on one device and on
    the planned deployment (and on one device at the measured H200 bandwidth,
    :func:`gpt2k3.accounting.roofline_band`), and how many devices hold it."""
    wb, eb = _weights("weight_dtype", weight_dtype, WEIGHT_DTYPES)
    cb = _dtype("cache_dtype", cache_dtype, CACHE_DTYPES)
    c = count_params(spec)
    mem = serving_memory(spec, context_len, batch, wb, cb, STATE_BYTES, eb)
    roof = roofline(spec, context_len, batch, hardware, 1, wb, cb, STATE_BYTES, True, eb)
    band = roofline_band(spec, context_len, batch, None, 1, wb, cb, STATE_BYTES, True, eb)
    pooled = devices_needed(spec, context_len, batch, hardware, wb, cb, STATE_BYTES, eb)
    plan = serving_plan(spec, context_len, batch, hardware, tp, wb, cb, STATE_BYTES,
                        expert_bytes=eb)
    rows = [
        ["parameters: total / active per token", f"{c.total:,} / {c.active:,}"],
        [f"weights ({weight_dtype})", fmt_decimal_bytes(mem["weights"])],
        [f"KV cache ({cache_dtype}) + KDA state (fp32), one sequence",
         f"{fmt_decimal_bytes(mem['cache'] / max(batch, 1))} + {fmt_decimal_bytes(mem['state'] / max(batch, 1))}"],
        [f"KV cache + state, batch {batch}", fmt_decimal_bytes(mem["cache"] + mem["state"])],
        ["bytes read per output token", fmt_decimal_bytes(roof.bytes_per_step / batch)],
        ["FLOPs per output token", f"{roof.flops_per_step / batch / 1e9:,.0f} GFLOP"],
        [f"{hardware.name}-time per output token (roofline)",
         f"{1e3 * roof.per_token_s:.3g} ms, {roof.bound}-bound "
         f"({roof.intensity:.0f} FLOP/byte; ridge {hardware.ridge:.0f})"],
        ["the same at the measured H200 bandwidth "
         f"({accounting.H200_MEASURED.bandwidth / 1e12:.2f} TB/s)",
         f"{1e3 * band['measured'].per_token_s:.3g} ms ({band['measured'].bound}-bound)"],
        [f"{hardware.name}s to hold it (pooled memory)", f"{pooled:,}"],
    ]
    if plan is None:
        rows.append([f"plan with tensor parallelism {tp}", "does not fit: one sequence's cache "
                     "outgrows a device"])
    else:
        step = plan_roofline(spec, plan, context_len, batch, hardware, wb, cb, STATE_BYTES,
                             True, eb)
        rows += [[f"plan: TP {tp} × DP {plan.dp}, EP {plan.ep}",
                  f"{plan.n_devices:,} {hardware.name}s in {plan.machines:,} machines, "
                  f"{plan.experts_per_device} experts per layer per device, "
                  f"{fmt_decimal_bytes(plan.per_device['total'])} on the fullest"],
                 ["step time on the plan (roofline of the busiest device)",
                  f"{1e3 * step.step_s:.3g} ms per step, {batch / step.step_s:,.0f} tokens/s, "
                  f"{step.bound}-bound"]]
    return rows


def _ctx_label(n: int) -> str:
    """``131072 -> '128K'``, ``1048576 -> '1M'``, ``1000 -> '1,000'``."""
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10}K"
    return f"{n:,}"


def plan_rows(spec: ArchSpec = KIMI_K3,
              cases: Sequence[tuple[str, int, int, int]] = (
                  ("bf16", 1 << 20, 1, 8), ("bf16", 1 << 20, 1, 1), ("bf16", 1 << 17, 64, 8),
                  ("bf16", 1 << 20, 64, 8), ("bf16", 1 << 20, 64, 1), ("fp8", 1 << 20, 64, 8),
                  ("mxfp4", 1 << 20, 64, 8), ("mxfp4", 1 << 20, 64, 1),
                  ("mxfp4", 1 << 17, 512, 8)),
              cache_dtype: str = "bf16", hardware: Hardware = H200) -> list[list]:
    """Serving plans on paper for ``(weight dtype, context, batch, tensor-parallel degree)``
    cases, one compact row each: ``[weights, context, batch, TP, "pooled / planned
    (machines)" devices, experts per layer per device, bytes on the fullest device,
    "step time (busiest device), tokens/s"]``.  A plan that cannot fit says so."""
    cb = _dtype("cache_dtype", cache_dtype, CACHE_DTYPES)
    rows = []
    for dtype, n, b, tp in cases:
        wb, eb = _weights("weight dtype", dtype, WEIGHT_DTYPES)
        pooled = devices_needed(spec, n, b, hardware, wb, cb, STATE_BYTES, eb)
        plan = serving_plan(spec, n, b, hardware, tp, wb, cb, STATE_BYTES, expert_bytes=eb)
        head = [dtype, _ctx_label(n), b, tp]
        if plan is None:
            rows.append(head + [f"{pooled} / does not fit", "—", "—", "—"])
            continue
        step = plan_roofline(spec, plan, n, b, hardware, wb, cb, STATE_BYTES, True, eb)
        rows.append(head + [f"{pooled} / {plan.n_devices} ({plan.machines})",
                            plan.experts_per_device, fmt_decimal_bytes(plan.per_device["total"]),
                            f"{1e3 * step.step_s:.3g} ms, {b / step.step_s:,.0f}"])
    return rows


def what_changed_table(context_len: int = 1 << 20, cache_bytes: float = 2,
                       weight_bytes: float = 2) -> list[list]:
    """:func:`what_changed_rows` in short form for a book-width table: ``[change, what,
    total, change in total, active, KV numbers per token, one sequence, read per token]``
    with counts like ``'47.5B'`` and bytes like ``'19.5 GB'`` (the first row's change empty,
    a step that changes no count ``'0'``)."""
    return [[change, what, fmt_count(total),
             "" if i == 0 else (fmt_count(delta, sign=True) if delta else "0"),
             fmt_count(active), kv, fmt_decimal_bytes(seq * 1e9), fmt_decimal_bytes(read * 1e9)]
            for i, (change, what, total, delta, active, kv, seq, read)
            in enumerate(what_changed_rows(context_len, cache_bytes, weight_bytes, exact=True))]


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
    cb = _dtype("cache_dtype", cache_dtype, CACHE_DTYPES)
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
                                 line=dict(color=_FULL, dash="dash"), x=ctx, y=[_r(v) for v in y],
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
            data={"x": [ctx, ctx], "y": [[_r(v / 1e9) for v in mem], [_r(v / 1e9) for v in read]],
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
    wb = _dtype("weight_dtype", weight_dtype, UNIFORM_WEIGHT_DTYPES)
    cb = _dtype("cache_dtype", cache_dtype, CACHE_DTYPES)
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
            data={"x": [batches] * 4, "y": [[_r(v / 1e9) for v in y] for y in ys],
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
    wb, eb = _weights("weight_dtype", weight_dtype, WEIGHT_DTYPES)
    cb = _dtype("cache_dtype", cache_dtype, CACHE_DTYPES)
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
            ys += [[_r(1e3 * r.memory_s / b) for r in roofs],
                   [_r(1e3 * r.compute_s / b) for r in roofs]]
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
        _weights("weight_dtypes", d, WEIGHT_DTYPES)
    batches = _positive_ints("batches", batches)
    contexts = _positive_ints("contexts", contexts)
    cb = _dtype("cache_dtype", cache_dtype, CACHE_DTYPES)
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
        _dtype("cache_dtypes", d, CACHE_DTYPES)
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
        ys = [[_r(r["batch1"]) for r in first]]
        texts = [[""] * len(contexts)]
        for n in n_devices:
            ys.append([_r(r["memory_limited"]) if r["memory_limited"] else None for r in runs[n]])
            texts.append([f"batches {r['batch']['hybrid']} vs {r['batch']['full']}"
                          for r in runs[n]])
        ys.append([_r(r["ceiling"]) for r in first])
        texts.append([""] * len(contexts))
        for n in n_devices:
            ys.append([_r(r["per_request"]) if r["per_request"] else None for r in runs[n]])
            texts.append([f"both at batch {r['equal_batch']}" for r in runs[n]])
        ys.append([_r(r["per_request_ceiling"]) for r in first])
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
    wb, eb = _weights("weight_dtype", weight_dtype, WEIGHT_DTYPES)
    cb = _dtype("cache_dtype", cache_dtype, CACHE_DTYPES)
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
