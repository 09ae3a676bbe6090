"""The live-explorer frame shared by every chapter's widgets (see :mod:`gpt2k3.book.widgets`)."""

from __future__ import annotations

import html
from typing import Callable, Mapping

import ipywidgets as W
from IPython import get_ipython

__all__ = ["Explorer", "explorer"]


class Explorer(W.VBox):
    """An ipywidgets box: controls on top, the rendered figure below.

    ``current`` holds what is shown now: the object ``render`` returned, or the
    message of the exception it raised -- a ``ValueError`` is shown as "not a valid
    setting", any other exception as "could not draw" with its type -- so an explorer
    never shows a stale or broken figure.
    """

    def __init__(self, controls: Mapping[str, W.ValueWidget], render: Callable[..., object],
                 title: str = ""):
        self.controls = dict(controls)
        self.render = render
        self.output = W.Output()
        self.current: object = None
        header = [W.HTML(f"<b>{title}</b>")] if title else []
        row = W.HBox(list(self.controls.values()), layout=W.Layout(flex_flow="row wrap"))
        super().__init__([*header, row, self.output])
        for w in self.controls.values():
            w.observe(self.redraw, names="value")
        self.redraw()

    def redraw(self, _change=None) -> None:
        values = {name: w.value for name, w in self.controls.items()}
        try:
            self.current = self.render(**values)
        except ValueError as err:
            self.current = W.HTML(f"<b>Not a valid setting:</b> {html.escape(str(err), quote=False)}")
        except Exception as err:  # noqa: BLE001 -- any failure replaces the old figure
            self.current = W.HTML(f"<b>Could not draw this setting</b> "
                                  f"({type(err).__name__}): {html.escape(str(err), quote=False)}")
        # Replace the Output widget's contents through its state, in one step.  Not
        # ``with self.output: clear_output(); display(...)``: outputs captured that way make
        # a headless client (nbclient, nbconvert) answer on the kernel's shell socket from
        # inside its IOPub handler, and that send can swallow the wake-up of the pending
        # execute_reply, so the cell stalls until its timeout (jupyter/nbclient#312).
        self.output.outputs = (display_data(self.current),)


def display_data(obj: object) -> dict:
    """``obj`` as a Jupyter ``display_data`` output (the rich formats the kernel would show)."""
    ip = get_ipython()
    data: dict = {}
    metadata: dict = {}
    if ip is not None:
        bundle = getattr(obj, "_repr_mimebundle_", None)
        if callable(bundle):  # plotly figures, widgets: ask the object, never display() it
            result = bundle()
            data, metadata = result if isinstance(result, tuple) else (result, {})
        else:
            data, metadata = ip.display_formatter.format(obj)
    data = dict(data or {})
    data.setdefault("text/plain", repr(obj))
    return {"output_type": "display_data", "data": data, "metadata": dict(metadata or {})}


def explorer(controls: Mapping[str, W.ValueWidget], render: Callable[..., object],
             title: str = "") -> Explorer:
    """Controls on top, the output of ``render(**values)`` below, redrawn on every change."""
    return Explorer(controls, render, title)
