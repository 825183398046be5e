"""Tests of the lexical shortlist (fadat.models.shortlist): the table against counts made by brute
force, the file's round trip and its errors, and `fadat shortlist` / `--shortlist` on the
command line."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from fadat.errors import InputError
from fadat.models.shortlist import SHORTLIST_NAME, build_shortlist, load_shortlist

SPECIALS = {BOS_ID, PAD_ID, EOS_ID, UNK_ID}


def _random_pairs(seed: int, n: int, vocab: int):
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        x = rng.integers(4, vocab, size=rng.integers(1, 8))
        y = x[rng.permutation(len(x))] % (vocab - 4) + 4  # correlated with x
        y = np.concatenate([y, rng.integers(4, vocab, size=rng.integers(0, 3))])
        pairs.append((np.append(x, EOS_ID), np.concatenate([[BOS_ID], y, [EOS_ID]])))
    return pairs


@pytest.mark.parametrize("top_k, frequent", [(3, 4), (0, 0), (50, 2)])
def test_table_matches_brute_force_counts(top_k, frequent):
    vocab = 30
    pairs = _random_pairs(0, 200, vocab)
    shortlist = build_shortlist(pairs, vocab, top_k=top_k, frequent=frequent)
    # brute force: pairs holding each token, and each (s, t) pair counted once per sentence
    tgt_count = Counter(t for _, y in pairs for t in set(y.tolist()) - SPECIALS)
    both = Counter(
        (s, t)
        for x, y in pairs
        for s in set(x.tolist()) - SPECIALS
        for t in set(y.tolist()) - SPECIALS
    )
    by_count = sorted(tgt_count, key=lambda t: (-tgt_count[t], t))[:frequent]
    expected_frequent = sorted(SPECIALS) + sorted(by_count)
    assert shortlist.frequent.tolist() == expected_frequent
    for s in range(vocab):
        cands = [t for (a, t) in both if a == s and t not in expected_frequent]
        cands.sort(key=lambda t: (-both[(s, t)], -tgt_count[t], t))
        row = shortlist.table[s].tolist()
        assert row == (cands[:top_k] + [-1] * top_k)[:top_k], s
    sentence = pairs[0][0]
    lexical = {t for s in sentence.tolist() for t in shortlist.table[s].tolist() if t >= 0}
    assert shortlist.candidates(sentence).tolist() == sorted(lexical | set(expected_frequent))


def test_file_round_trip_and_errors(tmp_path):
    shortlist = build_shortlist(_random_pairs(1, 50, 20), 20, top_k=4, frequent=3, built_from="x")
    path = shortlist.save(tmp_path / SHORTLIST_NAME)
    back = load_shortlist(tmp_path)  # a model directory: its shortlist.safetensors
    assert np.array_equal(back.table, shortlist.table)
    assert np.array_equal(back.frequent, shortlist.frequent)
    assert back.metadata["built_from"] == "x" and back.metadata["pairs"] == "50"
    with pytest.raises(InputError, match="vocabulary of 20"):
        load_shortlist(path, vocab_size=16)
    with pytest.raises(InputError, match="no shortlist"):
        load_shortlist(tmp_path / "missing")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(InputError, match="bad.safetensors: unreadable"):
        load_shortlist(bad)
    with pytest.raises(InputError, match=">= 0"):
        build_shortlist([], 20, top_k=-1)


def test_shortlist_verb_and_translate_flags(tmp_path, capsys):
    from test_translate import random_models

    from fadat import cli

    models = random_models(str(tmp_path / "random"))
    src, tgt = tmp_path / "train.src", tmp_path / "train.tgt"
    src.write_text("ab cd ef\ngh ij\nab gh\n", encoding="utf-8")
    tgt.write_text("ab cd\ngh ij ef\nab\n", encoding="utf-8")
    argv = ["shortlist", "--model", str(models["dat"]), "--source", str(src)]
    assert cli.main([*argv, "--target", str(tgt), "--top-k", "2", "--frequent", "1"]) == 0
    shortlist = load_shortlist(models["dat"], vocab_size=16)
    assert shortlist.table.shape == (16, 2) and shortlist.metadata["pairs"] == "3"
    assert cli.main([*argv, "--target", str(tgt), "--data", str(tmp_path)]) == 2
    assert "either --data" in capsys.readouterr().err
    # an AT takes one too (CTranslate2's vocabulary map, fadat export --shortlist); a NAT not
    at = ["shortlist", "--model", str(models["at"]), "--source", str(src), "--target", str(tgt)]
    assert cli.main([*at, "--top-k", "2", "--frequent", "1"]) == 0
    assert np.array_equal(load_shortlist(models["at"], vocab_size=16).table, shortlist.table)
    from fadat.models.config import make_config
    from fadat.models.nat import NATModel

    nat_config = make_config("tiny", 16, model_type="nat", max_source_positions=8)
    NATModel(nat_config).save_pretrained(tmp_path / "nat", spm_model=models["spm"])
    nat = ["shortlist", "--model", str(tmp_path / "nat"), "--source", str(src)]
    assert cli.main([*nat, "--target", str(tgt)]) == 2
    assert "shortlists are for DATs" in capsys.readouterr().err
    tgt.write_text("ab cd\n", encoding="utf-8")
    assert cli.main([*argv, "--target", str(tgt)]) == 2
    assert "3 lines" in capsys.readouterr().err

    inp = tmp_path / "in.txt"
    inp.write_text("ab cd ef\ngh ij\n", encoding="utf-8")
    base = ["translate", "--model", str(models["dat"]), "--input", str(inp)]
    out = tmp_path / "out.txt"
    flags = ["--shortlist", "--prune-threshold", "0.01", "--strategy", "joint-viterbi"]
    assert cli.main([*base, *flags, "--output", str(out)]) == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 2
    assert cli.main([*base, "--shortlist", "--strategy", "sample"]) == 2
    assert "apply to greedy" in capsys.readouterr().err
    assert cli.main([*base, "--prune-threshold", "2"]) == 2
    at = ["translate", "--model", str(models["at"]), "--input", str(inp), "--shortlist"]
    assert cli.main(at) == 2
    assert "for DAT models" in capsys.readouterr().err
