"""Build every live explorer and redraw it once, under whatever ipywidgets is importable.

Run by ``tests/test_bootstrap.py`` in a subprocess whose ``PYTHONPATH`` puts ipywidgets 7.7.1
(Colab's) ahead of this environment's, so the explorers are checked against the widget
library Colab's front end supports.  Prints one JSON line: the ipywidgets version, and per
explorer what it showed first, the control it moved, and what it showed after.

The chapter's GPT-2 sample explorer is the one slow render (it generates text with a trained
model); its sampling is replaced by a stand-in that returns at once, since what is checked
here is the widget layer, not the model (the model's sampling is tested in test_text_lm.py).
"""

from __future__ import annotations

import json
import sys


def _other_value(w):
    """A valid value of control ``w`` other than its current one (None: leave it)."""
    import ipywidgets as W

    if isinstance(w, W.Button):
        return None
    options = getattr(w, "options", None)
    if options:
        labels = [o[1] if isinstance(o, tuple) else o for o in options]
        if isinstance(w, W.SelectMultiple):
            return tuple(labels[:1]) if tuple(w.value) != tuple(labels[:1]) else tuple(labels[:2])
        others = [v for v in labels if v != w.value]
        return others[-1] if others else None
    if isinstance(w, W.Checkbox):
        return not w.value
    lo, hi = getattr(w, "min", None), getattr(w, "max", None)
    if lo is not None and hi is not None:
        return lo if w.value != lo else hi
    return None


def main() -> int:
    import ipywidgets as W

    from gpt2k3.experiments import text_lm

    class _Sample:
        prompt, text = "And it came to pass", ", that the widgets drew."

    text_lm.sample = lambda *a, **k: _Sample()

    import gpt2k3.book.widgets as widgets

    names = [n for n in widgets.__all__ if n.endswith("_explorer")]
    report = {"ipywidgets": W.__version__, "explorers": {}}
    for name in names:
        box = getattr(widgets, name)()
        first = box.current
        assert isinstance(box, W.VBox) and box.output.outputs, name
        moved = None
        for control, w in box.controls.items():
            value = _other_value(w)
            if value is not None:
                before = box.current
                w.value = value
                moved = control
                assert box.current is not before, f"{name}: moving {control} did not redraw"
                break
        shown = [first, box.current]
        failed = [getattr(x, "value", "") for x in shown if isinstance(x, W.HTML)
                  and str(x.value).startswith(("<b>Not a valid setting", "<b>Could not draw"))]
        report["explorers"][name] = {"first": type(first).__name__, "moved": moved,
                                     "after": type(box.current).__name__, "failed": failed,
                                     "outputs": len(box.output.outputs)}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
