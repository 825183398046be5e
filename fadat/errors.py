"""The one error type for bad input: every ``fadat`` verb turns it into exit code 2."""

from __future__ import annotations


class InputError(Exception):
    """Bad input from the user: a file, line, argument or model directory that cannot be used.

    The message is one line that names the file (and line, byte offset where known) and the
    problem. ``fadat.cli`` prints it as ``fadat: error: <message>`` and exits with code 2.
    """
