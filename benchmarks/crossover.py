"""Where does a fixed-size state beat a KV cache?  Time per decode step against context length.

For one attention layer (batch 1, 12 heads, float32 by default) at head dims 64 and 128, and
context lengths N = 1, 2, 4, ..., 65,536, the script times, side by side in the same run:

* **KV cache** -- write the new key and value into preallocated key and value buffers holding
  N - 1 earlier positions, then one query attends over all N with
  :func:`gpt2k3.ops.softmax.parallel` (``Tq = 1``: two matrix products).  O(N D) per step.
* **linear state** -- :func:`gpt2k3.ops.linear.decode_step` after the ``elu1`` feature map:
  update ``(S, z)`` in place and read it.  O(D^2) per step, whatever N is.
* **no cache** (the 2020 baseline) -- at step n the layer recomputes causal attention for all
  n positions (``F.scaled_dot_product_attention(..., is_causal=True)``) and keeps the last.
  O(n^2 D) per step; measured up to ``--no-cache-max-n`` and extrapolated beyond with a power
  law fitted to the last measured points (flagged as such in the results).

The two decode steps are the public functions chapter 3 shows, timed as they are: their one
argument check reads shapes and dtypes only, never a value, so it costs microseconds of Python
and no second pass over the cache.

At every N the two decode steps are sampled alternately, so their ratio is measured under the
same conditions; every time is the median of ``--repeats`` samples, each sample averaging
enough calls to last at least ``--min-time`` seconds.  From the per-step times the script
derives the crossover N where the state starts to win (:func:`gpt2k3.book.figures.linear.crossover_n`)
and the total time to generate N tokens with each method
(:func:`gpt2k3.book.figures.linear.generation_totals`: the sum of the step times at contexts
1..N), and checks those sums against generating ``--direct-n`` tokens end to end.  It also
times the rest of a GPT-2-style block for one token (LayerNorms, the q/k/v and output
projections, the MLP at ``n_embd = heads * D``), the per-token cost that no attention variant
removes.

Results: ``benchmarks/results/crossover_<device>.json`` with the machine and versions.

    python benchmarks/crossover.py            # full run, 2-3 minutes on a 2-core CPU
    python benchmarks/crossover.py --quick    # a smoke run (same file, marked "quick")
    python benchmarks/crossover.py --device cuda   # the same on a GPU, to crossover_cuda.json

On a machine shared with other jobs pass ``--threads 1``: with more intra-op threads than free
cores, every small op can wait a scheduler time slice for a descheduled thread, and the
microsecond-scale decode steps turn into milliseconds.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, calibrated_medians, machine, write  # noqa: E402

from gpt2k3.book.figures.linear import crossover_n, generation_totals  # noqa: E402
from gpt2k3.config import GPTConfig  # noqa: E402
from gpt2k3.model import Block  # noqa: E402
from gpt2k3.ops import linear, softmax  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def run_head_dim(D: int, args, device: str, dtype: torch.dtype) -> dict:
    H, g = args.heads, torch.Generator(device=device).manual_seed(D)
    ns = [2 ** i for i in range(args.max_n.bit_length()) if 2 ** i <= args.max_n]

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=dtype)

    q_t, k_t, v_t = randn(1, H, 1, D), randn(1, H, 1, D), randn(1, H, 1, D)
    k_buf, v_buf = randn(1, H, ns[-1], D), randn(1, H, ns[-1], D)  # a preallocated KV cache
    scale = D ** -0.5
    S = linear.elu1(randn(1, H, D, D)).float() * 10  # what a few earlier tokens would leave
    z = linear.elu1(randn(1, H, D)).float() * 10
    length = [0]

    def kv_step():  # the new token is written at position N - 1 and attends over N positions
        n = length[0] + 1
        k_buf[:, :, n - 1:n] = k_t
        v_buf[:, :, n - 1:n] = v_t
        return softmax.parallel(q_t, k_buf[:, :, :n], v_buf[:, :, :n], scale=scale)

    def state_step():
        q, k = linear.elu1(q_t).float(), linear.elu1(k_t).float()
        return linear.decode_step(q, k, v_t.float(), initial_state=(S, z), inplace=True)

    kv_s, state_s = [], []
    for n in ns:
        length[0] = n - 1
        t = calibrated_medians({"kv": kv_step, "state": state_step}, args.repeats, args.min_time, device)
        kv_s.append(t["kv"])
        state_s.append(t["state"])
        print(f"  D={D} N={n:>6}: KV cache {t['kv'] * 1e6:10.1f} us   state {t['state'] * 1e6:8.1f} us"
              f"   ratio {t['kv'] / t['state']:8.2f}", flush=True)

    nc_ns = [n for n in ns if n <= args.no_cache_max_n]
    nc_s = []
    for n in nc_ns:
        q, k, v = randn(1, H, n, D), randn(1, H, n, D), randn(1, H, n, D)
        t = calibrated_medians({"nc": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)},
                         min(args.repeats, 3), args.min_time, device, warmup=1)
        nc_s.append(t["nc"])
        print(f"  D={D} no cache, n={n:>6}: {t['nc'] * 1e3:10.3f} ms per step", flush=True)
        del q, k, v

    # the rest of a GPT-2 block, per token: what stays the same with any attention
    config = GPTConfig(n_embd=H * D, n_head=H, n_layer=1, vocab_size=1, block_size=1)
    block = Block(config).to(device=device, dtype=dtype).eval()
    x = randn(1, 1, H * D)

    @torch.no_grad()
    def rest_of_block():
        h = block.attn.c_proj(block.attn.c_attn(block.ln_1(x))[..., :H * D])
        h = x + h
        return h + block.mlp(block.ln_2(h))

    rest_s = calibrated_medians({"rest": rest_of_block}, args.repeats, args.min_time, device)["rest"]
    print(f"  D={D} rest of a block (n_embd={H * D}): {rest_s * 1e6:.1f} us per token", flush=True)

    lengths = ns
    totals = {"n": lengths}
    nc_tot, nc_extra = generation_totals(nc_ns, nc_s, lengths, fit_points=3)
    totals["no_cache_s"], totals["no_cache_extrapolated"] = nc_tot, nc_extra
    totals["kv_cache_s"], _ = generation_totals(ns, kv_s, lengths)
    totals["state_s"], _ = generation_totals(ns, state_s, lengths)

    # end-to-end check of the summed step times: generate tokens for real
    direct = {"n": args.direct_n, "no_cache_n": args.direct_n_no_cache}
    fresh_k, fresh_v = randn(1, H, args.direct_n, D), randn(1, H, args.direct_n, D)
    qs, ks, vs = (randn(args.direct_n, 1, H, 1, D) for _ in range(3))

    def generate_kv():
        for i in range(args.direct_n):
            fresh_k[:, :, i:i + 1], fresh_v[:, :, i:i + 1] = ks[i], vs[i]
            softmax.parallel(qs[i], fresh_k[:, :, :i + 1], fresh_v[:, :, :i + 1], scale=scale)

    def generate_state():
        state = (torch.zeros(1, H, D, D, device=device), torch.zeros(1, H, D, device=device))
        for i in range(args.direct_n):
            q, k = linear.elu1(qs[i]).float(), linear.elu1(ks[i]).float()
            _, state = linear.decode_step(q, k, vs[i].float(), initial_state=state, inplace=True)

    m = args.direct_n_no_cache
    qa, ka, va = randn(1, H, m, D), randn(1, H, m, D), randn(1, H, m, D)

    def generate_no_cache():
        for i in range(1, m + 1):
            F.scaled_dot_product_attention(qa[:, :, :i], ka[:, :, :i], va[:, :, :i], is_causal=True)

    t = calibrated_medians({"kv": generate_kv, "state": generate_state}, 3, 0.0, device, warmup=1)
    t_nc = calibrated_medians({"nc": generate_no_cache}, 3, 0.0, device, warmup=1)["nc"]
    direct.update({
        "kv_cache_s": t["kv"], "state_s": t["state"], "no_cache_s": t_nc,
        "kv_cache_estimate_s": generation_totals(ns, kv_s, [args.direct_n])[0][0],
        "state_estimate_s": generation_totals(ns, state_s, [args.direct_n])[0][0],
        "no_cache_estimate_s": generation_totals(nc_ns, nc_s, [m], fit_points=3)[0][0],
    })
    print(f"  D={D} generating {args.direct_n} tokens: KV cache {t['kv']:.3f} s "
          f"(sum of steps {direct['kv_cache_estimate_s']:.3f} s), state {t['state']:.3f} s "
          f"(sum {direct['state_estimate_s']:.3f} s); no cache, {m} tokens: {t_nc:.3f} s "
          f"(sum {direct['no_cache_estimate_s']:.3f} s)", flush=True)

    result = {
        "n_embd": H * D,
        "decode": {"n": ns, "kv_cache_s": kv_s, "state_s": state_s,
                   "ratio": [a / b for a, b in zip(kv_s, state_s)]},
        "no_cache": {"n": nc_ns, "step_s": nc_s},
        "rest_of_block_s": rest_s,
        "crossover_n": crossover_n(ns, kv_s, state_s),
        "totals": totals,
        "direct": direct,
        "bytes": {"kv_cache_per_token": 2 * H * D * k_buf.element_size(),
                  "state": H * (D * D + D) * S.element_size()},
    }
    del k_buf, v_buf, fresh_k, fresh_v
    gc.collect()
    return result


def main(argv=None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="a short smoke run: fewer repeats, shorter samples, smaller no-cache range")
    p.add_argument("--device", default="auto", help="cpu, cuda, or auto (cuda when available)")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--max-n", type=int, default=65536, help="largest context length (a power of 2)")
    p.add_argument("--no-cache-max-n", type=int, default=None,
                   help="largest n timed for the cacheless baseline (default 8192; 2048 with --quick)")
    p.add_argument("--direct-n", type=int, default=None,
                   help="tokens generated end to end with a KV cache and a state (default 2048; 512 quick)")
    p.add_argument("--direct-n-no-cache", type=int, default=None,
                   help="tokens generated end to end with no cache (default 512; 128 quick)")
    p.add_argument("--repeats", type=int, default=None, help="samples per point (default 7; 3 quick)")
    p.add_argument("--min-time", type=float, default=None,
                   help="seconds each sample lasts at least (default 0.05; 0.01 quick)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--out", type=Path, default=None,
                   help="output file (default benchmarks/results/crossover_<device>.json)")
    args = p.parse_args(argv)

    quick = args.quick
    defaults = dict(no_cache_max_n=(2048 if quick else 8192), direct_n=(512 if quick else 2048),
                    direct_n_no_cache=(128 if quick else 512), repeats=(3 if quick else 7),
                    min_time=(0.01 if quick else 0.05))
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("heads", "max_n", "no_cache_max_n", "direct_n", "direct_n_no_cache", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if any(d < 1 for d in args.head_dims):
        p.error("--head-dims must be positive")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda asked for, but torch sees no GPU")
    dtype = DTYPES[args.dtype]

    started = time.perf_counter()
    print(f"crossover benchmark on {device} ({'quick' if quick else 'full'} run)", flush=True)
    head_dims = {}
    with torch.inference_mode():
        for D in args.head_dims:
            head_dims[str(D)] = run_head_dim(D, args, device, dtype)
    payload = {
        "benchmark": "crossover",
        "quick": quick,
        "machine": machine(device),
        "config": {"batch": 1, "n_head": args.heads, "dtype": args.dtype, "device": device,
                   "repeats": args.repeats, "min_time_s": args.min_time,
                   "no_cache_max_n": args.no_cache_max_n,
                   "statistic": "median of repeats; ratios from alternating samples in one run"},
        "head_dims": head_dims,
        "wall_s": time.perf_counter() - started,
    }
    kind = "cuda" if device.startswith("cuda") else "cpu"
    if args.out is None:
        path = write(f"crossover_{kind}.json", payload)
    else:
        import json

        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
        path = args.out
    for D, r in head_dims.items():
        c = r["crossover_n"]
        last = r["decode"]
        print(f"D={D}: crossover N = {'none' if c is None else f'{c:,.0f}'}; at N={last['n'][-1]:,}: "
              f"KV cache {last['kv_cache_s'][-1] * 1e3:.3f} ms, state {last['state_s'][-1] * 1e6:.1f} us "
              f"per step ({last['ratio'][-1]:,.0f}x)")
    root = RESULTS.parent.parent
    shown = path.resolve().relative_to(root) if path.resolve().is_relative_to(root) else path
    print(f"wrote {shown} in {payload['wall_s']:.0f} s")
    return path


if __name__ == "__main__":
    main()
