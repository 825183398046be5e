"""Write a model directory in another inference engine's format (``fadat export``,
:mod:`fadat.cli.export`; from Python :func:`export`).

Two formats: ``onnx``, a DAT for ONNX Runtime (:mod:`fadat.translation.onnx_export`,
docs/engine.md), and ``ctranslate2``: the AT (:class:`fadat.models.at.ATModel`) described through
CTranslate2's model-spec API (``ctranslate2.specs.TransformerSpec``) and saved with it, so the
engine a CPU user would deploy a Transformer with runs our weights. Needs the optional extra
``pip install -e .[ctranslate2]``.

The exported directory holds CTranslate2's ``model.bin``, its two vocabularies (the
sentencepiece pieces, id order kept), ``spm.model`` and ``fadat_export.json`` (where it came
from, and the decoding options that reproduce fadat's outputs). :class:`CTranslate2AT` runs it
with fadat's decoding rules:

- ``beam_size`` set explicitly (CTranslate2's default is 2), ``length_penalty`` α as fadat's,
  ``return_end_token=True`` so a hypothesis is ranked by ``log P / (|y| + 1)^α`` with ``</s>``
  counted, as :meth:`fadat.models.at.ATModel.beam_search` does;
- ``min_decoding_length=0`` (``</s>`` may come first), ``<s>`` and ``<pad>`` suppressed;
- the length limit ``int(a·|x </s>| + b)`` tokens including ``</s>``: fadat forces ``</s>`` at
  the limit, CTranslate2 stops after ``max_decoding_length`` tokens, so the engine is given
  ``limit − 1`` and a longer output is cut to ``limit − 1`` tokens.

Greedy outputs are then the same tokens as fadat's for every sentence. Beam outputs can
differ in three ways, none of which occurred on 50 real test sentences with a trained model
(tests/test_export.py) except the first:

- at the length limit fadat adds the forced ``</s>``'s log-probability to the unfinished
  hypotheses and CTranslate2 ranks them without it, which may pick another hypothesis;
- CTranslate2 removes ``<s>`` and ``<pad>`` before its softmax and fadat (as fairseq) after, so
  a hypothesis' log-probability differs by ``log(1 − P(<s>) − P(<pad>))`` per step: nothing for
  a trained model, which gives those tokens no probability, but not for random weights;
- scores are float32 in the engine and float64 in fadat, so near-ties may break differently.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from fadat.errors import InputError
from fadat.models.directory import load_pretrained, read_model_metadata, spm_model_path
from fadat.outputs import (
    check_not_input,
    check_output_dir,
    check_replaceable,
    replace_dir,
    staging_dir,
)

FORMATS = ("ctranslate2", "onnx")
KIND = "ctranslate2-model"  # the output directory's kind (fadat.outputs)
QUANTIZATIONS = ("float32", "int8", "int8_float32", "int16", "float16", "bfloat16")
EXPORT_INFO = "fadat_export.json"
SPECIAL_PIECES = {BOS_ID: "<s>", PAD_ID: "<pad>", EOS_ID: "</s>", UNK_ID: "<unk>"}


def _require_ctranslate2():
    try:
        import ctranslate2
    except ImportError as err:
        raise InputError(
            "the ctranslate2 format needs the ctranslate2 package: pip install 'fadat[ctranslate2]'"
        ) from err
    return ctranslate2


def _vocabulary(spm_path: Path) -> list[str]:
    """The sentencepiece pieces in id order (CTranslate2 addresses tokens by string).

    Raises:
        InputError: the pieces of ids 0–3 are not fadat's specials, or two ids share a piece.
    """
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    for i, piece in SPECIAL_PIECES.items():
        if pieces[i] != piece:
            raise InputError(f"{spm_path}: id {i} is {pieces[i]!r}, expected {piece!r}")
    if len(set(pieces)) != len(pieces):
        raise InputError(f"{spm_path}: pieces are not unique")
    return pieces


def ctranslate2_spec(model: torch.nn.Module, pieces: list[str]):
    """The ``ctranslate2.specs.TransformerSpec`` of an AT model (weights as fp32 numpy arrays).

    The mapping: fadat's fused ``in_proj`` (rows q, k, v) is CTranslate2's fused self-attention
    projection; cross-attention ``q_proj`` and ``kv_proj`` (rows k, v) its query and fused
    memory projections; post-LN (or pre-LN with the final norms) as in the config; the one token
    embedding is the encoder's, the decoder's and the bias-free output projection's (the spec
    stores it once); learned positions ``0..n-1`` are the position tables as they are.

    Args:
        model: a :class:`fadat.models.at.ATModel`.
        pieces: V token strings in id order.

    Returns:
        The spec, not yet validated or saved.
    """
    _require_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.config
    activation = {"gelu": common_spec.Activation.GELU, "relu": common_spec.Activation.RELU}
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers),
        cfg.attention_heads,
        pre_norm=cfg.pre_norm,
        activation=activation[cfg.activation],
    )

    def array(t: Tensor):
        return t.detach().float().cpu().numpy()

    def linear(dst, module: torch.nn.Linear) -> None:
        dst.weight = array(module.weight)
        if module.bias is not None:
            dst.bias = array(module.bias)

    def norm(dst, module: torch.nn.LayerNorm) -> None:
        dst.gamma = array(module.weight)
        dst.beta = array(module.bias)

    def layer(dst, src, cross: bool) -> None:
        linear(dst.self_attention.linear[0], src.self_attn.in_proj)
        linear(dst.self_attention.linear[1], src.self_attn.out_proj)
        norm(dst.self_attention.layer_norm, src.self_attn_norm)
        if cross:
            linear(dst.attention.linear[0], src.cross_attn.q_proj)
            linear(dst.attention.linear[1], src.cross_attn.kv_proj)
            linear(dst.attention.linear[2], src.cross_attn.out_proj)
            norm(dst.attention.layer_norm, src.cross_attn_norm)
        linear(dst.ffn.linear_0, src.fc1)
        linear(dst.ffn.linear_1, src.fc2)
        norm(dst.ffn.layer_norm, src.ffn_norm)

    embedding = array(model.encoder.embed_tokens.weight)  # (V, d)
    enc, dec = spec.encoder, spec.decoder
    enc.embeddings[0].weight = embedding
    enc.scale_embeddings = cfg.scale_embedding
    enc.position_encodings.encodings = array(model.encoder.embed_positions.weight)
    for dst, src in zip(enc.layer, model.encoder.layers, strict=True):
        layer(dst, src, cross=False)
    dec.embeddings.weight = embedding
    dec.scale_embeddings = cfg.scale_embedding
    dec.position_encodings.encodings = array(model.decoder.embed_positions.weight)
    dec.projection.weight = embedding
    for dst, src in zip(dec.layer, model.decoder.layers, strict=True):
        layer(dst, src, cross=True)
    if cfg.pre_norm:
        norm(enc.layer_norm, model.encoder.final_norm)
        norm(dec.layer_norm, model.decoder.final_norm)

    spec.config.layer_norm_epsilon = model.encoder.layers[0].ffn_norm.eps
    spec.config.bos_token = SPECIAL_PIECES[BOS_ID]
    spec.config.eos_token = SPECIAL_PIECES[EOS_ID]
    spec.config.unk_token = SPECIAL_PIECES[UNK_ID]
    spec.config.decoder_start_token = SPECIAL_PIECES[BOS_ID]
    spec.config.add_source_eos = True  # fadat's source is `x </s>`
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    return spec


def export(
    model_dir: str | Path,
    output: str | Path,
    *,
    format: str,
    precision: str = "fp32",
    quantization: str = "float32",
    shortlist: bool | str | Path | None = None,
    force: bool = False,
    attention: str = "fused",
    top_k: int | None = None,
) -> Path:
    """Export a model directory to another inference engine (``fadat export``).

    Dispatches to :func:`fadat.translation.onnx_export.export_onnx` (a DAT for ONNX Runtime)
    or :func:`export_ctranslate2` (an AT for CTranslate2).

    Args:
        model_dir: a fadat model directory (DAT for ``onnx``, AT for ``ctranslate2``).
        output: the directory to create (built in a staging directory, renamed into place).
        format: ``"onnx"`` or ``"ctranslate2"`` (:data:`FORMATS`).
        precision: onnx: ``"fp32"`` or ``"int8"`` (ONNX Runtime's dynamic quantization; the
            links head stays fp32).
        quantization: ctranslate2: the stored weight type (:data:`QUANTIZATIONS`).
        shortlist: a lexical shortlist (``fadat shortlist``): ``True`` for ``model_dir``'s
            ``shortlist.safetensors``, or a shortlist file or the model directory holding one;
            ``None``/``False``: none. ctranslate2: written as CTranslate2's vocabulary map
            ``vmap.txt``; onnx: the graph's token head runs over each sentence's candidates
            and the file is copied into the export
            (:func:`~fadat.translation.onnx_export.export_onnx`).
        force: replace an existing export at ``output``.
        attention: onnx: ``"fused"`` (ONNX Runtime's ``MultiHeadAttention`` contrib op, the
            graph runs in ONNX Runtime only) or ``"standard"`` (standard ONNX ops).
        top_k: onnx: tokens per vertex in the graph's ``top_lp``/``top_tok`` outputs, the
            beam search's largest ``top_cand_n`` on the export (``None``: 5,
            :data:`fadat.engine.runtime.TOP_K`).

    Returns:
        ``output`` as a Path.

    Raises:
        InputError: an unknown ``format``; ``quantization`` with ``onnx``;
            ``precision``, ``attention`` or ``top_k`` with ``ctranslate2``; and as
            :func:`export_ctranslate2` and :func:`~fadat.translation.onnx_export.export_onnx`.
    """
    if format not in FORMATS:
        raise InputError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if shortlist is False:
        shortlist = None
    if format == "onnx":
        from fadat.translation.onnx_export import export_onnx

        if quantization != "float32":
            raise InputError("--quantization is for --format ctranslate2 (onnx: --precision)")
        from fadat.engine.runtime import TOP_K

        return export_onnx(
            model_dir,
            output,
            precision=precision,
            force=force,
            attention=attention,
            top_k=TOP_K if top_k is None else top_k,
            shortlist=model_dir if shortlist is True else shortlist,
        )
    if precision != "fp32":
        raise InputError("--precision is for --format onnx (ctranslate2: --quantization)")
    if attention != "fused":
        raise InputError("--attention is for --format onnx")
    if top_k is not None:
        raise InputError("--top-k is for --format onnx")
    return export_ctranslate2(
        model_dir,
        output,
        quantization=quantization,
        force=force,
        shortlist=model_dir if shortlist is True else shortlist,
    )


def export_ctranslate2(
    model_dir: str | Path,
    output: str | Path,
    *,
    quantization: str = "float32",
    force: bool = False,
    shortlist: str | Path | None = None,
) -> Path:
    """Export an AT model directory to a CTranslate2 model directory.

    The directory is built in a staging directory and renamed into place when complete; an
    existing ``output`` is replaced only when it is a fadat CTranslate2 export (fadat.outputs).

    Args:
        model_dir: a fadat AT model directory (``config.json``, ``model.safetensors``,
            ``spm.model``).
        output: the CTranslate2 model directory to create.
        quantization: the stored weight type (one of :data:`QUANTIZATIONS`; the engine can
            still convert at load time with ``compute_type``).
        force: replace an existing ``output``.
        shortlist: a vocabulary shortlist for the AT's vocabulary (``fadat shortlist --model
            AT_DIR``: the model directory or the file), written as CTranslate2's vocabulary map
            ``vmap.txt`` (translate with ``use_vmap=True``;
            :func:`fadat.models.shortlist.write_ctranslate2_vmap`).

    Returns:
        ``output`` as a Path.

    Raises:
        InputError: ctranslate2 not installed; ``model_dir`` missing, corrupt, a DAT model or
            without a sentencepiece model; ``output`` is an export and ``force`` is false, or is
            anything else than an export or an empty directory; unknown ``quantization``;
            ``shortlist`` missing, unreadable or for another vocabulary size.
    """
    _require_ctranslate2()
    if quantization not in QUANTIZATIONS:
        raise InputError(f"--quantization must be one of {', '.join(QUANTIZATIONS)}")
    model_dir, output = Path(model_dir), Path(output)
    meta = read_model_metadata(model_dir)
    if meta["model_type"] != "at":
        raise InputError(
            f"{model_dir}: holds a {meta['model_type']!r} model; the ctranslate2 export is for "
            "AT models (a DAT is not an autoregressive Transformer)"
        )
    spm_path = spm_model_path(model_dir)
    if spm_path is None:
        raise InputError(f"{model_dir}: has no sentencepiece model (needed for the vocabulary)")
    check_not_input(output, [("--model", model_dir)])
    if check_output_dir(output, KIND) and not force:
        raise InputError(f"--output {output}: an existing CTranslate2 export (pass --force)")
    check_replaceable(output, KIND)
    model = load_pretrained(model_dir)
    pieces = _vocabulary(spm_path)
    if len(pieces) != model.config.vocab_size:
        raise InputError(
            f"{spm_path}: {len(pieces)} pieces, the model's vocab_size is {model.config.vocab_size}"
        )
    vocabulary_map = None
    if shortlist is not None:
        from fadat.models.shortlist import load_shortlist

        vocabulary_map = load_shortlist(shortlist, model.config.vocab_size)
    spec = ctranslate2_spec(model, pieces)
    spec.validate()
    spec.optimize(quantization=None if quantization == "float32" else quantization)
    staged = staging_dir(output)
    try:
        spec.save(str(staged))
        shutil.copyfile(spm_path, staged / "spm.model")
        if vocabulary_map is not None:
            from fadat.models.shortlist import write_ctranslate2_vmap

            write_ctranslate2_vmap(vocabulary_map, pieces, staged / "vmap.txt")
        info = {
            "exported_from": str(model_dir.resolve()),
            "model_config": meta["config"],
            "data": meta.get("data"),
            "quantization": quantization,
            "vocabulary_map": (None if vocabulary_map is None else dict(vocabulary_map.metadata)),
            "fadat_decoding": (
                "translate_batch(pieces without </s>, beam_size=K, length_penalty=α, "
                "return_end_token=True, min_decoding_length=0, "
                "suppress_sequences=[['<s>'], ['<pad>']], max_decoding_length=limit-1) with "
                "limit = int(1.2·(|x|+1) + 10); see fadat.translation.export.CTranslate2AT"
            ),
        }
        (staged / EXPORT_INFO).write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n")
        replace_dir(staged, output, KIND)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return output


class CTranslate2AT:
    """An exported AT run by CTranslate2 with fadat's decoding rules (see the module docstring).

    Args:
        directory: written by :func:`export_ctranslate2`.
        compute_type: CTranslate2's ``compute_type`` (``"float32"``, ``"int8"``, ...).
        intra_threads: threads of one translation (OpenMP threads).
        inter_threads: translations run in parallel (each with ``intra_threads``).

    Raises:
        InputError: ctranslate2 not installed, or ``directory`` is not an export.
    """

    def __init__(
        self,
        directory: str | Path,
        compute_type: str = "float32",
        intra_threads: int = 1,
        inter_threads: int = 1,
    ) -> None:
        ctranslate2 = _require_ctranslate2()
        directory = Path(directory)
        if not (directory / "model.bin").is_file() or not (directory / EXPORT_INFO).is_file():
            raise InputError(f"{directory}: not a CTranslate2 export of fadat (no model.bin)")
        self.translator = ctranslate2.Translator(
            str(directory),
            device="cpu",
            compute_type=compute_type,
            intra_threads=intra_threads,
            inter_threads=inter_threads,
        )
        vocab_file = directory / "source_vocabulary.json"
        if not vocab_file.is_file():
            vocab_file = directory / "shared_vocabulary.json"
        self.pieces: list[str] = json.loads(vocab_file.read_text(encoding="utf-8"))
        info = json.loads((directory / EXPORT_INFO).read_text(encoding="utf-8"))
        self.max_target_positions = int(info["model_config"]["max_target_positions"])
        self.ids: dict[str, int] = {p: i for i, p in enumerate(self.pieces)}

    def translate_ids(
        self,
        sources: list[list[int]] | Tensor,
        beam_size: int = 5,
        length_penalty: float = 1.0,
        max_len_a: float = 1.2,
        max_len_b: int = 10,
        max_batch_size: int = 0,
        use_vmap: bool = False,
        target_lengths: Sequence[int] | None = None,
    ) -> list[list[int]]:
        """Translate source ids (``x </s>``, or a ``(B, S)`` PAD-padded tensor) to output ids
        without ``<s>``/``</s>``, as :meth:`fadat.models.at.ATModel.beam_search`
        (``beam_size`` > 1) or ``greedy`` (``beam_size`` 1) would, up to the limit case of the
        module docstring.

        Args:
            sources: as above.
            beam_size, length_penalty, max_len_a, max_len_b: fadat's decoding options.
            max_batch_size: CTranslate2 splits the sentences into batches of at most this
                many, run in parallel by its ``inter_threads`` replicas (0 = one batch).
            use_vmap: restrict the output vocabulary with the export's ``vmap.txt``
                (CTranslate2's vocabulary map;
                :func:`fadat.models.shortlist.write_ctranslate2_vmap`).
            target_lengths: force sentence ``i`` to ``target_lengths[i]`` output tokens: the
                engine decodes exactly ``n + 1`` steps (the work of ``n`` tokens and ``</s>``,
                with ``</s>`` suppressed until then) and the first ``n`` are returned. For
                timing against an AT whose outputs would have the references' lengths;
                sentences of equal ``n`` are translated together.

        Raises:
            ValueError: ``beam_size`` < 1, or ``target_lengths`` of another length or < 0.
        """
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        if isinstance(sources, Tensor):
            sources = [[t for t in row if t != PAD_ID] for row in sources.tolist()]
        if target_lengths is not None:
            if len(target_lengths) != len(sources) or min(target_lengths, default=0) < 0:
                raise ValueError("target_lengths must give one length >= 0 per sentence")
            out: list[list[int]] = [[] for _ in sources]
            # Each length is one call; they are submitted asynchronously so that the
            # inter_threads replicas translate different lengths at once (synchronous calls of
            # groups smaller than max_batch_size kept one replica busy and the others idle).
            pending = []
            for n in sorted(set(target_lengths)):
                rows = [i for i, m in enumerate(target_lengths) if m == n]
                tokens = [self._pieces(sources[i]) for i in rows]
                results = self.translator.translate_batch(
                    tokens,
                    max_batch_size=max_batch_size,
                    beam_size=beam_size,
                    length_penalty=length_penalty,
                    min_decoding_length=n + 1,
                    max_decoding_length=n + 1,
                    max_input_length=0,
                    use_vmap=use_vmap,
                    suppress_sequences=[[SPECIAL_PIECES[BOS_ID]], [SPECIAL_PIECES[PAD_ID]]],
                    asynchronous=True,
                )
                pending.append((n, rows, results))
            for n, rows, results in pending:
                for i, result in zip(rows, results, strict=True):
                    out[i] = [self.ids[p] for p in result.result().hypotheses[0]][:n]
            return out
        tokens, limits = [], []
        for ids in sources:
            tokens.append(self._pieces(ids))
            limit = int(max_len_a * (len(tokens[-1]) + 1) + max_len_b)  # as ATModel._max_lengths
            limits.append(min(max(limit, 1), self.max_target_positions))
        if not tokens:
            return []
        results = self.translator.translate_batch(
            tokens,
            max_batch_size=max_batch_size,
            beam_size=beam_size,
            length_penalty=length_penalty,
            return_end_token=True,
            min_decoding_length=0,
            max_decoding_length=max(max(limits) - 1, 1),
            max_input_length=0,
            use_vmap=use_vmap,
            suppress_sequences=[[SPECIAL_PIECES[BOS_ID]], [SPECIAL_PIECES[PAD_ID]]],
        )
        out = []
        for result, limit in zip(results, limits, strict=True):
            ids = [self.ids[p] for p in result.hypotheses[0]]
            if EOS_ID in ids:
                ids = ids[: ids.index(EOS_ID)]
            out.append(ids[: limit - 1])
        return out

    def _pieces(self, ids: list[int]) -> list[str]:
        """The pieces of ``x`` (``</s>`` dropped: CTranslate2 adds its own)."""
        body = ids[:-1] if ids and ids[-1] == EOS_ID else ids
        return [self.pieces[t] for t in body]
