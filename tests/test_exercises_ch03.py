"""Chapter 3's exercise solutions (``gpt2k3.book.exercises.ch03``) and its quoted speed-ups give
what their prose states."""

from __future__ import annotations

import math

import pytest
import torch

from gpt2k3.book import figures, results
from gpt2k3.book.exercises import ch03
from gpt2k3.ops import linear


def test_the_papers_speedups_grow_as_about_n_squared():
    p = ch03.KATHAROPOULOS_2020
    mnist, cifar = p["MNIST"], p["CIFAR-10"]
    assert (mnist["N"], cifar["N"]) == (784, 3072) and (mnist["speedup"], cifar["speedup"]) == (317, 4462)
    assert all(math.prod(x["image"]) == x["N"] for x in (mnist, cifar))
    a = ch03.growth_exponent(mnist["N"], mnist["speedup"], cifar["N"], cifar["speedup"])
    assert a == pytest.approx(math.log(4462 / 317) / math.log(3072 / 784))
    assert abs(a - 2) < abs(a - 1) and 1.9 < a < 2  # nearer a recomputing baseline's N^2
    assert ch03.growth_exponent(1, 1, 10, 100) == pytest.approx(2)


def test_the_papers_cached_baseline_gives_speedups_that_grow_within_n():
    p = ch03.KATHAROPOULOS_2020
    mnist, cifar = p["MNIST"], p["CIFAR-10"]
    assert (mnist["stateful_speedup"], cifar["stateful_speedup"]) == (16.8, 80)  # its Table 4
    over = [x["speedup"] / x["stateful_speedup"] for x in (mnist, cifar)]  # linear over stateful
    assert over[1] > 50  # appendix C.1: "more than 50x faster for CIFAR-10"
    a = ch03.growth_exponent(mnist["N"], over[0], cifar["N"], over[1])
    assert 0 < a < 1  # within the N^1 a KV cache allows, far from a recomputing baseline's N^2


def test_the_papers_equal_batch_times_shrink_the_factor():
    p = ch03.KATHAROPOULOS_2020
    assert p["mnist_images_at_once"] == 10_000  # section 4.2.1
    mnist, cifar = (p[key]["seconds_per_image"] for key in ("MNIST", "CIFAR-10"))
    assert cifar["gpu"] == {"softmax": 300.1, "stateful_softmax": 70.4, "linear": 61.3}  # its Table 5
    assert cifar["cpu"] == {"softmax": 8651.4, "stateful_softmax": 71.9, "linear": 45.1}
    over = lambda t, base: t[base] / t["linear"]
    assert over(cifar["gpu"], "softmax") == pytest.approx(4.9, abs=0.01)  # Table 5's own "(4.9x)"
    assert over(cifar["cpu"], "softmax") == pytest.approx(191.8, abs=0.05)
    assert over(mnist["cpu"], "softmax") == pytest.approx(13.2, abs=0.05)
    assert 1.1 < over(cifar["gpu"], "stateful_softmax") < 1.2
    a = ch03.growth_exponent(p["MNIST"]["N"], over(mnist["cpu"], "softmax"),
                             p["CIFAR-10"]["N"], over(cifar["cpu"], "softmax"))
    assert 1.9 < a < 2  # at one image per batch the CPU factor still grows as about N^2
    assert over(cifar["gpu"], "softmax") < p["CIFAR-10"]["speedup"] / 100  # far below the 4,462x
    mixed = cifar["gpu"]["softmax"] / cifar["cpu"]["linear"]  # the appendix's 6.6x mixes the devices
    assert mixed == pytest.approx(p["table5_text_speedup"], abs=0.1)


def test_3_1_measured_growth_against_each_baseline():
    bench = results.load("crossover_cpu.json")
    g = ch03.speedup_growth(bench, 64)
    assert abs(g["state_total_exponent"] - 1) < 0.05  # the state's total is linear
    assert abs(g["kv_cache_exponent"] - 1) < 0.1  # about N^1 at D = 64, as counted
    assert 1.5 < g["no_cache_exponent"] < 2  # below the N^2 of the count
    assert g["no_cache_total_exponent"] < 3
    assert g["no_cache_exponent"] == pytest.approx(g["no_cache_total_exponent"] - g["state_total_exponent"])
    g128 = ch03.speedup_growth(bench, 128)
    assert g128["kv_cache_exponent"] > g128["no_cache_exponent"]  # "as steeply as" the cacheless one
    j64, j128 = ch03.kv_step_jump(bench, 64), ch03.kv_step_jump(bench, 128)
    assert j64["bytes_after"] == j128["bytes_after"] and j64["n_after"] == 2 * j128["n_after"]
    assert j128["slowdown"] > 2 * 2 and j64["slowdown"] > 2  # more than the doubling of the bytes
    with pytest.raises(ValueError, match="measured range"):
        ch03.speedup_growth(bench, 64, ns=(784, 10**6))


def test_3_2_the_elu1_weights_tend_to_the_positive_parts_limit():
    g = torch.Generator().manual_seed(0)  # the chapter's figure 3.4 draw
    q, k = (torch.randn(12, 16, generator=g, dtype=torch.float64) for _ in range(2))
    limit = ch03.elu1_limit_weights(q, k)
    torch.testing.assert_close(limit.sum(-1), torch.ones(12, dtype=torch.float64))
    assert torch.equal(limit, limit.tril())
    gaps = [(figures.feature_map_weights_data(q, k, c)["linear"] - limit).abs().max().item()
            for c in (16, 1000)]
    assert gaps[1] < gaps[0] / 50  # falls as 1/c: 62.5 times the scale
    top = figures.feature_map_weights_data(q, k, 1000)["linear"][-1].max().item()
    assert round(top, 3) == round(limit[-1].max().item(), 3)  # the chapter's value at scale 1000
    # one key alone overlapping the query's positive part takes all the weight
    qq = torch.tensor([[1.0, -1.0], [1.0, -1.0]], dtype=torch.float64)
    kk = torch.tensor([[-1.0, 2.0], [3.0, -1.0]], dtype=torch.float64)
    assert ch03.elu1_limit_weights(qq, kk)[1].tolist() == [0.0, 1.0]


def test_3_3_relu_features_keep_the_forms_equal_and_make_dead_positions():
    r = ch03.relu_forms(64, 4, seed=8)
    assert r["recurrent_vs_parallel"] < 1e-12 and r["chunkwise_vs_parallel"] < 1e-12
    assert r["zero_denominators"] == r["zero_query_rows"] + r["no_overlap"] == len(r["dead_positions"])
    assert r["no_overlap"] >= 1 and r["zero_query_rows"] >= 1 and r["zero_key_rows"] >= 1
    assert r["dead_outputs_max"] == 0.0
    x = torch.tensor([-2.0, 0.0, 3.0])
    assert ch03.relu_features(x).tolist() == [0.0, 0.0, 3.0]
    assert (linear.elu1(x) > 0).all()  # ELU+1 has no zero entry to begin with
    with pytest.raises(ValueError, match="x"):
        ch03.relu_features([1.0])
    with pytest.raises(ValueError, match="eps"):  # without the epsilon a dead position is 0/0
        linear.parallel(*(torch.zeros(1, 1, 2, 2),) * 3, eps=0.0)
