"""fadat translate streams: results come out one chunk at a time in input order; Ctrl-C keeps
the finished chunks on stdout and leaves an --output file untouched; --progress draws a bar on
stderr."""

from __future__ import annotations

import io
import sys

import pytest
from test_translate import random_sentences

from fadat import cli
from fadat.models.directory import load_model
from fadat.translation.pipeline import iter_translations, translate_lines


def test_chunks_give_the_same_translations_in_order(models):
    model, sp = load_model(models["dat"])
    lines = random_sentences(23, 3, low=1, high=7)
    lines[4] = ""  # an empty line keeps its place
    whole = translate_lines(model, sp, lines)
    done = []
    stream = iter_translations(model, sp, lines, chunk_lines=5, progress=done.append)
    got = list(stream)
    assert [i for i, _ in got] == list(range(23))
    assert [h[0].text for _, h in got] == [h[0].text for h in whole]
    assert sum(done) == 23  # every line reported to the progress callback once
    assert got[4][1][0].text == ""


class _Interrupt:
    """Wraps a model's translate_batch: raises KeyboardInterrupt at the ``at``-th call."""

    def __init__(self, fn, at: int) -> None:
        self.fn, self.at, self.calls = fn, at, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return self.fn(*args, **kwargs)


def _interrupting_loader(monkeypatch, at: int):
    import fadat.cli.translate as translate

    real = translate.load_translation_model

    def load(*args, **kwargs):
        model, sp = real(*args, **kwargs)
        monkeypatch.setattr(model, "translate_batch", _Interrupt(model.translate_batch, at))
        return model, sp

    monkeypatch.setattr(translate, "load_translation_model", load)


def test_ctrl_c_keeps_finished_lines_on_stdout(models, tmp_path, monkeypatch, capsys):
    lines = random_sentences(9, 4)
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n")
    argv = ["translate", "--model", str(models["dat"]), "--input", str(src)]
    assert cli.main([*argv, "--chunk-lines", "4"]) == 0
    full = capsys.readouterr().out.splitlines()
    assert len(full) == 9
    # --max-tokens 1: one sentence per batch; the 6th batch is interrupted (chunk 2 of 4 lines).
    _interrupting_loader(monkeypatch, at=6)
    assert cli.main([*argv, "--chunk-lines", "4", "--max-tokens", "1"]) == 130
    out = capsys.readouterr()
    assert out.out.splitlines() == full[:4]  # the first chunk, in order, and nothing else
    assert "interrupted" in out.err


def test_ctrl_c_leaves_an_output_file_untouched(models, tmp_path, monkeypatch, capsys):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(random_sentences(9, 5)) + "\n")
    out = tmp_path / "out.txt"
    out.write_text("earlier results\n")
    _interrupting_loader(monkeypatch, at=3)
    argv = ["translate", "--model", str(models["dat"]), "--input", str(src), "--output", str(out)]
    argv.append("--force")  # out.txt was not written by fadat
    assert cli.main([*argv, "--chunk-lines", "2", "--max-tokens", "1"]) == 130
    assert out.read_text() == "earlier results\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]
    capsys.readouterr()


def test_progress_bar_on_request(models, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ab cd\nef gh\n")))
    argv = ["translate", "--model", str(models["dat"]), "--strategy", "sample", "--nbest", "4"]
    assert cli.main([*argv, "--seed", "1", "--progress"]) == 0
    out = capsys.readouterr()
    assert "translate" in out.err and "2/2" in out.err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ab cd\n")))
    assert cli.main(argv) == 0  # not a terminal: no bar by default
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("nbest", [1, 4])
def test_nbest_progress_is_plain_translates(models, nbest):
    """--nbest N reports progress as plain translate does: per chunk, its empty lines first, then
    the lines of each batch as soon as the batch (its N draws) is done, before the chunk's
    results come out."""
    model, sp = load_model(models["dat"])
    lines = random_sentences(7, 6, low=1, high=7)
    lines[1] = ""
    events: list = []
    stream = iter_translations(
        model,
        sp,
        lines,
        strategy="sample",
        options={"seed": 1},
        nbest=nbest,
        chunk_lines=3,
        max_sentences=2,
        progress=events.append,
    )
    for index, hyps in stream:
        events.append(f"line {index}")
        assert 1 <= len(hyps) <= nbest
    chunk = [f"line {i}" for i in range(7)]
    # chunk 1: an empty line, one batch of 2; chunk 2: batches of 2 and 1; chunk 3: one line
    assert events == [1, 2, *chunk[:3], 2, 1, *chunk[3:6], 1, chunk[6]]
