"""``fadat export --format onnx``: a DAT model directory as a self-contained ONNX Runtime engine
directory (docs/engine.md).

The directory holds:

- ``dat.onnx``: one graph, the DAT's encoder, decoder, token head reduced to each vertex's ``k``
  best tokens (what the beam search reads; their first is what greedy, lookahead, Viterbi and
  joint-Viterbi read: :class:`DATGraph`) and links head. Inputs ``source`` ``(batch,
  source_length)`` int64 ``x </s>`` right-padded with ``<pad>``, ``decoder_tokens`` ``(batch,
  graph_size)`` int64 ``[<s>, <unk> × (L_b − 2), </s>, <pad> …]``; outputs (:data:`OUTPUT_NAMES`)
  ``s`` ``(batch, graph_size)`` fp32, ``tok`` ``(batch, graph_size)`` int64, ``links`` ``(batch,
  graph_size, graph_size)`` fp32, ``top_lp`` ``(batch, graph_size, k)`` fp32 and ``top_tok``
  ``(batch, graph_size, k)`` int64. The axes are dynamic and carry those names; ``k`` is fixed
  at export (``top_k``, :data:`TOP_K` by default: ``fadat export --format onnx --top-k K``).
- ``metadata.json``: the format version (:data:`FORMAT_VERSION`), the decoding λ
  (``upsample_ratio``), the size limits, the special-token contract, ``top_k``, the precision,
  the opset and the versions of fadat, torch and onnx that wrote it (:data:`METADATA`).
- ``spm.model``: the model's sentencepiece model.
- with a vocabulary shortlist (``shortlist=``, ``fadat export --format onnx --shortlist``):
  ``shortlist.safetensors``, a copy of the shortlist file, named in ``metadata.json``'s
  ``shortlist`` (the file, the input, :data:`SHORTLIST_CONTRACT`, the shortlist's settings),
  and a graph (:class:`ShortlistDATGraph`) with a third input ``candidates`` ``(batch,
  candidates)`` int64: each sentence's candidate ids
  (:meth:`fadat.engine.shortlist.Shortlist.candidates`, the torch engine's rule), sorted,
  padded with −1 to the batch's width and at least ``k`` columns. Its token head gathers those
  rows of the (bias-free) output projection, masks padding columns to −inf before the
  log-softmax (so padding changes no sentence's result), renormalises the log-softmax over the
  candidates and maps the best columns back to full-vocabulary ids: the same five outputs,
  what :func:`fadat.models.inference.graph_top1` computes with a shortlist (plus the top
  ``k``). The format version stays 2: the new input cannot be misread, a reader that lacks it
  fails on it.

Export: ``torch.onnx.export(..., dynamo=True)`` (the ``torch.export``-based exporter, torch's
default since 2.9; the TorchScript one is deprecated). Precisions (:data:`PRECISIONS`):

- ``fp32``: the graph as exported;
- ``int8``: ONNX Runtime's dynamic quantization of the fp32 graph
  (``onnxruntime.quantization.quantize_dynamic``: int8 weights per output channel, activations
  quantized per batch at run time) of the ``MatMul`` s outside the links head, which stays fp32
  as in fadat's own int8 (:func:`fadat.models.inference.with_precision`); the token head's
  shared weight is folded first so that it is quantized too, as in fadat's int8. A shortlisted
  token head multiplies by rows gathered at run time, which dynamic quantization does not
  quantize: it runs in fp32 on the output projection rounded to int8 and back as the full head's
  weight would be (one scale per token; :func:`dequantized_shortlist_head`), the int8 weights'
  rows multiplied in fp32 as fadat's int8 path does with a shortlist
  (:func:`fadat.models.inference.head_weight`); the copy costs ``V·d`` fp32 weights on disk.

Attention (``attention=``, :data:`ATTENTION`): ``"fused"`` (the default) exports each of the
9 attention blocks (query/key/value after their projections, the key padding mask) as one
ONNX Runtime contrib op ``com.microsoft.MultiHeadAttention`` (:func:`fused_attention`), in place
of the ≈ 15 standard ops (reshapes, transposes, two MatMuls, the boolean mask's ``Where``, the
softmax and its NaN guard) that ``scaled_dot_product_attention`` exports to; such a graph runs in
ONNX Runtime only. ``"standard"`` keeps the standard ONNX ops (any ONNX runtime; slower in ONNX
Runtime).

Two rewrites make the graph faster in ONNX Runtime without changing what it computes:
:func:`decompose_logsumexp` (both precisions) and :func:`fold_transposed_weights` (int8).

bf16 is not offered: ONNX Runtime's CPU execution provider (1.32) has no bfloat16 kernel for
``MatMul``, ``Gemm``, ``Add`` or ``ReduceMax`` (``NOT_IMPLEMENTED`` when a session is created).

The graph runs in :class:`fadat.engine.runtime.OnnxDAT` (onnxruntime, numpy and sentencepiece
only). Needs ``pip install 'fadat[onnx]'`` (onnx, onnxruntime, onnxscript).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from fadat.engine.runtime import CANDIDATES, FORMAT_VERSION, TOP_K
from fadat.engine.shortlist import PAD_CANDIDATE, SHORTLIST_NAME
from fadat.errors import InputError
from fadat.models.directory import load_pretrained, read_model_metadata, spm_model_path
from fadat.models.transformer import CrossAttention, SelfAttention
from fadat.outputs import (
    check_not_input,
    check_output_dir,
    check_replaceable,
    replace_dir,
    staging_dir,
)

KIND = "onnx-engine"  # the output directory's kind (fadat.outputs)
PRECISIONS = ("fp32", "int8")
GRAPH_FILE = "dat.onnx"
METADATA = "metadata.json"
OPSET = 18
INPUT_NAMES = ("source", "decoder_tokens")
#: The third input of a shortlisted graph (``fadat export --shortlist``) and its second axis.
SHORTLIST_INPUT = CANDIDATES
SHORTLIST_AXIS = "candidates"
#: The graph's outputs (format version 2; version 1 had the first three only).
OUTPUT_NAMES = ("s", "tok", "links", "top_lp", "top_tok")
ATTENTION = ("fused", "standard")
#: What ``metadata.json`` says of a shortlisted graph's third input (``shortlist.contract``).
SHORTLIST_CONTRACT = (
    "candidates: (batch, candidates) int64, each sentence's candidate token ids (the "
    "shortlist file's frequent tokens and the table rows of its source tokens), sorted, padded "
    "with -1 to the batch's width, at least top_k columns; the outputs s, tok, top_lp and "
    "top_tok are over the sentence's candidates: log P(token|vertex) renormalised over them, "
    "ids in the full vocabulary (a sentence with fewer than top_k candidates has -inf and pad "
    "in its last top_lp and top_tok columns)"
)
FUSED_ATTENTION_OP = "com.microsoft.MultiHeadAttention"


def _require_onnx():
    try:
        import onnx
        import onnxruntime
        import onnxscript  # noqa: F401  (the dynamo exporter's ONNX builder)
    except ImportError as err:
        raise InputError(
            f"the onnx format needs {err.name}: pip install 'fadat[onnx]' "
            "(onnx, onnxruntime, onnxscript)"
        ) from err
    return onnx, onnxruntime


class DATGraph(nn.Module):
    """The part of a DAT that the engine exports: what :func:`fadat.models.inference.graph_top1`
    computes in fp32 without a shortlist or pruning, plus each vertex's ``top_k`` best tokens
    (what :func:`fadat.decoding.beam.top_candidates` gives the beam search), as one module with
    tensor inputs.

    Args:
        model: a :class:`fadat.models.dat.DATModel` (fp32, eval mode).
        top_k: tokens per vertex in ``top_lp``/``top_tok``, ``1 ≤ top_k ≤ V``.
    """

    def __init__(self, model: nn.Module, top_k: int = TOP_K) -> None:
        super().__init__()
        self.model = model
        self.top_k = top_k

    def forward(
        self, source: Tensor, decoder_tokens: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """``source`` ``(B, S)`` int64 and ``decoder_tokens`` ``(B, L)`` int64 (module docstring)
        → ``s`` ``(B, L)`` fp32 (``max_y log P(y|v)``, 0 at padding vertices), ``tok`` ``(B, L)``
        int64 (its argmax, the lowest id on ties; ``<pad>`` at padding vertices), ``links``
        ``(B, L, L)`` fp32 (:func:`fadat.models.dat.transition_log_probs`), ``top_lp`` ``(B, L,
        k)`` fp32 and ``top_tok`` ``(B, L, k)`` int64: the ``k`` largest log-probabilities of
        every vertex and their token ids, descending (0 and ``<pad>`` in every column at padding
        vertices).

        One ``topk`` gives all four token outputs: ``s`` and ``tok`` are its first column. In
        the exported graph it is ONNX's ``TopK`` (``largest``, ``sorted``), which puts the lower
        index first among equal values, so the tokens follow the tie rule of
        :func:`~fadat.decoding.beam.top_candidates` and ``tok`` is the lowest id of the maximum,
        as ``argmax`` (ONNX Runtime's CPU kernel does so: tests/test_engine_onnx.py). In eager
        PyTorch ``torch.topk`` orders equal values arbitrarily."""
        m = self.model
        graph_lengths = decoder_tokens.ne(PAD_ID).sum(dim=1)  # (B,)
        states = m.decoder_states(m.encode(source), decoder_tokens)  # (B, L, d)
        links = m.links_head(states, graph_lengths)  # (B, L, L)
        logp = torch.log_softmax(m.token_logits(states).float(), dim=-1)  # (B, L, V)
        top_lp, top_tok = logp.topk(self.top_k, dim=-1)  # (B, L, k), (B, L, k) descending
        real = decoder_tokens.ne(PAD_ID)[..., None]  # (B, L, 1)
        top_lp = torch.where(real, top_lp, torch.zeros((), dtype=top_lp.dtype))
        top_tok = torch.where(real, top_tok, torch.full((), PAD_ID, dtype=top_tok.dtype))
        return top_lp[..., 0], top_tok[..., 0], links, top_lp, top_tok


class ShortlistHead(nn.Module):
    """The token head over each sentence's shortlist candidates (:mod:`fadat.models.shortlist`),
    what :func:`fadat.models.inference.vertex_top1_of_states` computes with ``candidates``: the
    candidates' rows of the output projection, the log-softmax over them, each vertex's
    ``top_k`` best, mapped back to full-vocabulary ids. Its own module so that the exporter
    scopes its nodes ``shortlist_head`` (:func:`quantize_int8` finds them by it)."""

    def forward(
        self, states: Tensor, weight: Tensor, candidates: Tensor, top_k: int
    ) -> tuple[Tensor, Tensor]:
        """``states`` ``(B, L, d)``, ``weight`` ``(V, d)`` (bias-free), ``candidates`` ``(B, K)``
        int64 ids, :data:`~fadat.engine.shortlist.PAD_CANDIDATE` (−1) in padding columns, ``K
        ≥ top_k`` → ``top_lp`` ``(B, L, k)`` fp32 (descending; −inf only where a sentence has
        fewer than ``k`` candidates) and ``top_tok`` ``(B, L, k)`` int64 full-vocabulary ids
        (``<pad>`` for a padding column).

        A padding column's logit is −inf before the log-softmax, so it adds nothing to any
        normaliser and the outputs do not depend on the batch's width. ``TopK`` puts the lower
        column first among equal values; candidates are sorted, so that is the lower id."""
        real = candidates.ge(0)  # (B, K)
        ids = torch.where(real, candidates, torch.full((), PAD_ID, dtype=candidates.dtype))
        rows = F.embedding(ids, weight)  # (B, K, d) the candidates' rows
        logits = torch.matmul(states, rows.transpose(1, 2)).float()  # (B, L, K)
        logits = logits.masked_fill(~real[:, None, :], float("-inf"))
        logp = torch.log_softmax(logits, dim=-1)  # (B, L, K) renormalised over the candidates
        top_lp, column = logp.topk(top_k, dim=-1)  # (B, L, k), (B, L, k)
        top_tok = ids.gather(1, column.flatten(1)).view_as(column)  # (B, L, k) vocabulary ids
        return top_lp, top_tok


class ShortlistDATGraph(DATGraph):
    """:class:`DATGraph` with a vocabulary shortlist (``fadat export --format onnx
    --shortlist``): the same outputs from the token head over each sentence's candidates
    (:class:`ShortlistHead`), what :func:`fadat.models.inference.graph_top1` computes in fp32
    with a shortlist, plus each vertex's ``top_k`` best candidates for the beam search.

    Args:
        model: a :class:`fadat.models.dat.DATModel` (fp32, eval mode).
        top_k: tokens per vertex in ``top_lp``/``top_tok``, ``1 ≤ top_k ≤ V``.
    """

    def __init__(self, model: nn.Module, top_k: int = TOP_K) -> None:
        super().__init__(model, top_k)
        self.shortlist_head = ShortlistHead()

    def forward(  # type: ignore[override]
        self, source: Tensor, decoder_tokens: Tensor, candidates: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """``source`` ``(B, S)``, ``decoder_tokens`` ``(B, L)`` int64 as :class:`DATGraph`'s,
        ``candidates`` ``(B, K)`` int64 (each sentence's sorted candidate ids, padded with −1 to
        ``K ≥ top_k``; :meth:`fadat.engine.shortlist.Shortlist.batch_candidates`) → the outputs
        of :meth:`DATGraph.forward` over the candidates: ``s``, ``tok``, ``links``, ``top_lp``,
        ``top_tok``, token ids in the full vocabulary, ``s`` renormalised over the
        candidates."""
        m = self.model
        graph_lengths = decoder_tokens.ne(PAD_ID).sum(dim=1)  # (B,)
        states = m.decoder_states(m.encode(source), decoder_tokens)  # (B, L, d)
        links = m.links_head(states, graph_lengths)  # (B, L, L)
        top_lp, top_tok = self.shortlist_head(states, m.output_weight, candidates, self.top_k)
        real = decoder_tokens.ne(PAD_ID)[..., None]  # (B, L, 1)
        top_lp = torch.where(real, top_lp, torch.zeros((), dtype=top_lp.dtype))
        top_tok = torch.where(real, top_tok, torch.full((), PAD_ID, dtype=top_tok.dtype))
        return top_lp[..., 0], top_tok[..., 0], links, top_lp, top_tok


# ----------------------------------------------------------------------------------------------
# Fused attention: one ONNX Runtime contrib op per attention block


@torch.library.custom_op("fadat::key_masked_attention", mutates_args=())
def key_masked_attention(
    query: Tensor, key: Tensor, value: Tensor, keep: Tensor, heads: int
) -> Tensor:
    """Multi-head scaled dot-product attention on unsplit heads, the semantics of ONNX Runtime's
    ``com.microsoft.MultiHeadAttention`` with a 2-D key padding mask (ONNX Runtime's contrib-op
    reference, ContribOperators.md in its repository): ``query`` ``(B, T, d)``, ``key`` and
    ``value`` ``(B, S, d)`` fp32 (after their projections), ``keep`` ``(B, S)`` int32 (1 =
    attend, 0 = padding), ``heads`` dividing ``d``; returns ``(B, T, d)``, scores scaled by
    ``1/√(d/heads)``.

    A torch custom op (``torch.ops.fadat.key_masked_attention``) so that the exporter sees one
    node, which :func:`export_graph` translates into the contrib op; in PyTorch it computes the
    same as :class:`fadat.models.transformer.SelfAttention`'s attention.
    """
    b, t, d = query.shape
    s, dh = key.shape[1], d // heads

    def split(x: Tensor, n: int) -> Tensor:
        return x.reshape(b, n, heads, dh).transpose(1, 2)  # (B, h, n, d_h)

    mask = keep.bool()[:, None, None, :]  # (B, 1, 1, S)
    out = F.scaled_dot_product_attention(split(query, t), split(key, s), split(value, s), mask)
    return out.transpose(1, 2).reshape(b, t, d)


@key_masked_attention.register_fake
def _(query: Tensor, key: Tensor, value: Tensor, keep: Tensor, heads: int) -> Tensor:
    return torch.empty_like(query)


def _keep(mask: Tensor | None, like: Tensor) -> Tensor:
    """``(B, 1, 1, S)`` SDPA boolean key mask (True = attend) → ``(B, S)`` int32 (all ones for
    ``None``, keys of ``like`` ``(B, S, d)``)."""
    if mask is None:
        return torch.ones(like.shape[:2], dtype=torch.int32, device=like.device)
    return mask[:, 0, 0, :].to(torch.int32)


def _fused_self_attention(
    self: SelfAttention,
    x: Tensor,
    attn_mask: Tensor | None = None,
    causal: bool = False,
    cache: dict[str, Tensor] | None = None,
) -> Tensor:
    if causal or cache is not None:
        raise ValueError("fused attention is exported for the DAT's bidirectional attention only")
    q, k, v = self.in_proj(x).chunk(3, dim=-1)  # (B, T, d) each
    out = torch.ops.fadat.key_masked_attention(q, k, v, _keep(attn_mask, k), self.heads)
    return self.out_proj(out)


def _fused_cross_attention(
    self: CrossAttention,
    x: Tensor,
    memory: Tensor,
    memory_mask: Tensor,
    cache: dict[str, Tensor] | None = None,
) -> Tensor:
    if cache is not None:
        raise ValueError("fused attention is exported without a key/value cache")
    k, v = self.kv_proj(memory).chunk(2, dim=-1)  # (B, S, d) each
    out = torch.ops.fadat.key_masked_attention(
        self.q_proj(x), k, v, _keep(memory_mask, k), self.heads
    )
    return self.out_proj(out)


@contextlib.contextmanager
def fused_attention(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, every :class:`SelfAttention` and :class:`CrossAttention` of ``model``
    computes through :func:`key_masked_attention` (same weights, same result up to summation
    order); restored on exit. For export only: no causal mask, cache or dropout."""
    patched = []
    try:
        for module in model.modules():
            if isinstance(module, SelfAttention):
                module.forward = types.MethodType(_fused_self_attention, module)
            elif isinstance(module, CrossAttention):
                module.forward = types.MethodType(_fused_cross_attention, module)
            else:
                continue
            patched.append(module)
        yield model
    finally:
        for module in patched:
            del module.forward


def _multi_head_attention_translation():
    """The exporter's translation of :func:`key_masked_attention`: one
    ``com.microsoft.MultiHeadAttention`` node (query, key, value, no bias, the key padding
    mask; attribute ``num_heads``). The op's schema is not in onnx, so a minimal one is given
    for the inputs used."""
    import onnxscript
    from onnx.defs import OpSchema

    optional = OpSchema.FormalParameterOption.Optional
    schema = OpSchema(
        "MultiHeadAttention",
        "com.microsoft",
        1,
        inputs=[
            OpSchema.FormalParameter("query", "T"),
            OpSchema.FormalParameter("key", "T"),
            OpSchema.FormalParameter("value", "T"),
            OpSchema.FormalParameter("bias", "T", param_option=optional),
            OpSchema.FormalParameter("key_padding_mask", "M", param_option=optional),
        ],
        outputs=[OpSchema.FormalParameter("output", "T")],
        type_constraints=[("T", ["tensor(float)"], ""), ("M", ["tensor(int32)"], "")],
        attributes=[OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, "")],
    )
    op = onnxscript.values.Op(onnxscript.values.Opset("com.microsoft", 1), schema.name, schema)

    def translate(query, key, value, keep, heads: int):
        return op(query, key, value, None, keep, num_heads=heads)

    return translate


def example_inputs(model: nn.Module, batch: int = 2) -> tuple[Tensor, Tensor]:
    """``(source (B, S), decoder_tokens (B, L))`` of ``batch`` ≥ 2 sentences of different
    lengths: the exporter's example (a size of 1 would be specialised as a constant)."""
    lengths = torch.arange(batch, 0, -1) + 3  # (B,) distinct, ≥ 4
    source = torch.full((batch, int(lengths.max())), PAD_ID, dtype=torch.int64)
    for b, n in enumerate(lengths.tolist()):
        source[b, : n - 1] = torch.arange(4, 3 + n) % model.config.vocab_size
        source[b, n - 1] = EOS_ID
    graph_lengths = model.graph_lengths(lengths, True)  # (B,)
    return source, model.decoder_input_tokens(graph_lengths)


def example_candidates(model: nn.Module, batch: int, top_k: int) -> Tensor:
    """``(B, K)`` int64 example of the ``candidates`` input for ``batch`` sentences: the ids
    ``0 … K−1`` in every row, ``K = min(V, max(top_k, 2) + 2)``, the last row's last column
    the padding :data:`~fadat.engine.shortlist.PAD_CANDIDATE`."""
    width = min(model.config.vocab_size, max(top_k, 2) + 2)
    candidates = torch.arange(width).repeat(batch, 1)  # (B, K)
    candidates[-1, -1] = PAD_CANDIDATE
    return candidates


def decompose_logsumexp(proto) -> int:
    """Rewrite each ``ReduceLogSumExp`` node of the ONNX graph ``proto`` (an
    ``onnx.ModelProto``, changed in place) as ``ReduceMax → Sub → Exp → ReduceSum → Log → Add``
    (then ``Squeeze`` where the node drops the reduced axes): ``logsumexp(x) = m +
    log(sum(exp(x − m)))`` with ``m = max(x)``, what torch's ``logsumexp`` computes.

    The graph's one such node is the links head's mixture over heads
    (:func:`fadat.models.dat.transition_log_probs`, a reduction over axis 1 of ``(B, H, L,
    L)``). ONNX Runtime 1.32's CPU kernel for it took 1.6 ms a sentence at batch 1 on the AMD
    EPYC Zen 3 (one thread, released DAT), the six ops 0.3 ms. Its inputs are finite (invalid
    entries are zeroed before the reduction), so ``m`` is finite and no ``−inf − −inf`` arises.

    Returns:
        The number of nodes rewritten.
    """
    from onnx import helper

    nodes, count = [], 0
    for node in proto.graph.node:
        if node.op_type != "ReduceLogSumExp":
            nodes.append(node)
            continue
        count += 1
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        keep = int(attrs.get("keepdims", 1))
        x, axes = node.input[0], node.input[1] if len(node.input) > 1 else ""
        p = node.name or f"logsumexp_{count}"
        out = node.output[0]
        nodes += [
            helper.make_node("ReduceMax", [x, axes], [f"{p}_m"], name=f"{p}_max", keepdims=1),
            helper.make_node("Sub", [x, f"{p}_m"], [f"{p}_d"], name=f"{p}_sub"),
            helper.make_node("Exp", [f"{p}_d"], [f"{p}_e"], name=f"{p}_exp"),
            helper.make_node(
                "ReduceSum", [f"{p}_e", axes], [f"{p}_s"], name=f"{p}_sum", keepdims=1
            ),
            helper.make_node("Log", [f"{p}_s"], [f"{p}_l"], name=f"{p}_log"),
            helper.make_node(
                "Add", [f"{p}_l", f"{p}_m"], [out if keep else f"{p}_k"], name=f"{p}_add"
            ),
        ]
        if not keep:
            nodes.append(helper.make_node("Squeeze", [f"{p}_k", axes], [out], name=f"{p}_squeeze"))
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    return count


def fold_transposed_weights(proto) -> int:
    """Give each ``MatMul`` of ``proto`` (changed in place) whose weight is a ``Transpose`` of an
    initializer its own transposed initializer, and drop the ``Transpose`` s left unused.

    The token head multiplies by the transposed embedding matrix (shared weights); ONNX Runtime's
    dynamic quantization quantizes only ``MatMul`` s whose weight is an initializer, so without
    this the token head stayed fp32 in the int8 export (4.9 ms of a 38 ms sentence at batch 1 on
    the Zen 3; 3.0 ms in int8), unlike fadat's own int8 path. The copy costs ``V·d`` more weights
    on disk (1 MB in int8 at V = 4,000, d = 256).

    Returns:
        The number of ``MatMul`` s given a folded weight.
    """
    from onnx import numpy_helper

    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    folded: dict[str, str] = {}  # Transpose output -> its stored copy (one per Transpose)
    count = 0
    for node in graph.node:
        t = producer.get(node.input[1]) if node.op_type == "MatMul" else None
        if t is None or t.op_type != "Transpose" or t.input[0] not in inits:
            continue
        if t.output[0] not in folded:
            weight = numpy_helper.to_array(inits[t.input[0]])
            perm = [list(a.ints) for a in t.attribute if a.name == "perm"]
            name = f"{t.input[0]}_transposed_{len(folded)}"
            array = (weight.transpose(perm[0]) if perm else weight.T).copy()
            graph.initializer.append(numpy_helper.from_array(array, name))
            folded[t.output[0]] = name
        node.input[1] = folded[t.output[0]]
        count += 1
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    dead = [n for n in graph.node if n.op_type == "Transpose" and not (set(n.output) & used)]
    for n in dead:
        graph.node.remove(n)
    return count


@contextlib.contextmanager
def _exporter_notices_off() -> Iterator[None]:
    """Silence the exporter's notices that say nothing about this graph (torch 2.13): its
    registry logging that torchvision is absent, a pytree deprecation inside ``torch.export``,
    and that the source and graph axes share the ``batch`` name. Other warnings pass."""
    registry = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registry.level
    registry.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", r".*isinstance\(treespec, LeafSpec\)", FutureWarning)
            warnings.filterwarnings("ignore", r"# The axis name: batch will not", UserWarning)
            yield
    finally:
        registry.setLevel(level)


def check_top_k(top_k: int, vocab_size: int) -> None:
    """Check the export's tokens per vertex.

    Raises:
        ValueError: ``top_k`` not an integer in ``[1, vocab_size]``.
    """
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= vocab_size:
        raise ValueError(
            f"--top-k must be an integer in [1, {vocab_size}] (the vocabulary size), got {top_k!r}"
        )


def export_graph(
    model: nn.Module,
    path: str | Path,
    opset: int = OPSET,
    attention: str = "fused",
    top_k: int = TOP_K,
    shortlist: bool = False,
) -> None:
    """Export :class:`DATGraph` of ``model`` (with ``shortlist``: :class:`ShortlistDATGraph`)
    to one self-contained ONNX file (weights inside).

    Args:
        model: a DAT model in fp32.
        path: the ``.onnx`` file to write.
        opset: the ONNX opset.
        attention: ``"fused"`` (ONNX Runtime's ``MultiHeadAttention``) or ``"standard"``
            (module docstring).
        top_k: tokens per vertex in the outputs ``top_lp`` and ``top_tok``.
        shortlist: the graph takes the third input ``candidates`` ``(batch, candidates)``
            int64 and computes the token head over them (module docstring).

    Raises:
        ValueError: an unknown ``attention``; ``top_k`` outside ``[1, V]``.
    """
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, got {attention!r}")
    check_top_k(top_k, model.config.vocab_size)
    onnx, _ = _require_onnx()
    from torch.export import Dim

    fused = attention == "fused"
    batch = Dim("batch")
    source_length = Dim("source_length", max=model.config.max_source_positions)
    graph_size = Dim("graph_size", min=2, max=model.config.max_target_positions)
    dynamic: dict[str, dict[int, Any]] = {
        "source": {0: batch, 1: source_length},
        "decoder_tokens": {0: batch, 1: graph_size},
    }
    inputs: tuple[Tensor, ...] = example_inputs(model)
    if shortlist:
        graph: nn.Module = ShortlistDATGraph(model, top_k).eval()
        inputs = (*inputs, example_candidates(model, len(inputs[0]), top_k))
        dynamic[SHORTLIST_INPUT] = {0: batch, 1: Dim(SHORTLIST_AXIS, min=max(top_k, 2))}
    else:
        graph = DATGraph(model, top_k).eval()
    with fused_attention(model) if fused else contextlib.nullcontext(), _exporter_notices_off():
        program = torch.onnx.export(
            graph,
            inputs,
            dynamo=True,
            input_names=list(INPUT_NAMES) + ([SHORTLIST_INPUT] if shortlist else []),
            output_names=list(OUTPUT_NAMES),
            dynamic_shapes=dynamic,
            opset_version=opset,
            custom_translation_table=(
                {torch.ops.fadat.key_masked_attention.default: _multi_head_attention_translation()}
                if fused
                else None
            ),
            verbose=False,
        )
    proto = program.model_proto
    decompose_logsumexp(proto)
    onnx.checker.check_model(proto)
    onnx.save_model(proto, str(path), save_as_external_data=False)


def _scope_nodes(proto, scope: str) -> list:
    """The nodes of ``proto`` whose exporter scope (``pkg.torch.onnx.name_scopes``) names the
    module ``scope``."""
    return [
        node
        for node in proto.graph.node
        if any(
            p.key == "pkg.torch.onnx.name_scopes" and scope in p.value for p in node.metadata_props
        )
    ]


def int8_rows(weight) -> Any:
    """``weight`` ``(V, d)`` fp32 rounded to ONNX Runtime's int8 and back: each row quantized
    as ``quantize_dynamic`` quantizes the token head's weight (int8, symmetric, one scale per
    output channel, that is per token; ``onnxruntime.quantization.quant_utils.quantize_data``)
    and dequantized, ``scale · (q − zero_point)`` in fp32. ``(V, d)`` fp32."""
    import numpy as np
    from onnx import TensorProto
    from onnxruntime.quantization.quant_utils import quantize_data

    out = np.empty_like(weight, dtype=np.float32)
    for v, row in enumerate(weight):
        zero, scale, q = quantize_data(row, TensorProto.INT8, True)
        out[v] = np.float32(scale) * (q.astype(np.float32) - np.float32(zero))
    return out


def dequantized_shortlist_head(proto) -> int:
    """Give the shortlisted token head of ``proto`` (:class:`ShortlistHead`, changed in place)
    its weight in int8 precision: the ``Gather`` that takes the candidates' rows reads a new
    fp32 initializer, the output projection rounded to int8 and back (:func:`int8_rows`), so
    that it multiplies the rows of the int8 full head's weights in fp32, as fadat's int8 path
    does (:func:`fadat.models.inference.head_weight`). The projection stays an initializer of
    its own for the encoder's and decoder's embeddings.

    Returns:
        The number of ``Gather`` s given the rounded weight (1 in a shortlisted graph).
    """
    from onnx import numpy_helper

    inits = {i.name: i for i in proto.graph.initializer}
    count = 0
    for node in _scope_nodes(proto, "shortlist_head"):
        if node.op_type != "Gather" or node.input[0] not in inits:
            continue
        name = f"{node.input[0]}_int8_dequantized"
        if name not in inits:
            rows = int8_rows(numpy_helper.to_array(inits[node.input[0]]))
            proto.graph.initializer.append(numpy_helper.from_array(rows, name))
            inits[name] = proto.graph.initializer[-1]
        node.input[0] = name
        count += 1
    return count


def quantize_int8(fp32_path: str | Path, int8_path: str | Path) -> None:
    """ONNX Runtime's dynamic int8 quantization of the graph (module docstring), the links
    head's ``MatMul`` s excluded (found by the exporter's ``pkg.torch.onnx.name_scopes``), the
    token head included (:func:`fold_transposed_weights`). In a shortlisted graph the token
    head gathers rows of its weight instead: its nodes are excluded too, and the rows it
    gathers are the int8 weights dequantized (:func:`dequantized_shortlist_head`), multiplied
    in fp32.

    Raises:
        RuntimeError: no node of the links head (or, in a shortlisted graph, of the
            shortlisted head) found: the exporter's scopes changed.
    """
    onnx, _ = _require_onnx()
    from onnxruntime.quantization import QuantType, quantize_dynamic

    proto = onnx.load(str(fp32_path))
    fold_transposed_weights(proto)
    excluded = [node.name for node in _scope_nodes(proto, "links_head")]
    if not excluded:
        raise RuntimeError("no node of the links head found: the exporter's scopes changed")
    if SHORTLIST_INPUT in {i.name for i in proto.graph.input}:
        if dequantized_shortlist_head(proto) != 1:
            raise RuntimeError(
                "no Gather of the shortlisted token head found: the exporter's scopes changed"
            )
        excluded += [node.name for node in _scope_nodes(proto, "shortlist_head")]
    quantize_dynamic(
        proto,
        str(int8_path),
        weight_type=QuantType.QInt8,
        per_channel=True,
        op_types_to_quantize=["MatMul"],
        nodes_to_exclude=excluded,
    )


def _write_fp32(
    model: nn.Module,
    meta: dict,
    model_dir: Path,
    spm_path: Path,
    out: Path,
    opset: int,
    attention: str,
    top_k: int,
    shortlist: tuple[Path, Any] | None = None,
) -> None:
    """The fp32 export's files in ``out``: graph, ``spm.model``, ``metadata.json``; with
    ``shortlist`` (its file and the loaded :class:`~fadat.models.shortlist.Shortlist`) the
    shortlisted graph and a copy of the file."""
    import onnx
    import onnxruntime

    import fadat

    cfg = model.config
    export_graph(model, out / GRAPH_FILE, opset, attention, top_k, shortlist is not None)
    shutil.copyfile(spm_path, out / "spm.model")
    info = {
        "format": "fadat-onnx-engine",
        "format_version": FORMAT_VERSION,
        "graph": GRAPH_FILE,
        "precision": "fp32",
        "upsample_ratio": float(cfg.decoding_upsample_ratio),
        "max_source_positions": cfg.max_source_positions,
        "max_target_positions": cfg.max_target_positions,
        "vocab_size": cfg.vocab_size,
        "special_ids": {"bos": BOS_ID, "pad": PAD_ID, "eos": EOS_ID, "unk": UNK_ID},
        "top_k": top_k,
        "contract": (
            "source: (batch, source_length) int64, sentencepiece ids of x then </s>, "
            "right-padded with pad; decoder_tokens: (batch, graph_size) int64 "
            "[bos, unk x (L_b - 2), eos, pad ...] with L_b = clip(floor(upsample_ratio * "
            "|x </s>|), 2, max_target_positions); outputs s (batch, graph_size) float32 "
            "max log P(token|vertex) (0 at padding), tok (batch, graph_size) int64 its "
            "argmax (pad at padding), links (batch, graph_size, graph_size) float32 log "
            "transition probabilities (-inf where invalid), top_lp (batch, graph_size, top_k) "
            "float32 the top_k largest log P(token|vertex), descending, and top_tok (batch, "
            "graph_size, top_k) int64 their ids, ties by the lower id (0 and pad at padding); "
            "s and tok are their first column"
        ),
        "strategies": ["greedy", "lookahead", "viterbi", "joint-viterbi", "beam"],
        "default_strategy": model.default_strategy,
        "opset": opset,
        "attention": FUSED_ATTENTION_OP if attention == "fused" else "standard ONNX ops",
        "exporter": "torch.onnx.export(dynamo=True)",
        "versions": {
            "fadat": fadat.__version__,
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
        },
        "exported_from": str(model_dir.resolve()),
        "model_config": meta["config"],
        "data": meta.get("data"),
    }
    if shortlist is not None:
        path, table = shortlist
        shutil.copyfile(path, out / SHORTLIST_NAME)
        info["shortlist"] = {
            "file": SHORTLIST_NAME,
            "input": SHORTLIST_INPUT,
            "contract": SHORTLIST_CONTRACT,
            "settings": table.metadata,
            "copied_from": str(path.resolve()),
        }
    (out / METADATA).write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n")


def _write_int8(fp32_dir: Path, out: Path) -> None:
    """The int8 export's files in ``out`` from the fp32 export in ``fp32_dir`` (its shortlist
    copied too)."""
    quantize_int8(fp32_dir / GRAPH_FILE, out / GRAPH_FILE)
    shutil.copyfile(fp32_dir / "spm.model", out / "spm.model")
    info = json.loads((fp32_dir / METADATA).read_text(encoding="utf-8"))
    info["precision"] = "int8"
    info["quantization"] = (
        "onnxruntime.quantization.quantize_dynamic(weight_type=QInt8, per_channel=True, "
        "op_types_to_quantize=[MatMul], links head excluded, token head's weight folded)"
    )
    if "shortlist" in info:
        shutil.copyfile(fp32_dir / info["shortlist"]["file"], out / info["shortlist"]["file"])
        info["quantization"] = (
            "onnxruntime.quantization.quantize_dynamic(weight_type=QInt8, per_channel=True, "
            "op_types_to_quantize=[MatMul], links head and shortlisted token head excluded; "
            "the token head's rows gathered from its int8 weights dequantized, multiplied in "
            "fp32)"
        )
    (out / METADATA).write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n")


def quantize_export(directory: str | Path, output: str | Path, *, force: bool = False) -> Path:
    """An int8 export directory from an fp32 one, without exporting again (what
    :func:`export_onnx` with ``precision="int8"`` does after its fp32 export).

    Raises:
        InputError: ``directory`` not an fp32 export; ``output`` as in :func:`export_onnx`.
    """
    _require_onnx()
    directory, output = Path(directory), Path(output)
    meta_path = directory / METADATA
    info = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
    if info.get("format") != "fadat-onnx-engine" or info.get("precision") != "fp32":
        raise InputError(f"{directory}: not an fp32 ONNX export of fadat")
    check_not_input(output, [("directory", directory)])
    if check_output_dir(output, KIND) and not force:
        raise InputError(f"--output {output}: an existing ONNX export (pass --force)")
    check_replaceable(output, KIND)
    staged = staging_dir(output)
    try:
        _write_int8(directory, staged)
        replace_dir(staged, output, KIND)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return output


def export_onnx(
    model_dir: str | Path,
    output: str | Path,
    *,
    precision: str = "fp32",
    force: bool = False,
    opset: int = OPSET,
    attention: str = "fused",
    top_k: int = TOP_K,
    shortlist: str | Path | None = None,
) -> Path:
    """Export a DAT model directory to an ONNX Runtime engine directory (module docstring).

    Built in a staging directory and renamed into place when complete; an existing ``output``
    is replaced only when it is a fadat ONNX export (fadat.outputs) and ``force`` is set.

    Args:
        model_dir: a fadat DAT model directory.
        output: the directory to create.
        precision: one of :data:`PRECISIONS`.
        force: replace an existing export at ``output``.
        opset: the ONNX opset of the graph.
        attention: ``"fused"`` (one ONNX Runtime ``MultiHeadAttention`` per attention block;
            runs in ONNX Runtime only) or ``"standard"`` (standard ONNX ops), module docstring.
        top_k: tokens per vertex in the graph's ``top_lp``/``top_tok`` outputs (the most the
            beam search's ``top_cand_n`` can be on this export), ``1 ≤ top_k ≤ V``; recorded
            in ``metadata.json``. The default, 5, is the beam search's default ``top_cand_n``
            (DAG-Search's ``--decode-top-cand-n``).
        shortlist: a vocabulary shortlist of the model's vocabulary (``fadat shortlist``; a
            file, or a directory holding ``shortlist.safetensors``, e.g. ``model_dir``): the
            graph computes the token head over each sentence's candidates
            (:class:`ShortlistDATGraph`, module docstring) and the file is copied into the
            export, recorded in ``metadata.json`` (``shortlist``). ``None``: the full head.

    Returns:
        ``output`` as a Path.

    Raises:
        InputError: onnx, onnxruntime or onnxscript not installed; unknown ``precision``;
            ``top_k`` outside ``[1, V]``;
            ``model_dir`` missing, corrupt, not a DAT or without a sentencepiece model;
            ``shortlist`` missing, unreadable or for another vocabulary size;
            ``output`` an export without ``force``, or anything else than an export or an
            empty directory.
    """
    _require_onnx()
    if precision not in PRECISIONS:
        raise InputError(
            f"--precision must be one of {', '.join(PRECISIONS)} for the onnx format "
            f"(bf16: ONNX Runtime's CPU provider has no bfloat16 MatMul), got {precision!r}"
        )
    if attention not in ATTENTION:
        raise InputError(f"attention must be one of {', '.join(ATTENTION)}, got {attention!r}")
    model_dir, output = Path(model_dir), Path(output)
    meta = read_model_metadata(model_dir)
    if meta["model_type"] != "dat":
        raise InputError(
            f"{model_dir}: holds a {meta['model_type']!r} model; the onnx engine is for DAT "
            "models (export an AT with --format ctranslate2)"
        )
    spm_path = spm_model_path(model_dir)
    if spm_path is None:
        raise InputError(f"{model_dir}: has no sentencepiece model")
    vocab_size = int(meta["config"]["vocab_size"])
    try:
        check_top_k(top_k, vocab_size)
    except ValueError as err:
        raise InputError(str(err)) from None
    table = None
    if shortlist is not None:
        from fadat.models.shortlist import load_shortlist

        shortlist = Path(shortlist)
        if shortlist.is_dir():
            shortlist = shortlist / SHORTLIST_NAME
        table = (shortlist, load_shortlist(shortlist, vocab_size))
    check_not_input(output, [("--model", model_dir), ("--shortlist", shortlist)])
    if check_output_dir(output, KIND) and not force:
        raise InputError(f"--output {output}: an existing ONNX export (pass --force)")
    check_replaceable(output, KIND)
    model = load_pretrained(model_dir).float().eval()
    staged = staging_dir(output)
    args = (model, meta, model_dir, spm_path)
    try:
        if precision == "fp32":
            _write_fp32(*args, staged, opset, attention, top_k, table)
        else:
            with tempfile.TemporaryDirectory(dir=staged) as tmp:
                _write_fp32(*args, Path(tmp), opset, attention, top_k, table)
                _write_int8(Path(tmp), staged)
        replace_dir(staged, output, KIND)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return output
