"""The house style shared by every explorable figure (see :mod:`gpt2k3.book.figures`).

:func:`style` sets the look (template, fonts, margins, labelled axes), :func:`add_slider`
turns a list of :class:`Step` values into a plotly slider whose steps carry their data.

That is the figure Jupyter and Colab draw.  The web book draws the same figure through its
figure frame (``book/_static/figures.js``, fed by :mod:`gpt2k3.book.sphinx`), which fits it to
the reader's screen and theme for every figure alike: the title (updated by each slider step)
becomes the figure's caption, the legend a row of buttons and each slider a keyboard-movable
range control, all HTML that wraps at any width; on a phone the panels stack; margins grow
until every label fits; colours follow light or dark mode.  So a figure here needs no margins
or title lengths of its own for the web: a long title is fine (it is a caption there), and an
axis title longer than its axis is broken into lines.

Colours are chosen for a white page; the frame adapts them to a dark one.  A label's colour
(an annotation, text on a trace) is mixed toward the theme's text colour until it reads at
4.5:1 contrast or better (a grey reference label such as ``#555`` sits at 2.4:1 on the dark
page otherwise), and a colour scale keeps its hues with its lightness mirrored, so a heatmap's
zero cells take the page's colour instead of staying white.  The browser test checks both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import plotly.graph_objects as go

from gpt2k3.book.display import sig

__all__ = ["Step", "style", "add_slider", "round_data", "PALETTE", "DATA_DIGITS"]

#: Significant digits kept in a figure's data.  A figure is stored in its notebook and
#: compared on every reader's machine (nbval), so it carries no more digits than a float
#: computation guarantees everywhere; no plot can show more anyway.
DATA_DIGITS = 6


def _sig(x: float, digits: int) -> float:
    """``x`` at ``digits`` significant digits (:func:`gpt2k3.book.display.sig`); whole numbers that
    a float holds exactly, zeros and non-finite values are kept as they are."""
    if x != x or x in (float("inf"), float("-inf")) or (float(x).is_integer() and abs(x) < 2**53):
        return x
    return sig(x, digits)


def round_data(obj: Any, digits: int = DATA_DIGITS) -> Any:
    """``obj`` (numbers, lists, tuples, dicts of them) with every float at ``digits`` significant digits."""
    if isinstance(obj, bool) or isinstance(obj, int) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, float):
        return _sig(obj, digits)
    if isinstance(obj, dict):
        return {k: round_data(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        values = [round_data(v, digits) for v in obj]
        floats = [abs(v) for v in values if isinstance(v, float) and v == v and abs(v) != float("inf")]
        if floats and len(floats) == len(values):
            # a series' values below 1e-12 of its largest (and below 1e-9) are rounding noise of
            # an exact zero (their digits differ between machines): store them as 0
            floor = min(1e-12 * max(floats), 1e-9)
            values = [0.0 if abs(v) < floor else v for v in values]
        return values
    if hasattr(obj, "tolist"):  # numpy arrays and scalars
        return round_data(obj.tolist(), digits)
    return obj


def _round_traces(fig: go.Figure) -> None:
    for trace in fig.data:
        for attr in ("x", "y", "z", "customdata"):
            value = getattr(trace, attr, None) if attr in trace else None
            if value is not None:
                trace[attr] = round_data(value)
        err = getattr(trace, "error_y", None) if "error_y" in trace else None
        if err is not None:
            for attr in ("array", "arrayminus"):
                if err[attr] is not None:
                    err[attr] = round_data(err[attr])

#: Colours used consistently across the book (colour-blind-safe, Okabe-Ito).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")


def style(fig: go.Figure, *, title: str, x_title: str, y_title: str, height: int = 440) -> go.Figure:
    """Apply the book's house style in place and return ``fig``.

    Trace data already in the figure is rounded to :data:`DATA_DIGITS` significant digits.
    """
    _round_traces(fig)
    fig.update_layout(
        template="plotly_white",
        title=dict(text=title, x=0.02, xanchor="left", y=1.0, yanchor="top", yref="container",
                   pad=dict(t=14), font=dict(size=16)),
        height=height,
        margin=dict(l=70, r=30, t=110, b=60),
        font=dict(family="Inter, Helvetica, Arial, sans-serif", size=13),
        hoverlabel=dict(namelength=-1),
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0.0),
    )
    fig.update_xaxes(title_text=x_title, showline=True, linecolor="#888", mirror=False)
    fig.update_yaxes(title_text=y_title, showline=True, linecolor="#888", mirror=False)
    return fig


@dataclass
class Step:
    """One slider position: per-trace data updates and layout updates.

    ``data`` maps a trace attribute (``"x"``, ``"y"``, ``"text"``, ...) to a list with one
    entry per trace the step touches (``traces`` names them; all traces by default).
    """

    label: str
    data: dict[str, list[Any]]
    layout: dict[str, Any] = field(default_factory=dict)
    traces: Sequence[int] | None = None


def add_slider(fig: go.Figure, steps: Sequence[Step], *, prefix: str, active: int = 0,
               pad_top: int = 55) -> go.Figure:
    """Add a slider whose steps restyle the figure; the figure first shows ``steps[active]``.

    The figure's traces must already exist; the active step's data is applied to
    them so the initial view and the slider agree.  ``pad_top`` is the gap in pixels
    between the plot and the slider (more for rotated tick labels).
    """
    if not steps:
        raise ValueError("steps must not be empty")
    if not 0 <= active < len(steps):
        raise ValueError(f"active must be in [0, {len(steps)}), got {active}")
    steps = [Step(label=s.label, data=round_data(s.data), layout=s.layout, traces=s.traces) for s in steps]
    first = steps[active]
    for attr, values in first.data.items():
        for i, value in zip(first.traces or range(len(fig.data)), values):
            fig.data[i][attr] = value
    fig.update_layout(first.layout)
    slider_steps = []
    for s in steps:
        args: list[Any] = [s.data, s.layout]
        if s.traces is not None:
            args.append(list(s.traces))
        slider_steps.append(dict(method="update", label=s.label, args=args))
    fig.update_layout(
        sliders=[dict(active=active, steps=slider_steps, pad=dict(t=pad_top, b=10),
                      currentvalue=dict(prefix=prefix, font=dict(size=13)))],
        margin=dict(b=85 + pad_top),
    )
    return fig


