"""CTC non-autoregressive Transformer (Libovický & Helcl 2018; with glancing as Gu & Kong 2021),
the paper's "CTC" row of Table 2.

- The decoder (:class:`fadat.models.transformer.Decoder`, the DAT's and NAT's stack) runs on
  ``L = int(λ·|x </s>|)`` positions (``graph_lengths`` of
  :class:`~fadat.models.architectures.TranslationModel`, λ = ``upsample_ratio``), all fed ``<unk>``
  (:func:`fadat.models.transformer.decoder_input` without ends) plus the uniform copy of the encoder
  states; each position emits a token of the vocabulary or the *blank*, an extra output class
  (index ``V``) with its own output vector (the token classes use the tied embedding).
- Loss (objective ``ctc``, :mod:`fadat.objectives.ctc`): ``torch.nn.functional.ctc_loss`` of
  ``y`` (``<s>``/``</s>`` not included) per sentence, divided by ``|y|`` and averaged over
  sentences (``reduction="mean"``'s normalisation); a target the positions cannot hold
  (``L < |y|`` plus repeats) has no alignment: its loss is set to 0 and counted as
  ``invalid_too_long``.
- Glancing (``glancing_ratio > 0``): pass 1 without gradient under the dropout seed of pass 2;
  the best CTC alignment of ``y`` (:func:`best_alignment`, Viterbi) gives every position an
  oracle (a target token or blank); of the ``m`` positions aligned to target tokens, ``c`` have
  the oracle as pass-1 argmax; ``floor((m − c)·p + 0.5)`` of those ``m`` positions, chosen
  uniformly, get the oracle token as input instead of ``<unk>`` (the DA-Transformer's glancing
  rule with the CTC alignment in place of the DAG's). Blank-aligned positions are never revealed.
- Decoding (``argmax``, best-path decoding): the argmax class at every position, then
  consecutive duplicates merged and blanks (and ``<pad>``) dropped.

Only CPU was run.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fadat.data.contract import PAD_ID, pad_sequences
from fadat.models.architectures import BatchScores, Scored, TranslationModel, check_finite
from fadat.models.config import ModelConfig
from fadat.models.directory import PretrainedMixin
from fadat.models.transformer import Decoder, Encoder, EncoderOut, _init_bert, decoder_input

NEG_INF = float("-inf")


class CTCModel(PretrainedMixin, TranslationModel):
    """Encoder, upsampled non-autoregressive decoder, tied token output layer plus a blank class.

    Attributes:
        config: the :class:`~fadat.models.config.ModelConfig` (``model_type == "ctc"``;
            ``upsample_ratio`` / ``decode_upsample_ratio`` size the decoder; ``link_heads``
            and ``copy_source`` are unused: the copy is always on).
        metadata: the non-config entries of config.json after loading, else ``{}``.
    """

    model_type: ClassVar[str] = "ctc"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config, copy_source=True)
        self.blank_weight = nn.Parameter(torch.zeros(1, config.d_model))
        self.apply(lambda m: _init_bert(m, config.init_std))
        nn.init.normal_(self.blank_weight, mean=0.0, std=config.init_std)

    @property
    def blank(self) -> int:
        """The blank's class index ``V`` (one past the vocabulary)."""
        return self.config.vocab_size

    def decode_logits(self, encoder_out: EncoderOut, tokens: Tensor) -> Tensor:
        """``(B, L)`` decoder input → ``(B, L, V + 1)`` logits (autocast dtype; class ``V`` is
        the blank)."""
        states = self.decoder(self.encoder.embed_tokens, encoder_out, tokens)  # (B, L, d)
        weight = torch.cat([self.encoder.embed_tokens.weight, self.blank_weight])  # (V+1, d)
        return F.linear(states, weight)  # (B, L, V+1)

    def forward(self, source: Tensor, lengths: Tensor) -> Tensor:
        """``(B, S)`` source, ``(B,)`` decoder lengths → ``(B, L, V + 1)`` fp32 log-probs."""
        logits = self.decode_logits(self.encode(source), decoder_input(lengths, ends=False))
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
        """Best-path decoding; score = the best path's ``Σ_t max_c log p_t(c)`` (nats).

        ``upsample_ratio`` is the decoding λ (``None`` = the model's). With ``with_log_prob``,
        ``log P(y|x)`` of each output: the log-sum over all its alignments (``ctc_loss``, as
        :meth:`score_batch`) on the same (checked) log-probs; else ``None``.
        """
        source_lengths = source.ne(PAD_ID).sum(dim=1)  # (B,)
        lengths = self.graph_lengths(source_lengths, True, upsample_ratio)  # (B,)
        lp = check_finite(self(source, lengths), "token log-probabilities")  # (B, L, V+1)
        best, classes = lp.max(dim=-1)  # (B, L), (B, L)
        on = torch.arange(best.shape[1], device=best.device)[None, :] < lengths[:, None]
        scores = (best.double() * on).sum(1)  # (B,)
        outputs = [
            collapse(row[:n], self.blank)
            for row, n in zip(classes.tolist(), lengths.tolist(), strict=True)
        ]
        log_probs: list[float | None] = [None] * len(outputs)
        if with_log_prob:
            content = pad_sequences([y or [PAD_ID] for y in outputs]).to(source.device)  # (B, U)
            content_lengths = torch.tensor([len(y) for y in outputs], device=source.device)
            log_probs = self._log_prob(lp, lengths, content, content_lengths).tolist()
        return [
            [Scored(y, float(s), lp, len(y))]
            for y, s, lp in zip(outputs, scores.tolist(), log_probs, strict=True)
        ]

    def _log_prob(
        self, lp: Tensor, lengths: Tensor, content: Tensor, content_lengths: Tensor
    ) -> Tensor:
        """``log P(y|x)`` (float64, ``(B,)``) of the contents ``(B, U)`` (``content_lengths``
        ``(B,)``) on the log-probs ``lp`` ``(B, L, V+1)`` of ``lengths`` ``(B,)`` positions: minus
        ``ctc_loss`` without reduction; ``-inf`` where no alignment fits."""
        nll = F.ctc_loss(
            lp.transpose(0, 1),
            content,
            lengths,
            content_lengths,
            blank=self.blank,
            reduction="none",
            zero_infinity=False,
        )  # (B,)
        return -nll.double()

    def score_batch(
        self,
        source: Tensor,
        target: Tensor,
        target_lengths: Tensor,
        *,
        upsample_ratio: float | None = None,
    ) -> BatchScores:
        """``log P(y|x)``: the log-sum over every alignment (``ctc_loss``) of ``y`` (without
        ``<s>``/``</s>``) on the decoding positions (λ = ``upsample_ratio``, ``None`` = the
        model's decoding λ); ``-inf`` when no alignment fits."""
        source_lengths = source.ne(PAD_ID).sum(dim=1)  # (B,)
        lengths = self.graph_lengths(source_lengths, True, upsample_ratio)  # (B,)
        lp = check_finite(self(source, lengths), "token log-probabilities")  # (B, L, V+1)
        content, content_lengths = content_targets(target, target_lengths)
        log_probs = self._log_prob(lp, lengths, content, content_lengths).tolist()
        problems = [
            None if np.isfinite(v) else f"no alignment of {int(u)} tokens on {int(n)} positions"
            for v, u, n in zip(log_probs, content_lengths.tolist(), lengths.tolist(), strict=True)
        ]
        return BatchScores(log_probs, [int(u) for u in content_lengths], problems)


def collapse(classes: list[int], blank: int) -> list[int]:
    """CTC's output of an alignment: merge consecutive repeats, then drop blanks and ``<pad>``."""
    out, prev = [], None
    for c in classes:
        if c != prev and c != blank and c != PAD_ID:
            out.append(int(c))
        prev = c
    return out


def content_targets(target: Tensor, target_lengths: Tensor) -> tuple[Tensor, Tensor]:
    """``<s> y </s>`` rows → ``(y right-padded (B, U) int64, |y| (B,) int64)``."""
    content_lengths = (target_lengths - 2).clamp(min=0)  # (B,)
    width = max(int(content_lengths.max()) if content_lengths.numel() else 0, 1)
    content = target[:, 1 : 1 + width]  # (B, U)
    if content.shape[1] < width:
        content = F.pad(content, (0, width - content.shape[1]), value=PAD_ID)
    idx = torch.arange(width, device=target.device)[None, :]
    return content.masked_fill(idx >= content_lengths[:, None], PAD_ID), content_lengths


def best_alignment(
    log_probs: Tensor, targets: Tensor, input_lengths: Tensor, target_lengths: Tensor, blank: int
) -> tuple[Tensor, Tensor]:
    """The most probable CTC alignment of each target (Viterbi over the blank-extended target).

    States ``s = 0 … 2U`` of ``blank y_1 blank y_2 … y_U blank``; an alignment moves from ``s``
    to ``s``, ``s + 1``, or ``s + 2`` when ``s + 2`` is a token different from ``s``'s token
    two states back, starts in state 0 or 1 and ends in state ``2U`` or ``2U − 1``.

    Args:
        log_probs: ``(B, L, C)`` float log-probabilities.
        targets: ``(B, U)`` int64 labels (padding beyond ``target_lengths`` is ignored).
        input_lengths: ``(B,)`` int64 ``L_b``.
        target_lengths: ``(B,)`` int64 ``U_b``.
        blank: the blank class.

    Returns:
        ``(path, score)``: ``(B, L)`` int64 target index (``0 … U_b − 1``) aligned to each
        position, −1 for blank positions, positions ``≥ L_b`` and sentences with no alignment;
        ``(B,)`` the best alignment's log-probability (−inf: no alignment).
    """
    B, L, _ = log_probs.shape
    U = targets.shape[1]
    S = 2 * U + 1
    device = log_probs.device
    ext = torch.full((B, S), blank, dtype=torch.int64, device=device)  # (B, S)
    ext[:, 1::2] = targets.clamp(min=0)
    s_idx = torch.arange(S, device=device)  # (S,)
    valid = s_idx[None, :] < (2 * target_lengths + 1)[:, None]  # (B, S)
    skip = torch.zeros(B, S, dtype=torch.bool, device=device)  # (B, S)
    skip[:, 2:] = (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])
    emit = log_probs.gather(2, ext[:, None, :].expand(B, L, S))  # (B, L, S)
    alpha = torch.full((B, S), NEG_INF, dtype=emit.dtype, device=device)
    alpha[:, 0] = emit[:, 0, 0]
    if S > 1:
        alpha[:, 1] = emit[:, 0, 1]
    alpha = alpha.masked_fill(~valid, NEG_INF)
    final = alpha.clone()  # α at t = L_b − 1
    pad1 = torch.full((B, 1), NEG_INF, dtype=emit.dtype, device=device)
    pad2 = torch.full((B, 2), NEG_INF, dtype=emit.dtype, device=device)
    back = []  # back[t − 1][b, s]: how many states the best predecessor of s at t lies behind
    for t in range(1, L):
        prev1 = torch.cat([pad1, alpha[:, :-1]], dim=1)  # (B, S)
        prev2 = torch.cat([pad2, alpha[:, :-2]], dim=1).masked_fill(~skip, NEG_INF)  # (B, S)
        best, arg = torch.stack([alpha, prev1, prev2], dim=2).max(dim=2)  # (B, S)
        alpha = (best + emit[:, t]).masked_fill(~valid, NEG_INF)
        back.append(arg)
        final = torch.where((input_lengths - 1 == t)[:, None], alpha, final)
    last = (2 * target_lengths)[:, None]  # (B, 1): the final blank state
    ends = torch.cat([last, (last - 1).clamp(min=0)], dim=1)  # (B, 2)
    end_scores = final.gather(1, ends)  # (B, 2)
    end_scores[:, 1] = end_scores[:, 1].masked_fill(target_lengths == 0, NEG_INF)
    score, which = end_scores.max(dim=1)  # (B,)
    ok = torch.isfinite(score)  # (B,)
    state = torch.full((B,), -1, dtype=torch.int64, device=device)
    start = ends.gather(1, which[:, None])[:, 0]  # (B,)
    states = torch.full((B, L), -1, dtype=torch.int64, device=device)
    for t in range(L - 1, -1, -1):
        state = torch.where(input_lengths - 1 == t, start, state)
        active = (t <= input_lengths - 1) & ok  # (B,)
        states[:, t] = torch.where(active, state, -1)
        if t > 0:
            step = back[t - 1].gather(1, state.clamp(min=0)[:, None])[:, 0]  # (B,)
            state = torch.where(active, state - step, state)
    path = torch.where(states % 2 == 1, (states - 1) // 2, -1)  # (B, L)
    return path, score
