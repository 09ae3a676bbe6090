"""A GPT-2 decoder rearranged for speed at small batch, tested equal to
:func:`gpt2k3.model.generate`.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2k3.checks import check_nonnegative_int, check_positive_int, check_sampling, check_token_ids
from gpt2k3.layers.attention import CausalSelfAttention, GPT2Attention
from gpt2k3.layers.mlp import MLP
from gpt2k3.model import GPT2, sample


class FastDecoder:
    """Cached decoding of a plain GPT-2 at the memory-bandwidth limit of a CPU.

    :func:`generate` with a :class:`KVCache` is the decode loop chapter 2 teaches: readable,
    module by module. This class computes the same thing for a :class:`GPT2` (or a :class:`GPT` built with
    GPT-2's own parts), rearranged for speed at small batch, where a decode step is a chain
    of matrix-vector products whose cost is the bytes of weights they stream:

    * **each weight in the layout that streams fastest.** ``nn.Linear`` stores ``(out, in)``
      and computes ``x @ W.T``. For a single row ``x`` the BLAS streams a weight with a long
      output (the fused q/k/v projection, the MLP's up-projection, the square attention
      output, and above all the tied head, 50,257 outputs long) faster when it is stored
      ``(in, out)`` and multiplied as ``x @ W_t``; the MLP's down-projection, with a long
      *input*, streams faster as it is. ``benchmarks/decode.py`` measures both layouts for
      every shape and records them. So the weights with ``out >= in`` -- the head included, as
      ``wte.T`` of shape ``(n_embd, vocab)`` -- are copied once, at construction, into
      ``(in, out)``; the others are kept ``(out, in)``;
    * **preallocated buffers.** The KV cache (one K and one V tensor per layer, as in
      :class:`KVCache`) and a step's activations are allocated once; a step writes into them
      with ``out=`` products and in-place adds;
    * **no per-step bookkeeping.** No validation, no module calls, fewer operations (the
      attention scale ``1/sqrt(D)`` is folded into the query weights, exact for GPT-2's
      ``D = 64``), and logits only for the positions that are sampled: the prompt's last.

    Every product is the reference forward's, up to the BLAS kernel's rounding, so decoding
    gives the same tokens (tested: against :func:`generate`, and against Hugging Face's
    ``generate`` with the same weights). The packed copy costs a second set of weights in
    memory; build one decoder per model and reuse it. Later changes to the model's weights
    are not seen by the decoder, and it always decodes as in ``eval()`` mode (no dropout).

    Args:
        model: a :class:`GPT2`, or a :class:`GPT` with GPT-2's parts (the default).
        max_len: longest sequence (prompt + new tokens) it decodes; defaults to the block size.
        batch: sequences decoded together.
    """

    def __init__(self, model: GPT2, max_len: int | None = None, batch: int = 1):
        if not isinstance(model, GPT2):
            raise ValueError(f"model must be a GPT2 or GPT, got {type(model).__name__}")
        if not all(type(b.attn) in (GPT2Attention, CausalSelfAttention) and type(b.mlp) is MLP
                   and b.mlp.c_fc.out_features == 4 * model.config.n_embd
                   and isinstance(b.mlp.act, nn.GELU) and b.mlp.act.approximate == "tanh"
                   and type(b.ln_1) is nn.LayerNorm and type(b.ln_2) is nn.LayerNorm
                   for b in model.transformer.h) or getattr(model, "residual", None) is not None \
                or "wpe" not in model.transformer or not model.config.tie_embeddings:
            raise ValueError("model must be a plain GPT-2: causal self-attention, the 4x tanh-GELU MLP and "
                             "LayerNorm in every block, learned positions, a tied head and the "
                             "plain residual (FastDecoder packs exactly those weights)")
        cfg = model.config
        max_len = cfg.block_size if max_len is None else max_len
        check_positive_int(max_len, "max_len")
        if max_len > cfg.block_size:
            raise ValueError(f"max_len must be at most block_size={cfg.block_size}, got {max_len}")
        check_positive_int(batch, "batch")
        self.config, self.max_len, self.batch = cfg, max_len, batch
        t = model.transformer
        self.dtype, self.device = t.wte.weight.dtype, t.wte.weight.device
        C, H = cfg.n_embd, cfg.n_head
        D = C // H
        kw = dict(dtype=self.dtype, device=self.device)

        def vec(x: torch.Tensor | None, n: int) -> torch.Tensor:  # a bias, or zeros without one
            return torch.zeros(n, **kw) if x is None else x.detach().clone()

        def norm(ln: nn.LayerNorm) -> tuple:
            return (vec(ln.weight, C), vec(ln.bias, C), ln.eps)

        with torch.no_grad():
            self.wte = t.wte.weight.detach().clone()  # rows looked up by token id
            self.wpe = t.wpe.weight.detach().clone()
            self.head = self.pack(model.lm_head.weight)  # (C, vocab)
            self.ln_f = norm(t.ln_f)
            self.layers = []
            for b in t.h:
                a, m = b.attn, b.mlp
                w_qkv, b_qkv = self.pack(a.c_attn.weight), vec(a.c_attn.bias, 3 * C)
                # 1/sqrt(D) folded into the query columns: exact when it is a power of two
                # (D a power of four, as in every GPT-2), a rounding difference otherwise
                w_qkv[:, :C] *= 1.0 / math.sqrt(D)
                b_qkv[:C] *= 1.0 / math.sqrt(D)
                self.layers.append(dict(
                    ln_1=norm(b.ln_1), w_qkv=w_qkv, b_qkv=b_qkv,
                    w_o=self.pack(a.c_proj.weight), b_o=vec(a.c_proj.bias, C),
                    ln_2=norm(b.ln_2),
                    w_fc=self.pack(m.c_fc.weight), b_fc=vec(m.c_fc.bias, 4 * C),
                    w_mp=self.pack(m.c_proj.weight), b_mp=vec(m.c_proj.bias, C),
                ))
        self.k = [torch.zeros(batch, H, max_len, D, **kw) for _ in range(cfg.n_layer)]
        self.v = [torch.zeros(batch, H, max_len, D, **kw) for _ in range(cfg.n_layer)]
        # one step's activations, written in place, and views of them by head
        self._x = torch.empty(batch, C, **kw)
        self._qkv = torch.empty(batch, 3 * C, **kw)
        self._y = torch.empty(batch, C, **kw)
        self._fc = torch.empty(batch, 4 * C, **kw)
        self._o = torch.empty(batch, C, **kw)
        self._logits = torch.empty(batch, cfg.vocab_size, **kw)
        heads = self._qkv.view(batch, 3, H, D)
        self._q, self._k_new, self._v_new = heads[:, 0], heads[:, 1], heads[:, 2]  # (B, H, D)
        self._y_heads = self._y.view(batch * H, 1, D)

    @staticmethod
    def pack(weight: torch.Tensor) -> torch.Tensor:
        """``weight`` ``(out, in)`` as the ``(in, out)`` operand of ``x @ w``: a contiguous copy
        of ``weight.T`` when ``out >= in``, otherwise a transposed view of a copy of ``weight``
        (see the class docstring for why the layout depends on the shape)."""
        out_features, in_features = weight.shape
        w = weight.detach()
        return w.t().contiguous() if out_features >= in_features else w.clone().t()

    @property
    def nbytes(self) -> int:
        """Bytes held: the packed weights and the preallocated cache."""
        ts = [self.wte, self.wpe, self.head, *self.ln_f[:2], *self.k, *self.v]
        for layer in self.layers:
            ts += [x for v in layer.values() for x in (v[:2] if isinstance(v, tuple) else (v,))]
        return sum(x.numel() * x.element_size() for x in ts)

    @torch.no_grad()
    def prefill(self, idx: torch.Tensor) -> torch.Tensor:
        """Run the prompt ``(B, T)`` through every layer, filling the cache; logits of its
        last position ``(B, vocab)``. No checks: :meth:`generate` is the front door."""
        B, T = idx.shape
        C, H = self.config.n_embd, self.config.n_head
        x = self.wte[idx] + self.wpe[:T]  # (B, T, C)
        for li, L in enumerate(self.layers):
            h = F.layer_norm(x, (C,), *L["ln_1"])
            qkv = torch.addmm(L["b_qkv"], h.view(B * T, C), L["w_qkv"]).view(B, T, 3, H, C // H)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, D)
            self.k[li][:, :, :T] = k
            self.v[li][:, :, :T] = v
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)  # q pre-scaled
            y = y.transpose(1, 2).reshape(B * T, C)
            x = x + torch.addmm(L["b_o"], y, L["w_o"]).view(B, T, C)
            h = F.layer_norm(x, (C,), *L["ln_2"]).view(B * T, C)
            f = F.gelu(torch.addmm(L["b_fc"], h, L["w_fc"]), approximate="tanh")
            x = x + torch.addmm(L["b_mp"], f, L["w_mp"]).view(B, T, C)
        self._x.copy_(x[:, -1])
        h = F.layer_norm(self._x, (C,), *self.ln_f)
        return torch.mm(h, self.head, out=self._logits)

    @torch.no_grad()
    def step(self, tok: torch.Tensor, pos: int) -> torch.Tensor:
        """One token per sequence (``tok`` of shape ``(B,)``) at position ``pos``, attending to
        the ``pos`` cached positions and itself; logits ``(B, vocab)``. No checks, as
        :meth:`prefill`."""
        C, H = self.config.n_embd, self.config.n_head
        B, n = self.batch, pos + 1
        x, qkv, fc, o = self._x, self._qkv, self._fc, self._o
        torch.add(self.wte[tok], self.wpe[pos], out=x)
        for L, K, V in zip(self.layers, self.k, self.v):
            h = F.layer_norm(x, (C,), *L["ln_1"])
            torch.addmm(L["b_qkv"], h, L["w_qkv"], out=qkv)  # q comes out scaled by 1/sqrt(D)
            q = self._q.reshape(B * H, 1, C // H)  # a view at batch 1, a copy otherwise
            K[:, :, pos] = self._k_new
            V[:, :, pos] = self._v_new
            K, V = K.view(B * H, -1, C // H)[:, :n], V.view(B * H, -1, C // H)[:, :n]
            att = torch.softmax(torch.bmm(q, K.transpose(1, 2)), dim=-1)  # (B*H, 1, n)
            torch.bmm(att, V, out=self._y_heads)
            x.add_(torch.addmm(L["b_o"], self._y, L["w_o"], out=o))
            h = F.layer_norm(x, (C,), *L["ln_2"])
            torch.addmm(L["b_fc"], h, L["w_fc"], out=fc)
            x.add_(torch.addmm(L["b_mp"], F.gelu(fc, approximate="tanh"), L["w_mp"], out=o))
        h = F.layer_norm(x, (C,), *self.ln_f)
        return torch.mm(h, self.head, out=self._logits)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Same contract as :func:`generate` with ``use_cache=True``: ``(B, T + max_new_tokens)``.

        ``idx`` must have this decoder's batch size and ``T + max_new_tokens <= max_len``.
        """
        check_nonnegative_int(max_new_tokens, "max_new_tokens")
        check_sampling(temperature, top_k, self.config.vocab_size)
        B, T = check_token_ids(idx, self.config.vocab_size)
        if B != self.batch:
            raise ValueError(f"idx must have shape (B, T) = ({self.batch}, T >= 1) for this decoder, "
                             f"got {tuple(idx.shape)}")
        if T + max_new_tokens > self.max_len:
            raise ValueError(f"prompt length {T} + max_new_tokens {max_new_tokens} exceeds "
                             f"max_len={self.max_len}")
        out = torch.empty(B, T + max_new_tokens, dtype=idx.dtype, device=idx.device)
        out[:, :T] = idx
        if max_new_tokens == 0:
            return out
        logits = self.prefill(idx.to(self.device).long())
        for i in range(max_new_tokens):
            nxt = sample(logits, temperature, top_k, generator)  # (B, 1)
            out[:, T + i] = nxt[:, 0]
            if i + 1 < max_new_tokens:
                logits = self.step(nxt[:, 0], T + i)
        return out
