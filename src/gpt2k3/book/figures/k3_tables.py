"""Chapter 9's tables: the published claims checked, what changed from GPT-2, the summary and
the serving plans, as rows the notebook prints.
"""

from __future__ import annotations

from typing import Sequence

from gpt2k3 import accounting
from gpt2k3.accounting import (
    H200,
    ArchSpec,
    Hardware,
    count_params,
    decode_bytes_per_token,
    devices_needed,
    kv_cache_bytes,
    memory_per_sequence,
    plan_roofline,
    roofline,
    roofline_band,
    serving_memory,
    serving_plan,
)
from gpt2k3.accounting.serving import WEIGHT_FORMATS, weight_format
from gpt2k3.accounting.units import STATE_DTYPE_BYTES, dtype_bytes
from gpt2k3.archs import KIMI_K3, KIMI_LINEAR_48B, KIMI_LINEAR_CLAIMS, gpt2_to_k3_steps
from gpt2k3.book.display import fmt_count, fmt_decimal_bytes, sig

__all__ = ["training_table", "CONTEXTS", "BATCHES", "RATIOS", "WEIGHT_DTYPES", "UNIFORM_WEIGHT_DTYPES", "CACHE_DTYPES", "STATE_BYTES",
           "round4", "dtype_choice", "weight_choice", "hybrid_speedups", "claims_rows", "what_changed_rows", "summary_rows", "plan_rows", "what_changed_table"]


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



def round4(x: float, digits: int = 4) -> float:
    """Round to ``digits`` significant digits (stable stored figures; plenty for a plot)."""
    return sig(x, digits)



def dtype_choice(name: str, value: str, allowed: Sequence[str]) -> float:
    return dtype_bytes(name, value, allowed)



def weight_choice(name: str, value: str, allowed: Sequence[str]) -> tuple[float, float | None]:
    """``(weight_bytes, expert_bytes)`` of a weight format, ``ValueError`` naming ``name``."""
    try:
        return weight_format(value, allowed)
    except ValueError:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}") from None


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
            if verdict == "roofline lower":  # the published 6.3x is not at equal batches
                verdict = "not like for like (the report credits larger batches); roofline lower even so"
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
                     seq if exact else round4(seq), read if exact else round4(read)])
        before = c.total
    return rows



def summary_rows(spec: ArchSpec = KIMI_K3, context_len: int = 1 << 20, batch: int = 1,
                 weight_dtype: str = "bf16", cache_dtype: str = "bf16", tp: int = 8,
                 hardware: Hardware = H200) -> list[list[str]]:
    """Everything the chapter accounts for ``spec``, as ``[quantity, value]`` rows: parameters,
    weight bytes, cache and state, bytes and FLOPs per token, the roofline on one device and on
    the planned deployment (and on one device at the measured H200 bandwidth,
    :func:`gpt2k3.accounting.roofline_band`), and how many devices hold it."""
    wb, eb = weight_choice("weight_dtype", weight_dtype, WEIGHT_DTYPES)
    cb = dtype_choice("cache_dtype", cache_dtype, CACHE_DTYPES)
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
    cb = dtype_choice("cache_dtype", cache_dtype, CACHE_DTYPES)
    rows = []
    for dtype, n, b, tp in cases:
        wb, eb = weight_choice("weight dtype", dtype, WEIGHT_DTYPES)
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


def training_table(rows: Sequence[dict] | None = None) -> tuple[list[str], list[list[str]]]:
    """``(headers, rows)`` of the training-compute table: per published run, ``N`` (parameters a
    token is multiplied through), ``D`` as stated ("not stated" where the source gives none),
    ``C = 6ND`` ("—" without ``D``) and the source's own words, with the source.
    ``rows`` defaults to :func:`gpt2k3.accounting.training.training_compute`."""
    from gpt2k3.accounting.training import training_compute

    rows = training_compute() if rows is None else rows

    def count(n):
        return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"

    def flops(c):
        return "—" if c is None else f"{c:.2e}".replace("e+", "e")

    out = []
    for r in rows:
        words = (f"“{r['quote']}” " if r["quote"] else "") + (f"({r['note']}) " if r["note"] else "")
        out.append([r["model"], count(r["n_active"]),
                    "not stated" if r["tokens"] is None else f"{r['tokens'] / 1e12:g}T",
                    flops(r["flops"]), words + f"— {r['source']}"])
    return (["model", "N, parameters per token", "D, training tokens", "C = 6ND, FLOP",
             "the source's words"], out)
