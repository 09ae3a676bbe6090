r"""Muon and QK-clip: the optimizer Kimi K2 was trained with (MuonClip), in reference form.

**Muon** (Keller Jordan, 2024) keeps one momentum buffer per weight matrix, like SGD with
momentum, and then replaces the update by the nearest semi-orthogonal matrix: every singular
value of the update is pushed towards one, so a step moves the matrix by about the same amount
in every direction its gradient points to, instead of mostly along the few directions where the
gradient is largest. The orthogonalisation is a Newton--Schulz iteration
(:func:`newton_schulz`), five steps of the quintic

.. math::

    X \leftarrow a X + b (X X^\top) X + c (X X^\top)^2 X,
    \qquad (a, b, c) = (3.4445, -4.7750, 2.0315),

after dividing by the Frobenius norm, so that every singular value starts in ``(0, 1]``. Each
step maps a singular value :math:`\sigma` to :math:`a\sigma + b\sigma^3 + c\sigma^5`; the
coefficients make that map steep at zero, so five steps lift every singular value of at least
:math:`\|G\|_F / 500` into ``[0.68, 1.21]`` (:data:`NS_BAND`) rather than exactly to one.

**The scale rule** is Moonshot's ("Muon is Scalable for LLM Training", Liu et al. 2025): the
orthogonalised update ``O`` of an ``A x B`` matrix has an RMS of about ``1 / sqrt(max(A, B))``,
so it is multiplied by ``0.2 sqrt(max(A, B))`` (:func:`rms_match`) to give it the update RMS
AdamW shows in practice (Moonshot measured about 0.2 to 0.4 and took 0.2). AdamW's learning
rate and weight decay then carry over unchanged:

.. math::

    W \leftarrow W - \eta\,\big(0.2\,\sqrt{\max(A, B)}\; O + \lambda W\big).

Muon is for the hidden matrices only; the embeddings, the output head and every vector (norm
gains, biases) stay with AdamW (:func:`muon_param_groups` states the rule), and :class:`Muon`
runs both kinds of group as one optimizer.

**Per-Head Muon** is Kimi K3's refinement for attention (the K3 report, arXiv:2607.24653,
Section 2.5): "instead of applying Newton--Schulz orthogonalization to the full Q, K, and V
projection matrices, we partition their momentum matrices along the head dimension and
orthogonalize each head's block separately", so that heads with large momentum do not take the
shared direction from the quiet ones. Here ``newton_schulz(G, heads=h)`` cuts ``G``'s rows
into ``h`` blocks; for GPT-2's packed ``c_attn`` (rows: the query, key and value of every head
in turn) ``h = 3 n_head`` (:func:`muon_param_groups` with ``per_head=True``), each block scaled
by ``rms_match`` of its own shape. :func:`head_update_rms` measures each head's step under
either form.

**QK-clip** is Kimi K2's fix for the attention logits that grow without bound under Muon
(the "MuonClip" optimizer of the K2 report, arXiv:2507.20534, Algorithm 1): after every
optimizer step, for each attention head ``h`` whose largest pre-softmax logit in that step's
forward pass, :math:`S^h_{\max} = \max_{X \in B} \max_{i,j} q^h_i \cdot k^h_j / \sqrt{d}`,
exceeds a threshold :math:`\tau`, the head's query and key weights are scaled by
:math:`\sqrt{\gamma_h}` with :math:`\gamma_h = \min(1, \tau / S^h_{\max})`, so that the
logits those weights produce shrink by :math:`\gamma_h`. The report clips per head, and leaves
alone the heads below the threshold; for MLA only the head-specific parts are scaled
(:math:`q^C, k^C` by :math:`\sqrt{\gamma_h}`, the head's rotary query :math:`q^R` by
:math:`\gamma_h`, the rotary key shared by all heads not at all). K2 used :math:`\tau = 100`.
:class:`MaxLogits` records :math:`S^h_{\max}` for GPT-2's attention and :func:`qk_clip`
scales the head's rows of ``c_attn``'s query and key parts, biases included (GPT-2's
projections have biases, and only scaling both scales the logit exactly).

A readable reference, not a fast one: float32, one matrix at a time, on any device.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from gpt2k3.checks import (check_bool, check_finite_number, check_instance, check_int,
                           check_number, checked)
from gpt2k3.layers.attention import CausalSelfAttention

__all__ = ["NS_COEFFICIENTS", "NS_STEPS", "TORCH_MUON_CHECK", "TORCH_MUON_SHAPES",
           "TORCH_MUON_TOLERANCE", "K2_QK_CLIP_TAU", "PUBLISHED_OBSERVATIONS", "step_flops", "NS_BAND", "newton_schulz", "rms_match", "head_update_rms",
           "muon_direction", "Muon", "muon_param_groups", "head_max_logits", "MaxLogits",
           "qk_clip"]

#: The quintic's coefficients (Keller Jordan's reference ``zeropower_via_newtonschulz5``).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
#: QK-clip's threshold in Kimi K2's pre-training (the K2 report, Section 2.1: "we train Kimi K2
#: [...] using MuonClip with tau = 100").
K2_QK_CLIP_TAU = 100.0
#: What the K2 report (Section 2.1) and Moonshot's Muon paper say about the two behaviours
#: chapter 11 measures, in their words.
PUBLISHED_OBSERVATIONS = {
    "logit_growth": {"quote": "the maximum attention logits quickly exceed a magnitude of 1000",
                     "setting": "a mid-scale model, 9B activated and 53B total parameters, "
                                "trained with plain Muon",
                     "source": "Kimi Team 2025, 'Kimi K2: Open Agentic Intelligence' "
                               "(arXiv:2507.20534), Section 2.1"},
    "same_lr": {"quote": "Muon can directly reuse the learning rate and weight decay tuned for "
                         "AdamW",
                "setting": "with the update scaled by 0.2 sqrt(max(A, B))",
                "source": "Liu et al. 2025, 'Muon is Scalable for LLM Training' "
                          "(arXiv:2502.16982), beside its update-scale rule (Eq. 4)"},
}
#: The setting in which ``tests/test_muon.py`` checks whole-matrix :class:`Muon` against
#: PyTorch's own ``torch.optim.Muon`` (with ``adjust_lr_fn="match_rms_adamw"``, Moonshot's scale),
#: on matrices of :data:`TORCH_MUON_SHAPES`; PyTorch runs Newton--Schulz in bfloat16, so the two
#: steps agree to :data:`TORCH_MUON_TOLERANCE` of the step's largest entry.
TORCH_MUON_CHECK = dict(lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, ns_steps=5)
TORCH_MUON_SHAPES = ((64, 32), (32, 64))
TORCH_MUON_TOLERANCE = 0.03
#: Newton--Schulz steps per update (the reference's default).
NS_STEPS = 5
#: Where five steps put every singular value ``sigma`` of an input with ``sigma >= ||G||_F / 500``
#: (measured on the scalar map: 0.6818 .. 1.2024); smaller ones end lower (they start lower).
NS_BAND = (0.68, 1.21)


def _check_newton_schulz(G, steps=NS_STEPS, heads=1) -> None:
    """The door of :func:`newton_schulz`: a 2-D floating ``G`` whose rows split into ``heads``
    equal blocks, ``steps >= 1``."""
    if not isinstance(G, torch.Tensor) or G.dim() != 2 or not G.is_floating_point():
        raise ValueError(f"G must be a 2-D floating tensor, got {getattr(G, 'shape', G)!r}")
    check_int(steps, "steps", 1)
    if check_int(heads, "heads", 1) and G.shape[0] % heads:
        raise ValueError(f"heads must divide G's {G.shape[0]} rows, got {heads}")


@checked(_check_newton_schulz)
def newton_schulz(G: torch.Tensor, steps: int = NS_STEPS, heads: int = 1) -> torch.Tensor:
    """An approximately semi-orthogonal matrix with ``G``'s singular vectors: ``U S' V^T`` for
    ``G = U S V^T``, every ``S'`` in :data:`NS_BAND` (five quintic steps, in float32).

    With ``heads > 1`` the rows of ``G`` are cut into ``heads`` equal blocks (one attention
    head's rows of a projection each) and every block is orthogonalised on its own, with its
    own norm: Kimi K3's Per-Head Muon. ``heads=1`` is the whole matrix."""
    a, b, c = NS_COEFFICIENTS
    X = G.to(torch.float32).reshape(heads, G.shape[0] // heads, G.shape[1])
    tall = X.shape[1] > X.shape[2]
    if tall:  # iterate on the wide form: X X^T is then the smaller Gram matrix
        X = X.mT
    X = X / (X.norm(dim=(1, 2), keepdim=True) + 1e-7)  # each block's singular values <= 1
    for _ in range(steps):
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return (X.mT if tall else X).reshape(G.shape)


def rms_match(shape: torch.Size | tuple[int, ...]) -> float:
    """Moonshot's update scale for an ``A x B`` matrix, ``0.2 sqrt(max(A, B))``: it brings an
    orthogonalised update (RMS about ``1 / sqrt(max(A, B))``) to AdamW's update RMS, 0.2."""
    A, B = shape
    return 0.2 * math.sqrt(max(A, B))


def head_update_rms(update: torch.Tensor, heads: int) -> dict[str, torch.Tensor]:
    """Each of ``heads`` row blocks' RMS, ``(heads,)`` each: of ``update`` itself
    (``"input"``, the momentum Newton--Schulz receives) and of the step Muon takes from it,
    whole-matrix (``"whole"``: ``rms_match(shape)`` times :func:`newton_schulz` of the whole
    matrix) and per head (``"per_head"``: each block orthogonalised and scaled on its own)."""
    rows, cols = update.shape
    blocks = (rows // heads, cols)
    whole = rms_match(update.shape) * newton_schulz(update)
    per_head = rms_match(blocks) * newton_schulz(update, heads=heads)

    def rms(m):
        return m.float().reshape(heads, -1).square().mean(dim=1).sqrt()
    return {"input": rms(update), "whole": rms(whole), "per_head": rms(per_head)}


def muon_direction(grad: torch.Tensor, buf: torch.Tensor, momentum: float,
                   nesterov: bool = True, steps: int = NS_STEPS, heads: int = 1) -> torch.Tensor:
    """One Muon direction from ``grad``, updating the momentum buffer ``buf`` in place.

    As in Keller Jordan's reference: ``buf <- momentum buf + (1 - momentum) grad``; with
    Nesterov momentum the step looks ahead, ``(1 - momentum) grad + momentum buf``. Either way
    the result is orthogonalised (:func:`newton_schulz`, per head with ``heads > 1``), which
    also removes its overall scale.
    Moonshot's paper writes the buffer as a sum, ``M <- momentum M + grad``, and feeds
    ``momentum M + grad`` to the iteration: from a zero buffer that is this one times
    ``1 / (1 - momentum)`` at every step, a factor the normalisation removes.
    """
    buf.lerp_(grad, 1 - momentum)
    update = grad.lerp(buf, momentum) if nesterov else buf
    return newton_schulz(update, steps, heads)


class Muon(torch.optim.Optimizer):
    """Muon for the groups marked ``"muon": True``, AdamW for the others, in one optimizer.

    A Muon group must hold 2-D matrices only; each step decays a matrix by ``1 - lr *
    weight_decay`` and moves it by ``-lr * rms_match(shape)`` times its :func:`muon_direction`.
    A Muon group with ``"heads": h > 1`` (Per-Head Muon) orthogonalises each of its matrices'
    ``h`` row blocks on its own and scales each by ``rms_match`` of the block's shape, so every
    block's update has the RMS one whole matrix's has.
    An AdamW group runs AdamW with decoupled weight decay (moment decays ``betas``, ``eps``).
    One ``lr`` serves both, as in Moonshot's recipe; build the groups with
    :func:`muon_param_groups`. ``ValueError`` here for any bad setting or group.
    """

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True, ns_steps: int = NS_STEPS,
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8):
        check_finite_number(lr, "lr", 1)
        check_finite_number(weight_decay, "weight_decay", 1, allow_zero=True)
        check_number(momentum, "momentum", 0.0, 1.0, what="a number in [0, 1)")
        if momentum == 1.0:
            raise ValueError("momentum must be a number in [0, 1), got 1.0")
        check_bool(nesterov, "nesterov")
        check_int(ns_steps, "ns_steps", 1)
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            raise ValueError(f"betas must be a pair of numbers in [0, 1), got {betas!r}")
        for beta in betas:
            if check_number(beta, "betas", 0.0, 1.0, what="a pair of numbers in [0, 1)") == 1.0:
                raise ValueError(f"betas must be a pair of numbers in [0, 1), got {betas!r}")
        check_finite_number(eps, "eps", 1)
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_steps=ns_steps, betas=tuple(betas), eps=eps, muon=False, heads=1)
        try:
            super().__init__(params, defaults)
        except (TypeError, ValueError) as err:  # torch's own checks: say which argument
            raise ValueError(f"params must be parameters or parameter groups ({err})") from None
        for group in self.param_groups:
            _check_group(group)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    (self.muon_step if group["muon"] else self.adamw_step)(p, group)
        return loss

    def muon_step(self, p: torch.Tensor, group: dict) -> None:
        state = self.state[p]
        if not state:
            state["momentum_buffer"] = torch.zeros_like(p)
        heads = group["heads"]
        O = muon_direction(p.grad, state["momentum_buffer"], group["momentum"],
                           group["nesterov"], group["ns_steps"], heads)
        p.mul_(1 - group["lr"] * group["weight_decay"])  # decoupled, at the unscaled lr
        p.add_(O.to(p.dtype), alpha=-group["lr"] * rms_match((p.shape[0] // heads, p.shape[1])))

    def adamw_step(self, p: torch.Tensor, group: dict) -> None:
        state = self.state[p]
        if not state:
            state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
        state["step"] += 1
        (b1, b2), t = group["betas"], state["step"]
        state["exp_avg"].lerp_(p.grad, 1 - b1)
        state["exp_avg_sq"].lerp_(p.grad.square(), 1 - b2)
        m_hat = state["exp_avg"] / (1 - b1 ** t)  # bias corrections: the moments start at 0
        v_hat = state["exp_avg_sq"] / (1 - b2 ** t)
        p.mul_(1 - group["lr"] * group["weight_decay"])
        p.addcdiv_(m_hat, v_hat.sqrt().add_(group["eps"]), value=-group["lr"])


def _check_group(group: dict) -> None:
    """A parameter group's own settings, checked as the constructor's are."""
    check_bool(group["muon"], "a group's 'muon'")
    check_finite_number(group["lr"], "lr", 1)
    check_finite_number(group["weight_decay"], "weight_decay", 1, allow_zero=True)
    if group["muon"]:
        bad = [tuple(p.shape) for p in group["params"] if p.dim() != 2]
        if bad:
            raise ValueError(f"a Muon group must hold 2-D matrices only, got shapes {bad}")
        heads = check_int(group["heads"], "heads", 1)
        uneven = [tuple(p.shape) for p in group["params"] if p.shape[0] % heads]
        if uneven:
            raise ValueError(f"a Muon group's heads ({heads}) must divide the rows of its "
                             f"matrices, got shapes {uneven}")


def muon_param_groups(net: nn.Module, weight_decay: float, per_head: bool = False) -> list[dict]:
    """``net``'s parameters as :class:`Muon` groups, by one rule: **Muon for the weight of every
    ``nn.Linear`` except the output head** (``net.lm_head``) and any weight shared with an
    ``nn.Embedding``; **AdamW for everything else**: the embeddings (GPT-2's ``wte``, which its
    tied head shares, and ``wpe``), an untied head, every vector (norm gains, biases, gates) and
    any other tensor (a convolution kernel). Weight decay ``weight_decay`` on the Muon matrices
    and on AdamW's 2-D tensors, none on vectors (as :func:`gpt2k3.experiments.train.adamw`).

    With ``per_head`` (Kimi K3's Per-Head Muon), the query, key and value projection of every
    GPT-2 attention layer (``c_attn``, whose ``3 C`` rows are the query, key and value rows of
    each head in turn) goes into a group of its own with ``"heads": 3 n_head``: one block per
    head of each of Q, K and V. The output projection stays whole, as the report's Section 2.5
    cuts only the Q, K and V projections."""
    check_instance(net, "net", nn.Module)
    check_finite_number(weight_decay, "weight_decay", 1, allow_zero=True)
    check_bool(per_head, "per_head")
    head = getattr(net, "lm_head", None)
    kept_out = {id(m.weight) for m in net.modules() if isinstance(m, nn.Embedding)}
    if isinstance(head, nn.Module):
        kept_out |= {id(p) for p in head.parameters()}
    hidden = {id(m.weight) for m in net.modules()
              if isinstance(m, nn.Linear) and id(m.weight) not in kept_out}
    heads = {id(m.c_attn.weight): 3 * m.n_head for m in net.modules()
             if per_head and isinstance(m, CausalSelfAttention)}
    params = list(net.parameters())  # each shared tensor once, in the model's order
    groups = [{"params": [p for p in params if id(p) in hidden and id(p) not in heads],
               "muon": True, "weight_decay": weight_decay, "heads": 1},
              *({"params": [p for p in params if heads.get(id(p)) == h], "muon": True,
                 "weight_decay": weight_decay, "heads": h} for h in sorted(set(heads.values()))),
              {"params": [p for p in params if id(p) not in hidden and p.dim() >= 2],
               "muon": False, "weight_decay": weight_decay},
              {"params": [p for p in params if id(p) not in hidden and p.dim() < 2],
               "muon": False, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def step_flops(net: nn.Module, loss_fn, batch) -> dict[str, int]:
    """Floating-point operations of one training step of ``net`` on ``batch``, as torch's
    ``FlopCounterMode`` counts them (matrix products and convolutions): ``"forward_backward"``,
    ``loss_fn(net, batch)`` and its gradients, and ``"newton_schulz"``, orthogonalising every
    matrix Muon updates once (:func:`muon_param_groups`). Elementwise work is left out of both,
    and so is the rest of either optimizer. ``net``'s gradients are left as the step made them."""
    from torch.utils.flop_counter import FlopCounterMode

    check_instance(net, "net", nn.Module)
    with FlopCounterMode(display=False) as counter:
        loss_fn(net, batch).backward()
    train = counter.get_total_flops()
    matrices = [p for g in muon_param_groups(net, 0.0) if g["muon"] for p in g["params"]]
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        for matrix in matrices:
            newton_schulz(matrix)
    return {"forward_backward": train, "newton_schulz": counter.get_total_flops()}


def head_max_logits(qkv: torch.Tensor, n_head: int) -> torch.Tensor:
    """The largest causal pre-softmax logit ``q_i . k_j / sqrt(d)`` (``j <= i``) of each head,
    over every sequence and position of ``c_attn``'s output ``qkv`` ``(B, T, 3C)``: ``(H,)``."""
    B, T, three_c = qkv.shape
    C = three_c // 3
    q, k, _ = qkv.split(C, dim=2)
    q, k = (t.reshape(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k))
    logits = (q @ k.transpose(-1, -2)) * (C // n_head) ** -0.5  # (B, H, T, T)
    future = torch.ones(T, T, dtype=torch.bool, device=qkv.device).triu(1)
    return logits.masked_fill(future, -math.inf).amax(dim=(0, 2, 3))


class MaxLogits:
    """Records :math:`S^h_{\\max}` for every head of every GPT-2 attention layer of ``net``.

    A forward hook on each :class:`~gpt2k3.layers.attention.CausalSelfAttention`'s ``c_attn``
    computes :func:`head_max_logits` from the projection's output whenever the forward pass
    builds a graph (a training step, not an evaluation under ``torch.no_grad``; a step through
    a cache is not meant). ``latest[i]`` holds layer ``i``'s ``(H,)`` maxima from the most recent
    such pass. Use it as a context manager, or call :meth:`close` to remove the hooks.
    """

    def __init__(self, net: nn.Module):
        check_instance(net, "net", nn.Module)
        self.layers = [m for m in net.modules() if isinstance(m, CausalSelfAttention)]
        if not self.layers:
            raise ValueError("net must contain a CausalSelfAttention layer (GPT-2's attention)")
        if any(type(m) is not CausalSelfAttention for m in self.layers):
            # a subclass may transform q and k after c_attn (RoPE): these logits would be wrong
            kinds = sorted({type(m).__name__ for m in self.layers})
            raise ValueError(f"net's attention must be GPT-2's own CausalSelfAttention, "
                             f"got {kinds}")
        self.latest: list[torch.Tensor | None] = [None] * len(self.layers)
        self._handles = [layer.c_attn.register_forward_hook(self._recorder(i, layer.n_head))
                         for i, layer in enumerate(self.layers)]

    def _recorder(self, i: int, n_head: int):
        def hook(module, inputs, output):
            if torch.is_grad_enabled():
                with torch.no_grad():
                    self.latest[i] = head_max_logits(output.detach(), n_head)
        return hook

    def overall(self) -> float | None:
        """The largest logit of the latest pass over every head and layer (``None``: no pass)."""
        seen = [float(s.max()) for s in self.latest if s is not None]
        return max(seen) if seen else None

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __enter__(self) -> MaxLogits:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@torch.no_grad()
def qk_clip(logits: MaxLogits, tau: float) -> list[torch.Tensor]:
    """QK-clip after an optimizer step: every head ``h`` whose recorded :math:`S^h_{\\max}`
    exceeds ``tau`` has its rows of ``c_attn``'s query and key weights (and biases) scaled by
    :math:`\\sqrt{\\gamma_h}`, :math:`\\gamma_h = \\tau / S^h_{\\max}`; the others are left alone.
    Returns every layer's ``gamma`` ``(H,)`` (1 where nothing was clipped)."""
    check_instance(logits, "logits", MaxLogits)
    tau = check_finite_number(tau, "tau", 1)
    gammas = []
    for layer, s_max in zip(logits.layers, logits.latest):
        if s_max is None:
            raise ValueError("logits holds no forward pass yet: run a training step first")
        gamma = torch.where(s_max > tau, tau / s_max, torch.ones_like(s_max))
        C = layer.n_embd
        row = gamma.sqrt().repeat_interleave(C // layer.n_head)  # one factor per q (and k) row
        for tensor in (layer.c_attn.weight, layer.c_attn.bias):
            if tensor is not None:  # rows [0, C) are the queries, [C, 2C) the keys
                scale = row.to(tensor.dtype).reshape(-1, *([1] * (tensor.dim() - 1)))
                tensor[:C].mul_(scale)
                tensor[C:2 * C].mul_(scale)
        gammas.append(gamma)
    return gammas
