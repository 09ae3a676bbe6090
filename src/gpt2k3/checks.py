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

import contextvars
import functools
import math
import numbers
import operator


class _LazyTorch:
    """``torch``, imported on first use: the number checks below serve the torch-free
    accounting package, so importing this module must not import torch."""

    def __getattr__(self, name):
        import torch as _torch
        globals()["torch"] = _torch                  # from now on, the module itself
        return getattr(_torch, name)


torch = _LazyTorch()

__all__ = [
    "checked",
    "check_bool",
    "is_int",
    "is_real",
    "check_nonnegative_int",
    "check_positive_number",
    "check_bytes",
    "check_byte_sizes",
    "check_int",
    "check_positive_int",
    "check_number",
    "check_finite_number",
    "check_positive_float",
    "check_tensor",
    "check_float_tensor",
    "check_finite",
    "check_same_dtype",
    "check_draw",
    "check_qkv_shapes",
    "check_attention_qkv",
    "check_attention",
    "check_chunk_size",
    "check_choice",
    "check_instance",
    "check_state_shape",
    "check_write_strength",
    "check_log_decay",
    "check_gdn_gate",
    "check_kda_gate",
    "check_delta_rule_call",
    "check_gated_delta_rule_call",
    "check_chunkwise_call",
    "check_gated_chunkwise_call",
    "check_linear_attention_call",
    "check_linear_decode_call",
    "check_linear_state",
    "WRITE_STRENGTH_RTOL",
    "compute_dtype",
    "output_dtype",
    "check_layer_input",
    "check_token_ids",
    "check_sampling",
]


def checked(check):
    """Decorator: the public door of a pure body. ``check`` runs on the body's arguments and raises
    ``ValueError`` on bad input, once per public call: a door reached inside another door's call
    runs its body alone. ``inspect.unwrap`` (and the book's ``show_source``) reach the body."""
    def wrap(body):
        @functools.wraps(body)
        def door(*args, **kwargs):
            if not _INSIDE_DOOR.get():  # the outermost door checks; what it calls derives from that
                check(*args, **kwargs)
            token = _INSIDE_DOOR.set(True)
            try:
                return body(*args, **kwargs)
            finally:
                _INSIDE_DOOR.reset(token)
        door.check = check
        return door
    return wrap


#: True while the body of a :func:`checked` door runs (per thread and task).
_INSIDE_DOOR = contextvars.ContextVar("gpt2k3_inside_door", default=False)


def check_bool(value, name: str) -> bool:
    """``value`` if it is a real ``bool`` (a string such as ``"no"`` would be silently truthy)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


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
    ok = is_real(value)
    if ok:
        x = _as_float(value)
        ok = (lo < x if lo_open else lo <= x) and x <= hi  # False for NaN
    if not ok:
        if what is None:
            what = f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return x


def check_finite_number(value, name: str, sign: int = 0, allow_zero: bool = False) -> float:
    """Require a finite real number (not ``bool``): of any sign (``sign`` 0), positive (1) or
    negative (-1), or zero too with ``allow_zero``. Returns it as a ``float``."""
    x = _as_float(value) if is_real(value) else math.nan
    ok = math.isfinite(x) and (sign == 0 or x * sign > 0 or (allow_zero and x == 0))
    if not ok:
        kind = {0: "", 1: "positive ", -1: "negative "}[sign]
        if sign and allow_zero:
            kind = "non-" + ("negative " if sign > 0 else "positive ")
        raise ValueError(f"{name} must be a finite {kind}number, got {value!r}")
    return float(value)


def check_positive_float(value, name: str, none_ok: bool = False) -> float | None:
    """Require a finite real number ``> 0`` (or ``None`` when ``none_ok``); returns a ``float``."""
    if none_ok and value is None:
        return None
    if not is_real(value) or not 0 < _as_float(value) < math.inf:  # False for NaN
        raise ValueError(f"{name} must be {'None or ' if none_ok else ''}a finite float > 0, "
                         f"got {value!r}")
    return float(value)


def check_chunk_size(value, name: str = "chunk_size") -> int:
    """Require a positive integer chunk size."""
    return check_positive_int(value, name)


def _as_float(value) -> float:
    """A real number as a ``float``; an int too large for one becomes an infinity, so that a
    finite bound rejects it with the argument's name rather than an ``OverflowError``."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def is_real(value) -> bool:
    """A real number (Python, NumPy) that is not a ``bool``; NaN and infinities included."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_int(value) -> bool:
    """A Python ``int`` that is not a ``bool`` (the accounting's strict reading of a count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_nonnegative_int(value, name: str) -> int:
    """Require an ``int`` (not ``bool``) ``>= 0``; the message says "a non-negative int"."""
    if not is_int(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


def check_positive_number(value, name: str, what: str = "number") -> float:
    """Require a finite real number ``> 0`` (not ``bool``); the message says "a positive
    ``what``". Returns it unchanged."""
    if not is_real(value) or not math.isfinite(_as_float(value)) or value <= 0:
        raise ValueError(f"{name} must be a positive {what}, got {value!r}")
    return value


def check_bytes(value, name: str) -> float:
    """Require a positive finite number of bytes per number (fractional for sub-byte formats)."""
    return check_positive_number(value, name, "number of bytes")


def check_byte_sizes(**sizes) -> None:
    """:func:`check_bytes` for each ``name=value`` (``expert_bytes`` may be ``None``: "the same
    as ``weight_bytes``")."""
    for name, value in sizes.items():
        if not (value is None and name == "expert_bytes"):
            check_bytes(value, name)


def check_choice(value, name: str, choices):
    """Require ``value`` to be one of ``choices`` (a tuple of names, say). Returns it."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def check_instance(value, name: str, cls: type):
    """Require an instance of ``cls`` (the message names the class). Returns it."""
    if not isinstance(value, cls):
        raise ValueError(f"{name} must be a {cls.__name__}, got {type(value).__name__}")
    return value


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


def check_same_dtype(*named: tuple[torch.Tensor, str]) -> None:
    """Require ``(tensor, name)`` pairs of one dtype (a float32 key against a float64 state is an
    error that says so, not a matmul ``RuntimeError``)."""
    if len({t.dtype for t, _ in named}) > 1:
        raise ValueError(f"{', '.join(n for _, n in named)} must share one dtype, got "
                         f"{', '.join(f'{n} {t.dtype}' for t, n in named)}")


def check_draw(generator, dtype) -> None:
    """Arguments of a random draw: ``generator`` ``None`` or a ``torch.Generator``, ``dtype`` a
    real floating ``torch.dtype``."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be None or a torch.Generator, got {generator!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point or dtype.is_complex:
        raise ValueError(f"dtype must be a real floating torch.dtype, got {dtype!r}")


def check_qkv_shapes(q, k, v) -> tuple[int, int, int, int, int]:
    """Floating ``q, k`` of shape ``(B, H, T, Dk)`` and ``v`` of shape ``(B, H, T, Dv)``; reads no
    value (no host sync).

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
    return B, H, T, Dk, v.shape[-1]


def check_attention_qkv(q, k, v) -> tuple[int, int, int, int, int, int]:
    """Queries ``(B, H, Tq, Dk)`` against keys ``(B, H, Tk, Dk)`` and values ``(B, H, Tk, Dv)``,
    ``Tk >= Tq``, all of one floating dtype. Reads no value (no host sync): finiteness is checked
    at the front doors (a layer's input, a KV cache write). Returns ``(B, H, Tq, Tk, Dk, Dv)``."""
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
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"k and v must have q's dtype {q.dtype}, got {k.dtype} and {v.dtype}")
    return B, H, Tq, Tk, Dk, v.shape[-1]


def check_attention(q, k, v, scale=None, dropout_p: float = 0.0) -> None:
    """Every argument of :mod:`gpt2k3.ops.softmax`'s forms: :func:`check_attention_qkv`,
    ``scale`` ``None`` or a finite float ``> 0``, ``dropout_p`` a float in ``[0, 1)``. No value is
    read, so a decode step can afford it."""
    check_attention_qkv(q, k, v)
    check_positive_float(scale, "scale", none_ok=True)
    if check_number(dropout_p, "dropout_p", 0.0, 1.0, what="a float in [0, 1)") == 1.0:
        raise ValueError(f"dropout_p must be a float in [0, 1), got {dropout_p!r}")


def check_state_shape(value, name: str, shape: tuple[int, ...], names: str) -> torch.Tensor:
    """A floating tensor of exactly ``shape`` (``names`` spells it, e.g. ``"(B, H, Dk, Dv)"``);
    reads no value (no host sync)."""
    check_float_tensor(value, name)
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {names} = {_fmt(shape)}; got {_fmt(value.shape)}")
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


def check_log_decay(x, A_log, dt_bias, lower_bound=None, *, per_channel=True) -> None:
    """The door of a forget-gate function (``gpt2k3.layers.deltanet``'s ``*_log_decay``).

    ``x`` is the gate's pre-activation: ``(B, T, H, Dk)`` with ``dt_bias`` ``(H * Dk,)`` when
    ``per_channel`` (KDA; fla-core's layout), else ``(B, T, H)`` with ``dt_bias`` ``(H,)`` (Gated
    DeltaNet); ``A_log`` is ``(H,)``; ``lower_bound``, if given, a finite negative number. Shapes
    only: nothing is read back to the host, nothing is changed.
    """
    if lower_bound is not None:
        check_finite_number(lower_bound, "lower_bound", -1)
    ndim, layout = (4, "(B, T, H, Dk)") if per_channel else (3, "(B, T, H)")
    if not isinstance(x, torch.Tensor) or x.ndim != ndim or not x.dtype.is_floating_point:
        got = _fmt(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a floating {layout} tensor, got {got}")
    H, Dk = x.shape[2], x.shape[3] if per_channel else 1
    for value, name, shape, spelled in ((A_log, "A_log", (H,), "(H,)"),
                                        (dt_bias, "dt_bias", (H * Dk,), "(H * Dk,)" if per_channel else "(H,)")):
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape \
                or not value.dtype.is_floating_point:
            got = f"{value.dtype} {_fmt(value.shape)}" if isinstance(value, torch.Tensor) \
                else type(value).__name__
            raise ValueError(f"{name} must have shape {spelled} = {_fmt(shape)} and a floating "
                             f"dtype, got {got}")


def check_gdn_gate(x, A_log, dt_bias) -> None:
    """The door of Gated DeltaNet's gate: :func:`check_log_decay` with one decay per head."""
    check_log_decay(x, A_log, dt_bias, per_channel=False)


def check_kda_gate(x, A_log, dt_bias, lower_bound=None) -> None:
    """The door of KDA's gates (and K3's bounded one): :func:`check_log_decay`, one per channel."""
    check_log_decay(x, A_log, dt_bias, lower_bound)


def check_linear_state(value, name: str, B: int, H: int, Dk: int, Dv: int):
    """A linear-attention state: ``None`` or a pair ``(S, z)``, ``S (B, H, Dk, Dv)`` and
    ``z (B, H, Dk)``, floating (values are not read). Returns ``(S, z)`` or ``(None, None)``."""
    if value is None:
        return None, None
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(
            f"{name} must be a tuple (S, z) with S of shape (B, H, Dk, Dv) and z of shape "
            f"(B, H, Dk); got {type(value).__name__}"
        )
    S, z = value
    check_state_shape(S, f"{name}[0] (S)", (B, H, Dk, Dv), "(B, H, Dk, Dv)")
    check_state_shape(z, f"{name}[1] (z)", (B, H, Dk), "(B, H, Dk)")
    return S, z


def check_delta_rule_call(q, k, v, beta, g=None, *, initial_state=None) -> None:
    """The door of the token-by-token delta-rule ops: floating tensors whose shapes agree, ``q, k,
    v`` of one dtype. It reads no value, so it never waits on the device."""
    if not all(isinstance(x, torch.Tensor) and x.ndim == 4 for x in (q, v)):
        raise ValueError(f"q and v must be tensors (B, H, T, D), got {_what(q)} and {_what(v)}")
    (B, H, T, Dk), Dv = q.shape, v.shape[-1]
    shapes = {"q": [(B, H, T, Dk)], "k": [(B, H, T, Dk)], "v": [(B, H, T, Dv)], "beta": [(B, H, T)],
              "g": [(B, H, T), (B, H, T, Dk)], "initial_state": [(B, H, Dk, Dv)]}
    given = {"q": q, "k": k, "v": v, "beta": beta, "g": g, "initial_state": initial_state}
    for name, x in given.items():
        if x is None and name in ("g", "initial_state"):
            continue
        if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.shape in shapes[name]):
            want = " or ".join(_fmt(s) for s in shapes[name])
            raise ValueError(f"{name} must be a floating tensor of shape {want}, got {_what(x)}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")


def check_chunkwise_call(q, k, v, beta, g=None, *, initial_state=None, chunk_size=64) -> None:
    """The door of the chunkwise delta-rule ops: :func:`check_delta_rule_call` and a positive
    ``chunk_size``."""
    check_delta_rule_call(q, k, v, beta, g, initial_state=initial_state)
    check_chunk_size(chunk_size)


def check_gated_delta_rule_call(q, k, v, beta, g, *, initial_state=None) -> None:
    """The door of the gated token-by-token ops (:mod:`gpt2k3.ops.gated_delta`):
    :func:`check_delta_rule_call` with the log decay ``g`` required."""
    if g is None:
        raise ValueError("g must be a floating tensor of shape (B, H, T) or (B, H, T, Dk), got None")
    check_delta_rule_call(q, k, v, beta, g, initial_state=initial_state)


def check_gated_chunkwise_call(q, k, v, beta, g, *, initial_state=None, chunk_size=64) -> None:
    """The door of the gated chunkwise op: :func:`check_gated_delta_rule_call` and a positive
    ``chunk_size``."""
    check_gated_delta_rule_call(q, k, v, beta, g, initial_state=initial_state)
    check_chunk_size(chunk_size)


def _what(x) -> str:
    """A value as an error message describes it: a tensor's shape and dtype, else its type."""
    return f"shape {_fmt(x.shape)} {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__


def check_linear_attention_call(q, k, v, *, initial_state=None, chunk_size=1, eps=1e-6,
                                normalize=True) -> None:
    """The door of a linear-attention op (:mod:`gpt2k3.ops.linear`): :func:`check_qkv_shapes`
    with ``q, k, v`` of one dtype, ``eps`` a finite float ``> 0``, ``normalize`` a bool, a
    positive ``chunk_size``, an ``initial_state`` as :func:`check_linear_state`. Reads no value
    (a decode step can afford it) and changes nothing."""
    B, H, _, Dk, Dv = check_qkv_shapes(q, k, v)
    check_same_dtype((q, "q"), (k, "k"), (v, "v"))
    check_positive_float(eps, "eps")
    check_bool(normalize, "normalize")
    check_chunk_size(chunk_size)
    check_linear_state(initial_state, "initial_state", B, H, Dk, Dv)


def check_linear_decode_call(q_t, k_t, v_t, *, initial_state=None, eps=1e-6, normalize=True,
                             inplace=False) -> None:
    """The door of :func:`gpt2k3.ops.linear.decode_step`: :func:`check_linear_attention_call`
    for one token (``T = 1``) and ``inplace`` a bool (the string ``"no"`` would be truthy)."""
    check_linear_attention_call(q_t, k_t, v_t, initial_state=initial_state, eps=eps,
                                normalize=normalize)
    check_bool(inplace, "inplace")
    if q_t.shape[2] != 1:
        raise ValueError(f"q_t, k_t and v_t must hold one token, shape (B, H, 1, D); got "
                         f"T={q_t.shape[2]}")


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
                      ndim: int = 3, shape: str = "(B, T, n_embd)", *,
                      finite: bool = True) -> torch.Tensor:
    """A layer's input: a finite floating tensor of ``ndim`` dimensions whose last is ``width``,
    with at least one sequence, in the layer's parameter ``dtype`` if given (a float64 input to
    a float32 layer is an error that says which dtype to use, not a matmul ``RuntimeError``).
    ``finite=False`` checks shape and dtype only: no value scan, so no host sync (a layer that
    runs inside a decode step)."""
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
    return check_finite(value, name) if finite else value


def check_token_ids(idx, vocab_size: int, name: str = "idx") -> tuple[int, int]:
    """Token ids: an int64/int32 tensor ``(B, T)``, ``B, T >= 1``, ids in ``[0, vocab_size)``;
    returns ``(B, T)``. The range test is a host sync: run it once per call, never per step."""
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 \
            or idx.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name} must be an integer tensor of shape (B, T), got "
                         f"{getattr(idx, 'dtype', type(idx).__name__)} of shape "
                         f"{_fmt(getattr(idx, 'shape', ()))}")
    B, T = idx.shape
    if B == 0 or T == 0:
        raise ValueError(f"{name} must hold at least one sequence of at least one token "
                         f"(B >= 1, T >= 1), got shape {_fmt(idx.shape)}")
    if bool(((idx < 0) | (idx >= vocab_size)).any()):
        raise ValueError(f"{name} must hold token ids in [0, vocab_size={vocab_size}), got "
                         f"values in [{int(idx.min())}, {int(idx.max())}]")
    return B, T


def check_sampling(temperature, top_k, vocab_size: int) -> None:
    """Sampling arguments: ``temperature`` a finite number >= 0 (0: greedy; tiny positive values
    that overflow the logits are refused), ``top_k`` None or an int in ``[1, vocab_size]``."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if 0 < temperature < 1e-30:
        raise ValueError(f"temperature must be 0 (greedy) or at least 1e-30, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                              or not 1 <= top_k <= vocab_size):
        raise ValueError(f"top_k must be None or an int in [1, {vocab_size}], got {top_k!r}")


def check_situ(gate, up, beta, linear_beta) -> tuple[float, float | None]:
    """SiTU's arguments: ``gate`` and ``up`` tensors of one shape, ``beta`` a finite positive
    number, ``linear_beta`` one too or ``None``; returns ``(beta, linear_beta)`` as floats."""
    beta = check_finite_number(beta, "beta", 1)
    if linear_beta is not None:
        linear_beta = check_finite_number(linear_beta, "linear_beta", 1)
    if not isinstance(gate, torch.Tensor) or not isinstance(up, torch.Tensor) \
            or gate.shape != up.shape:
        raise ValueError(f"gate and up must be tensors of one shape, got "
                         f"{_fmt(getattr(gate, 'shape', ()))} and {_fmt(getattr(up, 'shape', ()))}")
    return beta, linear_beta
