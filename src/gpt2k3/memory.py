r"""Associative-memory experiments: write N key/value pairs into one D x D state, read them back.

A linear-attention state is an associative memory: writing the pair ``(k, v)`` adds the outer
product ``k^T v``, and reading with a key returns ``k S``. One association comes back scaled by
the key's squared norm, ``k (k^T v) = |k|^2 v``, so unit keys return it exactly. With many
associations each read also returns every other value, weighted by the key overlaps,

.. math::

    k_i S = |k_i|^2 v_i + \sum_{j \ne i} (k_i \cdot k_j)\, v_j ,

which vanishes only for orthogonal keys -- at most ``D`` of them. Beyond that, or with keys that
merely point in random directions, the sum is *interference*, and it grows with ``N``.

Two write rules are compared:

* ``"additive"`` -- linear attention: ``S = sum_i k_i^T v_i``;
* ``"delta"`` -- DeltaNet: each write first reads what the key already returns and stores only
  the correction, ``S <- S + beta k^T (v - k S)``, processed in order
  (:func:`gpt2k3.mixers.delta.recurrent`).

:func:`retrieval_error` measures how well every stored value can be read back; :func:`error_curve`
sweeps the number of pairs for a plot.
"""

from __future__ import annotations

import operator

import torch

from ._validate import check_tensor
from .mixers import delta as _delta

__all__ = [
    "random_unit_keys",
    "orthogonal_keys",
    "write_additive",
    "write_delta",
    "read",
    "retrieval_error",
    "error_curve",
]

_RULES = ("additive", "delta")
_KEY_KINDS = ("random", "orthogonal")


def _check_size(x, name: str, minimum: int) -> int:
    """Require an integer (Python, NumPy or 0-d tensor; not bool) ``>= minimum``."""
    if isinstance(x, bool) or not hasattr(x, "__index__") or operator.index(x) < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {x!r}")
    return operator.index(x)


def random_unit_keys(n: int, d: int, generator: torch.Generator | None = None, dtype=torch.float32):
    """``n`` keys of dimension ``d``, independent and uniform on the unit sphere: shape ``(n, d)``."""
    n, d = _check_size(n, "n", 0), _check_size(d, "d", 1)
    x = torch.randn(n, d, generator=generator, dtype=dtype)
    return x / x.norm(dim=-1, keepdim=True)


def orthogonal_keys(n: int, d: int, generator: torch.Generator | None = None, dtype=torch.float32):
    """``n <= d`` orthonormal keys of dimension ``d`` in a random orientation: shape ``(n, d)``.

    The rows of the Q factor of a Gaussian matrix (computed in float64, then cast).
    """
    n, d = _check_size(n, "n", 0), _check_size(d, "d", 1)
    if n > d:
        raise ValueError(
            f"orthogonal_keys needs n <= d (there are at most d orthogonal directions); got n={n}, d={d}"
        )
    g = torch.randn(d, d, generator=generator, dtype=torch.float64)
    Q, _ = torch.linalg.qr(g)
    return Q.T[:n].to(dtype).contiguous()


def _check_pairs(keys, values) -> None:
    check_tensor(keys, "keys", 2)
    check_tensor(values, "values", 2)
    if keys.shape[0] != values.shape[0]:
        raise ValueError(
            f"values must have shape (N, Dv) with N = {keys.shape[0]} rows to match keys (N, D); "
            f"got {tuple(values.shape)}"
        )


def write_additive(keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Linear-attention write of all pairs: ``S = sum_i k_i^T v_i = K^T V``, shape ``(D, Dv)``.

    (This is the state :func:`gpt2k3.mixers.linear.recurrent` ends with, minus its normaliser.)
    """
    _check_pairs(keys, values)
    return keys.transpose(0, 1) @ values


def write_delta(keys: torch.Tensor, values: torch.Tensor, beta=1.0) -> torch.Tensor:
    """DeltaNet write of the pairs in order, starting from an empty state: shape ``(D, Dv)``.

    ``beta`` is the write strength, a float or a tensor of shape ``(N,)``. Runs
    :func:`gpt2k3.mixers.delta.recurrent` on a single head (the queries are irrelevant to the
    final state; the keys are passed for them).
    """
    _check_pairs(keys, values)
    n = keys.shape[0]
    if isinstance(beta, torch.Tensor):
        if beta.shape != (n,):
            raise ValueError(
                f"beta must be a float or a tensor of shape (N,) = ({n},); got {tuple(beta.shape)}"
            )
        beta = beta.to(keys.dtype)
    else:
        beta = torch.full((n,), float(beta), dtype=keys.dtype)
    k = keys[None, None]  # (1, 1, N, D)
    _, S = _delta.recurrent(k, k, values[None, None], beta[None, None])
    return S[0, 0].to(torch.promote_types(keys.dtype, values.dtype))


def read(S: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Read the state with every key: ``K S``, shape ``(N, Dv)``."""
    check_tensor(S, "S", 2)
    check_tensor(keys, "keys", 2)
    if keys.shape[1] != S.shape[0]:
        raise ValueError(
            f"keys must have shape (N, D) with D = {S.shape[0]} to match S (D, Dv); "
            f"got {tuple(keys.shape)}"
        )
    return keys @ S


def _write(keys, values, rule: str, beta):
    if rule == "additive":
        return write_additive(keys, values)
    if rule == "delta":
        return write_delta(keys, values, beta)
    raise ValueError(f"rule must be one of {_RULES}, got {rule!r}")


def retrieval_error(keys: torch.Tensor, values: torch.Tensor, rule: str = "additive", beta=1.0):
    """Write all pairs with ``rule`` and read every key back.

    Returns the mean over pairs of the relative L2 error ``|k_i S - v_i| / |v_i|``
    (0 = perfect recall; about ``sqrt((N - 1) / D)`` for the additive rule with random unit keys).
    ``beta`` is used by the delta rule only.
    """
    if rule not in _RULES:
        raise ValueError(f"rule must be one of {_RULES}, got {rule!r}")
    S = _write(keys, values, rule, beta)
    err = (read(S, keys) - values).norm(dim=-1) / values.norm(dim=-1)
    return err.mean().item() if err.numel() else 0.0


def error_curve(
    d: int,
    ns,
    rule: str = "additive",
    key_kind: str = "random",
    beta=1.0,
    seed: int = 0,
    trials: int = 8,
    dtype=torch.float32,
) -> list[float]:
    """Mean retrieval error against the number of stored pairs, for a plot.

    For each ``n`` in ``ns``: ``trials`` times, draw ``n`` keys (``key_kind``: ``"random"`` unit
    keys or ``"orthogonal"`` ones, which needs ``n <= d``) and ``n`` standard-normal values of
    dimension ``d``, write them with ``rule`` into a ``d x d`` state and measure
    :func:`retrieval_error`. Deterministic for a given ``seed``.

    Returns:
        One mean error per entry of ``ns``.
    """
    d, trials = _check_size(d, "d", 1), _check_size(trials, "trials", 1)
    if rule not in _RULES:
        raise ValueError(f"rule must be one of {_RULES}, got {rule!r}")
    if key_kind not in _KEY_KINDS:
        raise ValueError(f"key_kind must be one of {_KEY_KINDS}, got {key_kind!r}")
    ns = [_check_size(n, "each n in ns", 1) for n in ns]
    if key_kind == "orthogonal" and max(ns, default=0) > d:
        raise ValueError(f"orthogonal keys need every n <= d = {d}; got max(ns) = {max(ns)}")
    make_keys = random_unit_keys if key_kind == "random" else orthogonal_keys
    gen = torch.Generator().manual_seed(seed)
    curve = []
    for n in ns:
        errs = []
        for _ in range(trials):
            keys = make_keys(n, d, gen, dtype=dtype)
            values = torch.randn(n, d, generator=gen, dtype=dtype)
            errs.append(retrieval_error(keys, values, rule, beta))
        curve.append(sum(errs) / trials)
    return curve
