"""The compute multiplier (chapter 11): FLOP counts, the interpolation, the stored run."""

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from gpt2k3.experiments import compute, text_lm
from gpt2k3.experiments.text_lm import TextModelConfig, TextTrainConfig

ROOT = Path(__file__).resolve().parents[1]
STORED = ROOT / "benchmarks" / "results" / "compute_multiplier.json"


def _benchmark():
    path = ROOT / "benchmarks" / "compute_multiplier.py"
    spec = importlib.util.spec_from_file_location("compute_multiplier", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------ counting
def test_gpt2_matmul_params_are_its_linear_weights_with_the_tied_head_once():
    model = TextModelConfig()
    net = text_lm.build_model("gpt2_fan_in", model, 0)
    d, L, V = net.config.n_embd, net.config.n_layer, net.config.vocab_size
    assert net.lm_head.weight is net.transformer.wte.weight  # tied: one matmul table
    assert compute.matmul_params(net) == L * 12 * d * d + V * d


def test_train_flops_per_byte_is_six_n_plus_attention():
    model = TextModelConfig()
    net = text_lm.build_model("gpt2_fan_in", model, 0)
    d, L, T = net.config.n_embd, net.config.n_layer, model.context
    attention = L * 2 * 2 * d * (T + 1) / 2  # QK^T and AV over the visible half, per token
    want = 3 * (2 * compute.matmul_params(net) + attention)
    assert compute.train_flops_per_byte(net, T) == pytest.approx(want)


def test_the_tiny_k3_counts_its_active_experts_only():
    model = TextModelConfig()
    net = text_lm.build_model("k3", model, 0)
    counts = text_lm.param_counts(net)
    assert compute.matmul_params(net) < counts["active"] < counts["total"]


def test_every_mixer_of_chapter_11_has_a_flop_count():
    model = TextModelConfig()
    for mixer in text_lm.MIXERS:
        assert compute.train_flops_per_byte(text_lm.build_model(mixer, model, 0), model.context) > 0


def test_a_mixer_without_a_rule_is_refused():
    with pytest.raises(ValueError, match="no FLOP count"):
        compute.mixer_flops_per_token(torch.nn.Identity(), 16)
    with pytest.raises(ValueError, match="context"):
        compute.train_flops_per_byte(text_lm.build_model("softmax", TextModelConfig(), 0), 0)


# ------------------------------------------------------------------ the multiplier
def test_log_interpolation_lands_between_budgets():
    pts = [(1.0, 2.0), (4.0, 1.0)]
    assert compute.log_interpolate(pts, 1.5) == pytest.approx(2.0)  # halfway in log compute
    assert compute.log_interpolate(pts, 2.5) == 1.0  # already below at the first budget
    assert compute.log_interpolate(pts, 0.5) is None  # never reached


def _runs(model, pairs, seed=0):
    return [{"model": model, "compute": c, "val_bits": b, "seed": seed} for c, b in pairs]


def test_multiplier_reads_the_compute_at_the_target_loss():
    base = _runs("b", [(1.0, 2.0), (2.0, 1.8), (4.0, 1.6)])
    target = _runs("t", [(0.5, 1.7)])
    found = compute.multiplier(base, target)
    # 1.7 lies halfway between 2x and 4x in log compute: sqrt(8) units, over the target's 0.5
    assert found["multiplier"] == pytest.approx(math.sqrt(8) / 0.5)
    assert found["lower_bound"] is None


def test_a_target_out_of_reach_gives_a_lower_bound():
    base = _runs("b", [(1.0, 2.0), (8.0, 1.9)])
    found = compute.multiplier(base, _runs("t", [(1.0, 1.7)]))
    assert found["multiplier"] is None and found["lower_bound"] == pytest.approx(8.0)


def test_the_band_comes_from_the_seeds():
    base = _runs("b", [(1.0, 2.0), (4.0, 1.6)], 0) + _runs("b", [(1.0, 2.1), (4.0, 1.7)], 1)
    target = _runs("t", [(1.0, 1.75)], 0) + _runs("t", [(1.0, 1.85)], 1)
    found = compute.multiplier(base, target)
    low, high = found["band"]
    assert low <= found["multiplier"] <= high
    with pytest.raises(ValueError):
        compute.multiplier([], target)


def test_longer_budgets_scale_the_schedule_only():
    bench = _benchmark()
    base = TextTrainConfig(steps=1200, warmup=120, eval_every=100)
    four = bench.budget_config(base, 4)
    assert (four.steps, four.warmup, four.eval_every) == (4800, 480, 400)
    assert (four.lr, four.batch_size, four.weight_decay) == (base.lr, base.batch_size, base.weight_decay)


# ------------------------------------------------------------------ the stored run
def test_the_stored_run_has_the_promised_keys_and_agrees_with_its_runs():
    data = json.loads(STORED.read_text())
    for key in ("baseline", "target", "runs", "multiplier", "lower_bound"):
        assert key in data
    for run in data["runs"]:
        assert {"model", "compute", "seed", "val_bits"} <= set(run)
        assert run["compute"] == pytest.approx(run["tokens"] * data["flops_per_byte"][run["model"]])
    base = [r for r in data["runs"] if r["model"] == data["baseline"]]
    target = [r for r in data["runs"] if r["model"] == data["target"]]
    again = compute.multiplier(base, target)
    assert again["multiplier"] == data["multiplier"]
    assert again["lower_bound"] == data["lower_bound"]
    assert (data["multiplier"] is None) != (data["lower_bound"] is None)


def test_the_benchmark_resumes_from_the_stored_runs(tmp_path):
    """A summary-only rerun keeps every finished run and rebuilds the same summary."""
    bench = _benchmark()
    out = tmp_path / "cm.json"
    out.write_text(STORED.read_text())
    bench.main(["--summarise", "--out", str(out)])
    again, stored = json.loads(out.read_text()), json.loads(STORED.read_text())
    assert again["trained"] == stored["trained"]
    assert again["multiplier"] == stored["multiplier"] and again["runs"] == stored["runs"]
