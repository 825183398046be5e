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
  (int8 weights per output channel, activations quantized per batch at run time;
  ``torch.ao.quantization.quantize_dynamic``); the links head stays fp32.

Their test BLEU is in RESULTS.md ("DAT inference against CTranslate2").
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fadat.data.contract import PAD_ID
from fadat.decoding import TOP1_STRATEGIES, VertexTop1, walk_links

PRECISIONS = ("fp32", "bf16", "int8")

# Rows of the token head computed at once: (256, 8000) fp32 logits are 8 MiB, about what the
# development machine's L2 + L3 share per core holds; the log-softmax then reads them from cache.
TOP1_BLOCK_ROWS = 256


def reads_top1_only(strategy: str, options: dict[str, Any]) -> bool:
    """Whether ``strategy`` with ``options`` reads the token head only through ``s_v`` and the
    argmax token (lookahead with n-gram bans reads each vertex's top candidates)."""
    if strategy not in TOP1_STRATEGIES:
        return False
    if strategy == "lookahead":
        bans = ("no_consecutive_repeated_ngram", "no_repeated_ngram")
        return not any(options.get(name, 0) for name in bans)
    return True


def precision_of(model: nn.Module) -> str:
    """The precision a model was converted to by :func:`with_precision` (``fp32`` if none)."""
    return getattr(model, "inference_precision", "fp32")


def with_precision(model: nn.Module, precision: str) -> nn.Module:
    """A DAT model for inference in ``precision`` (``fp32`` returns ``model`` itself).

    Args:
        model: a :class:`fadat.model.DATModel` in fp32.
        precision: one of :data:`PRECISIONS`.

    Returns:
        ``model`` (fp32) or a converted copy in eval mode, tagged ``inference_precision``.

    Raises:
        ValueError: unknown ``precision``, or bf16/int8 for a model that is not on the CPU (CPU
            autocast and dynamic quantization are CPU-only; on a GPU run fp32 or train-time
            autocast instead).
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


def vertex_top1_of_states(model: nn.Module, states: Tensor) -> tuple[Tensor, Tensor]:
    """``s`` and argmax token of the rows of ``states`` ``(N, d)``: ``(N,)`` fp32 and ``(N,)``
    int64, computed in blocks of :data:`TOP1_BLOCK_ROWS` rows (log-softmax in fp32)."""
    n = states.shape[0]
    s = torch.empty(n, dtype=torch.float32, device=states.device)
    tok = torch.empty(n, dtype=torch.int64, device=states.device)
    for start in range(0, n, TOP1_BLOCK_ROWS):
        block = _logits(model, states[start : start + TOP1_BLOCK_ROWS])  # (rows, V)
        best = torch.log_softmax(block.float(), dim=-1).max(dim=-1)  # (rows,) each
        s[start : start + TOP1_BLOCK_ROWS] = best.values
        tok[start : start + TOP1_BLOCK_ROWS] = best.indices
    return s, tok


def graph_top1(
    model: nn.Module, source: Tensor, path_only: bool = False
) -> tuple[VertexTop1, Tensor, Tensor]:
    """One decoder pass on the decoding graph, reduced to what the top-1 decoders read.

    Args:
        model: a :class:`fadat.model.DATModel`, possibly converted by :func:`with_precision`.
        source: ``(B, S)`` int64 ``x </s>``, right-padded.
        path_only: compute ``s``/argmax only on the vertices of the greedy path (the argmax
            walk of the links); other vertices get ``s = 0`` and ``<pad>``. For greedy only.

    Returns:
        ``(top1, links, graph_lengths)``: :class:`VertexTop1` ``(B, L)``, ``(B, L, L)`` fp32
        links, ``(B,)`` int64 graph sizes.
    """
    with torch.inference_mode(), precision_autocast(model):
        graph_lengths = model.graph_lengths(source.ne(PAD_ID).sum(dim=1), decoding=True)  # (B,)
        decoder_tokens = model.decoder_input_tokens(graph_lengths)  # (B, L)
        states = model.decoder_states(model.encode(source), decoder_tokens)  # (B, L, d)
        links = model.links_head(states, graph_lengths)  # (B, L, L) fp32
        b, size, _ = states.shape
        if path_only:
            paths, _ = walk_links(links, graph_lengths)  # (B, K): rows repeat their end vertex
            wanted = torch.zeros(b, size, dtype=torch.bool, device=states.device)
            wanted.scatter_(1, paths, True)  # (B, L)
        else:
            vertex = torch.arange(size, device=states.device)
            wanted = vertex[None, :] < graph_lengths[:, None]  # (B, L): no padding rows
        s = torch.zeros(b, size, dtype=torch.float32, device=states.device)
        tok = torch.full((b, size), PAD_ID, dtype=torch.int64, device=states.device)
        s[wanted], tok[wanted] = vertex_top1_of_states(model, states[wanted])
    return VertexTop1(s, tok), links, graph_lengths
