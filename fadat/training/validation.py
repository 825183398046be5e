"""Validation during training: the objective's loss without glancing (eval mode) and BLEU of the
model's ``validation_strategy`` outputs on the first ``--valid-subset`` sentences of the valid
split, and which sentences a model can take at all (:func:`usable_indices`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fadat.data.contract import Batch
from fadat.models.architectures import TranslationModel
from fadat.objectives import ObjectiveConfig, compute_loss
from fadat.objectives.glancing import forked_rng
from fadat.training.config import TrainConfig


def usable_indices(dataset, model: TranslationModel) -> np.ndarray:
    """Indices of the sentences ``model`` can take (its ``usable``: source within
    ``max_source_positions``; for the AT also the decoder input ``<s> y`` within
    ``max_target_positions``; a DAT target longer than its graph is kept and counted as invalid
    by the NLL).

    Returns:
        ``(N',)`` int64 sorted indices.
    """
    keep = model.usable(np.asarray(dataset.source_lengths), np.asarray(dataset.target_lengths))
    return np.flatnonzero(keep).astype(np.int64)


def _valid_indices(valid, model: TranslationModel, subset: int) -> list[int]:
    usable = usable_indices(valid, model).tolist()
    return usable[:subset] if subset else usable


def validate(
    model: TranslationModel,
    valid,
    cfg: TrainConfig,
    device: torch.device,
    objective: ObjectiveConfig,
    autocast: dict[str, Any],
) -> dict[str, float]:
    """Loss and BLEU on the first ``--valid-subset`` sentences of the valid split.

    Loss: the training objective without glancing, in eval mode (no dropout). BLEU: sacreBLEU
    (13a tokenisation) of the detokenised outputs of the model's ``validation_strategy``
    (lookahead with β = ``decode_beta`` for DAT, greedy for AT) against the raw references
    (docs/reference-behaviour.md, "Evaluation"). Runs under a forked RNG so that it never
    changes the training run's random stream.

    Returns:
        ``{"valid_loss", "bleu", "sentences"}``.
    """
    import sacrebleu

    from fadat.data.binarized import raw_references
    from fadat.data.spm import decode as spm_decode
    from fadat.data.spm import load_sentencepiece

    sp = load_sentencepiece(Path(cfg.data) / "spm.model")
    refs_all = raw_references(cfg.data, "valid")
    indices = _valid_indices(valid, model, cfg.valid_subset)
    budget = cfg.max_tokens_valid or cfg.max_tokens
    ratio, max_graph = model.length_budget()
    batches = _valid_batches(valid, indices, budget, ratio, max_graph)
    eval_objective = dataclasses.replace(objective, glancing_ratio=0.0)
    hyps: dict[int, str] = {}
    loss_sum, count = 0.0, 0
    was_training = model.training
    model.eval()
    with forked_rng(device):  # the training's random stream continues as if no validation ran
        with torch.no_grad():
            for idx in batches:
                batch = valid.collate(idx).to(device)
                with torch.autocast(**autocast):
                    out = compute_loss(model, batch, eval_objective)
                loss_sum += float(out.loss_sum)
                count += out.count
                for sid, tokens in zip(
                    batch.ids.tolist(), _translate(model, batch, cfg), strict=True
                ):
                    hyps[sid] = spm_decode(sp, tokens)
    model.train(was_training)
    order = sorted(hyps)
    hyp_list = [hyps[i] for i in order]
    streams = [[stream[i] for i in order] for stream in refs_all]
    bleu = sacrebleu.corpus_bleu(hyp_list, streams).score if order else 0.0
    return {"valid_loss": loss_sum / max(count, 1), "bleu": float(bleu), "sentences": len(order)}


def _valid_batches(valid, indices, budget, ratio, max_graph) -> list[list[int]]:
    from fadat.data.batching import TokenBatchSampler

    src = [int(valid.source_lengths[i]) for i in indices]
    tgt = [int(valid.target_lengths[i]) for i in indices]
    sampler = TokenBatchSampler(
        src, tgt, budget, ratio, max_graph_positions=max_graph, seed=0, shuffle=False
    )
    return [[indices[j] for j in b] for b in sampler.batches(0) if b]


def _translate(model: TranslationModel, batch: Batch, cfg: TrainConfig) -> list[list[int]]:
    """Token ids (without ``<s>``/``</s>``/``<pad>``) of the model's outputs for ``batch``, with
    its ``validation_strategy`` and ``validation_options`` read from ``cfg`` (lookahead with
    β = ``decode_beta`` for DAT, greedy for AT, argmax for NAT and CTC)."""
    options = {name: getattr(cfg, field) for name, field in model.validation_options.items()}
    hyps = model.translate_batch(batch.source, model.validation_strategy, options)
    return [hyp.tokens for (hyp,) in hyps]
