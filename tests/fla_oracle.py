"""Independent oracles: flash-linear-attention's pure-PyTorch reference implementations.

The ``fla-core`` package ships, next to its Triton kernels, plain PyTorch references in
``fla/ops/<op>/naive.py``. ``import fla.ops`` pulls in Triton (absent on CPU-only machines), so
the reference files are loaded here directly by file path; ``fla`` itself is located with
``importlib.util.find_spec`` without being imported.

Their conventions differ from ours: tensors are ``(B, T, H, D)`` (except the delta-rule file,
which uses ``(B, H, T, D)``), and queries are scaled by ``D ** -0.5`` unless ``scale`` is given.
The tests transpose and pass ``scale=1.0``.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest


def fla_package_dir() -> Path:
    """Directory of the installed ``fla`` package; skips the calling test if fla-core is absent."""
    spec = importlib.util.find_spec("fla")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("fla-core (flash-linear-attention) is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


@functools.cache
def _load(path: Path, op: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_fla_naive_{op}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_naive(op: str) -> ModuleType:
    """Load ``fla/ops/<op>/naive.py`` as a stand-alone module, e.g. ``load_naive("kda")``.

    A missing file in an installed fla-core is an error, not a skip: it means the oracle moved.
    """
    path = fla_package_dir() / "ops" / op / "naive.py"
    if not path.is_file():
        raise FileNotFoundError(f"fla-core is installed but has no reference file {path}")
    return _load(path, op)
