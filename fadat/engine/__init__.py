"""The DAT's inference engine outside PyTorch: an exported graph run by ONNX Runtime, the
top-1 decoders in numpy and the compiled beam search.

- :mod:`.decoding_np`: greedy, lookahead (without n-gram bans), Viterbi and joint-Viterbi over
  numpy arrays, the same outputs as :mod:`fadat.decoding` on the same graphs;
- :mod:`.beam_np`: the DAG beam search (optional KenLM language model) over each vertex's top
  tokens in numpy arrays, compiled with numba (:mod:`._beam_jit`); the torch engine's
  :func:`fadat.decoding.beam_search` runs it too;
- :mod:`.runtime`: :class:`~fadat.engine.runtime.OnnxDAT`, a directory written by
  ``fadat export --format onnx`` (:mod:`fadat.translation.onnx_export`) run with ONNX Runtime,
  numpy and sentencepiece;
- :mod:`.shortlist`: the lexical vocabulary shortlist's table and candidate rule, which both
  engines use (the ONNX Runtime engine on an export made with ``--shortlist``).

Nothing in this package imports torch or another fadat package (``import fadat`` is lazy), so
it runs where only ``onnxruntime``, ``numpy`` and ``sentencepiece`` are installed
(``pip install --no-deps fadat``; docs/engine.md); the beam search imports ``numba`` (and
``kenlm`` with a KenLM binary language model) when it runs, not before. Nothing heavy is
imported here; the engine choice of the front ends is defined here so that their argument
parsers need no torch.
"""

from __future__ import annotations

from pathlib import Path

#: The engines a DAT translates with (:func:`fadat.translation.engines.load_translation_model`);
#: ``auto`` is the engine of the directory given (:func:`resolve_engine`).
ENGINES = ("auto", "torch", "onnxruntime")

#: The engine used when none is named: the directory's own. A model directory is not exported
#: to ONNX Runtime on its own, although on an AVX2 CPU (AMD Zen 3, one thread, batch 1;
#: docs/results/cpu-speed.md) the ONNX Runtime engine was faster than torch at the same precision
#: (fp32 39.7 against 51.1 ms, int8 25.1 against 40.6 ms) and level with it in batches: the
#: export takes 30–60 s of CPU, more than it saves on a short input, and on CPUs with bf16
#: hardware (AMX) torch's bf16 has no ONNX Runtime counterpart. Export once
#: (``fadat export --format onnx``) and pass the export to use it.
DEFAULT_ENGINE = "auto"


def resolve_engine(directory: str | Path, engine: str) -> str:
    """The engine that translates ``directory``: ``engine`` itself, or for ``auto``
    ``onnxruntime`` when ``directory`` is an export of ``fadat export --format onnx`` and
    ``torch`` otherwise (a model directory). Imports no torch.

    Raises:
        ValueError: ``engine`` not one of :data:`ENGINES`.
    """
    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine != "auto":
        return engine
    from fadat.engine.runtime import is_engine_dir

    return "onnxruntime" if is_engine_dir(directory) else "torch"
