"""Chapter 1 (GPT-2): where the parameters live; the waste of decoding without a cache."""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go

from gpt2k3.accounting import COMPONENTS, ArchSpec, count_params
from gpt2k3.archs import GPT2_FAMILY
from gpt2k3.book.figures._style import PALETTE, Step, add_slider, style

__all__ = ["param_breakdown", "decode_waste", "decode_waste_counts"]


def param_breakdown(specs: Sequence[ArchSpec] = GPT2_FAMILY, active: int = 0) -> go.Figure:
    """Where a model's parameters live: one bar per component (log scale), a slider over ``specs``."""
    specs = list(specs)
    if not specs:
        raise ValueError("specs must hold at least one ArchSpec")
    counts = [count_params(s) for s in specs]
    names = list(COMPONENTS)

    def texts(c):
        return [f"{c.breakdown[n]:,} ({100 * c.breakdown[n] / c.total:.2f}%)" for n in names]

    def values(c):  # a zero (tied head) cannot sit on a log axis: leave the bar out
        return [c.breakdown[n] if c.breakdown[n] > 0 else None for n in names]

    fig = go.Figure(go.Bar(
        x=values(counts[0]), y=names, orientation="h", marker_color=PALETTE[0],
        text=texts(counts[0]), textposition="outside", cliponaxis=False,
        hovertemplate="%{y}: %{text}<extra></extra>",
    ))
    style(fig, title="", x_title="parameters (log scale)", y_title="component")
    hi = max(max(c.breakdown.values()) for c in counts)
    fig.update_xaxes(type="log", range=[2, len(str(hi)) + 0.6])
    fig.update_yaxes(autorange="reversed")

    def title(s, c):
        return (f"{s.name}: {c.total:,} parameters "
                f"(L={s.n_layer}, heads={s.n_head}, d={s.n_embd}, vocab={s.vocab_size:,})")

    if len(specs) == 1:
        fig.update_layout(title_text=title(specs[0], counts[0]))
        return fig
    steps = [Step(label=s.name, data={"x": [values(c)], "text": [texts(c)]},
                  layout={"title.text": title(s, c)})
             for s, c in zip(specs, counts)]
    return add_slider(fig, steps, prefix="model: ", active=active)


def decode_waste_counts(prompt_len: int, n_new: int) -> dict[str, list[int]]:
    """Token positions pushed through the model when generating ``n_new`` tokens with no cache.

    Step ``n`` (1-based) runs the whole sequence so far, ``prompt_len + n - 1``
    positions, and keeps the logits of one.  Returns per-step ``computed`` and
    ``used`` and their running totals; the total computed is quadratic in
    ``n_new``, the total used linear.  ``needed``/``total_needed`` are what a decoder with a
    cache runs: the prompt once (step 1, the one pass it cannot skip), then one position per
    step, ``prompt_len + n - 1`` in all after ``n`` steps.
    """
    if not isinstance(prompt_len, int) or prompt_len < 1:
        raise ValueError(f"prompt_len must be an int >= 1, got {prompt_len!r}")
    if not isinstance(n_new, int) or n_new < 1:
        raise ValueError(f"n_new must be an int >= 1, got {n_new!r}")
    computed = [prompt_len + n - 1 for n in range(1, n_new + 1)]
    used = [1] * n_new
    needed = [prompt_len] + [1] * (n_new - 1)
    total_needed = [prompt_len + n - 1 for n in range(1, n_new + 1)]
    cum_c, cum_u, tc, tu = [], [], 0, 0
    for c, u in zip(computed, used):
        tc, tu = tc + c, tu + u
        cum_c.append(tc)
        cum_u.append(tu)
    return {"step": list(range(1, n_new + 1)), "computed": computed, "used": used,
            "total_computed": cum_c, "total_used": cum_u, "needed": needed,
            "total_needed": total_needed}


def decode_waste(prompt_len: int = 8, lengths: Sequence[int] = (8, 16, 32, 64, 128, 256),
                 active: int = 0) -> go.Figure:
    """Decoding without a cache: per step, positions recomputed vs the one position used,
    and the running totals (quadratic vs linear); a slider over the generated length."""
    lengths = list(lengths)
    if not lengths or any(not isinstance(n, int) or n < 1 for n in lengths):
        raise ValueError(f"lengths must be positive ints, got {lengths!r}")
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12)
    fig.add_trace(go.Bar(name="recomputed (result thrown away)", marker_color=PALETTE[1],
                         hovertemplate="step %{x}: %{y} positions recomputed<extra></extra>"), 1, 1)
    fig.add_trace(go.Bar(name="new position (the one used)", marker_color=PALETTE[0],
                         hovertemplate="step %{x}: 1 position used<extra></extra>"), 1, 1)
    fig.add_trace(go.Scatter(name="total computed, no cache", mode="lines", line_color=PALETTE[1],
                             hovertemplate="after %{x} tokens: %{y:,} positions computed<extra></extra>"),
                  1, 2)
    fig.add_trace(go.Scatter(name="total needed (with a cache)", mode="lines", line_color=PALETTE[0],
                             hovertemplate="after %{x} tokens: %{y:,} positions needed (the prompt once, "
                             "then one per token)<extra></extra>"),
                  1, 2)
    style(fig, title="", x_title="decode step", y_title="positions run at this step", height=500)
    fig.update_layout(barmode="stack", margin=dict(t=160))
    fig.update_xaxes(title_text="tokens generated", row=1, col=2)
    fig.update_yaxes(title_text="running total of positions (log scale)", type="log", row=1, col=2)
    steps = []
    for n in lengths:
        c = decode_waste_counts(prompt_len, n)
        recomputed = [x - 1 for x in c["computed"]]
        waste = 1 - c["total_needed"][-1] / c["total_computed"][-1]
        steps.append(Step(
            label=str(n),
            data={"x": [c["step"], c["step"], c["step"], c["step"]],
                  "y": [recomputed, c["used"], c["total_computed"], c["total_needed"]]},
            layout={"title.text": (f"{n} tokens after a prompt of {prompt_len}, no cache:<br>"
                                   f"{c['total_computed'][-1]:,} positions computed, "
                                   f"{c['total_needed'][-1]:,} needed with a cache "
                                   f"({100 * waste:.1f}% wasted)")}))
    return add_slider(fig, steps, prefix="tokens generated: ", active=active)
