"""The DAT's fast inference path: one decoder pass that computes only what the chosen decoder
reads, in fp32, bf16 or int8 weights.

Greedy, lookahead, Viterbi and joint-Viterbi read the token head only through each vertex's
best token and its log-probability ``s_v = max_y log P(y|v)`` (:class:`fadat.decoding.VertexTop1`);
the ``(B, L, V)`` fp32 log-probabilities the training objectives need are never built here:

- the token head runs on the graph's real vertices only (no padding rows), in blocks of
  ``TOP1_BLOCK_ROWS`` rows whose ``(rows, V)`` logits and log-softmax stay in the CPU's cache;
- greedy does not read ``s`` to choose its path: the links are computed first and the token
  head runs on the path's vertices only (about ``1/λ`` of them);
- everything runs under ``torch.inference_mode``.

In fp32 the per-row arithmetic is the full path's (the same logits and log-softmax of each
vertex), so the decoders' outputs are the same (tests/test_inference.py). Lower precisions
(:func:`with_precision`):

- ``bf16``: a copy whose linear layers and embeddings hold bfloat16 weights, run under CPU
  autocast (LayerNorm, softmax, the links head and the log-softmax stay fp32);
- ``int8``: a copy whose linear layers and output projection are dynamically quantized
  (symmetric int8 weights with one scale per weight matrix, activations quantized per batch at
  run time; ``torch.ao.quantization.quantize_dynamic`` with its default qconfig, whose weights
  are ``torch.per_tensor_affine``); the links head stays fp32. The ONNX export's int8
  (:mod:`fadat.translation.onnx_export`) keeps one scale per output channel instead.

Their test BLEU is in docs/results/precision.md.

Two ways to compute less of the token head (issue 34), both off by default:

- a vocabulary shortlist (:mod:`fadat.models.shortlist`): each sentence's vertices take their best
  token and ``s_v`` over the sentence's candidate tokens only, the log-softmax renormalised over
  them (Marian's and CTranslate2's approximation); in int8 the shortlist's rows of the output
  projection are its int8 weights dequantized and multiplied in fp32;
- pruning (``prune_threshold`` τ): the token head runs only on the vertices whose passing
  probability under the links (:func:`fadat.dag.passing_probabilities`, paper Eq. 16) is at
  least τ, plus the argmax-link successor of every kept vertex (so a walk never meets a vertex
  without a kept successor); the others get ``s = −inf`` and ``<pad>``. Exact: a decoder whose
  full-head path visits only kept vertices gives the same output (lookahead picks the same
  argmax at every vertex of that path; joint-Viterbi's optimum and its length are unchanged).
"""

from __future__ import annotations

import copy
import warnings
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fadat.dag import passing_probabilities
from fadat.data.contract import PAD_ID
from fadat.decoding import VertexTop1, walk_links
from fadat.errors import EmulatedBF16Warning
from fadat.models.architectures import check_finite
from fadat.process import native_bf16

if TYPE_CHECKING:
    from fadat.models.shortlist import Shortlist

PRECISIONS = ("fp32", "bf16", "int8")

# Rows of the token head computed at once: (256, 8000) fp32 logits are 8 MiB, about what the
# development machine's L2 + L3 share per core holds; the log-softmax then reads them from cache.
TOP1_BLOCK_ROWS = 256


def precision_of(model: nn.Module) -> str:
    """The precision a model was converted to by :func:`with_precision` (``fp32`` if none)."""
    return getattr(model, "inference_precision", "fp32")


def with_precision(model: nn.Module, precision: str) -> nn.Module:
    """A DAT model for inference in ``precision`` (``fp32`` returns ``model`` itself).

    Args:
        model: a :class:`fadat.models.dat.DATModel` in fp32.
        precision: one of :data:`PRECISIONS`.

    Returns:
        ``model`` (fp32) or a converted copy in eval mode, tagged ``inference_precision``.

    Raises:
        ValueError: unknown ``precision``, or bf16/int8 for a model that is not on the CPU (CPU
            autocast and dynamic quantization are CPU-only; on a GPU run fp32 or train-time
            autocast instead).

    Warns:
        EmulatedBF16Warning: bf16 on a CPU without bf16 hardware (:func:`fadat.process.native_bf16`;
            on an AVX2-only AMD Zen 3 a bf16 matrix product took 33× as long as fp32).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp32":
        return model
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ValueError(
            f"precision {precision!r} converts models on the CPU; this one is on {device}"
        )
    if precision == "bf16" and not native_bf16("cpu"):
        warnings.warn(
            EmulatedBF16Warning(
                "bf16 precision on a CPU without bf16 hardware (AVX-512 BF16 or AMX): "
                "emulated bf16 is slower than fp32 here; int8 is the fastest precision on "
                "such a CPU"
            ),
            stacklevel=2,
        )
    out = copy.deepcopy(model).eval()
    heads = {"links_head"}  # stays fp32: small, and its links feed every decision
    if precision == "bf16":
        for name, module in out.named_modules():
            if name.split(".")[0] in heads:
                continue
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.to(torch.bfloat16)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
            for name, child in out.named_children():
                if name not in heads:
                    torch.ao.quantization.quantize_dynamic(
                        child, {nn.Linear}, dtype=torch.qint8, inplace=True
                    )
            projection = nn.Linear(model.config.d_model, model.config.vocab_size, bias=False)
            projection.weight = nn.Parameter(model.output_weight.detach().clone())
            out.int8_output = torch.ao.quantization.quantize_dynamic(
                nn.Sequential(projection), {nn.Linear}, dtype=torch.qint8
            )
    out.inference_precision = precision
    return out


def with_reduced_head(
    model: nn.Module, shortlist: Shortlist | None = None, prune_threshold: float | None = None
) -> nn.Module:
    """Tag ``model`` (in place) so that :meth:`fadat.models.dat.DATModel.translate_batch` runs the
    top-1 decoders with ``shortlist`` and ``prune_threshold`` (see :func:`graph_top1`);
    ``None`` turns each off. Returns ``model``.

    Raises:
        ValueError: ``prune_threshold`` outside ``[0, 1]``; a shortlist for another vocabulary.
    """
    if prune_threshold is not None and not 0.0 <= prune_threshold <= 1.0:
        raise ValueError(f"prune threshold must lie in [0, 1], got {prune_threshold}")
    if shortlist is not None and shortlist.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"the shortlist is for a vocabulary of {shortlist.vocab_size}, the model has "
            f"{model.config.vocab_size}"
        )
    model.inference_shortlist = shortlist
    model.inference_prune_threshold = prune_threshold
    return model


def precision_autocast(model: nn.Module):
    """The autocast context a model converted by :func:`with_precision` runs in (bf16: CPU
    autocast to bfloat16; otherwise a disabled one)."""
    enabled = precision_of(model) == "bf16"
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


def _logits(model: nn.Module, states: Tensor) -> Tensor:
    """``(N, d)`` -> ``(N, V)`` logits of the output projection in the model's precision."""
    if precision_of(model) == "int8":
        return model.int8_output(states.float())
    return F.linear(states, model.output_weight)


def head_weight(model: nn.Module) -> Tensor:
    """``(V, d)`` output projection of the token head in the model's precision: the fp32 or
    bf16 weights, or for int8 the int8 weights dequantized to fp32 (computed once, kept on the
    model)."""
    if precision_of(model) != "int8":
        return model.output_weight
    weight = getattr(model, "int8_output_dequantized", None)
    if weight is None:
        weight = model.int8_output[0].weight().dequantize()  # (V, d) fp32
        model.int8_output_dequantized = weight
    return weight


def vertex_top1_of_states(
    model: nn.Module, states: Tensor, candidates: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """``s`` and argmax token of the rows of ``states`` ``(N, d)``: ``(N,)`` fp32 and ``(N,)``
    int64, computed in blocks of :data:`TOP1_BLOCK_ROWS` rows (log-softmax in fp32).

    With ``candidates`` ``(n,)`` int64 (a sentence's shortlist, sorted), only those rows of the
    output projection (:func:`head_weight`) are used and the log-softmax runs over them.
    """
    n = states.shape[0]
    s = torch.empty(n, dtype=torch.float32, device=states.device)
    tok = torch.empty(n, dtype=torch.int64, device=states.device)
    weight = None if candidates is None else head_weight(model)[candidates]  # (n_c, d)
    int8 = precision_of(model) == "int8"
    for start in range(0, n, TOP1_BLOCK_ROWS):
        rows = states[start : start + TOP1_BLOCK_ROWS]  # (rows, d)
        if weight is None:
            block = _logits(model, rows)  # (rows, V)
        else:
            block = F.linear(rows.float() if int8 else rows, weight)  # (rows, n_c)
        best = torch.log_softmax(block.float(), dim=-1).max(dim=-1)  # (rows,) each
        s[start : start + TOP1_BLOCK_ROWS] = best.values
        index = best.indices if candidates is None else candidates[best.indices]
        tok[start : start + TOP1_BLOCK_ROWS] = index
    return s, tok


def kept_vertices(links: Tensor, graph_lengths: Tensor, threshold: float) -> Tensor:
    """The vertices whose token head pruning computes (see the module docstring).

    Args:
        links: ``(B, L, L)`` fp32 log transition probabilities.
        graph_lengths: ``(B,)`` int64.
        threshold: τ in ``[0, 1]``; ``0`` keeps every real vertex.

    Returns:
        ``(B, L)`` bool: real vertices with passing probability ≥ τ, vertex 0, the end vertex, and
        the argmax-link successor of every kept vertex before the end.

    Raises:
        ValueError: ``threshold`` outside ``[0, 1]``.
    """
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"prune threshold must lie in [0, 1], got {threshold}")
    b, size, _ = links.shape
    vertex = torch.arange(size, device=links.device)  # (L,)
    real = vertex[None, :] < graph_lengths[:, None]  # (B, L)
    end = vertex[None, :] == graph_lengths[:, None] - 1  # (B, L)
    keep = (passing_probabilities(links, graph_lengths) >= threshold) & real  # (B, L)
    keep[:, 0] = True
    keep |= end
    successor = links.argmax(dim=2)  # (B, L): the end vertex and padding rows point at 0
    while True:  # close under "successor of a kept vertex": a few rounds at most in practice
        add = torch.zeros_like(keep)
        add.scatter_(1, torch.where(keep & ~end & real, successor, 0), True)  # (B, L)
        grown = keep | (add & real)
        if torch.equal(grown, keep):
            return keep
        keep = grown


def graph_top1(
    model: nn.Module,
    source: Tensor,
    path_only: bool = False,
    shortlist: Shortlist | None = None,
    prune_threshold: float | None = None,
    return_states: bool = False,
    upsample_ratio: float | None = None,
) -> tuple[VertexTop1, Tensor, Tensor] | tuple[VertexTop1, Tensor, Tensor, Tensor]:
    """One decoder pass on the decoding graph, reduced to what the top-1 decoders read.

    Args:
        model: a :class:`fadat.models.dat.DATModel`, possibly converted by :func:`with_precision`.
        source: ``(B, S)`` int64 ``x </s>``, right-padded.
        path_only: compute ``s``/argmax only on the vertices of the greedy path (the argmax
            walk of the links); other vertices get ``s = 0`` and ``<pad>``. For greedy only.
        shortlist: take each vertex's best token over its sentence's shortlist candidates
            (:meth:`fadat.models.shortlist.Shortlist.candidates` of its source), renormalised.
        prune_threshold: compute the token head only on :func:`kept_vertices` (passing
            probability ≥ τ); the others get ``s = −inf`` and ``<pad>``. Ignored with
            ``path_only``, which computes less.
        return_states: also return the decoder states ``(B, L, d)`` (for
            :func:`output_match`: ``log P(y|x)`` of the outputs from this same pass).
        upsample_ratio: the decoding λ; ``None`` = the model's (``decoding_upsample_ratio``).

    Returns:
        ``(top1, links, graph_lengths)``: :class:`VertexTop1` ``(B, L)``, ``(B, L, L)`` fp32
        links, ``(B,)`` int64 graph sizes; then the states when ``return_states``.

    Raises:
        ValueError: ``prune_threshold`` outside ``[0, 1]``; a shortlist for another vocabulary.
        NonFiniteOutputError: NaN or +inf links or ``s``
            (:func:`fadat.models.architectures.check_finite`).
    """
    if shortlist is not None and shortlist.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"the shortlist is for a vocabulary of {shortlist.vocab_size}, the model has "
            f"{model.config.vocab_size}"
        )
    with torch.inference_mode(), precision_autocast(model):
        source_lengths = source.ne(PAD_ID).sum(dim=1)  # (B,)
        graph_lengths = model.graph_lengths(source_lengths, True, upsample_ratio)  # (B,)
        decoder_tokens = model.decoder_input_tokens(graph_lengths)  # (B, L)
        states = model.decoder_states(model.encode(source), decoder_tokens)  # (B, L, d)
        links = check_finite(model.links_head(states, graph_lengths), "link scores")  # (B, L, L)
        b, size, _ = states.shape
        vertex = torch.arange(size, device=states.device)
        real = vertex[None, :] < graph_lengths[:, None]  # (B, L): no padding rows
        s = torch.zeros(b, size, dtype=torch.float32, device=states.device)
        if path_only:
            paths, _ = walk_links(links, graph_lengths)  # (B, K): rows repeat their end vertex
            wanted = torch.zeros(b, size, dtype=torch.bool, device=states.device)
            wanted.scatter_(1, paths, True)  # (B, L)
        elif prune_threshold is not None:
            wanted = kept_vertices(links, graph_lengths, prune_threshold)  # (B, L)
            s.masked_fill_(real & ~wanted, float("-inf"))  # pruned: no decoder may pick them
        else:
            wanted = real
        tok = torch.full((b, size), PAD_ID, dtype=torch.int64, device=states.device)
        if shortlist is None:
            s[wanted], tok[wanted] = vertex_top1_of_states(model, states[wanted])
        else:
            for row in range(b):  # each sentence its own candidates
                cand = torch.from_numpy(shortlist.candidates(source[row])).to(states.device)
                rows = wanted[row]  # (L,)
                s[row, rows], tok[row, rows] = vertex_top1_of_states(model, states[row, rows], cand)
        check_finite(s, "token log-probabilities")
    if return_states:
        return VertexTop1(s, tok), links, graph_lengths, states
    return VertexTop1(s, tok), links, graph_lengths


def output_match(model: nn.Module, states: Tensor, targets: Tensor) -> Tensor:
    """``match[b, t, v] = log p_v(y_t)`` of the full model for given outputs, from the states
    of one decoder pass (the input of :func:`fadat.dag.dag_log_likelihood_from_match`).

    Exact whatever shortlist or pruning the decoder used: the log-softmax normaliser of each
    vertex runs over the full vocabulary (:func:`_logits`, in blocks of
    :data:`TOP1_BLOCK_ROWS` vertices, fp32), so the result is the ``log P(y|x)`` that
    ``fadat score`` computes (paper Eq. 3), at the cost of the full token head once.

    Args:
        model: a :class:`fadat.models.dat.DATModel`, possibly converted by :func:`with_precision`.
        states: ``(B, L, d)`` decoder states (:func:`graph_top1` with ``return_states``).
        targets: ``(B, T)`` int64 ``<s> y </s>`` right-padded with ``<pad>``.

    Returns:
        ``(B, T, L)`` fp32; padded target positions hold the ``<pad>`` log-prob (ignored by the
        DP past ``T_b``).

    Raises:
        NonFiniteOutputError: NaN or +inf log-probs
            (:func:`fadat.models.architectures.check_finite`; a NaN or +inf logit anywhere in a
            vertex's row makes its normaliser, and so every gathered entry of that vertex, NaN).
    """
    b, size, d = states.shape
    flat = states.reshape(b * size, d)  # (B·L, d)
    owner = torch.arange(b, device=states.device).repeat_interleave(size)  # (B·L,)
    match = torch.empty(b * size, targets.shape[1], dtype=torch.float32, device=states.device)
    for start in range(0, b * size, TOP1_BLOCK_ROWS):
        stop = start + TOP1_BLOCK_ROWS
        block = torch.log_softmax(_logits(model, flat[start:stop]).float(), dim=-1)  # (rows, V)
        match[start:stop] = block.gather(1, targets[owner[start:stop]])  # (rows, T)
    match = match.view(b, size, -1).transpose(1, 2)  # (B, T, L)
    return check_finite(match, "token log-probabilities")
