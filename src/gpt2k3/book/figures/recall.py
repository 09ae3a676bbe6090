"""Chapter 10 (learned recall): accuracy against the number of pairs, and the training curves.

Both figures read the results of ``benchmarks/mqar.py`` (a dict as in
``benchmarks/results/mqar.json``); nothing is trained here.  :func:`initial_decay_rates` reads
the gates of freshly built, untrained models, for the chapter's note on their starting point.
"""

from __future__ import annotations

import math
import statistics
from typing import Mapping, Sequence

import plotly.graph_objects as go
import torch

from gpt2k3.book.figures._style import PALETTE, Step, add_slider, style
from gpt2k3.checks import check_positive_int
from gpt2k3.experiments import recall
from gpt2k3.experiments.mqar import mqar
from gpt2k3.experiments.recall import MIXER_LABELS

__all__ = ["recall_summary", "recall_table", "recall_accuracy", "recall_loss_curves",
           "recall_run", "smooth", "initial_decay_rates"]

#: One colour per mixer, the same in every figure of the chapter.
COLORS = dict(zip(MIXER_LABELS, PALETTE))


def _check(data: Mapping) -> tuple[list[str], list[int], list[dict]]:
    try:
        config, runs = data["config"], data["runs"]
        mixers, pairs = list(config["mixers"]), [int(p) for p in config["pairs"]]
    except (KeyError, TypeError) as err:
        raise ValueError(f"data must be the results of benchmarks/mqar.py (missing {err})") from None
    if not runs:
        raise ValueError("data holds no finished runs")
    return mixers, pairs, list(runs)


def recall_summary(data: Mapping, step: int | None = None) -> dict[str, dict[int, dict]]:
    """Accuracy over seeds per mixer and number of pairs, after ``step`` (default: the last).

    Returns ``{mixer: {P: {"mean", "sd", "min", "max", "seeds"}}}`` with accuracies as
    fractions; ``sd`` is the sample standard deviation (0 for a single seed) and ``seeds`` the
    per-seed values in seed order.
    """
    mixers, pairs, runs = _check(data)
    out: dict[str, dict[int, dict]] = {}
    for mixer in mixers:
        mine = sorted((r for r in runs if r["mixer"] == mixer), key=lambda r: r["seed"])
        if not mine:
            continue
        per_pair = {}
        for P in pairs:
            accs = []
            for r in mine:
                hist = r["history"] if step is not None else r["history"][-1:]
                hit = [h for h in hist if step is None or h["step"] == step]
                if not hit:
                    raise ValueError(f"step must be one of the checkpoints "
                                     f"{[h['step'] for h in r['history']]}, got {step!r}")
                accs.append(hit[0]["accuracy"][str(P)])
            per_pair[P] = {"mean": statistics.fmean(accs),
                           "sd": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                           "min": min(accs), "max": max(accs), "seeds": accs}
        out[mixer] = per_pair
    return out


def recall_table(data: Mapping, step: int | None = None) -> tuple[list[str], list[list[str]]]:
    """Headers and rows for :func:`gpt2k3.book.display.md_table`: accuracy (%) as mean ± sd over seeds."""
    _, pairs, _ = _check(data)
    summary = recall_summary(data, step)
    headers = ["mixer", *[f"P = {P}" for P in pairs]]
    rows = [[MIXER_LABELS.get(m, m), *[f"{100 * s[P]['mean']:.1f} ± {100 * s[P]['sd']:.1f}"
                                        for P in pairs]]
            for m, s in summary.items()]
    return headers, rows


def initial_decay_rates(data: Mapping, mixers: Sequence[str] = ("gated_deltanet", "kda"),
                        seed: int = 0, share: float = 0.98, n_sequences: int = 32) -> dict:
    """Per-token decay rates ``-log alpha`` of the gated mixers as the sweep builds them, before
    any training: the models of ``seed`` read ``n_sequences`` sequences of the longest task. Returns ``{"low", "high", "median", "share"}``: the middle ``share`` of all rates (every
    layer, head, channel and token of every mixer in ``mixers``) lies between ``low`` and
    ``high``."""
    check_positive_int(n_sequences, "n_sequences")
    if not 0 < share < 1:
        raise ValueError(f"share must be a fraction in (0, 1), got {share!r}")
    tasks, model_cfg, _ = recall.sweep_config(data)
    batch = mqar(tasks[-1], n_sequences, seed=seed)
    rates = []
    for mixer in mixers:
        net = recall.build_model(mixer, tasks, model_cfg, seed=seed)
        gated = [m for m in net.modules() if hasattr(m, "log_alpha") and hasattr(m, "dt_bias")]
        if not gated:
            raise ValueError(f"mixers must name gated mixers, got {mixer!r}")
        hooks = [m.register_forward_pre_hook(
            lambda layer, args: rates.append(-layer.log_alpha(args[0]).flatten())) for m in gated]
        with torch.no_grad():
            net(batch.inputs)
        for h in hooks:
            h.remove()
    r = torch.cat(rates).double()
    tail = (1 - share) / 2
    low, median, high = torch.quantile(r, torch.tensor([tail, 0.5, 1 - tail], dtype=r.dtype))
    return {"low": low.item(), "median": median.item(), "high": high.item(), "share": share}


def _checkpoints(data: Mapping) -> list[int]:
    _, _, runs = _check(data)
    return [h["step"] for h in runs[0]["history"]]


def recall_accuracy(data: Mapping, active: int | None = None) -> go.Figure:
    """Held-out accuracy against the number of key-value pairs, one line per mixer.

    Markers are the mean over seeds, error bars span the lowest to the highest seed. A dotted
    line marks ``1/P``, what a model scores by answering with *some* value of the sequence; a
    dashed vertical line marks ``P = D``, the head dimension. The slider moves through the
    training checkpoints (``active``: index of the one shown first, default the last).
    """
    mixers, pairs, runs = _check(data)
    steps = _checkpoints(data)
    active = len(steps) - 1 if active is None else active
    if not 0 <= active < len(steps):
        raise ValueError(f"active must be in [0, {len(steps)}), got {active}")
    D = data["config"].get("head_dim")
    n_seeds = len({r["seed"] for r in runs})
    summaries = [recall_summary(data, s) for s in steps]
    shown = [m for m in mixers if m in summaries[-1]]

    fig = go.Figure()
    for m in shown:
        fig.add_trace(go.Scatter(
            x=pairs, mode="lines+markers", name=MIXER_LABELS.get(m, m),
            line=dict(color=COLORS.get(m), width=2), marker=dict(size=8),
            error_y=dict(type="data", symmetric=False, thickness=1.5, width=5),
            hovertemplate="%{text}<extra></extra>"))
    fig.add_trace(go.Scatter(x=pairs, y=[100 / P for P in pairs], mode="lines",
                             name="1/P: a value of the sequence, guessed",
                             line=dict(color="#888", dash="dot", width=1.5),
                             hovertemplate="P = %{x}: guessing among the P values scores %{y:.1f}%"
                                           "<extra></extra>"))
    style(fig, title="", x_title="key-value pairs per sequence, P (log scale)",
          y_title="held-out accuracy (%)", height=500)
    lo, hi = math.log10(min(pairs)), math.log10(max(pairs))
    pad = 0.08 * (hi - lo) if hi > lo else 0.3
    fig.update_xaxes(type="log", tickvals=pairs, ticktext=[str(P) for P in pairs],
                     range=[lo - pad, hi + pad])
    fig.update_yaxes(range=[0, 104])
    if D:  # on a log axis, annotations take log10 coordinates (shapes take data values)
        fig.add_vline(x=D, line=dict(color="#555", dash="dash", width=1))
        fig.add_annotation(x=math.log10(D), y=30, xref="x", yref="y", xanchor="left",
                           yanchor="middle", showarrow=False, text=f" P = D = {D}",
                           font=dict(size=12, color="#555"))
    fig.update_layout(margin=dict(t=150))

    def step_data(summary):
        ys, plus, minus, texts = [], [], [], []
        for m in shown:
            s = summary[m]
            ys.append([100 * s[P]["mean"] for P in pairs])
            plus.append([100 * (s[P]["max"] - s[P]["mean"]) for P in pairs])
            minus.append([100 * (s[P]["mean"] - s[P]["min"]) for P in pairs])
            texts.append([f"{MIXER_LABELS.get(m, m)}, P = {P}: {100 * s[P]['mean']:.1f}% "
                          f"(seeds: {', '.join(f'{100 * a:.1f}' for a in s[P]['seeds'])})"
                          for P in pairs])
        return {"y": ys, "error_y.array": plus, "error_y.arrayminus": minus, "text": texts}

    def title(step):
        return (f"MQAR after {step:,} of {steps[-1]:,} training steps: accuracy on held-out "
                f"sequences<br><sup>mean of {n_seeds} seed{'s' if n_seeds != 1 else ''}; "
                f"bars span the lowest to the highest seed</sup>")

    slider_steps = [Step(label=f"{s:,}", data=step_data(summary), layout={"title.text": title(s)},
                         traces=list(range(len(shown))))
                    for s, summary in zip(steps, summaries)]
    if len(steps) == 1:  # nothing to slide through
        for attr, values in slider_steps[0].data.items():
            for trace, value in zip(fig.data, values):
                trace[attr] = value
        fig.update_layout(title_text=title(steps[0]))
        return fig
    return add_slider(fig, slider_steps, prefix="training step: ", active=active)


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` values (shorter at the start)."""
    check_positive_int(window, "window")
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def recall_loss_curves(data: Mapping, active: int = 0, window: int = 10) -> go.Figure:
    """Training loss against step on the ``P``-pair batches, one line per mixer (mean over seeds).

    The sweep trains one model on all pair counts in turn, so the loss at step ``s`` belongs to
    the task ``s mod (number of tasks)``; the slider picks the task. The curves are smoothed with
    a trailing mean over ``window`` of that task's steps; the y axis is logarithmic.
    """
    mixers, pairs, runs = _check(data)
    if not 0 <= active < len(pairs):
        raise ValueError(f"active must be in [0, {len(pairs)}), got {active}")
    shown = [m for m in mixers if any(r["mixer"] == m for r in runs)]
    fig = go.Figure()
    for m in shown:
        fig.add_trace(go.Scatter(mode="lines", name=MIXER_LABELS.get(m, m),
                                 line=dict(color=COLORS.get(m), width=2),
                                 hovertemplate=f"{MIXER_LABELS.get(m, m)}, step %{{x}}: "
                                               "loss %{y:.3g}<extra></extra>"))
    style(fig, title="", x_title="training step",
          y_title="training loss (nats, log scale)", height=520)
    fig.update_yaxes(type="log")
    fig.update_layout(margin=dict(t=130))

    n = len(pairs)
    steps = []
    for i, P in enumerate(pairs):
        xs, ys = [], []
        for m in shown:
            curves = [r["losses"][i::n] for r in runs if r["mixer"] == m]
            length = min(len(c) for c in curves)
            mean = [statistics.fmean(c[j] for c in curves) for j in range(length)]
            xs.append(list(range(i + 1, i + 1 + n * length, n)))
            ys.append([round(y, 5) for y in smooth(mean, window)])
        steps.append(Step(label=str(P), data={"x": xs, "y": ys},
                          layout={"title.text": f"Training loss on the {P}-pair sequences "
                                                f"(mean over seeds, smoothed)"},
                          traces=list(range(len(shown)))))
    return add_slider(fig, steps, prefix="key-value pairs P: ", active=active)


def recall_run(result, reference: Mapping[int, float] | None = None,
               window: int | None = None) -> go.Figure:
    """One training run (a :class:`gpt2k3.experiments.recall.TrainResult`): its held-out accuracy per number
    of pairs (left), next to the sweep's for the same run if ``reference`` (``{P: accuracy}``) is
    given, and its training loss (right, log scale), smoothed over ``window`` steps (default five
    rounds of the tasks, so that the alternating pair counts average out)."""
    from plotly.subplots import make_subplots

    pairs = sorted(result.accuracy)
    if not pairs or not result.losses:
        raise ValueError("result must hold a finished run (accuracy and losses)")
    label = MIXER_LABELS.get(result.mixer, result.mixer)
    color = COLORS.get(result.mixer, PALETTE[0])
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14)
    fig.add_trace(go.Scatter(x=pairs, y=[100 * result.accuracy[P] for P in pairs],
                             mode="lines+markers", name=f"{label}: this run",
                             line=dict(color=color, width=2), marker=dict(size=9),
                             hovertemplate="P = %{x}: %{y:.1f}%<extra>this run</extra>"), 1, 1)
    if reference:
        fig.add_trace(go.Scatter(x=pairs, y=[100 * reference[P] for P in pairs], mode="markers",
                                 name="the sweep, same run", marker=dict(symbol="x", size=11,
                                                                         color="#333"),
                                 hovertemplate="P = %{x}: %{y:.1f}%<extra>sweep</extra>"), 1, 1)
    steps = len(result.losses)
    window = 5 * len(result.tasks) if window is None else window
    fig.add_trace(go.Scatter(x=list(range(1, steps + 1)), y=smooth(result.losses, window),
                             mode="lines", name="training loss (all tasks, smoothed)",
                             line=dict(color=color, width=1.5),
                             hovertemplate="step %{x}: loss %{y:.3g}<extra></extra>"), 1, 2)
    done = result.history[-1][0]
    style(fig, title=(f"{label}, seed {result.seed}: {done:,} training steps in "
                      f"{result.seconds:.1f} s"),
          x_title="key-value pairs per sequence, P (log scale)", y_title="held-out accuracy (%)",
          height=440)
    lo, hi = math.log10(min(pairs)), math.log10(max(pairs))
    pad = 0.08 * (hi - lo) if hi > lo else 0.3
    fig.update_xaxes(type="log", tickvals=pairs, ticktext=[str(P) for P in pairs],
                     range=[lo - pad, hi + pad], row=1, col=1)
    fig.update_yaxes(range=[0, 104], row=1, col=1)
    fig.update_xaxes(title_text="training step", row=1, col=2)
    fig.update_yaxes(title_text="training loss (nats, log scale)", type="log", row=1, col=2)
    fig.update_layout(margin=dict(t=120))
    return fig
