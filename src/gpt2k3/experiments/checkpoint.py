"""The trained GPT-2 the package ships (chapter 11's, which chapter 1 also samples): saving,
loading and finding its checkpoint.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Mapping

import torch

from gpt2k3.checks import check_instance
from gpt2k3.config import GPTConfig
from gpt2k3.experiments.text_lm import REFERENCE
from gpt2k3.model import GPT

__all__ = ["CHECKPOINT", "checkpoint_path", "save_checkpoint", "load_checkpoint", "load_gpt2"]


#: File name of the trained GPT-2 in ``gpt2k3/checkpoints``.
CHECKPOINT = "text_gpt2.pt"



_CHECKPOINT_FORMAT = "gpt2k3.text_lm/1"



# ------------------------------------------------------------------ the shipped GPT-2
def checkpoint_path(name: str = CHECKPOINT):
    """Where a checkpoint of the package lives (``gpt2k3/checkpoints/<name>``; a traversable)."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"name must be a plain file name, got {name!r}")
    return resources.files("gpt2k3") / "checkpoints" / name



def save_checkpoint(model: GPT, path, *, mixer: str, meta: Mapping | None = None) -> str:
    """Save ``model``'s weights (float32) and configuration to ``path``; return the file's
    SHA-256. Only plain GPT-2-shaped models (``mixer="softmax"`` with no parts swapped) load
    back with :func:`load_checkpoint`."""
    check_instance(model, "model", GPT)
    if mixer != REFERENCE:
        raise ValueError(f"mixer must be {REFERENCE!r}: only the GPT-2-shaped model is shipped, "
                         f"got {mixer!r}")
    payload = {"format": _CHECKPOINT_FORMAT, "mixer": mixer, "config": asdict(model.config),
               "state_dict": {k: v.detach().float().contiguous() for k, v in model.state_dict().items()},
               "meta": dict(meta or {})}
    buf = io.BytesIO()
    torch.save(payload, buf)
    Path(path).write_bytes(buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest()



def load_checkpoint(path) -> tuple[GPT, dict]:
    """``(model, meta)`` from a file written by :func:`save_checkpoint` (float32, eval mode)."""
    try:
        with (open(path, "rb") if isinstance(path, (str, Path)) else path.open("rb")) as f:
            payload = torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=True)
    except Exception as err:  # a missing file, a truncated or foreign one: all the same to the caller
        raise ValueError(f"path must be a checkpoint written by save_checkpoint "
                         f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None
    if not isinstance(payload, dict) or payload.get("format") != _CHECKPOINT_FORMAT:
        raise ValueError(f"path is not a {_CHECKPOINT_FORMAT} checkpoint")
    model = GPT(GPTConfig(**payload["config"]))
    model.load_state_dict(payload["state_dict"])
    return model.eval(), dict(payload.get("meta", {}))



def load_gpt2() -> GPT:
    """The small GPT-2 trained on the King James Bible in chapter 11's longer run (started at
    ``N(0, 1/fan_in)``, its results file's ``checkpoint`` names the run), shipped with the
    package: 4 layers, width 128, byte vocabulary, 256 positions. Float32, eval mode."""
    path = checkpoint_path()
    if not path.is_file():
        raise FileNotFoundError(f"{CHECKPOINT} is not in the package (run benchmarks/text_lm.py)")
    return load_checkpoint(path)[0]
