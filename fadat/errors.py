"""The one error type for bad input (every ``fadat`` verb turns it into exit code 2) and the
warning category of fadat's own warnings."""

from __future__ import annotations

from typing import Any


def shown(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to about ``limit`` characters (``10**400`` as
    ``10000000000000000000...00000000 (401 characters)``), so that a message naming a value
    stays one short line."""
    text = repr(value)
    if len(text) <= limit:
        return text
    digits = f" ({len(text)} characters)"
    return f"{text[: limit // 2]}...{text[-8:]}{digits}"


class FadatWarning(UserWarning):
    """A warning of fadat's about a choice that works but is probably not what the user wants
    (e.g. :class:`EmulatedBF16Warning`). ``fadat``'s command line prints it as one line,
    ``fadat: warning: <message>``; a Python caller gets a standard :mod:`warnings` warning."""


class EmulatedBF16Warning(FadatWarning):
    """bf16 requested on a CPU without bf16 hardware (neither AVX-512 BF16 nor AMX), where
    oneDNN emulates bf16 matrix products and they are far slower than fp32
    (:func:`fadat.process.native_bf16`)."""


class ThreadsAboveCoresWarning(FadatWarning):
    """More threads than the cores this process may use, let through because the caller insisted
    (``force``, the verbs' ``--force``): they share the cores and slow torch down
    (:func:`fadat.options.check_threads`)."""


class UnrecordedDatasetWarning(FadatWarning):
    """A compact copy (``fadat snapshot``) of a run whose checkpoint was written before fadat
    recorded the dataset it trained on, made where that dataset is not at the run's data path:
    the copy cannot record the dataset's digest (the sha256 of its training files), so it
    resumes only with the dataset at that path
    (:func:`fadat.training.checkpoints.check_resume_data`)."""


class InputError(ValueError):
    """Bad input from the user: a file, line, argument or model directory that cannot be used.

    The message is one line that names the file (and line, byte offset where known) and the
    problem. ``fadat.cli`` prints it as ``fadat: error: <message>`` and exits with code 2.
    It is a ``ValueError``, so that a Python caller's ``except ValueError`` (what the standard
    library raises for a value it cannot use) catches it too.
    """


class DecodingOptionError(InputError, ValueError):
    """A decoding request the model cannot honour: a strategy it does not offer, an option the
    strategy does not take or a value out of its range, an ``nbest`` the strategy cannot give,
    or a decoding λ (``upsample_ratio``) for a model whose decoder length does not depend on it
    (AT, NAT). A :class:`ValueError` too, as a Python caller expects of a bad argument; checked
    once, before any input is read (:func:`fadat.translation.pipeline.check_strategy`,
    :func:`fadat.translation.pipeline.check_upsample_ratio`).
    """


class NonFiniteOutputError(InputError):
    """A model whose outputs (token log-probabilities, links, logits) hold NaN or +inf for an
    input: its weights are corrupt, e.g. finite but so large that fp32 overflows in the forward
    pass (NaN or infinite weights in the file are refused when the model is loaded).

    The models' inference paths raise it through :func:`fadat.models.architectures.check_finite`,
    which knows only the affected rows of the batch; the batch loops add the model directory and the
    input lines (:func:`fadat.models.architectures.naming_inputs`). The message is then
    ``model DIR produces non-finite link scores for input line 3: its weights are probably
    corrupt``.

    Attributes:
        what: the outputs, e.g. ``"link scores"``.
        rows: the affected rows of the batch (0-based), or ``None`` when the batch failed as a
            whole (int8's quantization of NaN activations).
        model: the model directory, once known.
        lines: the 1-based input lines of ``rows`` (of the whole batch when ``rows`` is
            ``None``), sorted, once known.
    """

    def __init__(
        self,
        what: str,
        rows: list[int] | None = None,
        model: str | None = None,
        lines: list[int] | None = None,
    ) -> None:
        self.what, self.rows, self.model, self.lines = what, rows, model, lines
        if lines:
            shown = ", ".join(str(n) for n in lines[:3])
            more = f" and {len(lines) - 3} more" if len(lines) > 3 else ""
            one = "input line" if len(lines) == 1 else "input lines"
            where = f" for {'the batch of ' if rows is None else ''}{one} {shown}{more}"
        elif rows:
            where = f" for batch row {rows[0]}"
        else:
            where = ""
        name = f"model {model}" if model else "the model"
        super().__init__(
            f"{name} produces non-finite {what}{where}: its weights are probably corrupt"
        )

    def located(self, model: str | None, lines: list[int]) -> NonFiniteOutputError:
        """The same error naming ``model`` and the input lines of its rows (``lines``: the
        1-based input line of each row of the batch)."""
        rows = range(len(lines)) if self.rows is None else self.rows
        return NonFiniteOutputError(self.what, self.rows, model, sorted(lines[r] for r in rows))
