"""Chapter 3's exercises, and the published speed-ups its thousand-fold section quotes.

:data:`KATHAROPOULOS_2020` holds the figures the chapter quotes from Katharopoulos et al. (2020),
"Transformers are RNNs" (ICML): the headline of its abstract, and the speed-up of its linear
transformer over a softmax transformer in generating images (its Tables 1 and 2, MNIST and
CIFAR-10, images generated per second), with each benchmark's sequence length, and the speed-up
over the same softmax transformer of the appendix's further baseline, "stateful-softmax", which
keeps every key and value (its Table 4, appendix C.1). ``seconds_per_image`` holds its Table 5
(appendix C.2, "Equalizing the batch size"): seconds to generate one image at a batch of one, on a
CPU and on a GPU, for the softmax transformer, stateful-softmax and the linear transformer.
``batch_note`` is its section 4.2.1's reason for the throughput factor.
"""

from __future__ import annotations

import math

import torch

from gpt2k3.book import figures
from gpt2k3.checks import checked
from gpt2k3.ops import linear
from gpt2k3.ops.linear import check_elu1

__all__ = ["KATHAROPOULOS_2020", "growth_exponent", "speedup_growth", "kv_step_jump", "elu1_limit_weights",
           "relu_features", "relu_forms"]

#: Quoted from Katharopoulos et al. 2020 (arXiv:2006.16236v3): abstract ("up to 4000x faster"),
#: Tables 1-2 (``speedup``, linear over softmax), Table 4 (``stateful_speedup``, stateful-softmax
#: over the same softmax) and Table 5 (``seconds_per_image``, batch size 1, lower is better).
KATHAROPOULOS_2020 = {
    "headline_speedup": 4000,
    "mnist_images_at_once": 10_000,  # section 4.2.1: "simultaneously generate 10,000 MNIST images"
    "table5_text_speedup": 6.6,  # appendix C.2's text: "almost 6.6x faster than softmax" on CIFAR-10
    "MNIST": {"image": (28, 28, 1), "N": 28 * 28, "speedup": 317,            # Table 1
              "stateful_speedup": 16.8,                                    # Table 4
              "seconds_per_image": {                                       # Table 5
                  "cpu": {"softmax": 72.6, "stateful_softmax": 7.4, "linear": 5.5},
                  "gpu": {"softmax": 10.2, "stateful_softmax": 10.4, "linear": 7.3}}},
    "CIFAR-10": {"image": (32, 32, 3), "N": 32 * 32 * 3, "speedup": 4462,    # Table 2
                 "stateful_speedup": 80,                                   # Table 4
                 "seconds_per_image": {                                    # Table 5
                     "cpu": {"softmax": 8651.4, "stateful_softmax": 71.9, "linear": 45.1},
                     "gpu": {"softmax": 300.1, "stateful_softmax": 70.4, "linear": 61.3}}},
}


def growth_exponent(n0: float, y0: float, n1: float, y1: float) -> float:
    """The ``a`` of ``y ~ n^a`` through two points: ``log(y1 / y0) / log(n1 / n0)``."""
    return math.log(y1 / y0) / math.log(n1 / n0)


def speedup_growth(bench: dict, head_dim: int, ns=(784, 3072)) -> dict[str, float]:
    """Exercise 3.1: the state's speed-up over each baseline at the two lengths of ``ns``, from the
    measured step times of ``benchmarks/crossover.py`` (``figures.generation_totals``), the
    exponent with which it grows between them, and the exponent of each method's total time."""
    r = bench["head_dims"][str(head_dim)]
    dec, nc = r["decode"], r["no_cache"]
    if max(ns) > max(nc["n"]):
        raise ValueError(f"ns must lie in the cacheless baseline's measured range, got {ns}")
    st, _ = figures.generation_totals(dec["n"], dec["state_s"], ns)
    kv, _ = figures.generation_totals(dec["n"], dec["kv_cache_s"], ns)
    no, _ = figures.generation_totals(nc["n"], nc["step_s"], ns)
    out = {"state_total_exponent": growth_exponent(ns[0], st[0], ns[1], st[1])}
    for name, base in (("no_cache", no), ("kv_cache", kv)):
        a, b = base[0] / st[0], base[1] / st[1]
        out[f"{name}_first"], out[f"{name}_last"] = a, b
        out[f"{name}_exponent"] = growth_exponent(ns[0], a, ns[1], b)
        out[f"{name}_total_exponent"] = growth_exponent(ns[0], base[0], ns[1], base[1])
    return out


def kv_step_jump(bench: dict, head_dim: int) -> dict[str, float]:
    """Exercise 3.1: where the measured KV-cache step slows most from one context to the next
    (``n`` to ``2n`` on the benchmark's grid), with one layer's cache bytes at both ends."""
    r, cfg = bench["head_dims"][str(head_dim)]["decode"], bench["config"]
    if cfg["dtype"] != "float32":
        raise ValueError(f"bench must be a float32 run, got {cfg['dtype']!r}")
    ns, ts = r["n"], r["kv_cache_s"]
    i = max(range(len(ns) - 1), key=lambda j: ts[j + 1] / ts[j])
    layer_bytes = lambda n: 2 * cfg["n_head"] * n * head_dim * 4  # keys and values, float32
    return {"n_before": ns[i], "n_after": ns[i + 1], "slowdown": ts[i + 1] / ts[i],
            "bytes_before": layer_bytes(ns[i]), "bytes_after": layer_bytes(ns[i + 1])}


def elu1_limit_weights(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Exercise 3.2: the limit of ELU+1's causal weights as ``q`` and ``k`` are scaled by ``c ->
    inf``: ``phi(c x) ~ c relu(x)``, so ``w_ts -> relu(q_t) . relu(k_s) / sum_{s' <= t} (same)``.
    ``q, k (T, D)``; rows with no positive overlap at all are left at 0."""
    A = (q.clamp(min=0) @ k.clamp(min=0).T).tril()
    return A / A.sum(-1, keepdim=True).clamp(min=torch.finfo(A.dtype).tiny)


@checked(check_elu1)
def relu_features(x: torch.Tensor) -> torch.Tensor:
    """Exercise 3.3: the feature map ReLU in place of :func:`gpt2k3.ops.linear.elu1`:
    non-negative like it, but exactly zero on every negative entry."""
    return torch.relu(x)


def relu_forms(T: int, D: int, seed: int = 0) -> dict:
    """Exercise 3.3: linear attention's three forms on ReLU features of random ``q, k, v``
    ``(1, 1, T, D)`` (float64), and the positions whose denominator ``q_t . z_t`` is exactly 0."""
    g = torch.Generator().manual_seed(seed)
    q, k = (relu_features(torch.randn(1, 1, T, D, generator=g, dtype=torch.float64)) for _ in range(2))
    v = torch.randn(1, 1, T, D, generator=g, dtype=torch.float64)
    o_par, _ = linear.parallel(q, k, v)
    o_rec, _ = linear.recurrent(q, k, v)
    o_chk, _ = linear.chunkwise(q, k, v, chunk_size=16)
    denom = (q * k.cumsum(2)).sum(-1)[0, 0]  # q_t . z_t, without the epsilon
    dead, zero_q = denom == 0, (q[0, 0] == 0).all(-1)
    return {"recurrent_vs_parallel": (o_rec - o_par).abs().max().item(),
            "chunkwise_vs_parallel": (o_chk - o_par).abs().max().item(),
            "zero_denominators": int(dead.sum()), "zero_query_rows": int(zero_q.sum()),
            "no_overlap": int((dead & ~zero_q).sum()),  # a live query, but every earlier key off its support
            "zero_key_rows": int((k[0, 0] == 0).all(-1).sum()),
            "dead_positions": dead.nonzero().flatten().tolist(),
            "dead_outputs_max": o_par[0, 0][dead].abs().max().item() if dead.any() else 0.0}
