"""A model's decode step as an ONNX graph, its cache as explicit inputs and outputs.

:class:`DecodeStep` wraps one of the book's models (a :class:`gpt2k3.model.GPT`) without
re-implementing any of it: it rebuilds the model's own cache objects (:class:`KVCache`,
:class:`StateCache` of a :class:`DeltaState`, MLA's :class:`LatentCache`) around tensors it is
given, runs the model's forward body on one token, and returns the logits and the cache's
tensors after the step. A growing cache (keys and values, MLA latents) enters with ``P``
positions and leaves with ``P + 1``; a fixed state enters and leaves with one shape.
"""

from __future__ import annotations

import contextlib
import json
import inspect
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from gpt2k3.cache import KVCache, ModelCache, StateCache
from gpt2k3.layers.deltanet import DeltaState
from gpt2k3.layers.mla import LatentCache
from gpt2k3.model import GPT

__all__ = ["CacheInput", "cache_layout", "DecodeStep", "export_step", "to_float16_storage"]


@dataclass(frozen=True)
class CacheInput:
    """One cache tensor of one layer: ``name``, ``shape`` with ``None`` at the growing axis."""

    layer: int
    kind: str          # "kv", "latent" or "state"
    name: str
    shape: tuple

    @property
    def grows(self) -> bool:
        return None in self.shape


def cache_layout(model: GPT) -> list[CacheInput]:
    """The tensors of ``model``'s cache for one sequence, in the order :class:`DecodeStep` takes
    them: read off a real cache (``model.new_cache``) after one token."""
    cache = model.new_cache(1, 2)
    with torch.no_grad():
        inspect.unwrap(type(model).forward)(model, torch.zeros(1, 1, dtype=torch.long), cache)
    out = []
    for i, c in enumerate(cache):
        if isinstance(c, KVCache):
            for name in ("k", "v"):
                B, H, _, D = getattr(c, name).shape
                out.append(CacheInput(i, "kv", name, (1, H, None, D)))
        elif isinstance(c, LatentCache):
            for name in ("c_kv", "k_rope"):
                out.append(CacheInput(i, "latent", name, (1, None, getattr(c, name).shape[2])))
        elif isinstance(c, StateCache) and isinstance(c.state, DeltaState):
            out.append(CacheInput(i, "state", "S", tuple(c.state.S.shape)))
            for name, t in zip(("conv_q", "conv_k", "conv_v"), c.state.conv or ()):
                out.append(CacheInput(i, "state", name, tuple(t.shape)))
        else:
            raise ValueError(f"layer {i}'s cache ({type(c).__name__}) has no ONNX layout")
    return out


class _Cache(ModelCache):
    """A :class:`ModelCache` whose length is given (a symbolic size while exporting)."""

    def __init__(self, layers, length):
        super().__init__(layers)
        self._length = length

    @property
    def length(self):
        return self._length


def _grown(t: torch.Tensor, axis: int) -> torch.Tensor:
    """``t`` with one empty position appended along ``axis`` (the slot this step writes)."""
    shape = list(t.shape)
    shape[axis] = 1
    return torch.cat([t, t.new_zeros(shape)], dim=axis)


class DecodeStep(nn.Module):
    """``forward(token, *cache) -> (logits, *cache_after)`` for one sequence: ``token`` ``(1, 1)``
    int64, the cache tensors as :func:`cache_layout` lists them, ``logits`` ``(1, vocab)``."""

    def __init__(self, model: GPT):
        super().__init__()
        self.model = model.eval()
        self.layout = cache_layout(model)

    def forward(self, token: torch.Tensor, *tensors: torch.Tensor):
        growing = [(t, s) for t, s in zip(tensors, self.layout) if s.grows]
        past = growing[0][0].shape[growing[0][1].shape.index(None)] if growing else 0
        layers = _rebuild(self.layout, tensors, past)
        logits = inspect.unwrap(type(self.model).forward)(self.model, token, _Cache(layers, past))
        return (logits[:, -1], *_flatten(layers))


def _rebuild(layout, tensors, past) -> list:
    """The model's own layer caches around ``tensors``, each holding ``past`` tokens, with room
    for one more where the cache grows."""
    by_layer: dict[int, list] = {}
    for t, spec in zip(tensors, layout):
        by_layer.setdefault(spec.layer, []).append((spec.kind, t))
    layers = []
    for i in sorted(by_layer):
        kind, items = by_layer[i][0][0], [t for _, t in by_layer[i]]
        if kind == "kv":
            k, v = items
            c = KVCache.__new__(KVCache)
            c.k, c.v = _grown(k, 2), _grown(v, 2)
            c.batch, c.n_head, c.head_dim, c.max_len = 1, k.shape[1], k.shape[3], past + 1
        elif kind == "latent":
            c = LatentCache.__new__(LatentCache)
            c.c_kv, c.k_rope = (_grown(t, 1) for t in items)
        else:
            S, *conv = items
            c = StateCache(1, None)
            c.state = DeltaState(S, tuple(conv) if conv else None)
        c.length = past
        layers.append(c)
    return layers


def _flatten(layers) -> list[torch.Tensor]:
    """The tensors of the layer caches after the step, in :func:`cache_layout`'s order."""
    out = []
    for c in layers:
        if isinstance(c, KVCache):
            out += [c.k, c.v]
        elif isinstance(c, LatentCache):
            out += [c.c_kv, c.k_rope]
        else:
            out += [c.state.S, *(c.state.conv or ())]
    return out


@contextlib.contextmanager
def _traceable():
    """What export needs to trace a decode step, and nothing else changed:

    * a check that reads a value (``check_finite``, a host sync) cannot be traced, so it is
      skipped while the graph is recorded; shape checks run;
    * the delta layers run the body of their ops' chunkwise form, which solves a triangular
      system ONNX has no operator for; one token needs no chunk, so while the graph is recorded
      their ``chunkwise`` is the same op's token-by-token form (``recurrent``: the definition,
      which the tests hold equal to ``chunkwise`` to float32 rounding).
    """
    from gpt2k3 import checks
    from gpt2k3.ops import delta, gated_delta

    def by_token(op):
        body = inspect.unwrap(op.recurrent)

        def chunkwise(*args, initial_state=None, chunk_size=None):
            return body(*args, initial_state=initial_state)
        chunkwise.__wrapped__ = chunkwise
        return chunkwise

    saved = checks.check_finite, delta.chunkwise, gated_delta.chunkwise
    checks.check_finite = lambda value, name="value", *a, **k: value
    delta.chunkwise, gated_delta.chunkwise = by_token(delta), by_token(gated_delta)
    try:
        yield
    finally:
        checks.check_finite, delta.chunkwise, gated_delta.chunkwise = saved


def input_names(layout) -> list[str]:
    return ["token"] + [f"l{s.layer}_{s.name}" for s in layout]


def output_names(layout) -> list[str]:
    return ["logits"] + [f"l{s.layer}_{s.name}_out" for s in layout]


def example_inputs(layout, past: int = 3, generator: torch.Generator | None = None) -> list[torch.Tensor]:
    """A token and random cache tensors with ``past`` positions in every growing one."""
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    tok = torch.randint(0, 256, (1, 1), generator=g)
    return [tok] + [torch.randn(tuple(past if d is None else d for d in s.shape), generator=g)
                    for s in layout]


def export_step(model: GPT, path, *, max_past: int) -> list[CacheInput]:
    """Write ``model``'s decode step to ``path`` (ONNX; growing axes dynamic up to ``max_past``)."""
    step = DecodeStep(model)
    layout = step.layout
    P = torch.export.Dim("past", min=0, max=max_past)
    shapes = tuple({s.shape.index(None): P} if s.grows else None for s in layout)
    with _traceable():
        torch.onnx.export(step, tuple(example_inputs(layout)), str(path), dynamo=True,
                          dynamic_shapes={"token": None, "tensors": shapes},
                          input_names=input_names(layout), output_names=output_names(layout),
                          optimize=True, external_data=False, verbose=False)
    return layout


def to_float16_storage(path) -> None:
    """Store every float32 weight of the ONNX file at ``path`` as float16, cast back to float32
    where the graph starts: half the bytes, and the same numbers when the weights are
    float16-representable (the panel's trained models are stored so)."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.load(str(path))
    g = m.graph
    casts, keep = [], []
    for init in g.initializer:
        if init.data_type == onnx.TensorProto.FLOAT and np.prod(init.dims) > 16:
            arr = numpy_helper.to_array(init)
            half = numpy_helper.from_array(arr.astype(np.float16), init.name + "__f16")
            keep.append(half)
            casts.append(helper.make_node("Cast", [half.name], [init.name], to=onnx.TensorProto.FLOAT,
                                          name=init.name + "__cast"))
        else:
            keep.append(init)
    del g.initializer[:]
    g.initializer.extend(keep)
    nodes = list(g.node)
    del g.node[:]
    g.node.extend(casts + nodes)
    onnx.checker.check_model(m)
    onnx.save(m, str(path))


def strip_metadata(path) -> None:
    """Drop what the exporter notes on every node for debugging (its PyTorch stack trace and
    names): about half the file's bytes, and nothing the runtime reads."""
    import onnx

    m = onnx.load(str(path))
    for node in m.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    for v in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output):
        del v.metadata_props[:]
    del m.graph.value_info[:]
    onnx.checker.check_model(m)
    onnx.save(m, str(path))


# ------------------------------------------------------------------ the panel's three models
#: The panel's models: key -> (label, what it keeps, weights stored as float16?).
MODELS = {
    "gpt2": ("GPT-2 (KV cache)", "softmax", False),
    "gated_deltanet": ("Gated DeltaNet (fixed state)", "gated_deltanet", True),
    "k3": ("Tiny Kimi K3 (hybrid: MLA latent cache + KDA states)", "k3", True),
}
MANIFEST = "live_models.json"


def onnx_name(key: str) -> str:
    return f"live_{key}.onnx"


def load_panel_model(key: str) -> tuple[GPT, dict]:
    """``(model, meta)`` of one of :data:`MODELS`, as the package ships it (float32, eval)."""
    from gpt2k3.experiments.checkpoint import checkpoint_path, load_checkpoint
    from gpt2k3.book.live.weights import checkpoint_name, load_model

    if key not in MODELS:
        raise ValueError(f"key must be one of {sorted(MODELS)}, got {key!r}")
    if key == "gpt2":
        return load_checkpoint(checkpoint_path())
    path = checkpoint_path(checkpoint_name(key))
    if not path.is_file():
        raise FileNotFoundError(f"{checkpoint_name(key)} is not in the package: train it with "
                                f"python scripts/export_onnx.py --train --only {key}")
    return load_model(path)


def accounting(key: str, model: GPT) -> dict:
    """Bytes the book's accounting says one sequence's cache holds after ``L`` tokens, as
    ``fixed + per_token * L`` (float32 numbers, as the exported graphs keep them), and which
    functions computed them."""
    from gpt2k3 import accounting as acc
    from gpt2k3.archs import spec_from_gpt_config

    f32 = 4
    if key == "gpt2":
        spec = spec_from_gpt_config(model.config, "text GPT-2")
        return {"fixed": 0, "per_token": acc.kv_cache_bytes(spec, 1, dtype_bytes=f32),
                "source": "gpt2k3.accounting.kv_cache_bytes(spec_from_gpt_config(config), L, dtype_bytes=4)"}
    if key == "k3":
        spec = model.spec
        return {"fixed": acc.state_bytes(spec, dtype_bytes=f32),
                "per_token": acc.kv_cache_bytes(spec, 1, dtype_bytes=f32),
                "source": "gpt2k3.accounting.state_bytes(spec, dtype_bytes=4) + "
                          "kv_cache_bytes(spec, L, dtype_bytes=4), spec = the tiny K3's ArchSpec"}
    layer = model.transformer.h[0].attn
    per_layer = acc.mixer_state_numbers(layer.n_head, layer.head_k_dim, layer.head_v_dim,
                                        conv_kernel=layer.conv_size)
    return {"fixed": model.config.n_layer * sum(per_layer.values()) * f32, "per_token": 0,
            "source": "gpt2k3.accounting.mixer_state_numbers(n_head, d_key, d_value, conv_kernel) "
                      "x n_layer x 4 bytes"}


def export_all(dest=None, keys=None) -> list[Path]:
    """Export the panel models ``keys`` (default: all three) into ``dest`` (default: the
    package's ``checkpoints``) and write :data:`MANIFEST` beside them (layouts, accounting,
    sizes; entries of other models already there are kept); returns the paths."""
    from importlib import resources

    dest = Path(dest) if dest is not None else Path(str(resources.files("gpt2k3") / "checkpoints"))
    old = dest / MANIFEST
    manifest = json.loads(old.read_text()) if old.is_file() else {"format": "gpt2k3.live/1", "models": {}}
    paths = []
    for key, (label, mixer, half) in MODELS.items():
        if keys is not None and key not in keys:
            continue
        model, meta = load_panel_model(key)
        path = dest / onnx_name(key)
        layout = export_step(model, path, max_past=model.config.block_size - 1)
        strip_metadata(path)
        if half:
            to_float16_storage(path)
        paths.append(path)
        manifest["models"][key] = {
            "label": label, "mixer": mixer, "file": path.name, "bytes": path.stat().st_size,
            "weights": "float16, cast to float32 in the graph" if half else "float32",
            "params": model.num_params(), "block_size": model.config.block_size,
            "vocab_size": model.config.vocab_size, "val_bits": meta.get("val_bits"),
            "inputs": [{"name": f"l{s.layer}_{s.name}", "layer": s.layer, "kind": s.kind,
                        "shape": [-1 if d is None else d for d in s.shape]} for s in layout],
            "accounting": accounting(key, model)}
    manifest["models"] = {k: manifest["models"][k] for k in MODELS if k in manifest["models"]}
    out = dest / MANIFEST
    out.write_text(json.dumps(manifest, indent=1) + "\n")
    return paths + [out]
