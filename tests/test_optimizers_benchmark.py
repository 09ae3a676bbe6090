"""``benchmarks/optimizers.py --quick``: the AdamW-against-Muon experiment runs end to end on a
tiny model, writes every run as it finishes, and a restart skips the finished runs. Nothing
is timed here; the results go to a temporary folder."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_script():
    path_before = list(sys.path)
    spec = importlib.util.spec_from_file_location("_optimizers_benchmark",
                                                  BENCHMARKS / "optimizers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.path[:] = path_before
    return module


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    from gpt2k3.experiments import corpus
    try:
        corpus.find_bible()
    except Exception as err:  # noqa: BLE001 -- the corpus program is a system package
        pytest.skip(f"the King James Bible corpus is not installed ({err})")
    out = tmp_path_factory.mktemp("optimizers_quick")
    bench = load_script()
    results = bench.main(["--quick", "--out-dir", str(out)])
    return bench, out, results


def test_the_quick_run_writes_every_planned_run(quick):
    bench, out, results = quick
    on_disk = json.loads((out / "optimizers_quick.json").read_text())
    assert on_disk["complete"] and on_disk["runs"] == results["runs"]
    settings = results["settings"]
    sweep = [r for r in results["runs"] if r["phase"] == "sweep"]
    assert len(results["runs"]) == len(sweep) + len(bench.ARMS) * settings["seeds"]
    assert len(sweep) >= 2 * len(settings["lrs"])  # the grid, and any rate it grew by
    for run in results["runs"]:
        steps = run["steps"]
        assert len(run["losses"]) == len(run["max_logits"]) == steps
        assert all(math.isfinite(x) for x in run["losses"] + run["max_logits"])
        assert run["curve"][0]["step"] == 0 and run["curve"][-1]["step"] == steps
        assert run["tokens"] == steps * settings["batch_size"] * settings["model"]["context"]
        assert run["max_logit"] == max(run["max_logits"])
        assert (run["qk_clip"] is not None) == run["arm"].endswith("_qk")
        assert len(run["load_average_1min"]) == 2 and run["wall_seconds"] >= 0
    sessions = results["sessions"]
    assert len(sessions) == 1 and sessions[0]["cpu"] and "niceness" in sessions[0]


def test_the_learning_rates_follow_one_rule(quick):
    bench, _, results = quick
    for opt in ("adamw", "muon"):
        sweep = [r for r in results["runs"] if r["phase"] == "sweep" and r["arm"] == opt]
        best = min(sweep, key=lambda r: r["val_bits"])["lr"]
        assert {r["lr"] for r in results["runs"] if r["phase"] == "full"
                and r["optimizer"] == opt} == {best}
    taus = {r["qk_clip"] for r in results["runs"] if r["qk_clip"] is not None}
    seed0 = [r["max_logit"] for r in results["runs"]
             if r["phase"] == "full" and r["arm"] in ("adamw", "muon") and r["seed"] == 0]
    assert taus == {bench.sig(0.5 * max(seed0), 2)}


def test_the_rate_trials_grow_until_the_best_rate_is_inside_them():
    bench = load_script()

    def runs(bits):  # {lr: bits} of AdamW's trials
        return [{"phase": "sweep", "arm": "adamw", "lr": lr, "val_bits": b} for lr, b in bits.items()]

    grid = (1e-3, 2e-3)
    assert bench.next_trial([], "adamw", grid) == 1e-3
    assert bench.next_trial(runs({1e-3: 3.0}), "adamw", grid) == 2e-3
    assert bench.next_trial(runs({1e-3: 3.0, 2e-3: 2.5}), "adamw", grid) == 4e-3  # best at the top
    assert bench.next_trial(runs({1e-3: 2.5, 2e-3: 3.0}), "adamw", grid) == 5e-4  # at the bottom
    assert bench.next_trial(runs({1e-3: 3.0, 2e-3: 2.5, 4e-3: 2.7}), "adamw", grid) is None
    assert bench.next_trial(runs({1e-3: 3.0, 2e-3: 2.5, 4e-3: 2.7}), "muon", grid) == 1e-3


def test_per_head_muon_runs_at_muons_rate_and_records_the_head_scales(quick):
    bench, _, results = quick
    settings = results["settings"]
    per_head = [r for r in results["runs"] if r["arm"] == "muon_per_head"]
    assert len(per_head) == settings["seeds"]
    assert {r["lr"] for r in per_head} == {bench.chosen_lr(results["runs"], "muon")}
    heads = 3 * settings["model"]["n_head"]
    for run in per_head:
        steps = [p["step"] for p in run["head_update_rms"]]
        assert steps == [p["step"] for p in run["curve"]][1:]  # after every curve step
        for point in run["head_update_rms"]:
            assert len(point["layers"]) == settings["model"]["n_layer"]
            assert all(len(xs) == heads for layer in point["layers"] for xs in layer.values())
    assert all("head_update_rms" not in r for r in results["runs"] if r["arm"] != "muon_per_head")
    spread = results["summary"]["arms"]["muon_per_head"]["head_rms_spread"]
    assert spread["per_head"]["max"] < 2.0 <= spread["whole"]["max"]


def test_every_chosen_rate_has_a_worse_one_on_either_side(quick):
    bench, _, results = quick
    for opt in ("adamw", "muon"):
        tried = sorted(r["lr"] for r in results["runs"] if r["phase"] == "sweep" and r["arm"] == opt)
        assert tried[0] < bench.chosen_lr(results["runs"], opt) < tried[-1]


def test_the_summary(quick):
    _, _, results = quick
    s = results["summary"]
    assert set(s["arms"]) == {"adamw", "muon", "adamw_qk", "muon_qk", "muon_per_head"}
    finals = {a: [r["curve"][-1]["bits"] for r in results["runs"]
                  if r["phase"] == "full" and r["arm"] == a] for a in ("adamw", "muon")}
    target = max(sum(v) / len(v) for v in finals.values())  # a loss both optimizers reach
    assert s["target_bits"] == pytest.approx(target, rel=1e-4)
    for arm in ("adamw", "muon"):
        assert s["tokens_to_target"][arm]["mean_curve"] is not None


def test_a_restart_skips_finished_runs_and_redoes_a_missing_one(quick):
    bench, out, results = quick
    path = out / "optimizers_quick.json"
    again = bench.main(["--quick", "--out-dir", str(out)])
    assert again["runs"] == results["runs"]
    cut = json.loads(path.read_text())
    removed = cut["runs"].pop()
    path.write_text(json.dumps(cut))
    redone = bench.main(["--quick", "--out-dir", str(out)])
    assert redone["runs"][:-1] == results["runs"][:-1]
    last = redone["runs"][-1]
    assert last["key"] == removed["key"] and last["losses"] == removed["losses"]  # deterministic
    assert len(redone["sessions"]) == 2
    with pytest.raises(SystemExit, match="other settings"):
        bench.main(["--quick", "--out-dir", str(out), "--steps", "3"])


def test_tokens_to_reach_interpolates_on_the_curve():
    bench = load_script()
    curve = [{"tokens": 0, "bits": 8.0}, {"tokens": 100, "bits": 4.0}, {"tokens": 200, "bits": 2.0}]
    assert bench.tokens_to_reach(curve, 3.0) == 150.0
    assert bench.tokens_to_reach(curve, 4.0) == 100.0
    assert bench.tokens_to_reach(curve, 1.0) is None
    assert bench.tokens_to_reach(curve, 9.0) == 0.0
