"""Shared helpers for the benchmark scripts: machine description, timing, results files.

Benchmarks report medians of several runs and compute ratios from timings taken side
by side in the same process, so that a slower or busier machine shifts every number
alike.  Results are written to ``benchmarks/results/`` where the chapters read them.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Mapping

import torch

RESULTS = Path(__file__).resolve().parent / "results"
_out_dir: Path | None = None  # set by :func:`redirect`: where :func:`write` puts files instead


@contextmanager
def redirect(out_dir: str | Path):
    """Within the block, :func:`write` puts results files in ``out_dir`` instead of
    ``benchmarks/results`` (``benchmarks/gpu.py --dry-run --out DIR`` uses it)."""
    global _out_dir
    previous, _out_dir = _out_dir, Path(out_dir)
    try:
        yield _out_dir
    finally:
        _out_dir = previous


def machine(device: str = "cpu") -> dict:
    """What ran the benchmark: CPU model, cores, threads, torch version, GPU if used."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "load_average_1min_now": os.getloadavg()[0],
            "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "device": device,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d")}
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_call(fn: Callable[[], object], runs: int, device: str = "cpu", warmup: int = 1) -> list[float]:
    """Wall-clock seconds of ``runs`` calls of ``fn`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return times


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def read_bandwidth(device: str = "cpu", nbytes: int = 1 << 29, runs: int = 7) -> float:
    """Measured memory read bandwidth in bytes/s: ``sum`` over a buffer far larger than
    the caches (512 MiB by default), median of ``runs``."""
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    times = time_call(lambda: x.sum(), runs, device, warmup=2)
    return nbytes / median(times)


def write(name: str, payload: dict) -> Path:
    """Write ``payload`` as JSON to ``benchmarks/results/<name>`` (or the :func:`redirect` folder)."""
    folder = _out_dir if _out_dir is not None else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


# --------------------------------------------------------------------------- timing, side by side
# The one set of timing helpers the scripts share (chunkwise.py, crossover.py, gates.py, gpu.py).


def time_once(fn: Callable[[], object], device: str = "cpu") -> float:
    """Seconds of one call of ``fn``: bracketed by CUDA events on a GPU (kernel time, launch
    gaps included), by ``time.perf_counter`` otherwise."""
    if device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def rounds(fns: dict, repeats: int, device: str = "cpu", warmup: int = 1) -> dict:
    """Time every callable once per round, ``repeats`` rounds, after ``warmup`` untimed calls
    each; returns name -> list of seconds. Sampling in turn makes a busy moment slow every
    method alike, so ratios of the medians are fair."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync(device)
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(time_once(fn, device))
    return times


def mean_call_time(fn: Callable[[], object], calls: int, device: str = "cpu") -> float:
    """Seconds per call, averaged over ``calls`` back-to-back calls (for microsecond steps)."""
    sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync(device)
    return (time.perf_counter() - start) / calls


def calibrate_calls(fn: Callable[[], object], min_time: float, device: str = "cpu",
                    warmup: int = 3) -> int:
    """How many back-to-back calls make one sample last at least ``min_time`` seconds.

    The per-call time is estimated from the fastest of a few single calls, so that one call
    slowed down by another process does not shrink every later sample to a single call.
    """
    for _ in range(warmup):  # allocator, kernels, caches
        fn()
    if min_time <= 0:
        return 1
    fastest = min(mean_call_time(fn, 1, device) for _ in range(2))
    if fastest >= min_time:  # a slow call is its own sample
        return 1
    fastest = min(fastest, *(mean_call_time(fn, 1, device) for _ in range(3)))
    return max(1, min(1 << 20, math.ceil(min_time / max(fastest, 1e-9))))


def calibrated_medians(fns: dict, repeats: int, min_time: float, device: str = "cpu",
                       warmup: int = 3) -> dict:
    """Median seconds per call of each function, sampling them in turn ``repeats`` times, each
    sample averaging enough calls to last ``min_time`` seconds."""
    calls = {name: calibrate_calls(fn, min_time, device, warmup) for name, fn in fns.items()}
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(mean_call_time(fn, calls[name], device))
    return {name: statistics.median(ts) for name, ts in times.items()}


def next_rate(bits: Mapping[float, float], grid, beyond: Callable[[float, bool], float]) -> float | None:
    """The next learning rate a rate search must try, or ``None`` once it is done. ``bits`` maps
    every rate tried to its validation loss. First every rate of ``grid``; then, while the best
    rate tried (lowest loss, a tie to the lower rate) is the highest (lowest) tried,
    ``beyond(best, True)`` (``beyond(best, False)``): so the chosen rate always has a worse one
    on either side."""
    missing = [lr for lr in grid if lr not in bits]
    if missing:
        return missing[0]
    tried = sorted(bits)
    best = min(tried, key=lambda lr: bits[lr])
    if best == tried[-1]:
        return beyond(best, True)
    if best == tried[0]:
        return beyond(best, False)
    return None
