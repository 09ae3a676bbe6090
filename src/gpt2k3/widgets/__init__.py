"""Live explorers for Jupyter and Colab: ipywidgets controls that recompute anything.

Each function returns an :class:`Explorer` (an ipywidgets box).  They reuse the figure
builders of :mod:`gpt2k3.figures`, so the live and static views are the same figure.
In the static web book a kernel is missing, so the notebooks hide these outputs there
and say how to run them.  One module per chapter, all importable from here.
"""

from ._explorer import Explorer, explorer
from .gpt2 import param_explorer
from .kv_cache import cache_explorer

__all__ = ["Explorer", "explorer",
           # chapter 1
           "param_explorer",
           # chapter 2
           "cache_explorer"]
from .mla_moe import moe_explorer, routing_explorer

__all__ += ["moe_explorer", "routing_explorer"]  # chapter 7
from .linear import state_explorer, weights_explorer

__all__ += ["state_explorer", "weights_explorer"]  # chapter 3
from .gates import half_life_explorer, hybrid_explorer, retrieval_explorer

__all__ += ["half_life_explorer", "retrieval_explorer", "hybrid_explorer"]  # chapter 6
from .delta import chunk_cost_explorer, interference_explorer

__all__ += ["interference_explorer", "chunk_cost_explorer"]  # chapters 4 and 5
from .k3 import k3_explorer

__all__ += ["k3_explorer"]  # chapter 8
from .recall import train_explorer

__all__ += ["train_explorer"]  # chapter 9
