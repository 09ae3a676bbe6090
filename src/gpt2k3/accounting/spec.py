"""Architectures as data: :class:`ArchSpec`, :class:`VisionTower` and layer schedules.

An :class:`ArchSpec` describes a decoder-only architecture; the rest of
:mod:`gpt2k3.accounting` counts what it costs without building it.  The schedules of a
KDA / attention hybrid is written here once, :func:`hybrid_layers` ("``ratio`` KDA layers,
then one attention layer", the rule of Kimi Linear and Kimi K3 alike); :func:`hybrid_spec`
applies it to a spec (``ratio=None`` meaning every layer KDA).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from gpt2k3.checks import check_bool, is_int, is_real


__all__ = ["ArchSpec", "VisionTower", "ATTENTION_KINDS", "NORMS", "MLPS", "POSITIONS",
           "hybrid_layers", "hybrid_spec", "full_attention",
           "ratio_label"]

#: Softmax-attention kinds a spec's ``attention`` field may name.
ATTENTION_KINDS = ("mha", "gqa", "mla")
#: Norms, feed-forward kinds and position encodings a spec may name.
NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu", "situ")
POSITIONS = ("learned", "rope", "none")

@dataclass(frozen=True)
class VisionTower:
    """A vision encoder released beside a language model, as data: Kimi K3's MoonViT-V2
    layout (SGLang 0.5.23 ``srt/models/kimi_k3_vl.py``: ``KimiK3VisionTower`` and
    ``KimiK3MultiModalProjector``).

    A patch convolution (``in_channels x patch_size^2 -> n_embd``, no bias), a learned
    ``pos_emb_height x pos_emb_width x n_embd`` position table (the temporal one is a fixed
    sin-cos buffer, not a parameter), ``n_layer`` pre-norm blocks -- two RMSNorm gains, a fused
    ``n_embd -> 3 qkv_dim`` projection, ``qkv_dim -> n_embd``, a two-matrix GELU MLP of width
    ``d_ff``, all bias-free -- a final RMSNorm, and the projector: ``merge_kernel`` patches
    concatenated (width ``m = n_embd * kh * kw``), ``m -> m``, GELU, ``m -> text n_embd``,
    then an RMSNorm of the text width.  Rotary position in the blocks costs no parameters.
    """

    n_layer: int
    n_embd: int
    n_head: int
    qkv_dim: int
    d_ff: int
    patch_size: int
    pos_emb_height: int
    pos_emb_width: int
    merge_kernel: tuple[int, int] = (2, 2)
    in_channels: int = 3
    source: str = field(default="", compare=False)

    def __post_init__(self):
        for name in ("n_layer", "n_embd", "n_head", "qkv_dim", "d_ff", "patch_size",
                     "pos_emb_height", "pos_emb_width", "in_channels"):
            value = getattr(self, name)
            if not is_int(value) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        kernel = tuple(self.merge_kernel) if hasattr(self.merge_kernel, "__iter__") else ()
        if len(kernel) != 2 or any(not is_int(k) or k <= 0 for k in kernel):
            raise ValueError(f"merge_kernel must be two positive ints, got {self.merge_kernel!r}")
        object.__setattr__(self, "merge_kernel", kernel)
        if self.qkv_dim % self.n_head:
            raise ValueError(f"qkv_dim ({self.qkv_dim}) must be divisible by n_head "
                             f"({self.n_head})")

    def params(self, text_n_embd: int) -> dict[str, int]:
        """Parameters by part (``"patch embedding"``, ``"position embedding"``, ``"blocks"``,
        ``"final norm"``, ``"projector"``) for a language model of width ``text_n_embd``."""
        if not is_int(text_n_embd) or text_n_embd <= 0:
            raise ValueError(f"text_n_embd must be a positive int, got {text_n_embd!r}")
        d, q, f = self.n_embd, self.qkv_dim, self.d_ff
        m = d * self.merge_kernel[0] * self.merge_kernel[1]
        block = 2 * d + d * 3 * q + q * d + 2 * d * f
        return {"patch embedding": self.in_channels * self.patch_size ** 2 * d,
                "position embedding": self.pos_emb_height * self.pos_emb_width * d,
                "blocks": self.n_layer * block,
                "final norm": d,
                "projector": m * m + m * text_n_embd + text_n_embd}


@dataclass(frozen=True)
class ArchSpec:
    """A decoder-only transformer as data (see :mod:`gpt2k3.accounting` for what it covers).

    Core sizes: ``vocab_size``, ``n_layer``, ``n_embd``, ``n_head`` (query heads of the attention
    layers).  ``d_ff`` is the dense MLP width (default ``4 * n_embd``, GPT-2's).
    ``max_positions`` is the number of rows of the learned position table when
    ``position == "learned"``; for ``"rope"``/``"none"`` it records the context window and costs
    no parameters.  ``bias`` adds biases to MHA/GQA projections, the dense MLP and LayerNorm;
    MLA, KDA, routers and experts never have biases (as in every published model that uses
    them).  ``norm`` is ``"layernorm"`` or ``"rmsnorm"``; ``mlp`` is ``"gelu"`` or ``"swiglu"``.

    Attention (``attention`` in :data:`ATTENTION_KINDS`): ``n_kv_head`` (GQA; default
    ``n_head``) and ``d_head`` (default ``n_embd // n_head``) for MHA/GQA; for MLA the
    DeepSeek names ``q_lora_rank`` (``None``: a full-rank query projection), ``kv_lora_rank``,
    ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim`` (ignored unless
    ``attention == "mla"``).

    Linear-state layers: ``kda_layers`` (0-based indices; Kimi's ``config.json`` lists them
    1-based), ``kda_n_head``, ``kda_head_dim`` (keys and values, ``Dk = Dv``) and
    ``kda_conv_kernel`` (short causal convolution on q, k, v; 0 for none).

    Mixture of experts: ``n_routed_experts`` (0: every layer dense), ``n_shared_experts``,
    ``top_k`` routed experts per token, ``d_expert`` (an expert's SwiGLU width) and
    ``first_k_dense`` leading dense layers.

    What Kimi K3 adds (every field defaults to "absent", so a spec that does not set them
    counts exactly as before):

    * ``mla_output_gate``: a full-rank sigmoid gate on the MLA output, ``g_proj`` of
      ``n_embd x n_head * v_head_dim`` (``mla_use_output_gate``; MLA only).
    * ``kda_full_rank_gate``: KDA's output gate is one ``n_embd x kda_n_head * kda_head_dim``
      projection (``use_full_rank_gate``) instead of Kimi Linear's low-rank pair
      ``g_a`` (``n_embd x Dk``), ``g_b`` (``Dk x H Dk``).
    * ``kda_gate_lower_bound``: ``None`` for Kimi Linear's unbounded log-decay
      ``-exp(A_log) softplus(x + dt_bias)``; a negative number ``b`` for K3's bounded form
      ``b * sigmoid(exp(A_log) (x + dt_bias))``, in ``(b, 0)`` (``gate_lower_bound``).  Both
      forms have the same parameters (``A_log`` per head, ``dt_bias`` per channel; whether
      K3's checkpoint means its ``A_log`` per head is open: :func:`a_log_readings`).
    * ``moe_latent_dim``: latent MoE (``routed_expert_hidden_size``; 0: none).  The routed
      experts work at this width: a token is projected ``n_embd -> moe_latent_dim`` before
      them and back after, with an RMSNorm on the latent if ``moe_latent_norm``
      (``latent_moe_use_norm``).  The router and the shared experts stay at ``n_embd``.
    * ``attn_res_block_size``: Attention Residuals (0: the plain residual stream).  Each
      sub-layer (attention, feed-forward) reads a softmax mixture over depth instead of the
      running sum and owns one RMSNorm and one learned query vector (``n_embd`` each); the
      final read before the last norm owns another pair.
    * ``mlp="situ"``: SiTU-GLU (``beta tanh(g/beta) sigmoid(g) * lb tanh(u/lb)``), the
      same three matrices as SwiGLU.
    * ``vision``: a :class:`VisionTower` released with the model, counted on its own line
      (:attr:`ParamCount.vision`), outside ``total`` and ``active``.

    Impossible specs raise ``ValueError`` naming the offending field.
    """

    name: str
    vocab_size: int
    n_layer: int
    n_embd: int
    n_head: int
    d_ff: int | None = None
    max_positions: int = 0
    bias: bool = True
    norm: str = "layernorm"
    tied_embeddings: bool = True
    mlp: str = "gelu"
    position: str = "learned"
    attention: str = "mha"
    n_kv_head: int | None = None
    d_head: int | None = None
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    kda_layers: tuple[int, ...] = ()
    kda_n_head: int = 0
    kda_head_dim: int = 0
    kda_conv_kernel: int = 0
    n_routed_experts: int = 0
    n_shared_experts: int = 0
    top_k: int = 0
    d_expert: int = 0
    first_k_dense: int = 0
    mla_output_gate: bool = False
    kda_full_rank_gate: bool = False
    kda_gate_lower_bound: float | None = None
    moe_latent_dim: int = 0
    moe_latent_norm: bool = False
    attn_res_block_size: int = 0
    vision: VisionTower | None = None
    source: str = field(default="", compare=False)

    def __post_init__(self):
        for name in ("name", "source"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a str, got {getattr(self, name)!r}")
        for name in ("vocab_size", "n_layer", "n_embd", "n_head"):
            value = getattr(self, name)
            if not is_int(value) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name in ("d_ff", "n_kv_head", "d_head", "q_lora_rank"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value <= 0):
                raise ValueError(f"{name} must be None or a positive int, got {value!r}")
        for name in ("max_positions", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                     "v_head_dim", "kda_n_head", "kda_head_dim", "kda_conv_kernel",
                     "n_routed_experts", "n_shared_experts", "top_k", "d_expert", "first_k_dense"):
            value = getattr(self, name)
            if not is_int(value) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        for name, value, allowed in (("norm", self.norm, NORMS), ("mlp", self.mlp, MLPS),
                                     ("position", self.position, POSITIONS),
                                     ("attention", self.attention, ATTENTION_KINDS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        for name in ("bias", "tied_embeddings", "mla_output_gate", "kda_full_rank_gate",
                     "moe_latent_norm"):
            check_bool(getattr(self, name), name)
        for name in ("moe_latent_dim", "attn_res_block_size"):
            value = getattr(self, name)
            if not is_int(value) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        if self.vision is not None and not isinstance(self.vision, VisionTower):
            raise ValueError(f"vision must be None or a VisionTower, got {self.vision!r}")
        self._check_attention()
        self._check_kda()
        self._check_moe()

    def _check_attention(self) -> None:
        if self.attention in ("mha", "gqa"):
            if self.d_head is None and self.n_embd % self.n_head:
                raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head "
                                 f"({self.n_head}), or d_head must be given")
            kv = self.kv_heads
            if self.n_head % kv:
                raise ValueError(f"n_kv_head ({kv}) must divide n_head ({self.n_head}): each K/V "
                                 "head serves a whole group of query heads")
            if self.attention == "mha" and kv != self.n_head:
                raise ValueError(f"n_kv_head ({kv}) must equal n_head ({self.n_head}) for "
                                 "attention='mha'; use attention='gqa' to share K/V heads")
            if self.mla_output_gate:
                raise ValueError(f"mla_output_gate needs attention='mla', got "
                                 f"attention={self.attention!r}")
        else:  # mla
            if self.kv_lora_rank <= 0:
                raise ValueError(f"kv_lora_rank must be positive for attention='mla', "
                                 f"got {self.kv_lora_rank}")
            if self.v_head_dim <= 0:
                raise ValueError(f"v_head_dim must be positive for attention='mla', "
                                 f"got {self.v_head_dim}")
            if self.qk_nope_head_dim + self.qk_rope_head_dim <= 0:
                raise ValueError("qk_nope_head_dim + qk_rope_head_dim must be positive for "
                                 "attention='mla' (the query/key head width)")
            if self.qk_rope_head_dim % 2:
                raise ValueError(f"qk_rope_head_dim must be even (RoPE rotates pairs), "
                                 f"got {self.qk_rope_head_dim}")

    def _check_kda(self) -> None:
        layers = self.kda_layers
        if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
            raise ValueError(f"kda_layers must be a sequence of layer indices, got {layers!r}")
        layers = tuple(layers)
        if any(not is_int(i) or not 0 <= i < self.n_layer for i in layers):
            raise ValueError(f"kda_layers must hold 0-based layer indices in [0, n_layer="
                             f"{self.n_layer}), got {layers!r}")
        if len(set(layers)) != len(layers):
            raise ValueError(f"kda_layers must not repeat a layer, got {layers!r}")
        object.__setattr__(self, "kda_layers", tuple(sorted(layers)))
        if layers and (self.kda_n_head <= 0 or self.kda_head_dim <= 0):
            raise ValueError("kda_n_head and kda_head_dim must be positive when kda_layers is "
                             f"not empty, got {self.kda_n_head} and {self.kda_head_dim}")
        bound = self.kda_gate_lower_bound
        if bound is not None and not (is_real(bound) and math.isfinite(bound) and bound < 0):
            raise ValueError("kda_gate_lower_bound must be None (unbounded decay) or a finite "
                             f"negative number (the log-decay lies in (bound, 0)), got {bound!r}")

    def _check_moe(self) -> None:
        e, k = self.n_routed_experts, self.top_k
        if self.first_k_dense > self.n_layer:
            raise ValueError(f"first_k_dense ({self.first_k_dense}) must be <= n_layer "
                             f"({self.n_layer})")
        if e == 0:
            if k or self.n_shared_experts or self.moe_latent_dim or self.moe_latent_norm:
                raise ValueError(f"top_k ({k}), n_shared_experts ({self.n_shared_experts}), "
                                 f"moe_latent_dim ({self.moe_latent_dim}) and moe_latent_norm "
                                 f"({self.moe_latent_norm}) must be 0/False when "
                                 "n_routed_experts is 0 (a dense model)")
            return
        if self.moe_latent_dim > self.n_embd:
            raise ValueError(f"moe_latent_dim ({self.moe_latent_dim}) must be <= n_embd "
                             f"({self.n_embd}): the latent MoE projects tokens down, not up")
        if self.moe_latent_norm and not self.moe_latent_dim:
            raise ValueError("moe_latent_norm needs a latent MoE (moe_latent_dim > 0)")
        if not 1 <= k <= e:
            raise ValueError(f"top_k ({k}) must be between 1 and n_routed_experts ({e}): a "
                             "token cannot use more experts than exist")
        if self.d_expert <= 0:
            raise ValueError(f"d_expert must be positive when n_routed_experts > 0, "
                             f"got {self.d_expert}")

    # ------------------------------------------------------------------ derived sizes
    @property
    def ffn_dim(self) -> int:
        """Width of the dense MLP."""
        return self.d_ff if self.d_ff is not None else 4 * self.n_embd

    @property
    def head_dim(self) -> int:
        """Head width of MHA/GQA layers."""
        return self.d_head if self.d_head is not None else self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        """K/V heads of MHA/GQA layers (``n_kv_head``, default ``n_head``)."""
        return self.n_kv_head if self.n_kv_head is not None else self.n_head

    @property
    def qk_head_dim(self) -> int:
        """MLA query/key head width: ``qk_nope_head_dim + qk_rope_head_dim``."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def layer_mixers(self) -> tuple[str, ...]:
        """The token mixer of every layer: ``"kda"`` or the ``attention`` kind."""
        kda = set(self.kda_layers)
        return tuple("kda" if i in kda else self.attention for i in range(self.n_layer))

    @property
    def n_kda_layers(self) -> int:
        return len(self.kda_layers)

    @property
    def n_attention_layers(self) -> int:
        """Layers with softmax attention (the ones whose cache grows with context)."""
        return self.n_layer - self.n_kda_layers

    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0

    @property
    def n_moe_layers(self) -> int:
        return self.n_layer - self.first_k_dense if self.is_moe else 0

    @property
    def n_dense_layers(self) -> int:
        return self.n_layer - self.n_moe_layers

    @property
    def expert_width(self) -> int:
        """Width the routed experts read and write: ``moe_latent_dim`` for a latent MoE,
        else ``n_embd``."""
        return self.moe_latent_dim or self.n_embd

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert: a bias-free GLU, ``3 * expert_width * d_expert``."""
        return 3 * self.expert_width * self.d_expert

    @property
    def k3_features(self) -> tuple[str, ...]:
        """The Kimi-K3 pieces this spec uses (names of the fields set away from their
        "absent" default, ``mlp="situ"`` included); ``()`` for every earlier architecture.
        A builder that cannot express them must refuse the spec."""
        names = [n for n in ("mla_output_gate", "kda_full_rank_gate", "kda_gate_lower_bound",
                             "moe_latent_dim", "moe_latent_norm", "attn_res_block_size",
                             "vision") if getattr(self, n) not in (None, False, 0)]
        return tuple(names + (["mlp"] if self.mlp == "situ" else []))

    def with_(self, **changes) -> "ArchSpec":
        """A copy with some fields changed (validated like a new spec)."""
        return replace(self, **changes)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


def hybrid_layers(n_layer: int, ratio: int) -> tuple[int, ...]:
    """0-based indices of the linear-state layers of a ``ratio``:1 hybrid: the book's one
    layer schedule (:func:`gpt2k3.models.hybrid.hybrid_schedule`, :func:`gpt2k3.models.k3.tiny_k3`
    and :data:`gpt2k3.archs.KIMI_K3` all call it).

    Layers come in groups of ``ratio + 1``: ``ratio`` KDA layers, then one attention layer; the
    last layer is always attention.  ``ratio=0`` gives ``()`` (all attention).  With
    ``n_layer=27, ratio=3`` the attention layers are 4, 8, ..., 24 and 27 (1-based), Kimi
    Linear 48B's published schedule; with ``n_layer=93`` they are 4, 8, ..., 92 and 93, Kimi
    K3's ``full_attn_layers``.
    """
    if not is_int(n_layer) or n_layer <= 0:
        raise ValueError(f"n_layer must be a positive int, got {n_layer!r}")
    if not is_int(ratio) or ratio < 0:
        raise ValueError(f"ratio must be a non-negative int, got {ratio!r}")
    return tuple(i for i in range(n_layer - 1) if (i + 1) % (ratio + 1))


def ratio_label(ratio: int | None) -> str:
    """``0 -> 'all attention'``, ``3 -> '3:1'``, ``None -> 'all KDA'`` (see :func:`hybrid_spec`)."""
    if ratio is None:
        return "all KDA"
    if not is_int(ratio) or ratio < 0:
        raise ValueError(f"ratio must be None (all KDA) or a non-negative int, got {ratio!r}")
    return "all attention" if ratio == 0 else f"{ratio}:1"


def hybrid_spec(spec: ArchSpec, ratio: int | None) -> ArchSpec:
    """``spec`` with the layer schedule of a ``ratio``:1 KDA / attention hybrid.

    ``ratio=0`` is attention in every layer, ``ratio=None`` KDA in every layer; otherwise
    :func:`hybrid_layers` (the last layer is attention).  The name gets the schedule in
    brackets (:func:`ratio_label`).  ``spec`` must give the KDA sizes (``kda_n_head``,
    ``kda_head_dim``) unless ``ratio == 0``.  The one place in the book where ``None`` is
    read as "all KDA".
    """
    if not isinstance(spec, ArchSpec):
        raise ValueError(f"spec must be an ArchSpec, got {type(spec).__name__}")
    label = ratio_label(ratio)
    layers = tuple(range(spec.n_layer)) if ratio is None else hybrid_layers(spec.n_layer, ratio)
    return spec.with_(name=f"{spec.name} ({label})", kda_layers=layers)


def full_attention(spec: ArchSpec) -> ArchSpec:
    """``spec`` with softmax attention in every layer: the "full MLA" baseline of a hybrid
    (named ``"<name>, attention in every layer"``)."""
    return hybrid_spec(spec, 0).with_(name=f"{spec.name}, attention in every layer")


def check_spec(value, name: str = "spec") -> None:
    """An :class:`ArchSpec` (not ``None``, a name or a dict): ``ValueError`` naming ``name``."""
    if not isinstance(value, ArchSpec):
        raise ValueError(f"{name} must be an ArchSpec (e.g. gpt2k3.archs.GPT2_SMALL), "
                         f"got {type(value).__name__}")
