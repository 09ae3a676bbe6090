"""Forward FLOPs of a decode step: ``2 x`` the weights a token is multiplied through, plus the
context-dependent attention term and the KDA state update."""

from __future__ import annotations

from gpt2k3.accounting.params import _count_params
from gpt2k3.accounting.spec import ArchSpec, check_spec
from gpt2k3.checks import check_bool, check_nonnegative_int

__all__ = ["mla_decode_costs", "flops_per_token"]


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
    check_spec(spec)
    if spec.attention != "mla":
        raise ValueError(f"spec.attention must be 'mla', got {spec.attention!r}")
    return _mla_decode_costs(spec)


def _mla_decode_costs(spec: ArchSpec) -> dict[str, dict[str, int]]:
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
    few ``n_embd``-long dot products and sums per sub-layer, against billions) are ignored.
    """
    check_spec(spec)
    check_nonnegative_int(context_len, "context_len")
    check_bool(mla_absorbed, "mla_absorbed")
    return _flops_per_token(spec, context_len, mla_absorbed)


def _flops_per_token(spec: ArchSpec, context_len: int, mla_absorbed: bool) -> int:
    if spec.attention == "mla":
        per_position = _mla_decode_costs(spec)["absorbed" if mla_absorbed else "naive"]["flops"]
    else:
        per_position = 4 * spec.n_head * spec.head_dim
    state = 7 * spec.kda_n_head * spec.kda_head_dim ** 2
    return (2 * _count_params(spec).matmul_active
            + spec.n_attention_layers * per_position * context_len
            + spec.n_kda_layers * state)

