"""The one reader of user text files: corpora for ``fadat prepare``, ``--input`` of ``translate``
and ``score``, shortlist corpora and the training YAML.

Conventions: UTF-8; lines end with ``\\n`` or ``\\r\\n`` (a carriage return elsewhere is refused:
CR-only line endings would otherwise make the file one line); a final newline is optional; a
leading byte-order mark is dropped. A problem is an :class:`~fadat.errors.InputError` that names
the file, the 1-based line (``FILE:LINE:``) and the byte.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from fadat.errors import InputError

READ_BLOCK = 1 << 22  # bytes decoded at a time

_LONE_CR = re.compile(rb"\r(?!\n)")

#: The names under which :func:`iter_lines` reads standard input (with ``stdin=True``).
STDIN = (None, "-")


def iter_lines(path: str | Path | None, stdin: bool = False) -> Iterator[str]:
    """Lines of a UTF-8 text file, read in blocks of ``READ_BLOCK`` bytes, so that a corpus of
    any size streams. With ``stdin``, ``None`` or ``"-"`` is standard input (the verbs whose
    ``--input`` defaults to it); else ``"-"`` is a file name like any other.

    Raises:
        InputError: the file cannot be opened (``FILE: cannot read (reason)``), a NUL byte (not a
            text file), invalid UTF-8 (``FILE:LINE: … at byte offset N`` of the file, and the
            byte of the line) or a carriage return not followed by a line feed, when the
            iteration reaches it.
    """
    if stdin and path in STDIN:
        yield from _iter_stream("<stdin>", sys.stdin.buffer)
        return
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror or err})") from err
    with f:
        yield from _iter_stream(str(path), f)


def read_lines(path: str | Path | None, stdin: bool = False) -> list[str]:
    """All lines of a UTF-8 text file (with ``stdin``, ``None`` or ``"-"``: standard input);
    see :func:`iter_lines` for the conventions and errors."""
    return list(iter_lines(path, stdin))


def _iter_stream(name: str, f: BinaryIO) -> Iterator[str]:
    line = 0  # lines before the current block
    offset = 0  # byte offset of the current block
    rest = b""  # an unfinished line carried into the next block
    try:
        while True:
            data = f.read(READ_BLOCK)
            if not data:
                if rest:  # a last line without a final newline
                    yield from _decode_block(name, rest, line, offset)
                return
            data = rest + data
            cut = data.rfind(b"\n") + 1
            block, rest = data[:cut], data[cut:]
            if block:
                lines = _decode_block(name, block, line, offset)
                line += len(lines)
                offset += len(block)
                yield from lines
    except OSError as err:  # e.g. reading a directory
        raise InputError(f"{name}: cannot read ({err.strerror or err})") from err


def _decode_block(name: str, data: bytes, line: int, offset: int) -> list[str]:
    """The lines of ``data`` (whole lines, the first being line ``line + 1`` of the file, which
    starts at byte ``offset``)."""
    nul = data.find(b"\x00")
    if nul >= 0:
        at = line + data.count(b"\n", 0, nul) + 1
        raise InputError(f"{name}:{at}: NUL byte at byte offset {offset + nul} (not a text file?)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        at = line + data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1)
        raise InputError(
            f"{name}:{at}: invalid UTF-8 at byte offset {offset + err.start} "
            f"(byte {column} of the line: {err.reason})"
        ) from err
    lone_cr = _LONE_CR.search(data)
    if lone_cr is not None and lone_cr.start() < len(data) - 1:  # a CR ending the file ends a line
        # Lines ended by CR alone (classic Mac OS) would run together into one line: a TSV
        # corpus into one sentence pair.
        at = line + data.count(b"\n", 0, lone_cr.start()) + 1
        raise InputError(
            f"{name}:{at}: carriage return without a line feed at byte offset "
            f"{offset + lone_cr.start()} (CR-only line endings? fadat reads lines ending in LF or "
            "CRLF)"
        )
    if offset == 0 and text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def check_unicode(text: str, where: str) -> None:
    """Check that ``text`` is Unicode text that UTF-8 can encode: a lone surrogate (U+D800 to
    U+DFFF, e.g. from ``"\\udc80"`` or ``bytes.decode(errors="surrogateescape")``) is not a
    character, and sentencepiece would fail on it with a traceback. The server refuses the same
    in a request's JSON (``fadat.serve.app``).

    Raises:
        InputError: a lone surrogate, naming ``where``, its position and code point.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        code = ord(text[err.start])
        raise InputError(
            f"{where}: character {err.start} is a lone surrogate (\\u{code:04x}), not a character"
        ) from None
