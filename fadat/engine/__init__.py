"""The DAT's inference engine outside PyTorch: an exported graph run by ONNX Runtime and the
top-1 decoders in numpy.

- :mod:`.decoding_np`: greedy, lookahead (without n-gram bans), Viterbi and joint-Viterbi over
  numpy arrays, the same outputs as :mod:`fadat.decoding` on the same graphs;
- :mod:`.runtime`: :class:`~fadat.engine.runtime.OnnxDAT`, a directory written by
  ``fadat export --format onnx`` (:mod:`fadat.translation.onnx_export`) run with ONNX Runtime,
  numpy and sentencepiece.

Nothing in this package imports torch or another fadat package (``import fadat`` is lazy), so
it runs where only ``onnxruntime``, ``numpy`` and ``sentencepiece`` are installed
(``pip install --no-deps fadat``; docs/engine.md). Nothing is imported here; the engine choice
of the front ends is defined here so that their argument parsers need no torch.
"""

#: The engines a DAT translates with (:func:`fadat.translation.engines.load_translation_model`).
ENGINES = ("torch", "onnxruntime")

#: The engine used when none is named. ``torch`` until the benchmark of issue 45 (item 5)
#: measures which is faster on each CPU kind.
DEFAULT_ENGINE = "torch"
