"""What Kimi K3 adds, in plain numbers: the torch-free companions of :mod:`gpt2k3.models.k3` that
chapter 8 ("What Kimi K3 adds") computes with -- how many sources each Attention-Residual read
mixes, how large the bounded decay lets a kernel's diagonal block be as one float32 matrix
product, what latent experts cost, and the two factors of SiTU-GLU. K3's constants are read
off :data:`gpt2k3.archs.KIMI_K3_CONFIG`, where the published configuration is transcribed once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpt2k3.accounting.flops import flops_per_token
from gpt2k3.accounting.params import count_params
from gpt2k3.accounting.spec import ArchSpec
from gpt2k3.archs import KIMI_K3_CONFIG
from gpt2k3.checks import check_bool, check_finite_number, check_nonnegative_int, check_positive_int

__all__: list[str] = ["SITU_BETA", "SITU_LINEAR_BETA"]

#: ``activation_situ_beta`` / ``activation_situ_linear_beta`` (SGLang ``SituAndMul``).
SITU_BETA = KIMI_K3_CONFIG["activation_situ_beta"][0]
SITU_LINEAR_BETA = KIMI_K3_CONFIG["activation_situ_linear_beta"][0]


@dataclass(frozen=True)
class AttnResReads:
    """How many sources each Attention-Residual read of an ``n_layer``-layer stack mixes, for
    blocks of ``block_size`` decoder layers (:class:`AttnResidual`'s rule, SGLang's
    ``is_block_write_layer = layer_idx % attn_res_block_size == 0``, which counts decoder
    layers; the Attention Residuals paper's pseudocode counts sub-layers, two per decoder
    layer: :attr:`block_sublayers`).

    ``attn[i]`` and ``mlp[i]``: sources read before layer ``i``'s token mixer and its channel
    mixer (0-based ``i``); ``final``: sources the head's read mixes. The stack has ``n_blocks``
    blocks, the last holding ``last_block`` layers; at the end the bank holds ``n_blocks``
    snapshots (the embedding and the ``n_blocks - 1`` closed blocks) and the last block is the
    running sum.
    """

    n_layer: int
    block_size: int
    attn: tuple[int, ...]
    mlp: tuple[int, ...]
    final: int

    @property
    def n_blocks(self) -> int:
        """Blocks of the stack, ``ceil(n_layer / block_size)``; also the snapshots in the bank
        at the end (the embedding and every block but the last, which stays the running sum)."""
        return -(-self.n_layer // self.block_size)

    @property
    def block_sublayers(self) -> int:
        """The block size in the Attention Residuals paper's counting, which counts sub-layers
        (token mixer and channel mixer, two per decoder layer): ``2 * block_size``."""
        return 2 * self.block_size

    @property
    def full_sublayer_sources(self) -> int:
        """The sources of the head's read in the paper's *Full* Attention Residuals, where every
        sub-layer's output stays a source of its own: the embedding and ``2 n_layer``
        outputs. (``attn_res_reads(n_layer, 1).final``, ``n_layer + 1``, keeps one source per
        decoder layer instead.)"""
        return 2 * self.n_layer + 1

    @property
    def last_block(self) -> int:
        """Layers in the last block (``block_size`` unless ``n_layer`` is not a multiple)."""
        return self.n_layer - (self.n_blocks - 1) * self.block_size

    @property
    def reads(self) -> tuple[int, ...]:
        """Every read in order: layer 0's two, layer 1's two, ..., then the head's."""
        return tuple(n for pair in zip(self.attn, self.mlp) for n in pair) + (self.final,)

    @property
    def sources_read(self) -> int:
        """Sources mixed per token, summed over all ``2 n_layer + 1`` reads."""
        return sum(self.reads)

    @property
    def max_sources(self) -> int:
        """The widest read: the vectors of ``n_embd`` numbers a token must keep at once
        (the bank of snapshots plus the running block sum)."""
        return max(self.reads)

    @property
    def mean_sources(self) -> float:
        return self.sources_read / len(self.reads)


def attn_res_reads(n_layer: int, block_size: int) -> AttnResReads:
    """The sources of every Attention-Residual read (see :class:`AttnResReads`).

    Before layer ``i``'s token mixer: the ``i // S + 1`` snapshots and, unless a block has just
    closed (``i % S == 0``), the running sum of the current block -- ``ceil(i / S) + 1``;
    before its channel mixer ``i // S + 2``; the head ``ceil(n_layer / S) + 1``. Block size 1
    keeps every layer's output apart (the "full" form, ``n_layer + 1`` sources at the end);
    ``block_size >= n_layer`` leaves the embedding and one running sum.
    """
    check_positive_int(n_layer, "n_layer")
    check_positive_int(block_size, "block_size")
    attn = tuple(-(-i // block_size) + 1 for i in range(n_layer))
    mlp = tuple(i // block_size + 2 for i in range(n_layer))
    return AttnResReads(n_layer, block_size, attn, mlp, -(-n_layer // block_size) + 1)


#: fla-core 0.6.0's ``RCP_LN2`` (``fla/ops/utils/constant.py``): 1 / ln 2 as its kernels use it.
FLA_RCP_LN2 = 1.4426950216
#: ``ln`` of the largest float32 (about 88.72): ``exp`` of anything larger is ``inf``.
FLOAT32_MAX_EXP = math.log((2 - 2.0 ** -23) * 2.0 ** 127)  # ln of float32's largest finite value
#: fla-core 0.6.0's KDA chunk (``chunk_kda``: 64 tokens, 32 also allowed) and the sub-chunk it
#: splits each chunk into (``BC = 16``, ``fla/ops/kda/chunk_intra.py``); SGLang 0.5.23 vendors a
#: copy with the same sizes (``kernels/ops/attention/fla/``).
FLA_KDA_CHUNK, FLA_KDA_SUB_CHUNK = 64, 16
#: The shift ``s`` (natural-log units per token) fla's KDA intra-chunk kernel centres a diagonal
#: block with when no bound is handed to it -- the default ``chunk_kda`` uses.
FLA_KDA_GATE_SHIFT = 2.0
#: The float32 exponent (base 2) fla's DPLR kernels allow themselves: 128 minus 4 of headroom
#: (``gate_bound_is_safe``, ``fla/ops/generalized_delta_rule/dplr/chunk.py``).
DPLR_SAFE_EXPONENT = 124


def kda_diagonal_block_exponents(lower_bound: float, sub_chunk: int = FLA_KDA_SUB_CHUNK,
                                 shift: float = FLA_KDA_GATE_SHIFT) -> tuple[float, float]:
    """The largest exponents (natural log) of the two factors fla's KDA kernel splits a diagonal
    sub-chunk block's decays into, for log-decays in ``[lower_bound, 0]``.

    Within a sub-chunk of ``sub_chunk`` tokens, with cumulative log-decays ``G``, the decay
    between query ``i`` and key ``j`` is ``exp(G_i - G_j) = exp(G_i - C) * exp(C - G_j)``; the
    query factor goes into ``q_i``, the key factor into ``k_j``, and the block is one matrix
    product (fla's ``safe_gate``: "M=16 TensorCore acceleration"). fla-core 0.6.0
    (``chunk_kda_fwd_intra``) takes ``C = G_0 - d`` with ``d = (sub_chunk - 1) * shift / 2``, so
    ``exp(G_i - C) <= exp(d)`` and ``exp(C - G_j) <= exp((sub_chunk - 1) |lower_bound| - d)``.
    Returns ``(d, (sub_chunk - 1) |lower_bound| - d)``: ``(15, 60)`` for fla's 16 tokens,
    ``shift`` 2 and K3's -5, the bounds fla's docstring states. Without a floor the key factor
    has no bound at all; the blocks between sub-chunks need none (they factor through the
    sub-chunk boundary, every factor a decay ``<= 1``, as in chapter 6).
    """
    bound = check_finite_number(lower_bound, "lower_bound", -1)
    size = check_positive_int(sub_chunk, "sub_chunk")
    s = check_finite_number(shift, "shift", 1)
    d = (size - 1) * s / 2
    return d, (size - 1) * -bound - d


def kda_diagonal_block_fits_float32(lower_bound: float, sub_chunk: int = FLA_KDA_SUB_CHUNK,
                                    shift: float = FLA_KDA_GATE_SHIFT) -> bool:
    """Whether both factors of :func:`kda_diagonal_block_exponents` stay below the largest
    float32 (``exp`` under :data:`FLOAT32_MAX_EXP`), so a diagonal block of ``sub_chunk`` tokens
    can be one float32 (tensor-core) matrix product. True for fla's 16 tokens at K3's -5
    (``e^60``); false for 32 (``e^124``)."""
    return max(kda_diagonal_block_exponents(lower_bound, sub_chunk, shift)) < FLOAT32_MAX_EXP


def kda_largest_diagonal_block(lower_bound: float, shift: float = FLA_KDA_GATE_SHIFT) -> int:
    """The largest power-of-two sub-chunk :func:`kda_diagonal_block_fits_float32` accepts for
    ``lower_bound`` (16 for K3's -5: fla's ``BC``); at least 1, since a one-token block has no
    decay inside it."""
    check_finite_number(lower_bound, "lower_bound", -1)
    size = 1
    while kda_diagonal_block_fits_float32(lower_bound, 2 * size, shift):
        size *= 2
    return size


def dplr_chunk_is_safe(lower_bound: float, chunk_size: int) -> bool:
    """fla-core 0.6.0's rule for its **DPLR** kernels (``gate_bound_is_safe``,
    ``fla/ops/generalized_delta_rule/dplr/chunk.py``; the generalized delta rule and RWKV-7),
    not its KDA kernels: whether log-decays bounded below by ``lower_bound`` keep a whole
    chunk of ``chunk_size`` tokens, factored around its middle row, inside float32.

    The largest exponent, base 2, is ``(chunk_size // 2 + 1) * |lower_bound| / ln 2``; it must
    not exceed 124. When it holds, those kernels use the centred tensor-core form for the whole
    chunk (64 tokens by default when ``gate_bound_is_safe(lower_bound, 64)``, else 16). KDA's
    kernels instead keep 64-token chunks and centre only 16-token diagonal blocks
    (:func:`kda_diagonal_block_exponents`).
    """
    bound = check_finite_number(lower_bound, "lower_bound", -1)
    size = check_positive_int(chunk_size, "chunk_size")
    return abs(bound) * (size // 2 + 1) * FLA_RCP_LN2 <= DPLR_SAFE_EXPONENT


def dplr_largest_safe_chunk(lower_bound: float) -> int:
    """The largest power-of-two chunk :func:`dplr_chunk_is_safe` accepts for ``lower_bound``
    (32 at -5), or 0 if not even one token is safe. A DPLR quantity, not a KDA one."""
    check_finite_number(lower_bound, "lower_bound", -1)
    if not dplr_chunk_is_safe(lower_bound, 1):
        return 0
    size = 1
    while dplr_chunk_is_safe(lower_bound, 2 * size):
        size *= 2
    return size


@dataclass(frozen=True)
class LatentMoECost:
    """What a spec's MoE costs with its routed experts at width ``latent_dim`` (0: the full
    width ``n_embd``, no projections). Whole model: ``total`` and ``active`` parameters,
    ``matmul_active`` (what a token is multiplied through), ``flops_per_token`` (decode at
    context 0, :func:`gpt2k3.accounting.flops_per_token`). One MoE layer: ``layer_total`` and
    ``layer_active`` (router, latent projections and norm, shared and routed experts)."""

    latent_dim: int
    total: int
    active: int
    matmul_active: int
    flops_per_token: int
    layer_total: int
    layer_active: int


_MOE_PARTS = ("router", "latent projections", "shared experts", "routed experts")


def latent_moe_cost(spec: ArchSpec, latent_dim: int) -> LatentMoECost:
    """:class:`LatentMoECost` of ``spec`` with ``moe_latent_dim = latent_dim`` (everything else
    as in ``spec``; the latent RMSNorm kept if ``spec`` has one and ``latent_dim > 0``)."""

    if not isinstance(spec, ArchSpec):
        raise ValueError(f"spec must be an ArchSpec, got {type(spec).__name__}")
    if not spec.is_moe:
        raise ValueError(f"spec must have routed experts, {spec.name} has none")
    check_nonnegative_int(latent_dim, "latent_dim")
    if latent_dim > spec.n_embd:
        raise ValueError(f"latent_dim ({latent_dim}) must be <= n_embd ({spec.n_embd})")
    s = spec.with_(moe_latent_dim=latent_dim,
                   moe_latent_norm=bool(spec.moe_latent_norm and latent_dim))
    c = count_params(s)
    layers = s.n_moe_layers
    return LatentMoECost(latent_dim=latent_dim, total=c.total, active=c.active,
                         matmul_active=c.matmul_active, flops_per_token=flops_per_token(s, 0),
                         layer_total=sum(c.parts[p] for p in _MOE_PARTS) // layers,
                         layer_active=sum(c.active_parts[p] for p in _MOE_PARTS) // layers)


def latent_moe_break_even(spec: ArchSpec, stored: bool = False) -> float:
    """The latent width ``w*`` below which latent experts beat full-width ones.

    By default (``stored=False``) for the multiplications a token goes through: per MoE layer
    ``2 d w + 3 k w f`` (down and up projections, ``k`` experts of width ``f`` at ``w``) against
    ``3 k d f``, so ``w* = 3 k f d / (3 k f + 2 d)``. With ``stored=True`` for the parameters
    stored: all ``E`` routed experts shrink, and the projections and the latent norm (``w``
    gains, if ``spec.moe_latent_norm``) are stored once per layer, so
    ``w* = 3 E f d / (3 E f + 2 d + [norm])`` -- much closer to ``d``.
    """
    if not isinstance(spec, ArchSpec):
        raise ValueError(f"spec must be an ArchSpec, got {type(spec).__name__}")
    if not spec.is_moe:
        raise ValueError(f"spec must have routed experts, {spec.name} has none")
    check_bool(stored, "stored")
    if stored:
        ef = 3 * spec.n_routed_experts * spec.d_expert
        return ef * spec.n_embd / (ef + 2 * spec.n_embd + (1 if spec.moe_latent_norm else 0))
    kf = 3 * spec.top_k * spec.d_expert
    return kf * spec.n_embd / (kf + 2 * spec.n_embd)


def situ_factors(gate: float, up: float, beta: float = SITU_BETA,
                 linear_beta: float | None = SITU_LINEAR_BETA) -> tuple[float, float]:
    """SiTU-GLU's two factors for plain floats: ``(beta tanh(gate/beta) sigmoid(gate),
    linear_beta tanh(up/linear_beta))`` (``up`` itself when ``linear_beta`` is None); their
    product is :func:`situ_reference`. SwiGLU's factors are ``(silu(gate), up)``."""
    beta = check_finite_number(beta, "beta", 1)
    if linear_beta is not None:
        linear_beta = check_finite_number(linear_beta, "linear_beta", 1)
    for name, value in (("gate", gate), ("up", up)):
        check_finite_number(value, name)
    sigmoid = 1 / (1 + math.exp(-gate)) if gate >= 0 else math.exp(gate) / (1 + math.exp(gate))
    u = up if linear_beta is None else linear_beta * math.tanh(up / linear_beta)
    return beta * math.tanh(gate / beta) * sigmoid, u


def swiglu_reference(gate: float, up: float) -> float:
    """SwiGLU of one pair of plain floats: ``silu(gate) * up = gate sigmoid(gate) up``."""
    for name, value in (("gate", gate), ("up", up)):
        check_finite_number(value, name)
    sigmoid = 1 / (1 + math.exp(-gate)) if gate >= 0 else math.exp(gate) / (1 + math.exp(gate))
    return gate * sigmoid * up


def situ_bound(beta: float = SITU_BETA, linear_beta: float = SITU_LINEAR_BETA) -> float:
    """The least upper bound of ``|situ(gate, up)|``: ``beta * linear_beta`` (approached, never
    reached, as both pre-activations grow; 100 for K3). SwiGLU has none."""
    return check_finite_number(beta, "beta", 1) * check_finite_number(linear_beta, "linear_beta", 1)


__all__ += ["AttnResReads", "attn_res_reads", "FLA_RCP_LN2", "FLOAT32_MAX_EXP",
            "FLA_KDA_CHUNK", "FLA_KDA_SUB_CHUNK", "FLA_KDA_GATE_SHIFT", "DPLR_SAFE_EXPONENT",
            "kda_diagonal_block_exponents", "kda_diagonal_block_fits_float32",
            "kda_largest_diagonal_block", "dplr_chunk_is_safe", "dplr_largest_safe_chunk",
            "LatentMoECost",
            "latent_moe_cost", "latent_moe_break_even", "situ_factors", "swiglu_reference",
            "situ_bound"]


#: Kimi K3's new :class:`~gpt2k3.accounting.ArchSpec` fields (and the two K3 keeps from Kimi
#: Linear, ``mlp`` and ``position``), each with a reader's label, in the chapter's order.
K3_FEATURE_LABELS = {
    "mla_output_gate": "MLA output gate",
    "kda_full_rank_gate": "full-rank KDA output gate",
    "kda_gate_lower_bound": "KDA decay bounded below at",
    "moe_latent_dim": "latent expert width",
    "moe_latent_norm": "RMSNorm on the routed experts' latent sum",
    "attn_res_block_size": "Attention Residuals, block size (decoder layers)",
    "mlp": "gated MLP activation",
    "position": "positional encoding in attention",
}


def k3_feature_rows(*specs: ArchSpec) -> list[list]:
    """One row per entry of :data:`K3_FEATURE_LABELS`: the label, then each spec's value
    (``"—"`` where the field is absent: ``None``, ``False`` or 0, as in every model before K3)."""
    if not specs or any(not isinstance(s, ArchSpec) for s in specs):
        raise ValueError("specs must be one or more ArchSpec values")
    return [[label] + ["—" if getattr(s, name) in (None, False, 0) else getattr(s, name)
                       for s in specs]
            for name, label in K3_FEATURE_LABELS.items()]


__all__ += ["K3_FEATURE_LABELS", "k3_feature_rows"]
