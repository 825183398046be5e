"""``python -m fadat.cli``: the ``fadat`` command without the installed console script."""

from __future__ import annotations

import sys

from fadat.cli import main

sys.exit(main())
