"""Static matplotlib pictures of the matrices the chapters talk about.

The explorable figures of :mod:`gpt2k3.book.figures` are plotly; these three are plain heat maps of
one matrix (or a few side by side), for places where a picture of the numbers themselves says
more than a slider:

* :func:`state_before_after` -- a ``D x D`` associative memory before and after one delta-rule
  write (chapter 4, from :func:`gpt2k3.experiments.memory.read_erase_write`);
* :func:`causal_attention_weights` -- the lower-triangular weight matrix of causal softmax
  attention (chapter 2/3, checked against :func:`gpt2k3.ops.softmax.parallel`);
* :func:`wy_ut_matrices` -- one chunk's strictly lower ``diag(beta) K K^T``, its UT transform
  and the WY factors (chapter 5, from :mod:`gpt2k3.ops.wy`);
* :func:`chunkwise_steps` -- a schematic of the fast chunkwise form's three steps (chapter 5).

Each returns a :class:`matplotlib.figure.Figure` built directly (``Figure()``, no pyplot and no
global state), deterministic for its arguments, that renders as a PNG when it is the last
expression of a notebook cell. The numbers drawn are also returned on the figure as
``fig.matrices`` (a dict of name -> 2-D tensor), so a test can check what is shown. Its title is
``fig.caption`` and a description of what it shows ``fig.alt``: the PNG's output metadata carries
both, and the web book prints the caption under the picture and gives it the description as
alt text (:mod:`gpt2k3.book.sphinx`); the picture itself holds only the panels.
"""

from __future__ import annotations

import io

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from gpt2k3.checks import check_int, check_number, check_positive_float
from gpt2k3.experiments import memory
from gpt2k3.ops import softmax, wy

__all__ = ["PNGFigure", "state_before_after", "causal_attention_weights", "wy_ut_matrices", "chunkwise_steps"]

_CMAP = "RdBu_r"  # diverging: 0 is white, signs are colours


class _PNGFigure(Figure):
    """A :class:`~matplotlib.figure.Figure` that IPython displays as a PNG without pyplot's
    inline backend (``_repr_png_`` renders it with Agg). ``matrices`` holds the data drawn."""

    matrices: dict
    caption: str = ""
    alt: str = ""

    def _repr_png_(self):
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=100, metadata={"Software": None})
        meta = {k: v for k, v in (("caption", self.caption), ("alt", self.alt)) if v}
        return (buf.getvalue(), meta) if meta else buf.getvalue()


#: The public name of the PNG figure class, for other figure modules that build static pictures.
PNGFigure = _PNGFigure


def _heatmaps(panels: dict, title: str, *, width: float = 3.0, symmetric: bool = True,
              cmap: str = _CMAP, alt: str = "") -> _PNGFigure:
    """One row of heat maps, one per ``name -> 2-D tensor``, sharing a colour scale; ``title``
    is the caption and ``alt`` the description of the picture (see the module docstring)."""
    mats = {name: m.detach().double().cpu() for name, m in panels.items()}
    lim = max(float(m.abs().max()) for m in mats.values()) or 1.0
    fig = _PNGFigure(figsize=(width * len(mats), width + 0.6), layout="constrained")
    axes = fig.subplots(1, len(mats), squeeze=False)[0]
    image = None
    for ax, (name, m) in zip(axes, mats.items()):
        kw = dict(vmin=-lim, vmax=lim) if symmetric else dict(vmin=0.0, vmax=lim)
        image = ax.imshow(m.numpy(), cmap=cmap, interpolation="nearest", **kw)
        ax.set_title(name, fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(image, ax=list(axes), shrink=0.8)
    fig.matrices = {name: m for name, m in mats.items()}
    fig.caption = title
    fig.alt = alt or (f"{len(mats)} heat maps side by side, sharing one colour scale: "
                      + "; ".join(f"{_plain(name)} ({m.shape[0]}×{m.shape[1]})" for name, m in mats.items()))
    return fig


def _plain(label: str) -> str:
    """A panel title without its TeX: ``$\\beta$`` -> ``β``."""
    for tex, text in ((r"\mathrm", ""), (r"\mathcal", ""), (r"\operatorname", ""), (r"\beta", "β"),
                      (r"\top", "ᵀ"), (r"\,", " "), ("$", ""), ("{", ""), ("}", "")):
        label = label.replace(tex, text)
    return label


def state_before_after(d: int = 8, n_stored: int = 4, slot: int = 1, beta: float = 1.0,
                       seed: int = 0) -> Figure:
    """A ``d x d`` state holding ``n_stored`` pairs, before and after one delta-rule write.

    The stored keys are the first ``n_stored`` basis vectors, so pair ``i`` is row ``i`` of the
    state and the picture reads directly: the write of a new value under key ``slot`` (with
    strength ``beta``) changes that row only -- replaced for ``beta = 1`` -- and leaves the
    others alone. Panels: before, after, and their difference ``beta k^T (v - k S)``.
    """
    d = check_int(d, "d", 1)
    n_stored = check_int(n_stored, "n_stored", 1)
    if n_stored > d:
        raise ValueError(f"n_stored must be <= d = {d}, got {n_stored}")
    slot = check_int(slot, "slot", 0)
    if slot >= d:
        raise ValueError(f"slot must be in [0, d = {d}), got {slot}")
    beta = check_number(beta, "beta", 0.0, 2.0, what="a float in [0, 2]")
    gen = torch.Generator().manual_seed(check_int(seed, "seed", 0))
    keys = torch.eye(d, dtype=torch.float64)[:n_stored]
    values = torch.randn(n_stored, d, generator=gen, dtype=torch.float64)
    S = memory.write_additive(keys, values)
    v_new = torch.randn(d, generator=gen, dtype=torch.float64)
    step = memory.read_erase_write(S, torch.eye(d, dtype=torch.float64)[slot], v_new, beta)
    return _heatmaps({"before: $S$": step.before,
                      f"after one write (key {slot}, $\\beta$ = {beta:g})": step.after,
                      "after - before": step.after - step.before},
                     "A delta-rule write changes one row of the state",
                     alt=(f"Three {d}×{d} heat maps of the state: before the write, after writing a new "
                          f"value under key {slot} with strength β = {beta:g}, and their difference. "
                          f"Only row {slot} differs; the other rows are the same in both maps."))


def causal_attention_weights(T: int = 12, d: int = 8, seed: int = 0,
                             scale: float | None = None) -> Figure:
    """The ``T x T`` weights of causal softmax attention for random queries and keys.

    Row ``t`` is the softmax over keys ``0..t`` of ``scale * q_t . k_j``: lower triangular, each
    row summing to 1 -- the matrix a KV cache exists to avoid recomputing. Drawn beside the
    causal mask itself.
    """
    T, d = check_int(T, "T", 1), check_int(d, "d", 1)
    scale = check_positive_float(scale, "scale", none_ok=True)
    scale = d ** -0.5 if scale is None else scale
    gen = torch.Generator().manual_seed(check_int(seed, "seed", 0))
    q, k = (torch.randn(T, d, generator=gen, dtype=torch.float64) for _ in range(2))
    mask = softmax.causal_mask(T, 0)
    weights = ((q @ k.T) * scale).masked_fill(~mask, float("-inf")).softmax(-1)
    fig = _heatmaps({"causal mask": mask.double(), "softmax weights $A$": weights},
                    "Causal softmax attention: row t mixes positions 0..t", symmetric=False,
                    cmap="viridis",
                    alt=(f"Two {T}×{T} heat maps: the causal mask, ones on and below the diagonal, and "
                         f"the softmax weights, zero above the diagonal, each row summing to one."))
    fig.matrices["q"], fig.matrices["k"] = q, k
    return fig


def wy_ut_matrices(C: int = 8, d: int = 6, seed: int = 0) -> Figure:
    """One chunk of ``C`` tokens: ``tril(diag(beta) K K^T, -1)``, its UT transform ``T``, and the
    WY factors ``W = T K`` and ``U = T V`` (unit keys, ``beta`` uniform in ``[0, 1]``).

    The UT transform is lower triangular like the matrix it inverts; ``W`` and ``U`` are dense
    ``C x d`` -- together they carry the chunk's whole effect on any incoming state.
    """
    C, d = check_int(C, "C", 1), check_int(d, "d", 1)
    gen = torch.Generator().manual_seed(check_int(seed, "seed", 0))
    k = F.normalize(torch.randn(C, d, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(C, d, generator=gen, dtype=torch.float64)
    beta = torch.rand(C, generator=gen, dtype=torch.float64)
    A = torch.tril(beta[:, None] * (k @ k.T), -1)
    T_ut = wy.ut_transform(k, beta)
    W, U = wy.wy_representation(k, v, beta)
    fig = _heatmaps({r"$\mathrm{tril}(\mathrm{diag}(\beta)\,K K^\top, -1)$": A,
                     r"UT transform $\mathcal{T}$": T_ut, r"$W = \mathcal{T} K$": W,
                     r"$U = \mathcal{T} V$": U},
                    f"The WY / UT matrices of one chunk (C = {C})", width=2.6,
                    alt=(f"Four heat maps of one chunk of {C} tokens: the strictly lower-triangular "
                         f"beta-weighted key products, their UT transform (lower triangular, {C}×{C}), "
                         f"and the dense {C}×{d} factors W and U."))
    fig.matrices.update(k=k, v=v, beta=beta[None])
    return fig


def chunkwise_steps(n_chunks: int = 4, C: int = 4) -> Figure:
    """A schematic of the fast chunkwise form (chapter 5): the three steps of
    :func:`gpt2k3.ops.delta.chunkwise` over ``n_chunks`` chunks of ``C`` tokens.

    Top row: step 1, the UT/WY step (:func:`gpt2k3.ops.chunks.intra_chunk`), every chunk at
    once, since none of it needs the state. Middle row: step 2, the state pass
    (:func:`gpt2k3.ops.chunks.pass_state`), one small step per chunk, the only sequential part.
    Bottom row: step 3, every chunk's outputs at once from the state that entered it.
    ``fig.matrices["chunk_of_token"]`` holds the chunk index of each of the ``n_chunks * C``
    tokens drawn.
    """
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    n, C = check_int(n_chunks, "n_chunks", 1), check_int(C, "C", 1)
    fig = _PNGFigure(figsize=(1.9 * n + 2.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    ax.set_xlim(-2.3, 2.0 * n + 0.2)
    ax.set_ylim(-0.2, 4.3)
    ax.axis("off")
    blue, orange, grey = "#1f77b4", "#ff7f0e", "#555555"

    def box(x, y, text, color, w=1.5, h=0.62):
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.03",
                                    fc="white", ec=color, lw=1.6))
        ax.text(x, y, text, ha="center", va="center", fontsize=9)

    def arrow(a, b, color=grey, style="-|>"):
        ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=11, color=color, lw=1.2))

    for label, y in (("1. UT/WY step\nall chunks at once", 3.5), ("2. state pass\nchunk after chunk", 2.0),
                     ("3. outputs\nall chunks at once", 0.5)):
        ax.text(-2.2, y, label, ha="left", va="center", fontsize=9, color=grey)
    for i in range(n):
        x = 2.0 * i + 1.0
        box(x, 3.5, f"chunk {i + 1}\n$W, U, P$", blue)
        box(x, 0.5, "$O = Q S_{in} + P u$", blue, w=1.7)
        ax.text(x - 1.0, 2.0, f"$S_{i}$", ha="center", va="center", fontsize=11,
                bbox=dict(boxstyle="circle,pad=0.25", fc="white", ec=orange, lw=1.6))
        arrow((x - 0.72, 2.0), (x + 0.72, 2.0), orange)  # S_i -> S_{i+1}
        ax.text(x + 0.05, 1.84, r"$S \leftarrow S + K^\top (U - W S)$", ha="center", va="top", fontsize=7.5)
        arrow((x, 3.5 - 0.33), (x, 2.05), blue)  # the chunk's W, U feed its step
        arrow((x - 1.0, 2.0 - 0.3), (x - 0.45, 0.5 + 0.33), orange)  # S_in feeds the outputs
    ax.text(2.0 * n, 2.0, f"$S_{n}$", ha="center", va="center", fontsize=11,
            bbox=dict(boxstyle="circle,pad=0.25", fc="white", ec=orange, lw=1.6))
    fig.matrices = {"chunk_of_token": torch.arange(n).repeat_interleave(C)[None]}
    fig.caption = f"The chunkwise form's three steps over {n} chunks of {C} tokens"
    fig.alt = (f"A schematic in three rows. Top: {n} boxes, one per chunk, each computing W, U and P "
               f"at once. Middle: states S0 to S{n} in a chain, each arrow one chunk's update "
               f"u = U - W S, fed by that chunk's box. Bottom: {n} boxes computing each chunk's "
               f"outputs O = Q S_in + P u from the state that entered it.")
    return fig
