"""Decode speed of GPT-2 small: no cache, concatenating cache, preallocated cache, Hugging Face.

    python benchmarks/decode.py                 # the chapter's numbers (several minutes on 2 cores)
    python benchmarks/decode.py --quick         # a smoke run
    python benchmarks/decode.py --device cuda --dtype bfloat16   # on a GPU, if there is one

All four generators decode greedily from the same random GPT-2 small weights (Hugging
Face's ``GPT2LMHeadModel`` is built first and its state dict loaded into ours), so they
produce the same tokens; the script checks that.  For each, tokens/s is the median
over ``--runs`` runs of prompt + ``--new-tokens`` greedy tokens, timed side by side in
one process.  The memory-bandwidth bound divides the measured read bandwidth by the
bytes one decode step must read: every weight once (the tied embedding as the head; a
single row of the position table) plus the KV cache at the average context.

A second part times single decode steps against a KV cache filled to N positions (a
GPT-2-small-shaped model with a longer position table, so N can exceed 1,024) and
puts each next to its roofline prediction, bytes moved / bandwidth.

Writes ``benchmarks/results/decode_<device>.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, median, read_bandwidth, time_call, write  # noqa: E402

from gpt2k3.gpt2 import GPT, GPTConfig, generate  # noqa: E402
from gpt2k3.kv_cache import KVCache  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


def bench_generators(args, device, dtype) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(bos_token_id=0, eos_token_id=0)).eval()
    ours = GPT.from_hf_state_dict(hf.state_dict(), n_head=12)
    hf, ours = hf.to(device=device, dtype=dtype), ours.to(device=device, dtype=dtype)
    prompt = torch.randint(0, ours.config.vocab_size, (args.batch, args.prompt),
                           generator=torch.Generator().manual_seed(1)).to(device)
    n = args.new_tokens

    def hf_generate():
        return hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                           min_new_tokens=n, do_sample=False, use_cache=True, pad_token_id=0)

    generators = {
        "no cache": lambda: generate(ours, prompt, n, use_cache=False, temperature=0),
        "concatenating cache": lambda: generate(ours, prompt, n, temperature=0, cache_impl="concat"),
        "preallocated cache": lambda: generate(ours, prompt, n, temperature=0),
        "Hugging Face generate": hf_generate,
    }
    with torch.no_grad():
        outputs = {name: fn() for name, fn in generators.items()}
        identical = all(torch.equal(outputs["preallocated cache"], o) for o in outputs.values())
        runs = {}
        for name, fn in generators.items():
            r = args.runs_no_cache if name == "no cache" else args.runs
            print(f"  {name}: {r} runs", flush=True)
            runs[name] = time_call(fn, r, device, warmup=0)
    tps = {name: args.batch * n / median(t) for name, t in runs.items()}

    bandwidth = read_bandwidth(device)
    w_bytes = weight_bytes_per_token(ours)
    avg_ctx = args.prompt + (n - 1) / 2
    step_bytes = w_bytes + args.batch * cache_bytes_per_token(ours.config, avg_ctx, dtype.itemsize)
    bound_tps = args.batch * bandwidth / step_bytes
    pre = tps["preallocated cache"]
    return {
        "tokens_identical": identical,
        "runs_seconds": runs,
        "tokens_per_s": tps,
        "read_bandwidth_bytes_per_s": bandwidth,
        "weight_bytes_per_step": w_bytes,
        "cache_bytes_per_step_at_average_context": step_bytes - w_bytes,
        "average_context": avg_ctx,
        "bandwidth_bound_tokens_per_s": bound_tps,
        "ratios": {
            "preallocated / Hugging Face": pre / tps["Hugging Face generate"],
            "preallocated / no cache": pre / tps["no cache"],
            "preallocated / concatenating": pre / tps["concatenating cache"],
            "preallocated / bandwidth bound": pre / bound_tps,
        },
    }


def bench_step_vs_context(args, device, dtype, bandwidth) -> list[dict]:
    """Median time of one decode step against a cache filled to N positions."""
    contexts = [c for c in args.contexts if c < args.max_context]
    config = GPTConfig(block_size=args.max_context, vocab_size=50257)
    torch.manual_seed(0)
    model = GPT(config).to(device=device, dtype=dtype).eval()
    w_bytes = weight_bytes_per_token(model)
    rows = []
    with torch.no_grad():
        for n in contexts:
            cache = KVCache.for_model(config, batch=args.batch, max_len=n + 1, dtype=dtype, device=device)
            for k, v in zip(cache.k, cache.v):  # a filled cache: contents do not change the cost
                k.normal_()
                v.normal_()
            tok = torch.zeros(args.batch, 1, dtype=torch.long, device=device)

            def step():
                cache.length = n
                model(tok, cache=cache)

            t = median(time_call(step, args.step_runs, device, warmup=2))
            moved = w_bytes + args.batch * cache_bytes_per_token(config, n, dtype.itemsize)
            rows.append({"context": n, "seconds": t, "bytes_moved": moved,
                         "roofline_seconds": moved / bandwidth})
            print(f"  step at N={n}: {1e3 * t:.2f} ms (roofline {1e3 * moved / bandwidth:.2f} ms)",
                  flush=True)
    return rows


def main(argv=None) -> None:
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
    ap.add_argument("--contexts", type=int, nargs="+",
                    default=[16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--max-context", type=int, default=32769)
    ap.add_argument("--quick", action="store_true", help="tiny run to check the script works")
    ap.add_argument("--out", default=None, help="results file name (default decode_<device>.json)")
    args = ap.parse_args(argv)
    if args.quick:
        args.new_tokens, args.runs, args.runs_no_cache, args.step_runs = 16, 1, 1, 2
        args.contexts, args.max_context = [16, 256], 257
    torch.set_num_threads(args.threads)
    device, dtype = args.device, DTYPES[args.dtype]
    print(f"decode benchmark on {device} ({args.dtype}, {torch.get_num_threads()} threads)", flush=True)
    gen = bench_generators(args, device, dtype)
    steps = bench_step_vs_context(args, device, dtype, gen["read_bandwidth_bytes_per_s"])
    payload = {"machine": machine(device), "quick": args.quick,
               "config": {k: v for k, v in vars(args).items() if k not in ("quick", "out")},
               "model": "GPT-2 small (random weights), vocab 50257", **gen, "step_vs_context": steps}
    path = write(args.out or f"decode_{device.split(':')[0]}.json", payload)
    for name, v in gen["tokens_per_s"].items():
        print(f"{name:>24}: {v:8.2f} tokens/s")
    print(f"{'bandwidth bound':>24}: {gen['bandwidth_bound_tokens_per_s']:8.2f} tokens/s "
          f"({gen['read_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s)")
    for name, r in gen["ratios"].items():
        print(f"{name:>32}: {r:.2f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
