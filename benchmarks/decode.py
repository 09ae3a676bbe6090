"""Decode speed of GPT-2 small: no cache, concatenating cache, preallocated cache, the fast
decoder, Hugging Face -- against the memory-bandwidth bound.

    python benchmarks/decode.py                 # the chapter's numbers (about ten minutes on 2 cores)
    python benchmarks/decode.py --quick         # a smoke run
    python benchmarks/decode.py --device cuda --dtype bfloat16   # on a GPU, if there is one
    python benchmarks/decode.py --concat-sweep --threads 1   # only the long-context cache sweep (~2 minutes)

All five generators decode greedily from the same random GPT-2 small weights (Hugging Face's
``GPT2LMHeadModel`` is built first and its state dict loaded into ours), so they produce the
same tokens; the script checks that. The reference decoders are ``gpt2k3.model.generate``
(chapter 2's loop) without a cache, with the seed's concatenating cache and with the
preallocated ``KVCache``; the fast decoder is ``gpt2k3.models.gpt2_fast.FastDecoder`` (weights packed once
into the layout that streams fastest, preallocated buffers, no per-step bookkeeping). For each,
tokens/s is the median over ``--runs`` runs of prompt + ``--new-tokens`` greedy tokens. The
runs are interleaved -- every round runs each generator once, in turn -- so a busy moment on a
shared machine slows all of them alike, and every ratio comes from medians of the same rounds.

The memory-bandwidth bound divides the measured read bandwidth (a ``sum`` over 512 MiB, sampled
once per round, median) by the bytes one decode step must read: every weight once (the tied
embedding as the head; a single row of the position table) plus the KV cache at the average
context.

Also measured, to explain the fast decoder's speed with numbers:

* **weight layouts**: the bandwidth of one matrix-vector product per GPT-2 weight shape, with
  the weight stored ``(out, in)`` (``nn.Linear``, ``F.linear``) and ``(in, out)``
  (``x @ W_t``), streamed from memory (enough copies to exceed the caches), median of runs;
* **step breakdown**: one fast decode step against the same step's weight products alone (the
  difference is everything else: attention, LayerNorms, GELU, Python), side by side.

A last part times single decode steps against a KV cache filled to N positions (a
GPT-2-small-shaped model with a longer position table, so N can exceed 1,024) for the
reference forward and the fast decoder, and puts each next to its roofline prediction, bytes
moved / bandwidth.

``--concat-sweep`` runs a separate part instead: the **concatenating against the preallocated
cache at long context**.  A narrow model (4 layers, 256 wide, a 512-token vocabulary, so that a
step reads far more cache than weights) gets a cache filled with N random positions (8K, 16K
and 32K; the contents do not change the cost, and no O(N^2) prefill is run) and then decodes
``--concat-steps`` one-token steps through ``GPT.forward``'s body (as :func:`generate` calls it) -- the decode
step of ``gpt2k3.model.generate``, which reads nothing back to the host -- with each cache, the
two sampled in turn, every run from a freshly filled cache, median of ``--concat-runs`` runs.
Each row also holds the cache traffic of those steps
(:func:`gpt2k3.accounting.decode.decode_cache_traffic`), its ratio, the time that traffic plus
the weights would take at the measured read bandwidth, and the time of one step's ``torch.cat``
copies made into memory allocated once (the copying without the allocator).  On a shared
machine run it with ``--threads 1``: with two threads on two busy cores every small parallel
op waits for a descheduled thread.  It writes
``benchmarks/results/decode_concat_<device>.json``, with the machine and its load.

Writes ``benchmarks/results/decode_<device>.json``: the keys chapter 2 reads
(``tokens_per_s`` of the four reference generators and Hugging Face, ``ratios``,
``bandwidth_bound_tokens_per_s``, ``step_vs_context``, ...) plus ``fast_decoder``,
``weight_layouts`` and ``step_breakdown``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, median, read_bandwidth, sync, write  # noqa: E402

from gpt2k3.accounting.decode import decode_bytes, decode_cache_traffic  # noqa: E402
from gpt2k3.archs import spec_from_gpt_config  # noqa: E402
from gpt2k3.model import GPT, generate  # noqa: E402
from gpt2k3.models.gpt2 import from_hf_state_dict  # noqa: E402
from gpt2k3.models.gpt2_fast import FastDecoder  # noqa: E402
from gpt2k3.config import GPTConfig  # noqa: E402
from gpt2k3.cache import concat_cache  # noqa: E402

STEP = GPT.forward.__wrapped__  # forward's body, without its door: what generate calls each step

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FAST = "fast decoder"
#: a model small enough for a smoke run in seconds (``--tiny``)
TINY = dict(n_layer=2, n_head=4, n_embd=64, vocab_size=211, n_positions=64)
#: the long-context sweep's model (``--concat-sweep``): narrow, few layers, a small vocabulary,
#: so that at 8K+ tokens a step reads almost nothing but its cache
CONCAT_MODEL = dict(n_layer=4, n_head=4, n_embd=256, vocab_size=512)
CONCAT, PREALLOC = "concatenating cache", "preallocated cache"


def weight_bytes_per_token(model: GPT) -> int:
    """Bytes of parameters one decode step reads: all of them, except that only one row
    of the position table is touched (the token table is read in full as the tied head)."""
    p = next(model.parameters())
    wpe = model.transformer.wpe.weight
    n = model.num_params() - wpe.numel() + wpe.shape[1]
    return n * p.element_size()


def cache_bytes_per_token(config: GPTConfig, context: float, dtype_bytes: int) -> float:
    """Bytes of K and V one decode step reads at a given context length."""
    return 2 * config.n_layer * config.n_embd * context * dtype_bytes


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_generators(args, device, dtype) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    hf_config = GPT2Config(bos_token_id=0, eos_token_id=0, **(TINY if args.tiny else {}))
    hf = GPT2LMHeadModel(hf_config).eval()
    ours = from_hf_state_dict(hf.state_dict(), n_head=hf_config.n_head)
    hf, ours = hf.to(device=device, dtype=dtype), ours.to(device=device, dtype=dtype)
    prompt = torch.randint(0, ours.config.vocab_size, (args.batch, args.prompt),
                           generator=torch.Generator().manual_seed(1)).to(device)
    n = args.new_tokens
    start = time.perf_counter()
    fast = FastDecoder(ours, max_len=args.prompt + n, batch=args.batch)
    sync(device)
    pack_seconds = time.perf_counter() - start

    def hf_generate():
        return hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                           min_new_tokens=n, do_sample=False, use_cache=True, pad_token_id=0)

    generators = {
        "no cache": lambda: generate(ours, prompt, n, use_cache=False, temperature=0),
        "concatenating cache": lambda: generate(ours, prompt, n, temperature=0, cache=concat_cache(ours, args.batch)),
        "preallocated cache": lambda: generate(ours, prompt, n, temperature=0),
        "Hugging Face generate": hf_generate,
        FAST: lambda: fast.generate(prompt, n, temperature=0),
    }
    rounds = max(args.runs, args.runs_no_cache)
    runs = {name: [] for name in generators}
    bandwidth_samples = []
    with torch.no_grad():
        outputs = {name: fn() for name, fn in generators.items()}  # also the warm-up
        identical = {name: bool(torch.equal(outputs["preallocated cache"], o)) for name, o in outputs.items()}
        for r in range(rounds):
            bandwidth_samples.append(read_bandwidth(device, nbytes=args.bandwidth_bytes, runs=3))
            for name, fn in generators.items():
                if r < (args.runs_no_cache if name == "no cache" else args.runs):
                    runs[name].append(timed(lambda: (fn(), sync(device))))
            print(f"  round {r + 1}/{rounds}: " + ", ".join(
                f"{name} {args.batch * n / runs[name][-1]:.1f}" for name in generators
                if len(runs[name]) == r + 1) + " tokens/s", flush=True)
    tps = {name: args.batch * n / median(t) for name, t in runs.items()}

    bandwidth = median(bandwidth_samples)
    w_bytes = weight_bytes_per_token(ours)
    avg_ctx = args.prompt + (n - 1) / 2
    step_bytes = w_bytes + args.batch * cache_bytes_per_token(ours.config, avg_ctx, dtype.itemsize)
    bound_tps = args.batch * bandwidth / step_bytes
    pre, hf_tps, fast_tps = tps["preallocated cache"], tps["Hugging Face generate"], tps.pop(FAST)
    fast_runs = runs.pop(FAST)
    return {
        "tokens_identical": all(identical.values()),
        "tokens_identical_by_generator": identical,
        "runs_seconds": runs,
        "tokens_per_s": tps,
        "read_bandwidth_bytes_per_s": bandwidth,
        "read_bandwidth_samples": bandwidth_samples,
        "weight_bytes_per_step": w_bytes,
        "cache_bytes_per_step_at_average_context": step_bytes - w_bytes,
        "average_context": avg_ctx,
        "bandwidth_bound_tokens_per_s": bound_tps,
        "ratios": {
            "preallocated / Hugging Face": pre / hf_tps,
            "preallocated / no cache": pre / tps["no cache"],
            "preallocated / concatenating": pre / tps["concatenating cache"],
            "preallocated / bandwidth bound": pre / bound_tps,
            "fast / Hugging Face": fast_tps / hf_tps,
            "fast / preallocated": fast_tps / pre,
            "fast / bandwidth bound": fast_tps / bound_tps,
        },
        "fast_decoder": {
            "name": "gpt2k3.models.gpt2_fast.FastDecoder",
            "tokens_per_s": fast_tps,
            "runs_seconds": fast_runs,
            "pack_seconds": pack_seconds,
            "nbytes": fast.nbytes,
            "step_bytes_at_average_context": step_bytes,
            "effective_bytes_per_s": fast_tps / args.batch * step_bytes,
        },
        "_model": ours,  # for the later parts; removed before writing
        "_fast": fast,
    }


def bench_layouts(args, device, dtype, config: GPTConfig) -> list[dict]:
    """Bandwidth of one matrix-vector product for each weight shape of the model, stored
    ``(out, in)`` (``F.linear``) and ``(in, out)`` (``x @ W_t``), streamed from memory."""
    C, V = config.n_embd, config.vocab_size
    shapes = {"attention q/k/v (c_attn)": (3 * C, C), "attention output (c_proj)": (C, C),
              "MLP up (c_fc)": (4 * C, C), "MLP down (c_proj)": (C, 4 * C), "tied head (wte)": (V, C)}
    rows = []
    for name, (out_f, in_f) in shapes.items():
        nbytes = out_f * in_f * dtype.itemsize
        copies = max(2, math.ceil(args.layout_stream_bytes / nbytes))  # more than the caches hold
        g = torch.Generator().manual_seed(out_f + in_f)
        w0 = torch.randn(out_f, in_f, generator=g).to(device=device, dtype=dtype)
        ws = [w0.clone() for _ in range(copies)]  # distinct copies: each product reads memory
        wts = [w.t().contiguous() for w in ws]
        x = torch.randn(args.batch, in_f, generator=g).to(device=device, dtype=dtype)
        fns = {"(out, in): F.linear(x, W)": lambda: [F.linear(x, w) for w in ws],
               "(in, out): x @ W_t": lambda: [x @ w for w in wts]}
        times = {k: [] for k in fns}
        for fn in fns.values():
            fn()
        for _ in range(args.layout_runs):
            for k, fn in fns.items():
                times[k].append(timed(lambda: (fn(), sync(device))))
        row = {"weight": name, "out": out_f, "in": in_f, "copies": copies,
               "bytes_per_s": {k: copies * nbytes / median(t) for k, t in times.items()}}
        rows.append(row)
        print(f"  {name:28s} ({out_f} x {in_f}): " + ", ".join(
            f"{k} {v / 1e9:.1f} GB/s" for k, v in row["bytes_per_s"].items()), flush=True)
        del w0, ws, wts
    return rows


def bench_step_breakdown(args, device, fast: FastDecoder) -> dict:
    """One fast decode step against its weight products alone, side by side."""
    pos = args.prompt
    fast.prefill(torch.zeros(args.batch, args.prompt, dtype=torch.long, device=device))
    tok = torch.zeros(args.batch, dtype=torch.long, device=device)
    xs = {n: torch.randn(args.batch, n, dtype=fast.dtype, device=device)
          for n in {w.shape[0] for L in fast.layers for w in (L["w_qkv"], L["w_o"], L["w_fc"], L["w_mp"])}}

    def products():
        for L in fast.layers:
            for w in (L["w_qkv"], L["w_o"], L["w_fc"], L["w_mp"]):
                xs[w.shape[0]] @ w
        xs[fast.head.shape[0]] @ fast.head

    fns = {"step": lambda: fast.step(tok, pos), "weight products only": products}
    times = {k: [] for k in fns}
    with torch.no_grad():
        for fn in fns.values():
            fn()
        for _ in range(args.step_runs):
            for k, fn in fns.items():
                times[k].append(timed(lambda: (fn(), sync(device))))
    weights = sum(w.numel() * w.element_size() for L in fast.layers
                  for w in (L["w_qkv"], L["w_o"], L["w_fc"], L["w_mp"])) + fast.head.numel() * fast.head.element_size()
    step, prods = median(times["step"]), median(times["weight products only"])
    print(f"  fast step {1e3 * step:.2f} ms, its weight products alone {1e3 * prods:.2f} ms", flush=True)
    return {"context": pos + 1, "step_seconds": step, "weight_products_seconds": prods,
            "other_seconds": step - prods, "weight_bytes": weights,
            "weight_products_bytes_per_s": weights / prods, "samples": times}


def bench_step_vs_context(args, device, dtype, bandwidth) -> list[dict]:
    """Median time of one decode step against a cache filled to N positions (reference
    forward and fast decoder, sampled in turn)."""
    contexts = [c for c in args.contexts if c < args.max_context]
    base = dict(n_layer=TINY["n_layer"], n_head=TINY["n_head"], n_embd=TINY["n_embd"]) if args.tiny else {}
    config = GPTConfig(block_size=args.max_context, vocab_size=TINY["vocab_size"] if args.tiny else 50257,
                       **base)
    torch.manual_seed(0)
    model = GPT(config).to(device=device, dtype=dtype).eval()
    w_bytes = weight_bytes_per_token(model)
    rows = []
    with torch.no_grad():
        for n in contexts:
            cache = model.new_cache(args.batch, n + 1, dtype=dtype, device=device)
            fast = FastDecoder(model, max_len=n + 1, batch=args.batch)
            for buf in (*(c.k for c in cache), *(c.v for c in cache), *fast.k, *fast.v):
                buf.normal_()  # filled: contents do not change the cost
            tok = torch.zeros(args.batch, 1, dtype=torch.long, device=device)

            def step():
                for layer_cache in cache:  # rewind: every step decodes at context n
                    layer_cache.length = n
                STEP(model, tok, cache)  # generate's decode step

            fns = {"reference": step, "fast": lambda: fast.step(tok[:, 0], n)}
            times = {k: [] for k in fns}
            for fn in fns.values():
                for _ in range(2):
                    fn()
            for _ in range(args.step_runs):
                for k, fn in fns.items():
                    times[k].append(timed(lambda: (fn(), sync(device))))
            t, t_fast = median(times["reference"]), median(times["fast"])
            moved = w_bytes + args.batch * cache_bytes_per_token(config, n, dtype.itemsize)
            rows.append({"context": n, "seconds": t, "fast_seconds": t_fast, "bytes_moved": moved,
                         "roofline_seconds": moved / bandwidth})
            print(f"  step at N={n}: reference {1e3 * t:.2f} ms, fast {1e3 * t_fast:.2f} ms "
                  f"(roofline {1e3 * moved / bandwidth:.2f} ms)", flush=True)
            del cache, fast
    return rows


def bench_concat_vs_preallocated(args, device, dtype) -> dict:
    """The concatenating and the preallocated cache at long context, side by side: for each
    N, ``--concat-steps`` decode steps after a cache filled with N positions, each run from a
    freshly filled cache, the two caches sampled in turn; median of ``--concat-runs`` runs."""
    contexts, n_steps, B = list(args.concat_contexts), args.concat_steps, args.batch
    config = GPTConfig(block_size=max(contexts) + n_steps, **CONCAT_MODEL)
    spec = spec_from_gpt_config(config, name="concat sweep model")
    H, D = config.n_head, config.n_embd // config.n_head
    torch.manual_seed(0)
    model = GPT(config).to(device=device, dtype=dtype).eval()
    load_start = os.getloadavg()[0]
    start = time.perf_counter()
    bandwidth = median([read_bandwidth(device, nbytes=args.bandwidth_bytes, runs=3) for _ in range(3)])
    weights = decode_bytes(spec, 0, B, dtype.itemsize).weights
    rows = []
    with torch.no_grad():
        for n in contexts:
            g = torch.Generator().manual_seed(n)
            prefix = [(torch.randn(B, H, n, D, generator=g).to(device=device, dtype=dtype),
                       torch.randn(B, H, n, D, generator=g).to(device=device, dtype=dtype))
                      for _ in range(config.n_layer)]
            tokens = torch.randint(0, config.vocab_size, (B, n_steps), generator=g).to(device)

            def filled(kind):
                cache = (concat_cache(model, B) if kind == CONCAT
                         else model.new_cache(B, n + n_steps, dtype=dtype, device=device))
                for layer, (k, v) in zip(cache, prefix):  # N cached positions, no prefill run
                    layer.extend(k, v)
                sync(device)
                return cache

            def decode(cache) -> float:
                t0 = time.perf_counter()
                for i in range(n_steps):
                    STEP(model, tokens[:, i:i + 1], cache)  # generate's decode step
                sync(device)
                return (time.perf_counter() - t0) / n_steps

            samples = {PREALLOC: [], CONCAT: []}
            for r in range(args.concat_runs + 1):  # the first round is the warm-up
                for kind in samples:
                    cache = filled(kind)
                    seconds = decode(cache)
                    assert cache.length == n + n_steps
                    if r:
                        samples[kind].append(seconds)
                    del cache
            # the same copies torch.cat makes at this context, into memory allocated once:
            # what the copying costs without the allocator
            new = torch.zeros(B, H, 1, D, device=device, dtype=dtype)
            outs = [torch.empty(B, H, n + 1, D, device=device, dtype=dtype) for _ in range(2 * config.n_layer)]

            def copies():
                for out, (k, v) in zip(outs, [kv for kv in prefix for _ in range(2)]):
                    torch.cat((k, new), dim=2, out=out)
                sync(device)

            copies()
            copy_seconds = median([timed(copies) for _ in range(args.concat_runs)])
            del outs
            traffic = decode_cache_traffic(spec, n, n_steps, B, dtype.itemsize)
            moved = {PREALLOC: weights + traffic.preallocated / n_steps,
                     CONCAT: weights + traffic.concatenating / n_steps}
            med = {kind: median(t) for kind, t in samples.items()}
            rows.append({
                "context": n,
                "seconds_per_step": med,
                "ratio": med[CONCAT] / med[PREALLOC],
                "samples": samples,
                "cache_bytes_per_step": {PREALLOC: traffic.preallocated / n_steps,
                                         CONCAT: traffic.concatenating / n_steps},
                "traffic_ratio": traffic.ratio,
                "bytes_per_step": moved,
                "roofline_seconds": {kind: b / bandwidth for kind, b in moved.items()},
                "copies_into_reused_memory_seconds": copy_seconds,
            })
            print(f"  N={n}: preallocated {1e3 * med[PREALLOC]:.2f} ms/step, concatenating "
                  f"{1e3 * med[CONCAT]:.2f} ms/step: {med[CONCAT] / med[PREALLOC]:.2f}x "
                  f"(cache traffic {traffic.ratio:.2f}x); one step's copies into reused memory "
                  f"{1e3 * copy_seconds:.2f} ms", flush=True)
            del prefix
    info = machine(device)
    info["load_average_1min"] = {"start": load_start, "end": os.getloadavg()[0]}
    return {"machine": info, "quick": args.quick,
            "config": {"device": device, "dtype": args.dtype, "threads": args.threads, "batch": B,
                       "contexts": contexts, "steps": n_steps, "runs": args.concat_runs,
                       "bandwidth_bytes": args.bandwidth_bytes},
            "model": {**CONCAT_MODEL, "block_size": config.block_size,
                      "note": "random weights; the cache filled with random keys and values"},
            "weight_bytes_per_step": weights,
            "read_bandwidth_bytes_per_s": bandwidth,
            "rows": rows, "wall_s": time.perf_counter() - start}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--runs-no-cache", type=int, default=3)
    ap.add_argument("--step-runs", type=int, default=9)
    ap.add_argument("--layout-runs", type=int, default=7)
    ap.add_argument("--layout-stream-bytes", type=int, default=1 << 29,
                    help="bytes of weight copies streamed per layout sample (default 512 MiB)")
    ap.add_argument("--bandwidth-bytes", type=int, default=1 << 29,
                    help="buffer summed to measure read bandwidth (default 512 MiB)")
    ap.add_argument("--contexts", type=int, nargs="+",
                    default=[16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--max-context", type=int, default=32769)
    ap.add_argument("--concat-sweep", action="store_true",
                    help="run only the long-context sweep of the concatenating against the "
                         "preallocated cache; writes decode_concat_<device>.json")
    ap.add_argument("--concat-contexts", type=int, nargs="+", default=[8192, 16384, 32768])
    ap.add_argument("--concat-steps", type=int, default=16, help="decode steps per run of the sweep")
    ap.add_argument("--concat-runs", type=int, default=11, help="runs per cache and context of the sweep")
    ap.add_argument("--quick", action="store_true", help="tiny run to check the script works")
    ap.add_argument("--tiny", action="store_true",
                    help="a 2-layer, 64-wide model instead of GPT-2 small (smoke tests only)")
    ap.add_argument("--out", default=None, help="results file name (default decode_<device>.json)")
    args = ap.parse_args(argv)
    if args.quick:
        args.new_tokens, args.runs, args.runs_no_cache, args.step_runs = 16, 1, 1, 2
        args.layout_runs = 2
        args.layout_stream_bytes = min(args.layout_stream_bytes, 1 << 26)
        args.bandwidth_bytes = min(args.bandwidth_bytes, 1 << 26)
        args.contexts, args.max_context = [16, 256], 257
        args.concat_contexts, args.concat_steps, args.concat_runs = [64, 256], 2, 1
    if args.tiny:
        args.max_context = min(args.max_context, TINY["n_positions"])
        args.new_tokens = min(args.new_tokens, TINY["n_positions"] - args.prompt)
    return args


def run(args) -> dict:
    """Every part of the benchmark; returns the payload (written by :func:`main`)."""
    torch.set_num_threads(args.threads)
    device, dtype = args.device, DTYPES[args.dtype]
    load_start = os.getloadavg()[0]
    start = time.perf_counter()
    print(f"decode benchmark on {device} ({args.dtype}, {torch.get_num_threads()} threads)", flush=True)
    gen = bench_generators(args, device, dtype)
    model, fast = gen.pop("_model"), gen.pop("_fast")
    layouts = []  # on a GPU one small product is a kernel launch, not a memory stream: CPU only
    if device == "cpu":
        print("weight layouts (one matrix-vector product, streamed from memory):", flush=True)
        layouts = bench_layouts(args, device, dtype, model.config)
    print("step breakdown:", flush=True)
    breakdown = bench_step_breakdown(args, device, fast)
    del model, fast
    print("one step against a filled cache:", flush=True)
    steps = bench_step_vs_context(args, device, dtype, gen["read_bandwidth_bytes_per_s"])
    info = machine(device)
    # on a shared machine other jobs slow everything: record how busy it was
    info["load_average_1min"] = {"start": load_start, "end": os.getloadavg()[0]}
    info["transformers"] = __import__("transformers").__version__  # whose generate was timed
    return {"machine": info, "quick": args.quick, "tiny": args.tiny,
            "config": {k: v for k, v in vars(args).items() if k not in ("quick", "out", "tiny")},
            "model": ("tiny GPT-2-shaped model (random weights)" if args.tiny
                      else "GPT-2 small (random weights), vocab 50257"),
            **gen, "weight_layouts": layouts, "step_breakdown": breakdown, "step_vs_context": steps,
            "wall_s": time.perf_counter() - start}


def summary_lines(payload: dict) -> list[str]:
    tps = dict(payload["tokens_per_s"])
    tps[FAST] = payload["fast_decoder"]["tokens_per_s"]
    lines = [f"{name:>24}: {v:8.2f} tokens/s" for name, v in tps.items()]
    lines.append(f"{'bandwidth bound':>24}: {payload['bandwidth_bound_tokens_per_s']:8.2f} tokens/s "
                 f"({payload['read_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s)")
    lines += [f"{name:>32}: {r:.2f}" for name, r in payload["ratios"].items()]
    return lines


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.concat_sweep:
        torch.set_num_threads(args.threads)
        print(f"concatenating vs preallocated cache on {args.device} ({args.dtype}, "
              f"{torch.get_num_threads()} threads):", flush=True)
        payload = bench_concat_vs_preallocated(args, args.device, DTYPES[args.dtype])
        name = f"decode_concat_{args.device.split(':')[0]}{'_quick' if args.quick else ''}.json"
        path = write(args.out or name, payload)
        print(f"wrote {path} in {payload['wall_s']:.0f} s")
        return
    payload = run(args)
    path = write(args.out or f"decode_{args.device.split(':')[0]}.json", payload)
    print("\n".join(summary_lines(payload)))
    print(f"wrote {path} in {payload['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
