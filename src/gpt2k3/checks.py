"""Input checks at the boundary of the package: one module, one argument order.

Every public function of :mod:`gpt2k3.ops` (and of the memory experiments built on them)
validates its arguments with these helpers before doing any arithmetic, so that bad input fails
loudly with a ``ValueError`` that names the argument and says what was expected, instead of
broadcasting into a wrong answer or quietly producing NaN.

Every helper takes the value first and its name second, ``check_x(value, name, ...)``, and
returns the value (or what it normalises to).

Conventions (see the design notes): sequences are ``(B, H, T, D)``, recurrent states are
``(B, H, Dk, Dv)``, per-token scalars such as ``beta`` are ``(B, H, T)``, a log-space decay
``g`` is ``(B, H, T)`` or ``(B, H, T, Dk)``.
"""

from __future__ import annotations

import math
import numbers
import operator

import torch

__all__ = [
    "check_int",
    "check_positive_int",
    "check_number",
    "check_positive_float",
    "check_tensor",
    "check_float_tensor",
    "check_finite",
    "check_qkv",
    "check_attention_qkv",
    "check_chunk_size",
    "check_per_token",
    "check_gate",
    "check_state",
    "check_nonnegative",
    "check_write_strength",
    "check_delta_rule",
    "check_gated_delta_rule",
    "check_linear_state",
    "WRITE_STRENGTH_RTOL",
    "compute_dtype",
    "output_dtype",
    "check_layer_input",
]


def _fmt(shape) -> str:
    """Format a shape as ``(2, 3, 4)``; ``None`` entries print as ``*`` (any size)."""
    return "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"


# --------------------------------------------------------------------------------- numbers


def _as_int(value) -> int | None:
    """``value`` as an ``int`` if it is an integer (Python, NumPy, 0-d integer tensor; not ``bool``)."""
    try:
        return None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        return None


def check_int(value, name: str, minimum: int = 0) -> int:
    """Require an integer (Python, NumPy or 0-d integer tensor; ``bool`` is rejected) ``>= minimum``.

    Returns the value as an ``int``.
    """
    n = _as_int(value)
    if n is None or n < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return n


def check_positive_int(value, name: str) -> int:
    """Require a positive integer, as :func:`check_int` (the message says "a positive int")."""
    n = _as_int(value)
    if n is None or n < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return n


def check_number(value, name: str, lo: float = -math.inf, hi: float = math.inf, *,
                 lo_open: bool = False, what: str | None = None) -> float:
    """Require a real number (not ``bool``, not NaN) in ``[lo, hi]`` (``(lo, hi]`` if ``lo_open``).

    ``what`` replaces the default description ("a number in [lo, hi]") in the message.
    Returns the value as a ``float``.
    """
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok:
        x = float(value)
        ok = (lo < x if lo_open else lo <= x) and x <= hi  # False for NaN
    if not ok:
        if what is None:
            what = f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return x


def check_finite_number(value, name: str, sign: int, allow_zero: bool = False) -> float:
    """Require a finite real number (not ``bool``) that is positive (``sign`` 1) or negative
    (``sign`` -1), or zero too with ``allow_zero``. Returns it as a ``float``."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) \
        and (float(value) * sign > 0 or (allow_zero and float(value) == 0))
    if not ok:
        kind = ("non-" + ("negative" if sign > 0 else "positive")) if allow_zero else \
            ("positive" if sign > 0 else "negative")
        raise ValueError(f"{name} must be a finite {kind} number, got {value!r}")
    return float(value)


def check_positive_float(value, name: str, none_ok: bool = False) -> float | None:
    """Require a finite real number ``> 0`` (or ``None`` when ``none_ok``); returns a ``float``."""
    if none_ok and value is None:
        return None
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not ok or not 0 < float(value) < math.inf:  # False for NaN
        raise ValueError(f"{name} must be {'None or ' if none_ok else ''}a finite float > 0, "
                         f"got {value!r}")
    return float(value)


def check_chunk_size(value, name: str = "chunk_size") -> int:
    """Require a positive integer chunk size."""
    return check_positive_int(value, name)


# --------------------------------------------------------------------------------- tensors


def check_tensor(value, name: str, ndim: int | None = None) -> torch.Tensor:
    """Require a tensor, optionally of exactly ``ndim`` dimensions."""
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if ndim is not None and value.ndim != ndim:
        raise ValueError(
            f"{name} must have {ndim} dimensions, got {value.ndim} with shape {_fmt(value.shape)}"
        )
    return value


def check_float_tensor(value, name: str, ndim: int | None = None) -> torch.Tensor:
    """Require a real floating-point tensor (float16, bfloat16, float32, float64, ...)."""
    check_tensor(value, name, ndim)
    if not value.dtype.is_floating_point:
        raise ValueError(f"{name} must have a floating-point dtype, got {value.dtype}")
    return value


def check_finite(value: torch.Tensor, name: str) -> torch.Tensor:
    """Require every entry to be finite (no NaN, no +-inf).

    The mixers reject non-finite inputs instead of letting them spread: a single NaN key
    would poison the whole recurrent state, and fused attention kernels do not all propagate
    a NaN the same way.
    """
    if not bool(torch.isfinite(value).all()):
        bad = (~torch.isfinite(value)).nonzero()[0].tolist()
        raise ValueError(
            f"{name} must be finite everywhere; got {value[tuple(bad)].item()} at index {tuple(bad)}"
        )
    return value


def _check_sequence(value, name: str) -> torch.Tensor:
    check_float_tensor(value, name, 4)
    return check_finite(value, name)


def check_qkv(q, k, v) -> tuple[int, int, int, int, int]:
    """Check ``q, k`` are ``(B, H, T, Dk)`` and ``v`` is ``(B, H, T, Dv)``: floating, finite.

    Returns ``(B, H, T, Dk, Dv)``.
    """
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        check_float_tensor(x, name, 4)
    B, H, T, Dk = q.shape
    if k.shape != q.shape:
        raise ValueError(
            f"k must have the same shape as q, (B, H, T, Dk) = {_fmt(q.shape)}; got {_fmt(k.shape)}"
        )
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"v must have shape (B, H, T, Dv) = {_fmt((B, H, T, None))} to match q; "
            f"got {_fmt(v.shape)}"
        )
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        check_finite(x, name)
    return B, H, T, Dk, v.shape[-1]


def check_attention_qkv(q, k, v, finite_kv: bool = True) -> tuple[int, int, int, int, int, int]:
    """Queries ``(B, H, Tq, Dk)`` against keys ``(B, H, Tk, Dk)`` and values ``(B, H, Tk, Dv)``,
    ``Tk >= Tq``: floating, finite (``k`` and ``v`` only if ``finite_kv``: a KV cache checks
    each entry once, when it is written). Returns ``(B, H, Tq, Tk, Dk, Dv)``."""
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        check_float_tensor(x, name, 4)
    B, H, Tq, Dk = q.shape
    Tk = k.shape[2]
    if k.shape[:2] != q.shape[:2] or k.shape[3] != Dk:
        raise ValueError(
            f"k must have shape (B, H, Tk, Dk) = {_fmt((B, H, None, Dk))} to match q; "
            f"got {_fmt(k.shape)}"
        )
    if Tk < Tq:
        raise ValueError(
            f"k must hold at least as many positions as q (the queries are the last Tq of the Tk "
            f"positions); got Tk = {Tk} < Tq = {Tq}"
        )
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"v must have shape (B, H, Tk, Dv) = {_fmt((B, H, Tk, None))} to match k; "
            f"got {_fmt(v.shape)}"
        )
    for x, name in ((q, "q"), (k, "k"), (v, "v")) if finite_kv else ((q, "q"),):
        check_finite(x, name)
    return B, H, Tq, Tk, Dk, v.shape[-1]


def check_per_token(value, name: str, B: int, H: int, T: int) -> torch.Tensor:
    """Require a finite floating per-token scalar of shape ``(B, H, T)`` (e.g. ``beta``)."""
    check_float_tensor(value, name)
    if tuple(value.shape) != (B, H, T):
        raise ValueError(
            f"{name} must have shape (B, H, T) = {_fmt((B, H, T))}; got {_fmt(value.shape)}"
        )
    return check_finite(value, name)


def check_gate(value, name: str, B: int, H: int, T: int, Dk: int) -> torch.Tensor:
    """Check a log-space decay gate ``g = log(alpha)``.

    Accepted shapes: ``(B, H, T)`` (one scalar per head and token, Gated DeltaNet) or
    ``(B, H, T, Dk)`` (one value per key channel, Kimi Delta Attention). Values must be
    ``<= 0`` (a decay factor ``alpha = exp(g)`` in ``[0, 1]``); ``-inf`` is allowed and means
    "forget everything". NaN is rejected.
    """
    check_float_tensor(value, name)
    if tuple(value.shape) not in ((B, H, T), (B, H, T, Dk)):
        raise ValueError(
            f"{name} must have shape (B, H, T) = {_fmt((B, H, T))} or "
            f"(B, H, T, Dk) = {_fmt((B, H, T, Dk))}; got {_fmt(value.shape)}"
        )
    if not bool((value <= 0).all()):
        worst = value.detach().double().nan_to_num(nan=math.inf, posinf=math.inf).max().item()
        raise ValueError(
            f"{name} must be <= 0 everywhere (a decay alpha = exp({name}) in [0, 1]) and "
            f"not NaN; got a maximum of {worst:g}"
        )
    return value


def check_state(value, name: str, shape: tuple[int, ...], names: str) -> torch.Tensor:
    """Require a finite floating state of exactly ``shape``; ``names`` spells it, e.g.
    ``"(B, H, Dk, Dv)"``."""
    check_float_tensor(value, name)
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {names} = {_fmt(shape)}; got {_fmt(value.shape)}")
    return check_finite(value, name)


def check_nonnegative(value: torch.Tensor, name: str, hint: str = "") -> torch.Tensor:
    """Require every entry to be ``>= 0`` (and not NaN)."""
    if not bool((value >= 0).all()):
        raise ValueError(f"{name} must be non-negative everywhere{hint}")
    return value


#: Relative slack on the upper end of ``beta * |k|^2 <= 2`` for rounding: a unit key normalised
#: in float32 has ``|k|^2 = 1 +- a few 1e-7``. Inputs in a coarser dtype get twice its epsilon.
WRITE_STRENGTH_RTOL = 1e-5


def check_write_strength(beta: torch.Tensor, k: torch.Tensor, beta_name: str = "beta",
                         k_name: str = "k") -> None:
    r"""Require ``beta * |k|^2`` in ``[0, 2]`` for every token (the delta rule's stability range).

    One delta-rule step multiplies the state by ``I - beta k^T k``, whose eigenvalue along ``k``
    is ``1 - beta |k|^2`` (1 elsewhere). It lies in ``[-1, 1]`` -- the step is non-expansive --
    exactly when ``beta |k|^2 in [0, 2]``; outside, repeated writes amplify what is stored and the
    state overflows to NaN within a few hundred tokens. For unit keys this is ``beta in [0, 2]``.
    The upper end gets a relative slack for rounding (``WRITE_STRENGTH_RTOL``, or twice the
    machine epsilon of a coarser input dtype). ``beta`` is ``(..., T)`` and ``k`` ``(..., T, Dk)``.
    """
    coarse = max(torch.finfo(beta.dtype).eps, torch.finfo(k.dtype).eps)
    rtol = max(WRITE_STRENGTH_RTOL, 2 * coarse)
    dtype = compute_dtype(beta, k)
    norm2 = k.detach().to(dtype).square().sum(-1)
    strength = beta.detach().to(dtype) * norm2
    bad = ~((strength >= 0) & (strength <= 2 * (1 + rtol)))
    if bool(bad.any()):
        idx = tuple(bad.nonzero()[0].tolist())
        raise ValueError(
            f"{beta_name} * ||{k_name}||^2 must be in [0, 2] for every token (the delta-rule update "
            f"I - beta k^T k is non-expansive only then; for unit keys, beta in [0, 2]); got "
            f"{beta_name} = {beta[idx].item():g} with ||{k_name}||^2 = {norm2[idx].item():g} at "
            f"index {idx}"
        )


def check_delta_rule(q, k, v, beta, initial_state=None) -> tuple[int, int, int, int, int]:
    """All arguments of a DeltaNet form: ``q, k (B, H, T, Dk)``, ``v (B, H, T, Dv)``,
    ``beta (B, H, T)`` with ``beta * |k|^2`` in ``[0, 2]``, an optional ``initial_state
    (B, H, Dk, Dv)``; every tensor floating and finite. Returns ``(B, H, T, Dk, Dv)``."""
    B, H, T, Dk, Dv = check_qkv(q, k, v)
    check_per_token(beta, "beta", B, H, T)
    if initial_state is not None:
        check_state(initial_state, "initial_state", (B, H, Dk, Dv), "(B, H, Dk, Dv)")
    check_write_strength(beta, k)
    return B, H, T, Dk, Dv


def check_gated_delta_rule(q, k, v, beta, g, initial_state=None) -> tuple[int, int, int, int, int]:
    """As :func:`check_delta_rule`, plus the log decay ``g`` (see :func:`check_gate`)."""
    B, H, T, Dk, Dv = check_qkv(q, k, v)
    check_per_token(beta, "beta", B, H, T)
    check_gate(g, "g", B, H, T, Dk)
    if initial_state is not None:
        check_state(initial_state, "initial_state", (B, H, Dk, Dv), "(B, H, Dk, Dv)")
    check_write_strength(beta, k)
    return B, H, T, Dk, Dv


def check_linear_state(value, name: str, B: int, H: int, Dk: int, Dv: int):
    """A linear-attention state: ``None`` or a pair ``(S, z)``, ``S (B, H, Dk, Dv)`` and
    ``z (B, H, Dk)``, floating and finite. Returns ``(S, z)`` or ``(None, None)``."""
    if value is None:
        return None, None
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(
            f"{name} must be a tuple (S, z) with S of shape (B, H, Dk, Dv) and z of shape "
            f"(B, H, Dk); got {type(value).__name__}"
        )
    S, z = value
    check_state(S, f"{name}[0] (S)", (B, H, Dk, Dv), "(B, H, Dk, Dv)")
    check_state(z, f"{name}[1] (z)", (B, H, Dk), "(B, H, Dk)")
    return S, z


# --------------------------------------------------------------------------------- dtypes


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """The dtype the arithmetic runs in: the promoted input dtype, at least float32.

    Half-precision inputs are computed in float32 -- several kernels we use, such as
    ``torch.linalg.solve_triangular``, do not accept them on CPU, and a recurrent state is
    precision-sensitive anyway. float64 stays float64. ``None`` entries are skipped.
    """
    dtype = torch.float32
    for t in tensors:
        if t is not None:
            dtype = torch.promote_types(dtype, t.dtype)
    if not dtype.is_floating_point:  # e.g. complex: not supported
        raise ValueError(f"inputs must be real tensors, got dtype {dtype}")
    return dtype


def output_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype outputs are returned in: the promoted dtype of the inputs."""
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype if dtype.is_floating_point else compute_dtype(*tensors)


def check_layer_input(value, name: str, width: int, dtype: torch.dtype | None = None,
                      ndim: int = 3, shape: str = "(B, T, n_embd)") -> torch.Tensor:
    """A layer's input: a finite floating tensor of ``ndim`` dimensions whose last is ``width``,
    with at least one sequence, in the layer's parameter ``dtype`` if given (a float64 input to
    a float32 layer is an error that says which dtype to use, not a matmul ``RuntimeError``)."""
    if not isinstance(value, torch.Tensor) or value.ndim != ndim or value.shape[-1] != width:
        got = _fmt(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"{name} must have shape {shape} with last size {width}, got {got}")
    check_float_tensor(value, name)
    if value.shape[0] == 0:
        raise ValueError(f"{name} must hold at least one sequence (batch >= 1), got shape "
                         f"{_fmt(value.shape)}")
    if dtype is not None and value.dtype != dtype:
        raise ValueError(f"{name} must have the layer's dtype {dtype} (convert the input with "
                         f"x.to({dtype}) or the layer with layer.to({value.dtype})), got "
                         f"{value.dtype}")
    return check_finite(value, name)
