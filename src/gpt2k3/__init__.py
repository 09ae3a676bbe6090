"""gpt2k3: the shared implementation behind the book "From GPT-2 to Kimi K3".

One module per idea, in reading order: :mod:`gpt2k3.model`, :mod:`gpt2k3.cache`,
:mod:`gpt2k3.ops`, :mod:`gpt2k3.accounting`, :mod:`gpt2k3.archs`, and the
explorables in :mod:`gpt2k3.book.figures` (static plotly) and :mod:`gpt2k3.book.widgets`
(live ipywidgets).
"""

__version__ = "0.1.0"
