"""One source of numbers: every chapter's bytes per decode step, state size, H200 and published
configuration come from one definition in :mod:`gpt2k3.accounting` / :mod:`gpt2k3.archs`."""

import ast
import inspect
import math
import subprocess
import sys
from pathlib import Path

import pytest

from gpt2k3 import accounting
from gpt2k3.book import display, figures
from gpt2k3.accounting import (H200, STATE_DTYPE_BYTES, decode_bytes, decode_bytes_per_token,
    expected_distinct_experts, hybrid_cache_bytes, roofline, state_bytes, weight_and_cache_bytes)
from gpt2k3.archs import DEEPSEEK_V3, KIMI_K2, KIMI_LINEAR_48B
from gpt2k3.book.figures import k3 as ch8
from gpt2k3.book.figures import kv_cache as ch2

SRC = Path(__file__).resolve().parents[1] / "src" / "gpt2k3"
SPECS = (DEEPSEEK_V3, KIMI_LINEAR_48B, KIMI_K2)
CONTEXTS = (4096, 1 << 20)
BATCHES = (1, 64)


# ------------------------------------------------------------------ bytes per decode step
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("batch", BATCHES)
def test_chapters_2_7_and_8_report_the_same_bytes_per_decode_step(spec, context, batch):
    # chapter 2: the figure-side split of a step into weights and cache (+ state)
    w, c = ch2.weight_and_cache_bytes(spec, context, batch, 2, 2)
    # chapter 9: the roofline's bytes per step (bf16 weights and cache, float32 state)
    step8 = roofline(spec, context, batch, H200, 1, 2, 2, ch8.STATE_BYTES).bytes_per_step
    # chapter 7: bytes per token, with the defaults its table uses
    step7 = decode_bytes_per_token(spec, context, batch=batch) * batch
    assert w + c == pytest.approx(step8, rel=1e-12)
    assert step7 == pytest.approx(step8, rel=1e-12)
    assert w + c == pytest.approx(decode_bytes(spec, context, batch).total, rel=1e-12)
    # chapter 2's bars are the same numbers
    fig = figures.decode_step_bytes([spec], contexts=(context,), batch=batch)
    assert fig.data[0].y[0] + fig.data[1].y[0] == pytest.approx(step8, rel=1e-5)


def test_chapter_2_uses_the_wake_up_of_experts():
    # at B = 256 DeepSeek-V3 reads nearly all its experts, so its weights per step grow
    touched = expected_distinct_experts(DEEPSEEK_V3.n_routed_experts, DEEPSEEK_V3.top_k, 256)
    assert touched / DEEPSEEK_V3.n_routed_experts > 0.99
    w1, _ = ch2.weight_and_cache_bytes(DEEPSEEK_V3, 4096, 1)
    w256, _ = ch2.weight_and_cache_bytes(DEEPSEEK_V3, 4096, 256)
    assert w256 / w1 > 10
    assert decode_bytes(DEEPSEEK_V3, 4096, 256).experts_per_layer == touched


def test_the_function_chapter_2_uses_is_the_accounting():
    assert ch2.weight_and_cache_bytes is weight_and_cache_bytes
    assert ch8.full_attention is accounting.full_attention
    assert not hasattr(ch2, "DTYPE_BYTES") and not hasattr(ch2, "human_bytes")


# ------------------------------------------------------------------ state size
def test_one_state_size_float32_everywhere():
    assert STATE_DTYPE_BYTES == 4 == ch8.STATE_BYTES
    s = KIMI_LINEAR_48B
    per_layer = accounting.state_numbers_per_layer(s)
    assert per_layer == accounting.mixer_state_numbers(s.kda_n_head, s.kda_head_dim,
                                                       conv_kernel=s.kda_conv_kernel)
    # chapter 6 (hybrid figure), chapter 7 (table default) and chapter 9 (memory per sequence)
    st = state_bytes(s)
    assert st == s.n_kda_layers * sum(per_layer.values()) * 4
    assert hybrid_cache_bytes(s, 3, 1)["state"] == st
    assert accounting.memory_per_sequence(s, 0) == st
    assert display.fmt_decimal_bytes(st) == "44.9 MB" and display.fmt_bytes(st) == "42.8 MiB"
    # linear attention's state adds the normaliser z; a delta-rule state is S alone
    assert accounting.mixer_state_numbers(4, 16, normalizer=True)["recurrent"] == 4 * (16 * 16 + 16)
    assert accounting.mixer_state_numbers(4, 16) == {"recurrent": 4 * 16 * 16, "conv": 0}
    assert accounting.mixer_state_numbers(4, 16, conv_kernel=4)["conv"] == 3 * 4 * 3 * 16
    for bad in (dict(n_head=0), dict(d_key=-1), dict(d_value=0), dict(conv_kernel=-1),
                dict(normalizer=1)):
        kw = {"n_head": 4, "d_key": 16, **bad}
        with pytest.raises(ValueError, match=next(iter(bad))):
            accounting.mixer_state_numbers(**kw)


# ------------------------------------------------------------------ hardware, units, format
def test_one_h200_and_one_dtype_table():
    assert figures.H200_MEMORY_BYTES == H200.memory_bytes == 141e9
    assert (H200.bandwidth, H200.peak_flops) == (4.8e12, 989e12)
    assert accounting.DTYPE_BYTES == {"fp32": 4, "bf16": 2, "fp8": 1, "int4": 0.5}
    with pytest.raises(ValueError, match="weight_dtype"):
        accounting.dtype_bytes("weight_dtype", "fp16")


OWNED_FIGURES = ("gpt2", "kv_cache", "gates", "mla_moe", "k3", "recall")


@pytest.mark.parametrize("module", OWNED_FIGURES)
def test_figures_define_no_formatter_and_no_model_logic(module):
    tree = ast.parse((SRC / "book" / "figures" / f"{module}.py").read_text())
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    for name in ("human_bytes", "fmt_bytes", "fmt_gb", "fmt_count", "_gb", "_short",
                 "hybrid_spec", "hybrid_cache_bytes", "ratio_label", "full_attention",
                 "weight_and_cache_bytes", "mla_cache_variants"):
        assert name not in defined, f"figures/{module}.py defines {name}"


@pytest.mark.parametrize("path", sorted((SRC / "book" / "figures").glob("*.py"))
                         + sorted((SRC / "book" / "widgets").glob("*.py")), ids=lambda p: p.name)
def test_no_figure_or_widget_imports_a_private_name(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                assert not alias.name.startswith("_"), f"{path.name} imports {alias.name}"


def test_formatters():
    assert display.fmt_bytes(1536) == "1.5 KiB" and display.fmt_bytes(12) == "12 B"
    assert display.fmt_decimal_bytes(19.3e9) == "19.3 GB" and display.fmt_gb(15.7e6) == "0.0157 GB"
    assert display.fmt_count(671026404352) == "671B" and display.fmt_count(124439808) == "124M"
    assert display.fmt_count(-4_974_592, sign=True) == "−4.97M"
    assert display.sig(123456789.0, 3) == 123000000.0 and display.sig(0.000123456, 2) == 0.00012
    for f in (display.fmt_bytes, display.fmt_decimal_bytes, display.fmt_gb, display.fmt_count):
        with pytest.raises(ValueError, match="n"):
            f(math.nan)


# ------------------------------------------------------------------ published configurations
def test_published_layer_configs_derive_from_archs():
    from gpt2k3.layers.mla import MLAConfig
    from gpt2k3.layers.moe import MoEConfig

    for spec, mla, moe in ((DEEPSEEK_V3, MLAConfig.deepseek_v3(), MoEConfig.deepseek_v3()),
                           (KIMI_K2, MLAConfig.kimi_k2(), MoEConfig.kimi_k2())):
        assert mla == MLAConfig.from_spec(spec, rope_theta=mla.rope_theta)
        assert (mla.n_embd, mla.n_heads, mla.kv_lora_rank, mla.max_len) == (
            spec.n_embd, spec.n_head, spec.kv_lora_rank, spec.max_positions)
        assert moe == MoEConfig.from_spec(spec, routed_scaling_factor=moe.routed_scaling_factor,
                                          n_group=moe.n_group, topk_group=moe.topk_group)
        assert (moe.n_routed_experts, moe.top_k, moe.d_expert, moe.n_shared_experts) == (
            spec.n_routed_experts, spec.top_k, spec.d_expert, spec.n_shared_experts)
    assert MoEConfig.deepseek_v3().routed_scaling_factor == 2.5
    assert (MoEConfig.kimi_k2().n_routed_experts, MLAConfig.kimi_k2().n_heads) == (384, 64)
    with pytest.raises(ValueError, match="n_routed_experts"):
        MoEConfig.from_spec(DEEPSEEK_V3.with_(n_routed_experts=0, n_shared_experts=0, top_k=0))
    from gpt2k3.archs import KIMI_K3

    with pytest.raises(ValueError, match="latent"):
        MoEConfig.from_spec(KIMI_K3)


def test_archs_holds_no_transformers_helpers():
    from gpt2k3 import archs

    assert not hasattr(archs, "hf_meta_model") and not hasattr(archs, "hf_config")


# ------------------------------------------------------------------ torch-free accounting
def test_accounting_imports_no_torch():
    for path in sorted((SRC / "accounting").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "torch" for n in names), path.name
    code = ("import sys, gpt2k3.accounting, gpt2k3.archs, gpt2k3.book.display; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ------------------------------------------------------------------ one of each (chapters 7-9)
def _source(module) -> str:
    import inspect
    return inspect.getsource(module)


def test_one_mla_class_and_one_expert_dispatch():
    """One MLA (RoPE and the output gate are config fields), one sort-by-expert dispatch that
    both MoE forms call, one validation module the accounting uses, one layer schedule."""
    from gpt2k3.layers import mla, moe
    from gpt2k3.models import hybrid, k3
    classes = [n for n, v in vars(mla).items() if isinstance(v, type) and issubclass(v, mla.MLA)]
    assert classes == ["MLA"]
    text = _source(moe)
    assert text.count(".argsort(") == 1 and text.count("index_add_") == 1
    assert "dispatch(" in _source(moe.MoE.forward) and "dispatch(" in _source(moe.LatentMoE.forward)
    assert not (SRC / "accounting" / "_checks.py").exists()
    for path in sorted((SRC / "accounting").glob("*.py")):
        assert "_checks" not in path.read_text(), path.name
    # every schedule is the accounting's hybrid_layers
    assert "hybrid_layers(" in _source(hybrid.hybrid_schedule)
    assert "hybrid_layers(" in _source(k3.tiny_k3)
    assert not hasattr(k3, "k3_schedule")


def test_accounting_checks_a_spec_once_per_call(monkeypatch):
    from gpt2k3.accounting import decode, flops, memory, params, serving, spec as spec_module
    from gpt2k3.archs import KIMI_K3, KIMI_LINEAR_48B
    calls = []
    real = spec_module.check_spec
    for module in (decode, flops, memory, params, serving):
        monkeypatch.setattr(module, "check_spec", lambda v, n="spec": calls.append(n) or real(v, n))
    for call in (lambda: decode.decode_bytes(KIMI_K3, 1 << 20),
                 lambda: serving.roofline(KIMI_K3, 1 << 20, 8),
                 lambda: serving.max_batch(KIMI_K3, 1 << 20, n_devices=64),
                 lambda: serving.hybrid_speedups(KIMI_LINEAR_48B, 1 << 20),
                 lambda: flops.flops_per_token(KIMI_K3, 1 << 20)):
        calls.clear()
        call()
        assert len(calls) == 1


# --------------------------------------------------------------------------- one check per call


def test_a_door_inside_another_doors_call_runs_its_body_alone():
    """gpt2k3.checks.checked: the outermost door checks; a door it reaches does not check again;
    a door called on its own checks; the state is restored after an error."""
    from gpt2k3 import checks
    seen = []

    def check_inner(x):
        seen.append(("inner", x))
        if x < 0:
            raise ValueError(f"x must be >= 0, got {x}")

    def check_outer(x):
        seen.append(("outer", x))

    @checks.checked(check_inner)
    def inner(x):
        return x + 1

    @checks.checked(check_outer)
    def outer(x):
        return inner(x) * 2

    assert outer(3) == 8 and seen == [("outer", 3)]
    seen.clear()
    assert outer(-5) == -8 and seen == [("outer", -5)]  # the outer door vouched for it
    seen.clear()
    with pytest.raises(ValueError, match="x must be >= 0"):
        inner(-1)  # called on its own, the inner door checks
    seen.clear()

    @checks.checked(lambda x: (_ for _ in ()).throw(ValueError("bad x")))
    def refusing(x):
        return x

    with pytest.raises(ValueError, match="bad x"):
        refusing(1)
    assert inner(2) == 3 and seen == [("inner", 2)]  # nothing left set by the refused call
    assert inspect.unwrap(outer).__name__ == "outer" and not checks._INSIDE_DOOR.get()


def test_generate_checks_the_ids_once_per_call(monkeypatch):
    """One token check per call, whatever the number of steps: the model's forward and the
    layers' doors run inside generate's (and a token check reads the ids back to the host)."""
    import torch

    from gpt2k3 import model as model_module
    from gpt2k3.config import GPTConfig

    calls = []
    real = model_module.check_token_ids
    monkeypatch.setattr(model_module, "check_token_ids",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    m = model_module.GPT(GPTConfig(block_size=32, vocab_size=50, n_layer=2, n_head=2, n_embd=16))
    model_module.generate(m, torch.zeros(1, 3, dtype=torch.long), 6, temperature=0)
    assert len(calls) == 1
