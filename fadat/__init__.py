"""fadat: Directed Acyclic Transformers for non-autoregressive machine translation, trained with
the NLL of the DAG (DA-Transformer, Huang et al. 2022) and the fuzzy alignment objective (FA-DAT,
Ma et al. 2023), in plain PyTorch.

Every verb of the ``fadat`` command is a function here, with keyword arguments whose defaults
are the flags' (the command line is a thin layer over them, :mod:`fadat.cli`)::

    import fadat

    data = fadat.prepare("parallel-text", "data/mine", source_file="train.en",
                         target_file="train.de", source_lang="en", target_lang="de")
    fadat.train(fadat.TrainConfig(data=str(data), run_dir="runs/mine", preset="cpu-small"))
    model = fadat.average("runs/mine", "models/mine", data=data)
    report = fadat.evaluate(model, data=data, strategies=["lookahead"])
    fadat.Translator.from_pretrained(model).translate(["A sentence."])

``fadat serve`` is :func:`fadat.serve.serve` (``fadat.serve`` is the server's package).

Importing fadat changes nothing in the host process and imports no torch: each name is loaded
when first used. The ``fadat`` command opts into the memory settings of
:func:`fadat.process.tune_memory`.
"""

from __future__ import annotations

__version__ = "0.1.0"

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for type checkers and IDEs only; at run time see __getattr__
    from fadat.data.prepare import prepare as prepare
    from fadat.evaluation.analysis import analyze as analyze
    from fadat.evaluation.evaluate import evaluate as evaluate
    from fadat.evaluation.show_graph import show_graph as show_graph
    from fadat.models.shortlist import shortlist as shortlist
    from fadat.training.average import average as average
    from fadat.training.config import TrainConfig as TrainConfig
    from fadat.training.snapshot import snapshot as snapshot
    from fadat.training.trainer import train as train
    from fadat.translation.distill import distill as distill
    from fadat.translation.export import export as export
    from fadat.translation.translator import Translator as Translator

#: public name -> the module that defines it (imported on first use: `import fadat` stays light).
_LAZY: dict[str, str] = {
    "Translator": "fadat.translation.translator",
    "prepare": "fadat.data.prepare",
    "TrainConfig": "fadat.training.config",
    "train": "fadat.training.trainer",
    "average": "fadat.training.average",
    "snapshot": "fadat.training.snapshot",
    "evaluate": "fadat.evaluation.evaluate",
    "analyze": "fadat.evaluation.analysis",
    "show_graph": "fadat.evaluation.show_graph",
    "distill": "fadat.translation.distill",
    "export": "fadat.translation.export",
    "shortlist": "fadat.models.shortlist",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fadat' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
