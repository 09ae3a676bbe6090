"""Chapter 11's longer run and GPT-2's plateau: figures and tables from the results files.

The builders read what ``benchmarks/text_lm.py`` writes; nothing is trained here.

* GPT-2's plateau (``benchmarks/results/text_lm_plateau.json``, preset ``plateau``):
  :func:`plateau_curves` (validation loss of GPT-2 as published and with one change each) and
  :func:`previous_byte_heads` (how much each layer's attention looks at the previous byte, by
  position, as training goes on);
* the longer run (``benchmarks/results/text_lm_tuned.json``, preset ``chapter``):
  :func:`design_table` (its models, their parameters and the learning rates tried, from the
  settings the run was started with), :func:`repeat_table` (the repeats of the held-out books
  the repeat test reads), and, once every run has finished, :func:`lr_sweep` (validation loss
  against the learning rate tried), :func:`repeat_summary` and :func:`repeat_gain` (the loss on
  the second copy of a repeat against the first, by distance);
* the compute multiplier (``benchmarks/results/compute_multiplier.json``, from
  ``benchmarks/compute_multiplier.py``): :func:`multiplier_facts`, :func:`multiplier_table` and
  :func:`multiplier_figure` (GPT-2's loss against its training compute, beside the tiny K3's at
  one budget). They build from a partial file too, and say which budgets and seeds it holds.
"""

from __future__ import annotations

import math
import statistics
from typing import Mapping

import plotly.graph_objects as go

from gpt2k3.book.figures._style import PALETTE, Step, add_slider, style
from gpt2k3.book.figures.text import COLORS, spread
from gpt2k3.experiments.text_lm import MIXER_LABELS

__all__ = ["PLATEAU_LABELS", "plateau_summary", "plateau_curves", "previous_byte_heads",
           "design_table", "repeat_table", "lr_sweep", "seed_table", "repeat_summary",
           "inside_bins", "repeat_findings", "repeat_gain",
           "color_of", "K3_SCALING_QUOTE", "K3_SCALING_GAIN", "multiplier_facts",
           "multiplier_table", "multiplier_figure", "seeds_text"]

#: What each variant of the plateau preset changes, for legends and tables.
PLATEAU_LABELS = {"published": "as published", "fan_in": "weights N(0, 1/fan_in)",
                  "untied": "untied head", "sinusoid": "sinusoidal start of the table",
                  "no_warmup": "no warm-up", "lr_1e-3": "learning rate 1e-3",
                  "lr_1e-2": "learning rate 1e-2", "published_1200": "as published, 1,200 steps",
                  "fan_in_1200": "weights N(0, 1/fan_in), 1,200 steps",
                  "untied_1200": "untied head, 1,200 steps",
                  "sinusoid_1200": "sinusoidal start, 1,200 steps",
                  "no_warmup_1200": "no warm-up, 1,200 steps",
                  "warmup_30_1200": "30 warm-up steps, 1,200 steps"}
_EXTRA_COLORS = {"transformer_pp": "#882255", "gpt2_fan_in": "#999933"}  # the palette has eight


def color_of(mixer: str) -> str | None:
    """The chapter's colour of ``mixer`` (:data:`gpt2k3.book.figures.text.COLORS`, and one more
    for Transformer++)."""
    return COLORS.get(mixer) or _EXTRA_COLORS.get(mixer)


def _label(data: Mapping, mixer: str) -> str:
    return data.get("config", {}).get("labels", {}).get(mixer, MIXER_LABELS.get(mixer, mixer))


# ------------------------------------------------------------------ GPT-2's plateau
def _check_plateau(data: Mapping) -> list[dict]:
    try:
        runs = list(data["runs"])
        data["config"]["attention_bins"], data["config"]["uniform"]
    except (KeyError, TypeError) as err:
        raise ValueError(f"data must be the results of benchmarks/text_lm.py --preset plateau "
                         f"(missing {err})") from None
    if not runs:
        raise ValueError("data holds no finished plateau run")
    return runs


def plateau_summary(data: Mapping) -> dict[str, dict]:
    """Per variant: ``val_bits`` (after its last step, on the evaluation windows), ``steps``
    and ``bits_at`` (validation bits by step, from its curve)."""
    runs = _check_plateau(data)
    return {r["variant"]: {"val_bits": r["val_bits"], "steps": r["steps"],
                           "bits_at": {p["step"]: p["bits"] for p in r["curve"]}} for r in runs}


def plateau_curves(data: Mapping, active: int = 0) -> go.Figure:
    """Validation bits per byte of GPT-2 (seed 0) against the bytes trained on, as published
    and with one change each; dotted: the byte bigram and trigram tables. The slider brings
    one variant to the front (``active`` 0: every one alike)."""
    runs = _check_plateau(data)
    if not 0 <= active <= len(runs):
        raise ValueError(f"active must be in [0, {len(runs)}], got {active}")
    model, train = data["config"]["model"], data["config"]["train"]
    per_step = train["batch_size"] * model["context"]
    fig = go.Figure()
    for i, r in enumerate(runs):
        label = PLATEAU_LABELS.get(r["variant"], r["variant"])
        fig.add_trace(go.Scatter(
            x=[p["step"] * per_step for p in r["curve"]], y=[p["bits"] for p in r["curve"]],
            mode="lines+markers", name=label, marker=dict(size=5),
            line=dict(color=PALETTE[i % len(PALETTE)], width=2,
                      dash="solid" if r["steps"] == runs[0]["steps"] else "dash"),
            hovertemplate=f"{label}: %{{y:.3f}} bits/byte after %{{x:,}} bytes<extra></extra>"))
    style(fig, title="", x_title="training bytes seen", y_title="validation bits per byte",
          height=640)
    tops = [t.y[1] for t in fig.data if len(t.y) > 1]
    low = min(min(t.y) for t in fig.data)
    fig.update_yaxes(range=[round(max(0.0, low - 0.15), 3), round(max(tops) + 0.2, 3)])
    fig.update_layout(margin=dict(t=210))  # room for a legend of a dozen runs on a phone
    for name, value in (data.get("baselines") or {}).items():
        fig.add_hline(y=value, line=dict(color="#888", dash="dot", width=1))
        fig.add_annotation(x=1.0, xref="paper", xanchor="right", y=value, yanchor="bottom",
                           showarrow=False, text=f"{name} table {value:.2f}",
                           font=dict(size=11, color="#666"))
    n = len(runs)
    steps = [Step(label="every variant", data={"opacity": [1.0] * n, "line.width": [2] * n},
                  layout={"title.text": "GPT-2's validation loss, as published and with one "
                                        "change each (seed 0)"})]
    for i, r in enumerate(runs):
        label = PLATEAU_LABELS.get(r["variant"], r["variant"])
        steps.append(Step(label=label, data={"opacity": [1.0 if j == i else 0.2 for j in range(n)],
                                             "line.width": [4 if j == i else 1.5 for j in range(n)]},
                          layout={"title.text": f"GPT-2, {label}: validation bits per byte"}))
    return add_slider(fig, steps, prefix="in front: ", active=active)


def previous_byte_heads(data: Mapping, variant: str = "published_1200", active: int | None = None) -> go.Figure:
    """How much GPT-2's attention looks at the byte just before, by position in the window: for
    each layer the largest mean weight of a head on position ``t - 1`` (log scale), against
    what attention spread evenly over the visible bytes would put there (dashed). The slider
    walks through the training steps of ``variant`` (``active``: the index of the step shown
    first; default the last)."""
    runs = _check_plateau(data)
    run = next((r for r in runs if r["variant"] == variant), None)
    if run is None or not run.get("attention"):
        raise ValueError(f"the results hold no attention record of variant {variant!r}")
    bins = data["config"]["attention_bins"]
    labels = [f"{lo}–{hi - 1}" for lo, hi in bins]
    points = run["attention"]
    active = len(points) - 1 if active is None else active
    if not 0 <= active < len(points):
        raise ValueError(f"active must be in [0, {len(points)}), got {active}")
    n_layer = len(points[0]["layers"])
    fig = go.Figure()
    for i in range(n_layer):
        fig.add_trace(go.Scatter(x=labels, mode="lines+markers", name=f"layer {i + 1}",
                                 line=dict(color=PALETTE[i % len(PALETTE)], width=2),
                                 hovertemplate=f"layer {i + 1}: %{{y:.3f}} at positions %{{x}}"
                                               "<extra></extra>"))
    fig.add_trace(go.Scatter(x=labels, y=data["config"]["uniform"], mode="lines", name="spread evenly",
                             line=dict(color="#555", dash="dash", width=1.5),
                             hovertemplate="spread evenly: %{y:.3f}<extra></extra>"))
    style(fig, title="", x_title="position in the window (query)",
          y_title="attention on the previous byte (best head)", height=500)
    fig.update_yaxes(type="log", range=[-2.3, 0.05])
    fig.update_layout(margin=dict(t=130))
    label = PLATEAU_LABELS.get(variant, variant)
    steps = [Step(label=f"{p['step']:,}", data={"y": p["layers"]}, traces=list(range(n_layer)),
                  layout={"title.text": f"GPT-2 ({label}) after {p['step']:,} steps: attention "
                                        "on the previous byte"}) for p in points]
    return add_slider(fig, steps, prefix="training step: ", active=active)


# ------------------------------------------------------------------ the longer run: its design
def _check_run(data: Mapping) -> Mapping:
    try:
        data["config"]["mixers"], data["models"], data["config"]["reference"]
    except (KeyError, TypeError) as err:
        raise ValueError(f"data must be the results of benchmarks/text_lm.py (missing {err})") from None
    return data


def design_table(data: Mapping) -> tuple[list[str], list[list]]:
    """Headers and rows for :func:`gpt2k3.book.display.md_table`: every model of the run, its
    parameters (active), their difference from the reference model's, in percent, its position
    encoding and the longest window it can read. Settings only: no run's result."""
    _check_run(data)
    models, ref = data["models"], data["models"][data["config"]["reference"]]["params"]["total"]
    positions = {"learned": "learned table", "none": "none (NoPE)"}
    rows = []
    for m in data["config"]["mixers"]:
        p = models[m]["params"]
        where = "RoPE" if m == "transformer_pp" else positions.get(models[m]["position"], "?")
        rows.append([_label(data, m), f"{p['total']:,}" + (f" ({p['active']:,})" if p["active"] != p["total"] else ""),
                     f"{100 * (p['total'] - ref) / ref:+.2f}", where, f"{models[m]['block_size']:,}"])
    return ["model", "parameters (active)", "vs GPT-2 (%)", "positions", "longest window"], rows


def repeat_table(data: Mapping) -> tuple[list[str], list[list]]:
    """Headers and rows for :func:`gpt2k3.book.display.md_table`: the repeats the repeat test
    reads, by distance bin (bytes from the first copy's start to the second's): how many, how
    many bytes are scored (each copy from its ``skip``-th byte on) and the window length they
    are read in. Settings only: no run's result."""
    windows_of = _bin_windows(data)
    try:
        info = data["repeats"]
        reps, skip, bins = info["repeats"], info["skip"], info["distances"]
    except (KeyError, TypeError) as err:
        raise ValueError(f"data must be the results of benchmarks/text_lm.py (missing {err})") from None
    rows = []
    for (lo, hi), windows in zip(bins, windows_of):
        mine = [(f, s, n) for f, s, n in reps if lo <= s - f < hi]
        rows.append([f"{lo:,}–{hi - 1:,}", len(mine), sum(n - skip for *_, n in mine),
                     ", ".join(f"{w:,}" for w in sorted(windows)) or "–"])
    return ["distance (bytes)", "repeats", "bytes scored", "read in windows of"], rows


# ------------------------------------------------------------------ the longer run: results
def _complete(data: Mapping) -> Mapping:
    _check_run(data)
    if not data.get("complete"):
        raise ValueError("the run has not finished: its results are not shown until every run has")
    return data


def lr_sweep(data: Mapping, active: int = 0) -> go.Figure:
    """Validation bits per byte of every model (seed 0, the full budget) against the peak
    learning rate tried; a ring marks the rate each model was given. The slider brings one
    model to the front. Only a finished run (``data["complete"]``)."""
    _complete(data)
    mixers = [m for m in data["config"]["mixers"] if m in (data.get("lr_choice") or {})]
    if not 0 <= active <= len(mixers):
        raise ValueError(f"active must be in [0, {len(mixers)}], got {active}")
    fig = go.Figure()
    for m in mixers:
        trials = sorted((r["lr"], r["val_bits"]) for r in data["sweep"] if r["mixer"] == m)
        best = data["lr_choice"][m]["lr"]
        fig.add_trace(go.Scatter(
            x=[lr for lr, _ in trials], y=[b for _, b in trials], mode="lines+markers",
            name=_label(data, m), line=dict(color=color_of(m), width=2),
            marker=dict(size=[14 if lr == best else 7 for lr, _ in trials],
                        symbol=["circle-open" if lr == best else "circle" for lr, _ in trials],
                        line=dict(width=2)),
            hovertemplate=f"{_label(data, m)}: %{{y:.3f}} bits/byte at peak rate %{{x:g}}<extra></extra>"))
    style(fig, title="", x_title="peak learning rate (log scale)",
          y_title="validation bits per byte (seed 0)", height=520)
    fig.update_xaxes(type="log")
    fig.update_layout(margin=dict(t=130))
    n = len(mixers)
    steps = [Step(label="every model", data={"opacity": [1.0] * n},
                  layout={"title.text": "Validation loss against the learning rate tried (seed 0)"})]
    for i, m in enumerate(mixers):
        steps.append(Step(label=_label(data, m), data={"opacity": [1.0 if j == i else 0.2 for j in range(n)]},
                          layout={"title.text": f"{_label(data, m)}: validation loss against the "
                                                "learning rate"}))
    return add_slider(fig, steps, prefix="in front: ", active=active)


def seed_table(data: Mapping) -> tuple[list[str], list[list]]:
    """Headers and rows for :func:`gpt2k3.book.display.md_table`: every model's peak learning
    rate, its validation bits per byte at the training length for each seed, their mean and
    half their range (lowest to highest seed), best first; then the byte n-gram tables (four-,
    three- and two-byte) scored on the same evaluation windows. Only a finished run."""
    _complete(data)
    seeds = list(data["config"]["seeds"])
    rows = []
    for m in data["config"]["mixers"]:
        runs = {r["seed"]: r for r in data["runs"] if r["mixer"] == m}
        s = spread([runs[k]["val_bits"] for k in seeds])
        rows.append((s["mean"], [_label(data, m), f"{data['lr_choice'][m]['lr']:g}",
                                 *[f"{runs[k]['val_bits']:.3f}" for k in seeds],
                                 f"{s['mean']:.3f} ± {s['half_range']:.3f}"]))
    rows = [r for _, r in sorted(rows, key=lambda x: x[0])]
    base = data["eval_baselines"]
    for name, key in (("byte four-gram table", "fourgram_eval"), ("byte trigram table", "trigram_eval"),
                      ("byte bigram table", "bigram_eval")):
        if key in base:  # the four-gram table only in files scored since it was added
            rows.append([name, "–", *["–"] * len(seeds), f"{base[key]:.3f}"])
    return ["model", "peak rate", *[f"seed {k}" for k in seeds], "mean ± half range"], rows


def repeat_summary(data: Mapping) -> dict[str, dict]:
    """Per model, per distance bin of the repeat test: ``first`` and ``second`` (mean bits per
    byte over the seeds, each seed weighting its bin by the bytes scored), ``gain``
    (``first - second``: what reading the first copy saves on the second, per seed:
    ``gain_seeds``), ``bytes`` and ``repeats``; ``None`` for a bin some of whose repeats the
    model cannot read (past its position table), so every point averages the same repeats.
    Only a finished run."""
    _complete(data)
    bins = data["repeats"]["distances"]
    needed = _bin_windows(data)
    out = {}
    for m in data["config"]["mixers"]:
        runs = [r for r in data["runs"] if r["mixer"] == m]
        per_bin = []
        for i in range(len(bins)):
            # a model that cannot read some of a bin's repeats gets no point there: its mean
            # would be over other repeats than the other models'
            if any(r["repeats"].get(str(w)) is None for r in runs for w in needed[i]):
                per_bin.append(None)
                continue
            seeds = []
            for r in runs:
                parts = [rec for rec in r["repeats"].values() if rec is not None and rec["n"][i]]
                if not parts:
                    seeds.append("empty")
                    continue
                w = sum(rec["bytes"][i] for rec in parts)
                seeds.append({k: math.fsum(rec[k][i] * rec["bytes"][i] for rec in parts) / w
                              for k in ("first", "second")} | {"bytes": w,
                                                               "repeats": sum(rec["n"][i] for rec in parts)})
            if any(s == "empty" for s in seeds):
                per_bin.append(None)
                continue
            gains = [s["first"] - s["second"] for s in seeds]
            per_bin.append({"first": statistics.fmean(s["first"] for s in seeds),
                            "second": statistics.fmean(s["second"] for s in seeds),
                            "gain": statistics.fmean(gains), "gain_seeds": gains,
                            "bytes": seeds[0]["bytes"], "repeats": seeds[0]["repeats"]})
        out[m] = per_bin
    return out


def _bin_windows(data: Mapping) -> list[set[int]]:
    """For each distance bin of the repeat test, the window lengths its repeats are read in
    (each at the shortest evaluation length that holds both copies)."""
    try:
        info = data["repeats"]
        lengths = sorted(int(n) for n in info["lengths"])
        out = [set() for _ in info["distances"]]
        for f, s, n in info["repeats"]:
            fit = next((w for w in lengths if s + n - f <= w), None)
            for i, (lo, hi) in enumerate(info["distances"]):
                if lo <= s - f < hi and fit is not None:
                    out[i].add(fit)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"data must be the results of benchmarks/text_lm.py (missing {err})") from None
    return out


def inside_bins(data: Mapping) -> list[int]:
    """The indices of the repeat test's distance bins whose every repeat is read in a window no
    longer than the training length (both copies within what the models were trained on)."""
    try:
        context = data["config"]["model"]["context"]
    except (KeyError, TypeError) as err:
        raise ValueError(f"data must be the results of benchmarks/text_lm.py (missing {err})") from None
    return [i for i, windows in enumerate(_bin_windows(data)) if windows and max(windows) <= context]


def repeat_findings(data: Mapping, bins: list[int] | None = None) -> dict:
    """What the repeat test found over every model and distance bin it could read
    (:func:`repeat_summary`), or only the bins whose indices ``bins`` lists: ``largest`` (the
    largest mean saving: ``mixer``, ``bin``, ``gain``, ``first``), ``consistent`` (the
    ``(mixer, bin)`` pairs where every seed saved bits on the second copy), ``cells`` (how many
    pairs were read), ``spread`` (the largest half range of a pair's per-seed savings) and
    ``first_worst`` (the highest loss on a first copy: a model reading past what it was trained
    on). Only a finished run."""
    summary = repeat_summary(data)
    edges = [tuple(b) for b in data["repeats"]["distances"]]
    keep = range(len(edges)) if bins is None else bins
    cells = [(m, edges[i], per[i]) for m, per in summary.items() for i in keep if per[i] is not None]
    if not cells:
        raise ValueError("data holds no repeat the models could read")
    m, where, b = max(cells, key=lambda c: c[2]["gain"])
    worst = max(cells, key=lambda c: c[2]["first"])
    return {"largest": {"mixer": m, "bin": where, "gain": b["gain"], "first": b["first"]},
            "consistent": [(m, w) for m, w, b in cells if min(b["gain_seeds"]) > 0],
            "cells": len(cells),
            "spread": max((max(b["gain_seeds"]) - min(b["gain_seeds"])) / 2 for *_, b in cells),
            "first_worst": {"mixer": worst[0], "bin": worst[1], "first": worst[2]["first"]}}


def repeat_gain(data: Mapping, active: int = 0) -> go.Figure:
    """What reading a passage once saves on reading it again: for every model, the bits per
    byte of the first copy of a repeat minus those of the second, by distance between them
    (mean over seeds; bars: lowest to highest seed). Zero: the model does not use the first
    copy; the first two bins fit in the training length. The slider brings one model to the
    front. Only a finished run."""
    summary = repeat_summary(data)
    bins = data["repeats"]["distances"]
    x = [f"{lo:,}–{hi - 1:,}" for lo, hi in bins]
    mixers = list(summary)
    if not 0 <= active <= len(mixers):
        raise ValueError(f"active must be in [0, {len(mixers)}], got {active}")
    fig = go.Figure()
    for m in mixers:
        ys = [None if b is None else b["gain"] for b in summary[m]]
        plus = [0 if b is None else max(b["gain_seeds"]) - b["gain"] for b in summary[m]]
        minus = [0 if b is None else b["gain"] - min(b["gain_seeds"]) for b in summary[m]]
        fig.add_trace(go.Scatter(
            x=x, y=ys, mode="lines+markers", name=_label(data, m),
            line=dict(color=color_of(m), width=2), marker=dict(size=7),
            error_y=dict(type="data", symmetric=False, array=plus, arrayminus=minus, thickness=1, width=3),
            hovertemplate=f"{_label(data, m)}: the second copy %{{y:.3f}} bits/byte cheaper "
                          "at distances %{x}<extra></extra>"))
    fig.add_hline(y=0, line=dict(color="#555", width=1))
    style(fig, title="", x_title="distance from the first copy (bytes)",
          y_title="bits per byte saved on the second copy", height=540)
    fig.update_layout(margin=dict(t=130))
    n = len(mixers)
    steps = [Step(label="every model", data={"opacity": [1.0] * n},
                  layout={"title.text": "What the first copy saves on the second (mean over seeds)"})]
    for i, m in enumerate(mixers):
        steps.append(Step(label=_label(data, m), data={"opacity": [1.0 if j == i else 0.2 for j in range(n)]},
                          layout={"title.text": f"{_label(data, m)}: what the first copy saves "
                                                "on the second"}))
    return add_slider(fig, steps, prefix="in front: ", active=active)


# ------------------------------------------------------------------ the compute multiplier
#: The Kimi K3 report's Section 3.2 ("Scaling Law"), its first paragraph in full (Kimi Team,
#: "Kimi K3: Open Frontier Intelligence", arXiv:2607.24653).
K3_SCALING_QUOTE = (
    "Taken together, the architectural, data, and training improvements described in the "
    "previous sections define our new model family. Since these changes also alter the optimal "
    "training regime, we conduct dedicated scaling-law studies to retune key hyperparameters, "
    "including the batch size, learning rate, tokens-per-parameter ratio (TPP) and the model "
    "shape. Evaluated on held-out OOD validation data, the scaling law curves in (Fig. 7) show "
    "that these improvements collectively deliver an approximately 2.5× gain in overall scaling "
    "efficiency over Kimi K2. Table 1 provides a detailed architectural comparison between Kimi "
    "K2 and Kimi K3, highlighting the structural changes that contribute to this improvement.")
#: The gain that paragraph states. The report does not define "scaling efficiency"; read the
#: usual way, K3 reaches a validation loss with about this many times less training compute than
#: K2 (read off fitted scaling-law curves, its Figure 7).
K3_SCALING_GAIN = 2.5

def _check_multiplier(data: Mapping) -> list[dict]:
    try:
        runs = list(data["runs"])
        data["baseline"], data["target"], data["flops_per_byte"], data["target_bits"]
    except (KeyError, TypeError) as err:
        raise ValueError(f"data must be the results of benchmarks/compute_multiplier.py "
                         f"(missing {err})") from None
    if not runs:
        raise ValueError("data holds no run")
    return runs


def multiplier_facts(data: Mapping) -> dict:
    """What the multiplier file holds now: ``budgets`` (per multiple of chapter 11's bytes, the
    baseline's seeds finished), ``multiplier``, ``band``, ``lower_bound`` and ``complete`` as
    stored; ``reached`` (whether the baseline's mean reaches the target within the budgets);
    ``flops_ratio`` (the baseline's training FLOPs per byte over the target's), so that a
    multiplier in FLOPs is ``flops_ratio`` times smaller in bytes; ``largest`` (the largest
    budget's multiple) and ``target_compute``."""
    runs = _check_multiplier(data)
    base = [r for r in runs if r["model"] == data["baseline"]]
    budgets = {m: sorted(r["seed"] for r in base if r["multiple"] == m)
               for m in sorted({r["multiple"] for r in base})}
    per_byte = data["flops_per_byte"]
    return {"budgets": budgets, "largest": max(budgets), "multiplier": data.get("multiplier"),
            "band": list(data.get("band") or [None, None]),
            "lower_bound": data.get("lower_bound"), "complete": bool(data.get("complete")),
            "reached": data.get("multiplier") is not None,
            "flops_ratio": per_byte[data["baseline"]] / per_byte[data["target"]],
            "target_compute": data.get("target_compute"),
            "target_seeds": sorted(r["seed"] for r in runs
                                   if r["model"] == data["target"] and r["multiple"] == 1)}


def seeds_text(seeds) -> str:
    """Seeds as prose: ``"seed 0"``, ``"seeds 0 and 1"``, ``"seeds 0, 1 and 2"``."""
    names = [str(s) for s in seeds]
    if not names:
        raise ValueError("seeds must name at least one seed")
    if len(names) == 1:
        return "seed " + names[0]
    return "seeds " + ", ".join(names[:-1]) + " and " + names[-1]


def multiplier_table(data: Mapping) -> tuple[list[str], list[list]]:
    """``(headers, rows)``: one row per model and budget: the multiple of chapter 11's bytes,
    the bytes, the training compute (in 10^12 FLOPs) and its ratio to the tiny K3's at 1x, the
    validation bits per byte of every finished seed and their mean."""
    runs = _check_multiplier(data)
    t_compute = statistics.fmean(r["compute"] for r in runs
                                 if r["model"] == data["target"] and r["multiple"] == 1)
    rows = []
    for model in (data["target"], data["baseline"]):
        for m in sorted({r["multiple"] for r in runs if r["model"] == model}):
            rs = sorted((r for r in runs if r["model"] == model and r["multiple"] == m),
                        key=lambda r: r["seed"])
            bits = [r["val_bits"] for r in rs]
            rows.append([_label(data, model), f"{m}×", f"{rs[0]['tokens']:,}",
                         f"{rs[0]['compute'] / 1e12:,.1f}", f"{rs[0]['compute'] / t_compute:.2f}",
                         ", ".join(f"{r['seed']}: {r['val_bits']:.3f}" for r in rs),
                         f"{statistics.fmean(bits):.3f}"])
    return (["model", "budget", "bytes", "compute (10¹² FLOPs)", "compute / tiny K3's",
             "bits per byte by seed", "mean"], rows)


def multiplier_figure(data: Mapping) -> go.Figure:
    """Validation bits per byte against training compute (log scale): every finished run of the
    baseline (markers) and its mean per budget (line), the target's runs at 1x, and a dotted
    line at the target's mean; the title states the multiplier, or the lower bound."""
    runs = _check_multiplier(data)
    facts = multiplier_facts(data)
    fig = go.Figure()
    for model, symbol in ((data["baseline"], "circle"), (data["target"], "diamond")):
        rs = [r for r in runs if r["model"] == model]
        label = _label(data, model)
        fig.add_trace(go.Scatter(
            x=[r["compute"] for r in rs], y=[r["val_bits"] for r in rs], mode="markers",
            name=f"{label}, each seed", marker=dict(color=color_of(model), symbol=symbol, size=8,
                                                    opacity=0.6),
            text=[f"{r['multiple']}×, seed {r['seed']}" for r in rs],
            hovertemplate=f"{label} %{{text}}: %{{y:.3f}} bits/byte at %{{x:.3g}} FLOPs"
                          "<extra></extra>"))
        if model == data["baseline"]:
            budgets = sorted({r["compute"] for r in rs})
            means = [statistics.fmean(r["val_bits"] for r in rs if r["compute"] == c)
                     for c in budgets]
            fig.add_trace(go.Scatter(x=budgets, y=means, mode="lines", name=f"{label}, mean",
                                     line=dict(color=color_of(model), width=2),
                                     hoverinfo="skip"))
    target = data["target_bits"]["mean"]
    fig.add_hline(y=target, line=dict(color="#888", dash="dot", width=1))
    fig.add_annotation(x=1.0, xref="paper", xanchor="right", y=target, yanchor="top",
                       showarrow=False, text=f"{_label(data, data['target'])} at 1×: {target:.3f}",
                       font=dict(size=11, color="#666"))
    if facts["reached"]:
        title = f"GPT-2 reaches the tiny K3's loss at {facts['multiplier']:.1f}× its compute"
    else:
        so_far = "" if facts["complete"] else " so far"
        title = (f"GPT-2 has not reached the tiny K3's loss by {facts['lower_bound']:.2f}× its "
                 f"compute (budgets{so_far}: up to {facts['largest']}× the bytes)")
    style(fig, title=title, x_title="training compute (FLOPs)", y_title="validation bits per byte",
          height=460)
    fig.update_xaxes(type="log")
    return fig
