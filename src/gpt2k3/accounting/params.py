"""Parameters: :func:`count_params` (total, active, by component) and :func:`stored_elements`.

``count_params(spec).active`` is the number of parameters that take part in processing one
token: every parameter except the routed experts the router did not pick (see
:mod:`gpt2k3.accounting` for the convention and how it relates to the published headlines).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpt2k3.accounting.spec import ArchSpec, check_spec
from gpt2k3.checks import check_bool, check_bytes, is_int

__all__ = ["ParamCount", "count_params", "stored_elements", "COMPONENTS", "DETAIL_COMPONENTS",
           "PART_COMPONENTS", "PART_OF_DETAIL", "packed_bytes_per_weight", "checkpoint_bytes",
           "mtp_params"]

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
#: query vectors and norms into ``"norms"`` (per-layer vectors of ``n_embd`` numbers, used
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


@dataclass(frozen=True)
class ParamCount:
    """Parameter counts of one spec.

    ``total``; ``active`` per token (see :mod:`gpt2k3.accounting`; equal to ``total`` for dense
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
        """``active`` minus the token-embedding table, the untied head still in: the
        convention the Kimi Linear report states for its MoE models ("excluding embeddings"),
        and the one under which Kimi K3's 104.19B reproduces its report's "104.2B" (with the
        table: 105.36B)."""
        return self.active - self.detail["token embeddings"]

    @property
    def total_with_vision(self) -> int:
        """``total`` plus the vision tower: every parameter of the released model."""
        return self.total + self.vision


def _mha_layer(s: ArchSpec) -> tuple[int, int]:
    """(parameters, matmul parameters) of one MHA/GQA layer: Q, K, V and output projections."""
    d, h, kv, dh = s.n_embd, s.n_head, s.kv_heads, s.head_dim
    w = d * h * dh + 2 * d * kv * dh + h * dh * d
    b = (h * dh + 2 * kv * dh + d) if s.bias else 0
    return w + b, w


def _mla_gate(s: ArchSpec) -> int:
    """K3's MLA output gate ``g_proj``: ``n_embd x n_head * v_head_dim`` (0 without one)."""
    return s.n_embd * s.n_head * s.v_head_dim if s.mla_output_gate else 0


def _mla_layer(s: ArchSpec) -> tuple[int, int]:
    """(parameters, matmul parameters) of one MLA layer (Hugging Face's DeepseekV3Attention,
    plus K3's output gate when ``mla_output_gate``)."""
    d, h, r, rope = s.n_embd, s.n_head, s.kv_lora_rank, s.qk_rope_head_dim
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
    d, dk, p = s.n_embd, s.kda_head_dim, s.kda_n_head * s.kda_head_dim
    return d * p if s.kda_full_rank_gate else d * dk + dk * p


def _kda_layer(s: ArchSpec) -> tuple[int, int]:
    """(parameters, matmul parameters) of one KDA layer (Kimi Linear's KimiDeltaAttention;
    SGLang's KimiK3DeltaAttention with ``kda_full_rank_gate``).

    q/k/v projections, a depthwise causal convolution on them, the low-rank forget-gate
    projections (``f_a``, ``f_b``) with ``dt_bias`` (one per channel) and ``A_log`` (one per
    head, as SGLang reads K3's checkpoint; a per-key-channel reading is
    :func:`a_log_readings`'s other case) -- the same parameters whether the decay is bounded or not -- the write strength
    ``b_proj``, the output gate (:func:`_kda_gate`), the gated output norm and ``o_proj``.
    """
    d, h, dk = s.n_embd, s.kda_n_head, s.kda_head_dim
    p = h * dk
    conv = s.kda_conv_kernel * 3 * p
    w = 3 * d * p + conv + (d * dk + dk * p) + d * h + _kda_gate(s) + p * d
    return w + h + p + dk, w                    # + A_log, dt_bias, o_norm


def _mlp(d: int, f: int, kind: str, bias: bool) -> int:
    if kind == "gelu":
        return 2 * d * f + ((f + d) if bias else 0)
    return 3 * d * f + ((2 * f + d) if bias else 0)     # SwiGLU and SiTU-GLU: three matrices


def _vision(spec: ArchSpec) -> dict[str, int]:
    return spec.vision.params(spec.n_embd) if spec.vision is not None else {}


def param_parts(spec: ArchSpec) -> tuple[dict[str, int], dict[str, int], int]:
    """The core of :func:`count_params`: the parameters of ``spec`` by part
    (:data:`PART_COMPONENTS`), the active ones by part, and the matmul-active count."""
    d, V = spec.n_embd, spec.vocab_size
    norm = d * (2 if spec.norm == "layernorm" and spec.bias else 1)
    attn, attn_mm = (_mla_layer if spec.attention == "mla" else _mha_layer)(spec)
    attn_gate = _mla_gate(spec) if spec.attention == "mla" else 0
    kda, kda_mm = _kda_layer(spec) if spec.kda_layers else (0, 0)
    kda_gate = _kda_gate(spec) if spec.kda_layers else 0
    n_attn, n_kda, n_moe = spec.n_attention_layers, spec.n_kda_layers, spec.n_moe_layers
    w = spec.moe_latent_dim
    latent_mm = 2 * d * w                                   # routed_expert_down/up_proj
    parts = {
        "token embeddings": V * d,
        "position embeddings": spec.max_positions * d if spec.position == "learned" else 0,
        "softmax attention": n_attn * (attn - attn_gate),
        "softmax-attention output gates": n_attn * attn_gate,
        "linear attention": n_kda * (kda - kda_gate),
        "linear-attention output gates": n_kda * kda_gate,
        "dense MLP": spec.n_dense_layers * _mlp(d, spec.ffn_dim, spec.mlp, spec.bias),
        "router": n_moe * spec.n_routed_experts * d,
        "latent projections": n_moe * (latent_mm + (w if spec.moe_latent_norm else 0)),
        "shared experts": n_moe * spec.n_shared_experts * 3 * d * spec.d_expert,
        "routed experts": n_moe * spec.n_routed_experts * spec.expert_params,
        "attention residuals": (4 * spec.n_layer + 2) * d if spec.attn_res_block_size else 0,
        "norms": (2 * spec.n_layer + 1) * norm,
        "head": 0 if spec.tied_embeddings else V * d,
    }
    active = dict(parts, **{"routed experts": n_moe * spec.top_k * spec.expert_params})
    matmul = (n_attn * attn_mm + n_kda * kda_mm
              + spec.n_dense_layers * _mlp(d, spec.ffn_dim, spec.mlp, False)
              + parts["router"] + n_moe * latent_mm + parts["shared experts"]
              + active["routed experts"] + V * d)        # the head's matmul, tied or not
    return parts, active, matmul


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
    counted apart (:attr:`ParamCount.vision`).  :func:`param_parts` is the count itself;
    this entry checks ``spec`` and sums the parts into the coarser breakdowns.
    """
    check_spec(spec)
    return _count_params(spec)


def _count_params(spec: ArchSpec) -> ParamCount:
    """:func:`count_params` of an already-checked spec (the accounting modules' internal form)."""
    parts, active_parts, matmul = param_parts(spec)
    detail, active_detail = dict.fromkeys(DETAIL_COMPONENTS, 0), dict.fromkeys(DETAIL_COMPONENTS, 0)
    for name in PART_COMPONENTS:
        detail[PART_OF_DETAIL[name]] += parts[name]
        active_detail[PART_OF_DETAIL[name]] += active_parts[name]
    breakdown = dict.fromkeys(COMPONENTS, 0)
    for name, value in detail.items():
        breakdown[_COARSE[name]] += value
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
    K3's checkpoint stores ``kda_head_dim`` numbers for ``kda_n_head`` heads; the entries
    beyond one per head are counted apart, whichever way they are read: :func:`a_log_readings`).
    With ``include_vision`` the vision tower is added.

    Returns the parts (``"unpacked parameters"``, ``"packed experts"``, ``"expert scales"``,
    ``"router biases"``, ``"A_log beyond one per head"``, ``"vision tower"``) and their
    ``"total"``.
    """
    check_bool(router_bias, "router_bias")
    check_bool(include_vision, "include_vision")
    if not is_int(group_size) or group_size <= 0:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if expert_bits is not None and not is_int(expert_bits):
        raise ValueError(f"expert_bits must be None or one of 1, 2, 4, 8, got {expert_bits!r}")
    c = count_params(spec)
    routed = c.parts["routed experts"]
    packed = scales = 0
    if expert_bits is not None:
        if expert_bits not in (1, 2, 4, 8):
            raise ValueError(f"expert_bits must be None or one of 1, 2, 4, 8, got {expert_bits!r}")
        if not is_int(group_size) or group_size <= 0:
            raise ValueError(f"group_size must be a positive int, got {group_size!r}")
        per_byte = 8 // expert_bits
        for name, width in (("expert width", spec.expert_width), ("d_expert", spec.d_expert)):
            if spec.is_moe and (width % group_size or width % per_byte):
                raise ValueError(f"group_size ({group_size}) and the packing ({per_byte} per "
                                 f"byte) must divide the {name} ({width})")
        packed, scales, routed = routed // per_byte, routed // group_size, 0
    if a_log_stored is not None and (not is_int(a_log_stored) or a_log_stored < spec.kda_n_head):
        raise ValueError(f"a_log_stored must be None or an int >= kda_n_head "
                         f"({spec.kda_n_head}), got {a_log_stored!r}")
    parts = {
        "unpacked parameters": c.total - c.parts["routed experts"] + routed,
        "packed experts": packed,
        "expert scales": scales,
        "router biases": spec.n_moe_layers * spec.n_routed_experts if router_bias else 0,
        "A_log beyond one per head": (spec.n_kda_layers * (a_log_stored - spec.kda_n_head)
                          if a_log_stored is not None else 0),
        "vision tower": c.vision if include_vision else 0,
    }
    parts["total"] = sum(parts.values())
    return parts


def a_log_readings(spec: ArchSpec, a_log_stored: int) -> dict[str, dict[str, int]]:
    """The two public readings of a KDA checkpoint that stores ``a_log_stored`` numbers of
    ``A_log`` per layer (Kimi K3: 128, for 96 heads of key dimension 128), over all KDA layers.

    ``"per head"`` (SGLang's and vLLM's loaders): one decay scale per head, the first
    ``kda_n_head`` stored numbers used.  ``"per key channel"`` (a hypothetical reading): one per
    key channel, shared by every head, so all ``kda_head_dim`` are used; it needs
    ``a_log_stored == kda_head_dim``.  Each reading gives ``"stored"`` (the same for both),
    ``"used"`` and ``"unused"``; :func:`count_params` counts ``"per head"``.
    """
    check_spec(spec)
    if not is_int(a_log_stored) or a_log_stored < max(spec.kda_n_head, spec.kda_head_dim):
        raise ValueError(f"a_log_stored must be an int >= kda_n_head ({spec.kda_n_head}) and "
                         f">= kda_head_dim ({spec.kda_head_dim}), got {a_log_stored!r}")
    stored = spec.n_kda_layers * a_log_stored
    used = {"per head": spec.n_kda_layers * spec.kda_n_head,
            "per key channel": spec.n_kda_layers * spec.kda_head_dim}
    return {name: {"stored": stored, "used": n, "unused": stored - n} for name, n in used.items()}


def packed_bytes_per_weight(bits: int = 4, group_size: int = 32, scale_bits: int = 8) -> float:
    """Bytes one weight takes in a block-scaled format: ``bits / 8`` for the weight plus its
    share of one ``scale_bits`` scale per ``group_size`` weights.  MXFP4 (4-bit weights, one
    8-bit scale per 32, the format of Kimi K3's released routed experts): ``0.5 + 1/32 =
    0.53125``, the same bytes :func:`stored_elements` counts as uint8 elements."""
    if not is_int(bits) or bits not in (1, 2, 4, 8):
        raise ValueError(f"bits must be one of 1, 2, 4, 8, got {bits!r}")
    if not is_int(group_size) or group_size <= 0:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if not is_int(scale_bits) or scale_bits not in (8, 16, 32):
        raise ValueError(f"scale_bits must be one of 8, 16, 32, got {scale_bits!r}")
    return bits / 8 + scale_bits / 8 / group_size


def checkpoint_bytes(spec: ArchSpec, expert_bits: int | None = 4, group_size: int = 32,
                     other_bytes: float = 2, router_bias: bool = True,
                     a_log_stored: int | None = None,
                     include_vision: bool = False) -> dict[str, float]:
    """Bytes of a checkpoint of ``spec`` laid out as :func:`stored_elements` counts it: packed
    routed experts and their scales one byte (uint8) per element, every other element at
    ``other_bytes`` (bf16: 2).  With ``expert_bits=None`` the experts are unpacked, at
    ``other_bytes`` too.

    Returns ``{"routed experts", "other tensors", "total"}``.  Kimi K3's released weights are
    ``checkpoint_bytes(KIMI_K3, 4, 32, 2, a_log_stored=128, include_vision=True)``; the
    dtypes of the small tensors (router biases, norms) are taken to be ``other_bytes``, which
    the public listing does not settle and which moves the total by a few hundred kilobytes.
    """
    check_bytes(other_bytes, "other_bytes")
    check_bool(router_bias, "router_bias")
    check_bool(include_vision, "include_vision")
    e = stored_elements(spec, expert_bits, group_size, router_bias, a_log_stored, include_vision)
    if expert_bits is None:
        experts = count_params(spec).parts["routed experts"] * other_bytes
        others = (e["total"] - count_params(spec).parts["routed experts"]) * other_bytes
    else:
        experts = e["packed experts"] + e["expert scales"]
        others = (e["total"] - e["packed experts"] - e["expert scales"]) * other_bytes
    return {"routed experts": experts, "other tensors": others, "total": experts + others}


def mtp_params(spec: ArchSpec, n_layers: int = 1) -> dict[str, int]:
    """Parameters of ``n_layers`` multi-token-prediction (MTP) modules in DeepSeek-V3's layout
    (its ``config.json``: ``num_nextn_predict_layers``; the checkpoint's last layer).

    Each module is one more decoder layer of ``spec``'s attention and, when ``spec`` is a
    mixture of experts, an MoE block (``"decoder layer"``: attention, feed-forward, its two
    norms), an ``eh_proj`` of ``2d x d`` that joins the embedding of the next token with the
    main model's hidden state (``"eh_proj"``), the norms ``enorm``, ``hnorm`` and
    ``shared_head.norm`` (``"norms"``, ``3d``) and -- shared with the main model, although
    DeepSeek-V3's checkpoint stores a copy in the module -- the token embedding and the
    output head (``"embedding copy"``, ``"head copy"``, ``V d`` each).

    ``"unique"`` sums what is new (DeepSeek's count of an MTP module, without the shared
    embedding and head); ``"with copies"`` adds the two copies, as the checkpoint stores them.
    ``"active"`` is what one token uses of the unique part (``top_k`` of the routed experts).
    A spec's ``count_params`` never includes an MTP module.
    """
    if not isinstance(spec, ArchSpec):
        raise ValueError(f"spec must be an ArchSpec, got {type(spec).__name__}")
    if not is_int(n_layers) or n_layers < 1:
        raise ValueError(f"n_layers must be a positive int, got {n_layers!r}")
    # one more layer of spec's kind: the count of a spec one layer deeper, less the spec's own
    # (the extra layer is the last, so an attention layer and, for an MoE, an MoE block)
    deeper = count_params(spec.with_(n_layer=spec.n_layer + 1))
    base = count_params(spec)
    d, V = spec.n_embd, spec.vocab_size
    layer = deeper.total - base.total - (4 * d if spec.attn_res_block_size else 0)
    layer_active = deeper.active - base.active - (4 * d if spec.attn_res_block_size else 0)
    parts = {"decoder layer": n_layers * layer, "eh_proj": n_layers * 2 * d * d,
             "norms": n_layers * 3 * d, "embedding copy": n_layers * V * d,
             "head copy": n_layers * V * d}
    unique = parts["decoder layer"] + parts["eh_proj"] + parts["norms"]
    active = n_layers * (layer_active + 2 * d * d + 3 * d)
    return {**parts, "unique": unique, "with copies": unique + 2 * n_layers * V * d,
            "active": active}
