"""gpt2k3: the shared implementation behind the book "From GPT-2 to Kimi K3".

One organising idea per folder, from the bottom up:

* :mod:`gpt2k3.checks` -- the one validation module, used at the front doors;
* :mod:`gpt2k3.config` -- the decoder's sizes (:class:`~gpt2k3.config.GPTConfig`);
* :mod:`gpt2k3.cache` -- every cache kind a layer keeps between calls, behind one protocol;
* :mod:`gpt2k3.ops` -- pure ``(B, H, T, D)`` sequence functions, a token-by-token reference
  form beside each fast form;
* :mod:`gpt2k3.layers` -- ``nn.Module`` parts with the checkpoints' names (attention, linear
  attention, DeltaNet and its gated forms, MLA, MLPs, MoE, norms, the short convolution,
  Attention Residuals);
* :mod:`gpt2k3.model` -- the one decoder (:class:`~gpt2k3.model.GPT`, GPT-2 when given no
  parts) and :func:`~gpt2k3.model.generate`;
* :mod:`gpt2k3.models` -- assembly only, one file per architecture (GPT-2, the hybrid, Kimi K3);
* :mod:`gpt2k3.seed` -- the source worklog's snippets, kept with their bugs to be shown;
* :mod:`gpt2k3.accounting` and :mod:`gpt2k3.archs` -- torch-free counting, and the published
  architectures as data;
* :mod:`gpt2k3.experiments` -- what the chapters train and measure;
* :mod:`gpt2k3.book` -- what only the notebooks use: figures, widgets, listings, results.

Lower folders never import higher ones (``tests/test_core.py`` checks it).
"""

__version__ = "0.1.0"
