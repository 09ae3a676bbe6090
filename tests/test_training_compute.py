"""Training compute, 6 N D, from the published token counts: the formula against numbers
written by hand, ``None`` wherever a report gives no count, each count beside its quote."""

import math
import subprocess
import sys

import pytest

from gpt2k3 import archs
from gpt2k3.accounting import count_params
from gpt2k3.accounting import training as tc


def test_the_formula_against_hand_written_numbers():
    assert tc.training_flops(2, 3) == 36.0
    assert tc.training_flops(124e6, 1e9) == pytest.approx(7.44e17, rel=1e-15)
    # Kimi K2: 6 x 31,686,066,176 x 15.5e12, multiplied out by hand
    assert tc.training_flops(31_686_066_176, 15.5e12) == pytest.approx(2.946804154368e24, rel=1e-12)
    assert tc.training_flops(124e6, None) is None


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, True, "1", None])
def test_bad_counts_are_refused(bad):
    with pytest.raises(ValueError, match="n_params"):
        tc.training_flops(bad, 1e9)
    if bad is not None:
        with pytest.raises(ValueError, match="tokens"):
            tc.training_flops(1e6, bad)


def test_the_table_uses_the_accounting_and_the_stated_tokens():
    rows = {r["model"]: r for r in tc.training_compute()}
    assert list(rows) == [r.model for r in tc.TRAINING_RUNS]
    k2 = rows["Kimi K2"]
    count = count_params(archs.KIMI_K2)
    assert (k2["n_active"], k2["n_active_published"], k2["n_total"]) == (
        count.matmul_active, count.active_without_embedding, count.total)
    assert k2["tokens"] == 15.5e12 and k2["flops"] == 6.0 * count.matmul_active * 15.5e12
    assert rows["DeepSeek-V3"]["tokens"] == 14.8e12
    assert rows["Kimi Linear 48B-A3B (comparison runs)"]["tokens"] == 1.4e12
    assert rows["Kimi Linear 48B-A3B (released)"]["tokens"] == 5.7e12
    for flops, stated in ((rows["DeepSeek-V3"]["flops"], 3.25e24), (k2["flops"], 2.95e24)):
        assert flops == pytest.approx(stated, rel=0.01)  # 6 N D with the activated counts


def test_no_published_count_gives_none_not_a_guess():
    rows = {r["model"]: r for r in tc.training_compute()}
    for model in ("GPT-2 small", "Kimi K3"):
        assert rows[model]["tokens"] is None and rows[model]["flops"] is None
        assert rows[model]["note"]  # says why
    assert "40 GB" in rows["GPT-2 small"]["quote"]  # what the paper does give: bytes


def test_every_count_stands_beside_its_quote():
    spelled = {14.8e12: "14.8 trillion", 15.5e12: "15.5 trillion", 1.4e12: "1.4T", 5.7e12: "5.7T"}
    for run in tc.TRAINING_RUNS:
        assert run.source and hasattr(archs, run.arch)
        if run.tokens is not None:
            assert spelled[run.tokens] in run.quote, run.model
    assert "2×" in tc.CLAIMED_MULTIPLIERS["Muon"]["quote"]
    assert tc.CLAIMED_MULTIPLIERS["Attention Residuals"]["factor"] == 1.25
    for claim in tc.CLAIMED_MULTIPLIERS.values():  # each factor in its own words
        assert f"{claim['factor']:g}×" in claim["quote"] and claim["source"] and claim["condition"]


def test_the_ratios_beside_the_headline():
    r = tc.size_ratios()
    assert r["params_headline"] == archs.gpt2_multiples()["headline"] == 22580
    k3, gpt2 = count_params(archs.KIMI_K3), count_params(archs.GPT2_SMALL)
    assert r["params"] == k3.total / gpt2.total
    assert r["per_token"] == k3.matmul_active / gpt2.matmul_active
    assert r["compute"] is None  # neither GPT-2's nor K3's report states its tokens
    assert tc.size_ratios("Kimi K2")["params_headline"] is None
    assert tc.compute_ratio(6.0, 3.0) == 2.0 and tc.compute_ratio(None, 3.0) is None
    with pytest.raises(ValueError, match="model"):
        tc.size_ratios("GPT-5")
    with pytest.raises(ValueError, match="denominator"):
        tc.compute_ratio(1.0, 0.0)


def test_bad_runs_are_refused():
    with pytest.raises(ValueError, match="runs"):
        tc.training_compute(["not a run"])
    with pytest.raises(ValueError, match="arch"):
        tc.training_compute((tc.TrainingRun("X", "NO_SUCH_ARCH", 1e9, "", "nowhere"),))


def test_the_module_imports_no_torch():
    code = ("import sys, gpt2k3.accounting.training as t; t.training_compute(); "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_the_chapters_table_is_the_accounting():
    from gpt2k3.book.figures.k3_tables import training_table

    headers, rows = training_table()
    by = {r[0]: r for r in rows}
    assert headers[3] == "C = 6ND, FLOP" and list(by) == [r.model for r in tc.TRAINING_RUNS]
    assert by["Kimi K2"][1:4] == ["31.69B", "15.5T", "2.95e24"]
    assert by["GPT-2 small"][1:4] == ["123.5M", "not stated", "—"]
    assert "40 GB" in by["GPT-2 small"][4] and "Radford" in by["GPT-2 small"][4]


def test_k3_report_values_are_the_quoted_ones():
    """Every value the book takes from Kimi K3's report is in the sentence it is quoted from,
    so a changed value or quote fails here, not in the prose."""
    from gpt2k3.accounting.training import K3_REPORT, k3_recipe_rows
    r = K3_REPORT
    assert f"{r['scaling_efficiency']['factor']:g}\u00d7" in r["scaling_efficiency"]["quote"]
    assert f"{r['scaling_efficiency']['factor']:g}\u00d7" in r["scaling_law"]["quote"]
    assert "data" in r["scaling_efficiency"]["quote"] and "training" in r["scaling_law"]["quote"]
    s = r["schedule"]
    assert f"{100 * s['warmup_fraction']:g}% linear warmup" in s["quote"]
    assert f"Weight decay is set to {s['weight_decay']:g}" in s["quote"]
    c = r["context"]
    assert f"from {c['pretraining'][0]} to {c['pretraining'][1]} tokens during pre-training" in c["quote"]
    assert f"from {c['cooldown'][0]} to {c['cooldown'][1]} tokens during the cooldown" in c["quote"]
    assert "four-stage" in c["quote"] and c["stages"] == 4
    assert "NoPE" in r["positions"]["quote"] and "WSD" in r["schedule_choice"]["quote"]
    # the report states no token count: the training run has none either
    assert r["tokens"]["disclosed"] is False
    assert next(run for run in tc.TRAINING_RUNS if run.model == "Kimi K3").tokens is None
    rows = k3_recipe_rows()
    assert all(len(row) == 3 for row in rows) and rows[-1][1] == "(not stated)"
