"""fadat prepare on small generated parallel text: input problems, filtering, layout, round trip."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fadat.cli import main
from fadat.data import spm
from fadat.data.binarized import BinarizedDataset, raw_references, raw_sources
from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID

WORDS = "the cat dog sat on a mat and ran to house big small red blue green".split()


def sentences(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 9)))) for _ in range(n)]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    src, tgt = sentences(200, 1), [s.upper() for s in sentences(200, 1)]
    return {
        "src": write(tmp_path / "train.en", src),
        "tgt": write(tmp_path / "train.xx", tgt),
        "vsrc": write(tmp_path / "valid.en", sentences(20, 2)),
        "vtgt": write(tmp_path / "valid.xx", [s.upper() for s in sentences(20, 2)]),
        "vref2": write(tmp_path / "valid2.xx", [s.title() for s in sentences(20, 2)]),
    }


def argv(files: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return [
        "prepare",
        "--source-file",
        str(files["src"]),
        "--target-file",
        str(files["tgt"]),
        "--valid-source-file",
        str(files["vsrc"]),
        "--valid-target-file",
        str(files["vtgt"]),
        "--valid-extra-ref",
        str(files["vref2"]),
        "--source-lang",
        "en",
        "--target-lang",
        "xx",
        "--vocab-size",
        "60",
        "--output",
        str(out),
        *extra,
    ]


def test_round_trip_layout_and_meta(files, tmp_path):
    out = tmp_path / "out"
    assert main(argv(files, out)) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["special_ids"] == {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    assert meta["splits"]["train"]["pairs"] == 200 and meta["splits"]["valid"]["pairs"] == 20
    assert meta["source_files"][0]["sha256"] and meta["vocab_size"] == 60
    sp = spm.load_sentencepiece(out / "spm.model")
    ds = BinarizedDataset(out, "valid")
    assert len(ds) == 20
    vsrc = files["vsrc"].read_text().splitlines()
    vtgt = files["vtgt"].read_text().splitlines()
    for i in range(len(ds)):
        x, y = ds[i]
        assert x.dtype == np.int64 and x[-1] == EOS_ID and y[0] == BOS_ID and y[-1] == EOS_ID
        assert spm.decode(sp, x) == vsrc[i] and spm.decode(sp, y) == vtgt[i]
    assert ds.source_lengths.tolist() == [len(ds[i][0]) for i in range(len(ds))]
    batch = ds.collate([3, 0, 7])
    assert batch.ids.tolist() == [3, 0, 7]
    assert batch.source_lengths.tolist() == [len(ds[i][0]) for i in (3, 0, 7)]
    row = batch.source[1]
    assert (row[batch.source_lengths[1] :] == PAD_ID).all()
    assert raw_sources(out, "valid") == vsrc
    refs = raw_references(out, "valid")
    assert refs == [vtgt, files["vref2"].read_text().splitlines()]


def test_rerun_is_idempotent_and_different_inputs_refused(files, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(argv(files, out)) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert main(argv(files, out)) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    capsys.readouterr()
    assert main(argv(files, out, "--vocab-size", "50")) == 2
    err = capsys.readouterr().err
    assert "exists" in err and "--force" in err and len(err.strip().splitlines()) == 1
    assert (out / "meta.json").read_bytes() == before["meta.json"]  # nothing lost
    assert main(argv(files, out, "--vocab-size", "50", "--force")) == 0
    assert json.loads((out / "meta.json").read_text())["vocab_size"] == 50
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


def test_tsv_form_and_spm_reuse(files, tmp_path):
    tsv = write(tmp_path / "train.tsv", [f"{s}\t{s.upper()}" for s in sentences(100, 3)])
    out1 = tmp_path / "a"
    assert (
        main(
            [
                "prepare",
                "--tsv",
                str(tsv),
                "--source-lang",
                "en",
                "--target-lang",
                "xx",
                "--vocab-size",
                "50",
                "--output",
                str(out1),
            ]
        )
        == 0
    )
    out2 = tmp_path / "b"
    assert (
        main(
            [
                "prepare",
                "--tsv",
                str(tsv),
                "--source-lang",
                "en",
                "--target-lang",
                "xx",
                "--spm-model",
                str(out1 / "spm.model"),
                "--output",
                str(out2),
            ]
        )
        == 0
    )
    a, b = BinarizedDataset(out1, "train"), BinarizedDataset(out2, "train")
    assert all((a[i][0] == b[i][0]).all() and (a[i][1] == b[i][1]).all() for i in range(len(a)))


def test_empty_and_long_pairs_dropped_with_positions(files, tmp_path):
    src = sentences(50, 4)
    tgt = [s.upper() for s in src]
    src[4] = "   "
    tgt[9] = ""
    src[20] = " ".join(["house"] * 40)
    files["src"] = write(tmp_path / "s.en", src)
    files["tgt"] = write(tmp_path / "t.xx", tgt)
    out = tmp_path / "out"
    assert main(argv(files, out, "--max-source-positions", "30")) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["dropped"]["empty"] == {
        "count": 2,
        "first": [f"{files['src']}:5", f"{files['src']}:10"],
    }
    assert meta["dropped"]["too_long"]["first"] == [f"{files['src']}:21"]
    assert meta["splits"]["train"]["pairs"] == 47
    assert BinarizedDataset(out, "train").source_lengths.max() <= 30
    assert main(argv(files, tmp_path / "strict", "--strict")) == 2
    assert not (tmp_path / "strict").exists()


def test_many_drops_list_first_ten(files, tmp_path):
    src = sentences(60, 5)
    tgt = [s.upper() if i % 3 else "" for i, s in enumerate(src)]
    files["src"], files["tgt"] = write(tmp_path / "s", src), write(tmp_path / "t", tgt)
    out = tmp_path / "out"
    assert main(argv(files, out)) == 0
    entry = json.loads((out / "meta.json").read_text())["dropped"]["empty"]
    assert entry["count"] == 20
    assert entry["first"] == [f"{files['src']}:{i + 1}" for i in range(0, 30, 3)]


@pytest.mark.parametrize(
    "case, expected",
    [
        ("mismatch", ["train.en has 200 lines", "has 199"]),
        ("utf8", [":3: invalid UTF-8 at byte offset"]),
        ("nul", [":2: NUL byte"]),
        ("missing", ["nope.txt: cannot read (No such file or directory)"]),
        ("empty", ["empty corpus"]),
    ],
)
def test_input_errors_exit_2_one_line(files, tmp_path, capsys, case, expected):
    if case == "mismatch":
        write(files["tgt"], files["tgt"].read_text().splitlines()[:-1])
    elif case == "utf8":
        files["src"].write_bytes(b"a b\nc d\ne \xff f\n" + b"x\n" * 197)
    elif case == "nul":
        files["tgt"].write_bytes(b"a b\nc\x00d\n" + b"x\n" * 198)
    elif case == "missing":
        files["src"] = tmp_path / "nope.txt"
    elif case == "empty":
        files["src"] = write(tmp_path / "e1", [])
        files["tgt"] = write(tmp_path / "e2", [])
    out = tmp_path / "out"
    assert main(argv(files, out)) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for piece in expected:
        assert piece in err
    assert not out.exists()


def test_utf8_byte_offset_is_exact(tmp_path):
    from fadat.data.text import read_lines
    from fadat.errors import InputError

    path = tmp_path / "f"
    path.write_bytes(b"\xc3\xb1\nok\nab\xc3(")  # ñ, ok, then a truncated sequence
    with pytest.raises(InputError, match=r":3: invalid UTF-8 at byte offset 8 "):
        read_lines(path)


def test_wrong_vocabulary_and_spm_ids_refused(files, tmp_path):
    from fadat.errors import InputError

    out = tmp_path / "out"
    assert main(argv(files, out)) == 0
    other = tmp_path / "other"
    spm.train_sentencepiece([files["src"]], other, vocab_size=40)
    (out / "spm.model").write_bytes((tmp_path / "other.model").read_bytes())
    with pytest.raises(InputError, match="40 pieces but meta.json says vocab_size 60"):
        BinarizedDataset(out, "train")
    import sentencepiece

    sentencepiece.SentencePieceTrainer.train(
        input=str(files["src"]),
        model_prefix=str(tmp_path / "plain"),
        vocab_size=30,
        minloglevel=2,
    )  # sentencepiece's default ids: <unk>=0 <s>=1 </s>=2, no <pad>
    with pytest.raises(InputError, match="special ids"):
        spm.load_sentencepiece(tmp_path / "plain.model")
    assert main(argv(files, tmp_path / "o2", "--spm-model", str(tmp_path / "plain.model"))) == 2


def _dataset_files(out: Path) -> dict[str, bytes]:
    """Every file of a prepared directory; meta.json without its timings."""
    files = {}
    for p in sorted(out.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name == "meta.json":
                meta = json.loads(data)
                for key in ("seconds", "spm_seconds", "encode_seconds"):
                    meta.pop(key)
                data = json.dumps(meta, sort_keys=True).encode()
            files[str(p.relative_to(out))] = data
    return files


@pytest.mark.parametrize("sample", ["0", "150"])
def test_same_dataset_in_one_chunk_or_many(files, tmp_path, sample):
    src = sentences(300, 6)
    tgt = [s.upper() for s in src]
    src[10], tgt[77] = "", " "  # empty pairs
    src[40] = " ".join(["house"] * 40)  # too long
    files["src"], files["tgt"] = write(tmp_path / "s", src), write(tmp_path / "t", tgt)
    opts = ("--max-source-positions", "30", "--spm-sample-pairs", sample)
    one, many = tmp_path / "one", tmp_path / "many"
    assert main(argv(files, one, *opts, "--chunk-pairs", "100000", "--threads", "1")) == 0
    assert main(argv(files, many, *opts, "--chunk-pairs", "7", "--threads", "2")) == 0
    a, b = _dataset_files(one), _dataset_files(many)
    assert a.keys() == b.keys() and "train.src.ids.npy" in a and "raw/valid.ref2.txt" in a
    assert a == b
    meta = json.loads((one / "meta.json").read_text())
    long = [int(w.rsplit(":", 1)[1]) - 1 for w in meta["dropped"]["too_long"]["first"]]
    assert 40 in long and meta["dropped"]["too_long"]["count"] == len(long)
    assert meta["splits"]["train"]["pairs"] == 298 - len(long) and meta["ids_dtype"] == "uint8"
    trained_on = meta["spm"]["trained_on"]
    assert trained_on["of"] == 298 and trained_on["pairs"] == (298 if sample == "0" else 150)
    # the chunked output is the round trip of the text
    sp = spm.load_sentencepiece(one / "spm.model")
    ds = BinarizedDataset(one, "train")
    kept = [i for i in range(300) if i not in (10, 77, *long)]
    assert len(ds) == len(kept)
    for k in (0, 9, 10, 150, len(kept) - 1):
        x, y = ds[k]
        assert spm.decode(sp, x) == src[kept[k]] and spm.decode(sp, y) == tgt[kept[k]]


def test_spm_sample_is_seeded_and_uniform():
    from fadat.data.build import spm_sample

    a, b = spm_sample(10_000, 2_000), spm_sample(10_000, 2_000)
    assert (a == b).all() and len(np.unique(a)) == 2_000 and (np.diff(a) > 0).all()
    assert abs(a.mean() - 5_000) < 300 and spm_sample(100, 2_000) is None
    assert spm_sample(100, 0) is None


def test_interrupted_prepare_leaves_nothing_and_rerun_succeeds(files, tmp_path, monkeypatch):
    import os
    import subprocess

    from fadat.data import binarized

    calls = {"n": 0}
    append = binarized.SplitWriter.append

    def interrupted(self, *a):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # Ctrl-C or SIGTERM half-way through the train split
        return append(self, *a)

    out = tmp_path / "data" / "out"
    with monkeypatch.context() as m:
        m.setattr(binarized.SplitWriter, "append", interrupted)
        assert main(argv(files, out, "--chunk-pairs", "20")) == 130
    assert calls["n"] == 3
    assert not out.exists() and list(out.parent.iterdir()) == []
    # A killed run (SIGKILL) cannot clean up: its staging directory is removed by the next run;
    # one whose process still runs, and anything else, is left alone.
    # Staging directories are named .NAME.tmp-PID-* (fadat.outputs.staging_dir).
    proc = subprocess.Popen(["true"])  # noqa: S607 - a process id that is surely gone
    proc.wait()
    names = (f"{proc.pid}-dead", f"{os.getpid()}-alive", "user")
    stale, running, other = (out.parent / f".out.tmp-{name}" for name in names)
    for d in (stale, running, other):
        d.mkdir()
        (d / "train.src.ids.npy").write_bytes(b"half")
    assert main(argv(files, out, "--chunk-pairs", "20")) == 0
    assert not stale.exists() and running.exists() and other.exists()
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(["out", running.name, other.name])
    assert BinarizedDataset(out, "train")[0][0][-1] == EOS_ID


def test_sigterm_leaves_no_dataset(files, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    big = sentences(4_000, 7)
    files["src"], files["tgt"] = write(tmp_path / "s", big), write(tmp_path / "t", big)
    out = tmp_path / "data" / "out"
    out.parent.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fadat.cli", *argv(files, out, "--chunk-pairs", "50")],
        env=env,
        stderr=subprocess.PIPE,
    )

    def building() -> bool:
        """The build has written into its staging directory: the process is past the checks,
        the probe file and the lock, inside the block that cleans up (a signal at the instant
        the first file appears, as before, could land between a probe file's creation and its
        removal on a busy machine)."""
        for staging in out.parent.glob(".out.tmp-*"):
            try:
                if any(staging.iterdir()):
                    return True
            except FileNotFoundError:  # finished or removed meanwhile
                pass
        return False

    deadline = time.time() + 120
    while not building() and not out.exists():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.01)
    if out.exists():
        pytest.skip("prepare finished before it could be interrupted")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("prepare finished before the signal arrived")
    assert proc.returncode == 130, err
    assert list(out.parent.iterdir()) == []
    assert main(argv(files, out)) == 0 and out.is_dir()


def test_line_reader_blocks_do_not_change_lines_or_positions(tmp_path, monkeypatch):
    from fadat.data import text as prepare
    from fadat.errors import InputError

    path = tmp_path / "f"
    text = "\ufeffzero\r\n\n" + "".join(f"línea {i} ñ\n" for i in range(50)) + "last"
    path.write_bytes(text.encode())
    whole = prepare.read_lines(path)
    assert whole[:3] == ["zero", "", "línea 0 ñ"] and whole[-1] == "last" and len(whole) == 53
    for block in (1, 3, 7, 64):
        monkeypatch.setattr(prepare, "READ_BLOCK", block)
        assert prepare.read_lines(path) == whole
    bad = text.encode()
    at = bad.index("línea 30".encode())
    path.write_bytes(bad[:at] + b"\xff" + bad[at:])
    for block in (1, 5, 1 << 22):
        monkeypatch.setattr(prepare, "READ_BLOCK", block)
        with pytest.raises(InputError, match=rf":33: invalid UTF-8 at byte offset {at} "):
            prepare.read_lines(path)


def test_old_int32_datasets_still_read(tmp_path):
    from fadat.data.binarized import write_split

    write_split(tmp_path, "train", [[4, 2], [5, 6, 2]], [[0, 4, 2], [0, 2]], 300)
    assert np.load(tmp_path / "train.src.ids.npy").dtype == np.uint16
    for side in ("src", "tgt"):
        ids = np.load(tmp_path / f"train.{side}.ids.npy")
        np.save(tmp_path / f"train.{side}.ids.npy", ids.astype(np.int32))  # the old layout
    meta = {"vocab_size": 300, "splits": {"train": {"pairs": 2}}}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    ds = BinarizedDataset(tmp_path, "train")
    assert ds[1][0].tolist() == [5, 6, 2] and ds[1][0].dtype == np.int64
    assert ds.target_lengths.tolist() == [3, 2]
