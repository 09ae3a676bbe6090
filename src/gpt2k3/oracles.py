"""Optional independent checks against Hugging Face ``transformers``.

The book's numbers come from :mod:`gpt2k3.accounting` alone.  A chapter may set an
independent count beside them -- the same architecture built with ``transformers``' own
classes on PyTorch's ``meta`` device, where every parameter has a shape and no storage, so a
trillion-parameter model builds in a moment -- but ``transformers`` is not a dependency of
this package.  Every function here returns its result when ``transformers`` (recent enough to
have the class it needs) is importable, and otherwise returns ``None`` after printing one line
that says what was skipped and how to enable it::

    pip install "gpt2k3[oracles]"

(the ``oracles`` extra: ``transformers``, ``fla-core`` and ``einops``, the libraries the
tests use as independent implementations).  Nothing in a chapter may depend on the value.
"""

from __future__ import annotations

import importlib
import itertools
from typing import Any, Iterable

from gpt2k3.accounting import ArchSpec

__all__ = ["ENABLE", "MIN_TRANSFORMERS", "FLA_READ", "available", "hf_config", "hf_meta_model",
           "hf_param_count", "hf_param_counts"]

#: How to install the optional libraries.
ENABLE = 'pip install "gpt2k3[oracles]"'

#: The oldest ``transformers`` the checks run with (the ``oracles`` extra's lower bound): an
#: older one (Colab's, say) may lack a class or count differently, so it is skipped, not used.
MIN_TRANSFORMERS = "5.24.0"

#: The ``fla-core`` release whose pure-PyTorch references the tests load and the chapters quote
#: (the ``oracles`` extra pins it): named from here, so a chapter runs where it is not installed.
FLA_READ = "0.6.0"

_MODELS = {"GPT2Config": "GPT2LMHeadModel", "DeepseekV3Config": "DeepseekV3ForCausalLM",
           "KimiLinearConfig": "KimiLinearForCausalLM"}


def _skip(what: str, why: str) -> None:
    print(f"Skipped {what}: {why}. To run it: {ENABLE}")


def _version_tuple(version: str) -> tuple[int, ...]:
    """``"5.24.0.dev0"`` -> ``(5, 24, 0)``: the leading numeric release parts."""
    parts = []
    for piece in version.split("."):
        digits = "".join(itertools.takewhile(str.isdigit, piece))
        if not digits:
            break
        parts.append(int(digits))
        if digits != piece:
            break
    return tuple(parts)


def available(module: str = "transformers") -> bool:
    """Whether the optional library ``module`` (``"transformers"``, ``"fla"``) is importable."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _transformers(what: str, *classes: str):
    """The ``transformers`` module if it is importable and has ``classes``; else ``None``
    (after one line saying what was skipped)."""
    try:
        import transformers
    except ImportError:
        _skip(what, "transformers is not installed")
        return None
    if _version_tuple(transformers.__version__) < _version_tuple(MIN_TRANSFORMERS):
        _skip(what, f"transformers {transformers.__version__} is older than {MIN_TRANSFORMERS}, "
                    "the version these checks are tested with")
        return None
    missing = [c for c in classes if not hasattr(transformers, c)]
    if missing:
        _skip(what, f"transformers {transformers.__version__} has no {', '.join(missing)}")
        return None
    return transformers


def _config_args(spec: ArchSpec) -> tuple[str, dict[str, Any]]:
    """The ``transformers`` config class name and keyword arguments for ``spec`` (no import)."""
    if not isinstance(spec, ArchSpec):
        raise ValueError(f"spec must be an ArchSpec, got {type(spec).__name__}")
    if spec.attention == "mha" and spec.mlp == "gelu" and not spec.kda_layers and not spec.is_moe:
        if (spec.norm, spec.position, spec.tied_embeddings, spec.bias, spec.d_head, spec.d_ff) != (
                "layernorm", "learned", True, True, None, None):
            raise ValueError(f"{spec.name}: a GPT-2 config needs LayerNorm with bias, learned "
                             "positions, a tied head and the default head and MLP widths")
        return "GPT2Config", dict(vocab_size=spec.vocab_size, n_positions=spec.max_positions,
                                  n_embd=spec.n_embd, n_layer=spec.n_layer, n_head=spec.n_head)
    if (spec.attention, spec.mlp, spec.norm, spec.bias, spec.tied_embeddings) != (
            "mla", "swiglu", "rmsnorm", False, False):
        raise ValueError(f"{spec.name}: only GPT-2-, DeepSeek-V3- and Kimi-Linear-shaped specs "
                         "have a transformers config here")
    common = dict(vocab_size=spec.vocab_size, hidden_size=spec.n_embd,
                  intermediate_size=spec.ffn_dim,
                  num_hidden_layers=spec.n_layer, num_attention_heads=spec.n_head,
                  num_key_value_heads=spec.n_head, q_lora_rank=spec.q_lora_rank,
                  kv_lora_rank=spec.kv_lora_rank, qk_nope_head_dim=spec.qk_nope_head_dim,
                  qk_rope_head_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_head_dim,
                  tie_word_embeddings=False)
    moe = spec.is_moe
    experts = dict(moe_intermediate_size=spec.d_expert if moe else 1,
                   n_shared_experts=spec.n_shared_experts if moe else 1,
                   first_k_dense_replace=spec.first_k_dense if moe else spec.n_layer)
    if spec.kda_layers:
        if spec.kda_conv_kernel < 1:
            raise ValueError(f"{spec.name}: KimiLinearConfig needs kda_conv_kernel >= 1")
        full = [i + 1 for i in range(spec.n_layer) if i not in spec.kda_layers]
        return "KimiLinearConfig", dict(
            **common, **experts, num_experts=spec.n_routed_experts or 1,
            num_experts_per_token=spec.top_k or 1,
            linear_attn_config={"full_attn_layers": full,
                                "kda_layers": [i + 1 for i in spec.kda_layers],
                                "head_dim": spec.kda_head_dim, "num_heads": spec.kda_n_head,
                                "short_conv_kernel_size": spec.kda_conv_kernel})
    return "DeepseekV3Config", dict(
        **common, **experts, n_routed_experts=spec.n_routed_experts or 1,
        num_experts_per_tok=spec.top_k or 1, n_group=1, topk_group=1,
        max_position_embeddings=spec.max_positions or 4096)


def hf_config(spec: ArchSpec):
    """A Hugging Face ``transformers`` configuration with the shapes of ``spec``, or ``None``
    without ``transformers``.

    Three families are expressible: GPT-2 (``GPT2Config``: MHA, GELU MLP, LayerNorm with biases,
    learned positions, tied head), DeepSeek-V3 (``DeepseekV3Config``: MLA, SwiGLU, RMSNorm, no
    biases, untied head, dense or MoE with one shared-expert width) and Kimi Linear
    (``KimiLinearConfig``: the same with KDA layers).  Anything else raises ``ValueError``
    (with or without ``transformers``).  Only shapes are set; routing constants and RoPE
    settings keep transformers' defaults.
    """
    name, kwargs = _config_args(spec)
    transformers = _transformers(f"the transformers {name} of {spec.name}", name)
    return None if transformers is None else getattr(transformers, name)(**kwargs)


def hf_meta_model(spec: ArchSpec):
    """``spec`` built as a ``transformers`` causal LM on the ``meta`` device (every parameter
    has its shape and no storage, so any size is instant and free), or ``None`` without
    ``transformers``.  See :func:`hf_config`."""
    name, kwargs = _config_args(spec)
    transformers = _transformers(f"building {spec.name} with transformers", name, _MODELS[name])
    if transformers is None:
        return None
    import torch

    config = getattr(transformers, name)(**kwargs)
    with torch.device("meta"):
        return getattr(transformers, _MODELS[name])(config)


def hf_param_counts(specs: Iterable[ArchSpec]) -> list[int] | None:
    """Parameter counts of ``specs`` built with ``transformers`` on the meta device, or
    ``None`` (after one line) without it."""
    specs = list(specs)
    names = [_config_args(s)[0] for s in specs]  # bad specs raise ValueError either way
    needed = sorted({c for n in names for c in (n, _MODELS[n])})
    what = ("the independent parameter count of " + ", ".join(s.name for s in specs)
            + " with transformers' own classes")
    if _transformers(what, *needed) is None:
        return None
    return [sum(p.numel() for p in hf_meta_model(s).parameters()) for s in specs]


def hf_param_count(spec: ArchSpec) -> int | None:
    """:func:`hf_param_counts` of one spec."""
    counts = hf_param_counts([spec])
    return None if counts is None else counts[0]
