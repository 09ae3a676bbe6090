"""The explorables: figures carry valid slider steps, widgets stay in valid ranges."""

import plotly.graph_objects as go
import pytest

from gpt2k3.book import figures
from gpt2k3.accounting import count_params
from gpt2k3.archs import GPT2_FAMILY, GPT2_SMALL


def _slider_steps(fig):
    (slider,) = fig.layout.sliders
    return slider.steps


def test_param_breakdown_slider_steps_carry_each_models_counts():
    fig = figures.param_breakdown(GPT2_FAMILY, active=1)
    steps = _slider_steps(fig)
    assert [s.label for s in steps] == [s.name for s in GPT2_FAMILY]
    for step, spec in zip(steps, GPT2_FAMILY):
        bd = count_params(spec).breakdown
        xs = step.args[0]["x"][0]
        assert xs == [v if v > 0 else None for v in bd.values()]
        assert f"{count_params(spec).total:,}" in step.args[1]["title.text"]
    # the figure opens on the active step's data
    assert list(fig.data[0].x) == steps[1].args[0]["x"][0]
    assert fig.layout.xaxis.type == "log"
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text


def test_param_breakdown_single_spec_has_no_slider():
    fig = figures.param_breakdown([GPT2_SMALL])
    assert not fig.layout.sliders
    assert "124,439,808" in fig.layout.title.text


def test_decode_waste_counts_closed_form():
    p, n = 8, 100
    c = figures.decode_waste_counts(p, n)
    assert c["total_computed"][-1] == n * p + n * (n - 1) // 2
    assert c["total_used"][-1] == n
    assert c["computed"][0] == p and c["computed"][-1] == p + n - 1
    # a cache still runs the prompt once: 8 + 7 = 15 positions for 8 tokens after 8
    assert c["total_needed"][-1] == p + n - 1 and c["needed"][0] == p
    assert figures.decode_waste_counts(8, 8)["total_needed"][-1] == 15


@pytest.mark.parametrize("args", [(0, 5), (4, 0), (4, 2.5)])
def test_decode_waste_counts_rejects_bad_input(args):
    with pytest.raises(ValueError):
        figures.decode_waste_counts(*args)


def test_decode_waste_steps_differ_and_match_counts():
    fig = figures.decode_waste(prompt_len=4, lengths=(8, 16))
    s8, s16 = _slider_steps(fig)
    assert s8.args[0]["y"][2] == figures.decode_waste_counts(4, 8)["total_computed"]
    assert s8.args[0]["y"][3] == figures.decode_waste_counts(4, 8)["total_needed"]
    assert "11 needed with a cache" in s8.args[1]["title.text"]
    assert s8.args[0] != s16.args[0]
    assert len(fig.data) == 4
    with pytest.raises(ValueError, match="lengths"):
        figures.decode_waste(lengths=(0,))


def test_add_slider_validates():
    fig = go.Figure(go.Scatter(x=[0], y=[0]))
    with pytest.raises(ValueError, match="steps"):
        figures.add_slider(fig, [], prefix="")
    with pytest.raises(ValueError, match="active"):
        figures.add_slider(fig, [figures.Step("a", {"y": [[1]]})], prefix="", active=3)


def test_param_explorer_keeps_n_embd_divisible_and_redraws():
    from gpt2k3.book.widgets import param_explorer

    box = param_explorer()
    c = box.controls
    assert "124,439,808" in box.current.layout.title.text  # opens on GPT-2 small
    c["n_head"].value = 7
    assert c["n_embd"].value % 7 == 0 and c["n_embd"].step == 7
    c["n_layer"].value = 3
    assert isinstance(box.current, go.Figure)
    assert "L=3, heads=7" in box.current.layout.title.text


def test_explorer_shows_value_errors_instead_of_raising():
    import ipywidgets as W

    from gpt2k3.book.widgets import explorer

    def render(n):
        raise ValueError(f"n={n} is not allowed")

    box = explorer({"n": W.IntSlider(value=1)}, render)
    assert "n=1 is not allowed" in box.current.value
