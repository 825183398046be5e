"""Vanilla non-autoregressive Transformer (Gu et al., ICLR 2018), the paper's "NAT" row of
Table 2: a length predictor, a decoder that fills ``T`` positions at once, position-wise
cross-entropy, argmax decoding.

- Length: ``T = |<s> y </s>|`` is predicted from the mean-pooled encoder states by a
  256-way classifier (fairseq's NAT: ``logits = mean_s(h_s) · E_len^T``); trained with
  cross-entropy, weight :data:`LENGTH_LOSS_FACTOR` (fairseq's default 0.1).
- Decoder (:class:`fadat.models.transformer.Decoder`, the DAT's and CTC's stack): input
  ``[<s>, <unk> × (T − 2), </s>]`` (:func:`fadat.models.transformer.decoder_input`) + learned
  positions; every ``<unk>`` position also gets the final encoder state of source position
  ``round(j·(S − 1)/(T − 1))`` (:func:`fadat.models.transformer.uniform_copy`, Gu et al. 2018, here
  of encoder states as the DA-Transformer recipe's ``copy_source``); bidirectional self-attention,
  cross-attention to the source, the tied output projection.
- Loss (:func:`nat_loss`, objective ``nat`` in :mod:`fadat.objectives.nat`): label-smoothed
  cross-entropy (ε = 0.1, fairseq's ``nat_loss`` form) at the ``<unk>`` positions (``<s>`` and
  ``</s>`` are given as inputs), a per-sentence mean, plus the length loss; the trainer averages
  over sentences (as the DAG losses).
- Decoding (``argmax``): the most likely length ``T̂ ≥ 2`` (clipped to the decoder's
  positions), one decoder pass, the argmax token at every position ``1 … T̂ − 2``, ``<pad>``
  dropped. No de-duplication: repeated tokens are the multi-modality this baseline shows.

Glancing on this network is GLAT (:mod:`fadat.objectives.glat`). Only CPU was run.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from fadat.models.architectures import BatchScores, Scored, TranslationModel, check_finite
from fadat.models.config import ModelConfig
from fadat.models.directory import PretrainedMixin
from fadat.models.transformer import Decoder, Encoder, EncoderOut, _init_bert, decoder_input

#: Classes of the length predictor (lengths 0 … 255, fairseq's NAT).
MAX_LENGTH_CLASSES = 256
#: Weight of the length cross-entropy in :func:`nat_loss` (fairseq's ``--length-loss-factor``).
LENGTH_LOSS_FACTOR = 0.1
#: Label smoothing ε of the token cross-entropy (the NAT/GLAT recipes' 0.1).
LABEL_SMOOTHING = 0.1


class NATModel(PretrainedMixin, TranslationModel):
    """Vanilla NAT: encoder, length predictor, non-autoregressive decoder, tied output layer.

    Attributes:
        config: the :class:`~fadat.models.config.ModelConfig` (``model_type == "nat"``; the
            DAT-only fields ``upsample_ratio``, ``link_heads``, ``copy_source`` are unused).
        metadata: the non-config entries of config.json after loading, else ``{}``.
    """

    model_type: ClassVar[str] = "nat"
    upsampled: ClassVar[bool] = False  # the length is predicted, not λ·|x|

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config, copy_source=True)
        self.embed_length = nn.Embedding(MAX_LENGTH_CLASSES, config.d_model)
        self.apply(lambda m: _init_bert(m, config.init_std))

    def length_logprobs(self, encoder_out: EncoderOut) -> Tensor:
        """``(B, 256)`` fp32 ``log P(T | x)`` from the mean of the non-pad encoder states."""
        keep = (~encoder_out.padding_mask)[..., None].to(encoder_out.states.dtype)  # (B, S, 1)
        mean = (encoder_out.states * keep).sum(1) / keep.sum(1).clamp(min=1)  # (B, d)
        return torch.log_softmax(F.linear(mean, self.embed_length.weight).float(), dim=-1)

    def predict_lengths(self, encoder_out: EncoderOut) -> Tensor:
        """``(B,)`` int64 most likely ``T ≥ 2``, at most ``max_target_positions``."""
        lp = self.length_logprobs(encoder_out)  # (B, 256)
        top = min(MAX_LENGTH_CLASSES, self.config.max_target_positions + 1)
        return lp[:, 2:top].argmax(dim=1) + 2  # (B,)

    def decode_logits(self, encoder_out: EncoderOut, tokens: Tensor) -> Tensor:
        """``(B, T)`` decoder input (:func:`~fadat.models.transformer.decoder_input`) → ``(B, T,
        V)`` token logits (autocast dtype)."""
        states = self.decoder(self.encoder.embed_tokens, encoder_out, tokens)  # (B, T, d)
        return F.linear(states, self.output_weight)  # (B, T, V)

    def forward(self, source: Tensor, lengths: Tensor) -> Tensor:
        """``(B, S)`` source and ``(B,)`` lengths ``T_b`` → ``(B, T, V)`` fp32 log-probs."""
        logits = self.decode_logits(self.encode(source), decoder_input(lengths))
        return torch.log_softmax(logits.float(), dim=-1)

    # ---- the translation-model interface (fadat.models.architectures.TranslationModel)

    def translate_batch(
        self,
        source: Tensor,
        strategy: str,
        options: dict[str, Any],
        nbest: int = 1,
        *,
        upsample_ratio: float | None = None,
        with_log_prob: bool = False,
    ) -> list[list[Scored]]:
        """Argmax decoding; score = ``log P(T̂|x) + Σ_t max_y log p_t(y)`` (nats).

        ``upsample_ratio`` is ignored (the length is predicted, not ``λ·|x|``; the pipeline
        refuses one, ``upsampled``). With
        ``with_log_prob``, ``log P(y|x)`` of the output, as :meth:`score_batch` computes it,
        from the same pass: ``log P(T̂|x) + log p_0(<s>) + Σ_{0<t<T̂−1} log p_t(y_t) +
        log p_{T̂−1}(</s>)``; ``None`` when not asked, or when an argmax token is ``<pad>``
        (dropped from the output, whose length is then not ``T̂``: its probability needs a
        decoder pass of another length).
        """
        encoder_out = self.encode(source)
        length_lp = check_finite(self.length_logprobs(encoder_out), "length log-probabilities")
        lengths = self.predict_lengths(encoder_out)  # (B,)
        length_lp = length_lp.gather(1, lengths[:, None])  # (B, 1)
        logits = self.decode_logits(encoder_out, decoder_input(lengths))  # (B, T, V)
        lp = check_finite(torch.log_softmax(logits.float(), dim=-1), "token log-probabilities")
        best, tokens = lp.max(dim=-1)  # (B, T)
        width = tokens.shape[1]
        pos = torch.arange(width, device=tokens.device)[None, :]  # (1, T)
        on = pos < lengths[:, None]  # (B, T)
        scores = (best.double() * on).sum(1) + length_lp[:, 0].double()  # (B,)
        gold = torch.where(pos == 0, BOS_ID, tokens)
        gold = torch.where(pos == lengths[:, None] - 1, EOS_ID, gold)  # (B, T) <s> y </s>
        gold_lp = lp.gather(2, gold[..., None])[..., 0]  # (B, T)
        log_probs = (gold_lp.double() * on).sum(1) + length_lp[:, 0].double()  # (B,)
        out = []
        for row, n, score, log_prob in zip(
            tokens.tolist(), lengths.tolist(), scores.tolist(), log_probs.tolist(), strict=True
        ):
            kept = [t for t in row[1 : n - 1] if t != PAD_ID]
            exact = with_log_prob and len(kept) == n - 2
            out.append([Scored(kept, float(score), float(log_prob) if exact else None, n)])
        return out

    def score_batch(
        self,
        source: Tensor,
        target: Tensor,
        target_lengths: Tensor,
        *,
        upsample_ratio: float | None = None,
    ) -> BatchScores:
        """``log P(y|x) = log P(T|x) + Σ_t log p_t(y_t)`` over the ``T`` positions of
        ``<s> y </s>`` (the positions are independent given ``x`` and ``T``); ``-inf`` for a
        target longer than the length classes or the decoder's positions. ``upsample_ratio``
        is ignored."""
        limit = min(MAX_LENGTH_CLASSES - 1, self.config.max_target_positions)
        fits = target_lengths <= limit  # (B,)
        lengths = torch.where(fits, target_lengths, torch.full_like(target_lengths, 2))
        encoder_out = self.encode(source)
        length_lp = check_finite(self.length_logprobs(encoder_out), "length log-probabilities")
        length_lp = length_lp.gather(1, lengths[:, None])[:, 0]  # (B,)
        logits = self.decode_logits(encoder_out, decoder_input(lengths))  # (B, T, V)
        lp = check_finite(torch.log_softmax(logits.float(), dim=-1), "token log-probabilities")
        width = lp.shape[1]
        gold = target[:, :width]  # (B, T)
        gold = torch.where(fits[:, None], gold, torch.full_like(gold, PAD_ID))
        token_lp = lp.gather(-1, gold.clamp(min=0)[..., None])[..., 0]  # (B, T)
        token_lp = token_lp.masked_fill(gold.eq(PAD_ID), 0.0)
        total = token_lp.double().sum(1) + length_lp.double()  # (B,)
        total = torch.where(fits, total, torch.full_like(total, float("-inf")))
        problems = [
            None if f else f"the target has {int(t)} tokens, more than this NAT can predict"
            for f, t in zip(fits.tolist(), target_lengths.tolist(), strict=True)
        ]
        return BatchScores(total.tolist(), [int(t) for t in target_lengths], problems)

    def batch_cost(self, source_length: int, upsample_ratio: float | None = None) -> int:
        """An estimate of the decoder length before it is predicted: ``2·|x| + 2`` positions
        (``upsample_ratio`` is ignored)."""
        return min(2 * source_length + 2, self.config.max_target_positions)

    def length_budget(self) -> tuple[float, int | None]:
        """``(1, None)``: training batches count target (and source) tokens."""
        return 1.0, None

    def usable(self, source_lengths: np.ndarray, target_lengths: np.ndarray) -> np.ndarray:
        """Pairs within the position tables and the length classes."""
        limit = min(MAX_LENGTH_CLASSES - 1, self.config.max_target_positions)
        return (np.asarray(source_lengths) <= self.config.max_source_positions) & (
            np.asarray(target_lengths) <= limit
        )


def nat_loss(
    model: NATModel,
    source: Tensor,
    target: Tensor,
    target_lengths: Tensor,
    decoder_tokens: Tensor | None = None,
    encoder_out: EncoderOut | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Per-sentence NAT losses: mean label-smoothed CE over the ``<unk>`` input positions plus
    :data:`LENGTH_LOSS_FACTOR` × the length cross-entropy.

    Args:
        model: the network.
        source: ``(B, S)`` int64.
        target: ``(B, T)`` int64 ``<s> y </s>``.
        target_lengths: ``(B,)`` int64 ``T_b``.
        decoder_tokens: ``(B, T)`` decoder input (default :func:`decoder_input`; GLAT passes
            a glanced one: only its ``<unk>`` positions are scored).
        encoder_out: ``model.encode(source)`` if already computed.

    Returns:
        ``(losses (B,) fp32 with grad, stats)``; stats: ``nll_sum``, the token NLL summed over
        the scored positions (nats), and ``scored_tokens``, their number.
    """
    if encoder_out is None:
        encoder_out = model.encode(source)
    if decoder_tokens is None:
        decoder_tokens = decoder_input(target_lengths)
    logits = model.decode_logits(encoder_out, decoder_tokens)  # (B, T, V)
    with torch.autocast(logits.device.type, enabled=False):
        gold = target[:, : logits.shape[1]]  # (B, T)
        scored = decoder_tokens.eq(UNK_ID)  # (B, T)
        lp = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
        nll = -lp.gather(-1, gold[..., None])[..., 0]  # (B, T)
        # fairseq's nat_loss label smoothing: (1 − ε)·nll + ε·mean_v(−log p_v)
        ce = (1.0 - LABEL_SMOOTHING) * nll - LABEL_SMOOTHING * lp.mean(dim=-1)  # (B, T)
        n = scored.sum(1)  # (B,)
        token_loss = ce.masked_fill(~scored, 0.0).sum(1) / n.clamp(min=1)  # (B,)
        length_lp = model.length_logprobs(encoder_out)  # (B, 256)
        classes = target_lengths.clamp(max=MAX_LENGTH_CLASSES - 1)[:, None]  # (B, 1)
        length_nll = -length_lp.gather(1, classes)[:, 0]  # (B,)
        losses = token_loss + LENGTH_LOSS_FACTOR * length_nll  # (B,)
    stats = {
        "nll_sum": float(nll.detach().masked_fill(~scored, 0.0).sum()),
        "scored_tokens": float(n.sum()),
    }
    return losses, stats
