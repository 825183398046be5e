"""The DA-Transformer network: a non-autoregressive decoder over the graph's vertices, the token
head and the links (transition) head, on the shared encoder of :mod:`fadat.models.transformer`; and
its side of the translation-model interface (:class:`fadat.models.architectures.TranslationModel`).

The model returns ``(token_logprobs, links)``; objectives (:mod:`fadat.objectives`) and decoders
(:mod:`fadat.decoding`) consume them. The architecture follows the reference implementation
(docs/reference-behaviour.md, "Network"):

- Decoder input ``[<s>, <unk> × (L−2), </s>]`` + learned positions, bidirectional self-attention,
  cross-attention; no source copy unless ``copy_source`` (not in the reference).
- Links head as the reference's (docs/reference-behaviour.md, "Links"), see
  :func:`transition_log_probs`.

Differences from the reference, on purpose:

- No length predictor: the graph size comes from the source length (``L = λ·|x|``; the MT
  recipes use length-loss factor 0).
- ``max_transition_length`` uses the dense ``(B, L, L)`` layout with the window applied as a mask
  (the reference's compact layout exists only for its CUDA kernels).

Only CPU was run; the code is device-agnostic but CUDA was not tested.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fadat.dag import (
    bos_eos_targets,
    dag_log_likelihood,
    dag_log_likelihood_from_match,
    outputs_log_prob,
)
from fadat.data.contract import PAD_ID
from fadat.decoding.strategies import GRAPH
from fadat.models.architectures import BatchScores, Scored, TranslationModel, check_finite
from fadat.models.config import ModelConfig
from fadat.models.directory import PretrainedMixin
from fadat.models.inference import PRECISIONS
from fadat.models.transformer import (
    Decoder,
    Encoder,
    EncoderOut,
    _init_bert,
    decoder_input,
)

# ----------------------------------------------------------------------------------------------
# Links head


def transition_mask(graph_lengths: Tensor, size: int, max_transition_length: int = -1) -> Tensor:
    """Valid transitions ``v_i -> v_j``: ``i < j < L_b`` and ``j − i ≤ m``
    (docs/reference-behaviour.md, "Links").

    Args:
        graph_lengths: ``(B,)`` int64 graph sizes ``L_b`` (≤ ``size``).
        size: padded graph size ``L``.
        max_transition_length: m; −1 = unlimited.

    Returns:
        ``(B, L, L)`` bool.
    """
    idx = torch.arange(size, device=graph_lengths.device)
    jump = idx[None, :] - idx[:, None]  # (L, L): j - i
    valid = jump > 0
    if max_transition_length > 0:
        valid = valid & (jump <= max_transition_length)
    return valid[None] & (idx[None, None, :] < graph_lengths[:, None, None])  # (B, L, L)


def transition_log_probs(
    query: Tensor,
    key: Tensor,
    gate_logits: Tensor,
    graph_lengths: Tensor,
    max_transition_length: int = -1,
) -> Tensor:
    """The links: log transition probabilities of the DAG, a gated mixture of H heads
    (docs/reference-behaviour.md, "Links" ``extract_links``; paper Eq. 2 with multi-head
    transitions).

    ``links[b,i,j] = log Σ_h softmax_h(gate[b,i])_h · softmax_{j valid}(S[b,i,j,h])`` with
    ``S[b,i,j,h] = <Q[b,i,h], K[b,j,h]> / sqrt(d_h)``,

    computed in fp32 as ``logsumexp_h(log_softmax_j(S) + log_softmax_h(gate))``. Invalid
    transitions (``j ≤ i``, ``j ≥ L_b``, ``j − i > m``) are −inf; rows with no successor (the last
    vertex, padding rows) are all −inf. Those entries are filled *after* the softmax and the
    mixture and never enter them, so neither the values nor the gradients contain NaN.

    Args:
        query: ``(B, L, H, d_h)`` projected vertex features (any float dtype; cast to fp32).
        key: ``(B, L, H, d_h)``.
        gate_logits: ``(B, L, H)``.
        graph_lengths: ``(B,)`` int64 ``L_b``.
        max_transition_length: m; −1 = unlimited.

    Returns:
        ``(B, L, L)`` fp32 links.
    """
    b, size, heads, dh = query.shape
    q = query.float().transpose(1, 2)  # (B, H, L, d_h)
    k = key.float().transpose(1, 2)  # (B, H, L, d_h)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(dh)  # (B, H, L, L)
    valid = transition_mask(graph_lengths, size, max_transition_length)  # (B, L, L)
    has_successor = valid.any(dim=-1, keepdim=True)  # (B, L, 1)
    # Rows without a successor are left unmasked so their softmax stays finite (and is discarded).
    scores = scores.masked_fill((~valid & has_successor)[:, None], float("-inf"))
    head_logp = torch.log_softmax(scores, dim=-1)  # (B, H, L, L)
    log_gate = torch.log_softmax(gate_logits.float(), dim=-1).transpose(1, 2)  # (B, H, L)
    mixed = head_logp + log_gate[..., None]  # (B, H, L, L)
    # Zero the invalid entries before the logsumexp: all −inf inputs would give NaN gradients.
    mixed = torch.where(valid[:, None], mixed, mixed.new_zeros(()))
    links = torch.logsumexp(mixed, dim=1)  # (B, L, L)
    return links.masked_fill(~valid, float("-inf"))


class LinksHead(nn.Module):
    """Projects vertex features ``[h_j; P_link(j)]`` (2d) to per-head queries and keys (d) and gate
    logits (H) and returns the links (docs/reference-behaviour.md, "Links", ``--links-feature
    feature:position``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.d_model
        self.heads = config.link_heads
        self.max_transition_length = config.max_transition_length
        self.positions = nn.Embedding(config.max_target_positions, d)
        self.query_linear = nn.Linear(2 * d, d)
        self.key_linear = nn.Linear(2 * d, d)
        self.gate_linear = nn.Linear(2 * d, config.link_heads)

    def forward(self, states: Tensor, graph_lengths: Tensor) -> Tensor:
        """``states`` ``(B, L, d)`` final decoder states, ``graph_lengths`` ``(B,)`` ->
        ``(B, L, L)`` fp32 links. Runs in fp32 with autocast disabled."""
        b, size, d = states.shape
        with torch.autocast(device_type=states.device.type, enabled=False):
            pos = self.positions(torch.arange(size, device=states.device))  # (L, d)
            feats = torch.cat([states.float(), pos.float().expand(b, size, d)], dim=-1)  # (B,L,2d)
            q = self.query_linear(feats).view(b, size, self.heads, d // self.heads)
            k = self.key_linear(feats).view(b, size, self.heads, d // self.heads)
            gate = self.gate_linear(feats)  # (B, L, H)
            return transition_log_probs(q, k, gate, graph_lengths, self.max_transition_length)


class DATModel(PretrainedMixin, TranslationModel):
    """DA-Transformer: encoder, non-autoregressive decoder over L graph vertices, token head and
    links head (docs/reference-behaviour.md, "Network"; paper §2.2, Eq. 1–2).

    Attributes:
        config: the :class:`ModelConfig` (``model_type == "dat"``).
        encoder: the :class:`Encoder` (owns the shared embedding).
        decoder: the :class:`fadat.models.transformer.Decoder` over the graph's vertices.
        links_head: the :class:`LinksHead`.
        metadata: the non-config entries of config.json after :meth:`from_pretrained`
            (e.g. ``"data"`` licence/attribution), else ``{}``.
    """

    model_type: ClassVar[str] = "dat"
    default_strategy: ClassVar[str] = "lookahead"  # the paper's default
    validation_strategy: ClassVar[str] = "lookahead"
    validation_options: ClassVar[dict[str, str]] = {"beta": "decode_beta"}
    flag_aliases: ClassVar[dict[str, dict[str, str]]] = {"beam": {"length_penalty": "alpha"}}
    has_graph: ClassVar[bool] = True
    decoder_kind: ClassVar[str] = GRAPH
    precisions: ClassVar[tuple[str, ...]] = PRECISIONS
    reduced_head: ClassVar[bool] = True
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
        self.decoder = Decoder(config, copy_source=config.copy_source)
        self.links_head = LinksHead(config)
        self.apply(lambda m: _init_bert(m, config.init_std))

    def decoder_input_tokens(self, graph_lengths: Tensor) -> Tensor:
        """Decoder input ids ``[<s>, <unk> × (L_b − 2), </s>, <pad> …]``
        (:func:`fadat.models.transformer.decoder_input`).

        Args:
            graph_lengths: ``(B,)`` int64, every ``L_b ≥ 2``.

        Returns:
            ``(B, max_b L_b)`` int64.

        Raises:
            ValueError: a graph length < 2.
        """
        return decoder_input(graph_lengths)

    def decoder_states(self, encoder_out: EncoderOut, decoder_tokens: Tensor) -> Tensor:
        """Final decoder states of the NAT decoder (:class:`fadat.models.transformer.Decoder`:
        bidirectional self-attention over the non-pad vertices, cross-attention to the source).

        Args:
            encoder_out: from :meth:`encode`.
            decoder_tokens: ``(B, L)`` int64 vertex inputs (see :meth:`decode`).

        Returns:
            ``(B, L, d)`` (model dtype, or the autocast dtype).

        Raises:
            InputError: ``L`` exceeds ``max_target_positions``.
        """
        return self.decoder(self.encoder.embed_tokens, encoder_out, decoder_tokens)

    def token_logits(self, states: Tensor) -> Tensor:
        """``(B, L, d)`` states -> ``(B, L, V)`` logits of the tied, bias-free output projection,
        in the autocast dtype (bf16/fp16 under autocast, else fp32)."""
        return F.linear(states, self.output_weight)  # (B, L, V)

    def token_head(self, states: Tensor) -> Tensor:
        """``(B, L, d)`` states -> ``(B, L, V)`` fp32 token log-probs: the tied, bias-free output
        projection, logits cast to fp32 before the log-softmax (docs/reference-behaviour.md,
        "Network")."""
        return torch.log_softmax(self.token_logits(states).float(), dim=-1)  # (B, L, V) fp32

    def decode_logits(
        self, encoder_out: EncoderOut, decoder_tokens: Tensor
    ) -> tuple[Tensor, Tensor]:
        """:meth:`decode` without the log-softmax: ``(logits (B, L, V), links (B, L, L))``.

        The training objectives take the reference tokens' log-probabilities from the logits with
        :func:`target_logprobs`, which never builds the ``(B, L, V)`` fp32 log-softmax.
        """
        states = self.decoder_states(encoder_out, decoder_tokens)  # (B, L, d)
        lengths = decoder_tokens.ne(PAD_ID).sum(dim=1)  # (B,)
        return self.token_logits(states), self.links_head(states, lengths)

    def decode(self, encoder_out: EncoderOut, decoder_tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Run the NAT decoder and both heads.

        Args:
            encoder_out: from :meth:`encode`.
            decoder_tokens: ``(B, L)`` int64 vertex inputs (plain ``<unk>`` input or a glanced
                one); the graph size ``L_b`` is the number of non-pad tokens of row b, which
                must form a prefix of the row.

        Returns:
            ``token_logprobs`` ``(B, L, V)`` fp32 (:meth:`token_head`) and ``links``
            ``(B, L, L)`` fp32 (:class:`LinksHead`, :func:`transition_log_probs`).

        Raises:
            InputError: ``L`` exceeds ``max_target_positions``.
        """
        logits, links = self.decode_logits(encoder_out, decoder_tokens)
        return torch.log_softmax(logits.float(), dim=-1), links  # (B, L, V), (B, L, L)

    def forward(
        self, source: Tensor, graph_lengths: Tensor, decoder_tokens: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Encode ``source`` ``(B, S)`` and decode a graph of ``graph_lengths`` ``(B,)`` vertices.

        Args:
            source: ``(B, S)`` int64.
            graph_lengths: ``(B,)`` int64 (from :meth:`graph_lengths`).
            decoder_tokens: ``(B, L)`` int64 decoder input; default
                :meth:`decoder_input_tokens` of ``graph_lengths``.

        Returns:
            ``(token_logprobs (B, L, V), links (B, L, L))``, both fp32.
        """
        if decoder_tokens is None:
            decoder_tokens = self.decoder_input_tokens(graph_lengths)
        return self.decode(self.encode(source), decoder_tokens)

    # ---- the translation-model interface (fadat.models.architectures.TranslationModel)

    def graph_outputs(
        self, source: Tensor, upsample_ratio: float | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One decoder pass on the graph that decoding uses (sizes from the decoding λ).

        Args:
            source: ``(B, S)`` int64 ``x </s>`` right-padded.
            upsample_ratio: the decoding λ; ``None`` = the model's
                (``config.decoding_upsample_ratio``).

        Returns:
            ``(token_logprobs (B, L, V) fp32, links (B, L, L) fp32, graph_lengths (B,) int64)``.

        Raises:
            NonFiniteOutputError: NaN or +inf links or token log-probabilities
                (:func:`fadat.models.architectures.check_finite`).
        """
        source_lengths = source.ne(PAD_ID).sum(dim=1)  # (B,)
        graph_lengths = self.graph_lengths(source_lengths, True, upsample_ratio)  # (B,)
        token_logprobs, links = self(source, graph_lengths)  # (B, L, V), (B, L, L)
        check_finite(links, "link scores")
        check_finite(token_logprobs, "token log-probabilities")
        return token_logprobs, links, graph_lengths

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
        """One decoder pass and ``nbest`` decodes of the graph (:func:`fadat.decoding.decode`).

        Greedy, lookahead without n-gram bans, Viterbi and joint-Viterbi run on the fast
        inference path (:func:`fadat.models.inference.graph_top1`: only the per-vertex best tokens,
        in the precision of :func:`fadat.models.inference.with_precision`; in fp32 the same outputs
        as the full ``(B, L, V)`` path). n-best (``sample`` only) by repeated draws: draw k uses
        ``seed + k`` so the list is reproducible; duplicates are merged (keeping the best
        score) and the rest ranked.

        Args:
            source: ``(B, S)`` int64 ``x </s>`` right-padded.
            strategy, options, nbest: see :class:`fadat.models.architectures.TranslationModel`.
            upsample_ratio: the decoding λ (graph size ``L = λ·|x </s>|``); ``None`` = the
                model's (``config.decoding_upsample_ratio``).
            with_log_prob: also give each output's ``log P(y|x)`` (paper Eq. 3 over
                ``|<s> y </s>|`` tokens, as :meth:`score_batch` computes it) from this same
                pass. On the fast path that costs the full token head once
                (:func:`fadat.models.inference.output_match`: full-vocabulary normalisers, so exact
                with a shortlist or pruning too), which the fast path otherwise avoids; off, the
                hypotheses carry ``log_prob=None``.
        """
        from fadat.decoding import decode
        from fadat.models.inference import precision_autocast

        record = self.offered_strategies().get(strategy)  # None: decode() names the problem
        if nbest == 1 and record is not None and record.reads_top1_only(options):
            return self._translate_top1(source, strategy, options, upsample_ratio, with_log_prob)
        with torch.inference_mode(), precision_autocast(self):
            token_logprobs, links, graph_lengths = self.graph_outputs(source, upsample_ratio)
        draws = []
        for k in range(nbest):
            opts = dict(options)
            if nbest > 1 and options.get("seed") is not None:
                opts["seed"] = int(options["seed"]) + k
            draws.append(decode(token_logprobs, links, graph_lengths, strategy, **opts))
        out = _merge_draws(draws, source.shape[0], nbest)
        owner = [b for b, hyps in enumerate(out) for _ in hyps]
        flat = [tokens for hyps in out for tokens, _ in hyps]
        log_probs: list[float | None] = [None] * len(flat)
        if with_log_prob:  # one DP over every listed output, on this pass's log-probs
            log_probs = outputs_log_prob(token_logprobs, links, graph_lengths, owner, flat)
        found = iter(log_probs)
        return [
            [Scored(tokens, score, next(found), len(tokens) + 2) for tokens, score in hyps]
            for hyps in out
        ]

    def _translate_top1(
        self,
        source: Tensor,
        strategy: str,
        options: dict[str, Any],
        upsample_ratio: float | None,
        with_log_prob: bool,
    ) -> list[list[Scored]]:
        """:meth:`translate_batch`'s fast path (one output per sentence, a decoder that reads
        only each vertex's best token): :func:`fadat.models.inference.graph_top1`."""
        from fadat.decoding import decode
        from fadat.models.inference import graph_top1, output_match, precision_autocast

        top1, links, lengths, states = graph_top1(
            self,
            source,
            path_only=strategy == "greedy",
            shortlist=getattr(self, "inference_shortlist", None),
            prune_threshold=getattr(self, "inference_prune_threshold", None),
            return_states=True,
            upsample_ratio=upsample_ratio,
        )
        hyps = decode(top1, links, lengths, strategy, **options)
        outputs = [list(h.tokens) for h in hyps]
        log_probs: list[float | None] = [None] * len(outputs)
        if with_log_prob:
            targets, target_lengths = bos_eos_targets(outputs, source.device)  # (B, T), (B,)
            with torch.inference_mode(), precision_autocast(self):
                match = output_match(self, states, targets)  # (B, T, L)
            log_probs = dag_log_likelihood_from_match(
                match, links, lengths, target_lengths
            ).tolist()
        return [
            [Scored(y, float(h.score), lp, len(y) + 2)]
            for y, h, lp in zip(outputs, hyps, log_probs, strict=True)
        ]

    def score_batch(
        self,
        source: Tensor,
        target: Tensor,
        target_lengths: Tensor,
        *,
        upsample_ratio: float | None = None,
    ) -> BatchScores:
        """``log P(y|x)`` by paper Eq. 3 (:func:`fadat.dag.dag_log_likelihood`) on the graph that
        translation decodes (λ = ``upsample_ratio``, ``None`` = the model's decoding λ), over
        ``|<s> y </s>|`` tokens; ``-inf`` when the target has more tokens than the graph has
        vertices."""
        token_logprobs, links, graph_lengths = self.graph_outputs(source, upsample_ratio)
        log_probs = dag_log_likelihood(
            token_logprobs, links, target, graph_lengths, target_lengths
        )  # (B,)
        problems = [
            f"the target has {int(t)} tokens, more than the graph's {int(g)} vertices: log P = -inf"
            if t > g
            else None
            for t, g in zip(target_lengths, graph_lengths, strict=True)
        ]
        return BatchScores(
            [float(v) for v in log_probs], [int(t) for t in target_lengths], problems
        )


def _merge_draws(
    draws: list[list[Any]], batch: int, nbest: int
) -> list[list[tuple[list[int], float]]]:
    """Per sentence, the distinct outputs of ``draws`` (``nbest`` lists of ``batch``
    hypotheses) as ``(tokens, score)``, a duplicate keeping its best score; ranked best first
    when ``nbest > 1``."""
    out = []
    for b in range(batch):
        unique: dict[tuple[int, ...], float] = {}
        for draw in draws:
            h = draw[b]
            key = tuple(h.tokens)
            unique[key] = max(unique.get(key, -math.inf), float(h.score))
        ranked = sorted(unique.items(), key=lambda kv: -kv[1]) if nbest > 1 else unique.items()
        out.append([(list(tokens), score) for tokens, score in ranked])
    return out
