"""Explorable figures for the web book: plotly figures whose sliders work with no kernel.

Every slider step carries its data, computed when the notebook runs, so the static
HTML page can move between them in the browser.  One function per explorable, each
returning a :class:`plotly.graph_objects.Figure`; they live in one module per chapter
and are all importable from here, listed in chapter order.  The shared style is in
:mod:`gpt2k3.book.figures._style` (:func:`style`, :func:`add_slider`), so every figure looks and
behaves alike: labelled axes with units, log scales where a quantity spans decades, hover
text.  The figures compute nothing of their own: every number comes from
:mod:`gpt2k3.accounting`, the experiments of the book's modules or ``benchmarks/results``,
and every number in a label is formatted by :mod:`gpt2k3.book.display`.
"""

from gpt2k3.book.figures._style import PALETTE, Step, add_slider, style

__all__ = ["PALETTE", "Step", "add_slider", "style"]

from gpt2k3.book.figures.gpt2 import decode_waste, decode_waste_counts, param_breakdown  # noqa: E402

__all__ += [  # chapter 1
    "param_breakdown", "decode_waste", "decode_waste_counts"]

from gpt2k3.book.figures.kv_cache import (cache_bound_crossover, cache_growth,
    concat_vs_preallocated, decode_roofline, decode_speed, decode_step_bytes, kv_cache_schematic,
    registered_specs)

__all__ += [  # chapter 2
    "registered_specs", "cache_growth", "decode_step_bytes", "cache_bound_crossover",
    "decode_speed", "decode_roofline", "concat_vs_preallocated", "kv_cache_schematic"]

from gpt2k3.book.figures.linear import (crossover_n, feature_map_weights, feature_map_weights_data,
    first_crossing, generation_totals, measured_crossover, prefill_leak, seed_prefill_leak,
    speedup_rows, state_read_write, state_vs_cache, state_vs_cache_counts)

__all__ += [  # chapter 3
    "prefill_leak", "seed_prefill_leak", "state_vs_cache_counts", "state_vs_cache",
    "feature_map_weights_data", "feature_map_weights", "first_crossing", "crossover_n",
    "generation_totals", "speedup_rows", "measured_crossover", "state_read_write"]

from gpt2k3.book.figures.delta import (chunk_cost, chunkwise_speed, delta_read_write, interference_beta,
    interference_by_position, interference_curves, n_grid, read_erase_write_stages, speed_rows)

__all__ += [  # chapters 4 and 5
    "n_grid", "interference_curves", "interference_by_position", "interference_beta",
    "read_erase_write_stages", "delta_read_write", "chunk_cost", "speed_rows", "chunkwise_speed"]

from gpt2k3.book.figures.gates import (channel_decay, distractor_retrieval, forgetting_by_age,
    hybrid_cache, hybrid_cache_bytes, hybrid_spec, memory_half_life, ratio_label)

__all__ += [  # chapter 6
    "forgetting_by_age", "memory_half_life", "channel_decay", "distractor_retrieval",
    "hybrid_spec", "hybrid_cache_bytes", "hybrid_cache", "ratio_label"]

from gpt2k3.book.figures.mla_moe import (H200_MEMORY_BYTES, PARAM_SPECS, mla_cache,
    mla_cache_variants, moe_balancing, moe_routing, param_components, routing_counts)
from gpt2k3.book.figures.mla_moe import mla_absorption_schematic, routing_schematic  # noqa: E402

__all__ += [  # chapter 7
    "mla_cache", "mla_cache_variants", "moe_routing", "moe_balancing", "routing_counts",
    "param_components", "H200_MEMORY_BYTES", "PARAM_SPECS", "mla_absorption_schematic",
    "routing_schematic"]

from gpt2k3.book.figures.k3_adds import (attn_res_sources, bounded_decay, latent_experts,
    situ_vs_swiglu)

__all__ += [  # chapter 8 (constants: gpt2k3.book.figures.k3_adds)
    "attn_res_sources", "bounded_decay", "latent_experts", "situ_vs_swiglu"]

from gpt2k3.book.figures.k3_adds import quantile_balancing  # noqa: E402

__all__ += ["quantile_balancing"]  # chapter 8

from gpt2k3.book.figures.k3 import (full_attention, k3_batching, k3_dashboard, k3_devices,
    k3_hybrid, k3_params, k3_roofline, kimi_linear_check)
from gpt2k3.book.figures.k3_tables import (claims_rows, hybrid_speedups, plan_rows, summary_rows,
    what_changed_rows, what_changed_table)

__all__ += [  # chapter 9 (constants: gpt2k3.book.figures.k3)
    "k3_params", "k3_hybrid", "k3_batching", "k3_roofline", "k3_devices", "kimi_linear_check",
    "k3_dashboard", "hybrid_speedups", "claims_rows", "what_changed_rows", "what_changed_table",
    "summary_rows", "plan_rows", "full_attention"]

from gpt2k3.book.figures.recall import (recall_accuracy, recall_loss_curves, recall_run,
    recall_summary, recall_table)

__all__ += [  # chapter 10
    "recall_accuracy", "recall_loss_curves", "recall_run", "recall_summary", "recall_table"]

from gpt2k3.book.figures.text import (text_curves, text_memory, text_models_table,
    text_position_loss, text_run, text_samples_html, text_summary, text_table)

__all__ += [  # chapter 11
    "text_summary", "text_table", "text_models_table", "text_curves", "text_position_loss",
    "text_memory", "text_samples_html", "text_run"]

from gpt2k3.book.figures.optimizers import (lr_trial_table, max_logit_curves,  # noqa: E402
    optimizer_curves, optimizer_summary, optimizer_table)

__all__ += [  # chapter 11's optimizer experiment (constants: gpt2k3.book.figures.optimizers)
    "optimizer_summary", "optimizer_table", "lr_trial_table", "optimizer_curves",
    "max_logit_curves"]
