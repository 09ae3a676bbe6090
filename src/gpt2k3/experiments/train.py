"""The one training loop and learning-rate schedule the recall and text experiments share."""

from __future__ import annotations

import math


def warmup_cosine_lr(step: int, lr: float, warmup: int, steps: int) -> float:
    """The learning rate at ``step`` (0-based) of a ``steps``-step run: linear warm-up over
    ``warmup`` steps, then cosine decay to ``lr / 10``. The schedule of chapter 10's and
    chapter 11's training loops."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))
