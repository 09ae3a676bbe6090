"""Analytic accounting: parameters (and, later, bytes and FLOPs) of an architecture.

An :class:`ArchSpec` describes an architecture as data; :func:`count_params`
counts its parameters component by component without building the model, so the
same code can count GPT-2 small and models far too large to instantiate.  The
counts are checked against real modules in the tests (our :class:`gpt2k3.gpt2.GPT`
and Hugging Face's ``GPT2LMHeadModel``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

__all__ = ["ArchSpec", "ParamCount", "count_params", "kv_cache_bytes", "COMPONENTS"]

#: Names of the breakdown entries, in reading order (input to output).
COMPONENTS = ("token embeddings", "position embeddings", "attention", "MLP", "norms", "head")

_NORMS = ("layernorm", "rmsnorm")


@dataclass(frozen=True)
class ArchSpec:
    """A decoder-only transformer as data.

    ``d_ff`` defaults to ``4 * d_model`` (GPT-2's MLP width).  ``max_positions`` is
    the number of rows of a learned position-embedding table (0 for none).
    ``norm`` is ``"layernorm"`` (weight and bias) or ``"rmsnorm"`` (weight only).
    """

    name: str
    vocab_size: int
    n_layer: int
    d_model: int
    n_head: int
    d_ff: int | None = None
    max_positions: int = 0
    bias: bool = True
    norm: str = "layernorm"
    tied_embeddings: bool = True
    source: str = field(default="", compare=False)

    def __post_init__(self):
        for name in ("vocab_size", "n_layer", "d_model", "n_head"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.d_ff is not None and (not isinstance(self.d_ff, int) or self.d_ff <= 0):
            raise ValueError(f"d_ff must be None or a positive int, got {self.d_ff!r}")
        if not isinstance(self.max_positions, int) or self.max_positions < 0:
            raise ValueError(f"max_positions must be a non-negative int, got {self.max_positions!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        if self.norm not in _NORMS:
            raise ValueError(f"norm must be one of {_NORMS}, got {self.norm!r}")

    @property
    def ffn_dim(self) -> int:
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def with_(self, **changes) -> "ArchSpec":
        """A copy with some fields changed (validated like a new spec)."""
        return replace(self, **changes)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


@dataclass(frozen=True)
class ParamCount:
    """``total`` parameters, ``active`` per token (equal for dense models) and a
    per-component ``breakdown`` whose values sum to ``total``."""

    total: int
    active: int
    breakdown: dict[str, int]

    def fraction(self, component: str) -> float:
        return self.breakdown[component] / self.total


def count_params(spec: ArchSpec) -> ParamCount:
    """Count the parameters of ``spec``, component by component.

    Per layer: attention holds a fused QKV projection ``d x 3d`` and an output
    projection ``d x d`` (plus biases); the MLP ``d x d_ff`` and ``d_ff x d`` (plus
    biases); two norms.  One final norm; the head is free when tied to the token
    embedding.
    """
    if not isinstance(spec, ArchSpec):
        raise ValueError(f"spec must be an ArchSpec, got {type(spec).__name__}")
    d, L, f = spec.d_model, spec.n_layer, spec.ffn_dim
    b = 1 if spec.bias else 0
    norm = d * (2 if spec.norm == "layernorm" and spec.bias else 1)
    breakdown = {
        "token embeddings": spec.vocab_size * d,
        "position embeddings": spec.max_positions * d,
        "attention": L * (d * 3 * d + b * 3 * d + d * d + b * d),
        "MLP": L * (d * f + b * f + f * d + b * d),
        "norms": (2 * L + 1) * norm,
        "head": 0 if spec.tied_embeddings else spec.vocab_size * d,
    }
    total = sum(breakdown.values())
    return ParamCount(total=total, active=total, breakdown=breakdown)


def kv_cache_bytes(spec: ArchSpec, context_len: int, batch: int = 1, dtype_bytes: int = 2) -> int:
    """Bytes of a multi-head-attention KV cache: K and V, every layer, every head."""
    for name, value in (("context_len", context_len), ("batch", batch), ("dtype_bytes", dtype_bytes)):
        if not isinstance(value, int) or value < 0 or (name == "dtype_bytes" and value == 0):
            raise ValueError(f"{name} must be a {'positive' if name == 'dtype_bytes' else 'non-negative'} "
                             f"int, got {value!r}")
    return 2 * spec.n_layer * spec.d_model * context_len * batch * dtype_bytes
