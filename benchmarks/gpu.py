"""Every GPU measurement the book wants, in one run (under 8 minutes on an H200).

    python benchmarks/gpu.py                         # on a CUDA machine: benchmarks/results/*_cuda.json
    python benchmarks/gpu.py --dry-run --out DIR     # anywhere: CPU, tiny shapes, into DIR

Parts, in order of priority (each writes one file; the run stops starting new sizes when its time
budget, ``--budget-s``, runs out, and records what it skipped):

1. ``decode_steps_cuda.json`` -- one decode step against a context of N tokens (1K ... 1M, batch 1
   and 8), for the book's three kinds of decode memory, each eagerly and replayed as one CUDA
   graph (no launch overhead):

   * the **KV cache**: :func:`gpt2k3.ops.softmax.parallel` with one query over preallocated
     key and value buffers (32 heads x 128,
     bf16), the new token written at ``N - 1``: reads ``2 N H D`` numbers;
   * the **MLA latent cache**: :meth:`gpt2k3.layers.mla.MLA.decode_absorbed`, one DeepSeek-V3
     layer on a :class:`~gpt2k3.layers.mla.LatentCache` (the whole layer, projections included:
     its weights are read every step), and its attention alone (absorbed query against the
     cached latents, softmax, averaged latent), which reads ``N (r + d_rope)`` numbers;
   * a **fixed recurrent state**: one token of :func:`gpt2k3.ops.gated_delta.recurrent` with a
     KDA gate (32 heads, 128 x 128 float32 state) -- constant in N.

2. ``gates_cuda.json`` -- the training-form forward at T = 4K ... 64K (batch 1, 16 heads, D = 128):
   the book's :func:`~gpt2k3.ops.delta.chunkwise` DeltaNet and
   :func:`~gpt2k3.ops.gated_delta.chunkwise` Gated DeltaNet and KDA (float32 compute with TF32
   matmuls, from bf16 inputs; eagerly, and their public fast core
   :func:`~gpt2k3.ops.gated_delta.chunked` captured in one CUDA graph)
   against flash-linear-attention's Triton kernels (``fla.ops``: ``chunk_delta_rule``,
   ``chunk_gated_delta_rule``, ``chunk_kda``; bf16) and causal softmax attention
   (``F.scaled_dot_product_attention(..., is_causal=True)``, bf16, flash where available), with
   each of ours compared with fla's output (relative error).

3. ``chunkwise_cuda.json`` (chapter 5), by ``benchmarks/chunkwise.py``'s GPU comparison.
4. ``decode_cuda.json`` (chapter 2), by ``benchmarks/decode.py`` (GPT-2 small, bf16).
5. ``crossover_cuda.json`` (chapter 3), by ``benchmarks/crossover.py``.

``gpu_run_cuda.json`` records the machine (GPU, driver-side CUDA, torch, triton, fla-core and
transformers versions), the device-to-device copy bandwidth, and every part's status and time.
Timings are medians of several samples, each bracketed by CUDA events; ratios come from one run.
A method that fails is recorded with its error and the run goes on.

``--dry-run`` runs the same code on the CPU with tiny shapes, without CUDA graphs and without
fla's Triton kernels, and requires ``--out`` (it never writes into ``benchmarks/results``); the
test suite runs it (``tests/test_benchmarks_gpu.py``) so that this script cannot rot while no
GPU is at hand.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import statistics
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # chunkwise.py's fla_oracle import
import _common  # noqa: E402
from _common import machine, rounds, write  # noqa: E402

from gpt2k3.checks import compute_dtype  # noqa: E402
from gpt2k3.ops import delta, gated_delta, softmax  # noqa: E402
from gpt2k3.layers.mla import MLA, MLAConfig  # noqa: E402


# --------------------------------------------------------------------------- plumbing


class Budget:
    """Seconds left before the run should stop starting new measurements."""

    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()


def sample(fn, device: str, reps: int, warmup: int = 2) -> list[float]:
    """Seconds per call of ``fn``, ``reps`` samples after ``warmup`` calls (CUDA events on a GPU)."""
    return rounds({"fn": fn}, reps, device, warmup)["fn"]


def graphed(fn):
    """``fn`` captured once in a CUDA graph; returns the replay. Warm-up runs on a side stream
    first, as capture requires (and so that lazily initialised kernels are not captured cold)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def timed_methods(fns: dict, device: str, reps: int, rows: list, base: dict) -> dict:
    """Time each method (errors recorded, not raised); append one row each; name -> median s."""
    medians = {}
    for name, make in fns.items():
        row = dict(base, method=name)
        try:
            fn = make()  # builds the callable (a CUDA graph capture may fail here)
            ts = sample(fn, device, reps)
            row.update(median_s=statistics.median(ts), times_s=ts)
            medians[name] = row["median_s"]
        except Exception as err:  # noqa: BLE001 - a failing method must not stop the run
            row["error"] = f"{type(err).__name__}: {err}"[:500]
            if device == "cuda":
                _safe_cuda_sync()
        rows.append(row)
    return medians


def _safe_cuda_sync() -> None:
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001
        pass


def versions() -> dict:
    out = {"torch": torch.__version__, "python": platform.python_version(),
           "cuda": torch.version.cuda}
    for pkg in ("triton", "fla-core", "transformers"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def copy_bandwidth(device: str, nbytes: int) -> float:
    """Device-to-device copy, bytes read + written per second (median of 10)."""
    x = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    y = torch.empty_like(x)
    t = statistics.median(sample(lambda: y.copy_(x), device, reps=10))
    del x, y
    return 2 * nbytes / t


# --------------------------------------------------------------------------- part 1: decode steps


def decode_steps(cfg: dict, device: str, budget: Budget) -> dict:
    """One decode step against N cached tokens: KV cache, MLA latent cache, fixed state."""
    dtype, use_graphs, reps = cfg["dtype"], cfg["graphs"], cfg["reps"]
    H, D = cfg["kv_heads"], cfg["kv_head_dim"]
    Hs, Ds = cfg["state_heads"], cfg["state_dim"]
    mla_cfg = cfg["mla"]
    rows, skipped = [], []
    g = torch.Generator(device="cpu").manual_seed(0)

    def randn(*shape, dt=dtype):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dt)

    torch.manual_seed(0)
    mla = MLA(mla_cfg).to(device=device, dtype=dtype).eval()
    mla_weight_bytes = sum(p.numel() * p.element_size() for p in mla.parameters())
    r, dr, Hm = mla_cfg.kv_lora_rank, mla_cfg.qk_rope_head_dim, mla_cfg.n_heads
    for B in cfg["batches"]:
        # the fixed state: one token of KDA through the public function, eagerly (its check
        # reads the inputs back to the host) and captured in a CUDA graph
        q_s, k_s = (F.normalize(randn(B, Hs, 1, Ds, dt=torch.float32), dim=-1) for _ in range(2))
        v_s = randn(B, Hs, 1, Ds, dt=torch.float32)
        beta_s = torch.rand(B, Hs, 1, generator=g).to(device)
        la_s = F.logsigmoid(randn(B, Hs, 1, Ds, dt=torch.float32))
        S0 = randn(B, Hs, Ds, Ds, dt=torch.float32)
        state_fns = {"state (KDA, fp32) eager": lambda: (
            lambda: gated_delta.recurrent(q_s, k_s, v_s, beta_s, la_s, initial_state=S0))}
        if use_graphs:  # the same public function: its check reads no values while capturing
            state_fns["state (KDA, fp32) CUDA graph"] = lambda: graphed(
                lambda: gated_delta.recurrent(q_s, k_s, v_s, beta_s, la_s, initial_state=S0))
        state_bytes = 2 * B * Hs * Ds * Ds * 4  # read and written once
        for N in cfg["contexts"]:
            base = {"B": B, "N": N}
            if budget.left() < cfg["min_left_s"]:
                skipped.append(dict(base, reason="time budget"))
                continue
            kv_bytes = 2 * B * H * N * D * dtype.itemsize
            lat_bytes = B * N * (r + dr) * dtype.itemsize
            if kv_bytes > cfg["max_cache_bytes"]:
                skipped.append(dict(base, reason=f"KV cache of {kv_bytes / 2**30:.0f} GiB over the cap"))
                continue
            fns = {}
            # the KV cache: N - 1 cached positions, the new token written at N - 1, read all N
            k_buf = torch.empty(B, H, N, D, dtype=dtype, device=device).normal_()
            v_buf = torch.empty(B, H, N, D, dtype=dtype, device=device).normal_()
            q_t, k_t, v_t = (randn(B, H, 1, D) for _ in range(3))

            def kv_step(k_buf=k_buf, v_buf=v_buf, q_t=q_t, k_t=k_t, v_t=v_t):
                # softmax.parallel with Tq = 1: its check reads no value, so it can be graphed
                k_buf[:, :, N - 1:N], v_buf[:, :, N - 1:N] = k_t, v_t
                return softmax.parallel(q_t, k_buf, v_buf, scale=D ** -0.5)

            fns["KV cache eager"] = lambda: kv_step
            if use_graphs:
                fns["KV cache CUDA graph"] = lambda: graphed(kv_step)
            # the MLA latent cache: the whole layer, and its attention in latent space alone
            lat = mla.new_cache(B, max_len=N)
            lat.c_kv.normal_()
            lat.k_rope.normal_()
            x_t = randn(B, mla_cfg.n_embd)
            q_lat, q_rope = randn(B, Hm, r), randn(B, Hm, dr)  # one query per head, absorbed

            def mla_step():
                lat.length = N - 1  # decode_absorbed appends the new token's latent at N - 1
                return mla.decode_absorbed(x_t, lat)

            def mla_attention():
                # every head against the shared latents of all N positions: batched over B only,
                # so the cache is read once, never expanded per head
                c_kv, k_rope = lat.c_kv, lat.k_rope  # (B, N, r), (B, N, dr)
                scores = torch.baddbmm(torch.bmm(q_rope, k_rope.transpose(1, 2)), q_lat,
                                       c_kv.transpose(1, 2))  # (B, H, N)
                p = (scores.float() * mla_cfg.softmax_scale).softmax(-1).to(dtype)
                return torch.bmm(p, c_kv)  # (B, H, r): the averaged latent

            # (the layer is timed eagerly only: it builds its RoPE positions on the host every
            # step, a copy a CUDA graph cannot capture)
            fns["MLA layer eager"] = lambda: mla_step
            fns["MLA attention eager"] = lambda: mla_attention
            if use_graphs:
                fns["MLA attention CUDA graph"] = lambda: graphed(mla_attention)
            fns.update(state_fns)
            before = len(rows)
            with torch.inference_mode():
                medians = timed_methods(fns, device, reps, rows, base)
            for row in rows[before:]:
                m = row["method"]
                row["bytes_read"] = (kv_bytes if m.startswith("KV") else
                                     lat_bytes + mla_weight_bytes if m.startswith("MLA layer") else
                                     lat_bytes if m.startswith("MLA attention") else state_bytes)
                if "median_s" in row:
                    row["bytes_per_s"] = row["bytes_read"] / row["median_s"]
            print(f"  B={B} N={N:>8,}: " + ", ".join(f"{m} {1e3 * t:.3f} ms" for m, t in medians.items()),
                  flush=True)
            del k_buf, v_buf, lat
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
    return {"config": {"kv_cache": {"heads": H, "head_dim": D, "dtype": str(dtype)},
                       "mla": {k: getattr(mla_cfg, k) for k in ("n_embd", "n_heads", "q_lora_rank",
                                                                  "kv_lora_rank", "qk_nope_head_dim",
                                                                  "qk_rope_head_dim", "v_head_dim")},
                       "mla_weight_bytes": mla_weight_bytes,
                       "state": {"heads": Hs, "d_k": Ds, "d_v": Ds, "dtype": "float32", "gate": "KDA"},
                       "contexts": cfg["contexts"], "batches": cfg["batches"], "reps": reps,
                       "cuda_graphs": use_graphs},
            "rows": rows, "skipped": skipped}


# --------------------------------------------------------------------------- part 2: gates, training form


def _fla_kernels(use_fla: bool) -> tuple[dict, str | None]:
    if not use_fla:
        return {}, "not used (dry run)"
    try:
        from fla.ops.delta_rule import chunk_delta_rule
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.kda import chunk_kda
    except Exception as err:  # noqa: BLE001 - Triton or the GPU missing
        return {}, f"{type(err).__name__}: {err}"[:300]
    return {"DeltaNet": chunk_delta_rule, "Gated DeltaNet": chunk_gated_delta_rule, "KDA": chunk_kda}, None


def gates_prefill(cfg: dict, device: str, budget: Budget) -> dict:
    """The book's chunkwise DeltaNet / Gated DeltaNet / KDA against fla's kernels and causal SDPA."""
    B, H, D, C, reps = cfg["B"], cfg["H"], cfg["D"], cfg["chunk_size"], cfg["reps"]
    dtype = cfg["dtype"]
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    kernels, fla_error = _fla_kernels(cfg["fla"])
    rows, skipped = [], []
    for T in cfg["Ts"]:
        if budget.left() < cfg["min_left_s"]:
            skipped.append({"T": T, "reason": "time budget"})
            continue
        g = torch.Generator(device=device).manual_seed(T)  # drawn where they are used

        def randn(*shape):
            return torch.randn(*shape, generator=g, device=device)

        q, k = (F.normalize(randn(B, H, T, D), dim=-1).to(dtype) for _ in range(2))
        v, beta = randn(B, H, T, D).to(dtype), randn(B, H, T).sigmoid().to(dtype)
        gates = {"DeltaNet": None,  # log decays in float32, as fla takes them
                 "Gated DeltaNet": F.logsigmoid(randn(B, H, T)),
                 "KDA": F.logsigmoid(randn(B, H, T, D)) / 16}
        outs, fns = {}, {}

        def ours(name, la):
            if la is None:
                return lambda: outs.__setitem__(name, delta.chunkwise(q, k, v, beta, chunk_size=C)[0])
            return lambda: outs.__setitem__(name, gated_delta.chunkwise(q, k, v, beta, la, chunk_size=C)[0])

        def ours_graph(la):
            # the fast core the layers call, gated_delta.chunked, on inputs cast outside the
            # capture (as chunkwise casts them), so the graph holds only the algorithm
            cdt = compute_dtype(q, k, v, beta, la)
            qs, ks, vs, bs = (x.to(cdt) for x in (q, k, v, beta))
            ls = None if la is None else la.to(cdt)
            S0 = qs.new_zeros(B, H, D, D)
            return graphed(lambda: gated_delta.chunked(qs, ks, vs, bs, ls, S0, C))

        def theirs(name, kernel, la):
            qf, kf, vf, bf = (x.transpose(1, 2).contiguous() for x in (q, k, v, beta))
            if la is None:
                return lambda: outs.__setitem__(name, kernel(qf, kf, vf, bf, scale=1.0)[0].transpose(1, 2))
            lf = la.transpose(1, 2).contiguous()
            return lambda: outs.__setitem__(name, kernel(qf, kf, vf, lf, bf, scale=1.0)[0].transpose(1, 2))

        for name, la in gates.items():
            fns[f"{name} ours eager"] = (lambda name=name, la=la: ours(f"{name} ours", la))
            if cfg["graphs"]:
                fns[f"{name} ours CUDA graph"] = (lambda la=la: ours_graph(la))
            if name in kernels:
                fns[f"{name} fla"] = (lambda name=name, la=la: theirs(f"{name} fla", kernels[name], la))
        fns["causal SDPA"] = lambda: (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        base = {"B": B, "H": H, "D": D, "T": T}
        before = len(rows)
        with torch.inference_mode():
            medians = timed_methods(fns, device, reps, rows, base)
        for row in rows[before:]:
            name = row["method"].split(" ours")[0]
            mine, ref = outs.get(f"{name} ours"), outs.get(f"{name} fla")
            if row["method"].endswith("ours eager") and mine is not None and ref is not None:
                d = mine.float() - ref.float()
                row["rel_err_vs_fla"] = (d.norm() / ref.float().norm()).item()
        print(f"  T={T:>6,}: " + ", ".join(f"{m} {1e3 * t:.2f} ms" for m, t in medians.items()), flush=True)
        del q, k, v, beta, gates, outs, fns
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    med = {(r["method"], r["T"]): r["median_s"] for r in rows if "median_s" in r}
    summary = {}
    for (m, T), t in med.items():
        if " ours " not in m:
            continue
        name = m.split(" ours ")[0]
        if (f"{name} fla", T) in med:
            summary[f"{m} / fla at T={T}"] = t / med[(f"{name} fla", T)]
        if ("causal SDPA", T) in med:
            summary[f"{m} / causal SDPA at T={T}"] = t / med[("causal SDPA", T)]
    return {"config": {"B": B, "H": H, "D": D, "chunk_size": C, "Ts": cfg["Ts"], "reps": reps,
                       "inputs": str(dtype).replace("torch.", ""),
                       "ours_compute": "float32 (TF32 matmuls)" if device == "cuda" else "float32",
                       "gates": "Gated DeltaNet: logsigmoid(N(0,1)) per head; KDA: logsigmoid(N(0,1))/16 "
                                "per channel", "cuda_graphs": cfg["graphs"], "fla_error": fla_error},
            "rows": rows, "skipped": skipped, "summary": summary}


# --------------------------------------------------------------------------- parts 3-5: chapter scripts


def chunkwise_part(device: str, dry: bool) -> dict:
    import chunkwise

    ns = argparse.Namespace(quick=dry, repeats=2 if dry else 5)
    start, load_start = time.perf_counter(), os.getloadavg()[0]
    result = chunkwise.run_training(ns, device, Ts=[64, 128] if dry else None)
    info = machine(device)
    info["load_average_1min"] = {"start": load_start, "end": os.getloadavg()[0]}
    info["threads"] = torch.get_num_threads()
    info["device_name"] = info.get("gpu", info["cpu"])
    info["fla_core"] = versions()["fla-core"]
    return {"benchmark": "chunkwise", "quick": dry, "machine": info, **result,
            "wall_s": time.perf_counter() - start}


def decode_part(device: str, dry: bool) -> dict:
    import decode

    argv = ["--device", device, "--threads", str(torch.get_num_threads())]
    if dry:
        argv += ["--quick", "--tiny", "--bandwidth-bytes", str(1 << 22), "--layout-stream-bytes", str(1 << 20)]
    else:
        argv += ["--dtype", "bfloat16", "--runs", "3", "--runs-no-cache", "2", "--bandwidth-bytes", str(1 << 30)]
    return decode.run(decode.parse_args(argv))


def crossover_part(device: str, dry: bool, out: Path) -> Path:
    import crossover

    argv = ["--device", device, "--out", str(out / "crossover_cuda.json"),
            "--threads", str(torch.get_num_threads())]
    if dry:
        argv += ["--quick", "--max-n", "64", "--head-dims", "16", "--no-cache-max-n", "16",
                 "--direct-n", "16", "--direct-n-no-cache", "8", "--repeats", "1", "--min-time", "0.001"]
    else:
        argv += ["--repeats", "5", "--min-time", "0.02"]
    return crossover.main(argv)


# --------------------------------------------------------------------------- main


def configs(dry: bool) -> tuple[dict, dict]:
    """Sizes of parts 1 and 2: the real ones, or tiny ones for the dry run."""
    if dry:
        steps = dict(dtype=torch.float32, graphs=False, reps=2, kv_heads=2, kv_head_dim=8,
                     state_heads=2, state_dim=8, contexts=[16, 64], batches=[1, 2], min_left_s=0.0,
                     max_cache_bytes=1 << 30,
                     mla=MLAConfig(n_embd=32, n_heads=2, q_lora_rank=16, kv_lora_rank=16,
                                   qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, max_len=64))
        gates = dict(dtype=torch.float32, graphs=False, fla=False, reps=2, B=1, H=2, D=8,
                     chunk_size=16, Ts=[40, 64], min_left_s=0.0)
        return steps, gates
    steps = dict(dtype=torch.bfloat16, graphs=True, reps=20, kv_heads=32, kv_head_dim=128,
                 state_heads=32, state_dim=128, contexts=[1024, 4096, 16384, 65536, 262144, 1048576],
                 batches=[1, 8], min_left_s=60.0, max_cache_bytes=40 << 30, mla=MLAConfig.deepseek_v3())
    gates = dict(dtype=torch.bfloat16, graphs=True, fla=True, reps=5, B=1, H=16, D=128, chunk_size=64,
                 Ts=[4096, 8192, 16384, 32768, 65536], min_left_s=60.0)
    return steps, gates


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU, tiny shapes, no CUDA graphs, no fla kernels (needs --out)")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for the results files (default benchmarks/results)")
    ap.add_argument("--budget-s", type=float, default=450.0,
                    help="stop starting new measurements after this many seconds (default 450)")
    ap.add_argument("--parts", nargs="+", default=["steps", "gates", "chunkwise", "decode", "crossover"],
                    choices=["steps", "gates", "chunkwise", "decode", "crossover"])
    args = ap.parse_args(argv)
    if args.dry_run and args.out is None:
        ap.error("--dry-run needs --out DIR (a dry run never writes into benchmarks/results)")
    if not args.dry_run and not torch.cuda.is_available():
        ap.error("no CUDA device: nothing to measure (use --dry-run --out DIR to check the script)")
    if not math.isfinite(args.budget_s) or args.budget_s <= 0:
        ap.error("--budget-s must be a positive number of seconds")
    device = "cpu" if args.dry_run else "cuda"
    out = args.out if args.out is not None else _common.RESULTS
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget_s)
    started = time.perf_counter()
    steps_cfg, gates_cfg = configs(args.dry_run)
    run = {"benchmark": "gpu", "dry_run": args.dry_run, "device": device, "versions": versions(),
           "budget_s": args.budget_s, "parts": {}}
    print(f"GPU benchmarks on {device}{' (dry run)' if args.dry_run else ''}", flush=True)
    if device == "cuda":
        run["gpu"] = torch.cuda.get_device_name(0)
        run["copy_bytes_per_s"] = copy_bandwidth(device, 2 << 30)
        print(f"device-to-device copy: {run['copy_bytes_per_s'] / 1e12:.2f} TB/s", flush=True)

    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)

    def part(name: str, filename: str, fn, min_left_s: float) -> None:
        if name not in args.parts:
            return
        # every part starts from the same matmul settings (the chunkwise parts allow TF32)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
        if budget.left() < min_left_s:
            run["parts"][name] = {"status": "skipped (time budget)", "file": filename}
            print(f"{name}: skipped, {budget.left():.0f} s left", flush=True)
            return
        print(f"{name}:", flush=True)
        t0 = time.perf_counter()
        try:
            with _common.redirect(out):
                fn()
            status = {"status": "ok"}
        except Exception as err:  # noqa: BLE001 - record, go on with the next part
            traceback.print_exc()
            status = {"status": "failed", "error": f"{type(err).__name__}: {err}"[:1000]}
        run["parts"][name] = dict(status, file=filename, wall_s=time.perf_counter() - t0)

    def write_with_machine(name: str, payload: dict) -> None:
        info = machine(device)
        info.update(versions())
        write(name, {"benchmark": name.rsplit("_", 1)[0], "dry_run": args.dry_run, "machine": info,
                     **payload})

    dry = args.dry_run
    part("steps", "decode_steps_cuda.json",
         lambda: write_with_machine("decode_steps_cuda.json", decode_steps(steps_cfg, device, budget)),
         min_left_s=0.0)
    part("gates", "gates_cuda.json",
         lambda: write_with_machine("gates_cuda.json", gates_prefill(gates_cfg, device, budget)),
         min_left_s=0.0)
    part("chunkwise", "chunkwise_cuda.json",
         lambda: write("chunkwise_cuda.json", chunkwise_part(device, dry)), min_left_s=0 if dry else 90)
    part("decode", "decode_cuda.json",
         lambda: write("decode_cuda.json", decode_part(device, dry)), min_left_s=0 if dry else 90)
    part("crossover", "crossover_cuda.json", lambda: crossover_part(device, dry, out),
         min_left_s=0 if dry else 90)
    run["wall_s"] = time.perf_counter() - started
    with _common.redirect(out):
        path = write("gpu_run_cuda.json", run)
    print(f"wrote {path} in {run['wall_s']:.0f} s: " + ", ".join(
        f"{name} {p['status']}" for name, p in run["parts"].items()), flush=True)
    return run


if __name__ == "__main__":
    main()
