"""fadat: Directed Acyclic Transformers for non-autoregressive machine translation, trained with
the NLL of the DAG (DA-Transformer, Huang et al. 2022) and the fuzzy alignment objective (FA-DAT,
Ma et al. 2023), in plain PyTorch.

Importing fadat changes nothing in the host process; the ``fadat`` command opts into the memory
settings of :func:`fadat.process.tune_memory`.
"""

from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for type checkers and IDEs only; at run time see __getattr__
    from fadat.translation.translator import Translator as Translator


def __getattr__(name: str):
    # Lazy export: `import fadat` stays light (no torch import) until Translator is used.
    if name == "Translator":
        from fadat.translation.translator import Translator

        return Translator
    raise AttributeError(f"module 'fadat' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "Translator"])
