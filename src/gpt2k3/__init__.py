"""gpt2k3: the shared implementation behind the book "From GPT-2 to Kimi K3".

One module per idea, in reading order: :mod:`gpt2k3.gpt2`, :mod:`gpt2k3.kv_cache`,
:mod:`gpt2k3.mixers`, :mod:`gpt2k3.accounting`, :mod:`gpt2k3.archs`, and the
explorables in :mod:`gpt2k3.figures` (static plotly) and :mod:`gpt2k3.widgets`
(live ipywidgets).
"""

__version__ = "0.1.0"
