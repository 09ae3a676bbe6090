"""Chapter 11's figures and explorers: built from a results file, sliders over models, lengths
and contexts, nothing the figures compute on their own."""

import html
import statistics
from dataclasses import asdict

import plotly.graph_objects as go
import pytest
import torch

from gpt2k3.book import results
from gpt2k3.experiments import corpus as text, text_lm
from gpt2k3.book.display import md_table
from gpt2k3.book.figures import text as figs
from gpt2k3.book.figures._style import DATA_DIGITS
from gpt2k3.experiments.text_lm import TextModelConfig, TextTrainConfig

TINY = TextModelConfig(n_layer=4, n_embd=32, n_head=2, context=32, max_context=128, chunk_size=16)
TRAIN = TextTrainConfig(steps=6, batch_size=2, warmup=1, eval_every=3, curve_windows=2,
                        eval_windows=1)
SAMPLE = dict(prompt="And <God> & ", max_new_tokens=8, temperature=0.8, seed=0)
MIXERS = ["softmax", "deltanet", "hybrid"]


@pytest.fixture(scope="module")
def data():
    """A results file as ``benchmarks/text_lm.py`` writes it, from a tiny run."""
    torch.set_num_threads(1)
    corpus = (text.encode("And God said, Let there be light.\n" * 30, torch.uint8),
              text.encode("And God saw the light, that it was good.\n" * 10, torch.uint8))
    bins = {n: text_lm.position_bins(n) for n in TINY.lengths}
    runs = [text_lm.run_record(text_lm.train(m, corpus, TINY, TRAIN, seed=s, sample_args=SAMPLE), bins)
            for s in (0, 1) for m in MIXERS]
    config = {"mixers": MIXERS, "labels": {m: text_lm.MIXER_LABELS[m] for m in MIXERS},
              "seeds": [0, 1], "model": asdict(TINY), "lengths": list(TINY.lengths),
              "train": asdict(TRAIN), "curve_steps": TRAIN.curve_steps(),
              "bins": {str(n): b for n, b in bins.items()}, "sample": SAMPLE}
    return {"config": config, "runs": runs}


def _digits_ok(values):
    for v in values:
        if isinstance(v, float) and not v.is_integer():
            assert len(f"{v:.15g}".replace("-", "").replace(".", "").lstrip("0")) <= DATA_DIGITS


def test_summary_and_table(data):
    summary = figs.text_summary(data)
    assert list(summary) == MIXERS
    vals = [r["val_bits"] for r in data["runs"] if r["mixer"] == "deltanet"]
    s = summary["deltanet"]["val_bits"]
    assert s["mean"] == pytest.approx(statistics.fmean(vals))
    assert s["half_range"] == pytest.approx((max(vals) - min(vals)) / 2)
    assert summary["softmax"]["length_bits"][128] is None  # past its position table
    assert summary["deltanet"]["length_bits"][128]["mean"] > 0
    headers, rows = figs.text_table(data)
    assert len(rows) == 3 and all(len(r) == len(headers) for r in rows)
    assert rows[0][3] == "cannot run" and rows[0][-1] == "cannot run"
    assert "±" in rows[1][2]
    md_table(headers, rows)


def test_curves_slider_brings_one_model_forward(data):
    fig = figs.text_curves(data)
    assert isinstance(fig, go.Figure) and len(fig.data) == 3
    steps = fig.layout.sliders[0].steps
    assert len(steps) == 1 + 3
    assert steps[2].args[0]["opacity"] == [0.2, 1.0, 0.2]
    per_step = TRAIN.batch_size * TINY.context
    assert list(fig.data[0].x) == [s * per_step for s in TRAIN.curve_steps()]
    for t in fig.data:
        _digits_ok(t.y)
    with pytest.raises(ValueError, match="active"):
        figs.text_curves(data, active=9)
    with_lines = figs.text_curves({**data, "baselines": {"unigram": 4.3, "bigram": 3.29, "trigram": 2.57}})
    assert [a.text for a in with_lines.layout.annotations] == ["bigram table 3.29", "trigram table 2.57"]
    assert len(with_lines.layout.shapes) == 2


def test_position_loss_has_one_step_per_length_and_no_line_past_the_table(data):
    fig = figs.text_position_loss(data)
    steps = fig.layout.sliders[0].steps
    assert [s.label for s in steps] == ["32 (trained)", "128 (4×)"]
    long = steps[1].args[0]
    assert long["y"][0] == [] and len(long["y"][1]) == len(text_lm.position_bins(128))
    assert "cannot run" in steps[1].args[1]["title.text"]
    short = steps[0].args[0]
    mean = [statistics.fmean(v) for v in zip(*[r["position_bits"]["32"] for r in data["runs"]
                                               if r["mixer"] == "softmax"])]
    assert short["y"][0] == pytest.approx(mean, rel=1e-5)
    fig2 = figs.text_position_loss(data, active=1)
    assert fig2.data[0].y in (None, ()) or len(fig2.data[0].y) == 0


def test_memory_figure_puts_cache_against_quality(data):
    fig = figs.text_memory(data, active=1)
    step = fig.layout.sliders[0].steps[1].args[0]
    assert step["x"][0] == []  # GPT-2 cannot run at 128
    hybrid = next(r for r in data["runs"] if r["mixer"] == "hybrid")
    assert step["x"][2] == [hybrid["decode_bytes"]["128"]]
    assert fig.layout.xaxis.type == "log"


def test_samples_side_by_side_are_escaped(data):
    out = figs.text_samples_html(data, seed=1)
    assert out.data.count("<pre") == 3
    assert "And &lt;God&gt; &amp; " in out.data and "<God>" not in out.data
    with pytest.raises(ValueError, match="no sample"):
        figs.text_samples_html(data, seed=7)


def test_live_run_figure(data):
    corpus = (text.encode("abc abd abe\n" * 40, torch.uint8), text.encode("abc abe\n" * 40, torch.uint8))
    run = text_lm.train("softmax", corpus, TINY, TRAIN, seed=0, final_eval=False)
    fig = figs.text_run(run, data["runs"][0])
    assert len(fig.data) == 3 and len(fig.data[0].y) == TRAIN.steps


def test_bad_data_is_refused():
    with pytest.raises(ValueError, match="results of benchmarks/text_lm.py"):
        figs.text_summary({"runs": []})
    with pytest.raises(ValueError, match="no finished runs"):
        figs.text_curves({"config": {"mixers": [], "lengths": [1], "model": {"context": 1}},
                          "runs": []})
    with pytest.raises(ValueError, match="empty"):
        figs.spread([])


def test_explorers_build(data):
    from gpt2k3.book.widgets import text as live

    ex = live.text_results_explorer(data)
    assert isinstance(ex.current, go.Figure)
    ex.controls["view"].value = "cache against quality"
    assert isinstance(ex.current, go.Figure)
    ex.controls["models"].value = ()
    assert "at least one model" in ex.current.value
    trainer = live.text_train_explorer(data)
    assert "train" in trainer.current.value  # waits for the toggle


def test_sample_explorer_shows_the_recorded_sample():
    from gpt2k3.book.widgets import text as live

    data = results.load("text_lm_tuned.json")  # the longer run trained the shipped GPT-2
    s = data["checkpoint"]["sample"]
    ex = live.sample_explorer(data)
    ex.controls["length"].value = 40
    assert html.escape(s["text"][:40]) in ex.current.value


@pytest.mark.skipif(not results.exists("text_lm.json"), reason="no text_lm.json results")
def test_the_chapter_results_build_every_figure():
    data = results.load("text_lm.json")
    for fig in (figs.text_curves(data), figs.text_position_loss(data, 2), figs.text_memory(data)):
        assert fig.layout.sliders
    md_table(*figs.text_table(data))
    figs.text_samples_html(data)


def test_models_table_and_position_means(data):
    models = {m: {"sizes": text_lm.matched_sizes(m, TINY), "position": text_lm.gpt_config(m, TINY).position,
                  "params": text_lm.param_counts(text_lm.build_model(m, TINY))} for m in MIXERS}
    headers, rows = figs.text_models_table({**data, "models": models})
    assert [r[1] for r in rows] == ["softmax × 4", "DeltaNet × 4", "KDA, KDA, KDA, softmax"]
    assert rows[0][2] == "learned table" and rows[1][2] == "none (NoPE)"
    assert rows[0][4] == str(4 * TINY.n_embd)
    assert headers[3] == "short convolution" and rows[0][3] == "none"
    assert rows[1][3] == figs.MIXER_CONV["deltanet"] and "shared" in figs.MIXER_CONV["softmax_conv"]
    with pytest.raises(ValueError, match="missing"):
        figs.text_models_table(data)
    runs = [r for r in data["runs"] if r["mixer"] == "deltanet"]
    first = statistics.fmean(r["position_bits"]["32"][0] for r in runs)
    assert figs.position_mean(data, "deltanet", 32, 0, 1) == pytest.approx(first)
    bins = text_lm.position_bins(32)
    inside = [i for i, (a, b) in enumerate(bins) if a >= 16 and b <= 32]
    want = statistics.fmean(statistics.fmean(r["position_bits"]["32"][i] for r in runs) for i in inside)
    assert figs.position_mean(data, "deltanet", 32, 16, 32) == pytest.approx(want)
    with pytest.raises(ValueError, match="no per-position loss"):
        figs.position_mean(data, "softmax", 128, 0, 128)


def _restart_data(pos, short, long, mixer="deltanet"):
    bins = [[0, 1], [1, 2], [2, 4], [4, 8]]
    return {"config": {"mixers": [mixer], "lengths": [8, 16], "model": {"context": 8},
                       "bins": {"8": bins}},
            "runs": [{"mixer": mixer, "seed": 0, "length_bits": {"8": short, "16": long},
                      "position_bits": {"8": pos}, "tokens_per_second": 1.0}]}


def test_restart_effect_by_hand():
    # positions 0, 1 cost 4 and 3 bits, the rest 2: with head 2, q = 2, and one of the two short
    # windows no longer restarts: restart = -(1/2) * ((4 - 2) + (3 - 2)) / 8
    d = _restart_data([4.0, 3.0, 2.0, 2.0], short=2.375, long=2.5)
    r = figs.restart_effect(d, head=2)["deltanet"]
    assert r["restart"]["mean"] == pytest.approx(-3 / 16)
    assert r["measured"]["mean"] == pytest.approx(0.125)
    assert r["adjusted"]["mean"] == pytest.approx(0.125 + 3 / 16)
    # a model whose level is the same everywhere has no restart effect
    flat = figs.restart_effect(_restart_data([2.0] * 4, 2.0, 2.0), head=4)["deltanet"]
    assert flat["restart"]["mean"] == 0 and flat["adjusted"]["mean"] == 0
    # a model that cannot run at the length is left out
    assert figs.restart_effect(_restart_data([2.0] * 4, 2.0, None), head=2) == {}
    with pytest.raises(ValueError, match="head"):
        figs.restart_effect(d, head=3)  # not a bin edge
    with pytest.raises(ValueError, match="length"):
        figs.restart_effect(d, length=8)


def test_restart_effect_on_the_stored_results():
    stored = results.load("text_lm.json")
    r = figs.restart_effect(stored)
    assert "softmax" not in r  # GPT-2 cannot run at 8x
    for m, v in r.items():  # fewer restarts only ever help
        assert v["restart"]["max"] <= 0, m


def test_throughput_sessions():
    d = _restart_data([2.0] * 4, 2.0, 2.0)
    d["runs"].append({**d["runs"][0], "mixer": "k3", "seed": 0, "tokens_per_second": 5.0})
    d["config"]["mixers"].append("k3")
    d["updates"] = [{"mixers": ["k3"], "machine": {"load_average_1min_now": 3.5}}]
    s = figs.throughput_sessions(d)
    assert s["main"] == {"deltanet": {0: 1.0}} and s["rerun"] == {"k3": {0: 5.0}}
    assert s["load"]["rerun"] == [3.5]


def _tuned_complete() -> bool:
    return results.exists("text_lm_tuned.json") and bool(results.load("text_lm_tuned.json").get("complete"))


@pytest.mark.skipif(not _tuned_complete(), reason="the longer run has not finished")
def test_the_longer_run_builds_every_figure_and_table():
    """Chapter 11's longer run, as stored: every model has its rate between two worse ones, all
    its seeds, and every figure and table of the chapter builds from it."""
    from gpt2k3.book.figures import text_longer as longfigs

    data = results.load("text_lm_tuned.json")
    for m, choice in data["lr_choice"].items():
        tried = sorted(float(lr) for lr in choice["bits"])
        assert tried[0] < choice["lr"] < tried[-1]  # a worse rate on either side
    assert {(r["mixer"], r["seed"]) for r in data["runs"]} == {
        (m, s) for m in data["config"]["mixers"] for s in data["config"]["seeds"]}
    headers, rows = longfigs.seed_table(data)
    assert len(rows) == len(data["config"]["mixers"]) + 3
    for fig in (longfigs.lr_sweep(data), longfigs.repeat_gain(data)):
        assert fig.layout.sliders
    assert longfigs.repeat_findings(data, bins=longfigs.inside_bins(data))["cells"]
    figs.text_samples_html(data)


def test_the_compute_multiplier_builds_from_the_stored_file():
    """Whatever the file holds so far (its runs arrive while it is written): the table has a
    row per model and budget, the facts say which budgets and seeds are in, and either the
    multiplier or the lower bound is given."""
    from gpt2k3.book.figures import text_longer as longfigs
    from gpt2k3.book.results import load

    stored = load("compute_multiplier.json", missing_ok=True)
    if stored is None:
        pytest.skip("no compute_multiplier.json")
    facts = longfigs.multiplier_facts(stored)
    assert 1 in facts["budgets"] and facts["target_seeds"]
    assert facts["reached"] == (facts["multiplier"] is not None)
    assert facts["reached"] or facts["lower_bound"] is not None
    headers, rows = longfigs.multiplier_table(stored)
    assert len(rows) == len(facts["budgets"]) + 1  # the target at 1x, the baseline per budget
    assert rows[0][4] == "1.00"
    fig = longfigs.multiplier_figure(stored)
    assert len(fig.data) == 3


def test_the_multiplier_figure_by_hand():
    from gpt2k3.book.figures import text_longer as longfigs

    def run(model, mult, seed, bits, per_byte):
        return {"model": model, "multiple": mult, "seed": seed, "tokens": 100 * mult,
                "compute": 100 * mult * per_byte, "val_bits": bits}
    data = {"baseline": "gpt2_fan_in", "target": "k3", "flops_per_byte": {"gpt2_fan_in": 2.0, "k3": 1.0},
            "target_bits": {"mean": 1.5}, "multiplier": None, "band": [None, None],
            "lower_bound": 4.0, "complete": False,
            "runs": [run("k3", 1, 0, 1.5, 1.0), run("gpt2_fan_in", 1, 0, 2.0, 2.0),
                     run("gpt2_fan_in", 2, 0, 1.8, 2.0), run("gpt2_fan_in", 2, 1, 1.9, 2.0)]}
    facts = longfigs.multiplier_facts(data)
    assert facts["budgets"] == {1: [0], 2: [0, 1]} and facts["flops_ratio"] == 2.0
    assert not facts["reached"] and facts["largest"] == 2
    _, rows = longfigs.multiplier_table(data)
    assert rows[2][4] == "4.00" and rows[2][-1] == "1.850"
    title = longfigs.multiplier_figure(data).layout.title.text
    assert "4.00×" in title and "so far" in title  # the bound to two places, as the prose gives it
    done = longfigs.multiplier_figure({**data, "complete": True}).layout.title.text
    assert "so far" not in done
    with pytest.raises(ValueError, match="compute_multiplier"):
        longfigs.multiplier_facts({"runs": []})
    assert longfigs.seeds_text([0]) == "seed 0" and longfigs.seeds_text([0, 1]) == "seeds 0 and 1"
    assert longfigs.seeds_text([0, 1, 2]) == "seeds 0, 1 and 2"
    with pytest.raises(ValueError, match="seeds"):
        longfigs.seeds_text([])
