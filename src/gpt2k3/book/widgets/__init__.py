"""Live explorers for Jupyter and Colab: ipywidgets controls that recompute anything.

Each function returns an :class:`Explorer` (an ipywidgets box).  They reuse the figure
builders of :mod:`gpt2k3.book.figures`, so the live and static views are the same figure.
In the static web book a kernel is missing, so the notebooks hide these outputs there
and say how to run them.  One module per chapter, all importable from here, listed in
chapter order.
"""

from gpt2k3.book.widgets._explorer import Explorer, explorer

__all__ = ["Explorer", "explorer"]

from gpt2k3.book.widgets.gpt2 import param_explorer  # noqa: E402

__all__ += ["param_explorer"]  # chapter 1

from gpt2k3.book.widgets.kv_cache import cache_explorer  # noqa: E402

__all__ += ["cache_explorer"]  # chapter 2

from gpt2k3.book.widgets.linear import state_explorer, weights_explorer  # noqa: E402

__all__ += ["state_explorer", "weights_explorer"]  # chapter 3

from gpt2k3.book.widgets.delta import chunk_cost_explorer, interference_explorer  # noqa: E402

__all__ += ["interference_explorer", "chunk_cost_explorer"]  # chapters 4 and 5

from gpt2k3.book.widgets.gates import half_life_explorer, hybrid_explorer, retrieval_explorer  # noqa: E402

__all__ += ["half_life_explorer", "retrieval_explorer", "hybrid_explorer"]  # chapter 6

from gpt2k3.book.widgets.mla_moe import moe_explorer, routing_explorer  # noqa: E402

__all__ += ["moe_explorer", "routing_explorer"]  # chapter 7

from gpt2k3.book.widgets.k3_adds import (attn_res_explorer, bounded_decay_explorer,
    latent_moe_explorer, situ_explorer)

__all__ += ["attn_res_explorer", "bounded_decay_explorer", "latent_moe_explorer",
            "situ_explorer"]  # chapter 8

from gpt2k3.book.widgets.balancing import balancing_explorer  # noqa: E402

__all__ += ["balancing_explorer"]  # chapter 8

from gpt2k3.book.widgets.k3 import k3_explorer  # noqa: E402

__all__ += ["k3_explorer"]  # chapter 9

from gpt2k3.book.widgets.recall import train_explorer  # noqa: E402

__all__ += ["train_explorer"]  # chapter 10

from gpt2k3.book.widgets.text import (optimizer_explorer, sample_explorer,  # noqa: E402
    text_results_explorer, text_train_explorer)

__all__ += ["text_results_explorer", "sample_explorer", "text_train_explorer",
            "optimizer_explorer"]  # chapter 11
