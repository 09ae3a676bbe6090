"""The live panel's exported decode steps (gpt2k3.book.live) equal the PyTorch models they came
from: on random cache inputs, in greedy generation, and in the bytes the accounting predicts.

Reads the ONNX files the package ships (scripts/export_onnx.py writes them); a model whose file
is not there is skipped with the command that makes it.
"""

from __future__ import annotations

import json
from importlib import resources

import numpy as np
import pytest
import torch

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from gpt2k3.book.live import export as ex  # noqa: E402
from gpt2k3.model import generate  # noqa: E402

PROMPT = "And it came to pass, when "
N_NEW = 32
CHECKPOINTS = resources.files("gpt2k3") / "checkpoints"


def _manifest() -> dict:
    path = CHECKPOINTS / ex.MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {"models": {}}


def _shipped(key):
    if key not in _manifest()["models"] or not (CHECKPOINTS / ex.onnx_name(key)).is_file():
        pytest.skip(f"{ex.onnx_name(key)} is not in the package: run python scripts/export_onnx.py "
                    f"--only {key} (after --train for a trained model)")
    model, _ = ex.load_panel_model(key)
    sess = ort.InferenceSession(str(CHECKPOINTS / ex.onnx_name(key)), providers=["CPUExecutionProvider"])
    return model, sess


@pytest.fixture(scope="module", params=list(ex.MODELS))
def shipped(request):
    model, sess = _shipped(request.param)
    return request.param, model, sess


def ort_greedy(sess, entry: dict, prompt: list[int], n_new: int) -> tuple[list[int], list[int]]:
    """Greedy bytes as the page computes them (one decode step per byte, prompt included), and
    the bytes the cache tensors hold after each step."""
    cache = {i["name"]: np.zeros([0 if d < 0 else d for d in i["shape"]], np.float32)
             for i in entry["inputs"]}
    seq, out_ids, held = list(prompt), [], []
    i = 0
    while len(out_ids) < n_new:
        feeds = {"token": np.array([[seq[i]]], np.int64), **cache}
        outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        cache = {name: outs[name + "_out"] for name in cache}
        held.append(sum(a.nbytes for a in cache.values()))
        if i >= len(prompt) - 1:
            nxt = int(np.argmax(outs["logits"][0]))
            out_ids.append(nxt)
            seq.append(nxt)
        i += 1
    return out_ids, held


def test_graph_equals_its_pytorch_module_on_random_inputs(shipped):
    key, model, sess = shipped
    step = ex.DecodeStep(model)
    names = ex.input_names(step.layout)
    g = torch.Generator().manual_seed(1)
    for past in (0, 1, 17):
        xs = ex.example_inputs(step.layout, past, generator=g)
        with torch.no_grad():
            want = step(*xs)
        got = sess.run(None, {n: x.numpy() for n, x in zip(names, xs)})
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert a.shape == tuple(b.shape)
            np.testing.assert_allclose(a, b.numpy(), rtol=1e-4, atol=1e-4)


def test_greedy_bytes_equal_pytorch_generate(shipped):
    key, model, sess = shipped
    prompt = list(PROMPT.encode())
    want = generate(model, torch.tensor([prompt]), N_NEW, temperature=0)[0, len(prompt):].tolist()
    got, _ = ort_greedy(sess, _manifest()["models"][key], prompt, N_NEW)
    assert got == want


def test_held_bytes_equal_the_accounting_and_the_pytorch_cache(shipped):
    key, model, sess = shipped
    entry = _manifest()["models"][key]
    acc = entry["accounting"]
    assert acc == ex.accounting(key, model)  # the manifest is current
    prompt = list(PROMPT.encode())
    _, held = ort_greedy(sess, entry, prompt, 4)
    for length, nbytes in enumerate(held, start=1):
        assert nbytes == acc["fixed"] + acc["per_token"] * length
    cache = model.new_cache(1, len(prompt))  # PyTorch's own count after the prompt
    with torch.no_grad():
        model(torch.tensor([prompt]), cache)
    assert cache.used_nbytes == held[len(prompt) - 1]


def test_manifest_describes_the_files():
    for key, entry in _manifest()["models"].items():
        path = CHECKPOINTS / entry["file"]
        assert path.is_file() and path.stat().st_size == entry["bytes"], key
        m = onnx.load(str(path))
        assert [i.name for i in m.graph.input] == ["token"] + [i["name"] for i in entry["inputs"]]
        half = any(t.data_type == onnx.TensorProto.FLOAT16 for t in m.graph.initializer)
        assert half == ex.MODELS[key][2], key  # float16 storage exactly where it is declared


def test_float16_storage_keeps_the_numbers_of_float16_weights(tmp_path):
    """Stored as float16 and cast back in the graph, GPT-2's decode step computes what PyTorch
    computes with the same weights rounded to float16 (the trained models are stored so)."""
    model, _ = _shipped("gpt2")
    path = tmp_path / "half.onnx"
    path.write_bytes((CHECKPOINTS / ex.onnx_name("gpt2")).read_bytes())
    ex.to_float16_storage(path)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
    step = ex.DecodeStep(model)
    xs = ex.example_inputs(step.layout, 5)
    got = ort.InferenceSession(str(path)).run(None, {n: x.numpy() for n, x in zip(ex.input_names(step.layout), xs)})
    with torch.no_grad():
        want = step(*xs)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-4, atol=1e-4)
    assert path.stat().st_size < 0.6 * (CHECKPOINTS / ex.onnx_name("gpt2")).stat().st_size


def test_unknown_model_is_refused():
    with pytest.raises(ValueError, match="key must be one of"):
        ex.load_panel_model("gpt5")


def test_saved_weights_load_as_their_float16_rounding(tmp_path):
    from gpt2k3.book.live import load_model, save_model
    from gpt2k3.experiments import text_lm
    from gpt2k3.experiments.text_lm import TextModelConfig

    cfg = TextModelConfig(n_layer=2, n_embd=32, n_head=2, context=16, max_context=32, chunk_size=8)
    net = text_lm.build_model("gated_deltanet", cfg, seed=3)
    save_model(net, tmp_path / "m.pt", mixer="gated_deltanet", model=cfg, meta={"seed": 3})
    back, meta = load_model(tmp_path / "m.pt")
    assert meta == {"seed": 3, "mixer": "gated_deltanet"}
    for (name, a), (_, b) in zip(net.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a.half().float(), b), name
    with pytest.raises(ValueError, match="mixer must be one of"):
        save_model(net, tmp_path / "x.pt", mixer="softmax", model=cfg)
