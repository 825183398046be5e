"""MkDocs hook: the command-line reference, generated from the ``fadat`` parsers at build time.

One page per verb (``reference/cli/VERB.md``) and an index, rendered from
:func:`fadat.cli.build_parser`, so the reference cannot drift from the flags the command accepts.
Nothing here is written to disk: the pages are added to the build's files in ``on_files``.
"""

from __future__ import annotations

import argparse
import html
import os
from pathlib import Path

from mkdocs.structure.files import File, Files

CLI_DIR = "reference/cli"
#: Where the guide to an ONNX Runtime export will live; in the nav once the page exists.
ENGINE_PAGE = ("Export to ONNX Runtime", "engine.md")


def _verb_parser(verb: str) -> argparse.ArgumentParser:
    from fadat.cli import build_parser

    parser = build_parser(verb)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[verb]


def _cell(text: str) -> str:
    # A Markdown table cell: no raw HTML, no pipes, no line breaks.
    return html.escape(" ".join(text.split()), quote=False).replace("|", "\\|")


def _invocation(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    if not action.option_strings:
        return formatter._metavar_formatter(action, action.dest)(1)[0]
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    metavar = formatter._format_args(action, action.dest.upper())
    return ", ".join(f"{opt} {metavar}" for opt in action.option_strings)


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or action.required:
        return ""
    return f"`{action.default}`"


def verb_page(verb: str, help_text: str) -> str:
    """The Markdown page of one verb: usage, then one table per argument group."""
    parser = _verb_parser(verb)
    formatter = parser._get_formatter()
    usage = parser.format_usage().strip()
    if usage.startswith("usage: "):
        usage = usage[len("usage: ") :]
    lines = [
        f"# fadat {verb}",
        "",
        f"{help_text[0].upper()}{help_text[1:]}.",
        "",
        "*Generated from the parser of `fadat " + verb + "` when the site is built.*",
        "",
        "```text",
        usage,
        "```",
        "",
    ]
    for group in parser._action_groups:
        actions = [
            a
            for a in group._group_actions
            if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)
        ]
        if not actions:
            continue
        title = {"options": "Options", "positional arguments": "Arguments"}.get(
            group.title or "", group.title or "Options"
        )
        lines += [f"## {title[0].upper()}{title[1:]}", ""]
        if group.description:
            lines += [_cell(group.description), ""]
        lines += ["| argument | default | what |", "|---|---|---|"]
        for action in actions:
            what = formatter._expand_help(action) if action.help else ""
            if action.choices is not None and not action.option_strings:
                what = f"{what} (one of: {', '.join(map(str, action.choices))})"
            invocation = _cell(_invocation(action, formatter))
            lines.append(f"| `{invocation}` | {_default(action)} | {_cell(what)} |")
        lines.append("")
    return "\n".join(lines)


def index_page(verbs: dict[str, tuple[str, str]]) -> str:
    lines = [
        "# Command line",
        "",
        "Every verb of the `fadat` command, generated from its parser when the site is built. "
        "The exit codes and error rules that all verbs share are in "
        "[exit codes and errors](../errors.md).",
        "",
        "| verb | what |",
        "|---|---|",
    ]
    for verb, (_, help_text) in verbs.items():
        lines.append(f"| [`fadat {verb}`]({verb}.md) | {_cell(help_text)} |")
    return "\n".join(lines) + "\n"


def _expand_nav(nav: list, verbs: dict[str, tuple[str, str]], docs_dir: Path) -> list:
    """The nav with the generated CLI pages in place of ``reference/cli/index.md`` and the
    engine guide after the export guide when ``docs/engine.md`` exists."""
    out = []
    for item in nav:
        if isinstance(item, dict):
            ((title, value),) = item.items()
            if value == f"{CLI_DIR}/index.md":
                pages = [{"Overview": value}]
                pages += [{f"fadat {verb}": f"{CLI_DIR}/{verb}.md"} for verb in verbs]
                item = {title: pages}
            elif isinstance(value, list):
                item = {title: _expand_nav(value, verbs, docs_dir)}
            out.append(item)
            if value == "guides/export.md" and (docs_dir / ENGINE_PAGE[1]).is_file():
                out.append({ENGINE_PAGE[0]: ENGINE_PAGE[1]})
        else:
            out.append(item)
    return out


def on_config(config):
    from fadat.cli import VERBS

    # The usage lines wrap at the terminal's width: the same width on every machine.
    os.environ["COLUMNS"] = "100"
    config["nav"] = _expand_nav(config["nav"], VERBS, Path(config["docs_dir"]))
    return config


def on_files(files: Files, config) -> Files:
    from fadat.cli import VERBS

    files.append(File.generated(config, f"{CLI_DIR}/index.md", content=index_page(VERBS)))
    for verb, (_, help_text) in VERBS.items():
        files.append(
            File.generated(config, f"{CLI_DIR}/{verb}.md", content=verb_page(verb, help_text))
        )
    return files
