"""Training objectives: the DAG NLL, the FA-DAT fuzzy alignment loss, glancing, and the
label-smoothed cross-entropy of the autoregressive baseline.

Every objective returns a :class:`LossOutput` whose ``loss_sum`` is a SUM over the sentences (or,
for the AT baseline, the target tokens) of one micro-batch, together with the count it has to be
divided by. The trainer divides by the count of the whole update (all micro-batches, all ranks),
so one process with a global batch and several processes with its shards compute the same
gradient.

Sources: anchor-spec §2 (NLL, per-sentence normalisation, invalid sentences, force-emit),
§3 (glancing, ``--glat-p`` schedule), §4 (fuzzy alignment loss); FA-DAT paper eq. (loss)
``L = −BP · p′_n``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from fadat import dag
from fadat.data.contract import PAD_ID, Batch
from fadat.losses import target_logprobs

# --------------------------------------------------------------------------------------------
# Glancing-ratio schedule (anchor-spec §3, ``--glat-p "v0:v1@N"``)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GlancingSchedule:
    """Piecewise-linear glancing ratio over the update count.

    Attributes:
        values: ratios at the knots, each in [0, 1].
        positions: update counts of the knots, strictly increasing, first one 0.
        spec: the string it was parsed from (kept for logging and the resolved config).
    """

    values: tuple[float, ...]
    positions: tuple[int, ...]
    spec: str

    def __call__(self, update: int) -> float:
        """Ratio at update ``update`` (0-based count of finished updates).

        Between knots (a, pa) and (b, pb): ``a + (b − a)·(u − pa)/(pb − pa + 1)`` (the reference's
        ``+ 1``, anchor-spec §3 and §9.11); after the last knot its value.
        """
        if update < 0:
            raise ValueError(f"update count must be >= 0, got {update}")
        for k in range(len(self.positions) - 1):
            pa, pb = self.positions[k], self.positions[k + 1]
            if update < pb:
                a, b = self.values[k], self.values[k + 1]
                return a + (b - a) * (update - pa) / (pb - pa + 1)
        return self.values[-1]


def _parse_count(text: str, spec: str) -> int:
    # The reference only expands "k" (to "000"), anchor-spec §3; "m" is added for convenience.
    match = re.fullmatch(r"(\d+)([km]?)", text.strip())
    if match is None:
        raise ValueError(f"bad update count {text!r} in glancing schedule {spec!r}")
    return int(match.group(1)) * {"": 1, "k": 1000, "m": 1_000_000}[match.group(2)]


def parse_glancing_schedule(spec: str | float) -> GlancingSchedule:
    """Parse a glancing-ratio schedule (anchor-spec §3).

    Syntax: a single ratio ``"0.1"`` (constant), or ``"v0:v1@N"`` (linear from v0 at update 0 to
    v1 at update N, then constant), or more knots ``"v0:v1@N1:v2@N2"`` (positions increasing).
    ``k`` after a count multiplies by 1000 (``"0.5:0.1@200k"``), ``m`` by 10⁶.

    Args:
        spec: the schedule string, or a number for a constant ratio.

    Returns:
        The :class:`GlancingSchedule`.

    Raises:
        ValueError: malformed string, a ratio outside [0, 1], or non-increasing positions.
    """
    text = str(spec).strip()
    parts = text.split(":")
    values: list[float] = []
    positions: list[int] = []
    for k, part in enumerate(parts):
        if k == 0:
            if "@" in part:
                raise ValueError(f"the first value of glancing schedule {text!r} takes no '@'")
            value_text, pos = part, 0
        else:
            if part.count("@") != 1:
                raise ValueError(f"glancing schedule {text!r}: knot {part!r} needs 'value@updates'")
            value_text, pos_text = part.split("@")
            pos = _parse_count(pos_text, text)
        try:
            value = float(value_text)
        except ValueError:
            raise ValueError(f"bad ratio {value_text!r} in glancing schedule {text!r}") from None
        if not 0.0 <= value <= 1.0 or math.isnan(value):
            raise ValueError(f"glancing ratio {value} in {text!r} is outside [0, 1]")
        if positions and pos <= positions[-1]:
            raise ValueError(f"glancing schedule {text!r}: positions must increase")
        values.append(value)
        positions.append(pos)
    return GlancingSchedule(values=tuple(values), positions=tuple(positions), spec=text)


# --------------------------------------------------------------------------------------------
# Glancing (anchor-spec §3)
# --------------------------------------------------------------------------------------------


def glance_count(
    target_lengths: torch.Tensor, num_correct: torch.Tensor, ratio: float
) -> torch.Tensor:
    """Number of glanced tokens per sentence, ``number-random`` strategy (anchor-spec §3.4).

    Args:
        target_lengths: ``(B,)`` int64, T_b including ``<s>`` and ``</s>``.
        num_correct: ``(B,)`` int64, aligned vertices whose pass-1 argmax equals the oracle token.
        ratio: the current glancing ratio p in [0, 1].

    Returns:
        ``(B,)`` int64, ``floor((T_b − correct_b)·p + 0.5)``.
    """
    wrong = (target_lengths - num_correct).to(torch.float64)  # (B,)
    return torch.floor(wrong * ratio + 0.5).to(torch.int64)


def choose_glanced(
    path: torch.Tensor, counts: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Choose ``counts[b]`` aligned vertices of sentence b uniformly at random.

    As the reference: Gaussian scores on aligned vertices (−100 elsewhere), keep those at or
    above the N-th largest score (anchor-spec §3.4).

    Args:
        path: ``(B, L)`` int64 target index aligned to each vertex, −1 off the path.
        counts: ``(B,)`` int64, how many vertices to glance (≤ number of aligned vertices).
        generator: random generator (default: the global torch generator).

    Returns:
        ``(B, L)`` bool mask of glanced vertices; row b has exactly ``counts[b]`` True entries.
    """
    aligned = path >= 0  # (B, L)
    scores = torch.randn(path.shape, generator=generator, device=path.device)  # (B, L)
    scores = scores.masked_fill(~aligned, -100.0)
    order = scores.argsort(dim=1, descending=True)  # (B, L)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(path.shape[1], device=path.device).expand_as(order))
    counts = torch.minimum(counts, aligned.sum(dim=1))  # (B,)
    return (ranks < counts[:, None]) & aligned  # (B, L)


def oracle_tokens(targets: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
    """``oracle[b, j] = y_b[path[b, j]]`` for aligned vertices, ``<pad>`` elsewhere.

    Args:
        targets: ``(B, T)`` int64, ``<s> y </s>`` right-padded.
        path: ``(B, L)`` int64 target index per vertex, −1 off the path.

    Returns:
        ``(B, L)`` int64.
    """
    oracle = targets.gather(1, path.clamp(min=0))  # (B, L)
    return oracle.masked_fill(path < 0, PAD_ID)


@dataclass
class GlanceResult:
    """What the glancing pass decided (anchor-spec §3).

    Attributes:
        decoder_tokens: ``(B, L)`` int64 input of pass 2 (pass-1 input with glanced ``<unk>``
            replaced by oracle tokens).
        glanced: ``(B, L)`` bool, vertices whose input was replaced.
        path: ``(B, L)`` int64 best alignment of pass 1 (−1 off the path).
        num_correct: ``(B,)`` int64 aligned vertices whose pass-1 argmax equals the oracle.
        num_glanced: ``(B,)`` int64.
        seed: the dropout seed shared by both passes.
        pass1: pass-1 outputs ``(logits (B, L, V), links (B, L, L))`` (no grad; logits in the
            autocast dtype, see ``DATModel.decode_logits``).
    """

    decoder_tokens: torch.Tensor
    glanced: torch.Tensor
    path: torch.Tensor
    num_correct: torch.Tensor
    num_glanced: torch.Tensor
    seed: int
    pass1: tuple[torch.Tensor, torch.Tensor]


def _fp32(device: torch.device) -> torch.autocast:
    """Autocast off: the DAG math runs in fp32 whatever the network's autocast dtype."""
    return torch.autocast(device_type=device.type, enabled=False)


def _wide(x: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 → fp32; fp32 and fp64 unchanged (tests use fp64)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _rng_devices(device: torch.device) -> list[int]:
    return [device.index or 0] if device.type == "cuda" else []


def decode_with_seed(
    model, encoder_out, decoder_tokens: torch.Tensor, seed: int, logits: bool = False
):
    """Run ``model.decode`` (``model.decode_logits`` with ``logits=True``) with the global RNG
    seeded to ``seed`` and restored afterwards, so two calls with the same seed draw identical
    dropout masks (anchor-spec §3.1, §3.5)."""
    with torch.random.fork_rng(devices=_rng_devices(decoder_tokens.device)):
        torch.manual_seed(seed)
        if logits:
            return model.decode_logits(encoder_out, decoder_tokens)
        return model.decode(encoder_out, decoder_tokens)


def glance(
    model,
    encoder_out,
    targets: torch.Tensor,
    graph_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    ratio: float,
    seed: int,
) -> GlanceResult:
    """Glancing pass 1 (anchor-spec §3.1–3.4): decode the plain input without gradient under the
    dropout seed ``seed``, align the target with the best path of the DAG, count correct tokens,
    and choose ``floor((T − #correct)·p + 0.5)`` aligned vertices to reveal.

    The random choice of vertices uses the global torch RNG (after pass 1, outside the seeded
    block), so a resumed run with restored RNG states chooses the same vertices.

    Args:
        model: a ``DATModel`` (``decoder_input_tokens``, ``decode``).
        encoder_out: ``model.encode(source)``.
        targets: ``(B, T)`` int64 ``<s> y </s>``.
        graph_lengths: ``(B,)`` int64 L_b.
        target_lengths: ``(B,)`` int64 T_b.
        ratio: glancing ratio p in [0, 1].
        seed: dropout seed shared with pass 2.

    Returns:
        A :class:`GlanceResult`. Sentences with T_b > L_b have no path and get no glance.
    """
    plain = model.decoder_input_tokens(graph_lengths)  # (B, L)
    with torch.no_grad():
        logits, links = decode_with_seed(model, encoder_out, plain, seed, logits=True)
    with torch.no_grad(), _fp32(plain.device):
        links = _wide(links)
        fits = target_lengths <= graph_lengths  # (B,)
        path = torch.full(plain.shape, -1, dtype=torch.int64, device=plain.device)  # (B, L)
        if bool(fits.any()):
            rows = fits.nonzero().squeeze(1)
            width = int(target_lengths[rows].max())
            match = target_logprobs(_rows(logits, rows), targets[rows, :width])  # (B', T', L)
            path[rows] = dag.best_alignment_from_match(
                match, links[rows], graph_lengths[rows], target_lengths[rows]
            )
        oracle = oracle_tokens(targets, path)  # (B, L)
        aligned = path >= 0  # (B, L)
        correct = ((logits.argmax(dim=-1) == oracle) & aligned).sum(dim=1)  # (B,)
    counts = glance_count(target_lengths, correct, ratio) * fits  # (B,)
    glanced = choose_glanced(path, counts)  # (B, L)
    tokens = torch.where(glanced, oracle, plain)  # (B, L)
    return GlanceResult(
        decoder_tokens=tokens,
        glanced=glanced,
        path=path,
        num_correct=correct,
        num_glanced=glanced.sum(dim=1),
        seed=seed,
        pass1=(logits, links),
    )


# --------------------------------------------------------------------------------------------
# Losses on the DAG outputs
# --------------------------------------------------------------------------------------------


@dataclass
class LossOutput:
    """One micro-batch's contribution.

    Attributes:
        loss_sum: scalar fp32 tensor (with grad): the SUM of per-sentence (or per-token) losses.
        count: number of sentences (DAG objectives) or target tokens (AT) that ``loss_sum``
            sums over; the trainer divides by the update's total count.
        stats: additive statistics for logging (sums over this micro-batch), e.g.
            ``invalid_too_long``, ``invalid_nonfinite``, ``glanced``, ``precision_sum``.
    """

    loss_sum: torch.Tensor
    count: int
    stats: dict[str, float] = field(default_factory=dict)


def force_emit_match(
    match: torch.Tensor, path: torch.Tensor, glanced: torch.Tensor
) -> torch.Tensor:
    """Force-emit, anchor-spec §2 [v1] (FA-DAT): a glanced vertex j aligned to target t* may only
    emit y_{t*}; column j of ``match`` keeps row t* (detached) and is −inf elsewhere. Other
    vertices may still emit y_{t*}.

    Args:
        match: ``(B, T, L)`` fp32 log-probabilities ``log p(y_t | v_j)``.
        path: ``(B, L)`` int64 target index per vertex (−1 off the path).
        glanced: ``(B, L)`` bool glanced vertices (all on the path).

    Returns:
        ``(B, T, L)`` fp32.
    """
    t = torch.arange(match.shape[1], device=match.device)  # (T,)
    pinned = (t[None, :, None] == path[:, None, :]) & glanced[:, None, :]  # (B, T, L)
    column = glanced[:, None, :].expand_as(match)  # (B, T, L)
    out = torch.where(column & ~pinned, torch.full_like(match, -math.inf), match)
    return torch.where(pinned, match.detach(), out)  # (B, T, L)


def nll_loss(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    targets: torch.Tensor,
    graph_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    glance: GlanceResult | None = None,
    force_emit: bool = True,
) -> LossOutput:
    """DAG negative log-likelihood (anchor-spec §2; paper §2.2 ``L = −log P(y|x)``).

    Per sentence ``ℓ_b = −log P(y_b|x_b) / T_b``. Sentences that cannot be aligned (T_b > L_b,
    cause ``too_long``) or whose log-likelihood is not finite (cause ``nonfinite``) contribute 0
    and stay in the count, as the reference. Too-long sentences are removed before the DP so that
    their −inf never reaches the backward pass.

    Args:
        token_logprobs: ``(B, L, V)`` fp32 log-probabilities.
        links: ``(B, L, L)`` fp32 log transition probabilities.
        targets: ``(B, T)`` int64 ``<s> y </s>``, right-padded.
        graph_lengths: ``(B,)`` int64 L_b.
        target_lengths: ``(B,)`` int64 T_b.
        glance: the glancing decision of pass 1; with ``force_emit`` the glanced vertices are
            pinned to their oracle token (anchor-spec §2 [v1]).
        force_emit: apply force-emit to glanced vertices.

    :func:`nll_loss_from_logits` is the same loss from the output-projection logits (the
    training step's path: no ``(B, L, V)`` fp32 log-softmax).

    Returns:
        :class:`LossOutput` with ``loss_sum = Σ_b ℓ_b``, ``count = B``, the invalid counts and
        ``underflow_recomputed`` (sentences the DP recomputed in float64, see fadat.dag).
    """
    return _nll(
        lambda rows, tgt: dag.gather_match(_wide(token_logprobs[rows]), tgt),
        links,
        targets,
        graph_lengths,
        target_lengths,
        glance,
        force_emit,
    )


def nll_loss_from_logits(
    logits: torch.Tensor,
    links: torch.Tensor,
    targets: torch.Tensor,
    graph_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    glance: GlanceResult | None = None,
    force_emit: bool = True,
    inplace_backward: bool = False,
) -> LossOutput:
    """:func:`nll_loss` with ``token_logprobs = log_softmax(logits)``, computed through
    :func:`fadat.losses.target_logprobs` (``logits`` ``(B, L, V)`` in any float dtype; the other
    arguments and the result as :func:`nll_loss`). With ``inplace_backward`` the backward
    overwrites ``logits`` with their gradient (see ``target_logprobs``): for a caller that
    owns them, as the training step does."""

    return _nll(
        lambda rows, tgt: target_logprobs(
            _rows(logits, rows), tgt, inplace_backward=inplace_backward
        ),
        links,
        targets,
        graph_lengths,
        target_lengths,
        glance,
        force_emit,
    )


def _rows(logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``logits[rows]`` for the sorted ``(B',)`` indices of the sentences that fit their graph;
    ``logits`` itself when all do (the usual case), without a ``(B, L, V)`` copy."""
    return logits if len(rows) == len(logits) else logits[rows]


def _nll(
    match_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    links: torch.Tensor,
    targets: torch.Tensor,
    graph_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    glance: GlanceResult | None,
    force_emit: bool,
) -> LossOutput:
    """The body of :func:`nll_loss`; ``match_of(rows, targets[rows, :T'])`` gives the
    ``(B', T', L)`` match of the sentences that fit."""
    batch = targets.shape[0]
    fits = target_lengths <= graph_lengths  # (B,)
    loss_sum = links.new_zeros(())
    nonfinite = underflow = 0
    if bool(fits.any()):
        rows = fits.nonzero().squeeze(1)
        width = int(target_lengths[rows].max())
        match = match_of(rows, targets[rows, :width])  # (B', T', L)
        if glance is not None and force_emit:
            match = force_emit_match(match, glance.path[rows], glance.glanced[rows])
        ll, dag_stats = dag.dag_log_likelihood_from_match(
            match, _wide(links[rows]), graph_lengths[rows], target_lengths[rows], return_stats=True
        )  # (B',)
        underflow = dag_stats.underflow_recomputed
        finite = torch.isfinite(ll)  # (B',)
        nonfinite = int((~finite).sum())
        per_sentence = -ll / target_lengths[rows].to(ll.dtype)  # (B',)
        loss_sum = torch.where(finite, per_sentence, torch.zeros_like(per_sentence)).sum()
    stats = {
        "invalid_too_long": float(batch - int(fits.sum())),
        "invalid_nonfinite": float(nonfinite),
        "underflow_recomputed": float(underflow),
    }
    return LossOutput(loss_sum=loss_sum, count=batch, stats=stats)


def fuzzy_loss(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    targets: torch.Tensor,
    graph_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    order: int = 2,
) -> LossOutput:
    """FA-DAT fuzzy alignment loss ``ℓ_b = −BP_b · p′_n,b`` (anchor-spec §4; paper eq. loss).

    The n-gram statistics come from :func:`fadat.dag.fuzzy_alignment` (single order n, clipped
    expected matches over expected n-gram count, BP from expected length vs T_b, both counting
    ``<s>``/``</s>``). No force-emit, no log, as the reference. Non-finite scores contribute 0
    (cause ``nonfinite``).

    Args:
        token_logprobs: ``(B, L, V)`` fp32 log-probabilities.
        links: ``(B, L, L)`` fp32 log transition probabilities.
        targets: ``(B, T)`` int64.
        graph_lengths: ``(B,)`` int64.
        target_lengths: ``(B,)`` int64.
        order: the n-gram order n (default 2).

    Returns:
        :class:`LossOutput` with ``loss_sum = Σ_b −BP_b·p_b``, ``count = B``, and sums of
        precision, BP and length ratio ``E|A| / T`` for logging.
    """
    result = dag.fuzzy_alignment(
        _wide(token_logprobs), _wide(links), targets, graph_lengths, target_lengths, order=order
    )
    score = result.score  # (B,) = BP · p
    finite = torch.isfinite(score)  # (B,)
    per_sentence = torch.where(finite, -score, torch.zeros_like(score))  # (B,)
    ratio = result.expected_length / target_lengths.to(result.expected_length.dtype)  # (B,)
    stats = {
        "invalid_too_long": 0.0,
        "invalid_nonfinite": float((~finite).sum()),
        "precision_sum": float(result.precision.detach().nan_to_num().sum()),
        "bp_sum": float(result.brevity_penalty.detach().nan_to_num().sum()),
        "length_ratio_sum": float(ratio.detach().nan_to_num().sum()),
    }
    return LossOutput(loss_sum=per_sentence.sum(), count=targets.shape[0], stats=stats)


# --------------------------------------------------------------------------------------------
# The autoregressive baseline
# --------------------------------------------------------------------------------------------


def label_smoothed_nll(
    token_logprobs: torch.Tensor, gold: torch.Tensor, epsilon: float = 0.1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Label-smoothed cross-entropy per token, as fairseq's ``label_smoothed_cross_entropy``:
    ``(1 − ε − ε/(V−1))·nll + ε/(V−1)·Σ_v −log p_v``.

    Args:
        token_logprobs: ``(B, T, V)`` fp32 log-probabilities.
        gold: ``(B, T)`` int64 gold next tokens, ``<pad>`` where there is none.
        epsilon: smoothing mass ε in [0, 1).

    Returns:
        ``(loss, nll)``: two ``(B, T)`` fp32 tensors, zero at pad positions.
    """
    nll = -token_logprobs.gather(-1, gold.unsqueeze(-1)).squeeze(-1)  # (B, T)
    smooth = -token_logprobs.sum(dim=-1)  # (B, T)
    eps_i = epsilon / (token_logprobs.shape[-1] - 1)
    loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth  # (B, T)
    keep = gold != PAD_ID  # (B, T)
    return loss.masked_fill(~keep, 0.0), nll.masked_fill(~keep, 0.0)


# --------------------------------------------------------------------------------------------
# One micro-batch: model forward + objective
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ObjectiveConfig:
    """Settings of the objective for one update.

    Attributes:
        name: ``nll`` | ``fuzzy`` (DAG model) or ``label_smoothed_ce`` (AT baseline).
        glancing_ratio: the current glancing ratio p (DAG objectives).
        force_emit: force-emit glanced vertices in the NLL (anchor-spec §2 [v1]).
        ngram_order: n of the fuzzy loss.
        label_smoothing: ε of the AT loss.
    """

    name: str
    glancing_ratio: float = 0.0
    force_emit: bool = True
    ngram_order: int = 2
    label_smoothing: float = 0.1


def _dat_step(model, batch: Batch, cfg: ObjectiveConfig) -> LossOutput:
    graph_lengths = model.graph_lengths(batch.source_lengths)  # (B,)
    encoder_out = model.encode(batch.source)
    plain = model.decoder_input_tokens(graph_lengths)  # (B, L)
    # One seed for both passes: identical dropout masks (anchor-spec §3.1/§3.5). Drawn from the
    # global RNG so that a resumed run draws the same seeds.
    seed = int(torch.randint(0, 2**62, (1,)).item())
    glanced = None
    decoder_tokens = plain
    if cfg.glancing_ratio > 0:
        glanced = glance(
            model,
            encoder_out,
            batch.target,
            graph_lengths,
            batch.target_lengths,
            cfg.glancing_ratio,
            seed,
        )
        decoder_tokens = glanced.decoder_tokens
    logits, links = decode_with_seed(model, encoder_out, decoder_tokens, seed, logits=True)
    with _fp32(logits.device):
        links = _wide(links)
        if cfg.name == "nll":
            out = nll_loss_from_logits(
                logits,
                links,
                batch.target,
                graph_lengths,
                batch.target_lengths,
                glance=glanced,
                force_emit=cfg.force_emit,
                inplace_backward=True,  # the logits of this step are used by nothing else
            )
        else:
            out = fuzzy_loss(
                torch.log_softmax(_wide(logits), dim=-1),
                links,
                batch.target,
                graph_lengths,
                batch.target_lengths,
                order=cfg.ngram_order,
            )
    out.stats["glanced"] = float(glanced.num_glanced.sum()) if glanced is not None else 0.0
    out.stats["target_tokens"] = float(batch.target_lengths.sum())
    out.stats["sentences"] = float(len(batch))
    return out


def _at_step(model, batch: Batch, cfg: ObjectiveConfig) -> LossOutput:
    prev = batch.target[:, :-1]  # (B, T−1): <s> y
    gold = batch.target[:, 1:]  # (B, T−1): y </s>
    token_logprobs = model(batch.source, prev)  # (B, T−1, V)
    with _fp32(token_logprobs.device):
        loss, nll = label_smoothed_nll(_wide(token_logprobs), gold, cfg.label_smoothing)
    ntokens = int((gold != PAD_ID).sum())
    stats = {
        "nll_sum": float(nll.detach().sum()),
        "target_tokens": float(batch.target_lengths.sum()),
        "sentences": float(len(batch)),
    }
    return LossOutput(loss_sum=loss.sum(), count=ntokens, stats=stats)


# Registry: objective name -> (architecture it trains, micro-batch step).
OBJECTIVES: dict[str, tuple[str, Callable[..., LossOutput]]] = {
    "nll": ("dat", _dat_step),
    "fuzzy": ("dat", _dat_step),
    "label_smoothed_ce": ("at", _at_step),
}


def compute_loss(model, batch: Batch, cfg: ObjectiveConfig) -> LossOutput:
    """Forward ``batch`` through ``model`` and apply the objective ``cfg.name``.

    DAG objectives: encoder once, glancing pass 1 without gradient (if p > 0), pass 2 under the
    same dropout seed, loss on pass 2 (anchor-spec §3). AT: teacher forcing with
    ``<s> y`` → ``y </s>``, label smoothing ε.

    Args:
        model: ``DATModel`` or ``ATModel`` (unwrapped), in train or eval mode.
        batch: a :class:`~fadat.data.contract.Batch` with targets, on the model's device.
        cfg: the :class:`ObjectiveConfig`.

    Returns:
        :class:`LossOutput` (``loss_sum`` carries the gradient).

    Raises:
        ValueError: unknown objective name.
    """
    if cfg.name not in OBJECTIVES:
        raise ValueError(f"unknown objective {cfg.name!r}; choose from {sorted(OBJECTIVES)}")
    return OBJECTIVES[cfg.name][1](model, batch, cfg)


__all__ = [
    "OBJECTIVES",
    "GlanceResult",
    "GlancingSchedule",
    "LossOutput",
    "ObjectiveConfig",
    "choose_glanced",
    "compute_loss",
    "decode_with_seed",
    "force_emit_match",
    "fuzzy_loss",
    "glance",
    "glance_count",
    "label_smoothed_nll",
    "nll_loss",
    "oracle_tokens",
    "parse_glancing_schedule",
]
