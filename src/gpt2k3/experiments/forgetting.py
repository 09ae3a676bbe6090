r"""Forgetting experiments: how long an association survives in a gated delta-rule memory.

Chapter 4's experiments (:mod:`gpt2k3.experiments.memory`) write ``N`` pairs into a ``D x D`` state and read
them all back. Here the question is *time*: a fact is written once, then the stream goes on, and
we read the fact back after every later token. Everything runs through the real mixer,
:func:`gpt2k3.ops.gated_delta.recurrent` (at a few hundred tokens and a head dimension of 16
the token loop is the faster of the two equal forms on a CPU), with one trick: the query at every
step is the fact's own key, so the mixer's output ``o_t = k_0 S_t`` *is* the read of the fact
after ``t`` more tokens -- one call gives the whole forgetting curve.

Two things erode a stored association ``k_0^T v_0``:

* **the gate**: ``S <- Diag(alpha_t) S`` scales row ``i`` of the state by ``alpha_t[i]``;
* **later writes**: each delta update ``S <- (I - beta k^T k) S + beta k^T v`` removes the part
  of the memory along the new key ``k``. For random unit keys spread over ``m`` channels,
  ``E[k^T k]`` is ``1/m`` on those channels, so on average a write keeps a fraction
  ``1 - beta/m`` of every row it can touch.

Both act row by row, so they multiply, and for a fact key drawn uniformly from the channels
``F`` the *expected* fraction of ``v_0`` that comes back after ``t`` tokens is exactly

.. math::

    E[\text{signal}_t] = \frac{1}{|F|} \sum_{i \in F} \bigl(\alpha_i\,(1 - \beta\,[i \in W] / m)\bigr)^t

(``W`` the ``m`` channels distractor keys live in). :func:`expected_signal` computes it and the
tests hold the measured curves to it. For a scalar gate the half-life of the gate alone is
``ln 2 / -log alpha`` tokens (:func:`half_life`); writes shorten it further.

The *error* ``|k_0 S_t - v_0| / |v_0|`` also counts what the other writes leave behind: ``0`` is a
perfect read, ``1`` is an empty one (the read is ~0), and above ``1`` the read returns a vector
as large as a value that is not the value -- junk.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from gpt2k3.checks import check_int, check_number, is_real
from gpt2k3.ops import gated_delta

__all__ = ["half_life", "log_alpha_for_half_life", "RecallCurve", "fact_recall",
           "expected_signal", "AgeProfile", "recall_by_age", "split_channels"]


# ---------------------------------------------------------------------------- validation
def _log_alpha(log_alpha, d: int) -> torch.Tensor:
    """A scalar gate -> 0-d tensor; a per-channel gate -> ``(d,)`` tensor; both float64, <= 0."""
    if is_real(log_alpha):
        la = torch.tensor(float(log_alpha), dtype=torch.float64)
    else:
        try:
            la = torch.as_tensor(log_alpha, dtype=torch.float64)
        except (TypeError, ValueError):
            la = None
        if la is None or la.shape != (d,):
            raise ValueError(f"log_alpha must be a number (one decay for the whole head) or a "
                             f"sequence of d = {d} numbers (one per key channel), got {log_alpha!r}")
    if not bool((la <= 0).all()):
        raise ValueError(f"log_alpha must be <= 0 everywhere (a decay in (0, 1]), got {log_alpha!r}")
    return la


def _channels(channels, d: int, name: str) -> list[int]:
    if channels is None:
        return list(range(d))
    try:
        chans = [operator.index(c) for c in channels]
    except TypeError:
        chans = None
    if not chans or any(not 0 <= c < d for c in chans) or len(set(chans)) != len(chans):
        raise ValueError(f"{name} must be None or distinct channel indices in [0, d={d}), "
                         f"got {channels!r}")
    return sorted(chans)


# ---------------------------------------------------------------------------- half-life
def half_life(log_alpha: float) -> float:
    """Tokens until a constant decay ``alpha = exp(log_alpha)`` halves a memory: ``ln 2 / -log_alpha``.

    ``log_alpha = 0`` (no decay) gives ``inf``.
    """
    la = check_number(log_alpha, "log_alpha", -math.inf, 0.0, what="a number <= 0")
    return math.inf if la == 0 else math.log(2) / -la


def log_alpha_for_half_life(tokens: float) -> float:
    """The per-token log decay whose half-life is ``tokens``: ``-ln 2 / tokens``."""
    t = check_number(tokens, "tokens", 0.0, math.inf, what="a positive number of tokens")
    if t == 0:
        raise ValueError("tokens must be a positive number of tokens, got 0")
    return -math.log(2) / t


def split_channels(d: int, keep: int) -> tuple[list[int], list[int]]:
    """The first ``keep`` key channels (the ones that keep) and the other ``d - keep`` (that forget)."""
    d, keep = check_int(d, "d", 1), check_int(keep, "keep", 0)
    if keep > d:
        raise ValueError(f"keep must be <= d = {d}, got {keep}")
    return list(range(keep)), list(range(keep, d))


# ---------------------------------------------------------------------------- one fact over time
@dataclass(frozen=True)
class RecallCurve:
    """A fact read back after ``elapsed`` more tokens (0: right after it was written).

    ``signal``: mean of ``<read, v_0> / |v_0|^2``, the fraction of the value that comes back.
    ``error``: mean of ``|read - v_0| / |v_0|`` (0 perfect, 1 empty, > 1 junk).
    """

    elapsed: list[int]
    signal: list[float]
    error: list[float]


def _unit_keys(shape, channels, d, gen) -> torch.Tensor:
    """Unit keys ``(*shape, d)``, uniformly random on the sphere of the given channels, 0 elsewhere."""
    k = torch.zeros(*shape, d, dtype=torch.float64)
    k[..., channels] = F.normalize(torch.randn(*shape, len(channels), generator=gen,
                                               dtype=torch.float64), dim=-1)
    return k


def fact_recall(d: int = 16, n_tokens: int = 128, *, log_alpha=0.0, beta: float = 0.5,
                distractors: bool = True, fact_channels=None, distractor_channels=None,
                trials: int = 64, seed: int = 0) -> RecallCurve:
    """Write one fact, stream ``n_tokens`` more tokens through a gated delta rule, read the fact back.

    The fact ``(k_0, v_0)`` -- a unit key drawn within ``fact_channels`` (default: all ``d``), a
    standard-normal value -- is written with ``beta = 1`` into an empty ``d x d`` state. Each
    later token decays the state by ``log_alpha`` (a number: Gated DeltaNet's one decay per
    head; ``d`` numbers: KDA's decay per key channel) and, if ``distractors``, writes a random
    pair (unit key within ``distractor_channels``, standard-normal value) with strength
    ``beta``; otherwise it writes nothing (``beta = 0``), leaving the gate alone at work.

    Deterministic for a given ``seed``; ``trials`` independent streams are averaged.
    """
    d, n_tokens = check_int(d, "d", 1), check_int(n_tokens, "n_tokens", 0)
    trials = check_int(trials, "trials", 1)
    beta = check_number(beta, "beta", 0.0, 2.0, what="a number in [0, 2]")
    la = _log_alpha(log_alpha, d)
    fact_ch = _channels(fact_channels, d, "fact_channels")
    dist_ch = _channels(distractor_channels, d, "distractor_channels")
    gen = torch.Generator().manual_seed(check_int(seed, "seed", 0))
    T = n_tokens + 1
    k0 = _unit_keys((trials, 1), fact_ch, d, gen)  # (trials, 1, d)
    k = torch.cat([k0, _unit_keys((trials, n_tokens), dist_ch, d, gen)], dim=1)
    v = torch.randn(trials, T, d, generator=gen, dtype=torch.float64)
    b = torch.full((trials, T), beta if distractors else 0.0, dtype=torch.float64)
    b[:, 0] = 1.0
    gate = la.expand(trials, T, *la.shape).clone()
    gate[:, 0] = 0.0  # the state is empty before the fact: nothing to decay
    q = k0.expand(trials, T, d)  # read the fact at every step
    o, _ = gated_delta.recurrent(q[:, None], k[:, None], v[:, None], b[:, None], gate[:, None])
    o, v0 = o[:, 0], v[:, :1]
    signal = (o * v0).sum(-1) / (v0 * v0).sum(-1)  # (trials, T)
    error = (o - v0).norm(dim=-1) / v0.norm(dim=-1)
    return RecallCurve(list(range(T)), signal.mean(0).tolist(), error.mean(0).tolist())


def expected_signal(elapsed: Sequence[int], d: int = 16, *, log_alpha=0.0, beta: float = 0.5,
                    distractors: bool = True, fact_channels=None,
                    distractor_channels=None) -> list[float]:
    """The exact expectation of :func:`fact_recall`'s ``signal`` (see the module docstring).

    ``(1/|F|) sum_{i in F} (alpha_i (1 - beta [i in W] / |W|))^t`` for each ``t`` in ``elapsed``.
    """
    d = check_int(d, "d", 1)
    beta = check_number(beta, "beta", 0.0, 2.0, what="a number in [0, 2]")
    la = _log_alpha(log_alpha, d).expand(d)
    fact_ch = _channels(fact_channels, d, "fact_channels")
    dist_ch = _channels(distractor_channels, d, "distractor_channels")
    if isinstance(elapsed, (str, bytes)) or not hasattr(elapsed, "__iter__"):
        raise ValueError(f"elapsed must be a sequence of ints >= 0, got {elapsed!r}")
    ts = [check_int(t, "each entry of elapsed", 0) for t in elapsed]
    erase = torch.zeros(d, dtype=torch.float64)
    if distractors:
        erase[dist_ch] = beta / len(dist_ch)
    # per-row factor per token, in log space so that alpha -> 0 stays exact; (1 - erase) may be
    # <= 0 only when beta >= |W| (a single distractor channel with beta >= 1)
    keep = (1 - erase)[fact_ch]
    rate = la[fact_ch]
    out = []
    for t in ts:  # t = 0 is the fresh write, whatever the gate (-inf * 0 would be NaN)
        out.append(1.0 if t == 0 else float((rate * t).exp().mul(keep.pow(t)).mean()))
    return out


# ---------------------------------------------------------------------------- a whole stream
@dataclass(frozen=True)
class AgeProfile:
    """Recall of every pair of a stream, by age (0: the last pair written).

    ``error[a]`` and ``signal[a]`` are means over trials for the pair written ``a`` tokens before
    the end, as in :class:`RecallCurve`.
    """

    age: list[int]
    signal: list[float]
    error: list[float]


def recall_by_age(d: int = 16, n: int = 128, *, rule: str = "delta", beta: float = 1.0,
                  log_alpha: float = 0.0, trials: int = 32, seed: int = 0) -> AgeProfile:
    """Write ``n`` random pairs into a ``d x d`` state, then read every key back, sorted by age.

    ``rule``: ``"delta"`` (the gated delta rule with a constant ``log_alpha``; 0 is DeltaNet) or
    ``"additive"`` (linear attention's ``S <- alpha S + beta k^T v``). Keys are random unit
    vectors, values standard normal, every pair written with strength ``beta``.
    """
    if rule not in ("delta", "additive"):
        raise ValueError(f"rule must be 'delta' or 'additive', got {rule!r}")
    d, n, trials = check_int(d, "d", 1), check_int(n, "n", 1), check_int(trials, "trials", 1)
    beta = check_number(beta, "beta", 0.0, 2.0, what="a number in [0, 2]")
    la = float(_log_alpha(log_alpha, d))
    gen = torch.Generator().manual_seed(check_int(seed, "seed", 0))
    k = _unit_keys((trials, n), list(range(d)), d, gen)
    v = torch.randn(trials, n, d, generator=gen, dtype=torch.float64)
    if rule == "additive":
        age = torch.arange(n - 1, -1, -1, dtype=torch.float64)
        # alpha^age, with alpha^0 = 1 even for alpha = 0 (log_alpha = -inf: -inf * 0 is NaN)
        weights = beta * torch.where(age == 0, 1.0, torch.exp(la * age))
        S = k.transpose(1, 2) @ (weights[None, :, None] * v)
    else:
        b = torch.full((trials, 1, n), beta, dtype=torch.float64)
        g = torch.full((trials, 1, n), la, dtype=torch.float64)
        _, S = gated_delta.recurrent(k[:, None], k[:, None], v[:, None], b, g)
        S = S[:, 0]
    read = k @ S  # (trials, n, d)
    signal = ((read * v).sum(-1) / (v * v).sum(-1)).mean(0).flip(0)  # age 0 first
    error = ((read - v).norm(dim=-1) / v.norm(dim=-1)).mean(0).flip(0)
    return AgeProfile(list(range(n)), signal.tolist(), error.tolist())
