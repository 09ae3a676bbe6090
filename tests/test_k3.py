"""Chapter 9: the published Kimi K3 counted, its hybrid invariants, Kimi Linear's claims against
the roofline (both readings of TPOT), the GPT-2 -> K3 table, the chapter's figures and its
bounded explorer."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt2k3.book import figures
from gpt2k3.accounting import (H200, count_params, decode_bytes_per_token, kv_cache_bytes,
    kv_numbers_per_layer, max_batch, memory_per_sequence, roofline, serving_memory, serving_plan,
    state_bytes)
from gpt2k3.accounting.serving import WEIGHT_FORMATS, tpot_readings, weight_format
from gpt2k3.archs import (GPT2_SMALL, K3_TOTAL_PARAMS, KIMI_K3, KIMI_LINEAR_48B,
    KIMI_LINEAR_CLAIMS, PUBLISHED, gpt2_multiples, gpt2_to_k3_steps)
from gpt2k3.book import figures as F  # the figures and the tables of chapter 9
from gpt2k3.book.display import fmt_count
from gpt2k3.book.figures.gates import hybrid_spec

ONE_M = 1 << 20


# ----------------------------------------------------------------------------- the headline
def test_the_headline_ratio_is_recomputed():
    m = gpt2_multiples()
    assert m["gpt2"] == 124_439_808 and m["gpt2_rounded"] == 124_000_000
    assert m["headline"] == 22_580 and K3_TOTAL_PARAMS == 2.8e12
    assert round(m["exact"]) == 22_501
    # the published K3's exact count over GPT-2 small's exact count
    exact = gpt2_multiples(count_params(KIMI_K3).total)["exact"]
    assert exact == pytest.approx(2_779_484_393_568 / 124_439_808) and round(exact) == 22_336
    with pytest.raises(ValueError, match="total"):
        gpt2_multiples(-1)


def test_the_book_uses_the_published_k3_and_no_stand_in():
    import gpt2k3.archs as archs

    assert not hasattr(archs, "K3_SCALE") and not hasattr(archs, "K3_ASSUMPTIONS")
    assert KIMI_K3.name in [s.name for s in figures.registered_specs()]
    assert "K3-scale" not in [s.name for s in figures.registered_specs()]
    assert figures.H200_MEMORY_BYTES == 141e9  # chapter 7's reference line, the same H200
    assert round(count_params(KIMI_K3).total / 1e12, 2) == PUBLISHED["Kimi K3"]["total"] / 1e12


@pytest.mark.parametrize("changes, field", [
    (dict(top_k=897), "top_k"),                  # more active than total experts
    (dict(n_routed_experts=-896), "n_routed_experts"),
    (dict(n_embd=-7168), "n_embd"),
    (dict(kda_head_dim=0), "kda_n_head"),        # KDA layers need a head size
    (dict(n_layer=40), "kda_layers"),            # the schedule names layers up to 92
    (dict(kv_lora_rank=-1), "kv_lora_rank"),
    (dict(moe_latent_dim=8000), "moe_latent_dim"),   # a latent wider than the model
])
def test_impossible_k3_specs_raise(changes, field):
    with pytest.raises(ValueError, match=field):
        KIMI_K3.with_(**changes)


# ----------------------------------------------------------------------------- invariants
@settings(max_examples=40, deadline=None)
@given(ratio=st.one_of(st.none(), st.integers(0, 15)), n=st.integers(1, 1 << 21),
       k=st.integers(2, 5))
def test_cache_grows_linearly_in_attention_layers_and_not_in_kda_layers(ratio, n, k):
    s = hybrid_spec(KIMI_K3, ratio)
    per_attention_layer = kv_numbers_per_layer(s) * 2  # bf16
    assert kv_cache_bytes(s, n) == s.n_attention_layers * per_attention_layer * n
    assert kv_cache_bytes(s, k * n) == k * kv_cache_bytes(s, n)
    # the KDA layers' state is the same at any length
    grown = memory_per_sequence(s, k * n) - memory_per_sequence(s, n)
    assert grown == (k - 1) * kv_cache_bytes(s, n)
    assert state_bytes(s, 1, 4) == memory_per_sequence(s, n) - kv_cache_bytes(s, n)


def test_k3s_schedule_is_the_3_to_1_hybrid():
    assert hybrid_spec(KIMI_K3, 3).kda_layers == KIMI_K3.kda_layers
    assert (KIMI_K3.n_attention_layers, KIMI_K3.n_kda_layers) == (24, 69)
    # 24 MLA layers of 576 numbers (512 latent + 64 unrotated shared key) per token
    assert kv_numbers_per_layer(KIMI_K3) == 512 + 64
    assert kv_cache_bytes(KIMI_K3, ONE_M) == 24 * 576 * ONE_M * 2
    # 69 KDA layers of 96 heads x 128 x 128 float32, plus the conv tails (3 x 3 x 96 x 128)
    assert state_bytes(KIMI_K3) == 69 * (96 * 128 * 128 + 3 * 96 * 3 * 128) * 4


def test_ratio_zero_is_the_all_attention_model():
    zero = hybrid_spec(KIMI_K3, 0)
    full = KIMI_K3.with_(kda_layers=())
    assert zero.kda_layers == () and zero.with_(name=full.name) == full
    assert F.full_attention(KIMI_K3).with_(name=full.name) == full
    for n in (1024, ONE_M):
        assert kv_cache_bytes(zero, n) == kv_cache_bytes(full, n) == 93 * 576 * n * 2
        assert state_bytes(zero) == 0


def test_all_kda_has_no_growing_cache():
    s = hybrid_spec(KIMI_K3, None)
    assert s.n_attention_layers == 0
    assert all(kv_cache_bytes(s, n, batch=64) == 0 for n in (1, 4096, ONE_M, 1 << 24))
    assert memory_per_sequence(s, 1) == memory_per_sequence(s, 1 << 24) == state_bytes(s, 1, 4) > 0
    assert decode_bytes_per_token(s, 1 << 24) == decode_bytes_per_token(s, 1)


@pytest.mark.parametrize("spec", [KIMI_LINEAR_48B, KIMI_K3, KIMI_K3.with_(
    n_layer=92, kda_layers=tuple(i for i in range(91) if (i + 1) % 4))],
    ids=["Kimi Linear 48B", "Kimi K3", "92 layers"])
def test_the_3_to_1_hybrid_cuts_the_long_context_cache_by_75_percent(spec):
    full = F.full_attention(spec)
    cut = 1 - kv_cache_bytes(spec, ONE_M) / kv_cache_bytes(full, ONE_M)
    assert cut == pytest.approx(1 - spec.n_attention_layers / spec.n_layer)
    assert abs(cut - KIMI_LINEAR_CLAIMS["kv_cache_reduction"]) < 0.015
    if spec.n_layer % 4 == 0:
        assert cut == 0.75  # exactly a quarter of the layers attend
    # with the fixed KDA states counted, at a million tokens the cut is still within a point
    with_states = 1 - memory_per_sequence(spec, ONE_M) / memory_per_sequence(full, ONE_M)
    assert cut - 0.01 < with_states < cut
    assert F.hybrid_speedups(spec)["kv_reduction"] == pytest.approx(cut)


# ----------------------------------------------------------------------------- weight formats
def test_the_released_format_stores_experts_in_mxfp4_and_the_rest_in_bf16():
    from gpt2k3.accounting.params import checkpoint_bytes, packed_bytes_per_weight

    assert packed_bytes_per_weight(4, 32) == 0.5 + 1 / 32 == WEIGHT_FORMATS["mxfp4"][1]
    assert weight_format("mxfp4") == (2, 0.53125) and weight_format("bf16") == (2, None)
    c = count_params(KIMI_K3)
    routed = c.parts["routed experts"]
    m = serving_memory(KIMI_K3, 0, 0, 2, expert_bytes=0.53125)["weights"]
    assert m == (c.total - routed) * 2 + routed * 0.53125
    # the same bytes as the checkpoint's elements: packed experts and scales are uint8
    assert m == checkpoint_bytes(KIMI_K3, 4, 32, 2, router_bias=False)["total"]
    released = checkpoint_bytes(KIMI_K3, 4, 32, 2, a_log_stored=128, include_vision=True)
    assert released["routed experts"] == routed // 2 + routed // 32
    assert released["total"] - m == (82_432 + 2_208 + c.vision) * 2
    # H200s to hold the weights: bf16, fp8, MXFP4 experts
    n = {f: math.ceil(serving_memory(KIMI_K3, 0, 0, *(lambda w, e: (w,))(*weight_format(f)),
                                     expert_bytes=weight_format(f)[1])["weights"]
                      / H200.memory_bytes) for f in ("bf16", "fp8", "mxfp4")}
    assert n == {"bf16": 40, "fp8": 20, "mxfp4": 12}
    with pytest.raises(ValueError, match="weight format"):
        weight_format("fp4")
    with pytest.raises(ValueError, match="expert_bytes"):
        serving_memory(KIMI_K3, 0, 0, 2, expert_bytes=0)


def test_expert_bytes_change_only_the_routed_experts_read():
    bf16 = roofline(KIMI_K3, ONE_M, 64)
    mx = roofline(KIMI_K3, ONE_M, 64, expert_bytes=0.53125)
    same = roofline(KIMI_K3, ONE_M, 64, expert_bytes=2)
    assert same == bf16 and mx.flops_per_step == bf16.flops_per_step
    from gpt2k3.accounting import expected_distinct_experts
    routed = 92 * expected_distinct_experts(896, 16, 64) * KIMI_K3.expert_params
    assert bf16.bytes_per_step - mx.bytes_per_step == pytest.approx(routed * (2 - 0.53125))
    plan = serving_plan(KIMI_K3, ONE_M, 64, tp=8, expert_bytes=0.53125)
    assert plan.per_device["total"] <= H200.memory_bytes
    assert plan.n_devices <= serving_plan(KIMI_K3, ONE_M, 64, tp=8).n_devices


# ----------------------------------------------------------------------------- the claims
def test_published_claims_are_quoted_constants():
    c = KIMI_LINEAR_CLAIMS
    assert c["tpot_ms"] == {"Kimi Linear": 1.84, "MLA": 11.48}
    assert (c["tpot_speedup"], c["batch1_speedup"], c["kv_cache_reduction"]) == (6.3, (2.2, 2.3),
                                                                                0.75)
    assert c["context"] == ONE_M and "2510.26692" in c["where"]
    # the quoted times give 6.24x; the report rounds its own (unrounded) ratio to 6.3x
    assert c["tpot_ms"]["MLA"] / c["tpot_ms"]["Kimi Linear"] == pytest.approx(6.24, abs=0.01)


def test_the_two_readings_of_tpot():
    one = tpot_readings(KIMI_LINEAR_48B, ONE_M, 1)
    assert one["per_request"] == one["per_output_token"] == roofline(KIMI_LINEAR_48B, ONE_M).step_s
    five = tpot_readings(KIMI_LINEAR_48B, ONE_M, 5)
    r = roofline(KIMI_LINEAR_48B, ONE_M, 5)
    assert five["per_request"] == r.step_s == r.tpot_s > one["per_request"]   # a request waits
    assert five["per_output_token"] == r.step_s / 5 < one["per_output_token"]  # throughput grows
    assert five["tokens_per_s"] == pytest.approx(5 / r.step_s)


def test_the_roofline_against_the_published_speedups():
    r = F.hybrid_speedups(KIMI_LINEAR_48B, ONE_M)
    full = r["full"]
    assert full.kda_layers == () and full.n_layer == 27
    one = roofline(full, ONE_M).per_token_s / roofline(KIMI_LINEAR_48B, ONE_M).per_token_s
    assert r["batch1"] == pytest.approx(one)
    # batch 1: memory-bound, the roofline's ratio is above the published 2.2-2.3x
    assert r["batch1"] > KIMI_LINEAR_CLAIMS["batch1_speedup"][1]
    # memory-limited batches: one H200 holds one all-MLA 1M-token sequence and five hybrid ones
    assert r["batch"] == {"hybrid": max_batch(KIMI_LINEAR_48B, ONE_M),
                          "full": max_batch(full, ONE_M)} == {"hybrid": 5, "full": 1}
    assert r["batch1"] < r["memory_limited"] < r["ceiling"] < KIMI_LINEAR_CLAIMS["tpot_speedup"]
    eight = F.hybrid_speedups(KIMI_LINEAR_48B, ONE_M, n_devices=8)
    assert r["memory_limited"] < eight["memory_limited"] < eight["ceiling"]
    # the ceiling: all-MLA at batch 1 against the hybrid reading only its cache and state
    per_seq_h = kv_cache_bytes(KIMI_LINEAR_48B, ONE_M) + 2 * state_bytes(KIMI_LINEAR_48B, 1, 4)
    assert r["ceiling"] == pytest.approx(roofline(full, ONE_M).per_token_s * H200.bandwidth
                                         / per_seq_h)
    # per request, equal batches: the step-time ratio at the batch both hold, under the
    # per-sequence bytes ratio (about the cache ratio), far below 6.3x
    assert r["equal_batch"] == 1 and r["per_request"] == pytest.approx(r["batch1"])
    b = eight["equal_batch"]
    assert b == eight["batch"]["full"] == 31
    assert eight["per_request"] == pytest.approx(roofline(full, ONE_M, b, n_devices=8).step_s
                                                 / roofline(KIMI_LINEAR_48B, ONE_M, b,
                                                            n_devices=8).step_s)
    ceiling = kv_cache_bytes(full, ONE_M) / per_seq_h
    assert r["per_request_ceiling"] == pytest.approx(ceiling)
    assert r["batch1"] < eight["per_request"] < ceiling < 27 / 7 < KIMI_LINEAR_CLAIMS["tpot_speedup"]
    # the ratio climbs towards the ceiling as equal batches grow, never past it
    ratios = [roofline(full, ONE_M, n).step_s / roofline(KIMI_LINEAR_48B, ONE_M, n).step_s
              for n in (1, 16, 256, 4096)]
    assert ratios == sorted(ratios) and ratios[-1] < ceiling


def test_claims_rows_compare_computed_with_published():
    rows = F.claims_rows()
    unlike = "not like for like (the report credits larger batches); roofline lower even so"
    assert [r[3] for r in rows] == ["agrees", "roofline higher", unlike, unlike] + ["roofline lower"] * 2
    assert "75%" in rows[0][1] and "74.1%" in rows[0][2]
    assert f"{F.hybrid_speedups()['batch1']:.2f}×" == rows[1][2]
    assert "TPOT per request" in rows[2][0] and "step / batch" in rows[4][0]


# ----------------------------------------------------------------------------- GPT-2 -> K3
def test_what_changed_ends_at_the_published_k3():
    steps = gpt2_to_k3_steps()
    assert steps[0][2] == GPT2_SMALL
    assert steps[-1][2].with_(name=KIMI_K3.name) == KIMI_K3  # every field, vision included
    names = [s[0] for s in steps]
    for change in ("position encoding", "normalisation", "activation", "attention", "mixer",
                   "FFN → MoE", "latent experts", "output gates", "bounded decay", "SiTU-GLU",
                   "Attention Residuals"):
        assert change in names
    rows = F.what_changed_rows()
    assert [r[0] for r in rows] == names
    totals = [r[2] for r in rows]
    assert totals[-1] == count_params(KIMI_K3).total
    deltas = [r[3] for r in rows[1:]]
    assert deltas == [b - a for a, b in zip(totals, totals[1:])]
    by = {r[0]: r for r in rows}
    # dropping the learned positions removes a million-row table
    assert by["position encoding"][3] == -KIMI_K3.max_positions * KIMI_K3.n_embd
    # MLA caches 576 numbers per layer instead of 2 x 96 x 128; the hybrid keeps 24 layers
    assert by["activation"][5] == 93 * 2 * 96 * 128
    assert by["attention"][5] == 93 * 576 and by["mixer"][5] == 24 * 576
    # the bounded decay and SiTU change no count; latent experts halve the experts
    assert by["bounded decay"][3] == by["SiTU-GLU"][3] == 0
    assert by["latent experts"][3] == -92 * 896 * 3 * 3072 * (7168 - 3584) + 92 * (2 * 7168 * 3584 + 3584)
    assert by["Attention Residuals"][3] == (4 * 93 + 2) * 7168
    assert rows[-1][4] == count_params(KIMI_K3).active
    short = F.what_changed_table()
    assert [r[:2] for r in short] == [r[:2] for r in rows]
    assert short[2][3] == "−7.52B" and short[-1][2] == "2.78T" and short[0][3] == ""
    assert short[names.index("bounded decay")][3] == "0"
    assert fmt_count(4_974_592, sign=True) == "+4.97M" and fmt_count(0) == "0"


# ----------------------------------------------------------------------------- figures
def _steps(fig):
    (slider,) = fig.layout.sliders
    return slider.steps


def test_k3_params_adds_kimi_k3_to_chapter_7s_figure():
    fig = F.k3_params()
    steps = _steps(fig)
    assert steps[-1].label == "Kimi K3" and fig.layout.sliders[0].active == len(steps) - 1
    assert f"{count_params(KIMI_K3).total:,}" in fig.layout.title.text
    assert list(fig.data[0].x)[-1] == count_params(KIMI_K3).total
    with pytest.raises(ValueError, match="specs"):
        F.k3_params([])


def test_k3_hybrid_steps_carry_the_memory_of_each_schedule():
    fig = F.k3_hybrid()
    steps = _steps(fig)
    assert [s.label for s in steps][:4] == ["0:1", "1:1", "2:1", "3:1"]
    assert steps[-1].label == "all KDA"
    assert len(steps) == 17
    three = steps[3].args[0]
    assert three["y"][0][-1] == pytest.approx(memory_per_sequence(KIMI_K3, ONE_M) / 1e9, rel=1e-3)
    assert three["y"][1][-1] == pytest.approx(
        decode_bytes_per_token(KIMI_K3, ONE_M, 1, 2, 2, 4) / 1e9, rel=1e-3)
    assert f"{count_params(KIMI_K3).active / 1e9:.3g}B" in steps[3].args[1]["title.text"]
    assert list(fig.data[0].y) == three["y"][0]  # opens on 3:1, K3's own schedule
    assert fig.layout.xaxis.type == fig.layout.yaxis.type == "log"
    assert all(ax.title.text for ax in (fig.layout.xaxis, fig.layout.yaxis, fig.layout.yaxis2))
    with pytest.raises(ValueError, match="cache_dtype"):
        F.k3_hybrid(cache_dtype="fp4")


def test_k3_batching_roofline_and_devices_carry_the_accounting():
    fig = F.k3_batching(contexts=(1 << 17, ONE_M), batches=(1, 64))
    s = _steps(fig)[1].args[0]
    per_seq = kv_cache_bytes(KIMI_K3, ONE_M) + 2 * state_bytes(KIMI_K3, 1, 4)
    assert s["y"][1] == [pytest.approx(per_seq / 1e9, rel=1e-3)] * 2
    assert s["y"][2][1] == pytest.approx(decode_bytes_per_token(KIMI_K3, ONE_M, 64, 2, 2, 4) / 1e9,
                                         rel=1e-3)
    with pytest.raises(ValueError, match="weight_dtype"):
        F.k3_batching(weight_dtype="mxfp4")  # not one format for every weight

    fig = F.k3_roofline(batches=(1, 256), contexts=(4096, ONE_M))
    s = _steps(fig)[1].args[0]
    r = roofline(KIMI_K3, ONE_M, 256)
    assert s["y"][0][1] == pytest.approx(1e3 * r.memory_s / 256, rel=1e-3)
    assert s["y"][1][1] == pytest.approx(1e3 * r.compute_s / 256, rel=1e-3)
    mx = F.k3_roofline(batches=(1,), contexts=(ONE_M,), weight_dtype="mxfp4")
    assert _steps(mx)[0].args[0]["y"][0][0] == pytest.approx(
        1e3 * roofline(KIMI_K3, ONE_M, 1, expert_bytes=0.53125).memory_s, rel=1e-3)

    fig = F.k3_devices(batches=(1, 64), contexts=(4096, ONE_M))
    steps = _steps(fig)
    assert [st_.label for st_ in steps] == ["bf16", "fp8", "mxfp4"]
    from gpt2k3.accounting import devices_needed
    for step, fmt in zip(steps, ("bf16", "fp8", "mxfp4")):
        wb, eb = weight_format(fmt)
        ys = step.args[0]["y"]
        assert ys[1][1] == devices_needed(KIMI_K3, ONE_M, 64, weight_bytes=wb, expert_bytes=eb)
        assert ys[-1] == [devices_needed(KIMI_K3, 0, 0, weight_bytes=wb, expert_bytes=eb)] * 2
    assert steps[0].args[0]["y"][-1][0] == math.ceil(count_params(KIMI_K3).total * 2 / 141e9)
    assert steps[2].args[0]["y"][-1][0] == 12
    with pytest.raises(ValueError, match="weight_dtypes"):
        F.k3_devices(weight_dtypes=("fp16",))
    with pytest.raises(ValueError, match="batches"):
        F.k3_roofline(batches=(0,))


def test_kimi_linear_check_plots_both_readings_beside_the_published_points():
    fig = F.kimi_linear_check(contexts=(65536, ONE_M))
    steps = _steps(fig)
    assert [s.label for s in steps] == ["bf16", "fp8"]
    data = steps[0].args[0]
    assert len(data["y"]) == 7 and list(steps[0].args[2]) == list(range(7))
    r = F.hybrid_speedups(KIMI_LINEAR_48B, ONE_M)
    r8 = F.hybrid_speedups(KIMI_LINEAR_48B, ONE_M, n_devices=8)
    assert data["y"][0][-1] == pytest.approx(r["batch1"], rel=1e-3)
    assert data["y"][1][-1] == pytest.approx(r["memory_limited"], rel=1e-3)
    assert data["y"][3][-1] == pytest.approx(r["ceiling"], rel=1e-3)
    assert data["y"][5][-1] == pytest.approx(r8["per_request"], rel=1e-3)
    assert data["y"][6][-1] == pytest.approx(r["per_request_ceiling"], rel=1e-3)
    star = next(t for t in fig.data if "6.3" in t.name)
    assert list(star.y) == [6.3] and list(star.x) == [ONE_M]
    with pytest.raises(ValueError, match="cache_dtypes"):
        F.kimi_linear_check(cache_dtypes=("int8",))


def test_summary_and_plans():
    rows = dict(F.summary_rows())
    total = count_params(KIMI_K3).total
    assert rows["parameters: total / active per token"].startswith(f"{total:,}")
    plan = serving_plan(KIMI_K3, ONE_M, 1, tp=8)
    assert any(str(plan.n_devices) in v for v in rows.values())
    table = F.plan_rows()
    assert all(len(r) == 8 for r in table)
    assert table[0][:4] == ["bf16", "1M", 1, 8]
    assert table[0][4] == f"40 / {plan.n_devices} ({plan.machines})"
    assert any(r[0] == "mxfp4" for r in table)
    mx = dict(F.summary_rows(weight_dtype="mxfp4"))
    assert mx["weights (mxfp4)"] == "1.56 TB"
    with pytest.raises(ValueError, match="weight_dtype"):
        F.summary_rows(weight_dtype="fp16")


# ----------------------------------------------------------------------------- explorer
def test_k3_explorer_edits_any_field_and_reports_impossible_specs():
    from gpt2k3.book.widgets import k3_explorer
    from gpt2k3.book.widgets.k3 import spec_controls, spec_from_controls

    box = k3_explorer()
    c = box.controls
    editable = set(spec_controls(KIMI_K3))
    assert editable == set(KIMI_K3.field_names()) - {"name", "source", "kda_layers"}
    assert "vision" not in spec_controls(KIMI_LINEAR_48B)  # offered only when there is one
    assert editable <= set(c) and c["ratio"].value == 3
    assert "Kimi K3" in box.current.layout.title.text
    c["n_routed_experts"].value = 384
    total = count_params(KIMI_K3.with_(n_routed_experts=384)).total
    assert f"{total:,}" in box.current.data[0].cells.values[1][0]
    c["top_k"].value = 500  # more active than total experts
    assert "top_k" in box.current.value
    c["top_k"].value = 8
    c["q_lora_rank"].value = "None"
    c["kda_gate_lower_bound"].value = "None"
    c["vision"].value = False
    assert box.current.data[0].cells.values[1][0] != ""
    c["ratio"].value = None
    assert box.current.data[0].cells.values[1][2].startswith("0 B")
    spec = spec_from_controls(KIMI_K3, {"n_layer": 8, "d_ff": " none ", "first_k_dense": 1,
                                        "vision": False}, 1)
    assert spec.kda_layers == (0, 2, 4, 6) and spec.d_ff is None and spec.vision is None
    assert spec_from_controls(KIMI_K3, {"kda_gate_lower_bound": "-2.5"}, 3).kda_gate_lower_bound == -2.5
    with pytest.raises(ValueError, match="d_head"):
        spec_from_controls(KIMI_K3, {"d_head": "wide"}, 3)


def test_every_explorer_control_is_bounded():
    """Issue #19: a number box took n_layer = 10**12 and the kernel hung building the layers."""
    import ipywidgets as W

    from gpt2k3.book.widgets import k3_explorer
    from gpt2k3.book.widgets.k3 import FIELD_BOUNDS, spec_from_controls

    box = k3_explorer()
    for name, w in box.controls.items():
        assert not isinstance(w, (W.IntText, W.FloatText)), f"{name} is an unbounded number box"
        if isinstance(w, W.BoundedIntText):
            assert (w.min, w.max) == FIELD_BOUNDS[name]
            assert w.min <= getattr(KIMI_K3, name) <= w.max
    c = box.controls
    c["n_layer"].value = 10 ** 12          # clamped by the box, and computed at once
    assert c["n_layer"].value == FIELD_BOUNDS["n_layer"][1]
    assert "edited" in box.current.layout.title.text
    c["n_layer"].value = KIMI_K3.n_layer
    c["q_lora_rank"].value = str(10 ** 12)  # a text box: refused with the field's name
    assert "q_lora_rank" in box.current.value
    for bad in ({"n_layer": 10 ** 12}, {"n_embd": 0}, {"kda_gate_lower_bound": "-1e9"},
                {"n_kv_head": str(10 ** 9)}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            spec_from_controls(KIMI_K3, bad, 3)
