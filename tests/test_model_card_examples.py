"""scripts/model_card_examples.py: the percentile rule on hand-made scores (ties, the word bounds,
halves rounding up), the rows and labels, ``--keep`` and bad input (exit 2, one line), and one
run of the script on the tiny random DAT whose rows are known by construction."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
import torch

from fadat.errors import InputError
from fadat.translation.translator import Translator

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "model_card_examples.py"


def _load():
    spec = importlib.util.spec_from_file_location("model_card_examples", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


mce = _load()


@pytest.fixture(autouse=True, scope="module")
def _restore_threads():
    """The script sets torch's thread count (``--threads``); undo it afterwards."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def write_split(root: Path, sources: list[str], refs: list[str], split: str = "test") -> Path:
    """A dataset directory as ``fadat evaluate`` reads it: meta.json and raw/<split>.*."""
    raw = root / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    (root / "meta.json").write_text(json.dumps({"source_lang": "en", "target_lang": "en"}))
    (raw / f"{split}.src.txt").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    (raw / f"{split}.ref.txt").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    return root


# ----------------------------------------------------------------------------------------------
# The pure selection

# index:        0   1   2   3   4   5   6   7
SCORES = [50.0, 20.0, 20.0, 80.0, 10.0, 20.0, 90.0, 5.0]
LENGTHS = [12, 11, 9, 10, 25, 15, 26, 18]
# Within 10–25 words: 0, 1, 3, 4, 5, 7 (2 has 9 words, 6 has 26). Sorted by (score, index):
# 7 (5), 4 (10), 1 (20), 5 (20), 0 (50), 3 (80): n = 6, positions p/100 · 5 rounded half up.


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        (0, 7),  # position 0
        (10, 4),  # 0.5 -> 1 (half up; Python's round would give 0)
        (40, 1),  # 2.0 -> 2: the tie 1/5 at 20 is ordered by index
        (50, 5),  # 2.5 -> 3 (round would give 2)
        (60, 5),  # 3.0 -> 3
        (90, 3),  # 4.5 -> 5: the top of the bounds (10 words, included)
        (100, 3),  # 5: not 6, whose 90 has 26 words
    ],
)
def test_choose_picks_the_hand_computed_sentence(p, expected):
    assert mce.choose(SCORES, LENGTHS, [p], (10, 25)) == [expected]


def test_choose_keeps_the_order_of_the_percentiles_and_repeats():
    assert mce.choose(SCORES, LENGTHS, [90, 10, 50, 60], (10, 25)) == [3, 4, 5, 5]
    # 25 words (the upper bound) is a candidate: alone in 25–25, it is every percentile.
    assert mce.choose(SCORES, LENGTHS, [0, 50, 100], (25, 25)) == [4, 4, 4]
    # Bounds 0–100: every sentence; sorted 7 4 1 2 5 0 3 6, position round-half-up(p/100 · 7)
    assert mce.choose(SCORES, LENGTHS, [0, 50, 100], (0, 100)) == [7, 5, 6]


def test_choose_with_no_candidate_or_bad_arguments_raises():
    with pytest.raises(InputError, match="no sentence has 30–40 source words"):
        mce.choose(SCORES, LENGTHS, [50], (30, 40))
    with pytest.raises(InputError, match="between 0 and 100, got 120"):
        mce.choose(SCORES, LENGTHS, [10, 120], (10, 25))
    with pytest.raises(InputError, match="between 0 and 100, got -1"):
        mce.choose(SCORES, LENGTHS, [-1], (10, 25))
    with pytest.raises(InputError, match="--percentiles"):
        mce.choose(SCORES, LENGTHS, [float("nan")], (10, 25))
    with pytest.raises(InputError, match="--percentiles"):
        mce.choose(SCORES, LENGTHS, [], (10, 25))
    with pytest.raises(InputError, match="--words 25 10"):
        mce.choose(SCORES, LENGTHS, [50], (25, 10))
    with pytest.raises(ValueError, match="8 scores but 7 lengths"):
        mce.choose(SCORES, LENGTHS[:7], [50], (10, 25))


def test_percentile_position_is_exact_and_rounds_halves_up():
    assert mce.percentile_position(50, 4) == 2  # 1.5
    assert mce.percentile_position(10, 997) == 100  # 99.6
    assert mce.percentile_position(90, 997) == 896  # 896.4
    assert mce.percentile_position(50, 1) == 0
    assert mce.percentile_position(100, 997) == 996


def test_labels_and_rows():
    labels = {p: mce.percentile_label(p) for p in (0, 1, 2, 3, 10, 11, 12, 13, 21, 50, 92, 2.5)}
    assert labels == {
        0: "0th pct.",
        1: "1st pct.",
        2: "2nd pct.",
        3: "3rd pct.",
        10: "10th pct.",
        11: "11th pct.",
        12: "12th pct.",
        13: "13th pct.",
        21: "21st pct.",
        50: "median",
        92: "92nd pct.",
        2.5: "2.5th pct.",
    }
    # kept rows first, unlabelled unless a percentile falls on them; a repeated pick is one row
    rows = mce.table_rows([3, 8], [5, 3, 5], [10, 50, 90])
    assert rows == [(3, ("median",)), (8, ()), (5, ("10th pct.", "90th pct."))]
    assert mce.cell("a | b|c") == "a \\| b\\|c"


def test_keep_is_looked_up_by_exact_text():
    sources = ["A b.", "c d", "A b."]
    assert mce.keep_indices(sources, ["c d", "A b."], "raw/test.src.txt") == [1, 0]
    with pytest.raises(InputError, match=r"raw/test.src.txt: --keep 'A b' is not a source line"):
        mce.keep_indices(sources, ["A b"], "raw/test.src.txt")
    with pytest.raises(InputError, match="given twice"):
        mce.keep_indices(sources, ["c d", "c d"], "raw/test.src.txt")


# ----------------------------------------------------------------------------------------------
# The command line

SOURCES = [
    "ab cd",  # 0: 2 words, kept
    "ef gh ij",  # 1
    "kl mn op qr",  # 2
    "st uv wx ab cd ef",  # 3: 6 words
    "gh ij kl mn op",  # 4
    "qr st uv",  # 5
    "wx ab",  # 6: 2 words, kept
    "cd ef gh ij",  # 7
]
# Candidates of 3–5 words and the z's appended to their output to make their reference: the
# more z's, the lower the recall, so chrF ranks them 4 < 7 < 1 < 5 < 2.
PADDING = {1: 12, 2: 0, 4: 30, 5: 6, 7: 20}


def _error_line(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("model_card_examples: error: "), captured.err
    return lines[0]


def test_keep_not_in_the_split_fails_naming_it(models, tmp_path, capsys):
    data = write_split(tmp_path / "data", SOURCES, SOURCES)
    argv = ["--model", str(models["dat"]), "--data", str(data), "--words", "3", "5"]
    assert mce.main([*argv, "--keep", "ab cd", "--keep", "ab  cd"]) == 2
    line = _error_line(capsys)
    assert str(data / "raw" / "test.src.txt") in line and "split 'test'" in line
    assert "--keep 'ab  cd' is not a source line" in line


def test_bad_input_exits_2_with_one_line(models, tmp_path, capsys):
    data = write_split(tmp_path / "data", SOURCES, SOURCES)
    good = ["--model", str(models["dat"]), "--data", str(data), "--words", "3", "5"]
    cases = [
        ([*good, "--model", str(tmp_path / "nothing")], str(tmp_path / "nothing")),
        ([*good, "--split", "valid"], str(data / "raw" / "valid.src.txt")),
        ([*good, "--percentiles", "10", "120"], "between 0 and 100, got 120"),
        ([*good, "--words", "25", "10"], "--words 25 10"),
        ([*good, "--words", "30", "40"], "no sentence has 30–40 source words"),
        ([*good, "--strategy", "nonsense"], "nonsense"),
        ([*good, "--markdown", str(models["dat"] / "README.md")], "lies inside the --model"),
    ]
    for argv, expected in cases:
        assert mce.main(argv) == 2, argv
        assert expected in _error_line(capsys), argv
    assert not (models["dat"] / "README.md").exists()


def test_translations_are_fadat_evaluates(models, tmp_path):
    """The batches of ``fadat evaluate`` rebuilt (here 3 sentences each, with an empty line):
    every output equals the hypothesis evaluate saves, in input order."""
    from fadat.evaluation.evaluate import evaluate

    sources = [*SOURCES, "", "ij kl"]
    data = write_split(tmp_path / "data", sources, sources)
    evaluate(
        models["dat"],
        data=data,
        strategies=["lookahead"],
        latency=False,
        bootstrap=0,
        batch_size=3,
        threads=0,
        save_hypotheses=tmp_path / "hyps",
    )
    saved = (tmp_path / "hyps" / "dat.lookahead.txt").read_text(encoding="utf-8").split("\n")
    translator = Translator.from_pretrained(models["dat"])
    ours = mce.translate_like_evaluate(translator, sources, "lookahead", batch_size=3)
    assert ours == saved[:-1] and ours[8] == "" and len(set(ours)) > 2


def test_script_prints_the_rows_known_by_construction(models, tmp_path):
    outputs = Translator.from_pretrained(models["dat"]).translate(SOURCES, "lookahead")
    assert all(outputs[i] for i in PADDING), outputs  # chrF needs an output to rank by
    refs = [
        out + (" " + "z" * PADDING[i] if PADDING.get(i) else "") for i, out in enumerate(outputs)
    ]
    refs[0] = "ab | cd"  # a kept row, not a candidate: its reference only needs escaping
    chrf = {i: sacrebleu.sentence_chrf(outputs[i], [refs[i]]).score for i in PADDING}
    assert chrf[4] < chrf[7] < chrf[1] < chrf[5] < chrf[2] == 100, chrf
    data = write_split(tmp_path / "data", SOURCES, refs)
    out_file = tmp_path / "card" / "examples.md"
    argv = [sys.executable, str(SCRIPT), "--model", str(models["dat"]), "--data", str(data)]
    argv += ["--words", "3", "5", "--keep", "wx ab", "ab cd", "--threads", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [*argv, "--markdown", str(out_file)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert out_file.read_text(encoding="utf-8") == proc.stdout
    description, blank, *table = proc.stdout.splitlines()
    assert blank == ""
    assert description.startswith(
        "Rows (lookahead, split `test`): the first 2 rows given by `--keep`, then the sentences at "
        "the 10th, 50th and 90th percentile of sentence chrF among the n = 5 sentences of 3–5 "
        "source words (whitespace-separated, bounds included)."
    )
    assert "against 1 reference stream (`nrefs:1|" in description
    assert "sorted by (chrF, line number)" in description
    # n = 5: positions 0.4 -> 0, 2, 3.6 -> 4 of the ranking 4 7 1 5 2
    assert table == [
        "| source | reference | this model |",
        "|---|---|---|",
        f"| wx ab | {refs[6]} | {outputs[6]} |",
        f"| ab cd | ab \\| cd | {outputs[0]} |",
        f"| gh ij kl mn op (10th pct.) | {refs[4]} | {outputs[4]} |",
        f"| ef gh ij (median) | {refs[1]} | {outputs[1]} |",
        f"| kl mn op qr (90th pct.) | {refs[2]} | {outputs[2]} |",
    ]
