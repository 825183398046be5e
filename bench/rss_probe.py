"""Peak resident memory of one system of bench/bench_inference.py, in a process of its own.

Run by the benchmark, one child per row, after its timed passes::

    python bench/rss_probe.py SPEC.json

``SPEC.json``: ``{"kind": "torch" | "onnx" | "ct2", "batches": [[ids, ...], ...], ...}`` with the
kind's fields (``torch``: ``dat``, ``precision``, ``strategy``, ``shortlist``, ``prune``,
``ratio``, and for the beam search (``strategy`` ``beam``) ``lm`` (a KenLM file or null),
``gamma`` and ``beam_size``; ``onnx``: ``directory``, ``strategy``, ``ratio``, and for ``beam``
``lm``, ``gamma`` and ``beam_size`` as for torch; ``ct2``: ``directory``, ``compute``,
``beam``, ``vmap``, ``lengths`` (per batch the forced output lengths, or null)). The child
imports only what its kind needs (``onnx``: onnxruntime, numpy, sentencepiece and
:mod:`fadat.engine.runtime`, no torch; the beam search adds numba, and kenlm with an LM), then
reads its peak resident set size (``VmHWM``, :func:`peak_mib`) as ``base``, loads the system on
one thread, translates every batch once and reads the peak again. Prints one JSON line:
``{"base_mib", "peak_mib", "torch": whether torch was imported}``.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path


def peak_mib() -> float:
    """This process's peak resident set size so far in MiB: ``VmHWM`` of
    ``/proc/self/status``, else ``getrusage``'s ``ru_maxrss``.

    ``VmHWM`` belongs to the process's own address space, which ``exec`` replaces; Linux
    carries ``ru_maxrss`` over ``exec`` from the parent that forked the child, so in a child of
    the (large) benchmark process it would read the benchmark's peak.
    """
    try:
        for line in Path("/proc/self/status").read_text(encoding="utf-8").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def probe(spec: dict) -> dict:
    """Load the system of ``spec`` (module docstring), run its batches; the two peaks."""
    kind, batches = spec["kind"], spec["batches"]
    if kind == "onnx":
        from fadat.engine.runtime import OnnxDAT

        base = peak_mib()
        engine = OnnxDAT(spec["directory"], intra_threads=1)
        options = {}
        if spec.get("beam_size") is not None:  # the beam rows: the beam's size sets its memory
            options["beam_size"] = spec["beam_size"]
        if spec.get("lm"):  # the beam+LM rows: the LM is part of what the row holds
            import kenlm

            options.update(gamma=spec["gamma"], lm=kenlm.Model(spec["lm"]))
        for batch in batches:
            engine.translate_ids(batch, spec["strategy"], spec.get("ratio"), **options)
    elif kind == "torch":
        import torch

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_inference import BEAM, beam_translate, dat_translate

        from fadat.models.directory import load_model
        from fadat.models.inference import with_precision
        from fadat.models.shortlist import load_shortlist
        from fadat.translation.language_model import language_model_options

        torch.set_num_threads(1)
        base = peak_mib()
        model, sp = load_model(spec["dat"], "cpu")
        if spec["strategy"] == BEAM:  # the LM (if any) is part of what the row holds
            lm = spec.get("lm")
            options = {}
            if spec.get("beam_size") is not None:
                options["beam_size"] = spec["beam_size"]
            if lm:
                options.update(gamma=spec["gamma"], **language_model_options(lm, model, sp))
            run = beam_translate(with_precision(model, spec["precision"]), options, spec["ratio"])
        else:
            model = with_precision(model, spec["precision"])
            sl = spec.get("shortlist")
            sl = load_shortlist(sl, model.config.vocab_size) if sl else None
            run = dat_translate(model, spec["strategy"], sl, spec.get("prune"), spec.get("ratio"))
        for batch in batches:  # as the benchmark times it (graph_top1 runs without grad)
            run(batch)
    elif kind == "ct2":
        from fadat.translation.export import CTranslate2AT

        base = peak_mib()
        engine = CTranslate2AT(spec["directory"], spec["compute"], 1, 1)
        lengths = spec.get("lengths") or [None] * len(batches)
        for batch, forced in zip(batches, lengths, strict=True):
            engine.translate_ids(
                batch, beam_size=spec["beam"], use_vmap=spec["vmap"], target_lengths=forced
            )
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return {"base_mib": base, "peak_mib": peak_mib(), "torch": "torch" in sys.modules}


if __name__ == "__main__":
    print(json.dumps(probe(json.loads(Path(sys.argv[1]).read_text(encoding="utf-8")))))
