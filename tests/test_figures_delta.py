"""Chapters 4 and 5: the DeltaNet figures carry the right slider steps, the explorers redraw."""

import json

import plotly.graph_objects as go
import pytest
import torch

from gpt2k3.book import figures
from gpt2k3.experiments import memory
from gpt2k3.ops.wy import chunkwise_cost


def _steps(fig):
    (slider,) = fig.layout.sliders
    return slider.steps


def _trace(step, attr, i):
    """The value a slider step sets for ``attr`` on the i-th trace it touches."""
    return step.args[0][attr][i]


def _close(plotted, exact):
    """Figures store their numbers rounded to 4 decimals."""
    return plotted == pytest.approx(list(exact), abs=5.1e-5)


def _tensor(values):
    return torch.tensor(values, dtype=torch.float64)


# --------------------------------------------------------------------------- chapter 4


def test_n_grid():
    g = figures.n_grid(16)
    assert g[0] == 1 and g[-1] == 64 and 16 in g
    assert g == sorted(set(g))
    assert figures.n_grid(1) == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="d must be an int >= 1"):
        figures.n_grid(0)


def test_interference_curves_one_step_per_d():
    fig = figures.interference_curves(ds=(4, 8), trials=2, active=0)
    steps = _steps(fig)
    assert [s.label for s in steps] == ["4", "8"]
    assert len(fig.data) == 6  # the last: chapter 3's ELU+1 linear attention
    for step, d in zip(steps, (4, 8)):
        ns = figures.n_grid(d)
        assert _trace(step, "x", 0) == ns and max(ns) == 4 * d
        assert _close(_trace(step, "y", 0), memory.error_curve(d, ns, "additive", seed=0, trials=2))
        assert _close(_trace(step, "y", 2), memory.error_curve(d, ns, "delta", seed=0, trials=2))
        assert _trace(step, "x", 4) == [n for n in ns if n <= d]  # orthogonal keys: up to D
        assert max(_trace(step, "y", 4)) < 1e-5
        assert step.args[1]["shapes"][0]["x0"] == d  # the N = D line moves with D
    assert list(fig.data[0].x) == figures.n_grid(4)  # opens on the active step
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text
    with pytest.raises(ValueError, match="beta must be a float in"):
        figures.interference_curves(ds=(4,), beta=3.0)


def test_interference_by_position_slider_over_n():
    fig = figures.interference_by_position(d=4, ns=[1, 4, 16], trials=2)
    steps = _steps(fig)
    assert [s.label for s in steps] == ["1", "4", "16"]
    s16 = steps[2]
    assert _trace(s16, "x", 1) == list(range(1, 17))
    assert _close(_trace(s16, "y", 1), memory.error_by_position(4, 16, "delta", seed=0, trials=2))
    assert _trace(s16, "y", 1)[-1] < 1e-5  # the newest pair, exact under the delta rule
    assert "N = 16 pairs" in s16.args[1]["title.text"]


def test_interference_by_position_single_n_has_no_slider():
    fig = figures.interference_by_position(d=4, ns=[6], trials=2)
    assert not fig.layout.sliders
    assert list(fig.data[0].x) == list(range(1, 7)) and "N = 6" in fig.layout.title.text
    with pytest.raises(ValueError, match="orthogonal keys need every N <= d"):
        figures.interference_by_position(d=4, ns=[5], key_kind="orthogonal")


def test_interference_beta_updates_only_the_delta_trace():
    fig = figures.interference_beta(d=4, betas=(0.5, 1.0), trials=2)
    steps = _steps(fig)
    assert [s.label for s in steps] == ["0.5", "1"]
    assert fig.layout.sliders[0].active == 1  # opens on beta = 1
    for step, b in zip(steps, (0.5, 1.0)):
        assert list(step.args[2]) == [2]
        assert _close(_trace(step, "y", 0),
                      memory.error_curve(4, figures.n_grid(4), "delta", beta=b, seed=0, trials=2))
        assert _trace(step, "name", 0) == f"delta rule, β = {b:g}"
    with pytest.raises(ValueError, match="each entry of betas"):
        figures.interference_beta(betas=(-1,))


def test_read_erase_write_stages():
    fig = figures.read_erase_write_stages(d=6, n_stored=3, target=1, beta=1.0, seed=2)
    steps = _steps(fig)
    assert len(steps) == 4 and fig.layout.sliders[0].active == 3
    # reconstruct the setting and check the first and last stage
    gen = torch.Generator().manual_seed(2)
    keys = torch.eye(6, dtype=torch.float64)[:3]  # basis keys: pair i is row i of the state
    values = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    v_new = torch.randn(6, generator=gen, dtype=torch.float64)
    S = memory.write_additive(keys, values)
    torch.testing.assert_close(_tensor(_trace(steps[0], "z", 0)), S, atol=5.1e-5, rtol=0)
    torch.testing.assert_close(_tensor(_trace(steps[0], "y", 2)), values[1], atol=5.1e-5, rtol=0)
    # after the write the key reads the new value (beta = 1, unit key)
    torch.testing.assert_close(_tensor(_trace(steps[3], "y", 2)), v_new, atol=5.1e-5, rtol=0)
    assert "0.00" in steps[3].args[1]["title.text"]
    # the erase stage reads nothing; the write replaced row 1 and left the others
    assert max(abs(x) for x in _trace(steps[2], "y", 2)) == 0
    torch.testing.assert_close(_tensor(_trace(steps[3], "z", 0))[[0, 2]], values[[0, 2]], atol=5.1e-5, rtol=0)
    rotated = figures.read_erase_write_stages(d=6, n_stored=3, target=1, seed=2, rotate=True)
    # with rotated keys too, the key reads the new value (trace 4) after the write
    assert _close(_trace(_steps(rotated)[3], "y", 2), rotated.data[4].y)
    for kw, match in [({"n_stored": 7}, "n_stored must be <= d"),
                      ({"n_stored": 3, "target": 3}, "target must be in"),
                      ({"n_stored": 3, "beta": 2.5}, "beta must be a float")]:
        with pytest.raises(ValueError, match=match):
            figures.read_erase_write_stages(d=6, **kw)


# --------------------------------------------------------------------------- chapter 5


def test_chunk_cost_matches_the_model():
    fig = figures.chunk_cost(T=1024, ds=(32, 64), chunk_sizes=(1, 16, 64), active=0)
    steps = _steps(fig)
    assert [s.label for s in steps] == ["32", "64"]
    for step, d in zip(steps, (32, 64)):
        costs = [chunkwise_cost(1024, c, d) for c in (1, 16, 64)]
        assert _trace(step, "y", 0) == [c.flops / 1024 for c in costs]
        assert _trace(step, "y", 3) == [c.recurrent_flops / 1024 for c in costs]
    assert list(fig.data[4].y) == [1024, 64, 16]  # sequential steps, T / C
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"


def test_chunk_cost_single_d_marks_the_chunk_size():
    fig = figures.chunk_cost(T=512, ds=[16], mark=32)
    assert not fig.layout.sliders
    assert len(fig.data) == 8
    assert list(fig.data[-1].x) == [32] and list(fig.data[-1].y) == [16]
    assert "chunks of 32" in fig.layout.title.text
    with pytest.raises(ValueError, match="each entry of chunk_sizes"):
        figures.chunk_cost(chunk_sizes=(0, 4))


def _fake_results():
    rows = []
    for T in (256, 1024):
        rows.append({"sweep": "T", "method": "recurrent", "chunk_size": None, "T": T, "median_s": T * 1e-4})
        for c in (32, 64):
            rows.append({"sweep": "T", "method": "chunkwise", "chunk_size": c, "T": T, "median_s": T * 1e-5})
        rows.append({"sweep": "T", "method": "fla_naive_chunkwise", "chunk_size": 64, "T": T,
                     "median_s": T * 2e-5})
    for c in (16, 64):
        rows.append({"sweep": "chunk_size", "method": "chunkwise", "chunk_size": c, "T": 1024,
                     "median_s": c * 1e-4})
    return {"machine": {"device_name": "a test CPU", "threads": 2, "torch": "x"},
            "config": {"B": 1, "H": 4, "D": 64, "repeats": 3}, "rows": rows}


def test_chunkwise_speed_plots_every_series():
    fig = figures.chunkwise_speed(_fake_results())
    names = [t.name for t in fig.data]
    assert names[0].startswith("ours, token by token") and len(fig.data) == 5
    assert "C = 32" in names[1] and "C = 64" in names[2] and names[3].startswith("fla")
    assert list(fig.data[0].x) == [256, 1024]
    assert list(fig.data[0].y) == pytest.approx([25.6, 102.4])  # milliseconds
    assert list(fig.data[-1].x) == [16, 64]
    assert "a test CPU" in fig.layout.title.text
    with pytest.raises(ValueError, match="sweep must be"):
        figures.speed_rows(_fake_results(), "D")
    with pytest.raises(ValueError, match="no rows of the 'chunk_size' sweep"):
        figures.chunkwise_speed({"rows": _fake_results()["rows"][:3]})


def test_load_results(tmp_path, monkeypatch):
    from gpt2k3.book import results

    assert results.load("no_such_benchmark.json", missing_ok=True) is None
    with pytest.raises(FileNotFoundError, match="benchmarks/results/no_such_benchmark.json"):
        results.load("no_such_benchmark.json")
    target = tmp_path / "benchmarks" / "results"
    target.mkdir(parents=True)
    (target / "fake_chunkwise.json").write_text(json.dumps(_fake_results()))
    monkeypatch.chdir(tmp_path)
    assert results.load("fake_chunkwise.json")["config"]["H"] == 4


# --------------------------------------------------------------------------- explorers


def test_interference_explorer_follows_d_and_reports_bad_settings():
    from gpt2k3.book.widgets import interference_explorer

    box = interference_explorer(d=8, n=10)
    c = box.controls
    assert isinstance(box.current, go.Figure) and "N = 10 pairs in a 8×8" in box.current.layout.title.text
    c["d"].value = 4
    assert c["n"].max == 16
    c["keys"].value = "orthogonal"  # N = 10 > D = 4: not a valid setting, said in words
    assert "orthogonal keys need" in box.current.value
    c["n"].value = 3
    assert isinstance(box.current, go.Figure)


def test_chunk_cost_explorer_redraws():
    from gpt2k3.book.widgets import chunk_cost_explorer

    box = chunk_cost_explorer()
    assert "chunks of 64" in box.current.layout.title.text
    box.controls["chunk_size"].value = 16
    assert "chunks of 16" in box.current.layout.title.text
    assert list(box.current.data[-1].x) == [16]


# --------------------------------------------------------------------------- the delta-rule schematic


@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_delta_read_write_draws_one_step_of_the_recurrence(beta):
    from gpt2k3.ops import delta

    fig = figures.delta_read_write(d=4, n=3, beta=beta, seed=0)
    m, step = fig.matrices, fig.step
    k, S0, S1 = m["$k_t$"], m["$S_{t-1}$"], m["$S_t$"]
    v_old = m[r"$v^{\mathrm{old}}_t$"]
    torch.testing.assert_close(k @ S0, v_old)
    torch.testing.assert_close(beta * (m["$v_t$"] - v_old), m["$u_t$"])
    torch.testing.assert_close(S0 + k.T @ m["$u_t$"], S1)
    # the same state delta.recurrent reaches in one step
    one = [x[None, None] for x in (k, k, m["$v_t$"])]
    _, S_rec = delta.recurrent(*one, torch.full((1, 1, 1), beta, dtype=torch.float64),
                               initial_state=S0[None, None])
    torch.testing.assert_close(S1, S_rec[0, 0])
    # the read after the write: (1 - beta) v_old + beta v
    torch.testing.assert_close(m["$k_t S_t$"], (1 - beta) * v_old + beta * m["$v_t$"])
    assert step.beta == beta and fig.caption and len(fig.alt) > 30


def test_additive_curves_are_labelled_as_what_they_are():
    fig = figures.interference_curves(ds=(8,), trials=2, active=0)
    names = [t.name for t in fig.data]
    assert not any(n == "additive (linear attention)" for n in names)
    assert names[0] == figures.delta.ADDITIVE_LABEL and "no normaliser" in names[0]
    assert names[-1] == figures.delta.ELU1_LABEL
    (step,) = _steps(fig)
    assert _close(_trace(step, "y", 5), memory.linear_attention_error_curve(8, figures.n_grid(8), trials=2))
