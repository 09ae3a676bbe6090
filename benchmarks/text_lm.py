"""Every token mixer trained as a byte-level language model on the King James Bible (chapter 11).

    nice -n 19 python benchmarks/text_lm.py      # the chapter's run (about 30 minutes on a busy 2-core CPU)
    python benchmarks/text_lm.py --quick         # a smoke run (about a minute), written to text_lm_quick.json
    nice -n 19 python benchmarks/text_lm.py --mixers k3 --update   # rerun one model after its code changed

For each model of :data:`gpt2k3.experiments.text_lm.MIXERS` (GPT-2, softmax and linear attention behind a
short convolution, DeltaNet, Gated DeltaNet, KDA, the 3:1 KDA:softmax hybrid, the tiny Kimi K3) and each seed, one
small decoder at GPT-2's parameter count is trained on the same number of bytes of the
training books and scored on the held-out books (:mod:`gpt2k3.experiments.corpus`): validation bits per byte
at the training length and at 4x and 8x of it, per position, the cache it keeps per sequence,
its training throughput, and a sample written with a seeded generator.

Writes ``benchmarks/results/text_lm.json`` (rewritten after every run, so an interrupted run
leaves what it finished, ``"complete": false``) and, from the GPT-2 run of seed 0, the shipped
checkpoint ``src/gpt2k3/checkpoints/text_gpt2.pt`` (not in a quick run). Run
``python scripts/sync_results.py`` afterwards. The corpus comes from Debian's ``bible`` program
(``apt-get install bible-kjv``; ``scripts/setup_env.sh`` installs it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, machine, write  # noqa: E402

from gpt2k3.experiments import checkpoint, corpus, text_lm  # noqa: E402
from gpt2k3.experiments.text_lm import MIXERS, TextModelConfig, TextTrainConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = ROOT / "src" / "gpt2k3" / "checkpoints" / checkpoint.CHECKPOINT
SAMPLE = dict(prompt="And it came to pass, when ", max_new_tokens=230, temperature=0.8, seed=0)
FULL = dict(seeds=2, steps=TextTrainConfig().steps)
QUICK = dict(seeds=1, steps=6)


def main(argv=None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a smoke run, written to text_lm_quick.json")
    p.add_argument("--mixers", default=",".join(MIXERS), help="comma-separated, from %(default)s")
    p.add_argument("--seeds", type=int, help=f"seeds 0..N-1 (default {FULL['seeds']})")
    p.add_argument("--steps", type=int, help=f"training steps per run (default {FULL['steps']})")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: as fast for models this small, and on a shared "
                        "machine a second thread spin-waits)")
    p.add_argument("--out", default=None, help="results file name (default text_lm.json / text_lm_quick.json)")
    p.add_argument("--baselines", action="store_true",
                   help="only (re)compute the n-gram tables on the evaluation bytes into the "
                        "results file (seconds; no training)")
    p.add_argument("--update", action="store_true",
                   help="rerun only --mixers and replace their runs in the existing results file "
                        "(its other runs, settings and machine are kept; the settings must match)")
    args = p.parse_args(argv)

    preset = QUICK if args.quick else FULL
    seeds = list(range(args.seeds if args.seeds is not None else preset["seeds"]))
    steps = args.steps or preset["steps"]
    mixers = args.mixers.split(",")
    if unknown := [m for m in mixers if m not in MIXERS]:
        p.error(f"unknown mixers {unknown}; choose from {MIXERS}")
    torch.set_num_threads(args.threads)
    name = args.out or ("text_lm_quick.json" if args.quick else "text_lm.json")
    model = TextModelConfig()
    cfg = TextTrainConfig(steps=steps) if not args.quick else TextTrainConfig(
        steps=steps, eval_every=3, curve_windows=2, eval_windows=1, warmup=2)
    sample_args = SAMPLE

    data = corpus.kjv_data()
    if args.baselines:  # the n-gram tables on the models' evaluation bytes, stored for the chapter
        results = json.loads((RESULTS / name).read_text())
        ranges = {"inside": (model.context // 2, model.context),
                  "beyond": (model.max_context // 2, model.max_context)}
        results["eval_baselines"] = {
            **text_lm.eval_ngram_baselines(data, model, TextTrainConfig(**results["config"]["train"]),
                                           ranges),
            "ranges": {k: list(v) for k, v in ranges.items()}}
        path = write(name, results)
        print(f"wrote eval_baselines into {path}")
        return path
    bins = {n: text_lm.position_bins(n) for n in model.lengths}
    try:
        niceness = os.nice(0)
    except OSError:
        niceness = None
    header = {
        "benchmark": "text_lm",
        "machine": {**machine(), "niceness": niceness,
                    "shared": "run under `nice -n 19` on a 2-core machine that other jobs were "
                              "using at the same time: tokens/s are lower bounds"},
        "quick": args.quick,
        "command": " ".join(["python", "benchmarks/text_lm.py", *(argv if argv is not None else sys.argv[1:])]),
        "corpus": {
            "name": "King James Bible (1611; Debian package bible-kjv, program `bible "
                    f"\"{corpus.KJV_RANGE}\"`)",
            "license": "public domain: the translation's copyright has expired "
                       "(/usr/share/doc/bible-kjv/copyright)",
            "documents": "the 66 books; verse text one verse per line, verse numbers and chapter "
                         "headings removed",
            **corpus.corpus_stats(data.split)},
        "config": {"mixers": mixers, "labels": {m: text_lm.MIXER_LABELS[m] for m in mixers},
                   "seeds": seeds, "model": asdict(model), "lengths": list(model.lengths),
                   "train": asdict(cfg), "curve_steps": cfg.curve_steps(),
                   "tokens_per_run": cfg.steps * cfg.batch_size * model.context,
                   "bins": {str(n): b for n, b in bins.items()}, "sample": sample_args,
                   "reference": text_lm.REFERENCE,
                   "learned_positions": list(text_lm.LEARNED_POSITIONS),
                   "matching": "total parameters matched to GPT-2's (4 d MLP) by the MLP width of "
                               "every other model (the experts' and then the dense layer's width "
                               "for the tiny K3)"},
    }
    models = {}
    for m in mixers:
        net = text_lm.build_model(m, model, 0)
        models[m] = {"sizes": text_lm.matched_sizes(m, model), "params": text_lm.param_counts(net),
                     "position": net.config.position, "block_size": net.config.block_size,
                     "caches": list(net.new_cache(1, model.context).kinds)}
    header["models"] = models
    # what knowing only the last 0, 1 or 2 bytes is worth on the same validation books
    baselines = {name: round(corpus.ngram_bits(data.train, data.validation, n), 4)
                 for n, name in ((1, "unigram"), (2, "bigram"), (3, "trigram"))}
    header["baselines"] = baselines

    kept, checkpoint, wall_before = [], None, 0.0
    if args.update:  # keep the other models' runs; record what was rerun, when and where
        old = json.loads((RESULTS / name).read_text())
        for key in ("model", "train", "seeds", "sample"):
            if old["config"][key] != header["config"][key]:
                p.error(f"--update: the results' {key} settings differ from this run's")
        kept = [r for r in old["runs"] if r["mixer"] not in mixers]
        checkpoint = old.get("checkpoint") if text_lm.REFERENCE not in mixers else None
        wall_before = old.get("wall_seconds", 0.0)
        updates = old.get("updates", []) + [{"mixers": mixers, "machine": header["machine"],
                                             "command": header["command"]}]
        header = {**{k: v for k, v in old.items() if k not in ("runs", "checkpoint", "complete")},
                  "models": {**old["models"], **models}, "updates": updates,
                  "baselines": baselines}
    order = {m: i for i, m in enumerate(header["config"]["mixers"])}

    start = time.perf_counter()
    total = len(mixers) * len(seeds)
    records, walls = [], []
    for seed in seeds:  # seed-major: an interrupted run still covers every mixer
        for m in mixers:
            t0 = time.perf_counter()
            run = text_lm.train(m, data, model, cfg, seed=seed, threads=args.threads,
                                sample_args=sample_args)
            walls.append(time.perf_counter() - t0)
            record = text_lm.run_record(run, bins)
            record["wall_seconds"] = round(walls[-1], 1)
            records.append(record)
            if m == text_lm.REFERENCE and seed == 0 and not args.quick:
                CHECKPOINT.parent.mkdir(parents=True, exist_ok=True)
                sha = checkpoint.save_checkpoint(run.model, CHECKPOINT, mixer=m, meta={
                    "seed": seed, "corpus": "King James Bible (bible-kjv), byte level",
                    "val_bits": record["val_bits"], "tokens": run.tokens})
                # the chapter-1 check: the shipped weights, reloaded, write this sample
                again = text_lm.sample(checkpoint.load_checkpoint(CHECKPOINT)[0], **sample_args)
                if again.ids != run.sample.ids:
                    raise SystemExit("the reloaded checkpoint writes another sample")
                checkpoint = {"file": f"src/gpt2k3/checkpoints/{checkpoint.CHECKPOINT}",
                              "sha256": sha, "bytes": CHECKPOINT.stat().st_size,
                              "mixer": m, "seed": seed, "dtype": "float32",
                              "sample": record["sample"]}
            runs = sorted(kept + records, key=lambda r: (r["seed"], order[r["mixer"]]))
            payload = {**header, "runs": runs, "checkpoint": checkpoint,
                       "train_seconds": round(sum(r["train_seconds"] for r in runs), 1),
                       "wall_seconds": round(wall_before + time.perf_counter() - start, 1),
                       "complete": {(r["mixer"], r["seed"]) for r in runs}
                       == {(m, sd) for m in header["config"]["mixers"] for sd in header["config"]["seeds"]}}
            path = write(name, payload)
            lengths = " ".join(f"{k}:{v}" for k, v in record["length_bits"].items())
            print(f"[{len(records)}/{total}] {m:15s} seed {seed}: {record['val_bits']} bits/byte "
                  f"({lengths}); {record['tokens_per_second']:.0f} tokens/s; "
                  f"{walls[-1]:.0f} s", flush=True)
    print(f"total: {payload['train_seconds']:.0f} s training, {payload['wall_seconds']:.0f} s wall; "
          f"wrote {path}", flush=True)
    return path


if __name__ == "__main__":
    main()
