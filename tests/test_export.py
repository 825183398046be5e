"""Tests of ``fadat export --format ctranslate2``: the exported AT translates real bible-en-es test
sentences into the same tokens as fadat's AT (greedy and beam 5, fp32), and bad model
directories are one-line errors (exit 2)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from fadat import cli
from fadat.data.contract import EOS_ID
from fadat.models.directory import load_pretrained
from fadat.objectives.at import LabelSmoothedCEOptions

ctranslate2 = pytest.importorskip("ctranslate2")

from fadat.translation.export import CTranslate2AT, export_ctranslate2  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
TEST_50 = DATA / "bible-en-es-test-50"  # .en / .es: the first 50 pairs of the test split


@functools.cache
def briefly_trained_at(root: str) -> dict[str, Path]:
    """A small AT (d = 64, one encoder and one decoder layer, 500-piece vocabulary) trained
    for 350 updates on the 50 real bible-en-es test pairs of ``tests/data`` (the first 50 of
    the test split, as ``fadat prepare bible-en-es`` writes them from Debian's SWORD packages).

    It learns them by heart, imperfectly: most outputs are the reference or close to it and end
    with ``</s>`` before the length limit, as a trained translator's do (a model trained briefly
    on a real training set only repeats words up to the limit, where fadat and CTranslate2
    differ on purpose, see fadat.translation.export).
    """
    from fadat.training.checkpoints import write_averaged_model
    from fadat.training.trainer import TrainConfig, train

    root_path = Path(root)
    root_path.mkdir(parents=True, exist_ok=True)
    argv = ["prepare"]
    for prefix in ("", "valid-", "test-"):
        argv += [
            f"--{prefix}source-file",
            f"{TEST_50}.en",
            f"--{prefix}target-file",
            f"{TEST_50}.es",
        ]
    data = root_path / "data"
    argv += ["--source-lang", "en", "--target-lang", "es", "--vocab-size", "500"]
    assert cli.main([*argv, "--output", str(data)]) == 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(
            TrainConfig(
                data=str(data),
                run_dir=str(root_path / "run"),
                arch="at",
                preset="tiny",
                model={"d_model": 64, "ffn_dim": 128, "max_source_positions": 128},
                lr=1e-2,
                warmup=20,
                max_updates=350,
                max_tokens=4096,
                dropout=0.0,
                objective_options=LabelSmoothedCEOptions(label_smoothing=0.0),
                validate_every=0,
                log_every=1000,
                progress_bar=False,
                seed=1,
            )
        )
    finally:
        torch.set_num_threads(threads)
    model = root_path / "model"
    write_averaged_model([root_path / "run" / "checkpoint_last.pt"], model, data)
    return {"model": model, "test_src": Path(f"{TEST_50}.en")}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    return briefly_trained_at(str(tmp_path_factory.getbasetemp() / "export-at"))


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory) -> Path:
    out = tmp_path_factory.getbasetemp() / "export-at-ct2"
    assert (
        cli.main(
            [
                "export",
                "--format",
                "ctranslate2",
                "--model",
                str(trained["model"]),
                "--output",
                str(out),
            ]
        )
        == 0
    )
    return out


def _sources(trained) -> list[list[int]]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(trained["model"] / "spm.model"))
    lines = trained["test_src"].read_text(encoding="utf-8").splitlines()
    assert len(lines) == 50
    return [sp.encode(line) + [EOS_ID] for line in lines]


@pytest.mark.slow
def test_export_gives_fadats_greedy_and_beam_tokens(trained, exported):
    torch.set_num_threads(1)
    model = load_pretrained(trained["model"])
    engine = CTranslate2AT(exported, compute_type="float32")
    sources = _sources(trained)

    greedy = [model.greedy(torch.tensor([s]))[0].tokens for s in sources]
    assert engine.translate_ids(sources, beam_size=1) == greedy  # one batch of 50
    assert [engine.translate_ids([s], beam_size=1)[0] for s in sources] == greedy

    # Beam search: the same tokens whenever neither search's best hypothesis was cut by the
    # length limit (there fadat forces </s> and CTranslate2 stops; see fadat.translation.export).
    natural = 0
    for s in sources:
        limit = int(model._max_lengths(torch.tensor([s]), 1.2, 10))
        ours = model.beam_search(torch.tensor([s]), 5)[0].tokens
        theirs = engine.translate_ids([s], beam_size=5)[0]
        assert len(theirs) <= limit - 1
        if max(len(ours), len(theirs)) < limit - 1:
            natural += 1
            assert theirs == ours, (s, ours, theirs)
    assert natural >= 45, f"only {natural} of 50 beam outputs ended before the limit"

    # Not trivial: outputs differ between sentences and between the decoders, and use many words.
    beam = [engine.translate_ids([s], beam_size=5)[0] for s in sources]
    assert len({tuple(h) for h in greedy}) == 50 and len({t for h in beam for t in h}) >= 200


@pytest.mark.slow
def test_export_metadata_and_quantized_copy(trained, exported, tmp_path):
    info = json.loads((exported / "fadat_export.json").read_text(encoding="utf-8"))
    assert info["model_config"]["model_type"] == "at" and info["quantization"] == "float32"
    assert (exported / "spm.model").read_bytes() == (trained["model"] / "spm.model").read_bytes()
    vocab = json.loads((exported / "shared_vocabulary.json").read_text(encoding="utf-8"))
    assert vocab[:4] == ["<s>", "<pad>", "</s>", "<unk>"] and len(vocab) == 500
    # int8 weights are half the size or less and still translate (not compared: quantized).
    small = export_ctranslate2(trained["model"], tmp_path / "int8", quantization="int8")
    assert (small / "model.bin").stat().st_size < 0.5 * (exported / "model.bin").stat().st_size
    out = CTranslate2AT(small, compute_type="int8").translate_ids(_sources(trained)[:3], 5)
    assert len(out) == 3 and all(isinstance(t, int) for h in out for t in h)


def _export(argv, capsys) -> tuple[int, str]:
    code = cli.main(["export", "--format", "ctranslate2", *argv])
    return code, capsys.readouterr().err


def test_export_of_a_dat_or_corrupt_directory_is_a_one_line_error(tmp_path, capsys):
    from test_translate import random_models

    models = random_models(str(tmp_path / "random"))
    code, err = _export(["--model", str(models["dat"]), "--output", str(tmp_path / "o")], capsys)
    assert code == 2 and err.count("\n") == 1 and "'dat' model" in err, err
    assert not (tmp_path / "o").exists()

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json", encoding="utf-8")
    code, err = _export(["--model", str(broken), "--output", str(tmp_path / "o")], capsys)
    assert code == 2 and err.count("\n") == 1 and "config.json" in err, err

    at = tmp_path / "at"
    at.mkdir()
    for f in Path(models["at"]).iterdir():
        (at / f.name).write_bytes(f.read_bytes())
    (at / "model.safetensors").write_bytes(b"\x00" * 100)
    code, err = _export(["--model", str(at), "--output", str(tmp_path / "o")], capsys)
    assert code == 2 and err.count("\n") == 1 and "model.safetensors" in err, err
    assert not (tmp_path / "o").exists()

    code, err = _export(
        ["--model", str(tmp_path / "none"), "--output", str(tmp_path / "o")], capsys
    )
    assert code == 2 and "does not exist" in err

    # A good AT directory exports; exporting again onto it needs --force.
    code, _ = _export(["--model", str(models["at"]), "--output", str(tmp_path / "o")], capsys)
    assert code == 0 and (tmp_path / "o" / "model.bin").is_file()
    code, err = _export(["--model", str(models["at"]), "--output", str(tmp_path / "o")], capsys)
    assert code == 2 and "--force" in err
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_export_writes_the_vocabulary_map_from_the_ats_shortlist(tmp_path, capsys):
    """``fadat shortlist --model AT`` then ``fadat export --shortlist``: the export holds the
    shortlist as ``vmap.txt`` (the same file :func:`write_ctranslate2_vmap` writes) and names
    it in its info; a shortlist for another vocabulary is a one-line error and leaves nothing."""
    import sentencepiece as spm
    from test_translate import random_models

    from fadat.models.shortlist import build_shortlist, load_shortlist, write_ctranslate2_vmap

    models = random_models(str(tmp_path / "random"))
    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_text("ab cd\ngh ij\nab gh\n", encoding="utf-8")
    tgt.write_text("ab\ngh ij\nab cd\n", encoding="utf-8")
    argv = ["shortlist", "--model", str(models["at"]), "--source", str(src), "--target", str(tgt)]
    assert cli.main([*argv, "--top-k", "2", "--frequent", "1"]) == 0
    capsys.readouterr()
    code, err = _export(
        ["--model", str(models["at"]), "--output", str(tmp_path / "o"), "--shortlist"], capsys
    )
    assert code == 0, err
    sp = spm.SentencePieceProcessor(model_file=str(models["spm"]))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    expected = write_ctranslate2_vmap(load_shortlist(models["at"]), pieces, tmp_path / "v.txt")
    assert (tmp_path / "o" / "vmap.txt").read_text() == expected.read_text()
    info = json.loads((tmp_path / "o" / "fadat_export.json").read_text())
    assert info["vocabulary_map"]["top_k"] == "2"
    CTranslate2AT(tmp_path / "o", "float32").translate_ids([[4, 5, 2]], 2, use_vmap=True)

    other = build_shortlist([], 20, top_k=1, frequent=0).save(tmp_path / "other.safetensors")
    out = tmp_path / "o2"
    code, err = _export(
        ["--model", str(models["at"]), "--output", str(out), "--shortlist", str(other)], capsys
    )
    assert code == 2 and err.count("\n") == 1 and "vocabulary of 20" in err, err
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_vocabulary_map_and_forced_lengths(tmp_path):
    """``use_vmap`` with a vmap.txt written from a shortlist keeps every output token among the
    batch's candidates; ``target_lengths`` gives exactly that many tokens per sentence."""
    import numpy as np
    import sentencepiece as spm
    from test_translate import random_models

    from fadat.data.spm import encode_source
    from fadat.models.shortlist import build_shortlist, text_pairs, write_ctranslate2_vmap

    models = random_models(str(tmp_path / "random"))
    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_text("ab cd\ngh ij\n", encoding="utf-8")
    tgt.write_text("ab\ngh\n", encoding="utf-8")
    sp = spm.SentencePieceProcessor(model_file=str(models["spm"]))
    shortlist = build_shortlist(text_pairs(sp, src, tgt), 16, top_k=1, frequent=0)
    out = export_ctranslate2(models["at"], tmp_path / "ct2")
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    write_ctranslate2_vmap(shortlist, pieces, out / "vmap.txt")
    engine = CTranslate2AT(out, "float32")
    sources = [encode_source(sp, line) for line in ("ab cd", "gh ij", "ab gh ij")]
    for source in sources:
        allowed = set(shortlist.candidates(source).tolist())
        (ids,) = engine.translate_ids([source], beam_size=2, use_vmap=True)
        assert set(ids) <= allowed, (ids, allowed)
    free = engine.translate_ids(sources, beam_size=2)
    outside = [
        set(y) - set(shortlist.candidates(x).tolist()) for x, y in zip(sources, free, strict=True)
    ]
    assert any(outside)  # without the map the random AT leaves the shortlist
    lengths = [3, 0, 5]
    forced = engine.translate_ids(sources, beam_size=1, target_lengths=lengths)
    assert [len(y) for y in forced] == lengths
    assert np.array_equal(
        forced[2][:3], engine.translate_ids(sources[2:], 1, target_lengths=[3])[0]
    )
    # Two replicas share the per-length calls (submitted asynchronously): same outputs, in
    # the sentences' order, whatever replica finishes first.
    lengths = [3, 0, 5, 3, 1, 5]
    two = CTranslate2AT(out, "float32", inter_threads=2)
    for beam in (1, 2):
        want = engine.translate_ids(sources * 2, beam_size=beam, target_lengths=lengths)
        got = two.translate_ids(
            sources * 2, beam_size=beam, max_batch_size=1, target_lengths=lengths
        )
        assert got == want and [len(y) for y in got] == lengths
    with pytest.raises(ValueError, match="target_lengths"):
        engine.translate_ids(sources, target_lengths=[1])
