"""Gated DeltaNet and KDA: agreement with independent references, stability, and cost.

Three parts, all written to ``benchmarks/results/gates_cpu.json`` (machine and versions
included) for chapter 6 to read:

1. **Oracles.** flash-linear-attention's pure-PyTorch references (``fla/ops/gated_delta_rule/
   naive.py`` and ``fla/ops/kda/naive.py`` of the ``fla-core`` package, loaded by file path
   with ``tests/fla_oracle.py`` because ``import fla.ops`` needs Triton), in their ``(B, T, H, D)`` layout with
   ``scale=1.0``, against ``gpt2k3.ops.gated_delta``'s ``recurrent`` and ``chunkwise``: the
   largest absolute differences of the outputs and final states in float32 (the references
   compute in float32 whatever they are given), for moderate decays and (against their
   token-by-token reference) for decays down to ``g = log_alpha = -20``. Their chunked references are run only with moderate decays: they
   exponentiate ``g_i - g_j`` above the diagonal before masking, which overflows for strong ones.
2. **Stability.** ``chunkwise`` at ``T = 65,536`` tokens with ``log_alpha = -20`` on every token
   (scalar and per-channel gates): every output and state entry finite, and the outputs equal to
   the closed form they must take when each token wipes the state before writing,
   ``o_t = beta_t (q_t . k_t) v_t``; and with weak random decays, a restart from a mid-sequence
   state reproduces the tail token by token.
3. **Cost.** Seconds per forward of ``chunkwise`` for DeltaNet, Gated DeltaNet and KDA (and the
   token-by-token ``recurrent`` form) at several lengths, one head configuration, medians of
   ``--repeats`` runs sampled in turn, so the ratios (KDA / Gated DeltaNet: the price of a decay
   per channel, which KDA's chunkwise form pays with ``log2 C`` levels of factorised matrix
   products instead of a ``C x C x Dk`` decay tensor) are measured side by side; every sample
   and the ratios are written too.

    python benchmarks/gates.py            # full run, about 1-2 minutes on an idle 2-core CPU
    python benchmarks/gates.py --quick    # a smoke run (same file, marked "quick")
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # fla_oracle: fla's naive references by file path
from _common import machine, rounds, time_once, write  # noqa: E402
from fla_oracle import load_naive  # noqa: E402

from gpt2k3.ops import delta, gated_delta  # noqa: E402


# ---------------------------------------------------------------------------- fla references
def to_fla(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, ...) <-> fla's (B, T, H, ...)."""
    return x.transpose(1, 2).contiguous()


def inputs(B, H, T, Dk, Dv, *, per_channel, lo, hi, dtype, seed):
    """Normalised q, k; values; beta in [0, 1]; log_alpha uniform in [lo, hi]; a random state."""
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, H, T, Dk, generator=g, dtype=torch.float64), dim=-1)
    k = F.normalize(torch.randn(B, H, T, Dk, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(B, H, T, Dv, generator=g, dtype=torch.float64)
    beta = torch.rand(B, H, T, generator=g, dtype=torch.float64)
    shape = (B, H, T, Dk) if per_channel else (B, H, T)
    la = lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float64)
    S0 = torch.randn(B, H, Dk, Dv, generator=g, dtype=torch.float64)
    return [x.to(dtype) for x in (q, k, v, beta, la, S0)]


def oracle_cases(quick: bool) -> list[dict]:
    gdn, kda = load_naive("gated_delta_rule"), load_naive("kda")
    B, H, Dk, Dv = 2, 3, 32, 16
    T = 96 if quick else 300
    rows = []
    for dtype in (torch.float32,):
        for per_channel in (False, True):
            for lo, hi, label in ((-0.5, 0.0, "moderate"), (-20.0, 0.0, "down to -20")):
                q, k, v, beta, la, S0 = inputs(B, H, T, Dk, Dv, per_channel=per_channel, lo=lo,
                                               hi=hi, dtype=dtype, seed=len(rows))
                if per_channel:
                    ref_o, ref_S = kda.naive_recurrent_kda(
                        to_fla(q), to_fla(k), to_fla(v), to_fla(la), to_fla(beta), scale=1.0,
                        initial_state=S0, output_final_state=True)
                else:
                    ref_o, ref_S = gdn.naive_recurrent_gated_delta_rule(
                        to_fla(q), to_fla(k), to_fla(v), to_fla(beta), to_fla(la), scale=1.0,
                        initial_state=S0, output_final_state=True)
                ref_o = to_fla(ref_o)
                for form in ("recurrent", "chunkwise"):
                    fn = getattr(gated_delta, form)
                    kw = {"chunk_size": 64} if form == "chunkwise" else {}
                    o, S = fn(q, k, v, beta, la, initial_state=S0, **kw)
                    rows.append(_diff(f"fla naive_recurrent_{'kda' if per_channel else 'gated_delta_rule'}",
                                      form, dtype, T, label, o, S, ref_o, ref_S))
        # fla's chunked references, moderate decays only (see the module docstring)
        for per_channel in (False, True):
            Tc = 128 if per_channel else T  # theirs needs T % chunk_size == 0 for KDA
            lo = -0.2 if per_channel else -0.5
            q, k, v, beta, la, S0 = inputs(B, H, Tc, Dk, Dv, per_channel=per_channel, lo=lo, hi=0.0,
                                           dtype=dtype, seed=100 + len(rows))
            if per_channel:
                ref_o, ref_S = kda.naive_chunk_kda(
                    to_fla(q), to_fla(k), to_fla(v), to_fla(la), to_fla(beta), scale=1.0,
                    initial_state=S0, output_final_state=True, chunk_size=16)
            else:
                ref_o, ref_S = gdn.naive_chunk_gated_delta_rule(
                    to_fla(q), to_fla(k), to_fla(v), to_fla(la), to_fla(beta), chunk_size=32,
                    scale=1.0, initial_state=S0, output_final_state=True)
            o, S = gated_delta.chunkwise(q, k, v, beta, la, chunk_size=64, initial_state=S0)
            rows.append(_diff(f"fla naive_chunk_{'kda' if per_channel else 'gated_delta_rule'}",
                              "chunkwise", dtype, Tc, "moderate", o, S, to_fla(ref_o), ref_S))
    return rows


def _diff(reference, form, dtype, T, decays, o, S, ref_o, ref_S) -> dict:
    row = {"reference": reference, "ours": form, "dtype": str(dtype).replace("torch.", ""), "T": T,
           "decays": decays,
           "max_abs_diff_o": (o.double() - ref_o.double()).abs().max().item(),
           "max_abs_diff_S": (S.double() - ref_S.double()).abs().max().item(),
           "max_abs_o": ref_o.double().abs().max().item()}
    print(f"  {reference:34s} vs {form:9s} {row['dtype']:7s} T={T:4d} {decays:11s} "
          f"o {row['max_abs_diff_o']:.2e}  S {row['max_abs_diff_S']:.2e}", flush=True)
    return row


# ---------------------------------------------------------------------------- stability
def stability(quick: bool) -> list[dict]:
    T, D = (8192 if quick else 65_536), 16
    rows = []
    g = torch.Generator().manual_seed(0)
    q = F.normalize(torch.randn(1, 1, T, D, generator=g), dim=-1)
    k = F.normalize(torch.randn(1, 1, T, D, generator=g), dim=-1)
    v = torch.randn(1, 1, T, D, generator=g)
    beta = torch.rand(1, 1, T, generator=g)
    for per_channel in (False, True):
        shape = (1, 1, T, D) if per_channel else (1, 1, T)
        for decay in ("log_alpha = -20 on every token", "weak random, log_alpha in [-0.01, 0]"):
            strong = decay.startswith("log_alpha = -20")
            la = torch.full(shape, -20.0) if strong else -0.01 * torch.rand(shape, generator=g)
            result = {}
            seconds = time_once(lambda: result.update(out=gated_delta.chunkwise(q, k, v, beta, la)))
            o, S = result["out"]
            row = {"gate": "per channel (KDA)" if per_channel else "scalar (Gated DeltaNet)",
                   "decay": decay, "T": T, "D": D,
                   "finite": bool(torch.isfinite(o).all() and torch.isfinite(S).all()),
                   "max_abs_o": o.abs().max().item(), "max_abs_S": S.abs().max().item(),
                   "seconds": seconds}
            if strong:
                expected = (q * k).sum(-1, keepdim=True) * beta[..., None] * v
                row["check"] = "o_t = beta_t (q_t . k_t) v_t"
            else:
                cut = T - 300
                _, S_mid = gated_delta.chunkwise(*(x[:, :, :cut] for x in (q, k, v, beta, la)))
                expected, _ = gated_delta.recurrent(*(x[:, :, cut:] for x in (q, k, v, beta, la)),
                                                    initial_state=S_mid)
                o = o[:, :, cut:]
                row["check"] = "last 300 tokens, token by token from the state at T - 300"
            row["max_abs_diff"] = (o - expected).abs().max().item()
            print(f"  {row['gate']:24s} {decay:38s} T={T} finite={row['finite']} "
                  f"max|o|={row['max_abs_o']:.3g} max|S|={row['max_abs_S']:.3g} "
                  f"check diff {row['max_abs_diff']:.2e} ({seconds:.2f} s)", flush=True)
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------- cost
def cost(quick: bool, repeats: int) -> dict:
    B, H, D = 1, 4, 64
    lengths = [1024] if quick else [1024, 4096, 16384]
    recurrent_max = 1024 if quick else 4096
    out = {"B": B, "H": H, "D": D, "chunk_size": 64, "dtype": "float32", "lengths": lengths,
           "seconds": {}, "samples": {},
           "ratios": {"KDA chunkwise / Gated DeltaNet chunkwise": {},
                      "Gated DeltaNet chunkwise / DeltaNet chunkwise": {}}}
    for T in lengths:
        g = torch.Generator().manual_seed(T)
        q = F.normalize(torch.randn(B, H, T, D, generator=g), dim=-1)
        k = F.normalize(torch.randn(B, H, T, D, generator=g), dim=-1)
        v = torch.randn(B, H, T, D, generator=g)
        beta = torch.rand(B, H, T, generator=g)
        la_s = -0.1 * torch.rand(B, H, T, generator=g)
        la_c = -0.1 * torch.rand(B, H, T, D, generator=g)
        fns = {"DeltaNet chunkwise": lambda: delta.chunkwise(q, k, v, beta),
               "Gated DeltaNet chunkwise": lambda: gated_delta.chunkwise(q, k, v, beta, la_s),
               "KDA chunkwise": lambda: gated_delta.chunkwise(q, k, v, beta, la_c)}
        if T <= recurrent_max:
            fns["Gated DeltaNet recurrent"] = lambda: gated_delta.recurrent(q, k, v, beta, la_s)
            fns["KDA recurrent"] = lambda: gated_delta.recurrent(q, k, v, beta, la_c)
        times = rounds(fns, repeats)  # in turn: a busy moment slows every method alike
        med = {name: statistics.median(ts) for name, ts in times.items()}
        for name, s in med.items():
            out["seconds"].setdefault(name, {})[str(T)] = s
            out["samples"].setdefault(name, {})[str(T)] = times[name]
        out["ratios"]["KDA chunkwise / Gated DeltaNet chunkwise"][str(T)] = (
            med["KDA chunkwise"] / med["Gated DeltaNet chunkwise"])
        out["ratios"]["Gated DeltaNet chunkwise / DeltaNet chunkwise"][str(T)] = (
            med["Gated DeltaNet chunkwise"] / med["DeltaNet chunkwise"])
        print(f"  T={T:6d} " + "  ".join(f"{n}: {s * 1e3:8.1f} ms" for n, s in med.items())
              + f"  KDA/GDN {med['KDA chunkwise'] / med['Gated DeltaNet chunkwise']:.2f}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: shorter sequences, fewer repeats")
    ap.add_argument("--repeats", type=int, default=7, help="timed runs per method and length")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = 2 if args.quick else args.repeats
    load_start = os.getloadavg()[0]
    print("oracles (largest absolute differences):", flush=True)
    oracles = oracle_cases(args.quick)
    print("stability:", flush=True)
    stab = stability(args.quick)
    print("cost (seconds per forward, median):", flush=True)
    timing = cost(args.quick, repeats)
    info = machine("cpu")
    # other jobs on a shared machine slow every method alike (they run in turn), but record it
    info["load_average_1min"] = {"start": load_start, "end": os.getloadavg()[0]}
    payload = {"machine": info, "quick": args.quick, "repeats": repeats,
               "oracles": oracles, "stability": stab, "cost": timing}
    print(f"wrote {write('gates_cpu.json', payload)}")


if __name__ == "__main__":
    main()
