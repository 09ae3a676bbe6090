"""Chapter 11's optimizer figures and tables, on a results file written by hand: every number
they show is checked against the hand-written runs."""

import math

import pytest

from gpt2k3.book.figures import optimizers as ofigs


def _run(arm, seed, bits, logits, clip=None, lr=4e-3):
    losses = [3.0] * 60 + [3.0 + 0.1 * seed]  # the last step jumps by a tenth of a bit a seed
    curve = [{"step": s, "tokens": s * 100, "bits": b} for s, b in zip((0, 10, 20), bits)]
    return {"phase": "full", "arm": arm, "lr": lr, "seed": seed, "qk_clip": clip,
            "val_bits": bits[-1], "curve": curve, "losses": losses, "max_logits": logits,
            "max_logit": max(logits), "heads_clipped": None if clip is None else
            [int(v > clip) for v in logits]}


@pytest.fixture
def data():
    runs = [_run("adamw", 0, (8.0, 3.0, 2.6), [1.0, 5.0, 9.0]),
            _run("adamw", 1, (8.0, 3.2, 2.8), [1.0, 4.0, 11.0]),
            _run("muon", 0, (8.0, 2.9, 2.5), [1.0, 2.0, 3.0], lr=8e-3),
            _run("muon", 1, (8.0, 2.9, 2.3), [1.0, 2.0, 2.5], lr=8e-3),
            _run("adamw_qk", 0, (8.0, 3.0, 2.6), [1.0, 5.0, 6.0], clip=5.5),
            _run("adamw_qk", 1, (8.0, 3.2, 2.8), [1.0, 4.0, 5.0], clip=5.5)]
    sweep = [{"phase": "sweep", "arm": o, "lr": lr, "seed": 0, "val_bits": b}
             for o, lr, b in (("adamw", 4e-3, 2.9), ("adamw", 8e-3, 3.1),
                              ("muon", 4e-3, 2.8), ("muon", 8e-3, 2.7))]
    return {"settings": {"steps": 20, "seeds": 2}, "runs": sweep + runs,
            "summary": {"target_bits": 2.7,
                        "tokens_to_target": {"adamw": {"mean_curve": None},
                                             "muon": {"mean_curve": 1750.0}}}}


def test_the_summary_is_the_runs(data):
    s = ofigs.optimizer_summary(data)
    assert list(s) == ["adamw", "muon", "adamw_qk"]  # an arm with no run is left out
    assert s["adamw"]["val_bits"] == [2.6, 2.8] and s["adamw"]["mean"] == pytest.approx(2.7)
    assert s["adamw"]["half_range"] == pytest.approx(0.1)
    assert s["adamw"]["max_logit"] == 11.0 and s["muon"]["lr"] == 8e-3
    assert s["muon"]["to_target"] == 1750.0 and s["adamw"]["to_target"] is None
    assert s["adamw"]["largest_jump"] == pytest.approx(0.1)
    assert s["adamw_qk"]["steps_with_a_clip"] == 1 and s["adamw"]["steps_with_a_clip"] is None
    headers, rows = ofigs.optimizer_table(data)
    assert headers[1::3] == ["peak rate", "bytes until the curve reaches 2.700 bits"]
    assert rows[0] == ["AdamW", "0.004", "2.600, 2.800", "2.700 ± 0.100",
                       "not reached (ends at 2.700)", "11.0"]
    assert rows[1][4] == "1,750" and rows[2][0] == "AdamW + QK-clip (τ = 5.5)"


def test_the_largest_jump_is_measured_against_the_steps_before():
    losses = [2.0, 4.0] * 30 + [9.0]  # noisy, then a spike
    assert ofigs.largest_jump(losses, window=4, start=10) == pytest.approx(9.0 - 3.0)
    assert ofigs.largest_jump(losses[:-1], window=4, start=10) == pytest.approx(1.0)
    for bad in (dict(window=0), dict(window=60, start=50), dict(start=61)):
        with pytest.raises(ValueError):
            ofigs.largest_jump(losses, **bad)


def test_the_trial_table_stars_each_optimizers_best_rate(data):
    headers, rows = ofigs.lr_trial_table(data)
    assert headers == ["peak learning rate", "AdamW", "Muon"]
    assert rows == [["0.004", "2.900 *", "2.800"], ["0.008", "3.100", "2.700 *"]]


def test_the_curves_show_the_mean_and_each_seed(data):
    fig = ofigs.optimizer_curves(data)
    assert [t.name for t in fig.data] == ["AdamW", "Muon", "AdamW + QK-clip"]
    steps = fig.layout.sliders[0].steps
    assert [s.label for s in steps] == ["mean of the seeds", "seed 0", "seed 1"]
    assert list(fig.data[0].y) == pytest.approx([8.0, 3.1, 2.7])  # the mean is shown first
    assert steps[2].args[0]["y"][1] == pytest.approx([8.0, 2.9, 2.3])  # Muon, seed 1
    assert list(fig.data[0].x) == [0, 1000, 2000]


def test_the_logit_figure_shows_the_largest_and_the_threshold(data):
    fig = ofigs.max_logit_curves(data, arms=("adamw", "adamw_qk"), active=2)
    assert fig.layout.yaxis.type == "log"
    assert list(fig.data[0].y) == [1.0, 4.0, 11.0]  # seed 1, as asked
    steps = fig.layout.sliders[0].steps
    assert steps[0].args[0]["y"][0] == [1.0, 5.0, 11.0]  # the largest over the seeds, per step
    line = fig.data[-1]
    assert line.name == "QK-clip threshold τ = 5.5" and list(line.y) == [5.5, 5.5]
    assert list(steps[1].args[2]) == [0, 1]  # the slider moves the arms' lines, not the threshold's
    assert tuple(fig.layout.yaxis.range) == pytest.approx((-0.1, math.log10(11.0) + 0.1))


@pytest.mark.parametrize("call", [
    lambda d: ofigs.optimizer_curves({"runs": []}),
    lambda d: ofigs.optimizer_curves(d, arms=("sgd",)),
    lambda d: ofigs.optimizer_curves(d, arms=()),
    lambda d: ofigs.optimizer_curves(d, arms=("muon_qk",)),  # no run of that arm
    lambda d: ofigs.optimizer_curves(d, active=3),
    lambda d: ofigs.max_logit_curves(d, active=-1),
    lambda d: ofigs.lr_trial_table({**d, "runs": [r for r in d["runs"] if r["phase"] == "full"]}),
])
def test_bad_input_is_refused(data, call):
    with pytest.raises(ValueError):
        call(data)


def test_the_explorer_redraws_every_view(data):
    from gpt2k3.book.widgets.text import OPTIMIZER_VIEWS, optimizer_explorer

    box = optimizer_explorer(data)
    shown = []
    for view in OPTIMIZER_VIEWS:
        box.controls["view"].value = view
        box.controls["showing"].value = 1
        shown.append(box.current)
    assert [type(x).__name__ for x in shown] == ["Figure", "Figure"]
    assert shown[1].layout.yaxis.type == "log"
    box.controls["arms"].value = ()
    assert "Not a valid setting" in box.current.value


def test_the_logit_facts_are_the_runs(data):
    f = ofigs.logit_facts(data, late=2)
    assert f["peak_steps"] == (3, 3)  # every unclipped run peaks at its last step
    assert f["late_max"] == {"adamw": 11.0, "muon": 3.0}
    assert f["peak_range"] == {"adamw": (9.0, 11.0), "muon": (2.5, 3.0)}
    assert f["tau"] == 5.5 and f["clipped_late_max"] == 6.0
    assert f["over_within_pct"] == 100.0  # the one step above 5.5 is 6.0, within 10 %
    assert ofigs.logit_facts(data, late=2, near_pct=5)["over_within_pct"] == 0.0
    assert f["curve_offsets"] == pytest.approx((0.0, 0.0))
    with pytest.raises(ValueError, match="late"):
        ofigs.logit_facts(data, late=4)
    with pytest.raises(ValueError, match="with and without"):
        ofigs.logit_facts({**data, "runs": [r for r in data["runs"] if r.get("qk_clip") is None]}, late=2)


def _per_head(seed, bits, ratios):
    """A Per-Head Muon run whose one layer, at each recorded step, has heads of RMS
    ``(1, r)`` for each form's ratio ``r``."""
    run = _run("muon_per_head", seed, bits, [1.0, 2.0, 3.0], lr=8e-3)
    run["head_update_rms"] = [{"step": s, "layers": [{f: [1.0, r[f]] for f in r}]}
                              for s, r in zip((10, 20), ratios)]
    return run


@pytest.fixture
def heads(data):
    ratios = [{"input": 100.0, "whole": 4.0, "per_head": 1.1},
              {"input": 10.0, "whole": 2.0, "per_head": 1.05}]
    data = dict(data)
    data["runs"] = data["runs"] + [_per_head(0, (8.0, 2.9, 2.4), ratios),
                                   _per_head(1, (8.0, 2.9, 2.45), ratios)]
    return data


def test_the_per_head_table_pairs_the_seeds(heads):
    headers, rows = ofigs.per_head_table(heads)
    assert headers[1:3] == ["Muon (whole matrix)", "Per-Head Muon"]
    assert rows[0] == ["seed 0", "2.500", "2.400", "-0.100"]
    assert rows[1] == ["seed 1", "2.300", "2.450", "+0.150"]
    assert rows[-1] == ["mean of 2", "2.400", "2.425", "+0.025"]


def test_the_head_scale_facts_are_the_recorded_ratios(heads):
    f = ofigs.head_scale_facts(heads)
    assert f["seeds"] == [0, 1]
    assert f["whole"]["max"] == 4.0 and f["per_head"]["max"] == pytest.approx(1.1)
    assert f["input"]["median"] == pytest.approx(55.0)  # of 100, 10, 100, 10
    fig = ofigs.head_scale_curves(heads, seed=1)
    assert [t.name for t in fig.data] == list(ofigs.HEAD_FORMS.values())
    assert list(fig.data[1].y) == [4.0, 2.0] and list(fig.data[1].x) == [10, 20]


def test_the_per_head_builders_refuse_data_without_the_arm(data):
    with pytest.raises(ValueError, match="Per-Head"):
        ofigs.per_head_table(data)
    with pytest.raises(ValueError, match="Per-Head"):
        ofigs.head_scale_facts(data)


def test_the_stored_experiment_builds_the_per_head_views():
    from gpt2k3.book.results import load

    stored = load("optimizers.json")
    if not any(r["arm"] == "muon_per_head" for r in stored["runs"]):
        pytest.skip("the stored experiment holds no Per-Head Muon run yet")
    headers, rows = ofigs.per_head_table(stored)
    assert rows[-1][0].startswith("mean of")
    f = ofigs.head_scale_facts(stored)
    assert f["per_head"]["max"] < f["whole"]["max"]  # the per-head form evens the heads out
    ofigs.head_scale_curves(stored)
