"""The book's own compute multiplier (chapter 11): how much more compute the GPT-2 baseline
needs to reach the tiny Kimi K3's validation loss.

    nohup python benchmarks/compute_multiplier.py > cm.log 2>&1 &   # start once per core
    python benchmarks/compute_multiplier.py --summarise               # rebuild the summary only

Kimi K3's report states its gain over Kimi K2 as compute to reach a loss (about 2.5x, §3.2).
This benchmark asks the same question at chapter 11's scale. GPT-2 with the fan-in start
(``gpt2_fan_in``, chapter 11's chosen peak rate) trains at budgets of 2x, 4x and 8x chapter
11's bytes, two seeds each; its 1x runs and the tiny K3's 1x runs (the target) are read from
``text_lm_tuned.json``, which trained them under the same protocol. Each longer budget keeps the
protocol and scales the schedule with it: the same peak rate, warm-up the same tenth of the steps,
cosine decay to the end.

The multiplier is the compute at which GPT-2's validation bits per byte, interpolated linearly
in log compute between budgets, reach the tiny K3's mean at 1x, over the tiny K3's compute at 1x
(:func:`gpt2k3.experiments.compute.multiplier`). Its band comes from the seeds: the per-budget
best and worst GPT-2 seeds against the target's worst and best seed. If GPT-2 does not reach the
target within the largest budget, ``multiplier`` is ``None`` and ``lower_bound`` is that
budget's ratio. Compute is counted in FLOPs (:func:`gpt2k3.experiments.compute.train_flops_per_byte`:
``6 N`` per byte plus attention and state products) and in bytes.

Resumable and shared by workers like ``text_lm.py``: each finished run is written at once.
Writes ``benchmarks/results/compute_multiplier.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, machine  # noqa: E402
from text_lm import (_now, live_claims, locked, provenance, timed, write_atomically,  # noqa: E402
                     write_claims)

from gpt2k3.experiments import compute, corpus, text_lm  # noqa: E402
from gpt2k3.experiments.text_lm import TextModelConfig, TextTrainConfig  # noqa: E402

OUT = RESULTS / "compute_multiplier.json"
SOURCE = RESULTS / "text_lm_tuned.json"
BASELINE, TARGET = "gpt2_fan_in", "k3"
MULTIPLES = (2, 4, 8)
SEEDS = (0, 1)


def budget_config(base: TextTrainConfig, multiple: int) -> TextTrainConfig:
    """Chapter 11's training settings at ``multiple`` times its steps: the warm-up and the
    validation curve scale with them, every other setting stays."""
    return replace(base, steps=base.steps * multiple, warmup=base.warmup * multiple,
                   eval_every=base.eval_every * multiple)


def source_runs(tuned: dict) -> list[dict]:
    """The 1x runs of the baseline and the target, as this file records runs."""
    return [{"model": r["mixer"], "seed": r["seed"], "multiple": 1, "lr": r["lr"],
             "tokens": r["tokens"], "val_bits": r["val_bits"], "curve": r["curve"],
             "from": SOURCE.name, "wall_seconds": r["wall_seconds"]}
            for r in tuned["runs"] if r["mixer"] in (BASELINE, TARGET)]


def summarise(runs: list[dict], tuned: dict) -> dict:
    model = TextModelConfig(**tuned["config"]["model"])
    per_byte = {m: compute.train_flops_per_byte(text_lm.build_model(m, model, 0), model.context)
                for m in (BASELINE, TARGET)}
    rows = [{**r, "compute": r["tokens"] * per_byte[r["model"]]} for r in runs]
    base = [r for r in rows if r["model"] == BASELINE]
    target = [r for r in rows if r["model"] == TARGET and r["multiple"] == 1]
    found = compute.multiplier(base, target) if target and base else None
    return {"flops_per_byte": per_byte, "runs": rows, **(found or {})}


def main(argv=None) -> Path:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--summarise", action="store_true", help="only rebuild the summary (seconds)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    path = Path(args.out)
    torch.set_num_threads(args.threads)
    tuned = json.loads(SOURCE.read_text())
    base_train = TextTrainConfig(**tuned["config"]["train"])
    lr = tuned["lr_choice"][BASELINE]["lr"]
    model = TextModelConfig(**tuned["config"]["model"])
    head = {"benchmark": "compute_multiplier", "baseline": BASELINE, "target": TARGET,
            "command": "python benchmarks/compute_multiplier.py",
            "machine": {**machine(), "shared": "a shared 2-core machine: wall times are upper bounds"},
            "config": {"multiples": [1, *MULTIPLES], "seeds": list(SEEDS), "lr": lr,
                       "model": asdict(model), "train": asdict(base_train),
                       "source": SOURCE.name,
                       "schedule": "each budget: the same peak rate, warm-up a tenth of the steps, "
                                   "cosine decay to the end of the budget"}}

    def stored() -> list[dict]:
        return json.loads(path.read_text()).get("trained", []) if path.exists() else []

    def save(trained: list[dict]) -> None:
        jobs_left = [(m, s) for m in MULTIPLES for s in SEEDS
                     if not any((r["multiple"], r["seed"]) == (m, s) for r in trained)]
        write_atomically(path, {**head, "trained": trained,
                                **summarise(source_runs(tuned) + trained, tuned),
                                "complete": not jobs_left,
                                "wall_seconds": round(sum(r["wall_seconds"] for r in trained), 1)})

    if args.summarise:
        with locked(path):
            save(stored())
        print(f"wrote {path}")
        return path

    data = corpus.kjv_data()
    jobs = [(m, s) for s in SEEDS for m in MULTIPLES]  # seed 0 at every budget first
    while True:
        with locked(path):
            trained = stored()
            claims = live_claims(path)
            todo = [j for j in jobs if not any((r["multiple"], r["seed"]) == j for r in trained)]
            free = [j for j in todo if repr(j) not in claims]
            if free:
                job = free[-1] if len(claims) % 2 else free[0]  # a second worker starts at the long end
                claims[repr(job)] = {"pid": os.getpid(), "host": platform.node(), "started": _now()}
            write_claims(path, claims)
        if not free:
            break
        multiple, seed = job
        cfg = replace(budget_config(base_train, multiple), lr=lr)
        run, where = timed(lambda: text_lm.train(BASELINE, (data.train, data.validation), model,
                                                 cfg, seed=seed, threads=None))
        record = {"model": BASELINE, "seed": seed, "multiple": multiple, "lr": lr,
                  "tokens": run.tokens, "val_bits": text_lm._round(run.val_bits),
                  "curve": [{"step": s, "bits": text_lm._round(b)} for s, b in run.curve],
                  "train_seconds": round(run.train_seconds, 1),
                  "wall_seconds": where["wall_seconds"], "machine": where}
        with locked(path):
            trained = [r for r in stored() if (r["multiple"], r["seed"]) != job] + [record]
            save(sorted(trained, key=lambda r: (r["multiple"], r["seed"])))
            claims = live_claims(path)
            claims.pop(repr(job), None)
            write_claims(path, claims)
        print(f"{multiple}x seed {seed}: {record['val_bits']} bits/byte, "
              f"{where['wall_seconds']:.0f} s", flush=True)
    with locked(path):
        save(stored())
    print(f"done; wrote {path}", flush=True)
    return path


if __name__ == "__main__":
    main()
