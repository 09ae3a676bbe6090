"""Chapter 11's optimizer experiment: AdamW against Muon, with and without QK-clip.

The builders read what ``benchmarks/optimizers.py`` writes (``benchmarks/results/
optimizers.json``); nothing is trained here.

* :func:`optimizer_table` -- per arm: the learning rate the rule chose, the validation bits per
  byte of every seed, their mean and spread, the bytes to the target loss and the largest logit;
* :func:`lr_trial_table` -- the learning-rate trials of both optimizers;
* :func:`optimizer_curves` -- validation bits per byte against the bytes trained on;
* :func:`max_logit_curves` -- the largest pre-softmax attention logit of every step;
* :func:`per_head_table`, :func:`head_scale_facts`, :func:`head_scale_curves` -- Kimi K3's
  Per-Head Muon against whole-matrix Muon: the final loss per seed, and how unequal the heads'
  update scales are under each form.
"""

from __future__ import annotations

import math
import statistics
from typing import Mapping, Sequence

import plotly.graph_objects as go

from gpt2k3.book.figures._style import PALETTE, Step, add_slider, style

__all__ = ["ARMS", "ALL_ARMS", "ARM_LABELS", "arm_runs", "largest_jump", "optimizer_summary",
           "logit_facts", "optimizer_table", "lr_trial_table", "optimizer_curves",
           "max_logit_curves", "HEAD_FORMS", "per_head_table", "head_scale_facts",
           "head_scale_curves"]

#: The four arms of the experiment, in the order the chapter shows them.
ARMS = ("adamw", "muon", "adamw_qk", "muon_qk")
#: Every arm, Kimi K3's Per-Head Muon included (it runs at Muon's chosen rate).
ALL_ARMS = (*ARMS, "muon_per_head")
ARM_LABELS = {"adamw": "AdamW", "muon": "Muon", "adamw_qk": "AdamW + QK-clip",
              "muon_qk": "MuonClip: Muon + QK-clip", "muon_per_head": "Per-Head Muon"}
_COLORS = {"adamw": PALETTE[0], "muon": PALETTE[5], "adamw_qk": PALETTE[4], "muon_qk": PALETTE[1],
           "muon_per_head": PALETTE[2]}
_DASH = {"adamw": "solid", "muon": "solid", "adamw_qk": "dash", "muon_qk": "dash",
         "muon_per_head": "dashdot"}
#: What ``head_update_rms`` records per head: the momentum, and each form's step.
HEAD_FORMS = {"input": "momentum fed to Newton–Schulz", "whole": "whole-matrix Muon step",
              "per_head": "Per-Head Muon step"}


def _check(data: Mapping) -> list[dict]:
    try:
        runs, settings = list(data["runs"]), data["settings"]
        settings["steps"], settings["seeds"]
    except (KeyError, TypeError) as err:
        raise ValueError(f"data must be the results of benchmarks/optimizers.py (missing {err})") \
            from None
    return runs


def arm_runs(data: Mapping, arms: Sequence[str] = ARMS) -> dict[str, list[dict]]:
    """The full runs of each of ``arms`` (those that have any), by seed."""
    runs = _check(data)
    unknown = [a for a in arms if a not in ALL_ARMS]
    if unknown or not arms:
        raise ValueError(f"arms must be a non-empty subset of {ALL_ARMS}, got {list(arms)}")
    out = {a: sorted((r for r in runs if r["phase"] == "full" and r["arm"] == a),
                     key=lambda r: r["seed"]) for a in arms}
    out = {a: rs for a, rs in out.items() if rs}
    if not out:
        raise ValueError("data holds no finished full run of these arms")
    return out


def largest_jump(losses: Sequence[float], window: int = 20, start: int = 50) -> float:
    """How far a step's training loss rose above the median of the ``window`` steps before it,
    at most, over the steps from ``start`` on (past the warm-up): a loss spike shows as a large
    jump, batch-to-batch noise as a small one."""
    if not isinstance(window, int) or not isinstance(start, int) or not 1 <= window <= start:
        raise ValueError(f"window and start must be integers with 1 <= window <= start, "
                         f"got {window!r} and {start!r}")
    if len(losses) <= start:
        raise ValueError(f"losses must hold more than start = {start} steps, got {len(losses)}")
    return max(losses[t] - statistics.median(losses[t - window:t]) for t in range(start, len(losses)))


def optimizer_summary(data: Mapping) -> dict[str, dict]:
    """Per arm: ``lr``, ``qk_clip``, ``val_bits`` (per seed), ``mean``, ``half_range`` (half the
    spread of the seeds), ``max_logit`` (over every step of every seed), ``to_target`` (bytes to
    the target loss on the seed-mean curve, ``None``: not reached or no target), ``curve_end`` (the
    seed-mean validation curve's last point, the scale the target is on) and
    ``steps_with_a_clip`` and ``largest_jump`` (of the training loss, over the seeds,
    :func:`largest_jump`)."""
    reach = (data.get("summary") or {}).get("tokens_to_target") or {}
    out = {}
    for arm, rs in arm_runs(data, ALL_ARMS).items():
        bits = [r["val_bits"] for r in rs]
        out[arm] = {"lr": rs[0]["lr"], "qk_clip": rs[0]["qk_clip"], "seeds": [r["seed"] for r in rs],
                    "val_bits": bits, "mean": statistics.fmean(bits),
                    "half_range": (max(bits) - min(bits)) / 2,
                    "max_logit": max(r["max_logit"] for r in rs),
                    "to_target": (reach.get(arm) or {}).get("mean_curve"),
                    "curve_end": statistics.fmean(r["curve"][-1]["bits"] for r in rs),
                    "largest_jump": max(largest_jump(r["losses"]) for r in rs),
                    "steps_with_a_clip": None if rs[0]["qk_clip"] is None else
                    sum(sum(c > 0 for c in r["heads_clipped"]) for r in rs)}
    return out


def logit_facts(data: Mapping, late: int = 100, near_pct: float = 10) -> dict:
    """What the full runs' largest attention logits did, for the chapter's prose: ``peak_steps``
    (the earliest and latest step, 1-based, at which an unclipped run peaked), ``late_max`` (per
    unclipped arm, the largest logit over the last ``late`` steps), ``peak_range`` (per unclipped
    arm, the lowest and highest peak of its runs), ``tau`` (the clip threshold),
    ``clipped_late_max`` (the largest logit of a clipped run over its last ``late`` steps),
    ``over_within_pct`` (of the clipped runs' steps whose largest logit is above ``tau``, the
    share within ``near_pct`` percent of it) and ``curve_offsets`` (the lowest and highest
    difference between a run's last validation-curve point and its final evaluation)."""
    runs = [r for r in _check(data) if r["phase"] == "full" and r["arm"] in ARMS]
    if not isinstance(late, int) or not 1 <= late <= min(len(r["max_logits"]) for r in runs):
        raise ValueError(f"late must be an int between 1 and the steps of a run, got {late!r}")
    unclipped = [r for r in runs if r["qk_clip"] is None]
    clipped = [r for r in runs if r["qk_clip"] is not None]
    if not unclipped or not clipped:
        raise ValueError("data must hold full runs with and without QK-clip")
    peaks = [r["max_logits"].index(r["max_logit"]) + 1 for r in unclipped]
    arms = sorted({r["arm"] for r in unclipped}, key=ARMS.index)
    tau = clipped[0]["qk_clip"]
    over = [v for r in clipped for v in r["max_logits"] if v > tau]
    offsets = [r["curve"][-1]["bits"] - r["val_bits"] for r in runs]
    return {"peak_steps": (min(peaks), max(peaks)),
            "late_max": {a: max(max(r["max_logits"][-late:]) for r in unclipped if r["arm"] == a)
                         for a in arms},
            "peak_range": {a: (min(r["max_logit"] for r in unclipped if r["arm"] == a),
                               max(r["max_logit"] for r in unclipped if r["arm"] == a)) for a in arms},
            "tau": tau, "clipped_late_max": max(max(r["max_logits"][-late:]) for r in clipped),
            "over_within_pct": (100 * sum(v <= (1 + near_pct / 100) * tau for v in over) / len(over)
                                if over else None),
            "curve_offsets": (min(offsets), max(offsets))}


def optimizer_table(data: Mapping) -> tuple[list[str], list[list[str]]]:
    """``(headers, rows)`` of :func:`optimizer_summary` for :func:`gpt2k3.book.display.md_table`."""
    summary = optimizer_summary(data)
    target = (data.get("summary") or {}).get("target_bits")
    headers = ["optimizer", "peak rate", "bits per byte by seed", "mean ± half-range",
               f"bytes until the curve reaches {target:.3f} bits" if target else "bytes to the target",
               "max logit"]
    rows = []
    for arm, s in summary.items():
        clip = "" if s["qk_clip"] is None else f" (τ = {s['qk_clip']:g})"
        rows.append([ARM_LABELS[arm] + clip, f"{s['lr']:g}",
                     ", ".join(f"{b:.3f}" for b in s["val_bits"]),
                     f"{s['mean']:.3f} ± {s['half_range']:.3f}",
                     f"not reached (ends at {s['curve_end']:.3f})" if s["to_target"] is None
                     else f"{s['to_target']:,.0f}",
                     f"{s['max_logit']:.1f}"])
    return headers, rows


def lr_trial_table(data: Mapping) -> tuple[list[str], list[list[str]]]:
    """``(headers, rows)``: the validation bits per byte of every learning-rate trial (seed 0,
    the short budget), one column per optimizer; the chosen rate of each is starred."""
    trials = [r for r in _check(data) if r["phase"] == "sweep"]
    if not trials:
        raise ValueError("data holds no learning-rate trial")
    opts = [o for o in ("adamw", "muon") if any(r["arm"] == o for r in trials)]
    best = {o: min((r for r in trials if r["arm"] == o), key=lambda r: (r["val_bits"], r["lr"]))["lr"]
            for o in opts}
    rows = []
    for lr in sorted({r["lr"] for r in trials}):
        row = [f"{lr:g}"]
        for o in opts:
            hit = [r["val_bits"] for r in trials if r["arm"] == o and r["lr"] == lr]
            row.append("" if not hit else f"{hit[0]:.3f}" + (" *" if best[o] == lr else ""))
        rows.append(row)
    return ["peak learning rate", *[ARM_LABELS[o] for o in opts]], rows


def _seed_views(rs: list[dict], values) -> list[list[float]]:
    """Per slider view -- the mean over the seeds, then each seed -- the series ``values(run)``."""
    series = [values(r) for r in rs]
    mean = [statistics.fmean(col) for col in zip(*series)]
    return [mean, *series]


def optimizer_curves(data: Mapping, arms: Sequence[str] = ARMS, active: int = 0) -> go.Figure:
    """Validation bits per byte against the bytes trained on, one line per arm; the slider
    shows the mean over the seeds or one seed. Dotted: the target loss of the summary."""
    by_arm = arm_runs(data, arms)
    seeds = next(iter(by_arm.values()))
    n_views = 1 + len(seeds)
    fig = go.Figure()
    views = {}
    for arm, rs in by_arm.items():
        x = [p["tokens"] for p in rs[0]["curve"]]
        views[arm] = _seed_views(rs, lambda r: [p["bits"] for p in r["curve"]])
        fig.add_trace(go.Scatter(
            x=x, y=views[arm][0], mode="lines+markers", name=ARM_LABELS[arm],
            marker=dict(size=4), line=dict(color=_COLORS[arm], dash=_DASH[arm], width=2),
            hovertemplate=f"{ARM_LABELS[arm]}: %{{y:.3f}} bits/byte after %{{x:,}} bytes"
                          "<extra></extra>"))
    style(fig, title="", x_title="training bytes seen", y_title="validation bits per byte",
          height=520)
    low = min(min(min(v) for v in vs) for vs in views.values())
    second = max(max(v[1] for v in vs) for vs in views.values())  # the first point after step 0
    fig.update_yaxes(range=[round(low - 0.1, 3), round(second + 0.15, 3)])
    target = (data.get("summary") or {}).get("target_bits")
    if target:
        fig.add_hline(y=target, line=dict(color="#888", dash="dot", width=1))
        fig.add_annotation(x=0.0, xref="paper", xanchor="left", y=target, yanchor="bottom",
                           showarrow=False, text=f"target {target:.3f} (AdamW's end)",
                           font=dict(size=11, color="#666"))
    labels = ["mean of the seeds"] + [f"seed {r['seed']}" for r in seeds]
    steps = [Step(label=labels[v], data={"y": [views[a][v] for a in by_arm]},
                  layout={"title.text": f"Validation loss by optimizer, {labels[v]}"})
             for v in range(n_views)]
    if not 0 <= active < n_views:
        raise ValueError(f"active must be in [0, {n_views}), got {active}")
    return add_slider(fig, steps, prefix="showing: ", active=active)


def max_logit_curves(data: Mapping, arms: Sequence[str] = ARMS, active: int = 0) -> go.Figure:
    """The largest pre-softmax attention logit of each training step's forward pass, over
    every head and layer, one line per arm (log scale); the slider picks the seed, or the
    largest over the seeds. Dotted, a legend entry of its own: QK-clip's threshold."""
    by_arm = arm_runs(data, arms)
    seeds = next(iter(by_arm.values()))
    fig = go.Figure()
    views = {}
    for arm, rs in by_arm.items():
        per_seed = [r["max_logits"] for r in rs]
        views[arm] = [[max(col) for col in zip(*per_seed)], *per_seed]
        fig.add_trace(go.Scatter(
            x=list(range(1, len(per_seed[0]) + 1)), y=views[arm][0], mode="lines",
            name=ARM_LABELS[arm], line=dict(color=_COLORS[arm], dash=_DASH[arm], width=2),
            hovertemplate=f"{ARM_LABELS[arm]}: largest logit %{{y:.2f}} at step %{{x}}"
                          "<extra></extra>"))
    style(fig, title="", x_title="training step", y_title="largest attention logit", height=520)
    every = [v for vs in views.values() for view in vs for v in view]
    fig.update_yaxes(type="log", range=[math.log10(min(every)) - 0.1, math.log10(max(every)) + 0.1])
    taus = {r["qk_clip"] for rs in by_arm.values() for r in rs if r["qk_clip"] is not None}
    for tau in sorted(taus):  # a legend entry, not a label that curves could run through
        fig.add_trace(go.Scatter(x=[1, len(views[next(iter(by_arm))][0])], y=[tau, tau],
                                 mode="lines", name=f"QK-clip threshold τ = {tau:g}",
                                 line=dict(color="#888", dash="dot", width=1.5), hoverinfo="skip"))
    labels = ["largest over the seeds"] + [f"seed {r['seed']}" for r in seeds]
    n_views = len(labels)
    if not 0 <= active < n_views:
        raise ValueError(f"active must be in [0, {n_views}), got {active}")
    steps = [Step(label=labels[v], data={"y": [views[a][v] for a in by_arm]},
                  layout={"title.text": f"Largest attention logit per step, {labels[v]}"},
                  traces=list(range(len(by_arm))))  # the threshold's line stays as it is
             for v in range(n_views)]
    return add_slider(fig, steps, prefix="showing: ", active=active)


def per_head_table(data: Mapping) -> tuple[list[str], list[list[str]]]:
    """``(headers, rows)``: whole-matrix Muon against Per-Head Muon, one row per seed that both
    have finished, validation bits per byte of each and their difference; then the means."""
    runs = [r for r in _check(data) if r["phase"] == "full"]
    by_arm = {a: [r for r in runs if r["arm"] == a] for a in ("muon", "muon_per_head")}
    if not by_arm["muon_per_head"] or not by_arm["muon"]:
        raise ValueError("data holds no finished Per-Head Muon run beside a Muon run")
    whole = {r["seed"]: r["val_bits"] for r in by_arm["muon"]}
    heads = {r["seed"]: r["val_bits"] for r in by_arm["muon_per_head"]}
    seeds = sorted(set(whole) & set(heads))
    rows = [[f"seed {s}", f"{whole[s]:.3f}", f"{heads[s]:.3f}", f"{heads[s] - whole[s]:+.3f}"]
            for s in seeds]
    w, h = statistics.fmean(whole[s] for s in seeds), statistics.fmean(heads[s] for s in seeds)
    rows.append([f"mean of {len(seeds)}", f"{w:.3f}", f"{h:.3f}", f"{h - w:+.3f}"])
    return ["", "Muon (whole matrix)", "Per-Head Muon", "per-head minus whole"], rows


def _head_scale_runs(data: Mapping) -> list[dict]:
    """The finished Per-Head Muon runs that recorded their heads' update scales, by seed."""
    rs = sorted((r for r in _check(data) if r["phase"] == "full" and r["arm"] == "muon_per_head"
                 and r.get("head_update_rms")), key=lambda r: r["seed"])
    if not rs:
        raise ValueError("data holds no Per-Head Muon run with its head scales")
    return rs


def _spreads(run: Mapping) -> dict[str, list[tuple[int, float]]]:
    """Per form, per recorded step: the largest head's RMS over the smallest, the median over
    the run's attention layers."""
    out = {form: [] for form in HEAD_FORMS}
    for point in run["head_update_rms"]:
        for form in HEAD_FORMS:
            ratios = sorted(max(layer[form]) / min(layer[form]) for layer in point["layers"])
            out[form].append((point["step"], statistics.median(ratios)))
    return out


def head_scale_facts(data: Mapping) -> dict:
    """How unequal the heads' update scales are, over the Per-Head Muon runs: per form of
    :data:`HEAD_FORMS`, the median and the largest over every recorded step, layer and seed of
    the largest head's RMS over the smallest (Q, K and V heads of one layer together), and
    ``seeds``. The momentum is the one Per-Head Muon's own training produced; the whole-matrix
    step is what Muon would have taken from that same momentum."""
    rs = _head_scale_runs(data)
    ratios = {form: sorted(max(layer[form]) / min(layer[form]) for r in rs
                           for point in r["head_update_rms"] for layer in point["layers"])
              for form in HEAD_FORMS}
    return {"seeds": [r["seed"] for r in rs],
            **{form: {"median": statistics.median(v), "max": max(v)} for form, v in ratios.items()}}


def head_scale_curves(data: Mapping, seed: int | None = None) -> go.Figure:
    """The largest head's update RMS over the smallest, against the training step (log scale),
    for the momentum and for each form's step from it: the median over the attention layers
    of one Per-Head Muon run (``seed``; default the first)."""
    rs = _head_scale_runs(data)
    run = rs[0] if seed is None else next((r for r in rs if r["seed"] == seed), None)
    if run is None:
        raise ValueError(f"seed must be one of {[r['seed'] for r in rs]}, got {seed!r}")
    fig = go.Figure()
    colors = {"input": "#888", "whole": _COLORS["muon"], "per_head": _COLORS["muon_per_head"]}
    dash = {"input": "dot", "whole": "solid", "per_head": "dashdot"}
    for form, points in _spreads(run).items():
        fig.add_trace(go.Scatter(
            x=[s for s, _ in points], y=[v for _, v in points], mode="lines+markers",
            name=HEAD_FORMS[form], marker=dict(size=4),
            line=dict(color=colors[form], dash=dash[form], width=2),
            hovertemplate=f"{HEAD_FORMS[form]}: largest/smallest head %{{y:.2f}}× at step %{{x}}"
                          "<extra></extra>"))
    style(fig, title=f"How unequal the heads' update scales are (Per-Head Muon run, seed "
                     f"{run['seed']})", x_title="training step",
          y_title="largest head's RMS / smallest's", height=440)
    fig.update_yaxes(type="log")
    return fig
