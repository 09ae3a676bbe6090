"""Chapter 11 (does it still write?): every mixer as a byte-level language model.

The builders read the results of ``benchmarks/text_lm.py`` (a dict as in
``benchmarks/results/text_lm.json``); nothing is trained here. :func:`text_summary` and
:func:`text_table` summarise the runs over seeds; :func:`text_curves`,
:func:`text_position_loss` and :func:`text_memory` are the explorable figures (sliders over the
models, the evaluation length, the context); :func:`text_samples_html` lays the samples side
by side; :func:`text_run` draws one live run next to the recorded one.
"""

from __future__ import annotations

import html
import math
import statistics
from typing import Mapping, Sequence

import plotly.graph_objects as go
from IPython.display import HTML

from gpt2k3.book.display import fmt_bytes
from gpt2k3.book.figures._style import PALETTE, Step, add_slider, style
from gpt2k3.checks import check_int, check_positive_int, is_int
from gpt2k3.experiments.text_lm import MIXER_LABELS, MIXERS

__all__ = ["COLORS", "text_summary", "text_table", "text_models_table", "position_mean",
           "text_curves", "text_position_loss", "text_memory", "text_samples_html", "text_run",
           "spread", "restart_effect", "throughput_sessions", "MIXER_CONV"]

#: How each model's short convolution is placed, for the models table (the differences matter
#: when the softmax + conv and linear + conv models are compared with the delta family).
MIXER_CONV = {
    "softmax": "none",
    "softmax_conv": "on the block's input, shared by q, k, v; starts as identity; no SiLU",
    "linear": "on the block's input, shared by q, k, v; starts as identity; no SiLU",
    "deltanet": "on q, k, v separately, after projection; SiLU; random start",
    "gated_deltanet": "on q, k, v separately, after projection; SiLU; random start",
    "kda": "on q, k, v separately, after projection; SiLU; random start",
    "hybrid": "KDA layers as KDA; attention layer none",
    "k3": "KDA layers as KDA; MLA layer none",
}

#: One colour per model, the same in every figure of the chapter.
COLORS = dict(zip(MIXERS, PALETTE))


def _check(data: Mapping) -> tuple[dict, list[str], list[dict]]:
    try:
        config, runs = data["config"], data["runs"]
        mixers = list(config["mixers"])
        config["lengths"], config["model"]["context"]
    except (KeyError, TypeError) as err:
        raise ValueError(f"data must be the results of benchmarks/text_lm.py (missing {err})") from None
    if not runs:
        raise ValueError("data holds no finished runs")
    shown = [m for m in mixers if any(r["mixer"] == m for r in runs)]
    return config, shown, list(runs)


def _label(config: Mapping, mixer: str) -> str:
    return config.get("labels", {}).get(mixer, MIXER_LABELS.get(mixer, mixer))


def spread(values: Sequence[float]) -> dict:
    """``{"mean", "min", "max", "half_range", "seeds"}`` of per-seed values (``half_range``:
    half the distance between the lowest and the highest, 0 for one seed)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("values must not be empty")
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "half_range": (max(values) - min(values)) / 2, "seeds": values}


def _runs_of(runs, mixer):
    return sorted((r for r in runs if r["mixer"] == mixer), key=lambda r: r["seed"])


def text_summary(data: Mapping) -> dict[str, dict]:
    """Per model, over its seeds: ``val_bits`` (:func:`spread` of the validation bits per byte at
    the training length), ``length_bits[l]`` (at each evaluation length; ``None`` where the model
    cannot run), ``tokens_per_second`` (training bytes per second), ``decode_bytes[l]`` (cache
    bytes per sequence after ``l`` bytes, the same for every seed), ``params`` and ``seeds``."""
    config, shown, runs = _check(data)
    out = {}
    for m in shown:
        mine = _runs_of(runs, m)
        lengths = {}
        for length in config["lengths"]:
            vals = [r["length_bits"][str(length)] for r in mine]
            lengths[length] = None if any(v is None for v in vals) else spread(vals)
        out[m] = {"val_bits": spread([r["val_bits"] for r in mine]), "length_bits": lengths,
                  "tokens_per_second": spread([r["tokens_per_second"] for r in mine]),
                  "decode_bytes": {int(k): v for k, v in mine[0]["decode_bytes"].items()},
                  "params": mine[0]["params"], "seeds": [r["seed"] for r in mine]}
    return out


def _pm(s: dict | None, digits: int = 3) -> str:
    if s is None:
        return "cannot run"
    return f"{s['mean']:.{digits}f} ± {s['half_range']:.{digits}f}"


def text_table(data: Mapping) -> tuple[list[str], list[list]]:
    """Headers and rows for :func:`gpt2k3.book.display.md_table`: parameters, validation bits per
    byte at each evaluation length (mean ± half the spread over seeds), training throughput
    (the lowest to the highest seed: runs on a shared machine differ by several times) and the cache per sequence at the shortest and longest length."""
    config, shown, _ = _check(data)
    summary = text_summary(data)
    lengths = config["lengths"]
    context = config["model"]["context"]
    headers = ["model", "parameters (active)",
               *[f"bits/byte at {n:,}" + (" (trained)" if n == context else f" ({n // context}×)")
                 for n in lengths],
               "training bytes/s (seeds: lowest–highest)", f"cache at {lengths[0]:,}", f"cache at {lengths[-1]:,}"]
    rows = []
    for m in shown:
        s = summary[m]
        p = s["params"]
        params = f"{p['total']:,}" + (f" ({p['active']:,})" if p["active"] != p["total"] else "")
        cache = [fmt_bytes(s["decode_bytes"][n]) if s["decode_bytes"].get(n) is not None
                 else "cannot run" for n in (lengths[0], lengths[-1])]
        rows.append([_label(config, m), params, *[_pm(s["length_bits"][n]) for n in lengths],
                     f"{s['tokens_per_second']['min']:,.0f}–{s['tokens_per_second']['max']:,.0f}", *cache])
    return headers, rows


def text_models_table(data: Mapping) -> tuple[list[str], list[list]]:
    """Headers and rows for :func:`gpt2k3.book.display.md_table`: every model's token mixer per layer
    (built afresh from the results' settings, :func:`gpt2k3.experiments.text_lm.mixer_names`), positions,
    where its short convolution sits (:data:`MIXER_CONV`), MLP
    width (the experts' and the dense layer's for K3), total and active parameters."""
    from gpt2k3.experiments.text_lm import TextModelConfig, build_model, mixer_names

    config, _, _ = _check(data)
    try:
        models = data["models"]
        cfg = TextModelConfig(**config["model"])
    except (KeyError, TypeError) as err:
        raise ValueError(f"data must be the results of benchmarks/text_lm.py (missing {err})") from None
    rows = []
    for m in config["mixers"]:
        names = mixer_names(build_model(m, cfg, sizes=models[m]["sizes"]))
        layers = f"{names[0]} × {len(names)}" if len(set(names)) == 1 else ", ".join(names)
        sizes = models[m]["sizes"]
        width = (f"experts {sizes['d_expert']}, dense {sizes['d_ff']}" if "d_expert" in sizes
                 else str(sizes.get("mlp_hidden", 4 * cfg.n_embd)))
        positions = "learned table" if models[m]["position"] == "learned" else "none (NoPE)"
        rows.append([_label(config, m), layers, positions, MIXER_CONV.get(m, "?"), width,
                     models[m]["params"]["total"],
                     models[m]["params"]["active"]])
    return ["model", "token mixer per layer", "positions", "short convolution", "MLP width",
            "parameters", "active"], rows


def position_mean(data: Mapping, mixer: str, length: int, lo: int, hi: int) -> float:
    """``mixer``'s bits per byte at evaluation length ``length`` over positions ``[lo, hi)``: the
    mean over seeds of each position bin, then over the bins lying inside ``[lo, hi)``."""
    config, _, runs = _check(data)
    bins = config["bins"].get(str(length))
    mine = [r["position_bits"].get(str(length)) for r in runs if r["mixer"] == mixer]
    if bins is None or not mine or any(v is None for v in mine):
        raise ValueError(f"the results hold no per-position loss of {mixer!r} at length {length!r}")
    picked = [i for i, (a, b) in enumerate(bins) if a >= lo and b <= hi]
    if not picked:
        raise ValueError(f"no position bin lies inside [{lo}, {hi}) at length {length}")
    return statistics.fmean(statistics.fmean(v[i] for v in mine) for i in picked)


def text_curves(data: Mapping, active: int = 0) -> go.Figure:
    """Validation bits per byte against the bytes trained on, one line per model (mean over
    seeds; the bars span the lowest to the highest seed). Dotted lines mark the byte bigram and
    trigram tables of the results' ``baselines``, if recorded. The slider brings one model to
    the front (``active`` 0: every model alike)."""
    config, shown, runs = _check(data)
    if not 0 <= active <= len(shown):
        raise ValueError(f"active must be in [0, {len(shown)}], got {active}")
    per_step = config["train"]["batch_size"] * config["model"]["context"]
    fig = go.Figure()
    for m in shown:
        mine = _runs_of(runs, m)
        steps = [p["step"] for p in mine[0]["curve"]]
        points = [[r["curve"][i]["bits"] for r in mine] for i in range(len(steps))]
        x = [s * per_step for s in steps]
        fig.add_trace(go.Scatter(
            x=x, y=[statistics.fmean(p) for p in points], mode="lines+markers",
            name=_label(config, m), line=dict(color=COLORS.get(m), width=2), marker=dict(size=6),
            error_y=dict(type="data", symmetric=False, thickness=1, width=3,
                         array=[max(p) - statistics.fmean(p) for p in points],
                         arrayminus=[statistics.fmean(p) - min(p) for p in points]),
            hovertemplate=f"{_label(config, m)}: %{{y:.3f}} bits/byte after %{{x:,}} bytes"
                          "<extra></extra>"))
    style(fig, title="", x_title="training bytes seen", y_title="validation bits per byte",
          height=520)
    first = [t.y[1] for t in fig.data if len(t.y) > 1]
    top = max(first) if first else 8.0
    low = min(min(t.y) for t in fig.data)
    fig.update_yaxes(range=[round(max(0.0, low - 0.15), 3), round(top + 0.2, 3)])
    fig.update_layout(margin=dict(t=130))
    for name, value in (data.get("baselines") or {}).items():
        if name in ("bigram", "trigram"):  # what knowing only the last one or two bytes is worth
            fig.add_hline(y=value, line=dict(color="#888", dash="dot", width=1))
            fig.add_annotation(x=1.0, xref="paper", xanchor="right", y=value, yanchor="bottom",
                               showarrow=False, text=f"{name} table {value:.2f}",
                               font=dict(size=11, color="#666"))
    n = len(shown)
    steps = [Step(label="every model", data={"opacity": [1.0] * n, "line.width": [2] * n},
                  layout={"title.text": "Validation bits per byte during training "
                                        "(mean over seeds; bars: lowest to highest seed)"})]
    for i, m in enumerate(shown):
        steps.append(Step(label=_label(config, m),
                          data={"opacity": [1.0 if j == i else 0.2 for j in range(n)],
                                "line.width": [4 if j == i else 1.5 for j in range(n)]},
                          layout={"title.text": f"{_label(config, m)}: validation bits per byte "
                                                "during training"}))
    return add_slider(fig, steps, prefix="in front: ", active=active)


def _bin_x(bins: Sequence[Sequence[int]]) -> list[float]:
    """A position to plot each bin at: the geometric middle of its first and last position + 1."""
    return [math.sqrt((lo + 1) * hi) for lo, hi in bins]


def text_position_loss(data: Mapping, active: int = 0) -> go.Figure:
    """Bits per byte against the position in the window (log scale), one line per model, mean
    over seeds, on the same held-out bytes at every evaluation length; the slider picks the
    length (``active``: its index). A dashed line marks the training length; models that
    cannot run at a length (a learned position table) have no line there."""
    config, shown, runs = _check(data)
    lengths = config["lengths"]
    context = config["model"]["context"]
    if not 0 <= active < len(lengths):
        raise ValueError(f"active must be in [0, {len(lengths)}), got {active}")
    fig = go.Figure()
    for m in shown:
        fig.add_trace(go.Scatter(mode="lines+markers", name=_label(config, m),
                                 line=dict(color=COLORS.get(m), width=2), marker=dict(size=5),
                                 hovertemplate="%{text}<extra></extra>"))
    style(fig, title="", x_title="position in the window (bytes of context before, log scale)",
          y_title="bits per byte", height=520)
    fig.update_xaxes(type="log", range=[-0.05, round(math.log10(lengths[-1]) + 0.05, 6)])
    fig.add_vline(x=context, line=dict(color="#555", dash="dash", width=1))
    fig.add_annotation(x=round(math.log10(context), 6), y=1.0, yref="paper", xanchor="right",
                       yanchor="bottom", showarrow=False, text=f"training length {context} ",
                       font=dict(size=12, color="#555"))
    fig.update_layout(margin=dict(t=130))
    steps = []
    for length in lengths:
        bins = config["bins"][str(length)]
        xs, ys, texts = [], [], []
        for m in shown:
            mine = [r["position_bits"][str(length)] for r in _runs_of(runs, m)]
            if any(v is None for v in mine):
                xs.append([]), ys.append([]), texts.append([])
                continue
            mean = [statistics.fmean(v[i] for v in mine) for i in range(len(bins))]
            xs.append(_bin_x(bins))
            ys.append(mean)
            texts.append([f"{_label(config, m)}: {y:.3f} bits/byte at positions {lo}–{hi - 1}"
                          for y, (lo, hi) in zip(mean, bins)])
        missing = [_label(config, m) for m, y in zip(shown, ys) if not y]
        note = f"; {', '.join(missing)}: cannot run (no position past {context})" if missing else ""
        steps.append(Step(label=f"{length:,}" + (" (trained)" if length == context
                                                  else f" ({length // context}×)"),
                          data={"x": xs, "y": ys, "text": texts},
                          layout={"title.text": f"Loss by position in windows of {length:,} "
                                                f"bytes<br><sup>mean over seeds{note}</sup>"}))
    return add_slider(fig, steps, prefix="evaluation length: ", active=active)


def text_memory(data: Mapping, active: int = 0) -> go.Figure:
    """What each model keeps per sequence against how well it writes: cache bytes after ``l``
    bytes of context (log scale) and the validation bits per byte at that length, one marker
    per model (mean over seeds; bars: lowest to highest). The slider picks ``l``."""
    config, shown, _ = _check(data)
    lengths = config["lengths"]
    if not 0 <= active < len(lengths):
        raise ValueError(f"active must be in [0, {len(lengths)}), got {active}")
    summary = text_summary(data)
    fig = go.Figure()
    for m in shown:
        fig.add_trace(go.Scatter(mode="markers", name=_label(config, m),
                                 marker=dict(color=COLORS.get(m), size=13),
                                 error_y=dict(type="data", symmetric=False, thickness=1.5, width=4),
                                 hovertemplate="%{text}<extra></extra>"))
    style(fig, title="", x_title="cache per sequence (bytes, float32, log scale)",
          y_title="validation bits per byte", height=500)
    fig.update_xaxes(type="log")
    fig.update_layout(margin=dict(t=130))
    steps = []
    for length in lengths:
        xs, ys, plus, minus, texts = [], [], [], [], []
        for m in shown:
            s, nbytes = summary[m]["length_bits"][length], summary[m]["decode_bytes"].get(length)
            if s is None or nbytes is None:
                for lst in (xs, ys, plus, minus, texts):
                    lst.append([])
                continue
            xs.append([nbytes])
            ys.append([s["mean"]])
            plus.append([s["max"] - s["mean"]])
            minus.append([s["mean"] - s["min"]])
            texts.append([f"{_label(config, m)}: {s['mean']:.3f} bits/byte, keeps "
                          f"{fmt_bytes(nbytes)} per sequence after {length:,} bytes"])
        steps.append(Step(label=f"{length:,}", data={"x": xs, "y": ys, "error_y.array": plus,
                                                     "error_y.arrayminus": minus, "text": texts},
                          layout={"title.text": f"Cache per sequence against bits per byte, "
                                                f"after {length:,} bytes of context"}))
    return add_slider(fig, steps, prefix="context: ", active=active)


def text_samples_html(data: Mapping, seed: int = 0, columns: int = 2) -> HTML:
    """The samples of every model for one ``seed`` side by side (``columns`` per row): same
    prompt, temperature and generator seed, so only the model differs."""
    config, shown, runs = _check(data)
    check_positive_int(columns, "columns")
    cells = []
    for m in shown:
        run = next((r for r in runs if r["mixer"] == m and r["seed"] == seed), None)
        if run is None or "sample" not in run:
            raise ValueError(f"the results hold no sample of {m!r} with seed={seed!r}")
        s = run["sample"]
        cells.append(
            f'<div style="border:1px solid #ddd;border-radius:6px;padding:8px 10px">'
            f'<div style="font-weight:600;color:{COLORS.get(m, "#333")}">'
            f'{html.escape(_label(config, m))}</div>'
            f'<pre style="white-space:pre-wrap;margin:4px 0 0 0;font-size:12px">'
            f'<b>{html.escape(s["prompt"])}</b>{html.escape(s["text"])}</pre></div>')
    grid = (f'<div style="display:grid;grid-template-columns:repeat({columns},minmax(0,1fr));'
            f'gap:10px">{"".join(cells)}</div>')
    return HTML(grid)


def text_run(run, reference: Mapping | None = None, per_step: int | None = None) -> go.Figure:
    """One live training run (a :class:`gpt2k3.experiments.text_lm.TextRun`): its training bits per byte
    at every step and its validation points, next to the recorded run's validation points
    (``reference``: a run record of the results file, same model and seed) if given."""
    if not getattr(run, "losses", None):
        raise ValueError("run must be a finished gpt2k3.experiments.text_lm.TextRun")
    label = MIXER_LABELS.get(run.mixer, run.mixer)
    color = COLORS.get(run.mixer, PALETTE[0])
    per_step = per_step or run.tokens // len(run.losses)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[(i + 1) * per_step for i in range(len(run.losses))], y=run.losses,
                             mode="lines", name="training batches (this run)",
                             line=dict(color=color, width=1), opacity=0.5,
                             hovertemplate="%{y:.3f} bits/byte<extra>training</extra>"))
    fig.add_trace(go.Scatter(x=[s * per_step for s, _ in run.curve], y=[b for _, b in run.curve],
                             mode="lines+markers", name="validation (this run)",
                             line=dict(color=color, width=2.5), marker=dict(size=8),
                             hovertemplate="%{y:.3f} bits/byte<extra>this run</extra>"))
    if reference:
        pts = [p for p in reference["curve"] if p["step"] <= len(run.losses)]
        fig.add_trace(go.Scatter(x=[p["step"] * per_step for p in pts], y=[p["bits"] for p in pts],
                                 mode="markers", name="validation (recorded run, same seed)",
                                 marker=dict(symbol="x", size=11, color="#333"),
                                 hovertemplate="%{y:.3f} bits/byte<extra>recorded</extra>"))
    style(fig, title=f"{label}, seed {run.seed}: {run.tokens:,} training bytes in "
                     f"{run.train_seconds:.1f} s", x_title="training bytes seen",
          y_title="bits per byte", height=440)
    fig.update_yaxes(range=[0, 8.3])
    return fig


def restart_effect(data: Mapping, length: int | None = None, head: int = 32) -> dict[str, dict]:
    """How much of each model's change from the training length to ``length`` (default: the
    longest) fewer window restarts explain, from the stored per-position losses.

    Reading the same bytes in windows ``k = length / context`` times as long, ``k - 1`` of every
    ``k`` short windows no longer start afresh: their first ``head`` bytes, which a short window
    predicts from little context, get a long window's context instead. If a model used no more
    than ``head`` bytes of context, those bytes would cost its level over positions ``[head,
    context)`` and nothing else would change, so the change expected from the restarts alone is

    ``restart = -(k - 1) / k * sum_{t < head} (p(t) - q) / context``,

    with ``p(t)`` the per-position bits at the training length and ``q`` their mean over ``[head,
    context)``. ``measured`` is the change in bits per byte the results record; ``adjusted =
    measured - restart`` is what is left for the model's behaviour past the training length.
    Per model (those that can run at ``length``): ``measured``, ``restart``, ``adjusted``, each a
    :func:`spread` over the seeds. ``head`` must be a bin edge of the training length's bins."""
    config, shown, runs = _check(data)
    context = config["model"]["context"]
    length = max(config["lengths"]) if length is None else length
    check_int(length, "length", context + 1)
    if length not in config["lengths"]:
        raise ValueError(f"length must be one of the evaluation lengths above {context}, got {length!r}")
    bins = config["bins"].get(str(context))
    if bins is None:
        raise ValueError(f"the results hold no position bins at the training length {context}")
    edges = {a for a, _ in bins} | {b for _, b in bins}
    if not is_int(head) or not 0 < head < context or head not in edges:
        raise ValueError(f"head must be a bin edge in (0, {context}), one of {sorted(edges)}, got {head!r}")
    k = length // context
    out = {}
    for m in shown:
        measured, restart = [], []
        for r in _runs_of(runs, m):
            long, short, pos = (r["length_bits"].get(str(length)), r["length_bits"].get(str(context)),
                                r["position_bits"].get(str(context)))
            if long is None or short is None or pos is None:
                break
            total = {"head": 0.0, "tail": 0.0}
            for (a, b), p in zip(bins, pos):
                total["head" if b <= head else "tail"] += p * (b - a)
            q = total["tail"] / (context - head)
            restart.append(-(k - 1) / k * (total["head"] - head * q) / context)
            measured.append(long - short)
        else:
            if measured:
                out[m] = {"measured": spread(measured), "restart": spread(restart),
                          "adjusted": spread([a - b for a, b in zip(measured, restart)])}
    return out


def throughput_sessions(data: Mapping) -> dict:
    """Training bytes per second grouped by the session that timed them: ``{"main": {mixer:
    {seed: bytes/s}}, "rerun": {mixer: {seed: bytes/s}}, "load": {"main": .., "rerun": [..]}}``.
    The runs a later ``--update`` redid (the results' ``updates``) were timed in another session,
    under another load, so their bytes per second are not comparable with the main session's;
    within one session the runs of one seed ran back to back."""
    config, shown, runs = _check(data)
    redone = {m for u in data.get("updates", []) for m in u.get("mixers", [])}
    out = {"main": {}, "rerun": {}}
    for r in runs:
        side = "rerun" if r["mixer"] in redone else "main"
        out[side].setdefault(r["mixer"], {})[r["seed"]] = r["tokens_per_second"]
    out["load"] = {"main": data.get("machine", {}).get("load_average_1min_now"),
                   "rerun": [u.get("machine", {}).get("load_average_1min_now")
                             for u in data.get("updates", [])]}
    return out
