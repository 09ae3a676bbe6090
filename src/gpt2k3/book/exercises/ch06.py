"""Chapter 6's exercises: gates.

* 6.1 (predict): with a constant gate and a random write on every token, when does a stored
  value come back at half strength? The two clocks' rates add (:func:`half_life_with_writes`).
* 6.2 (derive): the expected fraction that comes back, ``(alpha (1 - beta/d))^t``, from
  ``E[k^T k] = I/d`` (:func:`derive_expected_signal`).
* 6.3 (predict): the memory a hybrid saves at long context is ``n_layer / n_attention``, not
  ``ratio + 1``, because the last layer is attention too (:func:`hybrid_factors`).
* 6.4 (change the code): a document boundary as one gate of ``-inf``: the memory is cleared in
  one token, which DeltaNet cannot do (:func:`recurrent_with_resets`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpt2k3.accounting import hybrid_cache_bytes, hybrid_spec
from gpt2k3.archs import KIMI_LINEAR_48B
from gpt2k3.checks import (check_gated_delta_rule_call, check_int, check_number, check_positive_int,
                           checked)
from gpt2k3.experiments import forgetting
from gpt2k3.ops import delta, gated_delta

__all__ = ["half_life_with_writes", "derive_expected_signal", "hybrid_factors",
           "check_resets", "recurrent_with_resets", "compare_resets"]


# ------------------------------------------------------------------------------ 6.1 predict
@dataclass(frozen=True)
class HalfLives:
    """Half-lives in tokens of one stored value: the gate's alone, the writes' alone, and both
    together, ``ln 2 / (-log alpha - ln(1 - beta/d))`` (rates add, so the combined half-life is
    half the harmonic mean of the two); ``crossing`` is where the exact expectation
    (:func:`gpt2k3.experiments.forgetting.expected_signal`) first falls to one half, and
    ``measured_at_crossing`` the mean of ``trials`` measured streams there."""

    log_alpha: float
    beta: float
    d: int
    gate: float
    writes: float
    both: float
    crossing: int
    expected_at_crossing: float
    measured_at_crossing: float


def half_life_with_writes(log_alpha: float = -0.03, beta: float = 0.5, d: int = 16,
                          trials: int = 256) -> HalfLives:
    """Exercise 6.1: the half-lives behind Figure 6.2 at one of its slider's gates."""
    la = check_number(log_alpha, "log_alpha", -math.inf, 0.0, lo_open=True, what="a number < 0")
    if la == 0:
        raise ValueError("log_alpha must be a number < 0, got 0")
    beta = check_number(beta, "beta", 0.0, 1.0, lo_open=True, what="a number in (0, 1]")
    d = check_positive_int(d, "d")
    gate, writes = forgetting.half_life(la), math.log(2) / -math.log1p(-beta / d)
    both = math.log(2) / (-la - math.log1p(-beta / d))
    ts = list(range(int(4 * both) + 2))
    expected = forgetting.expected_signal(ts, d, log_alpha=la, beta=beta)
    crossing = next(t for t, s in zip(ts, expected) if s <= 0.5)
    measured = forgetting.fact_recall(d, crossing, log_alpha=la, beta=beta, trials=trials).signal
    return HalfLives(la, beta, d, gate, writes, both, crossing, expected[crossing], measured[crossing])


# ------------------------------------------------------------------------------- 6.2 derive
def derive_expected_signal(d: int = 16, log_alpha: float = -0.03, beta: float = 0.5,
                           elapsed=(1, 5, 10, 20, 40), keys: int = 20000, trials: int = 256,
                           seed: int = 0) -> dict:
    """Exercise 6.2: the two facts the derivation uses and its result.

    ``E[k^T k] = I/d`` for random unit keys (the largest entry of the sampled mean minus
    ``I/d`` over ``keys`` draws); the derived ``(alpha (1 - beta/d))^t`` against
    :func:`gpt2k3.experiments.forgetting.expected_signal` (the same expectation, in its general
    per-channel form) and against the mean of ``trials`` simulated streams
    (:func:`~gpt2k3.experiments.forgetting.fact_recall`)."""
    d, keys, trials = (check_positive_int(x, n) for x, n in ((d, "d"), (keys, "keys"),
                                                             (trials, "trials")))
    la = check_number(log_alpha, "log_alpha", -math.inf, 0.0, what="a number <= 0")
    g = torch.Generator().manual_seed(check_int(seed, "seed", 0))
    k = F.normalize(torch.randn(keys, d, generator=g, dtype=torch.float64), dim=-1)
    kk = (k.T @ k) / keys                                  # the sample mean of k^T k
    ts = [check_int(t, "each entry of elapsed", 0) for t in elapsed]
    derived = [(math.exp(la) * (1 - beta / d)) ** t for t in ts]
    general = forgetting.expected_signal(ts, d, log_alpha=la, beta=beta)
    sim = forgetting.fact_recall(d, max(ts), log_alpha=la, beta=beta, trials=trials, seed=seed)
    measured = [sim.signal[t] for t in ts]
    return {"elapsed": ts, "derived": derived, "measured": measured,
            "kk_vs_identity_over_d": float((kk - torch.eye(d, dtype=torch.float64) / d).abs().max()),
            "derived_vs_general": max(abs(a - b) for a, b in zip(derived, general)),
            "derived_vs_measured": max(abs(a - b) for a, b in zip(derived, measured))}


# ------------------------------------------------------------------------------ 6.3 predict
@dataclass(frozen=True)
class HybridFactor:
    """For one KDA : attention ratio (``None``: all KDA) of ``spec``: its attention layers, the
    naive guess ``ratio + 1``, the layer count's ``n_layer / n_attention``, and the factor by
    which the whole memory of one sequence at ``context_len`` tokens is smaller than with
    attention in every layer (:func:`gpt2k3.accounting.hybrid_cache_bytes`)."""

    ratio: int | None
    n_attention: int
    guess: float
    layers_over_attention: float
    factor: float


def hybrid_factors(spec=KIMI_LINEAR_48B, ratios=(1, 3, 7), context_len: int = 1 << 20) -> list[HybridFactor]:
    """Exercise 6.3: Figure 6.5's slider positions, as factors of memory saved."""
    context_len = check_positive_int(context_len, "context_len")
    full = hybrid_cache_bytes(spec, 0, context_len)["total"]
    rows = []
    for r in ratios:
        s = hybrid_spec(spec, r)
        n_attn = s.n_attention_layers
        rows.append(HybridFactor(r, n_attn, r + 1, spec.n_layer / n_attn,
                                 full / hybrid_cache_bytes(spec, r, context_len)["total"]))
    return rows


# ---------------------------------------------------------------------- 6.4 change the code
def check_resets(resets, B: int, T: int) -> torch.Tensor:
    """Require a bool tensor of shape ``(B, T)`` (the front door of :func:`recurrent_with_resets`)."""
    if not isinstance(resets, torch.Tensor) or resets.dtype != torch.bool or tuple(resets.shape) != (B, T):
        got = f"{resets.dtype} {tuple(resets.shape)}" if isinstance(resets, torch.Tensor) else type(resets).__name__
        raise ValueError(f"resets must be a bool tensor of shape (B, T) = {(B, T)}, got {got}")
    return resets


def _check_resets_call(q, k, v, beta, g, resets, *, initial_state=None) -> None:
    """The door of :func:`recurrent_with_resets`: the gated delta rule's, and ``resets``."""
    check_gated_delta_rule_call(q, k, v, beta, g, initial_state=initial_state)
    check_resets(resets, q.shape[0], q.shape[2])  # (B, T) bool: where a new document starts


@checked(_check_resets_call)
def recurrent_with_resets(q, k, v, beta, g, resets, *, initial_state=None):
    """:func:`gpt2k3.ops.gated_delta.recurrent` with a document boundary: where ``resets``
    (``(B, T)`` bool) is set, the gate becomes ``-inf``, ``alpha = 0``, and the token writes into
    an empty state. One token, one decision: the rest of the loop is unchanged."""
    out_dtype, dtype = v.dtype, torch.promote_types(v.dtype, torch.float32)  # state: >= float32
    q, k, v, beta, g = (x.to(dtype) for x in (q, k, v, beta, g))
    B, H, T, Dk = k.shape
    S = k.new_zeros(B, H, Dk, v.shape[-1]) if initial_state is None else initial_state.to(dtype)
    g = g.masked_fill(resets[:, None, :, None] if g.ndim == 4 else resets[:, None, :], -math.inf)
    alpha = g.exp() if g.ndim == 4 else g.exp().unsqueeze(-1)  # (B, H, T, Dk or 1); exp(-inf) = 0
    o = torch.empty_like(v)
    for t in range(T):
        q_t, k_t, v_t = q[:, :, t], k[:, :, t], v[:, :, t]  # (B, H, D)
        S = S * alpha[:, :, t].unsqueeze(-1)  # decay first: row i of S times alpha_t[i]
        v_old = (k_t.unsqueeze(-2) @ S).squeeze(-2)  # what the state returns for k_t now
        u = beta[:, :, t, None] * (v_t - v_old)  # write only the correction
        S = S + k_t.unsqueeze(-1) * u.unsqueeze(-2)  # outer product k_t^T u
        o[:, :, t] = (q_t.unsqueeze(-2) @ S).squeeze(-2)
    return o.to(out_dtype), S


def compare_resets(T: int = 96, boundary: int = 40, D: int = 16, seed: int = 0) -> dict:
    """Exercise 6.4: two streams that differ only before a boundary at token ``boundary``.

    With the reset, for Gated DeltaNet's and KDA's gates alike: the outputs from the boundary
    on equal a fresh run on the second document (``"vs_fresh"``), the final states of the two
    streams are equal (``"state_gap"``), and the fast chunkwise form given the same ``-inf``
    gate agrees (``"chunkwise_vs_recurrent"``). Without a gate (DeltaNet) the second document's
    outputs still depend on the first (``"delta_after_boundary"``)."""
    T, D = check_positive_int(T, "T"), check_positive_int(D, "D")
    boundary = check_int(boundary, "boundary", 1)
    if boundary >= T:
        raise ValueError(f"boundary must be < T = {T}, got {boundary}")
    gen = torch.Generator().manual_seed(check_int(seed, "seed", 0))
    B, H = 2, 2  # two streams: the same second document after two different first ones

    def draw(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q, k = (F.normalize(draw(1, H, T, D), dim=-1).expand(B, -1, -1, -1).clone() for _ in range(2))
    v, beta = draw(1, H, T, D).expand(B, -1, -1, -1).clone(), torch.rand(B, H, T, generator=gen, dtype=torch.float64)
    beta[1] = beta[0]
    first = slice(0, boundary)                             # the first documents differ
    q[1, :, first], k[1, :, first] = F.normalize(draw(H, boundary, D), dim=-1), F.normalize(draw(H, boundary, D), dim=-1)
    v[1, :, first] = draw(H, boundary, D)
    resets = torch.zeros(B, T, dtype=torch.bool)
    resets[:, boundary] = True
    rest = slice(boundary, T)
    out = {"boundary": boundary, "T": T}
    gates = {"gdn": -0.1 * torch.rand(1, H, T, generator=gen, dtype=torch.float64).expand(B, -1, -1),
             "kda": -0.1 * torch.rand(1, H, T, D, generator=gen, dtype=torch.float64).expand(B, -1, -1, -1)}
    for name, g in gates.items():
        o, S = recurrent_with_resets(q, k, v, beta, g, resets)
        fresh, _ = gated_delta.recurrent(q[:, :, rest], k[:, :, rest], v[:, :, rest], beta[:, :, rest],
                                         g[:, :, rest])
        masked = g.masked_fill(resets[:, None, :, None] if g.ndim == 4 else resets[:, None, :], -math.inf)
        fast, _ = gated_delta.chunkwise(q, k, v, beta, masked, chunk_size=16)
        out[name] = {"vs_fresh": float((o[:, :, rest] - fresh).abs().max()),
                     "state_gap": float((S[0] - S[1]).abs().max()),
                     "chunkwise_vs_recurrent": float((fast - o).abs().max())}
    o_delta, _ = delta.recurrent(q, k, v, beta)
    out["delta_after_boundary"] = float((o_delta[0, :, rest] - o_delta[1, :, rest]).abs().max())
    return out
