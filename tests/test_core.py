"""The one model core: every architecture in the book is the same decoder with other parts.

* one parametrised test over every token-mixer kind (and the channel mixers and residual styles
  the book uses): greedy decoding through the layers' own caches gives exactly the tokens of
  recomputing the whole sequence every step, and the bytes the cache holds are what
  :mod:`gpt2k3.accounting` says a model of that shape caches;
* the package has no import cycle, counting imports inside functions too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from gpt2k3 import accounting
from gpt2k3.accounting import ArchSpec
from gpt2k3.cache import LayerCache, ModelCache, StateCache
from gpt2k3.model import GPT, generate
from gpt2k3.config import GPTConfig
from gpt2k3.models.k3 import tiny_k3
from gpt2k3.cache import ConcatKVCache, KVCache, concat_cache
from gpt2k3.layers import deltanet as delta
from gpt2k3.models.hybrid import hybrid_gpt
from gpt2k3.layers.linear_attention import LinearAttention
from gpt2k3.layers.mla import MLA, LatentCache, MLAConfig
from gpt2k3.layers.moe import MoE, MoEConfig

SRC = Path(__file__).resolve().parents[1] / "src" / "gpt2k3"
CFG = GPTConfig(block_size=40, vocab_size=61, n_layer=4, n_head=2, n_embd=16)
PROMPT, NEW, BATCH = 7, 12, 2


def _spec(name: str, **kw) -> ArchSpec:
    base = dict(name=name, vocab_size=CFG.vocab_size, n_layer=CFG.n_layer, n_embd=CFG.n_embd,
                n_head=CFG.n_head, max_positions=CFG.block_size)
    return ArchSpec(**{**base, **kw})


def _kda_fields(layers, conv=4):
    return dict(kda_layers=tuple(layers), kda_n_head=CFG.n_head, kda_head_dim=CFG.head_dim,
                kda_conv_kernel=conv)


_MLA = MLAConfig(n_embd=CFG.n_embd, n_heads=CFG.n_head, q_lora_rank=12, kv_lora_rank=6,
                 qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=8, max_len=CFG.block_size)
_MLA_SPEC = dict(attention="mla", q_lora_rank=12, kv_lora_rank=6, qk_nope_head_dim=4,
                 qk_rope_head_dim=4, v_head_dim=8, bias=False, norm="rmsnorm")


def _build(kind: str):
    """``(model, cache or None, spec or None, expected cache kinds)``: the spec describes the
    model's cache to accounting (``None`` where accounting has no formula for it)."""
    L = range(CFG.n_layer)
    if kind == "softmax (GPT-2)":
        return GPT(CFG), None, _spec(kind), {"KVCache"}
    if kind == "softmax, the seed's concatenating cache":
        m = GPT(CFG)
        return m, concat_cache(m, BATCH), _spec(kind), {"ConcatKVCache"}
    if kind == "linear attention":
        return GPT(CFG, mixer=lambda c, i: LinearAttention(c)), None, None, {"StateCache"}
    if kind == "DeltaNet":
        # the delta family keeps what a KDA layer keeps: H Dk Dv numbers and the conv tails
        return (GPT(CFG, mixer=lambda c, i: delta.DeltaNet(c)), None,
                _spec(kind, **_kda_fields(L)), {"StateCache"})
    if kind == "Gated DeltaNet":
        return (GPT(CFG, mixer=lambda c, i: delta.GatedDeltaNet(c)), None,
                _spec(kind, **_kda_fields(L)), {"StateCache"})
    if kind == "KDA":
        return GPT(CFG, mixer=lambda c, i: delta.KDA(c)), None, _spec(kind, **_kda_fields(L)), {"StateCache"}
    if kind == "KDA + softmax hybrid (1:1)":
        m = hybrid_gpt(CFG, ratio=1)
        return m, None, _spec(kind, **_kda_fields((0, 2))), {"KVCache", "StateCache"}
    if kind == "MLA":
        return GPT(CFG, mixer=lambda c, i: MLA(_MLA)), None, _spec(kind, **_MLA_SPEC), {"LatentCache"}
    if kind == "MLA + MoE":
        moe = MoEConfig(n_embd=CFG.n_embd, n_routed_experts=4, n_shared_experts=1, top_k=2, d_expert=8)
        m = GPT(CFG, mixer=lambda c, i: MLA(_MLA), mlp=lambda c, i: MoE(moe))
        return m, None, _spec(kind, **_MLA_SPEC), {"LatentCache"}
    if kind == "tiny Kimi K3":
        m = tiny_k3(CFG)
        return m, None, m.spec, {"LatentCache", "StateCache"}
    raise AssertionError(kind)


KINDS = ["softmax (GPT-2)", "softmax, the seed's concatenating cache", "linear attention",
         "DeltaNet", "Gated DeltaNet", "KDA", "KDA + softmax hybrid (1:1)", "MLA", "MLA + MoE",
         "tiny Kimi K3"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_mixer_decodes_identically_through_its_layers_caches(kind):
    torch.manual_seed(0)
    model, cache, spec, kinds = _build(kind)
    model = model.double().eval()
    idx = torch.randint(0, CFG.vocab_size, (BATCH, PROMPT), generator=torch.Generator().manual_seed(1))
    ref = generate(model, idx, NEW, use_cache=False, temperature=0)
    cache = cache if cache is not None else model.new_cache(BATCH, PROMPT + NEW)
    got = generate(model, idx, NEW, temperature=0, cache=cache)
    assert torch.equal(got, ref)
    assert isinstance(cache, ModelCache) and set(cache.kinds) == kinds
    # generate ran the prompt and NEW - 1 single tokens through the cache
    n = PROMPT + NEW - 1
    assert cache.length == n
    if spec is None:  # linear attention: (S, z) per head, D^2 + D numbers, float64
        D = CFG.head_dim
        assert cache.used_nbytes == CFG.n_layer * BATCH * CFG.n_head * (D * D + D) * 8
        return
    want = accounting.kv_cache_bytes(spec, n, BATCH, 8) + accounting.state_bytes(spec, BATCH, 8)
    assert cache.used_nbytes == want


def test_the_parts_are_plain_modules_of_one_class():
    """GPT-2, a hybrid and the tiny K3 are all instances of the same decoder."""
    models = [GPT(CFG), hybrid_gpt(CFG, ratio=1), tiny_k3(CFG)]
    assert all(type(m) is GPT for m in models)
    k3 = models[-1]
    assert "wpe" not in k3.transformer and k3.lm_head.weight is not k3.transformer.wte.weight
    assert k3.residual is not None and models[0].residual is None


def test_model_cache_protocol():
    m = GPT(CFG)
    cache = m.new_cache(1, 8)
    assert all(isinstance(c, KVCache) for c in cache) and cache.length == 0
    with pytest.raises(ValueError, match="overflow"):
        m(torch.zeros(1, 9, dtype=torch.long), cache=cache)
    assert cache.length == 0  # refused before anything was written
    m(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    assert cache.length == 3 and cache.used_nbytes == cache.nbytes * 3 // 8
    cache[0].extend(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8))
    with pytest.raises(ValueError, match="disagree"):
        _ = cache.length
    cache.reset()
    assert cache.length == 0
    with pytest.raises(ValueError, match="max_len"):
        m.new_cache(1, CFG.block_size + 1)
    with pytest.raises(ValueError, match="LayerCache"):
        ModelCache([object()])
    with pytest.raises(ValueError, match="one layer cache per block"):
        m(torch.zeros(1, 1, dtype=torch.long), cache=ModelCache([StateCache()]))
    s = StateCache()
    with pytest.raises(ValueError, match="None"):
        s.extend(None, 1)
    with pytest.raises(ValueError, match="non-negative"):
        KVCache(1, 1, 4, 4).check_room(-3)
    assert issubclass(LatentCache, LayerCache) and issubclass(ConcatKVCache, LayerCache)


def test_token_ids_outside_the_vocabulary_are_refused():
    m = GPT(CFG)
    with pytest.raises(ValueError, match="vocab_size"):
        m(torch.tensor([[CFG.vocab_size]]))
    with pytest.raises(ValueError, match="vocab_size"):
        generate(m, torch.tensor([[-1]]), 2)


# ------------------------------------------------------------------------------------------
# no import cycles
# ------------------------------------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = ("gpt2k3",) + path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1]) if parts[-1] == "__init__" else ".".join(parts)


def _import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):  # every import, in functions too
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            for t in targets:
                if t in modules and t != name:
                    graph[name].add(t)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_in_the_package():
    graph = _import_graph()
    assert len(graph) > 30  # the walk found the package
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _reach(graph, low):
    reach, todo = set(), [low]
    while todo:
        for w in graph[todo.pop()] - reach:
            reach.add(w)
            todo.append(w)
    return reach


def _under(mods, *prefixes):
    return {m for m in mods if any(m == p or m.startswith(p + ".") for p in prefixes)}


def test_the_layers_of_the_package():
    """ops import no layer or model; layers import no model; the core (model, cache, config,
    ops, layers, models) imports neither the experiments nor the book-only code; accounting
    and archs import no torch module of the package."""
    graph = _import_graph()
    core = _under(graph, "gpt2k3.ops", "gpt2k3.layers", "gpt2k3.models", "gpt2k3.model",
                  "gpt2k3.cache", "gpt2k3.config", "gpt2k3.checks")
    assert len(core) > 15
    for m in _under(graph, "gpt2k3.ops"):
        assert not _under(_reach(graph, m), "gpt2k3.layers", "gpt2k3.models", "gpt2k3.model"), m
    for m in _under(graph, "gpt2k3.layers"):
        assert not _under(_reach(graph, m), "gpt2k3.models", "gpt2k3.model"), m
    for m in core:
        assert not _under(_reach(graph, m), "gpt2k3.experiments", "gpt2k3.book"), m
    for m in _under(graph, "gpt2k3.accounting", "gpt2k3.archs"):
        assert not _under(_reach(graph, m), "gpt2k3.ops", "gpt2k3.layers", "gpt2k3.models",
                          "gpt2k3.model", "gpt2k3.cache"), m


def test_one_mlp_serves_gpt2_and_the_text_experiments():
    from gpt2k3.layers.mlp import MLP
    c = GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=2, n_embd=8)
    gpt2 = MLP(c)
    assert gpt2.c_fc.weight.shape == (32, 8) and gpt2.c_proj.weight.shape == (8, 32)
    assert set(gpt2.state_dict()) == {"c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"}
    narrow = MLP(c, hidden=12, activation="relu")
    assert narrow.c_fc.weight.shape == (12, 8)
    x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0))
    assert narrow(x).shape == x.shape
    with pytest.raises(ValueError, match="hidden"):
        MLP(c, hidden=0)
    with pytest.raises(ValueError, match="activation"):
        MLP(c, activation="swish?")


def test_situ_reference_is_finite_for_large_negative_gates():
    import math

    from gpt2k3.layers.mlp import situ, situ_reference
    for g in (-1000.0, -50.0, -1.0, 0.0, 1.0, 50.0, 1000.0):
        r = situ_reference(g, 1.0)
        assert math.isfinite(r)
        t = float(situ(torch.tensor([g], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)))
        assert r == pytest.approx(t, rel=1e-12, abs=1e-300)
    assert situ_reference(-1000.0, 1.0) == pytest.approx(0.0, abs=1e-300)


@pytest.mark.parametrize("kind", ["linear attention", "DeltaNet", "KDA"])
def test_a_state_cache_keeps_the_promise_of_new_cache(kind):
    """``new_cache(B, L)`` promises B sequences of up to L tokens; a state cache refuses, when
    written, more tokens or another batch, as a KV cache does."""
    torch.manual_seed(0)
    model = _build(kind)[0].eval()
    idx = torch.randint(0, CFG.vocab_size, (BATCH, 5), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache(BATCH, 6)
    assert all(isinstance(c, StateCache) and c.max_len == 6 and c.batch == BATCH for c in cache)
    with torch.no_grad():
        model(idx, cache=cache)
        with pytest.raises(ValueError, match="overflow"):
            model(idx[:, :2], cache=cache)
        assert cache.length == 5  # refused before any layer wrote
        with pytest.raises(ValueError, match="max_len=6"):
            cache[0].extend(cache[0].state, 2)
        with pytest.raises(ValueError, match=f"batch {BATCH}"):  # an empty cache, too
            model(torch.zeros(BATCH + 1, 1, dtype=torch.long), cache=model.new_cache(BATCH, 6))
        with pytest.raises(ValueError, match=f"batch {BATCH}"):
            cache[0].extend(tuple(t[:1] for t in cache[0].state)
                            if isinstance(cache[0].state, tuple) else cache[0].state[:1], 1)
        with pytest.raises(ValueError, match="max_len"):
            generate(model, idx, 2, cache=model.new_cache(BATCH, 6))
    with pytest.raises(ValueError, match="batch"):
        StateCache(batch=0)
