"""Chapter 3's explorables and the arithmetic they share with benchmarks/crossover.py."""

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from gpt2k3.book import figures
from gpt2k3.book.figures.linear import fmt_bytes, fmt_seconds
from gpt2k3.cache import ModelCache, StateCache
from gpt2k3.layers.linear_attention import state_nbytes
from gpt2k3.cache import KVCache

ROOT = Path(__file__).resolve().parents[1]


def _steps(fig):
    (slider,) = fig.layout.sliders
    return slider.steps


# --------------------------------------------------------------------------- the seed's leak


@pytest.mark.parametrize("changed", [1, 4, 7])
def test_prefill_leak_ours_is_causal_seed_is_not(changed):
    d = figures.prefill_leak(T=8, D=6, changed=changed, seed=3)
    assert d["position"] == list(range(8))
    assert all(x == 0.0 for x in d["ours"][:changed])  # exactly: nothing before it moves
    assert d["ours"][changed] > 0
    assert all(x > 1e-6 for x in d["seed"])  # every position moved, the first included


def test_prefill_leak_rejects_bad_positions():
    for kw, match in ((dict(changed=8), "changed must be a position"), (dict(T=1), "T must be"),
                      (dict(changed=-1), "changed must be")):
        with pytest.raises(ValueError, match=match):
            figures.prefill_leak(**{"T": 8, **kw})


def test_seed_prefill_leak_slider():
    fig = figures.seed_prefill_leak(T=6, D=4)
    steps = _steps(fig)
    assert [s.label for s in steps] == ["1", "2", "3", "4", "5"]
    for s in steps:
        j = int(s.label)
        seed_y, ours_y = s.args[0]["y"]
        assert seed_y == figures.prefill_leak(6, 4, j, 0)["seed"]
        assert ours_y[:j] == [0.0] * j
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text


# --------------------------------------------------------------------------- bytes and work


def test_counts_closed_forms_match_sums_and_caches():
    D, L, H = 8, 3, 2
    c = figures.state_vs_cache_counts([1, 5, 40], D, L, H, dtype_bytes=4)
    for i, n in enumerate([1, 5, 40]):
        assert c["kv_total_macs"][i] == L * H * sum(2 * m * D for m in range(1, n + 1))
        assert c["no_cache_total_macs"][i] == L * H * sum(m * (m + 1) * D for m in range(1, n + 1))
        assert c["state_total_macs"][i] == n * c["state_step_macs"][i]
    # the byte counts are what the real caches hold
    kv = ModelCache(KVCache(1, H, 40, D) for _ in range(L))
    for layer in kv:
        layer.extend(torch.zeros(1, H, 40, D), torch.zeros(1, H, 40, D))
    assert c["kv_bytes"][2] == kv.used_nbytes
    st = ModelCache(StateCache() for _ in range(L))
    for layer in st:
        layer.extend((torch.zeros(1, H, D, D), torch.zeros(1, H, D)), 1)
    assert c["state_bytes"][0] == st.nbytes == state_nbytes(L, H, D)


def test_counts_crossovers():
    D = 64
    n = np.arange(1, 400)
    c = figures.state_vs_cache_counts(n, D)
    assert n[np.argmax(c["kv_bytes"] >= c["state_bytes"])] == math.ceil((D + 1) / 2)
    assert n[np.argmax(c["kv_step_macs"] >= c["state_step_macs"])] == D + 1
    assert n[np.argmax(c["kv_total_macs"] >= c["state_total_macs"])] == 2 * D + 1


@pytest.mark.parametrize("kw", [dict(n=0), dict(n=[1.5]), dict(n=[]), dict(head_dim=0), dict(n_layer=-1),
                                dict(dtype_bytes=2.0)])
def test_counts_reject_bad_input(kw):
    args = {"n": [1, 2], "head_dim": 4, **kw}
    with pytest.raises(ValueError):
        figures.state_vs_cache_counts(**args)


def test_state_vs_cache_figure():
    fig = figures.state_vs_cache(head_dims=(32, 128), n_layer=2, n_head=3, max_n=4096, active=0)
    s32, s128 = _steps(fig)
    assert (s32.label, s128.label) == ("32", "128")
    ns = s32.args[0]["x"][0]
    assert ns[0] == 1 and ns[-1] == 4096
    kv_bytes = s128.args[0]["y"][0]
    assert kv_bytes[-1] == 2 * 2 * 3 * 4096 * 128 * 4
    assert s128.args[0]["y"][1][0] == state_nbytes(2, 3, 128)
    assert list(fig.data[0].y) == s32.args[0]["y"][0]
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    single = figures.state_vs_cache([64], max_n=1024)
    assert not single.layout.sliders and "D = 64" in single.layout.title.text
    with pytest.raises(ValueError, match="head_dims"):
        figures.state_vs_cache([])


# --------------------------------------------------------------------------- softmax vs ELU+1


def test_feature_map_weights_rows_and_limits():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(10, 8, generator=g), torch.randn(10, 8, generator=g)
    for c in (0.1, 1.0, 30.0):
        w = figures.feature_map_weights_data(q, k, c)
        for name in ("softmax", "linear"):
            assert torch.allclose(w[name].sum(-1), torch.ones(10, dtype=torch.float64))
            assert (w[name].triu(1) == 0).all() and (w[name] >= 0).all()
    # softmax sharpens without bound as the scores grow; ELU+1 weights approach a limit
    sharp_soft = figures.feature_map_weights_data(q, k, 30.0)["softmax"][-1].max()
    sharp_lin = figures.feature_map_weights_data(q, k, 30.0)["linear"][-1].max()
    limit_lin = figures.feature_map_weights_data(q, k, 3000.0)["linear"][-1].max()
    assert sharp_soft > 0.99 and sharp_lin < 0.6
    assert abs(float(sharp_lin - limit_lin)) < 0.02


def test_feature_map_weights_figure():
    fig = figures.feature_map_weights(T=6, D=4, scales=(0.5, 4), active=1)
    lo, hi = _steps(fig)
    z_soft = hi.args[0]["z"][0]
    assert z_soft[0][1] is None and abs(sum(z_soft[-1]) - 1) < 1e-9
    assert list(fig.data[0].z[0])[0] == pytest.approx(1.0)
    assert "top weight" in fig.layout.title.text
    single = figures.feature_map_weights(scales=[2.0])
    assert not single.layout.sliders
    with pytest.raises(ValueError, match="scale must be"):
        figures.feature_map_weights_data(torch.zeros(3, 2), torch.zeros(3, 2), 0)
    with pytest.raises(ValueError, match="k must have the shape of q"):
        figures.feature_map_weights_data(torch.zeros(3, 2), torch.zeros(3, 3))


# --------------------------------------------------------------------------- crossover and totals


def test_first_crossing_and_crossover_n():
    ns = [1, 2, 4, 8, 16]
    assert figures.first_crossing(ns, [2, 2, 2, 2, 2]) == 1.0
    assert figures.first_crossing(ns, [0.5, 0.6, 0.7, 0.8, 0.9]) is None
    # a power law ratio = N / 4 crosses 1 at N = 4 exactly (log-log linear)
    assert figures.first_crossing(ns, [n / 4 for n in ns]) == pytest.approx(4.0)
    # a noisy early win does not count: it must stay above for the rest of the range
    assert figures.first_crossing(ns, [3, 0.5, 0.5, 1.0, 4.0], 1.0) == pytest.approx(8.0)
    assert figures.crossover_n(ns, [n * 1.0 for n in ns], [3.0] * 5) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="strictly increasing"):
        figures.first_crossing([1, 1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="same non-zero length"):
        figures.crossover_n([1, 2], [1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite and > 0"):
        figures.crossover_n([1, 2], [0.0, 1.0], [1.0, 1.0])


def test_generation_totals():
    ns = [1, 4, 16]
    # constant step time: total = N * t
    tot, ext = figures.generation_totals(ns, [2.0, 2.0, 2.0], [1, 10, 16])
    assert tot == pytest.approx([2.0, 20.0, 32.0]) and ext == [False, False, False]
    # linear step time t(n) = n: exact on a log-log grid, total = N (N + 1) / 2
    tot, _ = figures.generation_totals(ns, [1.0, 4.0, 16.0], [16])
    assert tot == pytest.approx([136.0])
    # quadratic steps, extrapolated by the fitted power law: sum n^2 = N (N + 1) (2N + 1) / 6
    tot, ext = figures.generation_totals(ns, [1.0, 16.0, 256.0], [64], fit_points=3)
    assert ext == [True] and tot[0] == pytest.approx(64 * 65 * 129 / 6)
    # without a fit the last step time is held
    tot, _ = figures.generation_totals([1, 2], [1.0, 2.0], [4])
    assert tot == pytest.approx([1 + 2 + 2 + 2])
    with pytest.raises(ValueError, match="fit_points"):
        figures.generation_totals([1, 2], [1.0, 2.0], [8], fit_points=3)
    with pytest.raises(ValueError, match="lengths"):
        figures.generation_totals([1, 2], [1.0, 2.0], [0])


def test_fmt():
    assert fmt_bytes(512) == "512 B" and fmt_bytes(1536) == "1.5 KiB" and fmt_bytes(3 * 2**30) == "3 GiB"
    assert fmt_seconds(0.0123) == "12.3 ms" and fmt_seconds(2.5) == "2.5 s" and fmt_seconds(4e-6) == "4 µs"


# --------------------------------------------------------------------------- the benchmark's results


@pytest.fixture(scope="module")
def smoke_result(tmp_path_factory):
    """Run benchmarks/crossover.py on a tiny grid: the chapter's loaders must accept its output."""
    spec = importlib.util.spec_from_file_location("crossover_bench", ROOT / "benchmarks" / "crossover.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path_factory.mktemp("bench") / "crossover_cpu.json"
    bench.main(["--quick", "--device", "cpu", "--head-dims", "8", "16", "--heads", "2", "--max-n", "64",
                "--no-cache-max-n", "16", "--direct-n", "8", "--direct-n-no-cache", "4", "--repeats", "1",
                "--min-time", "0.0005", "--out", str(out)])
    return json.loads(out.read_text())


def test_benchmark_writes_what_the_chapter_reads(smoke_result):
    r = smoke_result
    assert r["quick"] is True and r["machine"]["cores"] >= 1 and r["machine"]["torch"] == torch.__version__
    assert set(r["head_dims"]) == {"8", "16"}
    d = r["head_dims"]["16"]
    assert d["decode"]["n"] == [1, 2, 4, 8, 16, 32, 64]
    assert d["no_cache"]["n"] == [1, 2, 4, 8, 16]
    assert d["totals"]["no_cache_extrapolated"] == [False] * 5 + [True, True]
    assert d["bytes"] == {"kv_cache_per_token": 2 * 2 * 16 * 4, "state": 2 * (16 * 16 + 16) * 4}
    assert d["crossover_n"] == figures.crossover_n(d["decode"]["n"], d["decode"]["kv_cache_s"],
                                                   d["decode"]["state_s"])
    rows = figures.speedup_rows(r, 16, [8, 64])
    assert [row["n"] for row in rows] == [8, 64]
    for row in rows:
        assert row["vs_no_cache"] == pytest.approx(row["no_cache_s"] / row["state_s"])
        assert row["vs_kv_cache"] == pytest.approx(row["kv_cache_s"] / row["state_s"])
    with pytest.raises(ValueError, match="head_dim must be one of"):
        figures.speedup_rows(r, 64)
    with pytest.raises(ValueError, match="lengths must be among"):
        figures.speedup_rows(r, 16, [5])


def test_measured_crossover_figure(smoke_result):
    fig = figures.measured_crossover(smoke_result)
    steps = _steps(fig)
    assert [s.label for s in steps] == ["D=8", "D=16"]
    assert len(fig.data) == 8
    data = steps[1].args[0]
    assert data["y"][0] == pytest.approx(smoke_result["head_dims"]["16"]["decode"]["kv_cache_s"], rel=1e-5)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    two = figures.measured_crossover([smoke_result, {**smoke_result, "config": {**smoke_result["config"],
                                                                              "device": "cuda"}}])
    assert [s.label for s in _steps(two)][-1] == "cuda, D=16"
    with pytest.raises(ValueError):
        figures.measured_crossover([])


# --------------------------------------------------------------------------- live explorers


def test_state_explorer_redraws():
    from gpt2k3.book.widgets import state_explorer

    box = state_explorer()
    assert isinstance(box.current, go.Figure) and "D = 64" in box.current.layout.title.text
    box.controls["head_dim"].value = 128
    box.controls["max_n"].value = 2 ** 12
    assert "D = 128" in box.current.layout.title.text
    assert box.current.data[0].x[-1] == 2 ** 12


def test_weights_explorer_redraws():
    from gpt2k3.book.widgets import weights_explorer

    box = weights_explorer()
    assert isinstance(box.current, go.Figure)
    box.controls["T"].value = 5
    assert len(box.current.data[0].z) == 5
    box.controls["scale"].value = 16.0
    assert "q, k × 16" in box.current.layout.title.text


# --------------------------------------------------------------------------- the state schematic


def test_state_read_write_draws_what_the_recurrence_computes():
    from gpt2k3.ops import linear

    fig = figures.state_read_write(d=4, n=3, seed=0)
    m = fig.matrices
    S = m["$S_t$"]
    # the write: S_{t-1} + k_t^T v_t = S_t
    torch.testing.assert_close(m["$S_{t-1}$"] + m["$k_t^{\\top}$"] @ m["$v_t$"], S)
    # the same state as linear.recurrent over the three pairs, and its read with the first key
    gen = torch.Generator().manual_seed(0)
    k = linear.elu1(torch.randn(3, 4, generator=gen, dtype=torch.float64))
    v = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    o, (S_rec, z) = linear.recurrent(k[None, None], k[None, None], v[None, None])
    torch.testing.assert_close(S, S_rec[0, 0])
    q = k[0]
    torch.testing.assert_close(m["$o_t$"][0], (q @ S) / (q @ z[0, 0]))
    # every stored value leaks into the read: positive weights that sum to one
    w = fig.weights
    assert (w > 0).all() and abs(float(w.sum()) - 1) < 1e-12
    torch.testing.assert_close(m["$o_t$"][0], w @ v)
    assert fig.caption and len(fig.alt) > 30
    assert fig._repr_png_()[0][:4] == b"\x89PNG"


def test_equation_rows_refuses_bad_rows():
    from gpt2k3.book.figures.linear import equation_rows

    with pytest.raises(ValueError, match="at least one matrix"):
        equation_rows([("row", ["+"])], "c", "a")
    with pytest.raises(ValueError, match="2-D"):
        equation_rows([("row", [("x", torch.ones(3))])], "c", "a")
    with pytest.raises(ValueError, match="n"):
        figures.state_read_write(n=1)
