r"""Training compute, :math:`C \approx 6 N D`: GPT-2 against the published Kimi models.

Training a dense transformer costs about six floating-point operations per parameter per
token: a multiply and an add for every weight a token passes through on the forward pass, and
twice that on the backward pass (the gradients with respect to the activations and to the
weights). For ``D`` training tokens and ``N`` parameters a token is multiplied through,

.. math::

    C \approx 6\, N\, D .

For a mixture of experts ``N`` is the *active* count: a token passes through the experts its
router picks, not the others. Here ``N`` is :attr:`gpt2k3.accounting.ParamCount.matmul_active`
(the active parameters minus embedding lookups and elementwise vectors; the head counts,
tied or not). The published "activated" figures (``active_without_embedding``) are recorded
beside it: for the mixtures of experts the two agree to well under one percent, but GPT-2's
head is its embedding table, which that convention leaves out. The formula leaves out
attention's own work over the context (``Q K^T`` and the weighted sum), which grows with the
sequence length and is small at the pre-training lengths; and it counts the main model only
(DeepSeek-V3's multi-token-prediction module is outside its 671B).

``D`` is what each report states, quoted in :data:`TRAINING_RUNS` with its source. Where a
report states no count of training tokens, ``tokens`` is ``None`` and so is the compute --
nothing is estimated. GPT-2's paper gives the size of the preliminary WebText its results use (slightly over 8
million documents, 40 GB of text), but not how many tokens the models were trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpt2k3.checks import check_positive_float

__all__ = ["TrainingRun", "TRAINING_RUNS", "CLAIMED_MULTIPLIERS", "K3_REPORT",
           "k3_recipe_rows", "training_flops", "training_compute", "compute_ratio", "size_ratios"]

_GPT2 = "Radford et al. 2019, 'Language Models are Unsupervised Multitask Learners', Section 2.1"
_KIMI_LINEAR_README = "github.com/MoonshotAI/Kimi-Linear, README"


@dataclass(frozen=True)
class TrainingRun:
    """One published pre-training run: ``model`` (display name), ``arch`` (the name of its
    configuration in :mod:`gpt2k3.archs`), ``tokens`` (training tokens as the source states
    them; ``None`` where it states none), ``quote`` (the source's own words) and ``source``."""

    model: str
    arch: str
    tokens: float | None
    quote: str
    source: str
    note: str = ""


#: The pre-training runs the book compares, with the token counts their reports state.
TRAINING_RUNS = (
    TrainingRun("GPT-2 small", "GPT2_SMALL", None,
                "The resulting dataset, WebText, contains the text subset of these 45 million "
                "links. [...] a preliminary version of WebText which does not include links "
                "created after Dec 2017 and which after de-duplication and some heuristic based "
                "cleaning contains slightly over 8 million documents for a total of 40 GB of "
                "text.",
                _GPT2, "the paper gives WebText's size in documents and bytes, not the number "
                       "of tokens trained on"),
    TrainingRun("DeepSeek-V3", "DEEPSEEK_V3", 14.8e12,
                "We pre-train DeepSeek-V3 on 14.8 trillion diverse and high-quality tokens",
                "DeepSeek-AI 2024, 'DeepSeek-V3 Technical Report' (arXiv:2412.19437), abstract"),
    TrainingRun("Kimi K2", "KIMI_K2", 15.5e12,
                "Based on MuonClip, K2 was pre-trained on 15.5 trillion tokens with zero loss "
                "spike.",
                "Kimi Team 2025, 'Kimi K2: Open Agentic Intelligence' (arXiv:2507.20534), "
                "abstract"),
    TrainingRun("Kimi Linear 48B-A3B (comparison runs)", "KIMI_LINEAR_48B", 1.4e12,
                "Fair empirical validation at scale: through 1.4T token training runs, Kimi "
                "Linear outperforms full attention and other baselines",
                _KIMI_LINEAR_README + " as first published (commit 16a0ae6; the report's "
                "comparison with full MLA, arXiv:2510.26692)"),
    TrainingRun("Kimi Linear 48B-A3B (released)", "KIMI_LINEAR_48B", 5.7e12,
                "released two versions model checkpoints trained with 5.7T tokens",
                _KIMI_LINEAR_README + " (the Base and Instruct checkpoints)"),
    TrainingRun("Kimi K3", "KIMI_K3", None, "",
                "Kimi Team 2026, 'Kimi K3: Open Frontier Intelligence' (arXiv:2607.24653) and "
                "the moonshotai/Kimi-K3 model card",
                "the report's abstract and its pre-training sections (3.1, 3.3, 3.4) give no "
                "total of pre-training tokens"),
)

#: Compute multipliers claimed for two of the changes that are not scale: the factor of
#: training compute the new method saves at equal loss, as the authors state it, and the
#: condition they state it under.
CLAIMED_MULTIPLIERS = {
    "Muon": {"factor": 2.0,
             "quote": "Scaling law experiments indicate that Muon achieves ∼2× computational "
                      "efficiency compared to AdamW with compute optimal training.",
             "condition": "from scaling-law fits, for compute-optimal training",
             "source": "Liu et al. 2025, 'Muon is Scalable for LLM Training' (arXiv:2502.16982), "
                       "abstract"},
    "Attention Residuals": {"factor": 1.25,
                            "quote": "with Block AttnRes matching the loss of a baseline trained "
                                     "with 1.25× more compute",
                            "condition": "in its scaling-law comparison, at 5.6 PFLOP/s-days "
                                         "of training compute",
                            "source": "Kimi Team 2026, 'Attention Residuals' (arXiv:2603.15031), "
                                      "Section 1; its scaling-law comparison (Section 5.1) puts "
                                      "it at 5.6 PFLOP/s-days"},
}


_K3_REPORT = "Kimi Team 2026, 'Kimi K3: Open Frontier Intelligence' (arXiv:2607.24653v2)"

#: What Kimi K3's technical report says about its pre-training, quoted from its text; no
#: number here is read off a figure. Each entry: ``quote`` (the report's words), ``section``, and the values the
#: book uses, typed from the quote.
K3_REPORT = {
    "scaling_efficiency": {
        "factor": 2.5,
        "quote": "Together with Stable LatentMoE, which effectively activates 16 of 896 routed "
                 "experts per token, and refined training and data recipes, these advances yield "
                 "an approximately 2.5\u00d7 improvement in overall scaling efficiency over Kimi K2",
        "section": "abstract",
        "compares": "Kimi K3's model family against Kimi K2's: architecture (KDA, Attention "
                    "Residuals, Stable LatentMoE), data and training recipe together",
    },
    "scaling_law": {
        "quote": "Taken together, the architectural, data, and training improvements described in "
                 "the previous sections define our new model family. Since these changes also "
                 "alter the optimal training regime, we conduct dedicated scaling-law studies to "
                 "retune key hyperparameters, including the batch size, learning rate, "
                 "tokens-per-parameter ratio (TPP) and the model shape. Evaluated on held-out OOD "
                 "validation data, the scaling law curves in (Fig. 7) show that these improvements "
                 "collectively deliver an approximately 2.5\u00d7 gain in overall scaling "
                 "efficiency over Kimi K2.",
        "section": "3.2",
        "figure": "Figure 7: Fitted scaling-law curves for Kimi K2 and Kimi K3. Kimi K3 achieves "
                  "2.5\u00d7 gain in scaling efficiency over Kimi K2.",
    },
    "schedule_choice": {
        "quote": "To ensure a fair comparison, we conduct an independent scaling-law search for "
                 "each schedule. Under their respective optimal hyperparameter settings, cosine "
                 "decay consistently achieves a lower final loss than WSD.",
        "section": "3.2",
    },
    "schedule": {
        "warmup_fraction": 0.01, "weight_decay": 0.1,
        "quote": "We use a cosine learning rate schedule with a 1% linear warmup. Weight decay is "
                 "set to 0.1 throughout.",
        "section": "3.3",
    },
    "optimizer": {
        "quote": "We optimize the model using the Per-Head Muon optimizer (\u00a7 2.5) together "
                 "with the weight-clipping mechanism introduced in Kimi K2, while adopting QB "
                 "(\u00a7 2.3.3) for MoE load balancing.",
        "section": "3.3",
    },
    "context": {
        "pretraining": ("8K", "64K"), "cooldown": ("256K", "1M"), "stages": 4,
        "quote": "We achieve this through extending the context window progressively as training "
                 "proceeds, following a four-stage curriculum. The window grows from 8K to 64K "
                 "tokens during pre-training, and from 256K to 1M tokens during the cooldown phase.",
        "section": "3.4",
    },
    "positions": {
        "quote": "Kimi K3 uses no explicit positional embedding (NoPE), and instead encodes "
                 "positional information implicitly through the recurrent gating and decay "
                 "mechanism of KDA. As a result, the model extrapolates directly to 1M-token "
                 "contexts without any positional-encoding modification, such as RoPE rescaling "
                 "or interpolation [93].",
        "section": "3.4",
    },
    "tokens": {
        "disclosed": False,
        "quote": "",
        "section": "abstract, 1, 3.1-3.4",
        "note": "the abstract, the introduction and the pre-training sections (3.1 data, 3.2 "
                "scaling law, 3.3 recipe, 3.4 long context) give no count of pre-training tokens; "
                "3.2 names the tokens-per-parameter ratio among the retuned hyperparameters "
                "without its value",
    },
    "source": _K3_REPORT,
}


def k3_recipe_rows() -> list[list[str]]:
    """Rows ``[what, the report's words, section]`` of Kimi K3's pre-training recipe, for a
    table: schedule, its choice over WSD, optimizer, context growth, positions, tokens."""
    r = K3_REPORT
    return [["schedule and weight decay", r["schedule"]["quote"], r["schedule"]["section"]],
            ["cosine over WSD", r["schedule_choice"]["quote"], r["schedule_choice"]["section"]],
            ["optimizer and balancing", r["optimizer"]["quote"], r["optimizer"]["section"]],
            ["context growth", r["context"]["quote"], r["context"]["section"]],
            ["positions", r["positions"]["quote"], r["positions"]["section"]],
            ["pre-training tokens", "(not stated)", r["tokens"]["section"]]]


def training_flops(n_params: float, tokens: float | None) -> float | None:
    """``6 * n_params * tokens``: the training FLOPs of ``tokens`` tokens through ``n_params``
    parameters per token; ``None`` when ``tokens`` is ``None`` (no published count)."""
    check_positive_float(n_params, "n_params")
    if tokens is None:
        return None
    return 6.0 * float(n_params) * check_positive_float(tokens, "tokens")


def training_compute(runs: tuple[TrainingRun, ...] = TRAINING_RUNS) -> list[dict]:
    """One row per run: ``model``, ``n_active`` (the ``N`` of ``6 N D``: parameters a token is
    multiplied through, :attr:`ParamCount.matmul_active`), ``n_active_published`` (the
    published convention, ``active_without_embedding``), ``n_total``, ``tokens``, ``flops``
    (``None`` without a token count), ``quote``, ``source``, ``note``."""
    from gpt2k3 import archs  # archs imports this package: import it when called
    from gpt2k3.accounting.params import count_params

    if not isinstance(runs, (tuple, list)) or not all(isinstance(r, TrainingRun) for r in runs):
        raise ValueError("runs must be a sequence of TrainingRun")
    rows = []
    for run in runs:
        spec = getattr(archs, run.arch, None)
        if spec is None:
            raise ValueError(f"run {run.model!r} names arch {run.arch!r}, which gpt2k3.archs lacks")
        count = count_params(spec)
        rows.append({"model": run.model, "n_active": count.matmul_active,
                     "n_active_published": count.active_without_embedding,
                     "n_total": count.total, "tokens": run.tokens,
                     "flops": training_flops(count.matmul_active, run.tokens),
                     "quote": run.quote, "source": run.source, "note": run.note})
    return rows


def compute_ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or ``None`` if either is ``None`` (an unpublished count)."""
    if numerator is None or denominator is None:
        return None
    return check_positive_float(numerator, "numerator") / check_positive_float(denominator, "denominator")


def size_ratios(model: str = "Kimi K3", reference: str = "GPT-2 small") -> dict:
    """How much larger ``model`` is than ``reference`` (names of :data:`TRAINING_RUNS`), three
    ways: ``"params_headline"`` (the source article's 2.8e12 / 124e6 for Kimi K3 against GPT-2
    small, :func:`gpt2k3.archs.gpt2_multiples`; ``None`` for other pairs), ``"params"`` (total
    parameters), ``"per_token"`` (``6 N`` per training token: active over active) and
    ``"compute"`` (``6 N D``: ``None`` unless both reports state their tokens)."""
    rows = {r["model"]: r for r in training_compute()}
    for name, value in (("model", model), ("reference", reference)):
        if value not in rows:
            raise ValueError(f"{name} must be one of {sorted(rows)}, got {value!r}")
    a, b = rows[model], rows[reference]
    headline = None
    if (model, reference) == ("Kimi K3", "GPT-2 small"):
        from gpt2k3.archs import gpt2_multiples
        headline = gpt2_multiples()["headline"]
    return {"params_headline": headline, "params": a["n_total"] / b["n_total"],
            "per_token": a["n_active"] / b["n_active"],
            "compute": compute_ratio(a["flops"], b["flops"])}
