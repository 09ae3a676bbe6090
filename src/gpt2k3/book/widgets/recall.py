"""Chapter 10 (learned recall): train a model yourself, live, and compare it with the sweep."""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import ipywidgets as W

from gpt2k3.book.figures.recall import recall_run
from gpt2k3.book.widgets._explorer import Explorer, explorer
from gpt2k3.experiments import recall
from gpt2k3.experiments.mqar import MQARConfig

__all__ = ["train_explorer", "VARIANTS"]

#: The settings the explorer can switch back, one at a time (see :mod:`gpt2k3.experiments.recall`).
VARIANTS = {
    "as in the sweep": {},
    "no short convolution anywhere": {"conv": "none"},
    "short convolution only in the delta layers": {"conv": "native"},
    "GPT-2's initialisation, N(0, 0.02²)": {"init": "gpt2"},
    "the layers' own forget-gate initialisation": {"gate_init": "layer"},
}


def train_explorer(data: Mapping | None = None) -> Explorer:
    """Pick a mixer, a seed and a training budget; switch on *train* to run it here.

    With the sweep's results (``data``, from ``benchmarks/results/mqar.json``) the run uses the
    sweep's exact settings and stops at one of its checkpoints, so its accuracy can be put next
    to the sweep's for the same run (they agree up to float rounding). Without them it uses the
    defaults of :mod:`gpt2k3.experiments.recall`. ``variant`` switches back one of the settings that make
    the models learn within the budget (:data:`VARIANTS`), to see what each one does. Every
    change retrains while *train* is on: a few seconds per hundred steps for softmax attention,
    several times that for KDA.
    """
    if data is not None:
        tasks, model, config = recall.sweep_config(data)
        checkpoints = [h["step"] for h in data["runs"][0]["history"]] if data.get("runs") else []
        seeds = sorted({r["seed"] for r in data.get("runs", [])}) or [0]
    else:
        tasks = [MQARConfig(n_pairs=P) for P in (4, 8, 16, 32)]
        model, config = recall.ModelConfig(), recall.TrainConfig()
        checkpoints, seeds = [], [0]
    budgets = checkpoints or config.checkpoint_steps()
    style = {"description_width": "initial"}
    mixer = W.Dropdown(options=[(recall.MIXER_LABELS[m], m) for m in recall.MIXERS],
                       value="deltanet", description="mixer", style=style)
    seed = W.Dropdown(options=seeds, value=seeds[0], description="seed", style=style)
    steps = W.SelectionSlider(options=budgets, value=budgets[0], description="training steps",
                              continuous_update=False, style=style)
    variant = W.Dropdown(options=list(VARIANTS), value="as in the sweep", description="variant",
                         style=style)
    train = W.ToggleButton(value=False, description="train", icon="play",
                           tooltip="train with these settings (and again after every change)")

    def render(mixer, seed, steps, variant, train):
        if not train:
            return W.HTML("Choose a mixer, a seed and a budget, then switch on <b>train</b>. "
                          f"Tasks: P = {', '.join(str(t.n_pairs) for t in tasks)} pairs; model: "
                          f"{model.n_layer} layers, n_embd {model.n_embd}, {model.n_head} heads.")
        result = recall.train(mixer, tasks, replace(model, **VARIANTS[variant]), config, seed=seed,
                              until=steps)
        reference = None
        if data is not None and not VARIANTS[variant]:
            try:
                reference = recall.sweep_point(data, mixer, seed, steps)
            except ValueError:
                reference = None
        return recall_run(result, reference)

    return explorer({"mixer": mixer, "seed": seed, "steps": steps, "variant": variant,
                     "train": train}, render,
                    title="Train it yourself: MQAR on this CPU")
