"""The DA-Transformer's objectives: the DAG negative log-likelihood (``nll``, with glancing and
force-emit) and FA-DAT's fuzzy alignment loss (``fuzzy``). Both run the same forward: the encoder
once, the glancing pass 1 without gradient (when the ratio is > 0), pass 2 under the same dropout
seed (docs/reference-behaviour.md, "Glancing"); the loss is taken on pass 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fadat.data.contract import Batch
from fadat.kernels.triton_dag import BACKENDS
from fadat.objectives.base import Objective, option
from fadat.objectives.glancing import GlanceResult, decode_with_seed, draw_seed, glance, no_autocast
from fadat.objectives.losses import LossOutput, fuzzy_loss, nll_loss_from_logits, widen

_DAG_BACKEND_HELP = (
    "DAG likelihood and best alignment: auto (the Triton kernels of fadat.kernels.triton_dag on a "
    "CUDA device with triton installed, else the PyTorch DPs), torch or triton"
)


def _dag_backend() -> Any:
    return option(
        "auto",
        _DAG_BACKEND_HELP,
        lambda v: v in BACKENDS,
        f"dag_backend must be one of {', '.join(BACKENDS)}",
    )


@dataclass(frozen=True)
class NLLOptions:
    """Options of ``nll``."""

    force_emit: bool = option(True, "do not pin glanced vertices to their oracle token")
    dag_backend: str = _dag_backend()


@dataclass(frozen=True)
class FuzzyOptions:
    """Options of ``fuzzy``."""

    ngram_order: int = option(
        2, "n of the fuzzy alignment loss (default 2)", lambda v: v >= 1, "ngram_order must be >= 1"
    )
    dag_backend: str = _dag_backend()


#: Statistics of both DAG objectives (sums over a micro-batch).
STATISTICS = ("glanced", "invalid_too_long", "invalid_nonfinite", "underflow_recomputed")


def forward(
    model: nn.Module, batch: Batch, glancing_ratio: float, dag_backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, GlanceResult | None]:
    """Pass 2 (with glancing pass 1 first when ``glancing_ratio > 0``; its best alignment runs
    in ``dag_backend``) on graphs of ``batch.graph_lengths`` vertices when the trainer drew them
    (a λ range), else of the model's fixed-λ sizes. Each row's graph is its own ``L_b``; the
    batch is padded to ``L = max_b L_b`` and the padding vertices take no part (links mask
    ``j ≥ L_b``; the likelihood, the fuzzy loss and glancing read ``L_b``).

    Returns:
        ``(logits (B, L, V) in the autocast dtype, links (B, L, L), graph_lengths (B,),
        the glancing decision or None)``.
    """
    graph_lengths = batch.graph_lengths  # (B,) drawn for this update, or None
    if graph_lengths is None:
        graph_lengths = model.graph_lengths(batch.source_lengths)  # (B,)
    encoder_out = model.encode(batch.source)
    plain = model.decoder_input_tokens(graph_lengths)  # (B, L)
    # One seed for both passes: identical dropout masks. Drawn from the global RNG so that a
    # resumed run draws the same seeds.
    seed = draw_seed()
    glanced = None
    decoder_tokens = plain
    if glancing_ratio > 0:
        glanced = glance(
            model,
            encoder_out,
            batch.target,
            graph_lengths,
            batch.target_lengths,
            glancing_ratio,
            seed,
            backend=dag_backend,
        )
        decoder_tokens = glanced.decoder_tokens
    logits, links = decode_with_seed(model, encoder_out, decoder_tokens, seed, logits=True)
    return logits, links, graph_lengths, glanced


def _finish(out: LossOutput, batch: Batch, glanced: GlanceResult | None) -> LossOutput:
    out.stats["glanced"] = float(glanced.num_glanced.sum()) if glanced is not None else 0.0
    out.stats["target_tokens"] = float(batch.target_lengths.sum())
    out.stats["sentences"] = float(len(batch))
    return out


def nll_step(model: nn.Module, batch: Batch, settings: Any) -> LossOutput:
    """The DAG NLL of pass 2, straight from the logits
    (:func:`fadat.objectives.losses.nll_loss_from_logits`, force-emit on the glanced vertices unless
    ``force_emit`` is off)."""
    logits, links, graph_lengths, glanced = forward(
        model, batch, settings.glancing_ratio, settings.options.dag_backend
    )
    with no_autocast(logits.device):
        out = nll_loss_from_logits(
            logits,
            widen(links),
            batch.target,
            graph_lengths,
            batch.target_lengths,
            glance=glanced,
            force_emit=settings.options.force_emit,
            inplace_backward=True,  # the logits of this step are used by nothing else
            backend=settings.options.dag_backend,
        )
    return _finish(out, batch, glanced)


def fuzzy_step(model: nn.Module, batch: Batch, settings: Any) -> LossOutput:
    """FA-DAT's fuzzy alignment loss of pass 2 (:func:`fadat.objectives.losses.fuzzy_loss`)."""
    logits, links, graph_lengths, glanced = forward(
        model, batch, settings.glancing_ratio, settings.options.dag_backend
    )
    with no_autocast(logits.device):
        out = fuzzy_loss(
            torch.log_softmax(widen(logits), dim=-1),
            widen(links),
            batch.target,
            graph_lengths,
            batch.target_lengths,
            order=settings.options.ngram_order,
        )
    out.stats.setdefault("underflow_recomputed", 0.0)
    return _finish(out, batch, glanced)


def log_dag(stats: dict[str, float]) -> dict[str, Any]:
    """The log fields of both DAG objectives."""
    return {
        "glancing_ratio": stats["glancing_ratio"],
        "glanced": int(stats["glanced"]),
        "invalid_too_long": int(stats["invalid_too_long"]),
        "invalid_nonfinite": int(stats["invalid_nonfinite"]),
        "underflow_recomputed": int(stats["underflow_recomputed"]),
    }


def log_fuzzy(stats: dict[str, float]) -> dict[str, Any]:
    """:func:`log_dag` plus the means of precision, brevity penalty and length ratio."""
    sentences = max(stats["sentences"], 1.0)
    return {
        **log_dag(stats),
        "precision": stats["precision_sum"] / sentences,
        "bp": stats["bp_sum"] / sentences,
        "length_ratio": stats["length_ratio_sum"] / sentences,
    }


NLL = Objective(
    name="nll",
    architecture="dat",
    step=nll_step,
    options_class=NLLOptions,
    statistics=STATISTICS,
    log=log_dag,
    glancing="0.5:0.1@200k",  # the reference recipe's NLL stage: 0.5 → 0.1 over 200k updates
    default_for=True,
)

FUZZY = Objective(
    name="fuzzy",
    architecture="dat",
    step=fuzzy_step,
    options_class=FuzzyOptions,
    statistics=(*STATISTICS, "precision_sum", "bp_sum", "length_ratio_sum"),
    log=log_fuzzy,
    glancing="0.1",  # FA-DAT fine-tuning keeps 0.1
)
