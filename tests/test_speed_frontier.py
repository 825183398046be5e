"""bench/speed_frontier.py: the frontier's points, speed-ups, Markdown table and picture from a
hand-written bench JSON (numbers checked, not only files), and its valid BLEU against the
bench's own decoding path on the tiny random DATs of two depths."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "speed_frontier.py"


def load_frontier():
    spec = importlib.util.spec_from_file_location("speed_frontier", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["speed_frontier"] = module
    spec.loader.exec_module(module)
    return module


def dat_row(design, strategy, lam, ms, bleu, ratio="same", precision="int8", **extra):
    """A torch row as bench/bench_inference.py --json writes it (the fields the frontier
    reads; ``ratio`` = the λ asked for, default ``lam``)."""
    return {
        "command": "fadat translate ...",
        "design": design,
        "model": f"runs/m/{design}-s1",
        "system": "torch",
        "strategy": strategy,
        "precision": precision,
        "upsample_ratio": lam if ratio == "same" else ratio,
        "lambda": lam,
        "shortlist": False,
        "prune": None,
        "threads": 1,
        "latency_ms": [ms, ms - 1, ms + 1],
        "sent_s": [1000 / ms, 900 / ms, 1100 / ms],
        "tok_bleu": bleu,
        **extra,
    }


def ct2_row(beam, ms, bleu=None, forced=False, vmap=False):
    row = {
        "command": "CTranslate2AT(...)",
        "design": None,
        "model": "AT_RANDOM",
        "system": "ctranslate2",
        "strategy": beam,
        "precision": "int8",
        "upsample_ratio": None,
        "lambda": None,
        "vmap": vmap,
        "forced": forced,
        "latency_ms": [ms, ms - 2, ms + 2],
        "sent_s": [50.0, 49.0, 51.0],
    }
    if bleu is not None:
        row["tok_bleu"] = bleu
    return row


def bench_json():
    """Two designs; design a's own λ (4) also asked for as λ=4 (the explicit row must win);
    rows the frontier must leave out (fp32, shortlist, pruning, +vmap); CTranslate2 beam 5 with
    BLEU and forced, greedy forced only."""
    return {
        "a: DAT lookahead int8": dat_row("a", "lookahead", 4.0, 99.0, 1.0, ratio=None),
        "a: DAT lookahead int8 λ=2": dat_row("a", "lookahead", 2.0, 10.0, 18.25),
        "a: DAT lookahead int8 λ=4": dat_row("a", "lookahead", 4.0, 20.0, 19.0),
        "a: DAT lookahead fp32 λ=2": dat_row("a", "lookahead", 2.0, 30.0, 18.0, precision="fp32"),
        "a: DAT lookahead int8 λ=2 +sl": dat_row("a", "lookahead", 2.0, 9.0, 18.0, shortlist=True),
        "a: DAT lookahead int8 λ=2 +prune 0.01": dat_row(
            "a", "lookahead", 2.0, 9.5, 18.0, prune=0.01
        ),
        "b: DAT joint-viterbi int8 λ=3": dat_row("b", "joint-viterbi", 3.0, 8.0, 17.5),
        "b: DAT lookahead int8 λ=3": dat_row("b", "lookahead", 3.0, 5.0, 17.0),
        "CT2 greedy int8 =ref len": ct2_row("greedy", 20.0, forced=True),
        "CT2 beam5 int8": ct2_row("beam5", 40.0, bleu=22.5),
        "CT2 beam5 int8 =ref len": ct2_row("beam5", 41.0, forced=True),
        "CT2 beam5 int8 +vmap": ct2_row("beam5", 30.0, bleu=22.4, vmap=True),
        "machine": {"cpu": "AMD EPYC", "versions": "torch x"},
        "run": {
            "designs": {"a": "runs/m/a-s1", "b": "runs/m/b-s1"},
            "test_sentences": 1516,
            "latency_sentences": 100,
            "threads": [1],
            "repeats": 3,
        },
    }


BLEU = {
    "split": "valid",
    "sentences": 300,
    "points": [
        {"design": "a", "lambda": 2.0, "strategy": "lookahead", "tok_bleu": 20.5},
        {"design": "b", "lambda": 3.0, "strategy": "joint-viterbi", "tok_bleu": 19.75},
    ],
}


def test_onnxruntime_rows_are_a_frontier_of_their_own():
    """--engine onnxruntime takes the ORT rows (the bench's system "onnxruntime") and only
    them, compared with the same run's CTranslate2 rows; an unknown engine is refused."""
    frontier = load_frontier()
    bench = bench_json()
    bench["a: ORT lookahead int8 λ=2"] = dat_row(
        "a", "lookahead", 2.0, 8.0, 18.5, system="onnxruntime"
    )
    bench["a: ORT lookahead fp32 λ=2"] = dat_row(
        "a", "lookahead", 2.0, 12.0, 18.5, precision="fp32", system="onnxruntime"
    )
    points, baselines = frontier.frontier_points([bench], BLEU, engine="onnxruntime")
    assert [(p.design, p.strategy, p.lam, p.precision) for p in points] == [
        ("a", "lookahead", 2.0, "int8 ORT")
    ]
    assert points[0].speedup_beam5 == pytest.approx(40.0 / 8.0)  # the AT's own beam 5 row
    assert points[0].valid_bleu == 20.5
    torch_points, _ = frontier.frontier_points([bench], BLEU)
    assert all(p.precision == "int8" for p in torch_points) and len(torch_points) == 4
    with pytest.raises(ValueError, match="engine must be one of"):
        frontier.frontier_points([bench], BLEU, engine="openvino")


def test_points_speedups_and_table():
    frontier = load_frontier()
    points, baselines = frontier.frontier_points([bench_json()], BLEU)
    got = [
        (p.design, p.strategy, p.lam, p.latency_ms[0], p.test_bleu, p.valid_bleu) for p in points
    ]
    assert got == [
        ("a", "lookahead", 2.0, 10.0, 18.25, 20.5),
        ("a", "lookahead", 4.0, 20.0, 19.0, None),  # the λ=4 row asked for, not the own-λ one
        ("b", "lookahead", 3.0, 5.0, 17.0, None),
        ("b", "joint-viterbi", 3.0, 8.0, 17.5, 19.75),
    ]
    # CTranslate2 beam 5: the AT's own row (40 ms), not the forced (41) or +vmap (30) one
    assert [(b.name, b.latency_ms[0], b.test_bleu) for b in baselines] == [
        ("CT2 beam5 int8", 40.0, 22.5),
        ("CT2 greedy int8 =ref len", 20.0, None),
    ]
    speedups = [(p.speedup_beam5, p.speedup_greedy) for p in points]
    assert speedups == [(4.0, 2.0), (2.0, 1.0), (8.0, 4.0), (5.0, 2.5)]

    text = frontier.markdown_table(points, baselines, [bench_json()], BLEU)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[1:] == [
        "| a | 2 | lookahead | int8 | 20.50 | 18.25 | 10.00 (9.00–11.00) | 100.0 | 4.00× | 2.00× |",
        "| a | 4 | lookahead | int8 | – | 19.00 | 20.00 (19.00–21.00) | 50.0 | 2.00× | 1.00× |",
        "| b | 3 | lookahead | int8 | – | 17.00 | 5.00 (4.00–6.00) | 200.0 | 8.00× | 4.00× |",
        "| b | 3 | joint-viterbi | int8 | 19.75 | 17.50 | 8.00 (7.00–9.00) | 125.0 | 5.00× "
        "| 2.50× |",
        "| CT2 beam5 int8 | – | beam5 | – | – | 22.50 | 40.00 (38.00–42.00) | 50.0 | – | – |",
        "| CT2 greedy int8 =ref len | – | greedy | – | – | – (forced to the references' "
        "lengths) | 20.00 (18.00–22.00) | 50.0 | – | – |",
    ]
    assert "1516 sentences" in text and "first 100" in text and "300 sentences" in text


def beam_bench_json():
    """:func:`bench_json` with design a's beam search rows: without an LM at λ 2 and 4, with the
    LM at γ 1 at λ 2 and 4 (the bench's ``--beam --lm lm/kd.bin --gamma 1``)."""
    bench = bench_json()
    lm = {"lm": "lm/kd.bin", "gamma": 1.0}
    bench["a: DAT beam int8 λ=2"] = dat_row("a", "beam", 2.0, 30.0, 19.0)
    bench["a: DAT beam int8 λ=4"] = dat_row("a", "beam", 4.0, 50.0, 20.0)
    bench["a: DAT beam+LM int8 λ=2"] = dat_row("a", "beam", 2.0, 25.0, 21.0, **lm)
    bench["a: DAT beam+LM int8 λ=4"] = dat_row("a", "beam", 4.0, 40.0, 22.0, **lm)
    return bench


#: Valid BLEU of the beam points: beam+LM at λ 2 at the bench's γ, at λ 4 at another γ only.
BEAM_BLEU = {
    **BLEU,
    "points": BLEU["points"]
    + [
        {
            "design": "a",
            "lambda": 2.0,
            "strategy": "beam",
            "lm": None,
            "gamma": None,
            "tok_bleu": 20.0,
        },
        {
            "design": "a",
            "lambda": 2.0,
            "strategy": "beam+LM",
            "lm": "x.bin",
            "gamma": 1.0,
            "tok_bleu": 22.0,
        },
        {
            "design": "a",
            "lambda": 4.0,
            "strategy": "beam+LM",
            "lm": "x.bin",
            "gamma": 0.5,
            "tok_bleu": 23.0,
        },
    ],
}


def test_beam_points_with_and_without_an_lm():
    """The bench's beam rows are two curves: ``beam`` and ``beam+LM`` (a row with ``lm``),
    each with its valid BLEU (``beam+LM`` only at the same γ), speed-ups, and table rows that
    name the LM's γ and file."""
    frontier = load_frontier()
    points, baselines = frontier.frontier_points([beam_bench_json()], BEAM_BLEU)
    got = [
        (p.strategy, p.lam, p.latency_ms[0], p.test_bleu, p.valid_bleu, p.lm, p.gamma)
        for p in points
        if p.design == "a"
    ]
    assert got == [
        ("lookahead", 2.0, 10.0, 18.25, 20.5, None, None),
        ("lookahead", 4.0, 20.0, 19.0, None, None, None),
        ("beam", 2.0, 30.0, 19.0, 20.0, None, None),
        ("beam", 4.0, 50.0, 20.0, None, None, None),
        ("beam+LM", 2.0, 25.0, 21.0, 22.0, "lm/kd.bin", 1.0),
        ("beam+LM", 4.0, 40.0, 22.0, None, "lm/kd.bin", 1.0),  # valid BLEU at γ 0.5 only
    ]
    lm2 = next(p for p in points if p.strategy == "beam+LM" and p.lam == 2.0)
    assert (lm2.speedup_beam5, lm2.speedup_greedy) == (40.0 / 25.0, 20.0 / 25.0)
    text = frontier.markdown_table(points, baselines, [beam_bench_json()], BEAM_BLEU)
    assert (
        "| a | 2 | beam+LM γ=1 | int8 | 22.00 | 21.00 | 25.00 (24.00–26.00) | 40.0 | 1.60× "
        "| 0.80× |" in text.splitlines()
    )
    assert (
        "| a | 4 | beam | int8 | – | 20.00 | 50.00 (49.00–51.00) | 20.0 | 0.80× | 0.40× |" in text
    )
    assert "- beam+LM: the DAT's beam search with the KenLM language model `lm/kd.bin`" in text


def test_beam_rows_at_another_beam_are_a_curve_of_their_own():
    """A bench run at ``--beam-size 20`` gives ``beam k=20`` / ``beam+LM k=20`` points without
    the valid BLEU of beam 100 (the ``bleu`` subcommand's); rows at beam 100 keep their label."""
    frontier = load_frontier()
    bench = beam_bench_json()
    for row in bench.values():
        if isinstance(row, dict) and row.get("strategy") == "beam":
            row["beam_size"] = 20
    points, _ = frontier.frontier_points([bench], BEAM_BLEU)
    got = {(p.strategy, p.lam): p.valid_bleu for p in points if p.design == "a"}
    assert got == {
        ("lookahead", 2.0): 20.5,
        ("lookahead", 4.0): None,
        ("beam k=20", 2.0): None,
        ("beam k=20", 4.0): None,
        ("beam+LM k=20", 2.0): None,
        ("beam+LM k=20", 4.0): None,
    }
    for row in bench.values():
        if isinstance(row, dict) and row.get("strategy") == "beam":
            row["beam_size"] = 100
    points, _ = frontier.frontier_points([bench], BEAM_BLEU)
    assert {(p.strategy, p.lam): p.valid_bleu for p in points if p.design == "a"}[
        ("beam+LM", 2.0)
    ] == 22.0


def test_picture_draws_beam_and_beam_lm_apart():
    """``beam`` and ``beam+LM`` of one design: two lines of the design's colour, each with its
    own line style and marker (none the other strategies')."""
    import matplotlib.pyplot as plt

    frontier = load_frontier()
    points, baselines = frontier.frontier_points([beam_bench_json()], BEAM_BLEU)
    fig = frontier.frontier_figure(points, baselines)
    try:
        lines = {line.get_label(): line for ax in fig.axes for line in ax.get_lines()}
        beam, with_lm = lines["a beam"], lines["a beam+LM"]
        assert list(beam.get_xdata()) == [30.0, 50.0] and list(beam.get_ydata()) == [19.0, 20.0]
        assert list(with_lm.get_xdata()) == [25.0, 40.0]
        assert list(with_lm.get_ydata()) == [21.0, 22.0]
        assert beam.get_color() == with_lm.get_color() == lines["a lookahead"].get_color()
        looks = {k: (v.get_linestyle(), v.get_marker()) for k, v in lines.items() if k[:2] == "a "}
        assert len(set(looks.values())) == len(looks) == 3, looks
    finally:
        plt.close(fig)
    # at beam 20 (bench_inference --beam-size 20) the curves are "beam k=20" and "beam+LM k=20",
    # drawn as beam and beam+LM are
    bench = beam_bench_json()
    for row in bench.values():
        if isinstance(row, dict) and row.get("strategy") == "beam":
            row["beam_size"] = 20
    points, baselines = frontier.frontier_points([bench], BEAM_BLEU)
    fig = frontier.frontier_figure(points, baselines)
    try:
        at_20 = {line.get_label(): line for ax in fig.axes for line in ax.get_lines()}
        for label, at_100 in (("a beam k=20", "a beam"), ("a beam+LM k=20", "a beam+LM")):
            got = (at_20[label].get_linestyle(), at_20[label].get_marker())
            assert got == looks[at_100], (label, got, looks)
    finally:
        plt.close(fig)


def test_picture_draws_the_curves_and_the_baselines():
    """One panel per strategy, in it one line per design through its λ points in λ order,
    labelled ``λ=x``; in every panel CTranslate2 beam 5 (with BLEU) a point, greedy (forced, no
    BLEU) a vertical line whose legend entry says so, and the target's lines."""
    import matplotlib.pyplot as plt

    frontier = load_frontier()
    points, baselines = frontier.frontier_points([bench_json()], BLEU)
    fig = frontier.frontier_figure(points, baselines)
    try:
        panels = [ax for ax in fig.axes if ax.get_visible()]
        # one panel per strategy, each with CTranslate2's rows, the target and a legend
        assert [ax.get_title() for ax in panels] == ["lookahead", "joint-viterbi"]
        for ax in panels:
            here = {line.get_label() for line in ax.get_lines()}
            assert "CTranslate2 beam 5" in here and any(
                k.startswith("CTranslate2 greedy") for k in here
            )
            assert "⅓ of CTranslate2 beam 5's latency (the target)" in here
            assert ax.get_legend() is not None
        assert {line.get_label() for line in panels[1].get_lines()} & {"a lookahead"} == set()
        lines = {line.get_label(): line for ax in panels for line in ax.get_lines()}
        a = lines["a lookahead"]
        assert list(a.get_xdata()) == [10.0, 20.0] and list(a.get_ydata()) == [18.25, 19.0]
        assert list(lines["b joint-viterbi"].get_xdata()) == [8.0]
        beam = lines["CTranslate2 beam 5"]
        assert (list(beam.get_xdata()), list(beam.get_ydata())) == ([40.0], [22.5])
        [greedy] = [k for k in lines if k.startswith("CTranslate2 greedy")]
        assert "no BLEU" in greedy and list(lines[greedy].get_xdata()) == [20.0, 20.0]
        labels = sorted(t.get_text() for ax in panels for t in ax.texts)
        assert labels == ["λ=2", "λ=3", "λ=3", "λ=4"]
        legend = [t.get_text() for t in panels[0].get_legend().get_texts()]
        assert greedy in legend and "CTranslate2 beam 5" in legend
        # the target: a third of beam 5's 40 ms, and beam 5's 22.5 BLEU less 0.3
        third = lines["⅓ of CTranslate2 beam 5's latency (the target)"]
        assert list(third.get_xdata()) == pytest.approx([40 / 3] * 2)
        floor = lines["CTranslate2 beam 5's BLEU − 0.3 (the target)"]
        assert list(floor.get_ydata()) == pytest.approx([22.2] * 2)
    finally:
        plt.close(fig)


def test_table_command_writes_both_files(tmp_path, capsys):
    frontier = load_frontier()
    bench, bleu = tmp_path / "bench.json", tmp_path / "bleu.json"
    bench.write_text(json.dumps(bench_json()), encoding="utf-8")
    bleu.write_text(json.dumps(BLEU), encoding="utf-8")
    md, png = tmp_path / "out" / "frontier.md", tmp_path / "out" / "frontier.png"
    argv = ["table", "--bench", str(bench), "--bleu", str(bleu)]
    assert frontier.main([*argv, "--markdown", str(md), "--png", str(png)]) == 0
    points, baselines = frontier.frontier_points([bench_json()], BLEU)
    expected = frontier.markdown_table(points, baselines, [bench_json()], BLEU)
    assert md.read_text(encoding="utf-8") == expected
    assert capsys.readouterr().out == expected
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in md.parent.iterdir()) == ["frontier.md", "frontier.png"]
    # one design in two bench files: its speed-ups would mix runs
    with pytest.raises(SystemExit, match="design 'a' is in bench files 0 and 1"):
        frontier.main(["table", "--bench", str(bench), str(bench)])


def test_bleu_files_of_single_designs_merge_into_one(tmp_path, capsys):
    """``table --bleu A B``: the designs' files (each written when the design finished) give
    the table of the one file holding both; a design in two files, or files of other
    sentences, are refused."""
    frontier = load_frontier()
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(bench_json()), encoding="utf-8")
    both = {**BLEU, "designs": {"a": "models/a", "b": "models/b"}}
    files = []
    for design in ("a", "b"):
        one = {
            **BLEU,
            "designs": {design: f"models/{design}"},
            "points": [p for p in BLEU["points"] if p["design"] == design],
        }
        files.append(tmp_path / f"bleu-{design}.json")
        files[-1].write_text(json.dumps(one), encoding="utf-8")
    whole = tmp_path / "bleu.json"
    whole.write_text(json.dumps(both), encoding="utf-8")
    assert frontier.main(["table", "--bench", str(bench), "--bleu", str(whole)]) == 0
    expected = capsys.readouterr().out
    assert "20.50" in expected and "19.75" in expected
    assert frontier.main(["table", "--bench", str(bench), "--bleu", *map(str, files)]) == 0
    assert capsys.readouterr().out == expected
    with pytest.raises(SystemExit, match="design 'a' is in two files"):
        frontier.main(["table", "--bench", str(bench), "--bleu", str(files[0]), str(whole)])
    other = tmp_path / "bleu-other.json"
    other.write_text(json.dumps({**json.loads(files[1].read_text()), "sentences": 989}))
    with pytest.raises(SystemExit, match="file 2 has sentences 989, file 1 300"):
        frontier.main(["table", "--bench", str(bench), "--bleu", str(files[0]), str(other)])


def test_bleu_files_compare_their_data_by_digest_not_path(tmp_path):
    """Files that name one dataset by two paths merge (by the split's digest where both have
    one, else by the directory's name); the same name with another digest, or another name
    without digests, is refused."""
    frontier = load_frontier()

    def one(design, data, digest=None):
        points = [p for p in BLEU["points"] if p["design"] == design]
        result = {**BLEU, "data": data, "designs": {design: f"models/{design}"}, "points": points}
        return {**result, "data_fingerprint": digest} if digest else result

    merged = frontier.merge_bleu([one("a", "data/d", "1" * 64), one("b", "/abs/data/d", "1" * 64)])
    assert merged["designs"] == {"a": "models/a", "b": "models/b"}
    assert merged["data"] == "data/d" and merged["data_fingerprint"] == "1" * 64
    assert len(merged["points"]) == 2
    frontier.merge_bleu([one("a", "data/d"), one("b", "/abs/data/d", "1" * 64)])  # an older file
    frontier.merge_bleu([one("a", "data/x", "1" * 64), one("b", "data/d", "1" * 64)])
    with pytest.raises(ValueError, match="file 2 has data '/abs/data/d'"):
        frontier.merge_bleu([one("a", "data/d", "1" * 64), one("b", "/abs/data/d", "2" * 64)])
    with pytest.raises(ValueError, match="file 2 has data 'data/e'"):
        frontier.merge_bleu([one("a", "data/d"), one("b", "data/e")])


def test_split_digest_is_the_raw_text_of_the_split(tmp_path):
    """The digest changes with a split's sources or references and with nothing else (not the
    vocabulary); a directory without the split's raw sources is refused."""
    from fadat.errors import InputError

    frontier = load_frontier()
    raw = tmp_path / "d" / "raw"
    raw.mkdir(parents=True)
    for name, text in (("valid.src.txt", "a\n"), ("valid.ref.txt", "b\n"), ("test.src.txt", "c\n")):
        (raw / name).write_text(text, encoding="utf-8")
    (tmp_path / "d" / "spm.model").write_bytes(b"one")
    first = frontier.split_digest(tmp_path / "d", "valid")
    (tmp_path / "d" / "spm.model").write_bytes(b"two")
    (raw / "test.src.txt").write_text("changed\n", encoding="utf-8")
    assert frontier.split_digest(tmp_path / "d", "valid") == first
    (raw / "valid.ref2.txt").write_text("b2\n", encoding="utf-8")
    second = frontier.split_digest(tmp_path / "d", "valid")
    assert second != first
    (raw / "valid.ref2.txt").write_text("b3\n", encoding="utf-8")
    assert frontier.split_digest(tmp_path / "d", "valid") not in (first, second)
    with pytest.raises(InputError, match="train.src.txt: no such file"):
        frontier.split_digest(tmp_path / "d", "train")


def designs_and_valid_data(tmp_path):
    """The bench tests' two tiny designs and a prepared dataset whose train and valid splits
    are 12 random sentences with the tiny design's λ = 2 joint-Viterbi outputs as references.
    Returns (designs, data directory, sources, references)."""
    from test_bench_inference import load_bench, two_designs
    from test_translate import random_sentences

    from fadat import cli
    from fadat.data.spm import encode_source

    bench = load_bench()
    dats, _, _ = two_designs(tmp_path)
    sources = random_sentences(12, seed=5, low=5, high=6)
    model, sp = bench.load_model(dats["tiny"], "cpu")
    ids = [encode_source(sp, x) for x in sources]
    refs = [sp.decode(y) for y in bench.dat_translate(model, "joint-viterbi", None, None, 2)(ids)]
    files = []
    for split in ("train", "valid"):
        for side, text in (("src", sources), ("tgt", refs)):
            path = tmp_path / f"{split}.{side}"
            path.write_text("\n".join(text) + "\n", encoding="utf-8")
            prefix = "" if split == "train" else "valid-"
            files += [f"--{prefix}source-file" if side == "src" else f"--{prefix}target-file"]
            files += [str(path)]
    data = tmp_path / "data"
    argv = ["prepare", *files, "--source-lang", "en", "--target-lang", "en", "--output", str(data)]
    assert cli.main([*argv, "--spm-model", str(dats["tiny"] / "spm.model")]) == 0
    return dats, data, sources, refs


@pytest.mark.skipif(importlib.util.find_spec("kenlm") is None, reason="kenlm is not installed")
def test_valid_bleu_of_the_beam_search_with_and_without_an_lm(tmp_path, capsys):
    """``bleu --strategies beam --lm FILE --gamma G``: per design and λ a ``beam`` point and a
    ``beam+LM`` point (its LM and γ recorded) whose BLEU is that of the bench's beam rows (the
    same decoding path, fp32); ``--gamma`` or ``beam+LM`` without ``--lm`` is refused."""
    from test_bench_inference import load_bench, pieces_lm

    from fadat.data.spm import encode_source
    from fadat.evaluation.scoring import corpus_scores
    from fadat.translation.language_model import language_model_options

    bench = load_bench()
    frontier = load_frontier()
    dats, data, sources, refs = designs_and_valid_data(tmp_path)
    arpa, _ = pieces_lm(tmp_path, dats["tiny"] / "spm.model")
    out = tmp_path / "valid-bleu.json"
    argv = ["bleu", "--design", f"tiny={dats['tiny']}", "--data", str(data), "--ratios", "2"]
    argv += ["--strategies", "beam", "--json", str(out)]
    assert frontier.main([*argv, "--lm", str(arpa), "--gamma", "3"]) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    assert (result["lm"], result["gamma"]) == (str(arpa), 3.0)
    got = {p["strategy"]: (p["lm"], p["gamma"], p["tok_bleu"]) for p in result["points"]}
    assert set(got) == {"beam", "beam+LM"} and len(result["points"]) == 2
    model, sp = bench.load_model(dats["tiny"], "cpu")
    ids = [encode_source(sp, x) for x in sources]
    with_lm = {"gamma": 3.0, **language_model_options(str(arpa), model, sp)}
    for strategy, options, lm, gamma in (
        ("beam", {}, None, None),
        ("beam+LM", with_lm, str(arpa), 3.0),
    ):
        hyps = bench.beam_translate(model, options, 2.0)(ids)
        scores = corpus_scores([sp.decode(y) for y in hyps], [refs], "en")
        assert got[strategy] == (lm, gamma, round(scores["tok_bleu"], 2)), strategy
    assert "tiny λ=2 beam+LM γ=3: " in capsys.readouterr().out
    assert result["beam_size"] == 100 and {p["beam_size"] for p in result["points"]} == {100}
    # at beam 1 the points are "k=1" curves with the BLEU of the bench's beam-1 rows
    assert frontier.main([*argv, "--lm", str(arpa), "--gamma", "3", "--beam-size", "1"]) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    got1 = {p["strategy"]: (p["beam_size"], p["tok_bleu"]) for p in result["points"]}
    assert set(got1) == {"beam k=1", "beam+LM k=1"} and result["beam_size"] == 1
    outputs = {}
    for strategy, options in (("beam", {}), ("beam+LM", with_lm)):
        for k in (1, 100):
            outputs[strategy, k] = bench.beam_translate(model, {**options, "beam_size": k}, 2.0)(
                ids
            )
        scores = corpus_scores([sp.decode(y) for y in outputs[strategy, 1]], [refs], "en")
        assert got1[f"{strategy} k=1"] == (1, round(scores["tok_bleu"], 2)), strategy
    assert any(outputs[s, 1] != outputs[s, 100] for s in ("beam", "beam+LM"))  # beam 1 differs
    with pytest.raises(SystemExit, match="--beam-size must be >= 1"):
        frontier.main([*argv, "--beam-size", "0"])
    with pytest.raises(SystemExit, match="--gamma weighs the --lm language model"):
        frontier.main([*argv, "--gamma", "3"])
    with pytest.raises(SystemExit, match="strategy beam\\+LM needs a language model"):
        frontier.main([*argv[:-4], "--strategies", "beam+LM", "--json", str(out)])


def test_valid_bleu_is_the_bench_paths_bleu(tmp_path):
    """``bleu`` through fadat.evaluate gives, per design, λ and strategy, the tokenized BLEU
    of the bench's own decoding path (fp32) at that λ on the same valid sentences; the
    references are one design's λ = 2 joint-Viterbi outputs (some of ≥ 4 words), so that point
    scores 100 and the same design at λ = 3 less: λ reaches the decoder."""
    from test_bench_inference import load_bench

    from fadat.data.spm import encode_source
    from fadat.evaluation.scoring import corpus_scores

    bench = load_bench()
    frontier = load_frontier()
    dats, data, sources, refs = designs_and_valid_data(tmp_path)
    out = tmp_path / "valid-bleu.json"
    argv = ["bleu", "--design", f"tiny={dats['tiny']}", "--design", f"deep={dats['deep']}"]
    argv += ["--data", str(data), "--ratios", "2", "3", "--json", str(out)]
    assert frontier.main(argv) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["data_fingerprint"] == frontier.split_digest(data, "valid")
    got = {(p["design"], p["lambda"], p["strategy"]): p["tok_bleu"] for p in result["points"]}
    assert len(got) == 2 * 2 * 2 and result["split"] == "valid"
    assert got["tiny", 2.0, "joint-viterbi"] == 100.0 > got["tiny", 3.0, "joint-viterbi"]
    for design, directory in dats.items():
        model, sp = bench.load_model(directory, "cpu")
        ids = [encode_source(sp, x) for x in sources]
        for ratio in (2.0, 3.0):
            for strategy in ("lookahead", "joint-viterbi"):
                hyps = bench.dat_translate(model, strategy, None, None, ratio)(ids)
                scores = corpus_scores([sp.decode(y) for y in hyps], [refs], "en")
                assert got[design, ratio, strategy] == round(scores["tok_bleu"], 2)


def test_every_default_beam_is_the_strategys():
    """The beam search's default beam is written where its module cannot import the strategy
    record (the torch-free engine, the frontier script, the torch wrappers' signatures): each
    copy equals ``strategies.BEAM``'s, so the frontier's ``k=K`` labels and the bench's
    ``--beam-size`` default mean the beam that ``fadat translate --strategy beam`` runs."""
    import inspect

    from fadat.decoding import beam, strategies
    from fadat.engine import beam_np

    default = strategies.BEAM.defaults["beam_size"]
    assert load_frontier().BLEU_BEAM_SIZE == default
    for fn in (beam_np.beam_search, beam.beam_search, beam.beam_search_candidates):
        assert inspect.signature(fn).parameters["beam_size"].default == default, fn.__name__
