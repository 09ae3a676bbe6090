"""Accelerators as data: :class:`Hardware`, and the NVIDIA H200 defined once.

:data:`H200` holds NVIDIA's published datasheet figures for the H200 SXM (141 GB of HBM3e,
4.8 TB/s, about 989 TFLOP/s of dense BF16 matmul -- the datasheet's 1,979 TFLOP/s are with 2:4
sparsity), eight to a machine (an HGX H200 board, NVLink inside): the roofline's optimistic
end.  :data:`H200_MEASURED` is the same device with the bandwidth measured on one H200
(:data:`H200_MEASUREMENTS`, copied into ``benchmarks/results/h200_anchor_2026-11-29.json``):
one decode step of softmax attention over a million-token bf16 KV cache reads at 4.55 TB/s
(a device-to-device copy moves 4.20 TB/s, bytes read plus written).  Dense matmul throughput
was *not* measured, so both keep the datasheet's peak.  :data:`H200_BAND` pairs them: a
roofline computed with each brackets the bandwidth the book assumes
(:func:`gpt2k3.accounting.roofline_band`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpt2k3.checks import check_bytes, check_positive_number, is_int


__all__ = ["Hardware", "H200", "H200_MEASURED", "H200_BAND", "H200_DATASHEET",
           "H200_MEASUREMENTS", "FLASHMLA_H800"]


@dataclass(frozen=True)
class Hardware:
    """One accelerator, as the roofline and the memory plan see it.

    ``memory_bytes``: its memory; ``bandwidth``: bytes per second it reads while decoding;
    ``peak_flops``: dense matmul FLOP/s in the format the weights are multiplied in;
    ``per_machine``: how many sit in one machine behind a fast interconnect (the most a
    tensor-parallel group spans); ``source``: where the figures come from.
    """

    name: str
    memory_bytes: float
    bandwidth: float
    peak_flops: float
    per_machine: int = 8
    source: str = field(default="", compare=False)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty str, got {self.name!r}")
        if not isinstance(self.source, str):
            raise ValueError(f"source must be a str, got {self.source!r}")
        check_bytes(self.memory_bytes, "memory_bytes")
        check_positive_number(self.bandwidth, "bandwidth", "number of bytes per second")
        check_positive_number(self.peak_flops, "peak_flops", "number of FLOP/s")
        if not is_int(self.per_machine) or self.per_machine < 1:
            raise ValueError(f"per_machine must be a positive int, got {self.per_machine!r}")

    @property
    def ridge(self) -> float:
        """FLOPs per byte at which a kernel is as limited by compute as by bandwidth."""
        return self.peak_flops / self.bandwidth

    def with_(self, **changes) -> "Hardware":
        """A copy with some fields changed (validated like a new one)."""
        return replace(self, **changes)


#: NVIDIA's published H200 (SXM) figures, with their source.
H200_DATASHEET = {
    "memory_bytes": 141e9, "bandwidth": 4.8e12, "peak_flops": 989e12, "per_machine": 8,
    "source": ("NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): 141 GB HBM3e, 4.8 TB/s, "
               "BF16 Tensor Core 1,979 TFLOP/s with sparsity, i.e. ~989 TFLOP/s dense; "
               "eight per HGX H200 board"),
}

#: What was measured on one NVIDIA H200 (PyTorch 2.11 + CUDA 13.0, 2026-11-29) and the file
#: that holds it (``benchmarks/results/``, copied from the measurement; the script that
#: wrote it is ``device_anchor.py`` beside the original).
H200_MEASUREMENTS = {
    "copy_bandwidth": 4.200604755593586e12,          # device-to-device copy, read + write
    "decode_read_bandwidth": 4.552299559015398e12,   # SDPA decode step, 1M-token bf16 cache
    "decode_context": 1048576, "decode_batch": 1, "decode_heads": 32, "decode_head_dim": 128,
    "decode_ms": 3.773888111114502,
    # the same file's MLA decode step at N=1048576, B=1: one layer's latent (576 numbers a token,
    # bf16), read at 0.60 TB/s.  The file does not record which
    # kernel produced it, so the book reports it but does not use it as a bandwidth.
    "mla_decode_read_bandwidth": 0.6047538668438248e12,
    "mla_decode_ms": 1.997439980506897,
    "file": "h200_anchor_2026-11-29.json",
    "source": ("measured on one NVIDIA H200, 2026-11-29 (benchmarks/results/"
               "h200_anchor_2026-11-29.json: copy_TBps; decode[N=1048576, B=1].mha_TBps)"),
}

#: An NVIDIA H200 with its datasheet figures: the default hardware of every roofline.
H200 = Hardware(name="NVIDIA H200", memory_bytes=H200_DATASHEET["memory_bytes"],
                bandwidth=H200_DATASHEET["bandwidth"], peak_flops=H200_DATASHEET["peak_flops"],
                per_machine=H200_DATASHEET["per_machine"], source=H200_DATASHEET["source"])

#: The H200 at the bandwidth one decode step was measured to read at (4.55 TB/s; memory and
#: peak FLOP/s from the datasheet, matmul throughput was not measured).
H200_MEASURED = H200.with_(
    name="NVIDIA H200 (measured bandwidth)",
    bandwidth=H200_MEASUREMENTS["decode_read_bandwidth"],
    source=(H200_MEASUREMENTS["source"] + "; memory and peak FLOP/s: "
            + H200_DATASHEET["source"]))

#: The sensitivity band of the roofline: datasheet (fast end) and measured (slow end).
H200_BAND = {"datasheet": H200, "measured": H200_MEASURED}


#: FlashMLA's rule for when MLA decoding is compute-bound, and what its dense decoding kernel
#: reached, quoted from github.com/deepseek-ai/FlashMLA (commit 9241ae3, 2026-04-29):
#: ``docs/20250422-new-kernel-deep-dive.md``, "A Theoretical Analysis of the MLA Algorithm",
#: and the README's "Performance".  Their intensity is ``h_q s_q (d_k + d_v) / d_k``, taken as
#: about ``2 h_q s_q``, so the rule reads "compute-bound once ``h_q s_q`` reaches half the
#: ridge", the ridge computed with the throttled peak, not the datasheet's.
FLASHMLA_H800 = {
    "peak_quote": ("An NVIDIA H800 SXM5 GPU has a peak memory bandwidth of 3.35 TB/s and peak "
                   "FLOPs of 990 TFlops. However, due to throttling (reducing to ~1600 MHz in our "
                   "case), the practical peak FLOPs drops to ~865 TFlops."),
    "rule_quote": ("Therefore, when $h_qs_q \\ge \\frac{1}{2} \\cdot \\frac{865}{3.35} = 128$, "
                   "the kernel is compute-bound; otherwise, it's memory-bound."),
    "bandwidth": 3.35e12, "peak_flops": 990e12, "throttled_flops": 865e12, "heads": 128,
    "achieved_quote": ("The dense MLA decoding kernel achieves up to 3000 GB/s in memory-bound "
                       "configuration and 660 TFLOPS in computation-bound configuration on H800 "
                       "SXM5 with CUDA 12.8."),
    "achieved_bandwidth": 3000e9, "achieved_flops": 660e12,
    "where": ("github.com/deepseek-ai/FlashMLA: docs/20250422-new-kernel-deep-dive.md (the rule) "
              "and README.md, Performance (what the kernel achieves)"),
}
