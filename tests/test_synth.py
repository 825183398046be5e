"""Tests of the synthetic multi-modal corpus (fadat.data.synth, ``fadat prepare
synth-multimodal``) and of the valid-set metrics (fadat.evaluation.validset_metrics, ``fadat
evaluate``): training targets lie in their valid sets, P = Q = 0 gives singletons, set sizes and
membership against brute-force enumeration, byte-identical output per seed, metrics on hand-made
outputs."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_evaluate import write_data

from fadat import cli
from fadat.data import synth
from fadat.data.synth import SynthConfig, ValidSet
from fadat.evaluation.validset_metrics import classify, validset_scores


def segment(words: list[str], lex: synth.Lexicon) -> list[list[int]]:
    """Source words → phrases of word ids: a phrase ends after a phrase-final word (the phrase
    boundaries are a function of the source words alone)."""
    index = {w: i for i, w in enumerate(lex.words)}
    phrases: list[list[int]] = [[]]
    for w in words:
        phrases[-1].append(index[w])  # KeyError: an unknown word
        if lex.final[index[w]]:
            phrases.append([])
    assert not phrases[-1], "the sentence does not end with a phrase-final word"
    return phrases[:-1]


SMALL = SynthConfig(
    seed=3,
    swap_prob=0.4,
    synonym_prob=0.4,
    train_size=300,
    valid_size=40,
    test_size=40,
    source_types=40,
    max_words=12,
)


def test_training_targets_are_in_the_valid_set_of_their_source():
    lex, splits = synth.generate(SMALL)
    for split in ("train", "valid", "test"):
        part = splits[split]
        for source, target, stored in zip(part.sources, part.targets, part.valid_sets, strict=True):
            # The valid set is rebuilt from the source words alone (phrase-final words).
            vs = synth.valid_set(segment(source.split(), lex), lex, SMALL)
            assert vs == stored
            assert vs.contains(target.split())
            assert SMALL.min_words <= len(source.split()) <= SMALL.max_words
    # The corpus is multi-modal: some training targets differ from the unswapped first synonyms.
    firsts = [
        " ".join(t for p in vs.phrases for w in p for t in w[0])
        for vs in splits["train"].valid_sets
    ]
    differ = sum(a != b for a, b in zip(firsts, splits["train"].targets, strict=True))
    assert 0.3 * SMALL.train_size < differ < SMALL.train_size


def test_deterministic_setting_has_singleton_valid_sets():
    cfg = replace(SMALL, swap_prob=0.0, synonym_prob=0.0)
    _, splits = synth.generate(cfg)
    for part in splits.values():
        for target, vs in zip(part.targets, part.valid_sets, strict=True):
            assert vs.count() == 1
            assert [" ".join(t) for t in vs.enumerate()] == [target]
    # The same seed gives the same source sentences at every (P, Q).
    _, other = synth.generate(SMALL)
    assert other["train"].sources == splits["train"].sources


def _brute_orders(k: int) -> list[tuple[int, ...]]:
    # Products of disjoint adjacent transpositions = permutations moving nothing by > 1.
    return [
        p for p in itertools.permutations(range(k)) if all(abs(p[i] - i) <= 1 for i in range(k))
    ]


@pytest.mark.parametrize("k", range(0, 8))
def test_swap_orders_against_brute_force(k):
    orders = synth.swap_orders(k, True)
    assert sorted(orders) == sorted(_brute_orders(k))
    assert len(orders) == synth.fibonacci(k + 1)
    assert synth.swap_orders(k, False) == [tuple(range(k))]


def test_valid_set_size_membership_and_bigrams_against_brute_force():
    _, splits = synth.generate(SMALL)
    rng = np.random.default_rng(0)
    checked = 0
    for vs in splits["valid"].valid_sets + splits["test"].valid_sets:
        if vs.count() > 3000:
            continue
        checked += 1
        # Brute force: every swap pattern × every synonym choice of every word.
        words_per_phrase = [list(p) for p in vs.phrases]
        combos = set()
        n = 0
        for order in _brute_orders(len(vs.phrases)):
            words = [w for i in order for w in words_per_phrase[i]]
            for choice in itertools.product(*words):
                n += 1
                combos.add(tuple(t for option in choice for t in option))
        assert vs.count() == n
        assert set(vs.enumerate()) == combos
        assert all(vs.contains(c) for c in combos)
        bigrams = {b for c in combos for b in zip(c, c[1:], strict=False)}
        assert vs.bigrams() == bigrams
        # Perturbed sequences are members exactly when brute force says so.
        vocab = sorted({t for c in combos for t in c})
        for c in list(combos)[:5]:
            for _ in range(5):
                x = list(c)
                i, j = rng.integers(len(x), size=2)
                x[i], x[j] = x[j], x[i]
                assert vs.contains(x) == (tuple(x) in combos)
                x[i] = vocab[rng.integers(len(vocab))]
                assert vs.contains(x) == (tuple(x) in combos)
            assert not vs.contains(c[:-1])
    assert checked >= 20


def test_no_valid_translation_repeats_a_token():
    # DA-T decoders drop a token equal to the previous one: such translations must not exist.
    for cfg in (SMALL, replace(SMALL, swap_prob=0.0, synonym_prob=0.0)):
        _, splits = synth.generate(cfg)
        for vs in splits["train"].valid_sets + splits["test"].valid_sets:
            assert all(a != b for a, b in vs.bigrams())
    assert synth.adjacent_repeat([[1, 2], [2]])
    assert synth.adjacent_repeat([[3], [1], [3]])  # the swap of [1] and [3] puts 3 next to 3
    assert synth.adjacent_repeat([[3], [1], [2], [3]])  # orders 1 3 | 3 2: phrases 0 and 3 meet
    assert not synth.adjacent_repeat([[3], [1], [2], [4], [3]])


def test_uniform_listing_draws_every_swap_pattern_equally():
    vs = ValidSet(tuple((((f"t{i}",),),) for i in range(5)), swaps=True)  # F(6) = 8 orders
    rng = np.random.default_rng(1)
    counts: dict[tuple[str, ...], int] = {}
    for _ in range(8000):
        y = vs.sample_uniform(rng)
        counts[y] = counts.get(y, 0) + 1
    assert len(counts) == 8
    assert all(abs(c - 1000) < 150 for c in counts.values())


def _prepare(out: Path, *extra: str) -> int:
    return cli.main(
        [
            "prepare",
            "synth-multimodal",
            "--output",
            str(out),
            "--train-size",
            "300",
            "--valid-size",
            "30",
            "--test-size",
            "30",
            *extra,
        ]
    )


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_same_seed_gives_byte_identical_files(tmp_path):
    assert _prepare(tmp_path / "a", "--seed", "5") == 0
    assert _prepare(tmp_path / "b", "--seed", "5") == 0
    assert _prepare(tmp_path / "c", "--seed", "6") == 0
    a, b, c = _tree(tmp_path / "a"), _tree(tmp_path / "b"), _tree(tmp_path / "c")
    assert "raw/valid.validset.jsonl" in a and "train.src.ids.npy" in a
    assert a == b
    assert a["raw/test.ref.txt"] != c["raw/test.ref.txt"]
    meta = json.loads(a["meta.json"])
    assert meta["corpus"] == "synth-multimodal" and meta["spm"]["model_type"] == "word"
    assert meta["splits"]["train"]["unk_tokens"] == 0
    # One sentencepiece piece per word: tokens = words.
    assert meta["splits"]["train"]["target_tokens"] == meta["splits"]["train"]["target_words"]
    # Raw references align with the valid sets and lie in them.
    sets = synth.read_valid_sets(tmp_path / "a", "test")
    refs = (tmp_path / "a" / "raw" / "test.ref.txt").read_text().splitlines()
    listed = synth.read_listed_references(tmp_path / "a", "test")
    assert len(sets) == len(refs) == len(listed) == 30
    assert all(vs.contains(r.split()) for vs, r in zip(sets, refs, strict=True))
    assert all(vs.contains(x.split()) for vs, xs in zip(sets, listed, strict=True) for x in xs)


def test_prepare_rejects_bad_options(tmp_path, capsys):
    assert _prepare(tmp_path / "x", "--swap-prob", "1.5") == 2
    assert "--swap-prob" in capsys.readouterr().err
    assert _prepare(tmp_path / "y", "--vocab-size", "100") == 2
    assert "--vocab-size" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


# ----------------------------------------------------------------------------------------------
# Metrics

# Three one-word phrases x, y, z; y has two synonyms y1/y2. Valid: x y z, y x z, x z y (× y1/y2).
HAND = ValidSet((((("x",),),), ((("y1",), ("y2",)),), ((("z",),),)), swaps=True)


def test_classify_hand_made_outputs():
    assert HAND.count() == 6
    assert classify("y2 x z", HAND) == "valid"
    assert classify("x z y1", HAND) == "valid"
    # Both bigrams occur in valid translations (x y1 z, y1 x z), the whole does not.
    assert classify("x y1 x", HAND) == "mixture"
    assert classify("z x y1", HAND) == "other"  # z x occurs nowhere
    assert classify("x x y1 z", HAND) == "other"  # repetition: x x occurs nowhere
    assert classify("x", HAND) == "other"  # no bigram


def test_validset_scores_on_hand_made_outputs():
    hyps = ["y2 x z", "x y1 x", "x x y1 z", "x z"]
    single = ["x y1 z"] * 4
    listed = [[" ".join(t) for t in HAND.enumerate()]] * 4
    s = validset_scores(hyps, [HAND] * 4, listed, single)
    assert s["exact_valid"] == pytest.approx(25.0)
    # "x y1 x" and "x z" (a dropped word, its one bigram valid) are mixtures; "x x y1 z" is not.
    assert s["mixtures"] == 2 and s["mixture_rate"] == pytest.approx(50.0)
    assert s["repeated_tokens"] == pytest.approx(100 * 1 / 12)  # "x x" in 12 tokens
    assert s["length_error"] == pytest.approx((0 + 0 + 1 + 1) / 4)
    assert s["length_bias"] == pytest.approx(0.0)
    assert s["references_per_sentence"] == pytest.approx(6.0)
    # A valid output alone: BLEU 100 against the valid set, less against the single reference.
    long = ValidSet(tuple((((w,),),) for w in "abcdef"), swaps=True)
    listed_long = [[" ".join(t) for t in long.enumerate()]]
    one = validset_scores(["b a c d f e"], [long], listed_long, ["a b c d e f"])
    assert one["bleu_multi"] == pytest.approx(100.0) and one["exact_valid"] == 100.0
    assert one["bleu_single"] < 50
    with pytest.raises(Exception, match="valid-set metrics"):
        validset_scores(hyps, [HAND] * 3, listed, single)


def test_evaluate_reports_validset_metrics(models, tmp_path, capsys):
    from test_translate import random_sentences

    sources = random_sentences(6, seed=30, low=1, high=6)
    refs = random_sentences(6, seed=31, low=2, high=6)
    data = write_data(tmp_path / "data", sources, [refs])
    sets = []
    with open(data / "raw" / "test.validset.jsonl", "w", encoding="utf-8") as f:
        for ref in refs:
            words = ref.split()
            vs = ValidSet(tuple(((((w,),),)) for w in words), swaps=True)
            sets.append(vs)
            f.write(json.dumps({**vs.to_json(), "references": [ref]}) + "\n")
    argv = [
        "evaluate",
        "--model",
        str(models["dat"]),
        "--data",
        str(data),
        "--strategies",
        "greedy",
        "--no-latency",
        "--bootstrap",
        "0",
        "--threads",
        "1",
        "--subset",
        "5",
        "--report",
        str(tmp_path / "r.json"),
        "--save-hypotheses",
        str(tmp_path / "h"),
    ]
    assert cli.main(argv) == 0
    assert "exact valid %" in capsys.readouterr().out
    report = json.loads((tmp_path / "r.json").read_text())
    system = report["systems"][0]
    hyps = (tmp_path / "h" / (system["name"].replace(":", ".") + ".txt")).read_text().splitlines()
    expected = validset_scores(hyps, sets[:5], [[r] for r in refs[:5]], refs[:5])
    assert system["validset"] == pytest.approx(expected)
