"""Every token mixer trained as a byte-level language model on the King James Bible (chapter 11).

    nohup nice -n 10 python benchmarks/text_lm.py --threads 1 > text_lm.log 2>&1 &   # the chapter's run
                                                    # (start it once per core: workers share the file)
    python benchmarks/text_lm.py --preset quick      # a smoke run (minutes), written to text_lm_quick.json
    python benchmarks/text_lm.py --preset short      # the earlier 300-step run (text_lm.json)
    python benchmarks/text_lm.py --save W --ship gpt2_fan_in:1  # ship that run's kept weights
    python benchmarks/text_lm.py --preset plateau    # GPT-2's plateau: what shortens it (text_lm_plateau.json)

For each model of :data:`gpt2k3.experiments.text_lm.MIXERS` (GPT-2 as published and started at
``N(0, 1/fan_in)``, Transformer++, softmax and
linear attention behind a short convolution, DeltaNet, Gated DeltaNet, KDA, the 3:1 KDA:softmax
hybrid, the tiny Kimi K3) and each seed, one small decoder at GPT-2's parameter count is trained
on the same number of bytes of the training books and scored on the held-out books
(:mod:`gpt2k3.experiments.corpus`): validation bits per byte at the training length and at 4x and
8x of it, per position, the cache it keeps per sequence, its training throughput, a sample
written with a seeded generator, and the repeat test (:func:`gpt2k3.experiments.text_lm.repeat_bits`:
the loss on stretches of held-out text the second time they occur within a window, against the
first time).

**The learning-rate rule** (preset ``chapter``): every model gets the best of three peak learning
rates, each tried once on seed 0 with the full budget, judged by the validation bits per byte
at the training length that the run reports (a tie goes to the lower rate); while the best is
the highest (lowest) rate tried, the next rate of the 1-3-10 grid above (below) it is tried too
(:func:`next_rate`), so the chosen rate always has a worse one on either side. That run is the model's seed
0; seeds 1 and 2 train at the chosen rate. (A shorter trial would mislead: GPT-2 sits on its
plateau for about a million bytes, longer than a quarter of the budget.)

**Resumable, and shared by workers.** Every finished run is written to the results file at once
(atomically: a kill never leaves half a file), and a restart reads the file, keeps every finished
run and trains only the missing ones, so the benchmark can span several sittings. Several
processes may work on one file at once (one per core): each takes the next run that no live
process has claimed, under a lock on the file, and merges what it finished with what the others
wrote. A restart with other settings
is refused (move the file away, or ``--redo`` some models). Each run records the machine, the
commit and the uncommitted files of ``src/`` and ``benchmarks/``, its start and end times, its
wall time and the load average (``os.getloadavg``) before and after it.

**GPT-2's plateau** (preset ``plateau``): GPT-2 of seed 0 at the earlier budget of 300 steps as
published and with one change each (another initialisation, an untied head, a sinusoidal start
of the position table, no warm-up, a lower and a higher learning rate), and for the chapter
preset's 1,200 steps as published, with the other initialisation, with the sinusoidal start, with
no warm-up and with the short run's 30 warm-up steps (its rate trials give the other learning
rates at that budget); at every point of the validation curve it records how much each layer's attention
looks at the previous byte, by position (:func:`gpt2k3.experiments.text_lm.previous_byte_attention`).

Writes ``benchmarks/results/<preset's file>``. ``--ship MIXER:SEED`` (with ``--save``, the
folder the run's weights were kept in) writes the shipped checkpoint
``src/gpt2k3/checkpoints/text_gpt2.pt`` from a finished run of the chapter preset and notes it in
the results file; the book ships GPT-2 with the fan-in start, seed 1, the first of its runs at
the chosen rate whose weights were kept (its seed 0, the rate trial, ran before ``--save``
kept weights). Run
``python scripts/sync_results.py`` afterwards. The corpus comes from Debian's ``bible`` program
(``apt-get install bible-kjv``; ``scripts/setup_env.sh`` installs it); ``--text FILE`` trains on
any text file instead (its last tenth held out).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import platform
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, machine, next_rate as search_next  # noqa: E402

from gpt2k3.experiments import checkpoint, corpus, text_lm  # noqa: E402
from gpt2k3.experiments.text_lm import MIXERS, TextModelConfig, TextTrainConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = ROOT / "src" / "gpt2k3" / "checkpoints" / checkpoint.CHECKPOINT
SAMPLE = dict(prompt="And it came to pass, when ", max_new_tokens=230, temperature=0.8, seed=0)
#: The chapter's models, in the order the chapter shows them: the two softmax baselines first.
ORDER = ("softmax", "gpt2_fan_in", "transformer_pp", "softmax_conv", "linear", "deltanet",
         "gated_deltanet", "kda", "hybrid", "k3")
#: Repeats shorter than this many bytes are not used by the repeat test.
REPEAT_MIN_LENGTH = 32


@dataclass(frozen=True)
class Plan:
    """What one preset runs: ``mixers`` x ``seeds`` runs of ``train``. With ``sweep_lrs``, each
    model first trains ``sweep_seed`` once at every rate of ``sweep_lrs`` (its ``lr`` replaced);
    the best of those runs is that seed's run, and the other seeds train at its rate."""

    out: str
    mixers: tuple[str, ...]
    seeds: tuple[int, ...]
    model: TextModelConfig
    train: TextTrainConfig
    sweep_lrs: tuple[float, ...] | None = None
    sweep_seed: int = 0
    sample: dict = field(default_factory=lambda: dict(SAMPLE))


def _presets() -> dict[str, Plan]:
    chapter = TextTrainConfig(steps=1200, batch_size=8, lr=3e-3, warmup=120, eval_every=100)
    tiny_model = TextModelConfig(n_layer=4, n_embd=32, n_head=2, context=32, max_context=128,
                                 chunk_size=16)
    return {
        "chapter": Plan(out="text_lm_tuned.json", mixers=ORDER, seeds=(0, 1, 2),
                        model=TextModelConfig(), train=chapter, sweep_lrs=(1e-3, 3e-3, 1e-2)),
        "short": Plan(out="text_lm.json", mixers=ORDER[:1] + ORDER[3:], seeds=(0, 1),
                      model=TextModelConfig(), train=TextTrainConfig()),
        "quick": Plan(out="text_lm_quick.json", mixers=ORDER, seeds=(0,), model=TextModelConfig(),
                      train=TextTrainConfig(steps=6, eval_every=3, curve_windows=2,
                                            eval_windows=1, warmup=2),
                      sweep_lrs=(1e-3, 3e-3)),
        "tiny": Plan(out="text_lm_tiny.json", mixers=("softmax", "deltanet"), seeds=(0, 1),
                     model=tiny_model,
                     train=TextTrainConfig(steps=4, batch_size=2, warmup=1, eval_every=2,
                                           curve_windows=2, eval_windows=1),
                     sweep_lrs=(1e-3, 3e-3),
                     sample=dict(prompt="And ", max_new_tokens=8, temperature=0.8, seed=0)),
    }


# ------------------------------------------------------------------ the corpus
def text_file_data(path: Path) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """``(train, validation, description)`` of a text file: its last tenth (from a line
    start) held out."""
    raw = Path(path).read_text(encoding="utf-8")
    cut = raw.rfind("\n", 0, int(len(raw) * 0.9)) + 1 or int(len(raw) * 0.9)
    train, val = corpus.encode(raw[:cut], torch.uint8), corpus.encode(raw[cut:], torch.uint8)
    return train, val, {"name": f"text file {Path(path).name}",
                        "train": {"bytes": train.numel()}, "validation": {"bytes": val.numel()}}


def kjv_description(data: corpus.KJVData) -> dict:
    return {"name": "King James Bible (1611; Debian package bible-kjv, program `bible "
                    f"\"{corpus.KJV_RANGE}\"`)",
            "license": "public domain: the translation's copyright has expired "
                       "(/usr/share/doc/bible-kjv/copyright)",
            "documents": "the 66 books; verse text one verse per line, verse numbers and chapter "
                         "headings removed",
            **corpus.corpus_stats(data.split)}


# ------------------------------------------------------------------ what a run records
def _git(*args) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.rstrip("\n") if done.returncode == 0 else None


def provenance() -> dict:
    """The commit and the uncommitted files of the code a run imports."""
    dirty = _git("status", "--porcelain", "--", "src/gpt2k3", "benchmarks/text_lm.py",
                 "benchmarks/_common.py", ":!src/gpt2k3/book")  # the book's code is not imported
    return {"commit": _git("rev-parse", "HEAD"),
            "uncommitted": [line[3:] for line in (dirty or "").splitlines()]}


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _niceness() -> int | None:
    try:
        return os.nice(0)
    except OSError:
        return None


def timed(fn):
    """Run ``fn()``; return its result and what the run records about where and when it ran."""
    where = {**machine(), "host": platform.node(), "niceness": _niceness(), **provenance(),
             "started": _now(), "load_before": [round(v, 2) for v in os.getloadavg()]}
    t0 = time.perf_counter()
    result = fn()
    where.update(finished=_now(), wall_seconds=round(time.perf_counter() - t0, 1),
                 load_after=[round(v, 2) for v in os.getloadavg()])
    return result, where


# ------------------------------------------------------------------ the header
def repeat_setup(val: torch.Tensor, model: TextModelConfig) -> tuple[list, dict]:
    """The repeats of the held-out bytes the repeat test uses (those whose first copy ends at
    least ``max_context`` bytes into the stream, so both copies get a full window at every
    length; each is scored at the shortest evaluation length that holds it,
    :func:`gpt2k3.experiments.text_lm.repeat_lengths`) and their description for the results."""
    found = corpus.find_repeats(val, REPEAT_MIN_LENGTH, model.max_context)
    usable = [r for r in found if r.first + r.length - 1 >= model.max_context]
    by_length = text_lm.repeat_lengths(usable, model.lengths)
    info = {"min_length": REPEAT_MIN_LENGTH, "skip": text_lm.REPEAT_SKIP,
            "lengths": {str(n): len(v) for n, v in by_length.items()},
            "distances": [list(b) for b in text_lm.REPEAT_DISTANCES],
            "offsets": [list(b) for b in text_lm.REPEAT_OFFSETS],
            "found": len(found), "used": len(usable),
            "bytes": sum(r.length for r in usable),
            "validation_bytes": val.numel(),
            "repeats": [[r.first, r.second, r.length] for r in usable],
            "examples": [{"distance": r.distance, "length": r.length,
                          "text": corpus.decode(val[r.second:r.second + r.length])}
                         for r in sorted(usable, key=lambda r: r.distance)[::max(1, len(usable) // 8)]]}
    return usable, info


def header(plan: Plan, name: str, train: torch.Tensor, val: torch.Tensor, description: dict,
           repeat_info: dict, command: str) -> dict:
    model, cfg = plan.model, plan.train
    bins = {n: text_lm.position_bins(n) for n in model.lengths}
    out = {
        "benchmark": "text_lm", "preset": name,
        "machine": {**machine(), "niceness": _niceness(),
                    "shared": "a shared 2-core machine other jobs were using at the same time: "
                              "bytes/s are lower bounds; each run records its own load"},
        "command": command, "corpus": description,
        "config": {"mixers": list(plan.mixers), "labels": {m: text_lm.MIXER_LABELS[m] for m in plan.mixers},
                   "seeds": list(plan.seeds), "model": asdict(model), "lengths": list(model.lengths),
                   "train": asdict(cfg), "curve_steps": cfg.curve_steps(),
                   "tokens_per_run": cfg.steps * cfg.batch_size * model.context,
                   "bins": {str(n): b for n, b in bins.items()}, "sample": plan.sample,
                   "reference": text_lm.REFERENCE,
                   "learned_positions": list(text_lm.LEARNED_POSITIONS),
                   "matching": "total parameters matched to GPT-2's (4 d MLP) by the MLP width of "
                               "every other model (the experts' and then the dense layer's width "
                               "for the tiny K3)"},
    }
    if plan.sweep_lrs:
        out["config"]["lr_rule"] = {
            "lrs": list(plan.sweep_lrs), "seed": plan.sweep_seed,
            "rule": "every rate trains the seed once with the full budget; while the best is the "
                    "highest (lowest) rate tried, the next rate of the 1-3-10 grid above (below) "
                    "it trains too; the one with the lowest validation bits per byte at the "
                    "training length (val_bits, the number the run reports) is the model's rate, "
                    "and that run is its run of this seed; a tie goes to the lower rate"}
    models = {}
    for m in plan.mixers:
        net = text_lm.build_model(m, model, 0)
        models[m] = {"sizes": text_lm.matched_sizes(m, model), "params": text_lm.param_counts(net),
                     "position": net.config.position, "block_size": net.config.block_size,
                     "caches": list(net.new_cache(1, model.context).kinds)}
    out["models"] = models
    # what knowing only the last 0, 1 or 2 bytes is worth on the same validation books
    out["baselines"] = {label: round(corpus.ngram_bits(train, val, n), 4)
                        for n, label in ((1, "unigram"), (2, "bigram"), (3, "trigram"))}
    ranges = {"inside": (model.context // 2, model.context),
              "beyond": (model.max_context // 2, model.max_context)}
    pair = SimpleNamespace(train=train, validation=val)
    out["eval_baselines"] = {**text_lm.eval_ngram_baselines(pair, model, cfg, ranges),
                             "ranges": {k: list(v) for k, v in ranges.items()}}
    out["repeats"] = repeat_info
    return out


# ------------------------------------------------------------------ resuming
def _same_settings(old: dict, new: dict) -> list[str]:
    """The settings in which a stored results file differs from this run (empty: resume).
    A field the code gained since (a new training option, say) counts only if it is not at
    the default the earlier runs had; models added to the run (every stored one still in it)
    are trained on resuming, their runs missing like any other."""
    defaults = {"model": asdict(TextModelConfig()), "train": asdict(TextTrainConfig())}
    diffs = []
    for key in ("mixers", "seeds", "model", "train", "lengths", "sample", "lr_rule"):
        a, b = old["config"].get(key), new["config"].get(key)
        if key == "mixers" and isinstance(a, list) and isinstance(b, list):
            same = set(a) <= set(b)
        elif key == "lr_rule" and isinstance(a, dict) and isinstance(b, dict):
            same = (a.get("lrs"), a.get("seed")) == (b.get("lrs"), b.get("seed"))
        elif isinstance(a, dict) and isinstance(b, dict) and key in defaults:
            gained = {k: v for k, v in b.items() if k not in a}
            same = {k: b[k] for k in a if k in b} == a and \
                all(v == defaults[key].get(k) for k, v in gained.items())
        else:
            same = a == b
        if not same:
            diffs.append(key)
    return diffs


def write_atomically(path: Path, payload: dict) -> None:
    """Write ``payload`` as JSON to ``path`` through a temporary file and a rename, so a kill
    at any moment leaves either the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, path)


def _final_bits(record: dict) -> float:
    return record["val_bits"]


def beyond(lr: float, up: bool) -> float:
    """The next rate of the 1-3-10 grid above (``up``) or below ``lr``: 1e-2 -> 3e-2 -> 1e-1."""
    exponent = math.floor(math.log10(lr) + 1e-9)
    first = lr / 10 ** exponent >= 2  # a 3 (else a 1) times a power of ten
    if up:
        return float(f"{1 if first else 3}e{exponent + 1 if first else exponent}")
    return float(f"{1 if first else 3}e{exponent if first else exponent - 1}")


def next_rate(sweep: list[dict], mixer: str, lrs) -> float | None:
    """The next rate ``mixer`` must try, or ``None`` once its trials are done: every rate of
    ``lrs``, then the 1-3-10 grid beyond its edge while the best is there (:func:`beyond`,
    ``_common.next_rate``)."""
    bits = {r["lr"]: _final_bits(r) for r in sweep if r["mixer"] == mixer}
    return search_next(bits, lrs, lambda lr, up: beyond(lr, up=up))


def choose_lr(sweep: list[dict], mixer: str, lrs) -> dict | None:
    """The rule: ``mixer``'s run of ``sweep`` with the lowest final validation bits (a tie to the
    lower rate); ``None`` until its trials are done (:func:`next_rate`)."""
    if next_rate(sweep, mixer, lrs) is not None:
        return None
    done = {r["lr"]: r for r in sweep if r["mixer"] == mixer}
    return done[min(sorted(done), key=lambda lr: _final_bits(done[lr]))]


def lr_choices(sweep: list[dict], plan: Plan) -> dict:
    out = {}
    for m in plan.mixers:
        best = choose_lr(sweep, m, plan.sweep_lrs)
        if best is not None:
            out[m] = {"lr": best["lr"], "bits": {f"{r['lr']:g}": _final_bits(r) for r in sweep
                                                 if r["mixer"] == m}}
    return out


# ------------------------------------------------------------------ workers sharing one file
@contextmanager
def locked(path: Path):
    """Hold an exclusive lock on ``path``'s lock file: one process at a time reads and
    rewrites the results and the claims."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_claims(path: Path) -> dict:
    """The runs that live processes of this machine are training: ``{job: claim}``. A claim of
    a process that has died, or of another machine, is void (its run was never written)."""
    file = path.with_name(path.name + ".claims")
    claims = json.loads(file.read_text()) if file.exists() else {}
    return {job: c for job, c in claims.items()
            if c.get("host") == platform.node() and _alive(c.get("pid", -1))}


def write_claims(path: Path, claims: dict) -> None:
    file = path.with_name(path.name + ".claims")
    if claims:
        write_atomically(file, claims)
    elif file.exists():
        file.unlink()


def stored_runs(path: Path) -> tuple[list, list, dict]:
    """``(rate trials, other runs, sessions and updates)`` of a results file (empty if none)."""
    if not path.exists():
        return [], [], {}
    stored = json.loads(path.read_text())
    sweep = stored.get("sweep", [])
    trials = {(r["mixer"], r["seed"], r["lr"]) for r in sweep}  # shown in runs too: kept once
    runs = [r for r in stored.get("runs", []) if (r["mixer"], r["seed"], r.get("lr")) not in trials]
    return sweep, runs, {k: stored[k] for k in ("sessions", "updates", "checkpoint") if k in stored}


def merged(mine: list, theirs: list, key) -> list:
    """The records of ``mine`` and of ``theirs``, each key once (``mine`` first)."""
    seen = {key(r) for r in mine}
    return mine + [r for r in theirs if key(r) not in seen]


# ------------------------------------------------------------------ one run
def one_run(plan: Plan, m: str, seed: int, lr: float, train: torch.Tensor, val: torch.Tensor,
            repeats: list, bins: dict, save: Path | None):
    """Train and evaluate ``m`` on ``seed`` at peak rate ``lr``: ``(run, record)``."""
    model = plan.model
    cfg = replace(plan.train, lr=lr)

    def work():
        run = text_lm.train(m, (train, val), model, cfg, seed=seed, threads=None,
                            sample_args=plan.sample)
        rep = {}
        for length, some in text_lm.repeat_lengths(repeats, model.lengths).items():
            bits = text_lm.repeat_bits(run.model, val, some, length) if some else \
                {"first": [], "second": []}  # no repeat needs this length: an empty record
            if length > run.model.config.block_size:
                bits = None  # cannot run
            rep[str(length)] = text_lm.repeat_record(bits, some, length)
        return run, rep

    (run, rep), where = timed(work)
    record = text_lm.run_record(run, bins)
    record.update(lr=lr, repeats=rep, wall_seconds=where["wall_seconds"], machine=where)
    if save is not None:
        save.mkdir(parents=True, exist_ok=True)
        torch.save({"mixer": m, "seed": seed, "lr": lr, "model": asdict(model), "sizes": run.sizes,
                    "state_dict": run.model.state_dict()}, save / f"{m}_seed{seed}_lr{lr:g}.pt")
    return run, record


def ship_gpt2(model, record: dict, sample_args: dict, *, mixer: str, seed: int,
              dest: Path = CHECKPOINT) -> dict:
    """Save ``model`` as the shipped GPT-2 checkpoint (``dest``; chapter 1 samples it) and check
    that the file, loaded back, writes the sample its run recorded (``record["sample"]``)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    sha = checkpoint.save_checkpoint(model, dest, mixer=text_lm.REFERENCE, meta={
        "trained_as": mixer, "seed": seed, "lr": record.get("lr"),
        "corpus": "King James Bible (bible-kjv), byte level",
        "val_bits": record["val_bits"], "tokens": record["tokens"]})
    again = text_lm.sample(checkpoint.load_checkpoint(dest)[0], **sample_args)
    if again.ids != record["sample"]["ids"]:
        raise SystemExit("the reloaded checkpoint writes another sample than its run recorded")
    return {"file": f"src/gpt2k3/checkpoints/{checkpoint.CHECKPOINT}", "sha256": sha,
            "bytes": dest.stat().st_size, "mixer": mixer, "seed": seed,
            "dtype": "float32", "sample": record["sample"]}


def ship_saved(path: Path, folder: Path, mixer: str, seed: int, dest: Path = CHECKPOINT) -> dict:
    """Ship the weights ``--save`` kept of ``mixer``'s run with ``seed`` (at the rate its record
    states) as the package's GPT-2, after checking they write the sample the run recorded, and
    note it as the results file's ``checkpoint``."""
    data = json.loads(path.read_text())
    record = next((r for r in data["runs"] if (r["mixer"], r["seed"]) == (mixer, seed)), None)
    if record is None:
        raise SystemExit(f"{path} holds no finished run of {mixer} with seed {seed}")
    if mixer not in text_lm.LEARNED_POSITIONS:
        raise SystemExit(f"only a GPT-2-shaped model ships, one of {text_lm.LEARNED_POSITIONS}")
    saved = torch.load(folder / f"{mixer}_seed{seed}_lr{record['lr']:g}.pt", weights_only=True)
    model = text_lm.build_model(mixer, TextModelConfig(**saved["model"]), sizes=saved["sizes"])
    model.load_state_dict(saved["state_dict"])
    shipped = ship_gpt2(model.eval(), record, data["config"]["sample"], mixer=mixer, seed=seed,
                        dest=dest)
    with locked(path):
        data = json.loads(path.read_text())
        data["checkpoint"] = shipped
        write_atomically(path, data)
    return shipped


# ------------------------------------------------------------------ GPT-2's plateau
#: The changes the plateau preset tries, each against GPT-2 as published: ``(name, start,
#: training settings changed)``.
_LONG = {"steps": 1200, "warmup": 120, "eval_every": 50}  # the chapter preset's budget
PLATEAU = (("published", None, {}), ("fan_in", "fan_in", {}), ("untied", "untied", {}),
           ("sinusoid", "sinusoid", {}), ("no_warmup", None, {"warmup": 0}),
           ("lr_1e-3", None, {"lr": 1e-3}), ("lr_1e-2", None, {"lr": 1e-2}),
           ("published_1200", None, _LONG), ("fan_in_1200", "fan_in", _LONG),
           ("sinusoid_1200", "sinusoid", _LONG),
           ("no_warmup_1200", None, {**_LONG, "warmup": 0}),
           ("warmup_30_1200", None, {**_LONG, "warmup": 30}))  # the short run's warm-up, in steps
#: Position bins of the previous-byte attention.
ATTENTION_BINS = ((1, 4), (4, 16), (16, 64), (64, 256))


def plateau(path: Path, train: torch.Tensor, val: torch.Tensor, command: str) -> Path:
    """The plateau preset (see the module docstring); resumable like the others."""
    model = TextModelConfig()
    base = TextTrainConfig(eval_every=25)
    x, _ = corpus.eval_windows(val, model.context, 16)
    head = {"benchmark": "text_lm_plateau", "command": command,
            "machine": {**machine(), "niceness": _niceness()},
            "config": {"model": asdict(model), "train": asdict(base), "seed": 0,
                       "variants": [[n, s, c] for n, s, c in PLATEAU],
                       "attention_bins": [list(b) for b in ATTENTION_BINS],
                       "uniform": text_lm.uniform_previous_byte(ATTENTION_BINS),
                       "attention_windows": [16, model.context]},
            "baselines": {"bigram": round(corpus.ngram_bits(train, val, 2), 4),
                          "trigram": round(corpus.ngram_bits(train, val, 3), 4)}}
    runs = json.loads(path.read_text())["runs"] if path.exists() else []
    for name, start, change in PLATEAU:
        if any(r["variant"] == name for r in runs):
            continue
        cfg = replace(base, **change)
        held, attention = [], []

        def keep(net):
            held.append(net)
            if start is not None:
                text_lm.GPT2_STARTS[start](net)
            look(-1, None)  # before the first step

        def look(step, _bits):  # after the steps the validation curve is scored at
            if step + 1 in cfg.curve_steps():
                attention.append({"step": step + 1, "layers": [
                    [round(v, 4) for v in layer]
                    for layer in text_lm.previous_byte_attention(held[0], x, ATTENTION_BINS)]})

        run, where = timed(lambda: text_lm.train("softmax", (train, val), model, cfg, seed=0,
                                                 threads=None, start=keep, callback=look))
        runs.append({"variant": name, "start": start, "change": change, "steps": cfg.steps,
                     "val_bits": text_lm._round(run.val_bits),
                     "curve": [{"step": s, "bits": text_lm._round(b)} for s, b in run.curve],
                     "attention": attention, "params": run.params, "machine": where})
        write_atomically(path, {**head, "runs": runs,
                                "complete": len(runs) == len(PLATEAU)})
        print(f"plateau {name}: {run.val_bits:.4f} bits/byte after {cfg.steps} steps; "
              f"{where['wall_seconds']:.0f} s", flush=True)
    write_atomically(path, {**head, "runs": runs, "complete": len(runs) == len(PLATEAU)})
    return path


# ------------------------------------------------------------------ the loop
def main(argv=None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    presets = _presets()
    p.add_argument("--preset", default="chapter", choices=sorted(presets) + ["plateau"])
    p.add_argument("--mixers", help="comma-separated subset of the preset's models (a new file only)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: as fast for models this small, and on a shared "
                        "machine a second thread spin-waits)")
    p.add_argument("--out", help="results file (default: the preset's, in benchmarks/results)")
    p.add_argument("--text", help="train on this UTF-8 text file instead of the King James Bible")
    p.add_argument("--save", help="also save every main run's weights into this folder")
    p.add_argument("--redo", help="comma-separated models whose stored runs are dropped and rerun")
    p.add_argument("--ship", metavar="MIXER:SEED",
                   help="only ship the weights --save kept of this finished run as the package's "
                        "GPT-2 checkpoint, noted in the results file (seconds; no training)")
    p.add_argument("--baselines", action="store_true",
                   help="only (re)compute the n-gram tables on the evaluation bytes into the "
                        "results file (seconds; no training)")
    args = p.parse_args(argv)
    name = args.preset
    command = " ".join(["python", "benchmarks/text_lm.py", *(argv if argv is not None else sys.argv[1:])])
    if name == "plateau":
        torch.set_num_threads(args.threads)
        data = corpus.kjv_data()
        return plateau(Path(args.out) if args.out else RESULTS / "text_lm_plateau.json",
                       data.train, data.validation, command)
    plan = presets[name]
    if args.ship:
        if not args.save:
            p.error("--ship needs --save, the folder that holds the run's weights")
        mixer, _, seed = args.ship.partition(":")
        shipped = ship_saved(Path(args.out) if args.out else RESULTS / plan.out, Path(args.save),
                             mixer, int(seed or 0))
        print(f"shipped {mixer} seed {shipped['seed']} as {shipped['file']} ({shipped['bytes']:,} bytes)")
        return CHECKPOINT
    if args.mixers:
        chosen = tuple(args.mixers.split(","))
        if unknown := [m for m in chosen if m not in MIXERS]:
            p.error(f"unknown mixers {unknown}; choose from {MIXERS}")
        plan = replace(plan, mixers=chosen)
    torch.set_num_threads(args.threads)
    path = Path(args.out) if args.out else RESULTS / plan.out

    if args.text:
        train, val, description = text_file_data(Path(args.text))
    else:
        data = corpus.kjv_data()
        train, val, description = data.train, data.validation, kjv_description(data)
    repeats, repeat_info = repeat_setup(val, plan.model)
    head = header(plan, name, train, val, description, repeat_info, command)
    if args.baselines:
        stored = json.loads(path.read_text())
        stored["eval_baselines"] = head["eval_baselines"]
        write_atomically(path, stored)
        print(f"wrote eval_baselines into {path}")
        return path

    with locked(path):
        sweep, runs, extra = stored_runs(path)
        if path.exists():
            if diffs := _same_settings(json.loads(path.read_text()), head):
                p.error(f"{path} holds runs with other settings ({', '.join(diffs)}); move it "
                        "away to start afresh")
            if args.redo:
                redo = args.redo.split(",")
                runs = [r for r in runs if r["mixer"] not in redo]
                sweep = [r for r in sweep if r["mixer"] not in redo]
                extra["updates"] = extra.get("updates", []) + [
                    {"mixers": redo, "command": command, "machine": head["machine"]}]
            print(f"resuming {path}: {len(sweep)} rate trials and {len(runs)} other runs kept",
                  flush=True)
        session = {"started": _now(), "command": command, "machine": head["machine"],
                   "pid": os.getpid(), **provenance()}
        extra["sessions"] = extra.get("sessions", []) + [session]
    order = {m: i for i, m in enumerate(plan.mixers)}
    bins = {n: text_lm.position_bins(n) for n in plan.model.lengths}
    trial_key, run_key = (lambda r: (r["mixer"], r["lr"])), (lambda r: (r["mixer"], r["seed"]))

    def chosen():
        """Every run the chapter reads: each model's best run of the sweep, and the others."""
        best = [b for m in plan.mixers if (b := choose_lr(sweep, m, plan.sweep_lrs or ()))] \
            if plan.sweep_lrs else []
        return best + runs

    def sync():
        """Merge what the other workers wrote since (call under the lock)."""
        nonlocal sweep, runs
        theirs_sweep, theirs_runs, theirs = stored_runs(path)
        sweep, runs = merged(sweep, theirs_sweep, trial_key), merged(runs, theirs_runs, run_key)
        for name in ("sessions", "updates"):
            ours = extra.get(name, [])
            both = theirs.get(name, []) + [x for x in ours if x not in theirs.get(name, [])]
            if both:
                extra[name] = both
        if "checkpoint" in theirs and "checkpoint" not in extra:
            extra["checkpoint"] = theirs["checkpoint"]

    def save_all():
        shown = chosen()
        done = {(r["mixer"], r["seed"]) for r in shown}
        payload = {**head, **extra,
                   "sweep": sorted(sweep, key=lambda r: (order[r["mixer"]], r["lr"])),
                   "lr_choice": lr_choices(sweep, plan) if plan.sweep_lrs else None,
                   "runs": sorted(shown, key=lambda r: (r["seed"], order[r["mixer"]])),
                   "train_seconds": round(sum(r["train_seconds"] for r in sweep + runs), 1),
                   "wall_seconds": round(sum(r["wall_seconds"] for r in sweep + runs), 1),
                   "complete": done == {(m, s) for m in plan.mixers for s in plan.seeds}}
        write_atomically(path, payload)

    def report(k, what, record):
        lengths = " ".join(f"{n}:{v}" for n, v in record["length_bits"].items())
        print(f"[{k}/{total}] {what}: {record['val_bits']} bits/byte ({lengths}); "
              f"{record['tokens_per_second']:.0f} bytes/s; {record['wall_seconds']:.0f} s, "
              f"load {record['machine']['load_before'][0]}", flush=True)

    with locked(path):
        sync()
        save_all()
    later = [s for s in plan.seeds if not (plan.sweep_lrs and s == plan.sweep_seed)]
    jobs = [("sweep", m, plan.sweep_seed, lr) for m in plan.mixers for lr in (plan.sweep_lrs or ())]
    jobs += [("run", m, s, None) for s in later for m in plan.mixers]  # seed-major
    total = len(jobs)
    save = Path(args.save) if args.save else None

    def done(job) -> bool:
        phase, m, seed, lr = job
        if phase == "sweep":
            return any(trial_key(r) == (m, lr) for r in sweep)
        return any(run_key(r) == (m, seed) for r in runs)

    def ready(job) -> bool:  # a later seed waits for its model's rate
        return job[0] == "sweep" or not plan.sweep_lrs or \
            choose_lr(sweep, job[1], plan.sweep_lrs) is not None

    def grown():  # rate trials beyond the grid, as the finished trials ask for them
        if not plan.sweep_lrs:
            return []
        return [("sweep", m, plan.sweep_seed, lr) for m in plan.mixers
                if all(any(trial_key(r) == (m, g) for r in sweep) for g in plan.sweep_lrs)
                and (lr := next_rate(sweep, m, plan.sweep_lrs)) is not None]

    while True:
        with locked(path):
            sync()
            claims = live_claims(path)
            # rate trials first, the grown ones too: a model's later seeds wait for them
            trials = [j for j in jobs if j[0] == "sweep"] + grown()
            todo = [j for j in trials + [j for j in jobs if j[0] == "run"] if not done(j)]
            free = [j for j in todo if ready(j) and repr(j) not in claims]
            if free:
                job = free[0]
                claims[repr(job)] = {"pid": os.getpid(), "host": platform.node(),
                                     "started": _now()}
            write_claims(path, claims)
        if not todo:
            break
        if not free:  # the rest waits for other workers' rate trials
            time.sleep(30)
            continue
        phase, m, seed, lr = job
        k = jobs.index(job) + 1 if job in jobs else len(jobs) + 1
        if phase == "run":
            lr = choose_lr(sweep, m, plan.sweep_lrs)["lr"] if plan.sweep_lrs else plan.train.lr
        run, record = one_run(plan, m, seed, lr, train, val, repeats, bins, save)
        with locked(path):
            sync()
            (sweep if phase == "sweep" else runs).append(record)
            save_all()
            claims = live_claims(path)
            claims.pop(repr(job), None)
            write_claims(path, claims)
        report(k, f"{m} seed {seed} lr {lr:g}" + (" (rate trial)" if phase == "sweep" else ""),
               record)
    print(f"done: {len(sweep)} rate trials and {len(runs)} other runs; wrote {path}", flush=True)
    return path


if __name__ == "__main__":
    main()
