"""Glancing (GLAT, as DA-Transformer trains with it): the glancing-ratio schedule and the glancing
pass that reveals some reference tokens to the decoder input (docs/reference-behaviour.md,
"Glancing").

Pass 1 decodes the plain input without gradient under a dropout seed, aligns the reference with
the best path of the DAG, counts the vertices whose argmax is already right, and replaces
``floor((T − correct)·p + 0.5)`` aligned ``<unk>`` inputs by their oracle tokens; pass 2 (the
objective's) decodes that input under the same seed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from fadat import dag
from fadat.data.contract import PAD_ID
from fadat.objectives.losses import fit_rows, target_logprobs, widen

# --------------------------------------------------------------------------------------------
# Glancing-ratio schedule (docs/reference-behaviour.md, "Glancing", ``--glat-p "v0:v1@N"``)
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
        ``+ 1``, docs/reference-behaviour.md, "Glancing"); after the last knot its value.
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
    # The reference only expands "k" (to "000"), docs/reference-behaviour.md, "Glancing"; "m" is
    # added for convenience.
    match = re.fullmatch(r"(\d+)([km]?)", text.strip())
    if match is None:
        raise ValueError(f"bad update count {text!r} in glancing schedule {spec!r}")
    return int(match.group(1)) * {"": 1, "k": 1000, "m": 1_000_000}[match.group(2)]


def parse_glancing_schedule(spec: str | float) -> GlancingSchedule:
    """Parse a glancing-ratio schedule (docs/reference-behaviour.md, "Glancing").

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
# Glancing (docs/reference-behaviour.md, "Glancing")
# --------------------------------------------------------------------------------------------


def glance_count(
    target_lengths: torch.Tensor, num_correct: torch.Tensor, ratio: float
) -> torch.Tensor:
    """Number of glanced tokens per sentence, ``number-random`` strategy
    (docs/reference-behaviour.md, "Glancing").

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
    above the N-th largest score (docs/reference-behaviour.md, "Glancing").

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
    """What the glancing pass decided (docs/reference-behaviour.md, "Glancing").

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


def no_autocast(device: torch.device) -> torch.autocast:
    """Autocast off: the DAG math runs in fp32 whatever the network's autocast dtype."""
    return torch.autocast(device_type=device.type, enabled=False)


def draw_seed() -> int:
    """A dropout seed for one micro-batch, in ``[0, 2^62)``, drawn from torch's global RNG (so a
    run resumed with its RNG states restored draws the same seeds)."""
    return int(torch.randint(0, 2**62, (1,)).item())


@contextmanager
def forked_rng(device: torch.device, seed: int | None = None) -> Iterator[None]:
    """Run the block on a fork of torch's global RNG (the CPU generator and, for a CUDA
    ``device``, that device's), seeded with ``seed`` unless it is None; the global state is
    restored afterwards. Two blocks with the same seed draw identical dropout masks (the two
    glancing passes, docs/reference-behaviour.md, "Glancing"); an unseeded block leaves the
    training's random stream as it found it (validation)."""
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        if seed is not None:
            torch.manual_seed(seed)
        yield


def decode_with_seed(
    model, encoder_out, decoder_tokens: torch.Tensor, seed: int, logits: bool = False
):
    """Run ``model.decode`` (``model.decode_logits`` with ``logits=True``) in
    :func:`forked_rng` seeded with ``seed``, so two calls with the same seed draw identical
    dropout masks (docs/reference-behaviour.md, "Glancing")."""
    with forked_rng(decoder_tokens.device, seed):
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
    backend: str = "auto",
) -> GlanceResult:
    """Glancing pass 1 (docs/reference-behaviour.md, "Glancing"): decode the plain input without
    gradient under the dropout seed ``seed``, align the target with the best path of the DAG, count
    correct tokens, and choose ``floor((T − #correct)·p + 0.5)`` aligned vertices to reveal.

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
        backend: the best alignment's implementation, ``"auto"``, ``"torch"`` or ``"triton"``
            (:func:`fadat.dag.best_alignment_from_match`).

    Returns:
        A :class:`GlanceResult`. Sentences with T_b > L_b have no path and get no glance.
    """
    plain = model.decoder_input_tokens(graph_lengths)  # (B, L)
    with torch.no_grad():
        logits, links = decode_with_seed(model, encoder_out, plain, seed, logits=True)
    with torch.no_grad(), no_autocast(plain.device):
        links = widen(links)
        fits = target_lengths <= graph_lengths  # (B,)
        path = torch.full(plain.shape, -1, dtype=torch.int64, device=plain.device)  # (B, L)
        if bool(fits.any()):
            rows = fits.nonzero().squeeze(1)
            width = int(target_lengths[rows].max())
            match = target_logprobs(fit_rows(logits, rows), targets[rows, :width])  # (B', T', L)
            path[rows] = dag.best_alignment_from_match(
                match, links[rows], graph_lengths[rows], target_lengths[rows], backend=backend
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
