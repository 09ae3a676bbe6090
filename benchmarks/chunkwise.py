"""DeltaNet in parallel: how much faster is the chunkwise (WY / UT-transform) form?

On the CPU (the default) the script times, side by side in the same process, for batch 1,
4 heads and head dimension 64 (float32):

* **recurrent** -- :func:`gpt2k3.ops.delta.recurrent`, the definition, token by token;
* **chunkwise** -- :func:`gpt2k3.ops.delta.chunkwise` at chunk sizes 32 and 64;
* **fla_naive_chunkwise** -- flash-linear-attention's pure-PyTorch chunkwise reference
  (``fla/ops/delta_rule/naive.py``, loaded by file path as the tests load it; it needs ``T`` to
  be a multiple of its chunk size, 64 here),

for T = 256 ... 8192, and ours alone at T = 4096 for chunk sizes 8 ... 256. In every round each
method runs once, in turn, so that a busy machine slows all of them alike; a time is the median
of ``--repeats`` rounds, and every speed-up is a ratio of two medians from the same run. Every
output is also compared with the recurrent form (the largest absolute difference is recorded).

With ``--device cuda`` (only where a GPU is present; nothing else needs one) it times, for
batch 1, 16 heads and head dimension 128 at T = 4K ... 64K: ours eagerly (chunk sizes 64 and
128), ours with the loop over chunks captured in one CUDA graph, fla's Triton chunk kernel
(``fla.ops.delta_rule.chunk_delta_rule``, bfloat16, the training form) and causal softmax
attention (``F.scaled_dot_product_attention(..., is_causal=True)``, bfloat16, flash attention
where available). Ours computes in float32 (TF32 matmuls allowed) from bfloat16 inputs. A method
that fails is recorded with its error instead of stopping the run.

Results: ``benchmarks/results/chunkwise_<device>.json`` (machine, versions, configuration, every
sample, medians, ratios, and a summary the chapter quotes).

    python benchmarks/chunkwise.py                 # full CPU run, 10-20 s on an idle 2-core CPU
    python benchmarks/chunkwise.py --quick         # a smoke run (same file, marked "quick")
    python benchmarks/chunkwise.py --device cuda   # the GPU comparison, to chunkwise_cuda.json
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # fla_oracle: fla's naive references by file path
from _common import machine, rounds, sync, write  # noqa: E402

from gpt2k3.checks import compute_dtype  # noqa: E402
from gpt2k3.ops import delta, gated_delta  # noqa: E402


def inputs(B, H, T, D, device, dtype=torch.float32, seed=0):
    """L2-normalised q, k (as a DeltaNet layer makes them), values, beta = sigmoid(.) in (0, 1)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = F.normalize(torch.randn(B, H, T, D, generator=g), dim=-1)
    k = F.normalize(torch.randn(B, H, T, D, generator=g), dim=-1)
    v = torch.randn(B, H, T, D, generator=g)
    beta = torch.rand(B, H, T, generator=g).sigmoid()
    return [x.to(device=device, dtype=dtype) for x in (q, k, v, beta)]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


# --------------------------------------------------------------------------- CPU


def run_cpu(args) -> dict:
    from fla_oracle import load_naive

    naive = load_naive("delta_rule")
    B, H, D = 1, 4, 64
    Ts = [256, 1024, 4096] if args.quick else [256, 512, 1024, 2048, 4096, 8192]
    ours_chunks = [32, 64]
    fla_chunk = 64
    sweep_T = 4096
    sweep_chunks = [16, 64, 256] if args.quick else [8, 16, 32, 64, 128, 256]
    rows = []
    for T in Ts:
        q, k, v, beta = inputs(B, H, T, D, "cpu")
        q_fla = q * D**0.5  # fla's reference always scales q by D**-0.5: undo it
        out = {}  # (method, chunk size) -> the outputs of its last call

        def keep(key, fn):
            def call():
                out[key] = fn()[0]
            return call

        fns = {("recurrent", None): lambda: delta.recurrent(q, k, v, beta)}
        for c in ours_chunks:
            fns[("chunkwise", c)] = lambda c=c: delta.chunkwise(q, k, v, beta, chunk_size=c)
        fns[("fla_naive_chunkwise", fla_chunk)] = lambda: naive.delta_rule_chunkwise(
            q_fla, k, v, beta, chunk_size=fla_chunk)
        times = rounds({key: keep(key, fn) for key, fn in fns.items()}, args.repeats, "cpu")
        ref = out[("recurrent", None)]
        for (method, c), ts in times.items():
            rows.append({"sweep": "T", "method": method, "chunk_size": c, "T": T,
                         "median_s": statistics.median(ts), "times_s": ts,
                         "max_abs_diff_vs_recurrent": max_diff(out[(method, c)], ref)})
        print(f"T = {T:5d}: " + ", ".join(
            f"{m}{'' if c is None else f'[{c}]'} {1e3 * statistics.median(ts):.2f} ms"
            for (m, c), ts in times.items()), flush=True)
        del q, k, v, beta, q_fla, out
        gc.collect()

    q, k, v, beta = inputs(B, H, sweep_T, D, "cpu")
    fns = {c: (lambda c=c: delta.chunkwise(q, k, v, beta, chunk_size=c)) for c in sweep_chunks}
    times = rounds(fns, args.repeats, "cpu")
    for c, ts in times.items():
        rows.append({"sweep": "chunk_size", "method": "chunkwise", "chunk_size": c, "T": sweep_T,
                     "median_s": statistics.median(ts), "times_s": ts})
    print(f"T = {sweep_T}, by chunk size: " + ", ".join(
        f"{c}: {1e3 * statistics.median(ts):.2f} ms" for c, ts in times.items()), flush=True)
    return {"config": {"B": B, "H": H, "D": D, "dtype": "float32", "Ts": Ts,
                       "chunk_sizes": ours_chunks, "fla_chunk_size": fla_chunk,
                       "sweep_T": sweep_T, "sweep_chunk_sizes": sweep_chunks,
                       "repeats": args.repeats},
            "rows": rows, "summary": summarize(rows, Ts)}


def summarize(rows: list[dict], Ts: list[int]) -> dict:
    """Speed-ups (ratios of medians from the same run) at T = 4096 and at the largest T."""
    med = {(r["method"], r["chunk_size"], r["T"]): r["median_s"] for r in rows if r["sweep"] == "T"}
    summary = {"max_T": max(Ts), "speedup_vs_recurrent": {}, "speedup_vs_fla_naive": {},
               "max_abs_diff_vs_recurrent": {}}
    for (method, c, T), t in med.items():
        if method != "chunkwise":
            continue
        key = f"C={c},T={T}"
        summary["speedup_vs_recurrent"][key] = med[("recurrent", None, T)] / t
        fla = [v for (m, _, TT), v in med.items() if m == "fla_naive_chunkwise" and TT == T]
        if fla:
            summary["speedup_vs_fla_naive"][key] = fla[0] / t
    for r in rows:
        if "max_abs_diff_vs_recurrent" in r and r["method"] != "recurrent":
            name = f"{r['method']}[{r['chunk_size']}]"
            summary["max_abs_diff_vs_recurrent"][name] = max(
                summary["max_abs_diff_vs_recurrent"].get(name, 0.0), r["max_abs_diff_vs_recurrent"])
    return summary


# --------------------------------------------------------------------------- CUDA


def run_training(args, device: str = "cuda", Ts=None) -> dict:
    """The training-form comparison: ours against fla's Triton kernel and causal SDPA.

    Meant for ``device="cuda"``; on the CPU (``Ts`` small) it runs only ours and SDPA, which is
    how this code path is smoke-tested on machines without a GPU.
    """
    cuda = device == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    B, H, D = 1, 16, 128
    if Ts is None:
        Ts = [4096, 16384] if args.quick else [4096, 8192, 16384, 32768, 65536]
    rows = []
    chunk_delta_rule = None
    if cuda:
        try:
            from fla.ops.delta_rule import chunk_delta_rule
        except Exception as err:  # fla's Triton kernels need triton and a GPU
            print(f"fla's Triton kernel is unavailable: {err!r}", flush=True)
    dtype = torch.bfloat16 if cuda else torch.float32
    for T in Ts:
        q, k, v, beta = inputs(B, H, T, D, device, dtype)
        out, fns = {}, {}
        for c in (64, 128):
            fns[("chunkwise", c)] = lambda c=c: out.__setitem__(
                ("chunkwise", c), delta.chunkwise(q, k, v, beta, chunk_size=c)[0])
        if cuda:
            try:
                fns[("chunkwise_cuda_graph", 64)] = graphed_chunkwise(q, k, v, beta, 64, out)
            except Exception as err:
                rows.append({"sweep": "T", "method": "chunkwise_cuda_graph", "chunk_size": 64, "T": T,
                             "error": repr(err)})
        if chunk_delta_rule is not None:
            qt, kt, vt, bt = (x.transpose(1, 2).contiguous() for x in (q, k, v, beta))
            fns[("fla_chunk", 64)] = lambda: out.__setitem__(
                ("fla_chunk", 64), chunk_delta_rule(qt, kt, vt, bt, scale=1.0)[0].transpose(1, 2))
        fns[("sdpa_causal", None)] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        for key, fn in list(fns.items()):  # drop (and record) any method that fails
            try:
                fn()
                sync(device)
            except Exception as err:
                rows.append({"sweep": "T", "method": key[0], "chunk_size": key[1], "T": T,
                             "error": repr(err)})
                del fns[key]
        times = rounds(fns, args.repeats, device, warmup=2)
        ref = out.get(("chunkwise", 64))
        for key, ts in times.items():
            row = {"sweep": "T", "method": key[0], "chunk_size": key[1], "T": T,
                   "median_s": statistics.median(ts), "times_s": ts}
            if ref is not None and key in out and key != ("chunkwise", 64):
                row["max_abs_diff_vs_chunkwise64"] = max_diff(out[key], ref)
            rows.append(row)
        print(f"T = {T:6d}: " + ", ".join(
            f"{m}[{c}] {1e3 * statistics.median(ts):.3f} ms" for (m, c), ts in times.items()), flush=True)
        del q, k, v, beta, out, fns
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    med = {(r["method"], r["chunk_size"], r["T"]): r["median_s"] for r in rows if "median_s" in r}
    summary = {"max_T": max(Ts)}
    for (m, c, T), t in med.items():
        if m.startswith("chunkwise"):
            if ("fla_chunk", 64, T) in med:
                summary[f"{m}[{c}] / fla_chunk at T={T}"] = t / med[("fla_chunk", 64, T)]
            if ("sdpa_causal", None, T) in med:
                summary[f"{m}[{c}] / sdpa_causal at T={T}"] = t / med[("sdpa_causal", None, T)]
    return {"config": {"B": B, "H": H, "D": D, "inputs": str(dtype).replace("torch.", ""),
                       "ours_compute": "float32 (TF32 matmuls)" if cuda else "float32",
                       "Ts": Ts, "repeats": args.repeats}, "rows": rows, "summary": summary}


def graphed_chunkwise(q, k, v, beta, chunk_size, out):
    """Ours with every kernel of one call captured in a CUDA graph (no launch overhead).

    Captures the body of :func:`gpt2k3.ops.delta.chunkwise` (``chunkwise.__wrapped__``, what
    runs after its door's checks) on inputs cast outside the capture; replaying the graph
    recomputes the whole sequence.
    """
    cdt = compute_dtype(q, k, v, beta)  # what delta.chunkwise computes in
    qs, ks, vs, bs = (x.to(cdt) for x in (q, k, v, beta))
    S0 = qs.new_zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            delta.chunkwise.__wrapped__(qs, ks, vs, bs, initial_state=S0, chunk_size=chunk_size)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_static, _ = delta.chunkwise.__wrapped__(qs, ks, vs, bs, initial_state=S0, chunk_size=chunk_size)

    def replay():
        graph.replay()
        out[("chunkwise_cuda_graph", chunk_size)] = o_static

    return replay


# --------------------------------------------------------------------------- main


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--repeats", type=int, default=None,
                        help="rounds per measurement (default 7, or 3 with --quick)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (3 if args.quick else 7)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device here; nothing was measured or written")
    start, load_start = time.perf_counter(), os.getloadavg()[0]
    result = run_training(args, "cuda") if args.device == "cuda" else run_cpu(args)
    info = machine(args.device)
    # other processes on the machine slow every method, and tiny multi-threaded operations (the
    # recurrence) more than large ones: record how busy the machine was
    info["load_average_1min"] = {"start": load_start, "end": os.getloadavg()[0]}
    info["threads"] = torch.get_num_threads()
    info["device_name"] = info.get("gpu", info["cpu"])
    try:
        info["fla_core"] = metadata.version("fla-core")
    except metadata.PackageNotFoundError:
        info["fla_core"] = None
    payload = {"benchmark": "chunkwise", "quick": args.quick, "machine": info, **result,
               "wall_s": time.perf_counter() - start}
    path = write(f"chunkwise_{args.device}.json", payload)
    print(f"wrote {path} in {payload['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
