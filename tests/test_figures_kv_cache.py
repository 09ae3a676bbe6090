"""Chapter 2's figures: slider steps carry the accounting's numbers."""

import json
from pathlib import Path

import pytest

from gpt2k3.book import figures as F
from gpt2k3.accounting import (cache_bound_context, decode_bytes, kv_cache_bytes, state_bytes,
    weights_read_per_step)
from gpt2k3.archs import DEEPSEEK_V3, GPT2_FAMILY, GPT2_SMALL, KIMI_LINEAR_48B
from gpt2k3.book.display import fmt_bytes
from gpt2k3.book.figures.kv_cache import log_grid, weight_and_cache_bytes

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def test_registered_specs_include_the_gpt2_family():
    names = [s.name for s in F.registered_specs()]
    assert names[:4] == [s.name for s in GPT2_FAMILY]


def test_fmt_bytes_and_log_grid():
    assert fmt_bytes(1536) == "1.5 KiB"
    assert fmt_bytes(3 * 2**30) == "3 GiB"
    assert fmt_bytes(12) == "12 B"
    g = log_grid(1, 1 << 20)
    assert g[0] == 1 and g[-1] == 1 << 20 and g == sorted(set(g))
    with pytest.raises(ValueError):
        log_grid(0, 10)
    with pytest.raises(ValueError):
        fmt_bytes(-1)


def test_weight_and_cache_bytes_are_the_one_decode_model():
    w, c = weight_and_cache_bytes(GPT2_SMALL, 100, batch=2, weight_bytes=2, cache_bytes=0.5)
    assert w == weights_read_per_step(GPT2_SMALL, 2) * 2
    assert c == kv_cache_bytes(GPT2_SMALL, 100, batch=2, dtype_bytes=0.5)
    # a mixture of experts: a batch wakes more experts, so the weights read per step grow
    w1, _ = weight_and_cache_bytes(DEEPSEEK_V3, 4096, 1)
    w256, _ = weight_and_cache_bytes(DEEPSEEK_V3, 4096, 256)
    assert w256 > 2 * w1 and w256 == decode_bytes(DEEPSEEK_V3, 4096, 256).weights
    # a hybrid: the cache part carries the KDA states, read and written, in float32
    w, c = weight_and_cache_bytes(KIMI_LINEAR_48B, 4096, 3)
    assert c == kv_cache_bytes(KIMI_LINEAR_48B, 4096, 3) + 2 * state_bytes(KIMI_LINEAR_48B, 3, 4)
    assert w + c == decode_bytes(KIMI_LINEAR_48B, 4096, 3).total
    with pytest.raises(ValueError, match="weight_bytes"):
        weight_and_cache_bytes(GPT2_SMALL, 1, weight_bytes=0)


def test_cache_growth_steps_are_the_accounting():
    fig = F.cache_growth(GPT2_FAMILY, batches=(1, 4), dtype="fp32")
    steps = fig.layout.sliders[0].steps
    assert [s.label for s in steps] == [s.name for s in GPT2_FAMILY]
    x = steps[1].args[0]["x"][0]
    y = steps[1].args[0]["y"][1]  # batch 4
    assert x[0] == 1 and x[-1] == 1 << 20
    assert y[-1] == kv_cache_bytes(GPT2_FAMILY[1], 1 << 20, batch=4, dtype_bytes=4)
    with pytest.raises(ValueError, match="dtype"):
        F.cache_growth(dtype="fp12")


def test_decode_step_bytes_slider_over_context_and_single_context():
    fig = F.decode_step_bytes(GPT2_FAMILY, contexts=(1, 65536))
    s1, s2 = fig.layout.sliders[0].steps
    assert s1.args[0]["y"][0] == s2.args[0]["y"][0]        # weights do not depend on context
    assert s2.args[0]["y"][1][0] > s1.args[0]["y"][1][0]    # the cache does
    assert "cache-bound" in s2.args[1]["title.text"]
    single = F.decode_step_bytes(GPT2_FAMILY, contexts=(8,))
    assert not single.layout.sliders and single.data[1].y[0] == kv_cache_bytes(GPT2_SMALL, 8)
    with pytest.raises(ValueError, match="batch"):
        F.decode_step_bytes(batch=0)


def test_crossover_is_where_cache_equals_weights():
    fig = F.cache_bound_crossover([GPT2_SMALL, DEEPSEEK_V3], batches=(1, 8),
                                  cache_dtypes=("bf16", "fp8"))
    bf16, fp8 = fig.layout.sliders[0].steps
    n1 = bf16.args[0]["y"][0][0]
    assert n1 == pytest.approx(cache_bound_context(GPT2_SMALL, 1), rel=1e-5)
    w, c = weight_and_cache_bytes(GPT2_SMALL, round(n1), 1)
    assert abs(c / w - 1) < 1e-3
    assert fp8.args[0]["y"][0][0] == pytest.approx(2 * n1, rel=1e-5)       # half the bytes, twice the tokens
    # 8 sequences share a dense model's weights (each reads its own position row): about n1 / 8
    n8 = weights_read_per_step(GPT2_SMALL, 8) * 2 / 8 / kv_cache_bytes(GPT2_SMALL, 1)
    assert bf16.args[0]["y"][0][1] == pytest.approx(n8, rel=1e-5)
    assert n8 == pytest.approx(n1 / 8, rel=1e-4)
    # a mixture of experts: 8 tokens wake more experts, the crossover falls by less than 8x
    v1, v8 = bf16.args[0]["y"][1]
    assert v1 == pytest.approx(cache_bound_context(DEEPSEEK_V3, 1), rel=1e-5)
    assert v1 / 8 < v8 < v1


def test_cache_explorer_renders_and_rejects_empty_choice():
    from gpt2k3.book.widgets import cache_explorer

    e = cache_explorer()
    assert "Context 4,096" in e.current.layout.title.text
    e.controls["context"].value = 1 << 20
    assert "1,048,576" in e.current.layout.title.text
    e.controls["model"].value = ()
    assert "at least one model" in e.current.value


@pytest.mark.skipif(not (RESULTS / "decode_cpu.json").exists(), reason="no decode benchmark results")
def test_benchmark_results_plot():
    r = json.loads((RESULTS / "decode_cpu.json").read_text())
    assert r["tokens_identical"] is True
    assert len(F.decode_speed(r).data[0].y) == len(r["tokens_per_s"]) + ("fast_decoder" in r)
    assert len(F.decode_roofline({"CPU": r}).data) == 2
    # the dashed line is a yardstick, not a ceiling: a decoder may reach or pass it
    line = F.decode_speed(r).layout.annotations[0].text
    assert line.startswith("bandwidth estimate") and "bound" not in line


def test_cache_growth_title_is_the_exact_crossing():
    from gpt2k3.accounting.decode import weights_cache_crossing

    fig = F.cache_growth(GPT2_FAMILY, batches=(1,), dtype="bf16")
    for spec, step in zip(GPT2_FAMILY, fig.layout.sliders[0].steps):
        n = weights_cache_crossing(spec, 1, 2, 2)
        assert f"beyond {n:,.0f} tokens" in step.args[1]["title.text"]
        weights = step.args[0]["y"][-1][0]
        assert weights == weights_cache_crossing(spec, 1, 2, 2) * kv_cache_bytes(spec, 1)
    tiny = F.cache_growth([GPT2_SMALL], batches=(1,), max_context=64)
    assert "stays below" in tiny.layout.sliders[0].steps[0].args[1]["title.text"]


def _sweep_result():
    rows = []
    for n, (pre, cat) in ((8192, (0.01, 0.03)), (32768, (0.02, 0.15))):
        rows.append({"context": n, "seconds_per_step": {"preallocated cache": pre, "concatenating cache": cat},
                     "ratio": cat / pre, "traffic_ratio": 2.99,
                     "roofline_seconds": {"preallocated cache": pre / 2, "concatenating cache": cat / 4},
                     "copies_into_reused_memory_seconds": pre})
    return {"rows": rows, "machine": {"cpu": "test CPU", "torch_threads": 1},
            "model": {"n_layer": 4, "n_embd": 256, "vocab_size": 512}, "config": {"dtype": "float32"}}


def test_concat_vs_preallocated_lays_out_the_sweep():
    from gpt2k3.book.figures.kv_cache import concat_vs_preallocated

    r = _sweep_result()
    fig = concat_vs_preallocated(r)
    assert len(fig.data) == 4
    pre, pre_roof, cat, cat_roof = fig.data
    assert list(pre.x) == [8192, 32768] and list(cat.y) == [30.0, 150.0]
    assert list(pre_roof.y) == [5.0, 10.0] and cat.customdata[1][0] == pytest.approx(7.5)
    assert "test CPU" in fig.layout.title.text
    for bad in ({}, {"rows": []}, None):
        with pytest.raises(ValueError, match="result"):
            concat_vs_preallocated(bad)


@pytest.mark.skipif(not (RESULTS / "decode_concat_cpu.json").exists(), reason="no concat sweep results")
def test_concat_sweep_results_plot():
    from gpt2k3.book.figures.kv_cache import concat_vs_preallocated

    r = json.loads((RESULTS / "decode_concat_cpu.json").read_text())
    assert r["config"]["finite_checks_skipped"] is True and r["machine"]["load_average_1min"]
    for row in r["rows"]:
        assert row["ratio"] == pytest.approx(row["seconds_per_step"]["concatenating cache"]
                                             / row["seconds_per_step"]["preallocated cache"])
        assert 2.9 < row["traffic_ratio"] < 3
    assert len(concat_vs_preallocated(r).data) == 4


def test_kv_cache_schematic_writes_then_reads_every_filled_slot():
    from gpt2k3.book.figures import kv_cache_schematic
    fig = kv_cache_schematic(max_len=8, prompt_len=3, n_steps=2)
    steps = fig.layout.sliders[0].steps
    assert [s.label for s in steps] == ["prefill", "1", "2"]
    prefill, step2 = steps[0].args[0], steps[2].args[0]
    assert list(prefill["x"][2]) == [0, 1, 2]            # the prompt's queries read slots 0..2
    assert list(step2["x"][2]) == [0, 1, 2, 3, 4]        # step 2 writes slot 4, reads 0..4
    colors = step2["marker.color"][0]
    assert colors[4] != colors[3] != colors[5]           # new, cached, empty
    with pytest.raises(ValueError, match="max_len"):
        kv_cache_schematic(max_len=4, prompt_len=3, n_steps=2)


def test_byte_axes_read_as_bytes_not_billions():
    from gpt2k3.book.figures import cache_growth, decode_step_bytes
    for fig in (cache_growth(), decode_step_bytes(contexts=(1, 4096))):
        assert fig.layout.yaxis.exponentformat == "SI" and fig.layout.yaxis.ticksuffix == "B"
