"""Input checks shared by the sequence mixers and the memory experiments.

Every public function in :mod:`gpt2k3.mixers` validates its arguments with these helpers
before doing any arithmetic, so that bad input fails loudly with a ``ValueError`` that
names the argument and says what was expected, instead of broadcasting into a wrong answer or
quietly producing NaN.

Conventions (see the design notes): sequences are ``(B, H, T, D)``, recurrent states are
``(B, H, Dk, Dv)``, per-token scalars such as ``beta`` are ``(B, H, T)``.
"""

from __future__ import annotations

import operator

import torch

__all__ = [
    "check_tensor",
    "check_qkv",
    "check_chunk_size",
    "check_per_token",
    "check_log_alpha",
    "check_state",
    "check_nonnegative",
    "compute_dtype",
    "output_dtype",
]


def _fmt(shape) -> str:
    """Format a shape as ``(2, 3, 4)``; ``None`` entries print as ``*`` (any size)."""
    return "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"


def check_tensor(x, name: str, ndim: int | None = None) -> torch.Tensor:
    """Require ``x`` to be a tensor, optionally of exactly ``ndim`` dimensions."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(
            f"{name} must have {ndim} dimensions, got {x.ndim} with shape {_fmt(x.shape)}"
        )
    return x


def check_qkv(q, k, v) -> tuple[int, int, int, int, int]:
    """Check ``q, k`` are ``(B, H, T, Dk)`` and ``v`` is ``(B, H, T, Dv)``.

    Returns ``(B, H, T, Dk, Dv)``.
    """
    check_tensor(q, "q", 4)
    check_tensor(k, "k", 4)
    check_tensor(v, "v", 4)
    B, H, T, Dk = q.shape
    if k.shape != q.shape:
        raise ValueError(
            f"k must have the same shape as q, (B, H, T, Dk) = {_fmt(q.shape)}; "
            f"got {_fmt(k.shape)}"
        )
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"v must have shape (B, H, T, Dv) = {_fmt((B, H, T, None))} to match q; "
            f"got {_fmt(v.shape)}"
        )
    return B, H, T, Dk, v.shape[-1]


def check_positive_int(value, name: str) -> int:
    """Require a positive integer (Python, NumPy or 0-d integer tensor); ``bool`` is rejected.
    Raises ``ValueError`` naming ``name``; returns the value as an ``int``."""
    try:
        n = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        n = None
    if n is None or n <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return n


def check_chunk_size(chunk_size) -> int:
    """Require a positive integer chunk size."""
    return check_positive_int(chunk_size, "chunk_size")


def check_per_token(x, name: str, B: int, H: int, T: int) -> torch.Tensor:
    """Require a per-token scalar of shape ``(B, H, T)`` (e.g. the write strength ``beta``)."""
    check_tensor(x, name)
    if tuple(x.shape) != (B, H, T):
        raise ValueError(f"{name} must have shape (B, H, T) = {_fmt((B, H, T))}; got {_fmt(x.shape)}")
    return x


def check_log_alpha(log_alpha, B: int, H: int, T: int, Dk: int) -> torch.Tensor:
    """Check a log-space decay gate.

    Accepted shapes: ``(B, H, T)`` (one scalar per head and token, Gated DeltaNet) or
    ``(B, H, T, Dk)`` (one value per key channel, Kimi Delta Attention). Values must be
    ``<= 0`` (a decay factor ``alpha = exp(log_alpha)`` in ``[0, 1]``); ``-inf`` is allowed
    and means "forget everything". NaN is rejected.
    """
    check_tensor(log_alpha, "log_alpha")
    if tuple(log_alpha.shape) not in ((B, H, T), (B, H, T, Dk)):
        raise ValueError(
            f"log_alpha must have shape (B, H, T) = {_fmt((B, H, T))} or "
            f"(B, H, T, Dk) = {_fmt((B, H, T, Dk))}; got {_fmt(log_alpha.shape)}"
        )
    if not bool((log_alpha <= 0).all()):
        worst = log_alpha.detach().float().nan_to_num(nan=float("inf")).max().item()
        raise ValueError(
            "log_alpha must be <= 0 everywhere (a decay alpha = exp(log_alpha) in [0, 1]) and "
            f"not NaN; got a maximum of {worst:g}"
        )
    return log_alpha


def check_state(S, name: str, shape: tuple[int, ...], names: str) -> torch.Tensor:
    """Require a state tensor of exactly ``shape``; ``names`` spells it, e.g. ``"(B, H, Dk, Dv)"``."""
    check_tensor(S, name)
    if tuple(S.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {names} = {_fmt(shape)}; got {_fmt(S.shape)}")
    return S


def check_nonnegative(x: torch.Tensor, name: str, hint: str = "") -> None:
    """Require every entry of ``x`` to be ``>= 0`` (and not NaN)."""
    if not bool((x >= 0).all()):
        raise ValueError(f"{name} must be non-negative everywhere{hint}")


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype the arithmetic runs in: the promoted input dtype, at least float32.

    Half-precision (and integer) inputs are computed in float32 -- several kernels we use, such
    as ``torch.linalg.solve_triangular``, do not accept them on CPU, and a recurrent state is
    precision-sensitive anyway. float64 stays float64.
    """
    dtype = torch.float32
    for t in tensors:
        if t is not None:
            dtype = torch.promote_types(dtype, t.dtype)
    if not dtype.is_floating_point:  # e.g. complex: not supported
        raise ValueError(f"inputs must be real tensors, got dtype {dtype}")
    return dtype


def output_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype outputs are returned in: the promoted dtype of the inputs if floating point."""
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype if dtype.is_floating_point else compute_dtype(*tensors)
