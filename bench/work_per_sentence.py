"""Work per sentence in multiply-adds, by part, for DAT designs at several decoding λ and for the
AT in CTranslate2's greedy and beam search (issue 44: "what stands in the way, measured").

Work does not depend on trained weights, so a model is given as a model directory (its
config.json and spm.model; the weights are not read) or as a training config (YAML, with the
vocabulary size and a sentencepiece model for tokenising). Every model tokenises the same raw
test sentences with its own sentencepiece model.

Usage (docs/speed-sweep.md, "Work per sentence")::

    python bench/work_per_sentence.py --data data/bible-en-es-4k \\
        --dat base=configs/dat-cpu-small-nll.yaml --dat 5x1=configs/dat-cpu-small-5x1-nll.yaml \\
        [--dat NAME=MODEL_DIR ...] --vocab 4000 \\
        --spm models/bible-en-es-fadat-cpu-small/spm.model \\
        --at configs/at-cpu-small.yaml --at-vocab 8000 --at-spm AT_SPM \\
        [--ratios 2 3 4 6] [--beam 5] [--test-sentences 0] [--verify 3] [--threads 1] \\
        [--json FILE]
    python bench/work_per_sentence.py --src SRC --ref REF --dat MODEL_DIR --at AT_DIR

What is counted. fadat's own forward code runs, in fp32 on the CPU with random weights, under
:class:`torch.utils.flop_counter.FlopCounterMode`; multiply-adds (MACs) are its FLOPs / 2 (it
counts ``2·m·n·k`` for an ``(m, k) × (k, n)`` product). The operators counted are the matrix
products of torch's registry that run here, ``aten.mm``, ``aten.addmm`` (linear layers: the bias
add is not counted), ``aten.bmm`` and ``aten.baddbmm``, and the attention
``aten.scaled_dot_product_attention`` (and ``aten._scaled_dot_product_flash_attention_for_cpu``),
which torch's registry counts only for its CUDA kernels: here it is counted by torch's own
formula (``torch.utils.flop_counter.sdpa_flop_count``: the scores ``Q·Kᵀ`` and the weighted sum
``P·V``, ``2·n_q·n_k·d`` MACs, masked entries included). Not counted: element-wise work (bias
adds, GELU, LayerNorm, residuals, the token embedding and positions, ``copy_source``'s gather),
the softmaxes and log-softmaxes, the masking, and the DAG decoders' own work, which is given
apart as an analytic count of add–max pairs (:func:`dag_decoder_ops`: lookahead ``L²``, since
fadat scores every vertex's successors; joint-Viterbi ``Σ_{k=2}^{L−2} (L−k)² + Σ_{k=1}^{L−2}
(L−k)``, about ``L³/3``). On the sweep's test sentences that is small beside the
multiply-adds (the table's ``jV DP`` column): the median sentence at λ = 6 (L = 180) has 1.9 M
add–max pairs against 571–878 M multiply-adds (0.2–0.3 %); the longest (L = 522) 47 M, 1.6 %
of base's and 2.6 % of 5+1's. int8 and bf16 do the same multiply-adds in other number formats.

The parts, attributed by FlopCounterMode's per-module breakdown (the modules fadat's code calls:
the encoder, the decoder stack, the links head; the rest of the pass is the token head):

- DAT, per sentence of ``S = |x </s>|`` source tokens at decoding λ: one pass of
  :func:`fadat.models.inference.graph_top1` (the inference fast path that lookahead and
  joint-Viterbi run on, batch 1): the encoder over ``S``; the decoder layers over the graph's
  ``L = int(λ·S)`` vertices (self-attention over ``L``, cross-attention to ``S``); the links
  head (query, key and gate projections of ``[h; position]`` and the ``L × L`` scores); the token
  head: the whole ``(L, V)`` output projection, as that path computes it for lookahead and
  joint-Viterbi (greedy computes it on its path's vertices only, which depends on the trained
  links: not counted here). The JSON splits the decoder into self-attention, cross-attention
  and FFN.
- AT, per sentence forced to its reference's length (``n`` pieces of the AT's sentencepiece
  model, ``n + 1`` decoding steps, as bench/bench_inference.py's ``=ref len`` rows): the encoder
  once over ``S``; then fadat's incremental decoder step (``ATModel._decoder`` with its
  key/value cache: self-attention of the new position over the ``t + 1`` cached positions,
  cross-attention over ``S``, whose keys and values are projected at the first step and
  cached) and the output projection over the vocabulary, at every step. The steps are scheduled
  as CTranslate2's beam search does on a CPU (``BeamSearch::search``,
  ``expand_after_first_step``): the first step on one row per sentence, after which its cache
  and the encoder states are replicated to ``beam`` rows (fadat's ``_reorder_cache``); every
  later step runs ``beam`` rows. Greedy is ``beam = 1``. (fadat's own ``ATModel.beam_search``
  replicates before the first step, so it does the first step, and the cross-attention's key and
  value projection, ``beam`` times.)

Counts are exact integers of the real code. DAT: each distinct source length is counted once
per architecture and λ and reused for every sentence of that length (designs that differ only
in training, such as a λ range, share their counts). AT: the encoder and the first two steps
are counted for each distinct source length, every step once at the shortest source length,
and each sentence's steps composed from them (:func:`at_sentence_work`: a step depends on the
source length only through its cross-attention, and on its index only through its
self-attention); the run checks the composition against whole counts of ``--verify``
sentences and stops if one differs. On the test set of bible-en-es (1,516 sentences, 72
distinct source lengths) the six designs at four λ and the AT take about ten minutes of one
shared CPU core: the counter's dispatch, not the arithmetic, sets the time.

Output: a Markdown table (stdout) with, per design × λ and for the AT greedy and beam: the
median graph size, MACs per sentence (median, mean, p90 over the sentences, in millions), each
part's share of the total over all sentences (its sum / the total's sum), the DAT's ratio to the
AT (beam and greedy) on the same sentences as the median of per-sentence ratios and as the
ratio of the means, and the median of joint-Viterbi's add–max pairs. ``--json FILE``: the
command, the inputs (files, sentencepiece models with their sha256, model configs), the
per-length counts (machine-independent) and the summaries.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from fadat.data.contract import BOS_ID, EOS_ID
from fadat.errors import InputError
from fadat.models.architectures import TranslationModel, model_class
from fadat.models.config import ModelConfig
from fadat.outputs import atomic_write

aten = torch.ops.aten

#: The DAT's parts in the JSON; the table sums the three ``decoder_*`` (:func:`coarse_parts`).
DAT_DETAIL = (
    "encoder",
    "decoder_self_attention",
    "decoder_cross_attention",
    "decoder_ffn",
    "links_head",
    "token_head",
)
#: The AT's parts in the JSON, likewise.
AT_DETAIL = (
    "encoder",
    "decoder_self_attention",
    "decoder_cross_attention",
    "decoder_ffn",
    "output_projection",
)

#: Operators counted besides torch's registry (which has mm, addmm, bmm, baddbmm and the CUDA
#: attention kernels): the CPU attention, by torch's attention formula.
ATTENTION_OPS = (
    aten.scaled_dot_product_attention,
    aten._scaled_dot_product_flash_attention_for_cpu,
)


def _attention_flops(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args, **kwargs):
    """FLOPs of one attention call: torch's ``sdpa_flop_count`` (``Q·Kᵀ`` and ``P·V``)."""
    return sdpa_flop_count(query.shape, key.shape, value.shape)


_attention_flops._get_raw = True  # FlopCounterMode passes the tensors, not their shapes


def flop_counter() -> FlopCounterMode:
    """A silent :class:`FlopCounterMode` (every module depth) that also counts the CPU
    attention (:data:`ATTENTION_OPS`) with torch's attention formula."""
    return FlopCounterMode(
        display=False, depth=None, custom_mapping={op: _attention_flops for op in ATTENTION_OPS}
    )


def counted_macs(fn: Callable[[], Any]) -> tuple[Any, dict[str, int]]:
    """Run ``fn()`` under :func:`flop_counter`.

    Returns:
        ``(fn's result, {module name: MACs})``: the multiply-adds (FLOPs / 2) of every module
        that ran (FlopCounterMode's names: the first module called has its class name, its
        submodules ``Name.child.grandchild``; a module's count includes its submodules') and
        ``"Global"``, the whole call's.
    """
    with flop_counter() as counter:
        out = fn()
    macs = {}
    for name, ops in counter.get_flop_counts().items():
        flops = sum(ops.values())
        if flops % 2:
            raise AssertionError(f"{name}: odd FLOP count {flops} (not multiply-adds)")
        macs[name] = flops // 2
    return out, macs


def _stack_split(macs: Mapping[str, int], prefix: str, layers: int) -> dict[str, int]:
    """Self-attention, cross-attention and FFN (the rest of each layer) MACs of the layers of a
    stack counted under the module name ``prefix``."""
    self_attn = sum(macs.get(f"{prefix}.layers.{i}.self_attn", 0) for i in range(layers))
    cross = sum(macs.get(f"{prefix}.layers.{i}.cross_attn", 0) for i in range(layers))
    return {
        "self_attention": self_attn,
        "cross_attention": cross,
        "ffn": macs.get(prefix, 0) - self_attn - cross,
    }


def _source(length: int) -> torch.Tensor:
    """``(1, length)`` int64 ``x </s>`` of ``length`` tokens (the ids do not change the work)."""
    source = torch.full((1, length), 4, dtype=torch.int64)
    source[0, -1] = EOS_ID
    return source


def dat_work(model: TranslationModel, source_length: int, upsample_ratio: float) -> dict[str, int]:
    """MACs of one batch-1 pass of :func:`fadat.models.inference.graph_top1` (the fast path
    of lookahead and joint-Viterbi: the full ``(L, V)`` token head), by part.

    Args:
        model: a :class:`fadat.models.dat.DATModel` (fp32; weights do not matter).
        source_length: ``S = |x </s>|``.
        upsample_ratio: the decoding λ.

    Returns:
        ``{"graph_size": L, "encoder", "decoder_self_attention", "decoder_cross_attention",
        "decoder_ffn", "links_head", "token_head"}`` (MACs; ``token_head`` is the pass's count
        outside the encoder, the decoder stack and the links head).

    Raises:
        InputError: a source or graph longer than the model's position tables.
    """
    from fadat.models.inference import graph_top1

    (_, _, lengths), macs = counted_macs(
        lambda: graph_top1(model, _source(source_length), upsample_ratio=upsample_ratio)
    )
    encoder = macs.get(type(model.encoder).__name__, 0)
    decoder_name = type(model.decoder).__name__
    split = _stack_split(macs, decoder_name, model.config.decoder_layers)
    links = macs.get(type(model.links_head).__name__, 0)
    return {
        "graph_size": int(lengths[0]),
        "encoder": encoder,
        "decoder_self_attention": split["self_attention"],
        "decoder_cross_attention": split["cross_attention"],
        "decoder_ffn": split["ffn"],
        "links_head": links,
        "token_head": macs["Global"] - encoder - macs.get(decoder_name, 0) - links,
    }


def at_work(
    model: TranslationModel, source_length: int, steps: int, beam: int
) -> tuple[int, list[dict[str, int]]]:
    """MACs of the AT decoding one sentence for ``steps`` steps with a key/value cache, the
    steps scheduled as CTranslate2's beam search on a CPU (the first step on one row, then
    ``beam`` rows; the module docstring).

    Args:
        model: a :class:`fadat.models.at.ATModel` (fp32; weights do not matter).
        source_length: ``S = |x </s>|``.
        steps: decoding steps (``n + 1`` for an output of ``n`` pieces and ``</s>``).
        beam: beam width (1 = greedy).

    Returns:
        ``(encoder MACs, [per step {"decoder_self_attention", "decoder_cross_attention",
        "decoder_ffn", "output_projection"}])``.

    Raises:
        InputError: a source longer than ``max_source_positions`` or more steps than
            ``max_target_positions``.
    """
    from fadat.models.at import _reorder_cache

    decoder_name = type(model.decoder).__name__
    with torch.inference_mode():
        enc, macs = counted_macs(lambda: model.encode(_source(source_length)))
        encoder = macs["Global"]
        cache: list[dict] = [{} for _ in model.decoder.layers]
        prev = torch.full((1, 1), BOS_ID, dtype=torch.int64)
        out = []
        for step in range(steps):
            _, macs = counted_macs(lambda: model._decoder(prev, step, enc, cache))  # noqa: B023
            split = _stack_split(macs, decoder_name, model.config.decoder_layers)
            out.append(
                {
                    "decoder_self_attention": split["self_attention"],
                    "decoder_cross_attention": split["cross_attention"],
                    "decoder_ffn": split["ffn"],
                    "output_projection": macs["Global"] - macs.get(decoder_name, 0),
                }
            )
            if step == 0 and beam > 1:  # CTranslate2 replicates the state after the first step
                index = torch.zeros(beam, dtype=torch.int64)
                enc = enc.index_select(index)
                _reorder_cache(cache, index)
            prev = torch.full((enc.states.shape[0], 1), 4, dtype=torch.int64)  # (rows, 1)
    return encoder, out


def _sum_steps(steps: Sequence[Mapping[str, int]]) -> dict[str, int]:
    """Per-part sums of :func:`at_work`'s steps."""
    return {k: sum(step[k] for step in steps) for k in AT_DETAIL[1:]}


def at_sentence_work(
    model: TranslationModel,
    pairs: Sequence[tuple[int, int]],
    beam: int,
    verify: int = 3,
) -> tuple[dict[tuple[int, int], dict[str, int]], list[tuple[int, int]]]:
    """MACs by part (:data:`AT_DETAIL`) of every ``(source length S, steps T)`` of ``pairs``,
    composed from counts of the real code (:func:`at_work`) and checked against whole counts.

    A step's work depends on the source length only through the cross-attention (its keys and
    values) and on the step only through the self-attention (``t + 1`` cached positions); so
    step ``t ≥ 1`` of a sentence of length ``S`` is step ``t`` of one long count at the
    shortest length ``S₀`` plus the difference of the two lengths' step 1, and step 0 and the
    encoder are counted for every ``S``. That costs one count of ``max T`` steps and two steps
    per distinct ``S`` instead of ``Σ_S max T`` steps (the counter's dispatch costs ~0.1 s a
    step). The composition is checked: ``verify`` sentences (the longest output, the longest
    source, the median source; distinct pairs) are counted whole with :func:`at_work` and must
    agree exactly (then others, where these are fewer than ``verify``).

    Args:
        model: a :class:`fadat.models.at.ATModel`.
        pairs: ``(S, T)`` per sentence (repeats allowed).
        beam: beam width (1 = greedy).
        verify: how many sentences to count whole (0 = none).

    Returns:
        ``({(S, T): {part: MACs}}, [the (S, T) counted whole])``.

    Raises:
        AssertionError: a sentence counted whole disagrees with the composition.
        InputError: as :func:`at_work`.
    """
    distinct = sorted(set(pairs))
    lengths = sorted({s for s, _ in distinct})
    s0, t_all = lengths[0], max(t for _, t in distinct)
    _, base = at_work(model, s0, t_all, beam)  # steps 0 … t_all − 1 at S₀
    first = {s: at_work(model, s, min(2, t_all), beam) for s in lengths}  # encoder, steps 0, 1

    def composed(s: int, t: int) -> dict[str, int]:
        encoder, (step0, *rest) = first[s]
        out = {"encoder": encoder, **step0}
        for k in AT_DETAIL[1:]:
            shift = rest[0][k] - base[1][k] if rest else 0  # step 1 at S minus step 1 at S₀
            out[k] += sum(base[i][k] for i in range(1, t)) + (t - 1) * shift
        return out

    work = {pair: composed(*pair) for pair in distinct}
    picks = [
        max(distinct, key=lambda p: (p[1], p[0])),
        max(distinct, key=lambda p: (p[0], p[1])),
        sorted(pairs)[len(pairs) // 2],
        *distinct,
    ]
    checked = list(dict.fromkeys(picks))[:verify]  # distinct, in this order
    for s, t in checked:
        encoder, steps = at_work(model, s, t, beam)
        whole = {"encoder": encoder, **_sum_steps(steps)}
        if whole != work[s, t]:
            raise AssertionError(
                f"AT work of S={s}, T={t}, beam {beam}: counted whole {whole}, "
                f"composed {work[s, t]}"
            )
    return work, checked


def dag_decoder_ops(graph_size: int) -> dict[str, int]:
    """Add–max pairs of the DAG decoders on a graph of ``L`` vertices (analytic, from the code of
    :mod:`fadat.decoding`; not multiply-adds and not in FlopCounterMode's counts):
    ``lookahead``: ``L²`` (the ``(L, L)`` scores ``links + β·s`` and their argmax per vertex);
    ``joint_viterbi``: ``Σ_{k=2}^{K} (L−k)² + Σ_{k=1}^{K} (L−k)`` with ``K = L − 2`` (the DP's
    lower-right blocks and its per-length ends)."""
    size = graph_size
    k_max = max(size - 2, 0)
    blocks = sum((size - k) ** 2 for k in range(2, k_max + 1))
    ends = sum(size - k for k in range(1, k_max + 1))
    return {"lookahead": size * size, "joint_viterbi": blocks + ends}


# ----------------------------------------------------------------------------- models


@dataclasses.dataclass
class System:
    """A model to count: ``name``, the model (random weights), its sentencepiece processor,
    where they came from (``source``: the directory or config as given; ``spm``: the path) and
    the sentencepiece model's sha256."""

    name: str
    model: TranslationModel
    sp: Any
    source: str
    spm: str
    spm_sha256: str


def load_system(
    name: str, spec: str, model_type: str, vocab: int | None = None, spm: str | None = None
) -> System:
    """A model from a model directory (config.json; spm.model unless ``spm``) or a training
    config (YAML; ``vocab`` and ``spm`` needed), with random weights.

    Raises:
        InputError: a missing or bad directory or config, a model of another ``model_type``,
            a config without ``vocab`` or ``spm``, a sentencepiece model of another vocabulary.
    """
    from fadat.data.build import sha256_file
    from fadat.data.spm import load_sentencepiece
    from fadat.models.directory import check_vocabulary, read_model_metadata, spm_model_path

    path = Path(spec)
    if path.is_dir():
        config = ModelConfig.from_dict(read_model_metadata(path)["config"])
        spm_path = Path(spm) if spm else spm_model_path(path, verify=False)
        if spm_path is None:
            raise InputError(f"{path}: no spm.model (give one with --spm / --at-spm)")
        model = model_class(config.model_type)(config)
    else:
        from fadat.training.config import config_from_dict, load_yaml_config
        from fadat.training.model_init import build_model

        if vocab is None or spm is None:
            raise InputError(f"{spec}: a training config needs the vocabulary size and --spm")
        cfg = config_from_dict({"data": "", "run_dir": "", **load_yaml_config(path)}, spec)
        # The work does not depend on the weights: the initialisations are not loaded.
        cfg = dataclasses.replace(cfg, init_from="", init_encoder_from="")
        model = build_model(cfg, vocab)
        spm_path = Path(spm)
    if model.config.model_type != model_type:
        raise InputError(f"{spec}: a {model.config.model_type!r} model, not {model_type!r}")
    sp = load_sentencepiece(spm_path)
    check_vocabulary(sp, model, where=str(spm_path))
    torch.manual_seed(0)
    return System(name, model.eval(), sp, spec, str(spm_path), sha256_file(spm_path))


def _architecture(config: ModelConfig) -> str:
    """The fields of ``config`` that shape the network (not λ, its range or dropout), as a key."""
    d = config.to_dict()
    for key in ("upsample_ratio", "upsample_ratio_range", "decode_upsample_ratio", "dropout"):
        d.pop(key, None)
    return json.dumps(d, sort_keys=True)


# ----------------------------------------------------------------------------- the report


def summary(values: Sequence[float]) -> dict[str, float]:
    """``{"median", "mean", "p90"}`` of ``values`` (numpy's linear percentiles)."""
    a = np.asarray(values, dtype=np.float64)
    return {
        "median": float(np.median(a)),
        "mean": float(a.mean()),
        "p90": float(np.percentile(a, 90)),
    }


def _columns(records: Sequence[Mapping[str, int]]) -> dict[str, list[int]]:
    """Records with the same keys as columns: ``{key: [value per record]}``."""
    return {key: [r[key] for r in records] for key in records[0]} if records else {}


def _dumps(obj: Any) -> str:
    """``obj`` as indented JSON with every list of numbers on one line."""
    text = json.dumps(obj, indent=1, ensure_ascii=False)
    number = r"-?[0-9][0-9.eE+-]*"
    lists = re.compile(rf"\[\s*((?:{number},\s*)*{number})\s*\]")
    return lists.sub(lambda m: "[" + ", ".join(m.group(1).replace(",", " ").split()) + "]", text)


def coarse_parts(detail: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    """The table's parts from the detailed ones (:data:`DAT_DETAIL`, :data:`AT_DETAIL`): the
    decoder's self-attention, cross-attention and FFN summed into ``decoder``, per sentence."""
    out: dict[str, list[int]] = {}
    for name, values in detail.items():
        part = "decoder" if name.startswith("decoder_") else name
        if part in out:
            out[part] = [a + b for a, b in zip(out[part], values, strict=True)]
        else:
            out[part] = list(values)
    return out


def _row(
    name: str,
    kind: str,
    lam: float | None,
    parts: Mapping[str, Sequence[int]],
    detail: Mapping[str, Sequence[int]],
    references: Mapping[str, np.ndarray],
    graph_sizes: Sequence[int] | None = None,
) -> dict[str, Any]:
    """One row of the report: per-sentence totals and parts summarised, part shares, ratios to
    each reference system's per-sentence totals."""
    total = np.sum([np.asarray(v, dtype=np.int64) for v in parts.values()], axis=0)
    row: dict[str, Any] = {
        "system": name,
        "kind": kind,
        "lambda": lam,
        "total": summary(total),
        "parts": {k: summary(v) for k, v in parts.items()},
        "detail": {k: summary(v) for k, v in detail.items()},
        "share": {k: float(np.sum(v) / total.sum()) for k, v in parts.items()},
        "ratios": {},
    }
    for ref_name, ref_total in references.items():
        row["ratios"][ref_name] = {
            "median_of_ratios": float(np.median(total / ref_total)),
            "ratio_of_means": float(total.mean() / ref_total.mean()),
        }
    if graph_sizes is not None:
        row["graph_size"] = summary(graph_sizes)
        jv = [dag_decoder_ops(size)["joint_viterbi"] for size in graph_sizes]
        la = [dag_decoder_ops(size)["lookahead"] for size in graph_sizes]
        row["dag_decoder_ops"] = {"lookahead": summary(la), "joint_viterbi": summary(jv)}
    return row


def work_per_sentence(
    dats: Sequence[System],
    at: System,
    sources: Sequence[str],
    references: Sequence[str],
    ratios: Sequence[float] = (),
    beam: int = 5,
    verify: int = 3,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """MACs per sentence of every DAT at every λ and of the AT greedy and with ``beam``, on the
    same raw sentences (each system tokenises them with its own sentencepiece model).

    Args:
        dats: the DAT designs.
        at: the AT.
        sources, references: raw source and reference lines (same count).
        ratios: the decoding λ values; empty = each design's own
            (``config.decoding_upsample_ratio``).
        beam: the AT's beam width (> 1).
        verify: AT sentences counted whole to check the composition (:func:`at_sentence_work`).
        progress: called with a line as each part is counted.

    Returns:
        ``{"sentences", "beam", "rows": [...], "counts": {...}}``: ``rows`` as :func:`_row` (AT
        greedy, AT beam, then each design × λ); ``counts`` the per-length MACs they come from,
        as columns (one entry per distinct length): ``"at"``: per ``"greedy"`` / ``"beamK"``,
        ``source_length``, ``steps`` and the parts of :data:`AT_DETAIL` per distinct ``(S, T)``
        of the sentences, and ``verified``, the ``[S, T]`` counted whole; ``"dat"``: per design
        and λ (``"4"``), ``source_length``, ``graph_size`` and the parts of :data:`DAT_DETAIL`
        per distinct ``S``, or ``{"same_counts_as": NAME}`` for a design whose counts are an
        earlier one's (the same network and sentencepiece model).

    Raises:
        InputError: a different number of sources and references; ``beam`` < 2; what
            :func:`dat_work` and :func:`at_work` raise.
        AssertionError: :func:`at_sentence_work`'s check fails.
    """
    from fadat.data.spm import encode_source

    if len(sources) != len(references):
        raise InputError(f"{len(sources)} sources but {len(references)} references")
    if beam < 2:
        raise InputError(f"beam must be at least 2, got {beam}")
    say = progress or (lambda line: None)

    # ---- the AT: per (source length, steps) of the sentences
    at_source = [len(encode_source(at.sp, x)) for x in sources]
    at_steps = [len(at.sp.encode(y)) + 1 for y in references]
    pairs = list(zip(at_source, at_steps, strict=True))
    at_counts: dict[str, Any] = {}
    at_rows = []
    totals: dict[str, np.ndarray] = {}
    for width, label in ((1, "greedy"), (beam, f"beam{beam}")):
        say(f"AT {label}: {len(set(at_source))} source lengths, {len(set(pairs))} (S, steps)")
        work, verified = at_sentence_work(at.model, pairs, width, verify)
        detail = {k: [work[pair][k] for pair in pairs] for k in AT_DETAIL}
        at_counts[label] = {
            "verified": [list(pair) for pair in verified],
            **_columns([{"source_length": s, "steps": t, **work[s, t]} for s, t in sorted(work)]),
        }
        parts = coarse_parts(detail)
        totals[label] = np.sum([np.asarray(v, dtype=np.int64) for v in parts.values()], axis=0)
        at_rows.append((f"AT {label}", parts, detail))
    rows = [_row(name, "at", None, parts, detail, totals) for name, parts, detail in at_rows]

    # ---- the DATs: one pass per architecture, λ and source length
    cache: dict[tuple[str, float, int], dict[str, int]] = {}
    dat_counts: dict[str, dict[str, Any]] = {}
    for design in dats:
        lengths = [len(encode_source(design.sp, x)) for x in sources]
        key = _architecture(design.model.config)
        dat_counts[design.name] = {}
        for lam in ratios or [design.model.config.decoding_upsample_ratio]:
            lam = float(lam)
            todo = sorted({s for s in lengths if (key, lam, s) not in cache})
            say(f"{design.name} λ={lam:g}: {len(todo)} source lengths to count")
            for s in todo:
                cache[key, lam, s] = dat_work(design.model, s, lam)
            detail = {k: [cache[key, lam, s][k] for s in lengths] for k in DAT_DETAIL}
            parts = coarse_parts(detail)
            sizes = [cache[key, lam, s]["graph_size"] for s in lengths]
            rows.append(_row(design.name, "dat", lam, parts, detail, totals, sizes))
            dat_counts[design.name][f"{lam:g}"] = _columns(
                [{"source_length": s, **cache[key, lam, s]} for s in sorted(set(lengths))]
            )
        for earlier, counts in dat_counts.items():
            if earlier != design.name and counts == dat_counts[design.name]:
                dat_counts[design.name] = {"same_counts_as": earlier}
                break
    return {
        "sentences": len(sources),
        "beam": beam,
        "rows": rows,
        "counts": {"at": at_counts, "dat": dat_counts},
    }


def markdown_table(report: Mapping[str, Any]) -> str:
    """The report's rows as a Markdown table: MACs in millions, shares in %, ratios to the AT."""
    beam = f"beam{report['beam']}"
    head = (
        "| system | λ | L (median) | M MACs median | mean | p90 | encoder | decoder | links head "
        f"| token head / output proj. | ÷ AT {beam}: median, of means "
        "| ÷ AT greedy: median, of means | jV DP (M, median) |"
    )
    lines = [head, "|" + "---|" * 13]

    def share(row: Mapping[str, Any], part: str) -> str:
        value = row["share"].get(part)
        return "—" if value is None else f"{100 * value:.1f} %"

    for row in report["rows"]:
        token = "token_head" if row["kind"] == "dat" else "output_projection"
        ratio = [
            f"{row['ratios'][r]['median_of_ratios']:.2f}, {row['ratios'][r]['ratio_of_means']:.2f}"
            for r in (beam, "greedy")
        ]
        total = row["total"]
        cells = [
            row["system"],
            "—" if row["lambda"] is None else f"{row['lambda']:g}",
            "—" if "graph_size" not in row else f"{row['graph_size']['median']:g}",
            f"{total['median'] / 1e6:.1f}",
            f"{total['mean'] / 1e6:.1f}",
            f"{total['p90'] / 1e6:.1f}",
            share(row, "encoder"),
            share(row, "decoder"),
            share(row, "links_head"),
            share(row, token),
            *ratio,
            "—"
            if "dag_decoder_ops" not in row
            else f"{row['dag_decoder_ops']['joint_viterbi']['median'] / 1e6:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The command line (the module docstring); returns the report written by ``--json``."""
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument(
        "--dat",
        action="append",
        required=True,
        metavar="[NAME=]DIR_OR_CONFIG",
        help="a DAT design: a model directory or a training config (YAML); repeatable",
    )
    p.add_argument("--vocab", type=int, help="vocabulary size of the DATs given as configs")
    p.add_argument("--spm", help="sentencepiece model of the DATs given as configs")
    p.add_argument("--at", required=True, help="the AT: a model directory or a training config")
    p.add_argument("--at-vocab", type=int, help="vocabulary size of an AT given as a config")
    p.add_argument("--at-spm", help="sentencepiece model of an AT given as a config")
    p.add_argument("--data", help="prepared data directory: raw/test.src.txt, raw/test.ref.txt")
    p.add_argument("--src", help="or: source text file")
    p.add_argument("--ref", help="and its reference file")
    p.add_argument("--ratios", type=float, nargs="*", default=[], help="decoding λ values")
    p.add_argument("--beam", type=int, default=5, help="the AT's beam width (default 5)")
    p.add_argument("--test-sentences", type=int, default=0, help="first N only (0 = all)")
    p.add_argument(
        "--verify",
        type=int,
        default=3,
        help="AT sentences counted whole to check the per-step composition (default 3)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads (speed only)")
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)
    if bool(args.data) == bool(args.src and args.ref):
        p.error("give --data, or --src and --ref")
    torch.set_num_threads(args.threads)

    if args.data:
        raw = Path(args.data) / "raw"
        src_path, ref_path = raw / "test.src.txt", raw / "test.ref.txt"
    else:
        src_path, ref_path = Path(args.src), Path(args.ref)
    sources = src_path.read_text(encoding="utf-8").splitlines()
    references = ref_path.read_text(encoding="utf-8").splitlines()
    if args.test_sentences:
        sources, references = sources[: args.test_sentences], references[: args.test_sentences]

    dats = []
    for value in args.dat:
        name, sep, spec = value.partition("=")
        if not sep:
            name, spec = Path(value).stem if Path(value).is_file() else Path(value).name, value
        dats.append(load_system(name, spec, "dat", args.vocab, args.spm))
    at = load_system("AT", args.at, "at", args.at_vocab, args.at_spm)

    report = work_per_sentence(
        dats,
        at,
        sources,
        references,
        args.ratios,
        args.beam,
        args.verify,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    table = markdown_table(report)
    print(table)
    out = {
        "command": "python bench/work_per_sentence.py " + shlex.join(argv),
        "counting": (
            "multiply-adds = FLOPs / 2 of torch.utils.flop_counter.FlopCounterMode over fadat's "
            "forward code in fp32 (aten mm, addmm, bmm, baddbmm; scaled_dot_product_attention "
            "by torch's sdpa_flop_count); element-wise work, softmaxes and the DAG decoders "
            "are not counted (dag_decoder_ops: add-max pairs). DAT: "
            "fadat.models.inference.graph_top1 at batch 1 (full (L, V) token head). AT: "
            "forced to the reference length (n + 1 steps), fadat's cached decoder step, "
            "CTranslate2's CPU schedule (first step on one row, then beam rows)"
        ),
        "inputs": {
            "source": str(src_path),
            "reference": str(ref_path),
            "sentences": len(sources),
            "ratios": [float(r) for r in args.ratios],
            "beam": args.beam,
            "dat": {
                d.name: {
                    "from": d.source,
                    "spm": d.spm,
                    "spm_sha256": d.spm_sha256,
                    "config": d.model.config.to_dict(),
                }
                for d in dats
            },
            "at": {
                "from": at.source,
                "spm": at.spm,
                "spm_sha256": at.spm_sha256,
                "config": at.model.config.to_dict(),
            },
        },
        **report,
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(args.json, _dumps(out) + "\n", "--json")
    return out


if __name__ == "__main__":
    main()
