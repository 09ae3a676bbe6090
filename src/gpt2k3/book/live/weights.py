"""Saving and loading the panel's trained models (chapter 11's Gated DeltaNet and tiny Kimi K3;
the GPT-2 is :func:`gpt2k3.experiments.checkpoint.load_gpt2`).

Weights are stored as float16 and loaded as float32: the loaded model *is* the float16-rounded
one, so the ONNX file (float16 initializers cast to float32) holds exactly the same numbers.
"""

from __future__ import annotations

import io
from dataclasses import asdict
from pathlib import Path
from typing import Mapping

import torch

from gpt2k3.checks import check_choice
from gpt2k3.experiments import text_lm
from gpt2k3.experiments.text_lm import TextModelConfig
from gpt2k3.model import GPT

__all__ = ["checkpoint_name", "save_model", "load_model"]

_FORMAT = "gpt2k3.live/1"
SHIPPED = ("gated_deltanet", "k3")


def checkpoint_name(mixer: str) -> str:
    """File name in ``gpt2k3/checkpoints`` of the trained ``mixer`` model."""
    check_choice(mixer, "mixer", SHIPPED)
    return f"text_{mixer}.pt"


def save_model(net: GPT, path, *, mixer: str, model: TextModelConfig, meta: Mapping | None = None) -> None:
    """Write ``net`` (built by ``text_lm.build_model(mixer, model)``) with float16 weights."""
    check_choice(mixer, "mixer", SHIPPED)
    payload = {"format": _FORMAT, "mixer": mixer, "model": asdict(model),
               "sizes": text_lm.matched_sizes(mixer, model),
               "state_dict": {k: v.detach().to(torch.float16).contiguous() if v.is_floating_point()
                              else v.detach().contiguous() for k, v in net.state_dict().items()},
               "meta": dict(meta or {})}
    buf = io.BytesIO()
    torch.save(payload, buf)
    Path(path).write_bytes(buf.getvalue())


def load_model(path) -> tuple[GPT, dict]:
    """``(model, meta)`` from a file of :func:`save_model`: float32, eval mode."""
    with (open(path, "rb") if isinstance(path, (str, Path)) else path.open("rb")) as f:
        payload = torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
        raise ValueError(f"path must be a {_FORMAT} checkpoint")
    net = text_lm.build_model(payload["mixer"], TextModelConfig(**payload["model"]), sizes=payload["sizes"])
    net.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in payload["state_dict"].items()})
    return net.eval(), dict(payload["meta"], mixer=payload["mixer"])
