"""Chapter 6's explorables: slider steps carry the experiments' numbers; the explorers redraw."""

import math

import plotly.graph_objects as go
import pytest

from gpt2k3.book import figures
from gpt2k3.experiments import forgetting as fg
from gpt2k3 import accounting
from gpt2k3.accounting import kv_cache_bytes, kv_numbers_per_layer, state_bytes
from gpt2k3.archs import GPT2_SMALL, KIMI_LINEAR_48B
from gpt2k3.book.display import fmt_bytes, fmt_decimal_bytes


def steps_of(fig):
    (slider,) = fig.layout.sliders
    return slider.steps


def test_forgetting_by_age_steps():
    fig = figures.forgetting_by_age(d=8, lengths=(8, 16), log_alpha=-0.1, trials=4, active=1)
    s8, s16 = steps_of(fig)
    assert [s8.label, s16.label] == ["8", "16"]
    delta = fg.recall_by_age(8, 16, rule="delta", trials=4)
    # 4 digits; the newest pair's exact-zero error (rounding noise) is stored as 0
    assert s16.args[0]["y"][2] == pytest.approx([float(f"{e:.4g}") for e in delta.error], abs=1e-12)
    assert s16.args[0]["x"][0] == list(range(16)) and s8.args[0]["x"][0] == list(range(8))
    assert list(fig.data[2].y) == s16.args[0]["y"][2]  # opens on the active step
    assert [t.name for t in fig.data] == ["linear attention", "linear attention + gate", "DeltaNet",
                                          "Gated DeltaNet"]
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text


def test_memory_half_life_steps():
    fig = figures.memory_half_life(log_alphas=(0.0, -0.05), d=8, beta=0.5, n_tokens=64, trials=8)
    no_gate, gated = steps_of(fig)
    assert no_gate.args[0]["x"][3] == [None, None]  # no half-life line without a gate
    h = fg.half_life(-0.05)
    assert gated.args[0]["x"][3] == pytest.approx([h, h], rel=1e-5)  # figure data keeps 6 digits
    x = gated.args[0]["x"][0]
    assert x[0] == 1 and x[-1] == 64 and x == sorted(set(x))
    idle = gated.args[0]["y"][0]
    assert idle == pytest.approx([math.exp(-0.05 * t) for t in x], rel=1e-3)
    expected = fg.expected_signal(x, 8, log_alpha=-0.05, beta=0.5)
    assert gated.args[0]["y"][2] == pytest.approx(expected, rel=1e-3)
    assert "never fades" in no_gate.args[1]["title.text"]
    assert fig.layout.xaxis.type == "log"


def test_channel_decay_steps():
    fig = figures.channel_decay(d=8, keeps=(2, 6), log_alpha_fast=-0.2, n_tokens=20, active=0)
    two, six = steps_of(fig)
    assert two.args[0]["y"][0] == pytest.approx([1.0] * 2 + [math.exp(-0.2)] * 6, rel=1e-3)
    assert two.args[0]["y"][1] == pytest.approx([math.exp(-0.2 * 6 / 8)] * 2, rel=1e-3)
    assert two.args[0]["y"][2] == pytest.approx([1.0] * 21)  # the kept fact
    assert six.args[0]["y"][3] == pytest.approx([math.exp(-0.2 * t) for t in range(21)], rel=1e-3)
    assert six.args[0]["y"][4] == pytest.approx([math.exp(-0.05 * t) for t in range(21)], rel=1e-3)
    with pytest.raises(ValueError, match=r"each entry of keeps must be an int in \[1, d - 1 = 7\]"):
        figures.channel_decay(d=8, keeps=(0,))
    with pytest.raises(ValueError, match="log_alpha_fast must be < 0"):
        figures.channel_decay(d=8, keeps=(2,), log_alpha_fast=0.0)


def test_distractor_retrieval_steps():
    fig = figures.distractor_retrieval(log_alphas=(-0.05, -1.0), d=8, keep=4, n_tokens=16, trials=8)
    weak, strong = steps_of(fig)
    names = [t.name for t in fig.data]
    assert names == ["Gated DeltaNet", "KDA", "DeltaNet"] * 2
    kw = dict(beta=0.5, fact_channels=range(4), trials=8)
    gdn = fg.fact_recall(8, 16, log_alpha=-0.5, **kw)  # mean of [0]*4 + [-1.0]*4
    assert strong.args[0]["y"][0] == [float(f"{s:.4g}") for s in gdn.signal]
    assert strong.args[0]["y"][2] == weak.args[0]["y"][2]  # DeltaNet does not depend on the gate
    assert strong.args[0]["y"][0][-1] < weak.args[0]["y"][0][-1]  # a stronger scalar gate loses more
    routed = figures.distractor_retrieval(log_alphas=(-1.0,), d=8, keep=4, n_tokens=16, trials=8,
                                          distractors_in="forgetting")
    assert not routed.layout.sliders  # one setting: no slider
    kda_signal = routed.data[1].y
    assert list(kda_signal) == pytest.approx([1.0] * 17)  # distractors never touch the fact
    with pytest.raises(ValueError, match="distractors_in must be 'all' or 'forgetting'"):
        figures.distractor_retrieval(distractors_in="some")
    with pytest.raises(ValueError, match=r"keep must be in \[1, d - 1 = 7\]"):
        figures.distractor_retrieval(d=8, keep=8)


# --------------------------------------------------------------------------- the hybrid
def test_hybrid_cache_bytes_agree_with_accounting():
    L = 1 << 20
    kimi = figures.hybrid_cache_bytes(KIMI_LINEAR_48B, 3, L)
    assert kimi["kv"] == kv_cache_bytes(KIMI_LINEAR_48B, L)  # the published schedule is 3:1
    assert kimi["state"] == state_bytes(KIMI_LINEAR_48B, dtype_bytes=4) == state_bytes(KIMI_LINEAR_48B)
    assert sum(kimi["per_layer"]) == kimi["total"] == kimi["kv"] + kimi["state"]
    assert kimi["kinds"].count("kda") == 20
    full = figures.hybrid_cache_bytes(KIMI_LINEAR_48B, 0, L)
    assert full["state"] == 0 and full["total"] == 27 * kv_numbers_per_layer(KIMI_LINEAR_48B) * L * 2
    none = figures.hybrid_cache_bytes(KIMI_LINEAR_48B, None, L)
    assert none["kv"] == 0 and none["total"] == figures.hybrid_cache_bytes(KIMI_LINEAR_48B, None, 1)["total"]
    assert figures.hybrid_spec(KIMI_LINEAR_48B, 1).n_attention_layers == 14
    with pytest.raises(ValueError):
        figures.hybrid_spec(GPT2_SMALL, 3)  # no KDA sizes to build KDA layers from
    with pytest.raises(ValueError, match="spec must be an ArchSpec"):
        figures.hybrid_spec("Kimi", 3)
    with pytest.raises(ValueError, match="ratio"):
        figures.hybrid_spec(KIMI_LINEAR_48B, -1)
    # the figures' names are the accounting's: one definition of the schedules
    assert figures.hybrid_spec is accounting.hybrid_spec
    assert figures.hybrid_cache_bytes is accounting.hybrid_cache_bytes
    assert figures.ratio_label is accounting.ratio_label
    assert figures.hybrid_spec(KIMI_LINEAR_48B, None).kda_layers == tuple(range(27))
    assert accounting.full_attention(KIMI_LINEAR_48B).kda_layers == ()


def test_hybrid_cache_figure():
    fig = figures.hybrid_cache(ratios=(0, 3, None), context_len=1 << 16)
    full, kimi, linear = steps_of(fig)
    assert [s.label for s in (full, kimi, linear)] == ["all attention", "3:1", "all KDA"]
    assert len(full.args[0]["x"][0]) == 27 and full.args[0]["x"][1] == []
    assert kimi.args[0]["x"][0] == [4, 8, 12, 16, 20, 24, 27]
    assert linear.args[0]["x"][0] == [] and len(linear.args[0]["x"][1]) == 27
    assert list(kimi.args[2]) == [0, 1, 3]  # the all-attention reference line stays put
    totals = kimi.args[0]["y"][2]
    assert totals[-1] == figures.hybrid_cache_bytes(KIMI_LINEAR_48B, 3, 1 << 16)["total"]
    assert fmt_decimal_bytes(totals[-1]) in kimi.args[1]["title.text"]  # decimal, as chapters 7-9
    assert "7 of 27 layers keep a growing cache" in kimi.args[1]["title.text"]
    assert fig.layout.yaxis.type == "log" and fig.layout.xaxis2.type == "log"


def test_labels_and_bytes():
    assert figures.ratio_label(0) == "all attention"
    assert figures.ratio_label(3) == "3:1"
    assert figures.ratio_label(None) == "all KDA"
    assert fmt_bytes(512) == "512 B" and fmt_bytes(1536) == "1.5 KiB"
    assert fmt_bytes(3 * 2**30) == "3 GiB"
    with pytest.raises(ValueError):
        fmt_bytes(-1)


# --------------------------------------------------------------------------- live explorers
def test_half_life_explorer():
    from gpt2k3.book.widgets import half_life_explorer

    box = half_life_explorer()
    c = box.controls
    c["n_tokens"].value = 256
    c["half"].value = 16
    assert isinstance(box.current, go.Figure) and not box.current.layout.sliders
    assert box.current.data[3].x == (16.0, 16.0) or list(box.current.data[3].x) == pytest.approx([16, 16])
    c["no_gate"].value = True
    assert "never fades" in box.current.layout.title.text


def test_retrieval_explorer_keeps_keep_below_d():
    from gpt2k3.book.widgets import retrieval_explorer

    box = retrieval_explorer()
    c = box.controls
    c["n_tokens"].value = 16
    c["d"].value = 4
    assert c["keep"].max == 3 and c["keep"].value == 3
    c["where"].value = "forgetting"
    assert "forgetting channels only" in box.current.layout.title.text


def test_hybrid_explorer():
    from gpt2k3.book.widgets import hybrid_explorer

    box = hybrid_explorer()
    assert "7 of 27 layers" in box.current.layout.title.text
    box.controls["all_kda"].value = True
    assert "0 of 27 layers" in box.current.layout.title.text
    box.controls["all_kda"].value = False
    box.controls["n_layer"].value = 8
    box.controls["ratio"].value = 1
    assert "4 of 8 layers" in box.current.layout.title.text
