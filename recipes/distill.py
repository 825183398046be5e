"""Sequence-level knowledge distillation: this recipe is now the ``fadat distill`` verb
(:func:`fadat.translation.distill.distill`); kept so that older commands keep working.

Usage::

    python recipes/distill.py --model runs/at-cpu-small-model --data data/bible-en-es \
        --output data/bible-en-es-distill [--beam 5] [--threads 2] [--batch-size 64]
"""

from __future__ import annotations

import sys

from fadat import cli

if __name__ == "__main__":
    sys.exit(cli.main(["distill", *sys.argv[1:]]))
