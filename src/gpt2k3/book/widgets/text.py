"""Chapter 11 (does it still write?): the results re-plotted live, the shipped GPT-2 writing,
and a language model trained here.

* :func:`text_results_explorer` -- pick the models and the view (training curves, loss by
  position, cache against quality) and the evaluation length;
* :func:`sample_explorer` -- the small GPT-2 trained in this chapter (shipped with the package,
  :func:`gpt2k3.experiments.checkpoint.load_gpt2`) continues any prompt at any temperature and seed;
* :func:`optimizer_explorer` -- the optimizer experiment (AdamW, Muon, QK-clip) re-plotted:
  validation loss or the largest attention logit, any arms, any seed;
* :func:`text_train_explorer` -- train any model for a few steps on the King James Bible on this
  CPU and put its validation curve next to the recorded run's (needs the ``bible`` program,
  ``apt-get install bible-kjv``).
"""

from __future__ import annotations

import html
from typing import Mapping

import ipywidgets as W

from gpt2k3.book.figures import text as figs
from gpt2k3.book.results import load
from gpt2k3.book.widgets._explorer import Explorer, explorer
from gpt2k3.experiments import checkpoint, text_lm

__all__ = ["text_results_explorer", "sample_explorer", "text_train_explorer", "optimizer_explorer",
           "VIEWS", "OPTIMIZER_VIEWS"]

#: The views of :func:`text_results_explorer`.
VIEWS = ("training curves", "loss by position", "cache against quality")


def _data(data: Mapping | None) -> Mapping:
    return load("text_lm.json") if data is None else data


def _subset(data: Mapping, mixers) -> dict:
    """``data`` with only the runs of ``mixers`` (in the results' order)."""
    mixers = [m for m in data["config"]["mixers"] if m in set(mixers)]
    if not mixers:
        raise ValueError("choose at least one model")
    return {**data, "config": {**data["config"], "mixers": mixers},
            "runs": [r for r in data["runs"] if r["mixer"] in mixers]}


def text_results_explorer(data: Mapping | None = None) -> Explorer:
    """The chapter's three figures over any subset of the models: *view* picks the figure,
    *models* the lines (ctrl/shift-click for several), *length* the evaluation length of the
    loss-by-position and cache views. ``data`` defaults to ``text_lm.json``."""
    data = _data(data)
    config = data["config"]
    lengths = list(config["lengths"])
    style = {"description_width": "initial"}
    view = W.Dropdown(options=list(VIEWS), value=VIEWS[1], description="view", style=style)
    models = W.SelectMultiple(options=[(figs._label(config, m), m) for m in config["mixers"]],
                              value=tuple(config["mixers"]), description="models", rows=8,
                              style=style)
    length = W.Dropdown(options=[(f"{n:,}", i) for i, n in enumerate(lengths)], value=0,
                        description="length", style=style)

    def render(view, models, length):
        sub = _subset(data, models)
        if view == "training curves":
            return figs.text_curves(sub)
        if view == "loss by position":
            return figs.text_position_loss(sub, active=length)
        if view == "cache against quality":
            return figs.text_memory(sub, active=length)
        raise ValueError(f"view must be one of {VIEWS}, got {view!r}")

    return explorer({"view": view, "models": models, "length": length}, render,
                    title="The language-model results, your way")


_MODEL = {}


def sample_explorer(data: Mapping | None = None) -> Explorer:
    """Continue a prompt with the chapter's small GPT-2 (:func:`gpt2k3.experiments.checkpoint.load_gpt2`).

    *temperature* 0 is greedy; the same prompt, temperature and seed always give the same text
    (:func:`gpt2k3.experiments.text_lm.sample`). With ``data`` the controls start at the recorded sample's
    settings, so the first text shown is the one in the results file.
    """
    s = dict(_data(data)["config"]["sample"]) if data is not None else dict(
        prompt="And it came to pass, when ", max_new_tokens=230, temperature=0.8, seed=0)
    style = {"description_width": "initial"}
    prompt = W.Text(value=s["prompt"], description="prompt", continuous_update=False, style=style)
    temperature = W.FloatSlider(value=s["temperature"], min=0.0, max=1.5, step=0.05,
                                description="temperature", continuous_update=False, style=style)
    seed = W.BoundedIntText(value=s["seed"], min=0, max=2**31 - 1, description="seed", style=style)
    length = W.IntSlider(value=min(s["max_new_tokens"], 200), min=20, max=500, step=20,
                         description="bytes", continuous_update=False, style=style)

    def render(prompt, temperature, seed, length):
        if "gpt2" not in _MODEL:
            _MODEL["gpt2"] = checkpoint.load_gpt2()
        model = _MODEL["gpt2"]
        room = model.config.block_size - len(prompt.encode("utf-8"))
        if room < 1:
            raise ValueError(f"the prompt must be shorter than {model.config.block_size} bytes")
        out = text_lm.sample(model, prompt, min(length, room), temperature=temperature, seed=seed)
        return W.HTML(f'<pre style="white-space:pre-wrap"><b>{html.escape(out.prompt)}</b>'
                      f'{html.escape(out.text)}</pre>')

    return explorer({"prompt": prompt, "temperature": temperature, "seed": seed,
                     "length": length}, render, title="The chapter's GPT-2 writes")


def text_train_explorer(data: Mapping | None = None) -> Explorer:
    """Train a model on the King James Bible here, for a budget of steps of the recorded run.

    With the results (``data``) the run uses their exact settings and stops after the chosen
    number of steps, so its validation points can be put next to the recorded run's (they
    agree up to float rounding). Needs the ``bible`` program; without it the explorer says how
    to install it. Roughly 0.2 s per step for GPT-2 on one core, two to three times that for
    KDA and the tiny K3.
    """
    data = _data(data)
    config = data["config"]
    model = text_lm.TextModelConfig(**config["model"])
    train_cfg = text_lm.TextTrainConfig(**config["train"])
    budgets = [s for s in train_cfg.curve_steps() if s > 0]
    style = {"description_width": "initial"}
    mixer = W.Dropdown(options=[(figs._label(config, m), m) for m in config["mixers"]],
                       value=config["mixers"][0], description="model", style=style)
    seed = W.Dropdown(options=list(config["seeds"]), value=config["seeds"][0], description="seed",
                      style=style)
    steps = W.SelectionSlider(options=budgets, value=budgets[0], description="training steps",
                              continuous_update=False, style=style)
    train = W.ToggleButton(value=False, description="train", icon="play",
                           tooltip="train with these settings (and again after every change)")
    corpus = {}

    def render(mixer, seed, steps, train):
        if not train:
            return W.HTML("Choose a model, a seed and a budget, then switch on <b>train</b>. "
                          f"Model: {model.n_layer} layers, width {model.n_embd}, context "
                          f"{model.context} bytes; batch {train_cfg.batch_size}.")
        if "data" not in corpus:
            from gpt2k3.experiments.corpus import kjv_data
            corpus["data"] = kjv_data()
        run = text_lm.train(mixer, corpus["data"], model, train_cfg, seed=seed, until=steps,
                            final_eval=False)
        reference = next((r for r in data["runs"] if r["mixer"] == mixer and r["seed"] == seed),
                         None)
        return figs.text_run(run, reference)

    return explorer({"mixer": mixer, "seed": seed, "steps": steps, "train": train}, render,
                    title="Train it yourself: a byte-level language model on this CPU")


#: The views of :func:`optimizer_explorer`.
OPTIMIZER_VIEWS = ("validation loss", "largest attention logit")


def optimizer_explorer(data: Mapping | None = None) -> Explorer:
    """The optimizer experiment's two figures over any subset of its arms: *view* picks the
    figure, *arms* the lines, *showing* the seed (or the seeds' mean, or for the logits their
    largest). ``data`` defaults to ``optimizers.json``."""
    from gpt2k3.book.figures import optimizers as ofigs

    data = load("optimizers.json") if data is None else data
    seeds = ofigs.arm_runs(data)[ofigs.ARMS[0]]
    style = {"description_width": "initial"}
    view = W.Dropdown(options=list(OPTIMIZER_VIEWS), value=OPTIMIZER_VIEWS[0], description="view",
                      style=style)
    arms = W.SelectMultiple(options=[(ofigs.ARM_LABELS[a], a) for a in ofigs.ARMS],
                            value=ofigs.ARMS, description="arms", rows=4, style=style)
    showing = W.Dropdown(options=[("all seeds (mean, or largest)", 0)]
                         + [(f"seed {r['seed']}", i + 1) for i, r in enumerate(seeds)],
                         value=0, description="showing", style=style)

    def render(view, arms, showing):
        if view == OPTIMIZER_VIEWS[0]:
            return ofigs.optimizer_curves(data, arms, active=showing)
        if view == OPTIMIZER_VIEWS[1]:
            return ofigs.max_logit_curves(data, arms, active=showing)
        raise ValueError(f"view must be one of {OPTIMIZER_VIEWS}, got {view!r}")

    return explorer({"view": view, "arms": arms, "showing": showing}, render,
                    title="AdamW, Muon and QK-clip, your way")
