"""Published architectures as data (:class:`gpt2k3.accounting.ArchSpec` values).

Each spec carries its ``source``.  The GPT-2 sizes are those of OpenAI's released
checkpoints (Radford et al., 2019; the ``config.json`` files of the ``gpt2``,
``gpt2-medium``, ``gpt2-large`` and ``gpt2-xl`` checkpoints): vocabulary 50,257,
1,024 learned positions, LayerNorm with bias, head tied to the token embedding.
"""

from __future__ import annotations

from .accounting import ArchSpec

__all__ = ["GPT2_SMALL", "GPT2_MEDIUM", "GPT2_LARGE", "GPT2_XL", "GPT2_FAMILY", "K3_TOTAL_PARAMS",
           "spec_from_gpt_config"]

_GPT2_SOURCE = ("Radford et al. 2019, 'Language Models are Unsupervised Multitask Learners'; "
                "sizes from the released checkpoints' config.json")


def _gpt2(name: str, n_layer: int, n_head: int, d_model: int) -> ArchSpec:
    return ArchSpec(name=name, vocab_size=50257, n_layer=n_layer, d_model=d_model, n_head=n_head,
                    max_positions=1024, bias=True, norm="layernorm", tied_embeddings=True,
                    source=_GPT2_SOURCE)


GPT2_SMALL = _gpt2("GPT-2 small", 12, 12, 768)
GPT2_MEDIUM = _gpt2("GPT-2 medium", 24, 16, 1024)
GPT2_LARGE = _gpt2("GPT-2 large", 36, 20, 1280)
GPT2_XL = _gpt2("GPT-2 XL", 48, 25, 1600)
GPT2_FAMILY = (GPT2_SMALL, GPT2_MEDIUM, GPT2_LARGE, GPT2_XL)

#: The headline size of the Kimi-K3-scale model the book ends with (about 2.8
#: trillion parameters; the full configuration arrives with chapter 8).
K3_TOTAL_PARAMS = 2.8e12


def spec_from_gpt_config(config, name: str = "custom") -> ArchSpec:
    """The :class:`ArchSpec` of a :class:`gpt2k3.gpt2.GPTConfig` (to count a model we can build)."""
    return ArchSpec(name=name, vocab_size=config.vocab_size, n_layer=config.n_layer,
                    d_model=config.n_embd, n_head=config.n_head, max_positions=config.block_size,
                    bias=config.bias, norm="layernorm", tied_embeddings=True)
