r"""Associative-memory experiments: write N key/value pairs into one D x D state, read them back.

A linear-attention state is an associative memory: writing the pair ``(k, v)`` adds the outer
product ``k^T v``, and reading with a key returns ``k S``. One association comes back scaled by
the key's squared norm, ``k (k^T v) = |k|^2 v``, so unit keys return it exactly. With many
associations each read also returns every other value, weighted by the key overlaps,

.. math::

    k_i S = |k_i|^2 v_i + \sum_{j \ne i} (k_i \cdot k_j)\, v_j ,

which vanishes only for orthogonal keys -- at most ``D`` of them. Beyond that, or with keys that
merely point in random directions, the sum is *interference*, and it grows with ``N``.

For random unit keys in ``D`` dimensions each overlap ``k_i . k_j`` has mean 0 and variance
``1/D``, so the interference of ``N - 1`` other values has about ``(N - 1)/D`` times the energy of
the wanted one: the relative error of the additive rule is about ``sqrt((N - 1) / D)``
(:func:`expected_additive_error`).

Three ways to fill the state are compared:

* ``"additive"`` -- linear attention: ``S = sum_i k_i^T v_i``;
* ``"delta"`` -- DeltaNet: each write first reads what the key already returns and stores only
  the correction, ``S <- S + beta k^T (v - k S)``, processed in order
  (:func:`gpt2k3.ops.delta`); :func:`read_erase_write` takes one such write apart;
* :func:`linear_attention_error_curve` is chapter 3's linear attention used the same way: ELU+1
  features of standard-normal keys (all positive, so no two are orthogonal), the additive write,
  and a read divided by the normaliser ``q . z``. The ``"additive"`` rule above is the bare write,
  with zero-mean unit keys and no normaliser;
* ``"least_squares"`` -- not a write rule but a yardstick: the state that minimises the total
  squared recall error over all pairs, ``argmin_S |K S - V|^2``, computed with every pair in
  view at once. It is exact while the keys are linearly independent (``N <= D``) and no ``D x D``
  state can do better in that measure once ``N > D``.

:func:`pair_errors` and :func:`retrieval_error` measure how well every stored value can be read
back; :func:`error_curve` sweeps the number of pairs and :func:`error_by_position` shows which
pairs (oldest or newest) are lost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gpt2k3.checks import (
    check_choice,
    check_draw,
    check_finite,
    check_write_strength,
    check_float_tensor,
    check_int,
    check_number,
    check_same_dtype,
)
from gpt2k3.ops import delta as _delta
from gpt2k3.ops.linear import elu1 as _elu1

__all__ = [
    "RULES",
    "random_unit_keys",
    "orthogonal_keys",
    "write_additive",
    "write_delta",
    "write_least_squares",
    "read",
    "DeltaStep",
    "read_erase_write",
    "pair_errors",
    "retrieval_error",
    "expected_additive_error",
    "error_curve",
    "error_by_position",
    "linear_attention_error_curve",
]

#: The ways of filling a state that :func:`retrieval_error` and :func:`error_curve` know.
RULES = ("additive", "delta", "least_squares")
_KEY_KINDS = ("random", "orthogonal")


def random_unit_keys(n: int, d: int, generator: torch.Generator | None = None, dtype=torch.float32):
    """``n`` keys of dimension ``d``, independent and uniform on the unit sphere: shape ``(n, d)``."""
    n, d = check_int(n, "n", 0), check_int(d, "d", 1)
    check_draw(generator, dtype)
    x = torch.randn(n, d, generator=generator, dtype=dtype)
    return x / x.norm(dim=-1, keepdim=True)


def orthogonal_keys(n: int, d: int, generator: torch.Generator | None = None, dtype=torch.float32):
    """``n <= d`` orthonormal keys of dimension ``d`` in a random orientation: shape ``(n, d)``.

    The rows of the Q factor of a Gaussian matrix (computed in float64, then cast).
    """
    n, d = check_int(n, "n", 0), check_int(d, "d", 1)
    check_draw(generator, dtype)
    if n > d:
        raise ValueError(
            f"orthogonal_keys needs n <= d (there are at most d orthogonal directions); got n={n}, d={d}"
        )
    g = torch.randn(d, d, generator=generator, dtype=torch.float64)
    Q, _ = torch.linalg.qr(g)
    return Q.T[:n].to(dtype).contiguous()


def _check_tensors(*named) -> None:
    """``(tensor, name, ndim)`` triples: floating, finite, of one dtype (the experiments' front
    door: they run ops that read no value)."""
    for t, name, ndim in named:
        check_finite(check_float_tensor(t, name, ndim), name)
    check_same_dtype(*((t, name) for t, name, _ in named))


def _check_pairs(keys, values) -> None:
    _check_tensors((keys, "keys", 2), (values, "values", 2))
    if keys.shape[0] != values.shape[0]:
        raise ValueError(
            f"values must have shape (N, Dv) with N = {keys.shape[0]} rows to match keys (N, D); "
            f"got {tuple(values.shape)}"
        )


def write_additive(keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Linear-attention write of all pairs: ``S = sum_i k_i^T v_i = K^T V``, shape ``(D, Dv)``.

    (This is the state :func:`gpt2k3.ops.linear.recurrent` ends with, minus its normaliser.)
    """
    _check_pairs(keys, values)
    return keys.transpose(0, 1) @ values


def _beta_vector(beta, keys: torch.Tensor) -> torch.Tensor:
    """``beta`` as a tensor of shape ``(N,)`` for the ``(..., N, D)`` keys: a float is repeated, a
    tensor must be ``(N,)``; ``beta_i |k_i|^2`` must lie in ``[0, 2]``
    (:func:`gpt2k3.checks.check_write_strength`: the delta-rule op itself reads no value)."""
    vector = _beta_as_tensor(beta, keys.shape[-2], keys.dtype)
    check_write_strength(vector.expand(keys.shape[:-1]), keys)
    return vector


def _beta_as_tensor(beta, n: int, dtype) -> torch.Tensor:
    if isinstance(beta, torch.Tensor):
        if beta.shape != (n,):
            raise ValueError(
                f"beta must be a float or a tensor of shape (N,) = ({n},); got {tuple(beta.shape)}"
            )
        return beta.to(dtype)
    beta = check_number(beta, "beta", what=f"a float or a tensor of shape (N,) = ({n},)")
    return torch.full((n,), beta, dtype=dtype)


def _write_delta_batched(keys: torch.Tensor, values: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """Delta-rule writes of ``(B, N, D)`` keys and ``(B, N, Dv)`` values, ``beta`` ``(N,)``.

    Runs :func:`gpt2k3.ops.delta.chunkwise` (tested equal to the token-by-token recurrence)
    with the batch of trials as its batch dimension and one head; the queries do not affect the
    final state, so the keys stand in for them.
    """
    k = keys.unsqueeze(1)  # (B, 1, N, D)
    b = beta.to(keys.dtype).expand(keys.shape[0], 1, keys.shape[1])
    _, S = _delta.chunkwise(k, k, values.unsqueeze(1), b)
    return S[:, 0].to(torch.promote_types(keys.dtype, values.dtype))


def write_delta(keys: torch.Tensor, values: torch.Tensor, beta=1.0) -> torch.Tensor:
    """DeltaNet write of the pairs in order, starting from an empty state: shape ``(D, Dv)``.

    ``beta`` is the write strength, a float or a tensor of shape ``(N,)``, with
    ``beta_i |k_i|^2`` in ``[0, 2]`` (``beta`` in ``[0, 2]`` for unit keys; ``ValueError``
    otherwise). Uses the DeltaNet mixer of :mod:`gpt2k3.ops.delta` on a single head.
    """
    _check_pairs(keys, values)
    beta = _beta_vector(beta, keys)
    return _write_delta_batched(keys[None], values[None], beta)[0]


def write_least_squares(keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The state with the smallest total squared recall error, ``argmin_S |K S - V|^2``: ``(D, Dv)``.

    A yardstick, not a write rule (it needs every pair at once). Exact recall whenever the keys are
    linearly independent, which random keys are up to ``N = D``; for ``N < D`` the minimum-norm
    solution. Computed in float64.
    """
    _check_pairs(keys, values)
    return _write_least_squares_batched(keys[None], values[None])[0]


def _write_least_squares_batched(keys, values):
    dtype = torch.promote_types(keys.dtype, values.dtype)
    # the pseudo-inverse gives the minimum-norm solution in both the under- and over-determined case
    return (torch.linalg.pinv(keys.double()) @ values.double()).to(dtype)


def read(S: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Read the state with every key: ``K S``, shape ``(N, Dv)``."""
    _check_tensors((S, "S", 2), (keys, "keys", 2))
    if keys.shape[1] != S.shape[0]:
        raise ValueError(
            f"keys must have shape (N, D) with D = {S.shape[0]} to match S (D, Dv); "
            f"got {tuple(keys.shape)}"
        )
    return keys @ S


# --------------------------------------------------------------------------- one write, taken apart


@dataclass(frozen=True)
class DeltaStep:
    """One delta-rule write of ``(k, v)`` into ``S``, stage by stage (all states ``(D, Dv)``).

    ``before`` -- the state; ``v_old = k S`` -- what the key reads now ("read the board");
    ``erased = S - beta k^T v_old`` -- the old association removed (fully for ``beta = 1`` and a
    unit key); ``after = erased + beta k^T v`` -- the new one written. ``read_erased`` and
    ``read_after`` are what the key reads at those stages.
    """

    before: torch.Tensor
    v_old: torch.Tensor
    erased: torch.Tensor
    read_erased: torch.Tensor
    after: torch.Tensor
    read_after: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    beta: float


def read_erase_write(S: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: float = 1.0) -> DeltaStep:
    """Take one delta-rule write apart: read the board, erase, write.

    Args:
        S: ``(D, Dv)`` state; k: ``(D,)`` key (normalise it for an exact overwrite);
        v: ``(Dv,)`` value; beta: write strength in ``[0, 2]``.

    ``after`` equals the state :func:`gpt2k3.ops.delta.recurrent` reaches (tested).
    """
    _check_tensors((S, "S", 2), (k, "k", 1), (v, "v", 1))
    if k.shape[0] != S.shape[0] or v.shape[0] != S.shape[1]:
        raise ValueError(
            f"k must have shape (D,) = ({S.shape[0]},) and v shape (Dv,) = ({S.shape[1]},) to match "
            f"S (D, Dv); got k {tuple(k.shape)} and v {tuple(v.shape)}"
        )
    beta = check_number(beta, "beta", 0.0, 2.0, what="a float in [0, 2]")
    v_old = k @ S
    erased = S - beta * torch.outer(k, v_old)
    after = erased + beta * torch.outer(k, v)
    return DeltaStep(before=S, v_old=v_old, erased=erased, read_erased=k @ erased, after=after,
                     read_after=k @ after, k=k, v=v, beta=beta)


# --------------------------------------------------------------------------- recall


def _write(keys, values, rule: str, beta):
    """Fill a state from ``(B, N, D)`` keys and ``(B, N, Dv)`` values: ``(B, D, Dv)``."""
    if rule == "additive":
        return keys.transpose(-1, -2) @ values
    if rule == "delta":
        return _write_delta_batched(keys, values, _beta_vector(beta, keys))
    if rule == "least_squares":
        return _write_least_squares_batched(keys, values)
    raise AssertionError(f"unknown rule {rule!r}")  # callers check the rule first


def _pair_errors(keys, values, rule, beta):
    """``|k_i S - v_i| / |v_i|`` for batched ``(B, N, D)`` keys: ``(B, N)``."""
    S = _write(keys, values, rule, beta)
    return (keys @ S - values).norm(dim=-1) / values.norm(dim=-1)


def pair_errors(keys: torch.Tensor, values: torch.Tensor, rule: str = "additive", beta=1.0) -> torch.Tensor:
    """Write all pairs with ``rule``, read every key back: ``|k_i S - v_i| / |v_i|``, shape ``(N,)``.

    0 is perfect recall of pair ``i``; 1 is as bad as reading nothing. ``beta`` is used by the
    delta rule only; ``rule`` is one of :data:`RULES`. A value row of all zeros has no relative
    error and raises ``ValueError`` (it used to come back as ``inf``).
    """
    check_choice(rule, "rule", RULES)
    _check_pairs(keys, values)
    zero = (values == 0).all(-1)
    if bool(zero.any()):
        raise ValueError(
            "values must have no all-zero row (each error is relative to |v_i|, undefined for "
            f"v_i = 0); row {zero.nonzero()[0].item()} is zero"
        )
    return _pair_errors(keys[None], values[None], rule, beta)[0]


def retrieval_error(keys: torch.Tensor, values: torch.Tensor, rule: str = "additive", beta=1.0):
    """The mean over pairs of :func:`pair_errors`: a float (0 = perfect recall).

    About ``sqrt((N - 1) / D)`` for the additive rule with random unit keys.
    """
    err = pair_errors(keys, values, rule, beta)
    return err.mean().item() if err.numel() else 0.0


def expected_additive_error(n: int, d: int) -> float:
    """``sqrt((n - 1) / d)``: the root-mean-square relative recall error of the additive rule with
    ``n`` random unit keys in ``d`` dimensions (see the module docstring). The mean error that
    :func:`error_curve` reports is slightly below it (the mean of a square root is at most the
    square root of the mean)."""
    n, d = check_int(n, "n", 1), check_int(d, "d", 1)
    return math.sqrt((n - 1) / d)


def _draw(n, d, trials, key_kind, gen, dtype):
    """``trials`` sets of ``n`` keys (``(trials, n, d)``) and standard-normal values of dimension ``d``."""
    if key_kind == "random":
        keys = torch.randn(trials, n, d, generator=gen, dtype=dtype)
        keys = keys / keys.norm(dim=-1, keepdim=True)
    else:
        g = torch.randn(trials, d, d, generator=gen, dtype=torch.float64)
        keys = torch.linalg.qr(g)[0].transpose(-1, -2)[:, :n].to(dtype).contiguous()
    values = torch.randn(trials, n, d, generator=gen, dtype=dtype)
    return keys, values


def _check_curve_args(d, rule, key_kind, trials, ns):
    d, trials = check_int(d, "d", 1), check_int(trials, "trials", 1)
    check_choice(rule, "rule", RULES)
    check_choice(key_kind, "key_kind", _KEY_KINDS)
    if isinstance(ns, (str, bytes)) or not hasattr(ns, "__iter__"):
        raise ValueError(f"ns must be a sequence of positive ints, got {ns!r}")
    ns = [check_int(n, "each n in ns", 1) for n in ns]
    if not ns:
        raise ValueError("ns must hold at least one n, got an empty sequence")
    if key_kind == "orthogonal" and max(ns, default=0) > d:
        raise ValueError(f"orthogonal keys need every n <= d = {d}; got max(ns) = {max(ns)}")
    return d, trials, ns


def error_curve(
    d: int,
    ns,
    rule: str = "additive",
    key_kind: str = "random",
    beta=1.0,
    seed: int = 0,
    trials: int = 8,
    dtype=torch.float64,
) -> list[float]:
    """Mean retrieval error against the number of stored pairs, for a plot.

    For each ``n`` in ``ns``: ``trials`` independent draws of ``n`` keys (``key_kind``:
    ``"random"`` unit keys, or ``"orthogonal"`` ones, which needs ``n <= d``) and ``n``
    standard-normal values of dimension ``d``, written with ``rule`` into a ``d x d`` state; the
    error of every pair read back (:func:`pair_errors`), averaged over pairs and trials.
    Deterministic for a given ``seed``; the trials run as one batch.

    Returns:
        One mean error per entry of ``ns``.
    """
    d, trials, ns = _check_curve_args(d, rule, key_kind, trials, ns)
    gen = torch.Generator().manual_seed(check_int(seed, "seed", 0))
    curve = []
    for n in ns:
        keys, values = _draw(n, d, trials, key_kind, gen, dtype)
        curve.append(_pair_errors(keys, values, rule, beta).mean().item())
    return curve


def error_by_position(
    d: int,
    n: int,
    rule: str = "additive",
    key_kind: str = "random",
    beta=1.0,
    seed: int = 0,
    trials: int = 8,
    dtype=torch.float64,
) -> list[float]:
    """The recall error of each of ``n`` pairs by the order it was written in (first = oldest).

    Same draws as :func:`error_curve`, averaged over ``trials`` but not over pairs: it shows
    *which* associations a rule loses -- the additive rule blurs all of them alike, the delta rule
    keeps the newest and lets the oldest go.

    Returns:
        ``n`` mean errors, oldest pair first.
    """
    d, trials, (n,) = _check_curve_args(d, rule, key_kind, trials, [n])
    gen = torch.Generator().manual_seed(check_int(seed, "seed", 0))
    keys, values = _draw(n, d, trials, key_kind, gen, dtype)
    return _pair_errors(keys, values, rule, beta).mean(0).tolist()


def linear_attention_error_curve(d: int, ns, seed: int = 0, trials: int = 8, dtype=torch.float64) -> list[float]:
    """Mean retrieval error of chapter 3's linear attention, against the number of stored pairs.

    For each ``n`` in ``ns``: ``trials`` draws of ``n`` standard-normal keys mapped by ELU+1
    (:func:`gpt2k3.ops.linear.elu1`, positive in every entry) and ``n`` standard-normal values;
    the state ``S = sum_i phi(k_i)^T v_i`` and normaliser ``z = sum_i phi(k_i)``; each pair read
    back with its own feature, ``phi(k_i) S / (phi(k_i) . z)``, as a causal read at the last
    position does. The error is ``|read - v_i| / |v_i|``, averaged over pairs and trials.

    Unlike the ``"additive"`` rule of :func:`error_curve` (zero-mean unit keys, no normaliser),
    every pair of positive features overlaps, so the read is a weighted average of all values
    and the error tends to 1 as ``n`` grows, whatever ``d`` is.
    """
    d, trials, ns = _check_curve_args(d, "additive", "random", trials, ns)
    gen = torch.Generator().manual_seed(check_int(seed, "seed", 0))
    curve = []
    for n in ns:
        keys = _elu1(torch.randn(trials, n, d, generator=gen, dtype=dtype))
        values = torch.randn(trials, n, d, generator=gen, dtype=dtype)
        S, z = keys.transpose(-1, -2) @ values, keys.sum(1, keepdim=True)
        reads = (keys @ S) / (keys * z).sum(-1, keepdim=True)
        curve.append(((reads - values).norm(dim=-1) / values.norm(dim=-1)).mean().item())
    return curve
