"""The autoregressive Transformer baseline (the paper's AT comparison, Transformer-base; §4).

Same encoder code, embeddings, initialisation and presets as the DAT model
(fadat.models.transformer); the decoder is causal, fed ``<s> y`` (teacher forcing) and trained to
predict ``y </s>`` (label smoothing is the trainer's business). Decoding: greedy and beam search
with a key/value cache, so each step runs the decoder on one new token per hypothesis
(cross-attention keys/values are projected once per sentence). Only CPU was run; CUDA was not
tested.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID
from fadat.decoding.strategies import AUTOREGRESSIVE
from fadat.models.architectures import BatchScores, Scored, TranslationModel, check_finite
from fadat.models.config import ModelConfig
from fadat.models.directory import PretrainedMixin
from fadat.models.transformer import Decoder, Encoder, EncoderOut, _init_bert

# One cache per decoder layer: {"self": {"k", "v"}, "cross": {"mk", "mv"}}, tensors (N, h, t, d_h).
Cache = list[dict[str, dict[str, Tensor]]]


@dataclass(frozen=True)
class ATHypothesis:
    """One decoded sentence.

    Attributes:
        tokens: output ids without ``<s>`` and ``</s>``.
        log_prob: Σ log p of the emitted tokens including the final ``</s>`` (nats).
        score: the ranking score ``log_prob / (len(tokens) + 1) ** length_penalty`` (fairseq's
            normalisation; the length counts ``</s>``).
    """

    tokens: list[int]
    log_prob: float
    score: float


class ATModel(PretrainedMixin, TranslationModel):
    """Encoder–decoder Transformer with a causal decoder and a tied output projection.

    Attributes:
        config: the :class:`~fadat.models.config.ModelConfig` (``model_type == "at"``).
        decoder: the causal :class:`~fadat.models.transformer.Decoder`.
        metadata: the non-config entries of config.json after :meth:`from_pretrained`, else ``{}``.
    """

    model_type: ClassVar[str] = "at"
    default_strategy: ClassVar[str] = "beam"
    validation_strategy: ClassVar[str] = "greedy"
    autoregressive: ClassVar[bool] = True
    decoder_kind: ClassVar[str] = AUTOREGRESSIVE
    upsampled: ClassVar[bool] = False
    # Until the decoder stack was shared (fadat.models.transformer.Decoder) its parts sat at the
    # top.
    renamed_parameters: ClassVar[dict[str, str]] = {
        "embed_positions.": "decoder.embed_positions.",
        "layers.": "decoder.layers.",
        "final_norm.": "decoder.final_norm.",
    }

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.apply(lambda m: _init_bert(m, config.init_std))

    def _decoder(
        self,
        tokens: Tensor,
        start: int,
        encoder_out: EncoderOut,
        cache: Cache | None,
    ) -> Tensor:
        """Causal decoder stack (:class:`fadat.models.transformer.Decoder`) on ``tokens`` ``(B, T)``
        at positions ``start..start+T-1``; returns fp32 log-probs ``(B, T, V)``. Without a cache the
        self-attention is causal over ``tokens``; with one, ``tokens`` are appended after the
        cached prefix.

        Raises:
            InputError: ``start + T`` exceeds ``max_target_positions``.
        """
        x = self.decoder(
            self.encoder.embed_tokens, encoder_out, tokens, causal=True, start=start, cache=cache
        )  # (B, T, d)
        logits = F.linear(x, self.output_weight)  # (B, T, V)
        return torch.log_softmax(logits.float(), dim=-1)  # (B, T, V) fp32

    def forward(self, source: Tensor, prev_output_tokens: Tensor) -> Tensor:
        """Teacher-forced log-probabilities.

        Args:
            source: ``(B, S)`` int64, ``x </s>`` right-padded.
            prev_output_tokens: ``(B, T)`` int64, ``<s> y`` right-padded (the target shifted
                right); causal masking makes right padding harmless for the real positions.

        Returns:
            ``(B, T, V)`` fp32 log p(next token), position t predicting token t+1 of ``<s> y </s>``.
        """
        return self._decoder(prev_output_tokens, 0, self.encode(source), cache=None)

    def _max_lengths(self, source: Tensor, max_len_a: float, max_len_b: int) -> Tensor:
        """Per-sentence output limit ``int(a·|x </s>| + b)`` (tokens incl. ``</s>``), ≥ 1 and
        ≤ max_target_positions (the decoder reads ``<s>`` plus all but the last token)."""
        src_len = source.ne(PAD_ID).sum(dim=1).double()  # (B,)
        limit = (max_len_a * src_len + max_len_b).floor().long()
        return limit.clamp(min=1, max=self.config.max_target_positions)  # (B,)

    @torch.no_grad()
    def greedy(
        self,
        source: Tensor,
        max_len_a: float = 1.2,
        max_len_b: int = 10,
        length_penalty: float = 1.0,
    ) -> list[ATHypothesis]:
        """Greedy decoding with a key/value cache (one decoder step per output token).

        ``<pad>`` and ``<s>`` are never emitted; ``</s>`` is forced at the length limit
        ``int(max_len_a·|x </s>| + max_len_b)`` (fairseq's ``max_len_a``/``max_len_b``).

        Args:
            source: ``(B, S)`` int64.
            max_len_a, max_len_b: the length limit, in tokens including ``</s>``.
            length_penalty: only for the reported ``score``.

        Returns:
            One :class:`ATHypothesis` per sentence, in input order.
        """
        enc = self.encode(source)
        b = source.shape[0]
        limits = self._max_lengths(source, max_len_a, max_len_b)  # (B,)
        cache: Cache = [{} for _ in self.decoder.layers]
        prev = torch.full((b, 1), BOS_ID, dtype=torch.int64, device=source.device)  # (B, 1)
        out_tokens: list[Tensor] = []
        out_scores: list[Tensor] = []
        done = torch.zeros(b, dtype=torch.bool, device=source.device)
        for step in range(int(limits.max())):
            lp = self._decoder(prev, step, enc, cache)[:, 0]  # (B, V)
            check_finite(lp, "token log-probabilities")
            lp = _ban_specials(lp, force_eos=limits.le(step + 1))
            score, token = lp.max(dim=-1)  # (B,), (B,)
            token = token.masked_fill(done, PAD_ID)
            out_tokens.append(token)
            out_scores.append(score.masked_fill(done, 0.0))
            done = done | token.eq(EOS_ID)
            if bool(done.all()):
                break
            prev = token[:, None]
        tokens = torch.stack(out_tokens, dim=1).tolist()  # (B, T)
        log_probs = torch.stack(out_scores, dim=1).double().sum(dim=1).tolist()  # (B,)
        hyps = []
        for row, lp_sum in zip(tokens, log_probs, strict=True):
            body = row[: row.index(EOS_ID)]
            hyps.append(ATHypothesis(body, lp_sum, lp_sum / (len(body) + 1) ** length_penalty))
        return hyps

    @torch.no_grad()
    def beam_search(
        self,
        source: Tensor,
        beam_size: int = 5,
        length_penalty: float = 1.0,
        max_len_a: float = 1.2,
        max_len_b: int = 10,
    ) -> list[ATHypothesis]:
        """Beam search with a key/value cache (fairseq's ``SequenceGenerator`` rules).

        Each step scores ``2·beam`` candidates per sentence; a ``</s>`` candidate among the top
        ``beam`` ranks finishes a hypothesis, scored ``log_prob / (length incl. </s>)^α``; the best
        ``beam`` other candidates continue. A sentence is done when ``beam`` hypotheses have
        finished (``</s>`` is forced at the length limit), and its rows leave the batch and the
        cache. The result is the finished hypothesis with the best score. With ``beam_size=1``
        this equals :meth:`greedy`.

        Args:
            source: ``(B, S)`` int64.
            beam_size: K ≥ 1.
            length_penalty: α.
            max_len_a, max_len_b: length limit as in :meth:`greedy`.

        Returns:
            One :class:`ATHypothesis` per sentence, in input order.

        Raises:
            ValueError: ``beam_size`` < 1.
        """
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        k = beam_size
        device = source.device
        b = source.shape[0]
        limits = self._max_lengths(source, max_len_a, max_len_b).tolist()
        enc = self.encode(source)
        # Active rows: sentence `sent[r // k]`, beam r % k.
        rows = torch.arange(b, device=device).repeat_interleave(k)  # (B·K,)
        enc = enc.index_select(rows)
        cache: Cache = [{} for _ in self.decoder.layers]
        sent = list(range(b))
        prefixes: list[list[int]] = [[] for _ in range(b * k)]
        # Only beam 0 is live at step 0, so the K copies of <s> do not fill the beam with copies.
        scores = torch.full((b, k), float("-inf"), dtype=torch.float64, device=device)
        scores[:, 0] = 0.0
        prev = torch.full((b * k, 1), BOS_ID, dtype=torch.int64, device=device)
        finished: list[list[ATHypothesis]] = [[] for _ in range(b)]
        step = 0
        while sent:
            n = len(sent)
            lp = self._decoder(prev, step, enc, cache)[:, 0]  # (n·K, V)
            check_finite(lp.view(n, k, -1), "token log-probabilities", rows=sent)
            force = torch.tensor([limits[s] <= step + 1 for s in sent], device=device)
            lp = _ban_specials(lp, force_eos=force.repeat_interleave(k))
            cand = scores[:, :, None] + lp.view(n, k, -1).double()  # (n, K, V)
            vocab = cand.shape[-1]
            top_scores, top_idx = cand.view(n, -1).topk(min(2 * k, k * vocab), dim=1)  # (n, 2K)
            top_scores, top_idx = top_scores.tolist(), top_idx.tolist()
            keep_rows, keep_tokens, keep_scores, keep_sent = _beam_step(
                top_scores, top_idx, sent, k, vocab, prefixes, finished, length_penalty
            )
            if not keep_sent:
                break
            prefixes = [prefixes[r] + [t] for r, t in zip(keep_rows, keep_tokens, strict=True)]
            index = torch.tensor(keep_rows, dtype=torch.int64, device=device)
            enc = enc.index_select(index)
            _reorder_cache(cache, index)
            scores = torch.tensor(keep_scores, dtype=torch.float64, device=device).view(-1, k)
            prev = torch.tensor(keep_tokens, dtype=torch.int64, device=device)[:, None]
            sent = keep_sent
            step += 1
        return [max(hyps, key=lambda h: h.score) for hyps in finished]

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
        """:meth:`greedy` or :meth:`beam_search` (the ``method`` of the strategy's record, with
        the record's defaults: beam size 5); one hypothesis each.

        ``upsample_ratio`` is ignored (no graph; the pipeline refuses one, ``upsampled``). With
        ``with_log_prob``, each output's ``log P(y|x)``: the sum of its token log-probs over
        ``y </s>`` that the search kept (as :meth:`score_batch` computes it teacher-forced);
        else ``None``.
        """
        record = self.offered_strategies()[strategy]
        hyps = getattr(self, record.method)(source, **{**record.defaults, **options})
        return [
            [
                Scored(
                    list(h.tokens),
                    float(h.score),
                    float(h.log_prob) if with_log_prob else None,
                    len(h.tokens) + 1,
                )
            ]
            for h in hyps
        ]

    def score_batch(
        self,
        source: Tensor,
        target: Tensor,
        target_lengths: Tensor,
        *,
        upsample_ratio: float | None = None,
    ) -> BatchScores:
        """Teacher-forced ``Σ_t log P(y_t | y_<t, x)`` over ``y </s>`` (``|y </s>|`` tokens); NaN
        for a target longer than ``max_target_positions`` (the decoder reads ``<s> y``).
        ``upsample_ratio`` is ignored."""
        limit = self.config.max_target_positions
        lengths = [int(t) for t in target_lengths]
        log_probs = [math.nan] * len(lengths)
        problems: list[str | None] = [
            f"the target has {t - 1} tokens, more than the model's maximum of {limit}: "
            "not scored (nan)"
            if t - 1 > limit
            else None
            for t in lengths
        ]
        fits = [k for k, problem in enumerate(problems) if problem is None]
        if fits:
            index = torch.tensor(fits, device=source.device)
            prev = target[index, :-1]  # (B', T-1)
            gold = target[index, 1:]  # (B', T-1)
            lprobs = self(source[index], prev[:, : min(prev.shape[1], limit)])  # (B', T-1, V)
            check_finite(lprobs, "token log-probabilities", rows=fits)
            token_lp = lprobs.gather(2, gold[:, : lprobs.shape[1], None]).squeeze(2)  # (B', T-1)
            mask = gold[:, : lprobs.shape[1]].ne(PAD_ID)  # (B', T-1)
            sums = token_lp.double().masked_fill(~mask, 0.0).sum(dim=1)  # (B',)
            for k, row in enumerate(fits):
                log_probs[row] = float(sums[k])
        return BatchScores(log_probs, [t - 1 for t in lengths], problems)

    def batch_cost(self, source_length: int, upsample_ratio: float | None = None) -> int:
        """The source length (``upsample_ratio`` is ignored)."""
        return source_length

    def length_budget(self) -> tuple[float, int | None]:
        """``(1, None)``: training batches count target tokens."""
        return 1.0, None

    def usable(self, source_lengths: np.ndarray, target_lengths: np.ndarray) -> np.ndarray:
        """Source (with ``</s>``) within ``max_source_positions`` and decoder input ``<s> y``
        within ``max_target_positions``."""
        return (np.asarray(source_lengths) <= self.config.max_source_positions) & (
            np.asarray(target_lengths) - 1 <= self.config.max_target_positions
        )


def _ban_specials(lp: Tensor, force_eos: Tensor) -> Tensor:
    """Never emit ``<pad>``/``<s>``; rows where ``force_eos`` (``(N,)`` bool) may only emit
    ``</s>``. ``lp``: ``(N, V)`` log-probs; returns a masked copy."""
    lp = lp.clone()
    lp[:, PAD_ID] = float("-inf")
    lp[:, BOS_ID] = float("-inf")
    eos = lp[:, EOS_ID].clone()
    lp[force_eos] = float("-inf")
    lp[:, EOS_ID] = eos
    return lp


def _beam_step(
    top_scores: list[list[float]],
    top_idx: list[list[int]],
    sent: list[int],
    k: int,
    vocab: int,
    prefixes: list[list[int]],
    finished: list[list[ATHypothesis]],
    length_penalty: float,
) -> tuple[list[int], list[int], list[float], list[int]]:
    """One step's choice in :meth:`ATModel.beam_search`, sentence by sentence: walk the ``2·K``
    best candidates of active sentence ``local`` (``top_scores``/``top_idx`` ``[n][2K]``, flat
    indices ``beam · V + token`` into rows ``local · K + beam``, best first); a ``</s>`` among
    the top ``K`` appends a finished hypothesis to ``finished[sent[local]]`` (until it holds
    ``K``); the first ``K`` other candidates continue (padded with dead beams). Returns the rows,
    tokens and scores that continue and the sentences still active."""
    keep_rows: list[int] = []
    keep_tokens: list[int] = []
    keep_scores: list[float] = []
    keep_sent: list[int] = []
    for local, s in enumerate(sent):
        chosen = []
        for rank, (sc, idx) in enumerate(zip(top_scores[local], top_idx[local], strict=True)):
            if sc == float("-inf"):
                break
            beam, token = divmod(idx, vocab)
            row = local * k + beam
            if token == EOS_ID:
                if rank < k and len(finished[s]) < k:
                    body = prefixes[row]
                    normed = sc / (len(body) + 1) ** length_penalty
                    finished[s].append(ATHypothesis(list(body), sc, normed))
            elif len(chosen) < k:
                chosen.append((row, token, sc))
        if len(finished[s]) >= k or not chosen:
            continue
        while len(chosen) < k:  # fewer than K live candidates: pad with dead beams
            chosen.append((chosen[0][0], chosen[0][1], float("-inf")))
        keep_sent.append(s)
        for row, token, sc in chosen:
            keep_rows.append(row)
            keep_tokens.append(token)
            keep_scores.append(sc)
    return keep_rows, keep_tokens, keep_scores, keep_sent


def _reorder_cache(cache: Cache, index: Tensor) -> None:
    """Keep (and reorder) the cache's rows ``index`` ``(R',)`` int64 in every layer, in place."""
    for layer_cache in cache:
        for part in layer_cache.values():
            for name in part:
                part[name] = part[name].index_select(0, index)
