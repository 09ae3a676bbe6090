"""Shared helpers for the benchmark scripts: machine description, timing, results files.

Benchmarks report medians of several runs and compute ratios from timings taken side
by side in the same process, so that a slower or busier machine shifts every number
alike.  Results are written to ``benchmarks/results/`` where the chapters read them.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

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
