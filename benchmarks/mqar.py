"""Learned recall (MQAR) on a CPU: every mixer, a sweep of pair counts, several seeds.

    python benchmarks/mqar.py              # the chapter's sweep (15 minutes measured on a busy 2-core CPU)
    python benchmarks/mqar.py --quick      # a smoke run (well under a minute), written to mqar_quick.json

For each mixer (softmax, linear attention, DeltaNet, Gated DeltaNet, KDA) and seed, one tiny
GPT (:mod:`gpt2k3.experiments.recall`) is trained on a mixture of MQAR tasks (:mod:`gpt2k3.experiments.mqar`), one per
number of key-value pairs in ``--pairs``, and scored on held-out sequences of each task at a few
checkpoints. The pair counts run past the head dimension ``D`` (= n_embd / n_head), the number
of keys one head's ``D x D`` state can keep apart exactly.

Writes ``benchmarks/results/mqar.json``: the machine, the full configuration, one row per
(mixer, pairs, seed) with the final accuracy, and per run the loss at every step, the accuracy at
every checkpoint and the wall time. The file is rewritten after every run, so an interrupted sweep
leaves what it finished (``"complete": false``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, write  # noqa: E402

from gpt2k3.experiments.recall import MIXERS, ModelConfig, TrainConfig, sweep_results, train  # noqa: E402
from gpt2k3.experiments.mqar import MQARConfig  # noqa: E402

FULL = dict(pairs=(4, 8, 16, 32), seeds=3, steps=TrainConfig().steps)
QUICK = dict(pairs=(2, 4), seeds=1, steps=40)


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def main(argv=None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a smoke run, written to mqar_quick.json")
    p.add_argument("--mixers", default=",".join(MIXERS), help="comma-separated, from %(default)s")
    p.add_argument("--pairs", type=ints, help=f"numbers of key-value pairs (default {FULL['pairs']})")
    p.add_argument("--seeds", type=int, help=f"seeds 0..N-1 (default {FULL['seeds']})")
    p.add_argument("--steps", type=int, help=f"training steps per run (default {FULL['steps']})")
    p.add_argument("--batch-size", type=int, default=TrainConfig().batch_size)
    p.add_argument("--lr", type=float, default=TrainConfig().lr)
    p.add_argument("--d-model", type=int, default=ModelConfig().n_embd)
    p.add_argument("--n-head", type=int, default=ModelConfig().n_head)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: the models are too small to gain from more, and "
                        "on a busy machine extra threads spin-wait)")
    p.add_argument("--out", default=None, help="results file name (default mqar.json / mqar_quick.json)")
    args = p.parse_args(argv)

    preset = QUICK if args.quick else FULL
    pairs = args.pairs or preset["pairs"]
    seeds = list(range(args.seeds if args.seeds is not None else preset["seeds"]))
    steps = args.steps or preset["steps"]
    mixers = args.mixers.split(",")
    if unknown := [m for m in mixers if m not in MIXERS]:
        p.error(f"unknown mixers {unknown}; choose from {MIXERS}")
    torch.set_num_threads(args.threads)
    name = args.out or ("mqar_quick.json" if args.quick else "mqar.json")

    tasks = [MQARConfig(n_pairs=P, vocab_size=args.vocab) for P in pairs]
    model = ModelConfig(n_embd=args.n_embd, n_head=args.n_head)
    cfg = TrainConfig(steps=steps, batch_size=args.batch_size, lr=args.lr)
    header = {
        "benchmark": "mqar",
        "machine": machine(),
        "quick": args.quick,
        "command": " ".join(["python", "benchmarks/mqar.py", *(argv if argv is not None else sys.argv[1:])]),
    }
    start = time.perf_counter()
    total = len(mixers) * len(seeds)
    results, walls = [], []
    for seed in seeds:  # seed-major: an interrupted sweep still covers every mixer
        for mixer in mixers:
            t0 = time.perf_counter()
            r = train(mixer, tasks, model, cfg, seed=seed, threads=args.threads)
            results.append(r)
            walls.append(time.perf_counter() - t0)
            payload = {**header, **sweep_results(results)}
            payload["config"]["mixers"] = mixers  # the planned ones, in order
            for run, wall in zip(payload["runs"], walls):
                run["wall_seconds"] = wall
            payload["wall_seconds"] = time.perf_counter() - start
            payload["complete"] = len(results) == total
            path = write(name, payload)
            accs = " ".join(f"P={P}:{a:.3f}" for P, a in r.accuracy.items())
            print(f"[{len(results)}/{total}] {mixer:15s} seed {seed}: {accs}  "
                  f"({r.seconds:.1f} s training, {walls[-1]:.1f} s with evaluation)", flush=True)
    print(f"total: {payload['train_seconds']:.0f} s training, {payload['wall_seconds']:.0f} s wall; "
          f"wrote {path}", flush=True)
    return path


if __name__ == "__main__":
    main()
