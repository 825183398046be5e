"""``fadat <verb>``: a thin argparse layer. Each verb lives in its own module, which provides
``add_arguments(parser)`` and ``run(args) -> int``; this file holds no logic.

Exit codes for every verb: 0 success, 2 bad input (one line on stderr, no traceback),
1 internal error, 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from fadat.errors import InputError

# verb -> (module, one-line help). Modules are imported only when their verb runs.
VERBS: dict[str, tuple[str, str]] = {
    "prepare": ("fadat.data.prepare", "build a binarized dataset from parallel text or a built-in corpus"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fadat", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb, (module_name, help_text) in VERBS.items():
        p = sub.add_parser(verb, help=help_text, description=help_text)
        p.set_defaults(_module=module_name)
        importlib.import_module(module_name).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fadat`` console script; returns the process exit code."""
    try:
        args = build_parser().parse_args(argv)
        return int(importlib.import_module(args._module).run(args) or 0)
    except InputError as err:
        print(f"fadat: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fadat: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
