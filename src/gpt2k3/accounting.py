"""Analytic accounting: parameters, cache and state bytes, bytes moved and FLOPs per token.

An :class:`ArchSpec` describes a decoder-only architecture as data; the functions here count
what it costs without building it, so the same code counts GPT-2 small and models far too large
to instantiate.  Every count is checked against real modules in the tests: our
:class:`gpt2k3.gpt2.GPT` and Hugging Face's ``GPT2LMHeadModel`` for the GPT-2 family, and
``DeepseekV3ForCausalLM`` / ``KimiLinearForCausalLM`` built on PyTorch's ``meta`` device (no
memory) for DeepSeek-V3, Kimi K2 and Kimi Linear.

What a spec can describe
------------------------
* **Token mixers, per layer.**  Every layer is either a softmax-attention layer of the kind
  ``attention`` -- ``"mha"`` (one K/V head per query head), ``"gqa"`` (``n_kv_head`` shared K/V
  heads) or ``"mla"`` (multi-head latent attention: the cache holds one latent per token) -- or,
  if its 0-based index is in ``kda_layers``, a Kimi Delta Attention layer, whose memory of the
  past is a fixed-size state instead of a growing cache.  :func:`hybrid_layers` writes the
  Kimi-Linear-style schedule "``ratio`` KDA layers, then one attention layer".
* **Feed-forward blocks, per layer.**  A dense MLP (``"gelu"``: two matrices, GPT-2;
  ``"swiglu"``: three, everything after) of width ``d_ff``, or -- from layer ``first_k_dense``
  on, when ``n_routed_experts > 0`` -- a mixture of experts: a router, ``n_shared_experts``
  always-on SwiGLU experts and ``n_routed_experts`` routed SwiGLU experts of width ``d_expert``,
  of which each token uses ``top_k``.
* LayerNorm (weight and bias) or RMSNorm (weight only); learned, rotary or no positions;
  a head tied to the token embedding or not.
* **What Kimi K3 adds** (see :class:`ArchSpec`): output gates on MLA and full-rank output
  gates on KDA, KDA's bounded decay, latent experts (routed experts working at a narrower
  width behind a down/up projection and an RMSNorm), SiTU-GLU, Attention Residuals (a learned
  softmax over depth instead of the running residual sum), and a vision tower counted on a
  line of its own.  :data:`PART_COMPONENTS` gives each new piece its own line.

Active parameters
-----------------
``count_params(spec).active`` is the number of parameters that take part in processing one
token: **every parameter except the routed experts the router did not pick**.  Concretely:
token embeddings (the whole table counts, although a token reads one row of it), position
embeddings, attention and linear-attention layers, dense MLPs, the router, the shared experts,
``top_k`` routed experts per MoE layer, the norms and the head.  For a dense model it equals the
total.  The tests check it against the modules of the meta-device models.  The published
"activated" headlines (DeepSeek-V3 37B, Kimi K2 32B, Kimi Linear 3B) match this count *minus*
the token-embedding table (36.6B, 31.7B, 3.1B), although DeepSeek's weight documentation says
its 36.7B includes the embedding; the book keeps the table in and says so
(:attr:`ParamCount.active_without_embedding` is the published convention).  Kimi K3 follows
the same rule: its technical report's 104.2B activated (Table 1) is this count minus the
token-embedding table, 104,189,530,208, with the untied head, the norms, the Attention-Residual
vectors, the output gates, the latent projections and the two shared experts all in; its
2.78T total is the language model's 2,779,484,393,568, and stays 2.78T with the vision tower
(0.45B), which is never active for a text token and is counted apart
(:attr:`ParamCount.vision`).  What a token
*reads* and *multiplies* is narrower -- one embedding row, no norm arithmetic to speak of -- and
is what :func:`decode_bytes_per_token` and :func:`flops_per_token` use
(``ParamCount.matmul_active``).

DeepSeek-V3's router also carries a per-expert bias (``e_score_correction_bias``, auxiliary-loss-
free balancing).  It is updated by a rule, not by gradients, and Hugging Face stores it as a
buffer, not a parameter; it is not counted here (256 numbers per MoE layer; Kimi K3: 896 per
MoE layer, 82,432 in all -- too few to move either published figure).  A checkpoint does
store it: :func:`stored_elements` counts what a released checkpoint holds, packed experts,
scales and such buffers included.

Hardware, memory and time (chapter 8)
-------------------------------------
:class:`Hardware` describes an accelerator (:data:`H200` holds the book's reference figures).
:func:`serving_memory`, :func:`devices_needed` and :func:`max_batch` say what fits;
:func:`roofline` turns bytes and FLOPs into a lower bound on the time of a decode step;
:func:`serving_plan` lays a model out over devices by tensor and expert parallelism, and
:func:`plan_roofline` times a step by the plan's busiest device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

__all__ = [
    "ArchSpec", "ParamCount", "count_params", "kv_cache_bytes", "kv_numbers_per_layer",
    "kv_numbers_per_token", "state_bytes", "state_numbers_per_layer", "decode_bytes_per_token",
    "flops_per_token", "mla_decode_costs", "hybrid_layers", "COMPONENTS", "DETAIL_COMPONENTS",
    "ATTENTION_KINDS",
    # Kimi K3's pieces
    "VisionTower", "PART_COMPONENTS", "PART_OF_DETAIL", "kda_layers_from_full_attn",
    "stored_elements", "kda_log_decay", "kda_log_decay_range",
    # chapter 8: hardware, memory, the roofline and serving plans
    "weights_read_per_step", "Hardware", "H200", "memory_per_sequence", "serving_memory",
    "devices_needed", "max_batch", "Roofline", "roofline", "ServingPlan", "serving_plan",
    "plan_roofline",
]

#: Names of the breakdown entries, in reading order (input to output).  ``"attention"`` holds
#: every token mixer (softmax attention and linear attention), ``"MLP"`` every feed-forward
#: block (dense MLPs, routers, shared and routed experts).
COMPONENTS = ("token embeddings", "position embeddings", "attention", "MLP", "norms", "head")

#: The finer breakdown of :attr:`ParamCount.detail`; each entry belongs to one of
#: :data:`COMPONENTS` (see :data:`_COARSE`).
DETAIL_COMPONENTS = ("token embeddings", "position embeddings", "softmax attention",
                     "linear attention", "dense MLP", "router", "shared experts", "routed experts",
                     "norms", "head")

_COARSE = {"token embeddings": "token embeddings", "position embeddings": "position embeddings",
           "softmax attention": "attention", "linear attention": "attention", "dense MLP": "MLP",
           "router": "MLP", "shared experts": "MLP", "routed experts": "MLP", "norms": "norms",
           "head": "head"}

#: The finest breakdown, :attr:`ParamCount.parts`: :data:`DETAIL_COMPONENTS` with Kimi K3's
#: new pieces on lines of their own.  Each entry folds into one entry of
#: :data:`DETAIL_COMPONENTS` (see :data:`PART_OF_DETAIL`): the output gates into their
#: attention layers, the latent-MoE projections and their norm into ``"router"`` (the
#: always-active front of the MoE block, beside the router; they are not routed, so
#: ``"routed experts"`` stays exactly the experts a token may skip), the Attention-Residual
#: query vectors and norms into ``"norms"`` (per-layer vectors of ``d_model`` numbers, used
#: elementwise).  For a spec without K3's pieces the new lines are 0.
PART_COMPONENTS = ("token embeddings", "position embeddings", "softmax attention",
                   "softmax-attention output gates", "linear attention",
                   "linear-attention output gates", "dense MLP", "router", "latent projections",
                   "shared experts", "routed experts", "attention residuals", "norms", "head")

#: The :data:`DETAIL_COMPONENTS` entry each of :data:`PART_COMPONENTS` belongs to.
PART_OF_DETAIL = {**{name: name for name in DETAIL_COMPONENTS},
                  "softmax-attention output gates": "softmax attention",
                  "linear-attention output gates": "linear attention",
                  "latent projections": "router", "attention residuals": "norms"}

#: Softmax-attention kinds a spec's ``attention`` field may name.
ATTENTION_KINDS = ("mha", "gqa", "mla")
_NORMS = ("layernorm", "rmsnorm")
_MLPS = ("gelu", "swiglu", "situ")
_POSITIONS = ("learned", "rope", "none")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class VisionTower:
    """A vision encoder released beside a language model, as data: Kimi K3's MoonViT-V2
    layout (SGLang 0.5.23 ``srt/models/kimi_k3_vl.py``: ``KimiK3VisionTower`` and
    ``KimiK3MultiModalProjector``).

    A patch convolution (``in_channels x patch_size^2 -> d_model``, no bias), a learned
    ``pos_emb_height x pos_emb_width x d_model`` position table (the temporal one is a fixed
    sin-cos buffer, not a parameter), ``n_layer`` pre-norm blocks -- two RMSNorm gains, a fused
    ``d_model -> 3 qkv_dim`` projection, ``qkv_dim -> d_model``, a two-matrix GELU MLP of width
    ``d_ff``, all bias-free -- a final RMSNorm, and the projector: ``merge_kernel`` patches
    concatenated (width ``m = d_model * kh * kw``), ``m -> m``, GELU, ``m -> text d_model``,
    then an RMSNorm of the text width.  Rotary position in the blocks costs no parameters.
    """

    n_layer: int
    d_model: int
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
        for name in ("n_layer", "d_model", "n_head", "qkv_dim", "d_ff", "patch_size",
                     "pos_emb_height", "pos_emb_width", "in_channels"):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        kernel = tuple(self.merge_kernel) if hasattr(self.merge_kernel, "__iter__") else ()
        if len(kernel) != 2 or any(not _is_int(k) or k <= 0 for k in kernel):
            raise ValueError(f"merge_kernel must be two positive ints, got {self.merge_kernel!r}")
        object.__setattr__(self, "merge_kernel", kernel)
        if self.qkv_dim % self.n_head:
            raise ValueError(f"qkv_dim ({self.qkv_dim}) must be divisible by n_head "
                             f"({self.n_head})")

    def params(self, text_d_model: int) -> dict[str, int]:
        """Parameters by part (``"patch embedding"``, ``"position embedding"``, ``"blocks"``,
        ``"final norm"``, ``"projector"``) for a language model of width ``text_d_model``."""
        if not _is_int(text_d_model) or text_d_model <= 0:
            raise ValueError(f"text_d_model must be a positive int, got {text_d_model!r}")
        d, q, f = self.d_model, self.qkv_dim, self.d_ff
        m = d * self.merge_kernel[0] * self.merge_kernel[1]
        block = 2 * d + d * 3 * q + q * d + 2 * d * f
        return {"patch embedding": self.in_channels * self.patch_size ** 2 * d,
                "position embedding": self.pos_emb_height * self.pos_emb_width * d,
                "blocks": self.n_layer * block,
                "final norm": d,
                "projector": m * m + m * text_d_model + text_d_model}


@dataclass(frozen=True)
class ArchSpec:
    """A decoder-only transformer as data (see the module docstring for what it covers).

    Core sizes: ``vocab_size``, ``n_layer``, ``d_model``, ``n_head`` (query heads of the attention
    layers).  ``d_ff`` is the dense MLP width (default ``4 * d_model``, GPT-2's).
    ``max_positions`` is the number of rows of the learned position table when
    ``position == "learned"``; for ``"rope"``/``"none"`` it records the context window and costs
    no parameters.  ``bias`` adds biases to MHA/GQA projections, the dense MLP and LayerNorm;
    MLA, KDA, routers and experts never have biases (as in every published model that uses
    them).  ``norm`` is ``"layernorm"`` or ``"rmsnorm"``; ``mlp`` is ``"gelu"`` or ``"swiglu"``.

    Attention (``attention`` in :data:`ATTENTION_KINDS`): ``n_kv_head`` (GQA; default
    ``n_head``) and ``d_head`` (default ``d_model // n_head``) for MHA/GQA; for MLA the
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
      ``d_model x n_head * v_head_dim`` (``mla_use_output_gate``; MLA only).
    * ``kda_full_rank_gate``: KDA's output gate is one ``d_model x kda_n_head * kda_head_dim``
      projection (``use_full_rank_gate``) instead of Kimi Linear's low-rank pair
      ``g_a`` (``d_model x Dk``), ``g_b`` (``Dk x H Dk``).
    * ``kda_gate_lower_bound``: ``None`` for Kimi Linear's unbounded log-decay
      ``-exp(A_log) softplus(x + dt_bias)``; a negative number ``b`` for K3's bounded form
      ``b * sigmoid(exp(A_log) (x + dt_bias))``, in ``(b, 0)`` (``gate_lower_bound``).  Both
      forms have the same parameters (``A_log`` per head, ``dt_bias`` per channel).
    * ``moe_latent_dim``: latent MoE (``routed_expert_hidden_size``; 0: none).  The routed
      experts work at this width: a token is projected ``d_model -> moe_latent_dim`` before
      them and back after, with an RMSNorm on the latent if ``moe_latent_norm``
      (``latent_moe_use_norm``).  The router and the shared experts stay at ``d_model``.
    * ``attn_res_block_size``: Attention Residuals (0: the plain residual stream).  Each
      sub-layer (attention, feed-forward) reads a softmax mixture over depth instead of the
      running sum and owns one RMSNorm and one learned query vector (``d_model`` each); the
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
    d_model: int
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
        for name in ("vocab_size", "n_layer", "d_model", "n_head"):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name in ("d_ff", "n_kv_head", "d_head", "q_lora_rank"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value <= 0):
                raise ValueError(f"{name} must be None or a positive int, got {value!r}")
        for name in ("max_positions", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                     "v_head_dim", "kda_n_head", "kda_head_dim", "kda_conv_kernel",
                     "n_routed_experts", "n_shared_experts", "top_k", "d_expert", "first_k_dense"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        for name, value, allowed in (("norm", self.norm, _NORMS), ("mlp", self.mlp, _MLPS),
                                     ("position", self.position, _POSITIONS),
                                     ("attention", self.attention, ATTENTION_KINDS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        for name in ("bias", "tied_embeddings", "mla_output_gate", "kda_full_rank_gate",
                     "moe_latent_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("moe_latent_dim", "attn_res_block_size"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        if self.vision is not None and not isinstance(self.vision, VisionTower):
            raise ValueError(f"vision must be None or a VisionTower, got {self.vision!r}")
        self._check_attention()
        self._check_kda()
        self._check_moe()

    def _check_attention(self) -> None:
        if self.attention in ("mha", "gqa"):
            if self.d_head is None and self.d_model % self.n_head:
                raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head "
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
        if any(not _is_int(i) or not 0 <= i < self.n_layer for i in layers):
            raise ValueError(f"kda_layers must hold 0-based layer indices in [0, n_layer="
                             f"{self.n_layer}), got {layers!r}")
        if len(set(layers)) != len(layers):
            raise ValueError(f"kda_layers must not repeat a layer, got {layers!r}")
        object.__setattr__(self, "kda_layers", tuple(sorted(layers)))
        if layers and (self.kda_n_head <= 0 or self.kda_head_dim <= 0):
            raise ValueError("kda_n_head and kda_head_dim must be positive when kda_layers is "
                             f"not empty, got {self.kda_n_head} and {self.kda_head_dim}")
        bound = self.kda_gate_lower_bound
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float))
                                  or not math.isfinite(bound) or bound >= 0):
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
        if self.moe_latent_dim > self.d_model:
            raise ValueError(f"moe_latent_dim ({self.moe_latent_dim}) must be <= d_model "
                             f"({self.d_model}): the latent MoE projects tokens down, not up")
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
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def head_dim(self) -> int:
        """Head width of MHA/GQA layers."""
        return self.d_head if self.d_head is not None else self.d_model // self.n_head

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
        else ``d_model``."""
        return self.moe_latent_dim or self.d_model

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
    """0-based indices of the linear-state layers of a ``ratio``:1 hybrid, Kimi Linear style.

    Layers come in groups of ``ratio + 1``: ``ratio`` KDA layers, then one attention layer; the
    last layer is always attention.  ``ratio=0`` gives ``()`` (all attention).  With
    ``n_layer=27, ratio=3`` the attention layers are 4, 8, ..., 24 and 27 (1-based), Kimi
    Linear 48B's published schedule.
    """
    if not _is_int(n_layer) or n_layer <= 0:
        raise ValueError(f"n_layer must be a positive int, got {n_layer!r}")
    if not _is_int(ratio) or ratio < 0:
        raise ValueError(f"ratio must be a non-negative int, got {ratio!r}")
    return tuple(i for i in range(n_layer - 1) if (i + 1) % (ratio + 1))


def kda_layers_from_full_attn(n_layer: int, full_attn_layers) -> tuple[int, ...]:
    """0-based KDA layer indices from a Kimi ``config.json``'s 1-based ``full_attn_layers``.

    Every layer not listed is a KDA layer.  An index outside ``[1, n_layer]``, a repeat or a
    non-integer raises ``ValueError`` (a schedule that names a layer the model does not have).
    """
    if not _is_int(n_layer) or n_layer <= 0:
        raise ValueError(f"n_layer must be a positive int, got {n_layer!r}")
    if isinstance(full_attn_layers, (str, bytes)) or not hasattr(full_attn_layers, "__iter__"):
        raise ValueError(f"full_attn_layers must be a sequence of 1-based layer indices, got "
                         f"{full_attn_layers!r}")
    full = tuple(full_attn_layers)
    if any(not _is_int(i) or not 1 <= i <= n_layer for i in full):
        raise ValueError(f"full_attn_layers must hold 1-based layer indices in [1, n_layer="
                         f"{n_layer}], got {full!r}")
    if len(set(full)) != len(full):
        raise ValueError(f"full_attn_layers must not repeat a layer, got {full!r}")
    return tuple(i for i in range(n_layer) if i + 1 not in set(full))


# ---------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class ParamCount:
    """Parameter counts of one spec.

    ``total``; ``active`` per token (see the module docstring; equal to ``total`` for dense
    models); ``breakdown`` over :data:`COMPONENTS` and ``detail`` over
    :data:`DETAIL_COMPONENTS`, both summing to ``total``; ``active_detail`` summing to
    ``active``; ``matmul_active``: the parameters a token is multiplied through (the active
    ones minus embedding lookups, norm gains and other elementwise vectors; a tied head counts
    here, because the head's matmul reads the whole table).  ``parts`` and ``active_parts``:
    the finest breakdown, over :data:`PART_COMPONENTS` (summing to ``total`` and ``active``).
    ``vision``: the parameters of the spec's :class:`VisionTower` (0 without one), by part in
    ``vision_detail``; they are in neither ``total`` nor ``active``.
    """

    total: int
    active: int
    breakdown: dict[str, int]
    detail: dict[str, int] = field(default_factory=dict)
    active_detail: dict[str, int] = field(default_factory=dict)
    matmul_active: int = 0
    parts: dict[str, int] = field(default_factory=dict)
    active_parts: dict[str, int] = field(default_factory=dict)
    vision: int = 0
    vision_detail: dict[str, int] = field(default_factory=dict)

    def fraction(self, component: str) -> float:
        return self.breakdown[component] / self.total

    @property
    def active_fraction(self) -> float:
        return self.active / self.total

    @property
    def active_without_embedding(self) -> int:
        """``active`` minus the token-embedding table: the convention of the published
        "activated" headlines (DeepSeek-V3 36.6B -> "37B", Kimi K2 31.7B -> "32B", Kimi Linear
        3.1B -> "3B", Kimi K3 104.19B -> "104.2B"); the untied head still counts."""
        return self.active - self.detail["token embeddings"]

    @property
    def total_with_vision(self) -> int:
        """``total`` plus the vision tower: every parameter of the released model."""
        return self.total + self.vision


def _mha_layer(s: ArchSpec) -> tuple[int, int]:
    """(parameters, matmul parameters) of one MHA/GQA layer: Q, K, V and output projections."""
    d, h, kv, dh = s.d_model, s.n_head, s.kv_heads, s.head_dim
    w = d * h * dh + 2 * d * kv * dh + h * dh * d
    b = (h * dh + 2 * kv * dh + d) if s.bias else 0
    return w + b, w


def _mla_gate(s: ArchSpec) -> int:
    """K3's MLA output gate ``g_proj``: ``d_model x n_head * v_head_dim`` (0 without one)."""
    return s.d_model * s.n_head * s.v_head_dim if s.mla_output_gate else 0


def _mla_layer(s: ArchSpec) -> tuple[int, int]:
    """(parameters, matmul parameters) of one MLA layer (Hugging Face's DeepseekV3Attention,
    plus K3's output gate when ``mla_output_gate``)."""
    d, h, r, rope = s.d_model, s.n_head, s.kv_lora_rank, s.qk_rope_head_dim
    if s.q_lora_rank is None:
        q_w, q_norm = d * h * s.qk_head_dim, 0
    else:
        q_w, q_norm = d * s.q_lora_rank + s.q_lora_rank * h * s.qk_head_dim, s.q_lora_rank
    w = (q_w + d * (r + rope)                              # q path; kv_a_proj_with_mqa
         + r * h * (s.qk_nope_head_dim + s.v_head_dim)     # kv_b_proj
         + h * s.v_head_dim * d                            # o_proj
         + _mla_gate(s))                                   # g_proj (K3)
    return w + q_norm + r, w                               # + q_a_layernorm, kv_a_layernorm


def _kda_gate(s: ArchSpec) -> int:
    """KDA's output gate: K3's full-rank ``g_proj`` (``d x H Dk``) or Kimi Linear's low-rank
    ``g_a`` (``d x Dk``) and ``g_b`` (``Dk x H Dk``)."""
    d, dk, p = s.d_model, s.kda_head_dim, s.kda_n_head * s.kda_head_dim
    return d * p if s.kda_full_rank_gate else d * dk + dk * p


def _kda_layer(s: ArchSpec) -> tuple[int, int]:
    """(parameters, matmul parameters) of one KDA layer (Kimi Linear's KimiDeltaAttention;
    SGLang's KimiK3DeltaAttention with ``kda_full_rank_gate``).

    q/k/v projections, a depthwise causal convolution on them, the low-rank forget-gate
    projections (``f_a``, ``f_b``) with ``dt_bias`` (one per channel) and ``A_log`` (one per
    head) -- the same parameters whether the decay is bounded or not -- the write strength
    ``b_proj``, the output gate (:func:`_kda_gate`), the gated output norm and ``o_proj``.
    """
    d, h, dk = s.d_model, s.kda_n_head, s.kda_head_dim
    p = h * dk
    conv = s.kda_conv_kernel * 3 * p
    w = 3 * d * p + conv + (d * dk + dk * p) + d * h + _kda_gate(s) + p * d
    return w + h + p + dk, w                    # + A_log, dt_bias, o_norm


def _mlp(d: int, f: int, kind: str, bias: bool) -> int:
    if kind == "gelu":
        return 2 * d * f + ((f + d) if bias else 0)
    return 3 * d * f + ((2 * f + d) if bias else 0)     # SwiGLU and SiTU-GLU: three matrices


def _vision(spec: ArchSpec) -> dict[str, int]:
    return spec.vision.params(spec.d_model) if spec.vision is not None else {}


def count_params(spec: ArchSpec) -> ParamCount:
    """Count the parameters of ``spec``, component by component, and the active ones.

    Per layer: a token mixer (MHA/GQA: Q, K, V, output projections with optional biases; MLA
    and KDA as in :func:`_mla_layer` / :func:`_kda_layer`, output gates included), a
    feed-forward block (dense MLP, or router ``E x d`` + shared experts, each a bias-free GLU
    ``3 d d_expert`` at the full width ``d`` + routed experts, ``3 w d_expert`` each at the
    width ``w`` they work at -- the latent width of a latent MoE, whose ``d x w`` down and
    ``w x d`` up projections and optional ``w``-wide RMSNorm every token passes through) and
    two norms; with Attention Residuals two more RMSNorm gains and two query vectors
    (``d`` each).  One final norm (plus, with Attention Residuals, the final read's norm and
    query vector); the head is free when tied to the token embedding.  A vision tower is
    counted apart (:attr:`ParamCount.vision`).
    """
    if not isinstance(spec, ArchSpec):
        raise ValueError(f"spec must be an ArchSpec, got {type(spec).__name__}")
    d, V = spec.d_model, spec.vocab_size
    norm = d * (2 if spec.norm == "layernorm" and spec.bias else 1)
    attn, attn_mm = (_mla_layer if spec.attention == "mla" else _mha_layer)(spec)
    attn_gate = _mla_gate(spec) if spec.attention == "mla" else 0
    kda, kda_mm = _kda_layer(spec) if spec.kda_layers else (0, 0)
    kda_gate = _kda_gate(spec) if spec.kda_layers else 0
    n_attn, n_kda = spec.n_attention_layers, spec.n_kda_layers
    expert, shared_expert = spec.expert_params, 3 * d * spec.d_expert
    n_moe = spec.n_moe_layers
    w = spec.moe_latent_dim
    latent_mm = 2 * d * w                                   # routed_expert_down/up_proj
    latent = latent_mm + (w if spec.moe_latent_norm else 0)  # + routed_expert_norm
    dense_mlp = _mlp(d, spec.ffn_dim, spec.mlp, spec.bias)
    dense_mlp_mm = _mlp(d, spec.ffn_dim, spec.mlp, False)
    attn_res = (4 * spec.n_layer + 2) * d if spec.attn_res_block_size else 0

    parts = {
        "token embeddings": V * d,
        "position embeddings": spec.max_positions * d if spec.position == "learned" else 0,
        "softmax attention": n_attn * (attn - attn_gate),
        "softmax-attention output gates": n_attn * attn_gate,
        "linear attention": n_kda * (kda - kda_gate),
        "linear-attention output gates": n_kda * kda_gate,
        "dense MLP": spec.n_dense_layers * dense_mlp,
        "router": n_moe * spec.n_routed_experts * d,
        "latent projections": n_moe * latent,
        "shared experts": n_moe * spec.n_shared_experts * shared_expert,
        "routed experts": n_moe * spec.n_routed_experts * expert,
        "attention residuals": attn_res,
        "norms": (2 * spec.n_layer + 1) * norm,
        "head": 0 if spec.tied_embeddings else V * d,
    }
    active_parts = dict(parts, **{"routed experts": n_moe * spec.top_k * expert})
    detail, active_detail = dict.fromkeys(DETAIL_COMPONENTS, 0), dict.fromkeys(DETAIL_COMPONENTS, 0)
    for name in PART_COMPONENTS:
        detail[PART_OF_DETAIL[name]] += parts[name]
        active_detail[PART_OF_DETAIL[name]] += active_parts[name]
    breakdown = dict.fromkeys(COMPONENTS, 0)
    for name, value in detail.items():
        breakdown[_COARSE[name]] += value
    matmul = (n_attn * attn_mm + n_kda * kda_mm + spec.n_dense_layers * dense_mlp_mm
              + parts["router"] + n_moe * latent_mm + parts["shared experts"]
              + active_parts["routed experts"] + V * d)        # the head's matmul, tied or not
    vision = _vision(spec)
    return ParamCount(total=sum(parts.values()), active=sum(active_parts.values()),
                      breakdown=breakdown, detail=detail, active_detail=active_detail,
                      matmul_active=matmul, parts=parts, active_parts=active_parts,
                      vision=sum(vision.values()), vision_detail=vision)


def stored_elements(spec: ArchSpec, expert_bits: int | None = None, group_size: int = 32,
                    router_bias: bool = True, a_log_stored: int | None = None,
                    include_vision: bool = True) -> dict[str, int]:
    """Elements (tensor entries, whatever their dtype) a released checkpoint of ``spec`` holds.

    Every parameter of :func:`count_params` is one element, except the routed experts when
    ``expert_bits`` is given: they are stored packed, ``8 // expert_bits`` weights per uint8
    element, plus one uint8 scale per group of ``group_size`` weights along each matrix's input
    (MXFP4 in compressed-tensors' ``mxfp4-pack-quantized`` format: ``expert_bits=4``,
    ``group_size=32``, so ``n`` weights take ``n/2 + n/32`` elements).  A checkpoint also
    stores what is not a parameter here: with ``router_bias``, each MoE layer's
    ``e_score_correction_bias`` (``n_routed_experts`` numbers, a buffer updated by a rule);
    ``a_log_stored``, if given, is the length each KDA layer's ``A_log`` is stored at (Kimi
    K3's checkpoint stores ``kda_head_dim`` numbers where the model uses the first
    ``kda_n_head``).  With ``include_vision`` the vision tower is added.

    Returns the parts (``"unpacked parameters"``, ``"packed experts"``, ``"expert scales"``,
    ``"router biases"``, ``"A_log padding"``, ``"vision tower"``) and their ``"total"``.
    """
    c = count_params(spec)
    routed = c.parts["routed experts"]
    packed = scales = 0
    if expert_bits is not None:
        if expert_bits not in (1, 2, 4, 8):
            raise ValueError(f"expert_bits must be None or one of 1, 2, 4, 8, got {expert_bits!r}")
        if not _is_int(group_size) or group_size <= 0:
            raise ValueError(f"group_size must be a positive int, got {group_size!r}")
        per_byte = 8 // expert_bits
        for name, width in (("expert width", spec.expert_width), ("d_expert", spec.d_expert)):
            if spec.is_moe and (width % group_size or width % per_byte):
                raise ValueError(f"group_size ({group_size}) and the packing ({per_byte} per "
                                 f"byte) must divide the {name} ({width})")
        packed, scales, routed = routed // per_byte, routed // group_size, 0
    if a_log_stored is not None and (not _is_int(a_log_stored) or a_log_stored < spec.kda_n_head):
        raise ValueError(f"a_log_stored must be None or an int >= kda_n_head "
                         f"({spec.kda_n_head}), got {a_log_stored!r}")
    parts = {
        "unpacked parameters": c.total - c.parts["routed experts"] + routed,
        "packed experts": packed,
        "expert scales": scales,
        "router biases": spec.n_moe_layers * spec.n_routed_experts if router_bias else 0,
        "A_log padding": (spec.n_kda_layers * (a_log_stored - spec.kda_n_head)
                          if a_log_stored is not None else 0),
        "vision tower": c.vision if include_vision else 0,
    }
    parts["total"] = sum(parts.values())
    return parts


# ---------------------------------------------------------------------------- cache and state
def _check_nonneg_int(name: str, value) -> None:
    if not _is_int(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")


def _check_positive_number(name: str, value) -> None:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value <= 0):
        raise ValueError(f"{name} must be a positive number of bytes, got {value!r}")


def _as_bytes(x: float) -> int | float:
    """Whole bytes as an ``int``; sub-byte formats (int4) may leave a fraction."""
    return int(x) if float(x).is_integer() else x


def kv_numbers_per_layer(spec: ArchSpec) -> int:
    """Numbers one softmax-attention layer caches per token.

    MHA/GQA: a key and a value per K/V head, ``2 * n_kv_head * head_dim``.  MLA: the latent and
    the shared rotary key, ``kv_lora_rank + qk_rope_head_dim`` (DeepSeek-V3: 576).
    """
    if spec.attention == "mla":
        return spec.kv_lora_rank + spec.qk_rope_head_dim
    return 2 * spec.kv_heads * spec.head_dim


def kv_numbers_per_token(spec: ArchSpec) -> int:
    """Numbers the whole model caches per token: linear-state layers add nothing."""
    return spec.n_attention_layers * kv_numbers_per_layer(spec)


def kv_cache_bytes(spec: ArchSpec, context_len: int, batch: int = 1, dtype_bytes: float = 2) -> int | float:
    """Bytes of the KV cache of ``batch`` sequences of ``context_len`` tokens.

    Grows linearly with context in every softmax-attention layer (see
    :func:`kv_numbers_per_layer`) and not at all in linear-state layers (their memory is
    :func:`state_bytes`).  ``dtype_bytes`` may be fractional (0.5 for int4).
    """
    _check_nonneg_int("context_len", context_len)
    _check_nonneg_int("batch", batch)
    _check_positive_number("dtype_bytes", dtype_bytes)
    return _as_bytes(kv_numbers_per_token(spec) * context_len * batch * dtype_bytes)


def state_numbers_per_layer(spec: ArchSpec) -> dict[str, int]:
    """The fixed-size memory of one KDA layer, per sequence.

    ``"recurrent"``: the state matrices, ``kda_n_head x Dk x Dv``; ``"conv"``: the last
    ``kda_conv_kernel - 1`` inputs of the short convolutions on q, k and v (the minimum a decoder
    must keep; some kernels keep ``kda_conv_kernel``).
    """
    h, dk = spec.kda_n_head, spec.kda_head_dim
    conv = max(spec.kda_conv_kernel - 1, 0) * 3 * h * dk
    return {"recurrent": h * dk * dk, "conv": conv}


def state_bytes(spec: ArchSpec, batch: int = 1, dtype_bytes: float = 2) -> int | float:
    """Bytes of the fixed linear-attention state of ``batch`` sequences (every KDA layer).

    Independent of the context length; see :func:`state_numbers_per_layer` for what is held.
    """
    _check_nonneg_int("batch", batch)
    _check_positive_number("dtype_bytes", dtype_bytes)
    per_layer = sum(state_numbers_per_layer(spec).values()) if spec.kda_layers else 0
    return _as_bytes(spec.n_kda_layers * per_layer * batch * dtype_bytes)


def kda_log_decay(x: float, a_log: float = 0.0, dt_bias: float = 0.0,
                  lower_bound: float | None = None) -> float:
    """One channel's per-step log-decay ``g`` (the state is multiplied by ``exp(g)``) for
    gate pre-activation ``x``, in plain floats.

    Kimi Linear (``lower_bound=None``): ``-exp(a_log) * softplus(x + dt_bias)``, anywhere in
    ``(-inf, 0)``.  Kimi K3 (``lower_bound=b < 0``, fla-core's ``naive_kda_lowerbound_gate``):
    ``b * sigmoid(exp(a_log) * (x + dt_bias))``, inside ``(b, 0)``: a channel keeps at least
    ``exp(b)`` of its state per step (``e^-5`` ~ 0.67% for K3) and never more than all of it.
    """
    for name, value in (("x", x), ("a_log", a_log), ("dt_bias", dt_bias)):
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    z = x + dt_bias
    if lower_bound is None:
        softplus = z + math.log1p(math.exp(-z)) if z > 0 else math.log1p(math.exp(z))
        return -math.exp(a_log) * softplus
    if (isinstance(lower_bound, bool) or not isinstance(lower_bound, (int, float))
            or not math.isfinite(lower_bound) or lower_bound >= 0):
        raise ValueError(f"lower_bound must be None or a finite negative number, "
                         f"got {lower_bound!r}")
    u = math.exp(a_log) * z
    sigmoid = 1 / (1 + math.exp(-u)) if u >= 0 else math.exp(u) / (1 + math.exp(u))
    return lower_bound * sigmoid


def kda_log_decay_range(spec: ArchSpec) -> tuple[float, float]:
    """The open interval ``(lowest, highest)`` a KDA layer's per-step log-decay can take:
    ``(kda_gate_lower_bound, 0)`` for a bounded gate, ``(-inf, 0)`` for Kimi Linear's."""
    if not isinstance(spec, ArchSpec):
        raise ValueError(f"spec must be an ArchSpec, got {type(spec).__name__}")
    if not spec.kda_layers:
        raise ValueError(f"{spec.name} has no KDA layers")
    low = spec.kda_gate_lower_bound
    return (float(low) if low is not None else -math.inf, 0.0)


# ---------------------------------------------------------------------------- bytes and FLOPs
def _expected_distinct_experts(n_experts: int, top_k: int, batch: int) -> float:
    """Expected number of distinct experts ``batch`` tokens touch in one MoE layer, when each
    token picks ``top_k`` of ``n_experts`` uniformly and independently of the others."""
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** batch)


def weights_read_per_step(spec: ArchSpec, batch: int = 1) -> float:
    """Parameters one decode step of ``batch`` sequences reads from memory (see
    :func:`decode_bytes_per_token`): every parameter except the embedding tables (``batch``
    rows of each are read; a tied head still reads the whole token table) and the routed
    experts no token picked -- the expected number of distinct experts under uniform,
    independent routing, ``E (1 - (1 - k/E)^batch)`` per MoE layer.  A float, because that
    expectation is not whole."""
    if not _is_int(batch) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    c = count_params(spec)
    d = spec.d_model
    expert = spec.expert_params
    weights = (c.total - c.detail["token embeddings"] - c.detail["position embeddings"]
               - c.detail["routed experts"])
    if spec.is_moe:
        touched = _expected_distinct_experts(spec.n_routed_experts, spec.top_k, batch)
        weights += spec.n_moe_layers * touched * expert
    weights += c.detail["token embeddings"] if spec.tied_embeddings else batch * d
    if spec.position == "learned" and spec.max_positions:
        weights += batch * d
    return weights


def decode_bytes_per_token(spec: ArchSpec, context_len: int, batch: int = 1,
                           weight_bytes: float = 2, cache_bytes: float = 2,
                           state_dtype_bytes: float | None = None) -> float:
    """Bytes moved between memory and the processor per decoded token, for a batch of
    ``batch`` sequences each at ``context_len`` cached positions.

    One decode step reads the weights it needs **once for the whole batch**, and, for every
    sequence, its whole KV cache; linear-state layers read and write their state.  Per token::

        weights_read(batch) * weight_bytes / batch
        + kv_cache_bytes(spec, context_len, 1, cache_bytes)
        + 2 * state_bytes(spec, 1, state_dtype_bytes)

    (``state_dtype_bytes`` defaults to ``cache_bytes``; recurrent kernels usually keep the
    state in float32, 4 bytes.)

    ``weights_read`` (:func:`weights_read_per_step`) is every parameter except the embedding
    tables (only ``batch`` rows are read; a tied head still reads the whole table) and the
    routed experts nobody picked.  With ``batch`` tokens per MoE layer the experts touched are
    taken as the expected number of distinct experts under uniform, independent routing,
    ``E (1 - (1 - k/E)^batch)``: ``k`` at batch 1, all ``E`` for large batches.  Real routing
    is correlated, so this is a model, not a measurement.  Activations and the cache write of
    the new token are ignored.
    """
    _check_nonneg_int("context_len", context_len)
    if not _is_int(batch) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    _check_positive_number("weight_bytes", weight_bytes)
    _check_positive_number("cache_bytes", cache_bytes)
    if state_dtype_bytes is None:
        state_dtype_bytes = cache_bytes
    _check_positive_number("state_dtype_bytes", state_dtype_bytes)
    weights = weights_read_per_step(spec, batch)
    per_sequence = (kv_cache_bytes(spec, context_len, 1, cache_bytes)
                    + 2 * state_bytes(spec, 1, state_dtype_bytes))
    return weights * weight_bytes / batch + per_sequence


def mla_decode_costs(spec: ArchSpec) -> dict[str, dict[str, int]]:
    """What one MLA layer reads and computes **per cached position** when decoding one token.

    Three ways to run the same layer (``H`` heads, latent ``r``, rotary ``dr``, ``dn``/``dv``
    no-rope key and value widths):

    * ``"mha_cache"``: cache the decompressed keys and values (what plain MHA would hold):
      reads ``H (dn + dr + dv)`` numbers; ``2 H (dn + dr) + 2 H dv`` FLOPs (scores, weighted sum).
    * ``"naive"``: cache the latent and decompress every position at every step: reads
      ``r + dr``; ``2 r H (dn + dv)`` FLOPs to decompress plus the attention of ``"mha_cache"``.
    * ``"absorbed"``: cache the latent and attend in latent space (the up-projections folded
      into the query and the output): reads ``r + dr``; ``2 H (r + dr) + 2 H r`` FLOPs.

    Returns ``{form: {"numbers": ..., "flops": ...}}``.  The per-token projections (including
    the absorbed ``W_UK``, ``W_UV`` products, which are ``kv_b_proj``'s weights used once per
    token) are not per-position costs and are counted in ``ParamCount.matmul_active``.
    """
    if spec.attention != "mla":
        raise ValueError(f"spec.attention must be 'mla', got {spec.attention!r}")
    h, r, dr = spec.n_head, spec.kv_lora_rank, spec.qk_rope_head_dim
    dn, dv = spec.qk_nope_head_dim, spec.v_head_dim
    attend = 2 * h * (dn + dr) + 2 * h * dv
    return {
        "mha_cache": {"numbers": h * (dn + dr + dv), "flops": attend},
        "naive": {"numbers": r + dr, "flops": 2 * r * h * (dn + dv) + attend},
        "absorbed": {"numbers": r + dr, "flops": 2 * h * (r + dr) + 2 * h * r},
    }


def flops_per_token(spec: ArchSpec, context_len: int, mla_absorbed: bool = True) -> int:
    """Forward FLOPs to decode one token that attends over ``context_len`` cached positions.

    ``2 * matmul_active`` (a multiply and an add per weight the token is multiplied through)
    plus the context-dependent attention term of every softmax-attention layer:

    * MHA/GQA: ``4 * n_head * head_dim * context_len`` (scores and weighted sum; sharing K/V
      heads saves bytes, not FLOPs);
    * MLA: :func:`mla_decode_costs`'s ``"absorbed"`` (default) or ``"naive"`` FLOPs per position
      times ``context_len``;

    plus, per KDA layer, the state update and read, ``7 * kda_n_head * Dk * Dv`` (decay 1,
    ``k^T S`` 2, rank-one write 2, ``q^T S`` 2), which does not grow with context.  Softmax,
    norms, activations, gates' elementwise products and Attention Residuals' depth mixture (a
    few ``d_model``-long dot products and sums per sub-layer, against billions) are ignored.
    """
    _check_nonneg_int("context_len", context_len)
    if not isinstance(mla_absorbed, bool):
        raise ValueError(f"mla_absorbed must be a bool, got {mla_absorbed!r}")
    if spec.attention == "mla":
        per_position = mla_decode_costs(spec)["absorbed" if mla_absorbed else "naive"]["flops"]
    else:
        per_position = 4 * spec.n_head * spec.head_dim
    state = 7 * spec.kda_n_head * spec.kda_head_dim ** 2
    return (2 * count_params(spec).matmul_active
            + spec.n_attention_layers * per_position * context_len
            + spec.n_kda_layers * state)


# ---------------------------------------------------------------------------- hardware and serving
@dataclass(frozen=True)
class Hardware:
    """One accelerator, as the roofline and the memory plan see it.

    ``memory_bytes``: its memory; ``bandwidth``: bytes per second it reads while decoding;
    ``peak_flops``: dense matmul FLOP/s in the format the weights are multiplied in;
    ``per_machine``: how many sit in one machine behind a fast interconnect (the most a
    tensor-parallel group spans).
    """

    name: str
    memory_bytes: float
    bandwidth: float
    peak_flops: float
    per_machine: int = 8
    source: str = field(default="", compare=False)

    def __post_init__(self):
        for name in ("memory_bytes", "bandwidth", "peak_flops"):
            _check_positive_number(name, getattr(self, name))
        if not _is_int(self.per_machine) or self.per_machine < 1:
            raise ValueError(f"per_machine must be a positive int, got {self.per_machine!r}")

    @property
    def ridge(self) -> float:
        """FLOPs per byte at which a kernel is as limited by compute as by bandwidth."""
        return self.peak_flops / self.bandwidth


#: An NVIDIA H200 with the reference figures of the book's design notes: the nominal 141 GB
#: of HBM3e (NVIDIA's datasheet; less is usable once the runtime takes its share), the
#: ~4.5 TB/s that one decode step of softmax attention over a million-token bf16 KV cache was
#: measured to read at (the datasheet says 4.8 TB/s), the ~790 TFLOP/s measured for a bf16
#: dense matmul (datasheet: 989), and eight to a machine (an HGX H200 board, NVLink inside).
H200 = Hardware(name="NVIDIA H200", memory_bytes=141e9, bandwidth=4.5e12, peak_flops=790e12,
                per_machine=8,
                source=("141 GB: NVIDIA H200 datasheet (nominal). 4.5 TB/s decode read and "
                        "790 TFLOP/s bf16 dense: measured on an H200 (design notes, section 7)."))


def _check_hardware(hardware) -> None:
    if not isinstance(hardware, Hardware):
        raise ValueError(f"hardware must be a Hardware, got {type(hardware).__name__}")


def memory_per_sequence(spec: ArchSpec, context_len: int, cache_bytes: float = 2,
                        state_dtype_bytes: float = 4) -> float:
    """Bytes one sequence keeps between decode steps: its KV cache at ``context_len`` tokens
    (:func:`kv_cache_bytes`) plus the fixed state of the linear-attention layers
    (:func:`state_bytes`, float32 by default)."""
    return (kv_cache_bytes(spec, context_len, 1, cache_bytes)
            + state_bytes(spec, 1, state_dtype_bytes))


def serving_memory(spec: ArchSpec, context_len: int, batch: int = 1, weight_bytes: float = 2,
                   cache_bytes: float = 2, state_dtype_bytes: float = 4) -> dict[str, float]:
    """Bytes that must sit in accelerator memory to decode ``batch`` sequences of
    ``context_len`` tokens: ``{"weights", "cache", "state", "total"}``.

    Every parameter is stored in the weight format (a real quantized checkpoint keeps a few
    tensors -- norms, the router, sometimes the embeddings -- wider, and adds scales);
    activations, workspace and the runtime's own reserve are not counted.
    """
    _check_nonneg_int("batch", batch)
    _check_positive_number("weight_bytes", weight_bytes)
    weights = count_params(spec).total * weight_bytes
    cache = kv_cache_bytes(spec, context_len, batch, cache_bytes)
    state = state_bytes(spec, batch, state_dtype_bytes)
    return {"weights": weights, "cache": cache, "state": state, "total": weights + cache + state}


def devices_needed(spec: ArchSpec, context_len: int, batch: int = 1, hardware: Hardware = None,
                   weight_bytes: float = 2, cache_bytes: float = 2,
                   state_dtype_bytes: float = 4) -> int:
    """The fewest devices whose pooled memory holds the weights and every sequence's cache
    and state (:func:`serving_memory`): a lower bound that assumes every byte can go
    anywhere.  :func:`serving_plan` lays the same bytes out by tensor and expert parallelism,
    which can need more."""
    hardware = H200 if hardware is None else hardware
    _check_hardware(hardware)
    total = serving_memory(spec, context_len, batch, weight_bytes, cache_bytes,
                           state_dtype_bytes)["total"]
    return max(1, math.ceil(total / hardware.memory_bytes))


def max_batch(spec: ArchSpec, context_len: int, hardware: Hardware = None, n_devices: int = 1,
              weight_bytes: float = 2, cache_bytes: float = 2, state_dtype_bytes: float = 4) -> int:
    """The most sequences of ``context_len`` tokens whose caches and states fit beside the
    weights in the pooled memory of ``n_devices`` devices (0 when the weights alone do not
    fit): the *memory-limited batch*."""
    hardware = H200 if hardware is None else hardware
    _check_hardware(hardware)
    if not _is_int(n_devices) or n_devices < 1:
        raise ValueError(f"n_devices must be a positive int, got {n_devices!r}")
    if not _is_int(context_len) or context_len < 1:
        raise ValueError(f"context_len must be a positive int, got {context_len!r}")
    free = n_devices * hardware.memory_bytes - serving_memory(
        spec, context_len, 0, weight_bytes, cache_bytes, state_dtype_bytes)["weights"]
    per_sequence = memory_per_sequence(spec, context_len, cache_bytes, state_dtype_bytes)
    return max(0, int(free // per_sequence))


@dataclass(frozen=True)
class Roofline:
    """What the roofline model predicts for one decode step (see :func:`roofline`).

    ``bytes_per_step`` and ``flops_per_step`` are for the whole batch; ``memory_s`` and
    ``compute_s`` the times to move and to compute them on ``n_devices`` devices working in
    perfect parallel.  The step takes the larger of the two.
    """

    batch: int
    n_devices: int
    bytes_per_step: float
    flops_per_step: float
    memory_s: float
    compute_s: float

    @property
    def step_s(self) -> float:
        """Seconds per decode step: every sequence of the batch gains one token."""
        return max(self.memory_s, self.compute_s)

    @property
    def per_token_s(self) -> float:
        """Seconds per output token over the whole batch (the inverse of throughput)."""
        return self.step_s / self.batch

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved; compare with :attr:`Hardware.ridge`."""
        return self.flops_per_step / self.bytes_per_step


def roofline(spec: ArchSpec, context_len: int, batch: int = 1, hardware: Hardware = None,
             n_devices: int = 1, weight_bytes: float = 2, cache_bytes: float = 2,
             state_dtype_bytes: float = 4, mla_absorbed: bool = True) -> Roofline:
    """The roofline of one decode step: ``batch`` sequences at ``context_len`` cached tokens.

    Time is the larger of bytes moved over bandwidth and FLOPs over peak::

        t = max(batch * decode_bytes_per_token(...) / (n * bandwidth),
                batch * flops_per_token(...) / (n * peak_flops))

    The weights a step needs are read once for the whole batch, caches and states once per
    sequence (:func:`decode_bytes_per_token`); every token does its own FLOPs
    (:func:`flops_per_token`).  Matmuls run at ``peak_flops`` whatever the weight format
    (weight-only quantization: weights are stored narrow and multiplied in bf16).  ``n``
    devices split bytes and FLOPs evenly and never wait for each other: communication
    (all-to-all for the experts, all-reduce for tensor parallelism), kernel launches and
    imperfect overlap are left out, so the prediction is a lower bound on the time.
    """
    hardware = H200 if hardware is None else hardware
    _check_hardware(hardware)
    if not _is_int(n_devices) or n_devices < 1:
        raise ValueError(f"n_devices must be a positive int, got {n_devices!r}")
    per_token = decode_bytes_per_token(spec, context_len, batch, weight_bytes, cache_bytes,
                                       state_dtype_bytes)
    moved = per_token * batch
    flops = flops_per_token(spec, context_len, mla_absorbed) * batch
    return Roofline(batch=batch, n_devices=n_devices, bytes_per_step=moved, flops_per_step=flops,
                    memory_s=moved / (n_devices * hardware.bandwidth),
                    compute_s=flops / (n_devices * hardware.peak_flops))


@dataclass(frozen=True)
class ServingPlan:
    """A layout of one model over ``n_devices`` devices (see :func:`serving_plan`).

    ``per_device`` holds the bytes on the fullest device: ``"shared weights"`` (everything
    but the routed experts, split ``tp`` ways), ``"routed experts"`` (``experts_per_device``
    of every MoE layer), ``"cache"`` and ``"state"`` (its sequences), and ``"total"``.
    """

    n_devices: int
    tp: int
    machines: int
    experts_per_device: int
    sequences_per_group: int
    per_device: dict[str, float]

    @property
    def ep(self) -> int:
        """Expert-parallel degree: the routed experts are spread over every device."""
        return self.n_devices

    @property
    def dp(self) -> int:
        """Data-parallel groups: each holds its own share of the sequences."""
        return self.n_devices // self.tp


def _plan_sizes(spec: ArchSpec, context_len: int, tp: int, wb: float, cb: float,
                sb: float) -> tuple[float, float, float, float]:
    """(shared weights per device, bytes of one routed expert in every MoE layer, cache and
    state of one sequence per device) for tensor-parallel degree ``tp``."""
    c = count_params(spec)
    shared = (c.total - c.detail["routed experts"]) * wb / tp
    expert_layers = spec.n_moe_layers * spec.expert_params * wb
    # An MLA latent belongs to the token, not to a head: every rank of a tensor-parallel group
    # keeps all of it.  MHA/GQA caches and KDA states split by head.
    if spec.attention == "mla":
        cache_share = 1.0
    else:
        cache_share = math.ceil(spec.kv_heads / tp) / spec.kv_heads
    state_share = (math.ceil(spec.kda_n_head / tp) / spec.kda_n_head) if spec.kda_layers else 0.0
    cache = kv_cache_bytes(spec, context_len, 1, cb) * cache_share
    state = state_bytes(spec, 1, sb) * state_share
    return shared, expert_layers, cache, state


def serving_plan(spec: ArchSpec, context_len: int, batch: int = 1, hardware: Hardware = None,
                 tp: int = 1, weight_bytes: float = 2, cache_bytes: float = 2,
                 state_dtype_bytes: float = 4, max_devices: int = 8192) -> ServingPlan | None:
    """The fewest devices (a multiple of ``tp``) that hold ``spec`` and ``batch`` sequences
    of ``context_len`` tokens under tensor and expert parallelism, planned on paper.

    The plan, in the style of DeepSeek-V3's and Kimi K2's serving:

    * **expert parallelism** over all ``n`` devices: each holds ``ceil(E / n)`` routed experts
      of every MoE layer, and each token's ``top_k`` experts are reached by all-to-all;
    * **tensor parallelism** of degree ``tp`` (at most one machine) for everything else --
      embeddings, attention and KDA layers, dense MLPs, routers, shared experts, head --
      split ``tp`` ways and replicated in each of the ``n / tp`` data-parallel groups;
    * the sequences are shared out over the groups.  Inside a group, MHA/GQA caches and KDA
      states split by head, but an MLA latent is per token, so every rank of the group keeps
      it whole: tensor parallelism multiplies MLA's cache by ``tp``, which is why ``tp=1``
      (data-parallel attention) suits MLA.

    Returns ``None`` if nothing up to ``max_devices`` fits (a single sequence's cache can
    outgrow one device).  Only memory is planned; :func:`roofline` gives the time.
    """
    hardware = H200 if hardware is None else hardware
    _check_hardware(hardware)
    _check_nonneg_int("context_len", context_len)
    if not _is_int(batch) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    if not _is_int(tp) or not 1 <= tp <= hardware.per_machine:
        raise ValueError(f"tp must be an int in [1, per_machine={hardware.per_machine}] (tensor "
                         f"parallelism stays inside one machine), got {tp!r}")
    for name, value in (("weight_bytes", weight_bytes), ("cache_bytes", cache_bytes),
                        ("state_dtype_bytes", state_dtype_bytes)):
        _check_positive_number(name, value)
    if not _is_int(max_devices) or max_devices < tp:
        raise ValueError(f"max_devices must be an int >= tp, got {max_devices!r}")
    shared, expert_layers, cache, state = _plan_sizes(spec, context_len, tp, weight_bytes,
                                                      cache_bytes, state_dtype_bytes)

    def layout(n: int) -> ServingPlan:
        experts = math.ceil(spec.n_routed_experts / n) if spec.is_moe else 0
        seqs = math.ceil(batch / (n // tp))
        per_device = {"shared weights": shared, "routed experts": experts * expert_layers,
                      "cache": seqs * cache, "state": seqs * state}
        per_device["total"] = sum(per_device.values())
        return ServingPlan(n_devices=n, tp=tp, machines=math.ceil(n / hardware.per_machine),
                           experts_per_device=experts, sequences_per_group=seqs,
                           per_device=per_device)

    # The bytes on the fullest device never grow as devices are added: search the multiples
    # of tp for the first that fits, if the largest allowed does.
    fits = lambda k: layout(k * tp).per_device["total"] <= hardware.memory_bytes  # noqa: E731
    lo, hi = 1, max_devices // tp
    if not fits(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return layout(lo * tp)


def plan_roofline(spec: ArchSpec, plan: ServingPlan, context_len: int, batch: int,
                  hardware: Hardware = None, weight_bytes: float = 2, cache_bytes: float = 2,
                  state_dtype_bytes: float = 4, mla_absorbed: bool = True) -> Roofline:
    """The roofline of one decode step on a :class:`ServingPlan`, set by its busiest device.

    :func:`roofline` with ``n_devices`` splits every byte and FLOP evenly, which a real layout
    cannot do: a sequence's cache lives in one data-parallel group, an MLA latent is read
    whole by every rank of its group, and a token's experts sit on a few devices.  Here the
    device that serves the fullest group (``plan.sequences_per_group`` sequences) reads

    * its ``1/tp`` share of the shared weights those sequences need,
    * its experts that any of the ``batch`` tokens picked (uniform, independent routing: each
      of its ``ceil(E/n)`` experts per layer with probability ``1 - (1 - k/E)^batch``),
    * the caches and states of its group's sequences (an MLA latent whole, MHA/GQA caches and
      KDA states by head),

    and does the matching FLOPs (attention split by head).  The returned :class:`Roofline`
    describes that device (``n_devices=1``); its ``step_s`` is the step time of the whole
    deployment and ``per_token_s`` divides it by ``batch``.  Communication is still ignored.
    """
    hardware = H200 if hardware is None else hardware
    _check_hardware(hardware)
    if not isinstance(plan, ServingPlan):
        raise ValueError(f"plan must be a ServingPlan, got {type(plan).__name__}")
    if not _is_int(batch) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    tp, n = plan.tp, plan.n_devices
    seqs = min(plan.sequences_per_group, batch)
    _, expert_layers, cache, state = _plan_sizes(spec, context_len, tp, weight_bytes, cache_bytes,
                                                 state_dtype_bytes)
    c = count_params(spec)
    expert = spec.expert_params
    touched_all = (_expected_distinct_experts(spec.n_routed_experts, spec.top_k, seqs)
                   if spec.is_moe else 0.0)
    shared_read = weights_read_per_step(spec, seqs) - spec.n_moe_layers * touched_all * expert
    picked = 1 - (1 - spec.top_k / spec.n_routed_experts) ** batch if spec.is_moe else 0.0
    experts_read = plan.experts_per_device * picked * expert_layers
    moved = shared_read * weight_bytes / tp + experts_read + seqs * (cache + 2 * state)
    # FLOPs: the group's tokens through the shared matmuls (split tp ways), the device's share
    # of all tokens' expert work, and attention / state updates split by head.
    routed_active = c.active_detail["routed experts"]
    shared_flops = 2 * seqs * (c.matmul_active - routed_active) / tp
    expert_flops = (2 * batch * routed_active * plan.experts_per_device / spec.n_routed_experts
                    if spec.is_moe else 0.0)
    mixing = flops_per_token(spec, context_len, mla_absorbed) - 2 * c.matmul_active
    flops = shared_flops + expert_flops + seqs * mixing / tp
    return Roofline(batch=batch, n_devices=1, bytes_per_step=moved, flops_per_step=flops,
                    memory_s=moved / hardware.bandwidth, compute_s=flops / hardware.peak_flops)
