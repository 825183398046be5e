"""Tests of fadat.translation.pipeline / fadat.cli.score: the translation core against the
decoders on the same tensors, batching and order, the input problems of issue #5 (empty, over-long,
invalid UTF-8, missing/corrupt model, vocabulary mismatch), scoring against Eq. 3 and the AT chain
rule, and the acceptance test: a tiny DAT trained on a copy task reproduces held-out inputs
exactly."""

from __future__ import annotations

import functools
import io
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fadat
from fadat import cli
from fadat.dag import dag_log_likelihood
from fadat.data.spm import encode_source, encode_target, train_sentencepiece
from fadat.data.text import read_lines
from fadat.decoding import decode
from fadat.errors import DecodingOptionError, InputError
from fadat.models.at import ATModel
from fadat.models.config import make_config
from fadat.models.dat import DATModel
from fadat.models.directory import load_model
from fadat.translation.pipeline import make_batches, score_pairs
from fadat.translation.translator import Translator

WORDS = "ab cd ef gh ij kl mn op qr st uv wx".split()


def random_sentences(n: int, seed: int, low: int = 2, high: int = 6) -> list[str]:
    """Sentences over WORDS without consecutive repeats (a DAG's output de-duplicates
    consecutive equal tokens, docs/reference-behaviour.md, "Decoding", so a copy model cannot emit
    ``ab ab``)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS)]
        for _ in range(rng.randint(low, high) - 1):
            words.append(rng.choice([w for w in WORDS if w != words[-1]]))
        out.append(" ".join(words))
    return out


@functools.cache
def random_models(root: str) -> dict[str, Path]:
    """Randomly initialised tiny DAT and AT models sharing a word-level sentencepiece model.

    ``init_std = 0.5`` makes the token and link distributions peaked, so argmax decisions are
    far from ties and batching (padding) cannot flip them."""
    root_path = Path(root)
    root_path.mkdir(parents=True, exist_ok=True)
    train_sentencepiece(
        random_sentences(200, 0), root_path / "spm", vocab_size=16, model_type="word"
    )
    spm_path = root_path / "spm.model"
    torch.manual_seed(0)
    dat = DATModel(make_config("tiny", 16, max_source_positions=8, init_std=0.5, dropout=0.0))
    dat.save_pretrained(root_path / "dat", spm_model=spm_path)
    at = ATModel(
        make_config("tiny", 16, model_type="at", max_source_positions=8, init_std=0.5, dropout=0.0)
    )
    at.save_pretrained(root_path / "at", spm_model=spm_path)
    return {"dat": root_path / "dat", "at": root_path / "at", "spm": spm_path}


def copy_task_model(root: str) -> dict[str, Path]:
    """Prepare a copy-task corpus and train a tiny DAT on it with ``fadat prepare`` and the
    trainer's Python API (300 updates), then write the model directory.

    Returns:
        ``{"model": model dir, "data": data dir, "test_src": file}``.
    """
    from fadat.training.checkpoints import write_averaged_model
    from fadat.training.trainer import TrainConfig, train

    root_path = Path(root)
    root_path.mkdir(parents=True, exist_ok=True)
    files = []
    for k, (split, n) in enumerate((("train", 2000), ("valid", 30), ("test", 30))):
        lines = random_sentences(n, seed=100 + k)
        for side in ("src", "tgt"):
            path = root_path / f"{split}.{side}"
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        prefix = "" if split == "train" else f"{split}-"
        files += [f"--{prefix}source-file", str(root_path / f"{split}.src")]
        files += [f"--{prefix}target-file", str(root_path / f"{split}.tgt")]
    data = root_path / "data"
    argv = [
        "prepare",
        *files,
        "--source-lang",
        "en",
        "--target-lang",
        "en",
        "--vocab-size",
        "16",
        "--model-type",
        "word",
        "--output",
        str(data),
    ]
    assert cli.main(argv) == 0
    threads = torch.get_num_threads()
    # One thread: tiny matrices gain nothing from two, and on a busy 2-core machine two OpenMP
    # threads wait on each other (measured: 3-5x slower training).
    torch.set_num_threads(1)
    try:
        cfg = TrainConfig(
            data=str(data),
            run_dir=str(root_path / "run"),
            arch="dat",
            preset="tiny",
            lr=5e-3,
            warmup=50,
            max_updates=300,
            max_tokens=2048,
            dropout=0.0,
            glat_p="0.5:0.1@1k",
            validate_every=0,
            log_every=1000,
            progress_bar=False,
            clip_norm=1.0,
            seed=1,
        )
        train(cfg)
    finally:
        torch.set_num_threads(threads)
    model = root_path / "model"
    write_averaged_model([root_path / "run" / "checkpoint_last.pt"], model, data)
    return {"model": model, "data": data, "test_src": root_path / "test.src"}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models run fastest on one thread; restore the setting for other test modules."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    return random_models(str(tmp_path_factory.getbasetemp() / "random-models"))


def run_cli(argv: list[str], capsys, monkeypatch, stdin: bytes | None = None):
    """Run ``fadat`` in-process; returns ``(exit code, stdout, stderr)``."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


# ----------------------------------------------------------------------------------------------
# The core against the decoders and the model, on the same tensors


def _single_sentence_tensors(model, sp, line):
    source = torch.tensor([encode_source(sp, line)])  # (1, S)
    graph_lengths = model.graph_lengths(torch.tensor([source.shape[1]]), decoding=True)  # (1,)
    with torch.no_grad():
        token_logprobs, links = model(source, graph_lengths)  # (1, L, V), (1, L, L)
    return token_logprobs, links, graph_lengths


@pytest.mark.parametrize(
    ("strategy", "options"),
    [
        ("greedy", {}),
        ("lookahead", {"beta": 1.0}),
        ("viterbi", {}),
        ("joint-viterbi", {"length_penalty": 1.2}),
        ("sample", {"seed": 3, "temperature": 0.7}),
        ("beam", {"beam_size": 4}),
    ],
)
def test_translator_equals_decode_on_same_tensors(models, strategy, options):
    translator = Translator.from_pretrained(models["dat"])
    lines = random_sentences(5, seed=7)
    got = translator.translate_nbest(lines, 1, strategy, max_tokens=1, **options)
    for line, hyps in zip(lines, got, strict=True):
        tensors = _single_sentence_tensors(translator.model, translator.sp, line)
        expected = decode(*tensors, strategy, **options)[0]
        assert hyps[0].tokens == expected.tokens
        assert hyps[0].score == pytest.approx(expected.score)
        assert hyps[0].text == translator.sp.decode(expected.tokens)
    assert any(h[0].text for h in got)  # the peaked random model emits words


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_at_translation_equals_model_search(models, strategy):
    translator = Translator.from_pretrained(models["at"])
    lines = random_sentences(4, seed=8)
    got = translator.translate_nbest(lines, 1, strategy, max_tokens=1)
    for line, hyps in zip(lines, got, strict=True):
        source = torch.tensor([encode_source(translator.sp, line)])
        if strategy == "greedy":
            expected = translator.model.greedy(source)[0]
        else:
            expected = translator.model.beam_search(source, beam_size=5)[0]
        assert hyps[0].tokens == expected.tokens
        assert hyps[0].score == pytest.approx(expected.score)


@pytest.mark.parametrize("kind", ["dat", "at"])
def test_batching_keeps_input_order(models, kind):
    translator = Translator.from_pretrained(models[kind])
    lines = random_sentences(12, seed=9, low=1, high=7)
    one_by_one = [translator.translate([line], max_tokens=1)[0] for line in lines]
    for budget in (40, 200, None):
        assert translator.translate(lines, max_tokens=budget) == one_by_one


def test_make_batches_partitions_within_budget():
    rng = random.Random(0)
    for _ in range(200):
        costs = [rng.randint(1, 30) for _ in range(rng.randint(0, 40))]
        budget = rng.choice([None, 10, 40, 100])
        cap = rng.choice([None, 1, 3, 8])
        batches = make_batches(costs, budget, cap)
        assert sorted(i for b in batches for i in b) == list(range(len(costs)))
        for batch in batches:
            if cap:
                assert len(batch) <= cap
            if budget and len(batch) > 1:
                assert len(batch) * max(costs[i] for i in batch) <= budget


def test_nbest_sample_is_ranked_unique_draws(models):
    translator = Translator.from_pretrained(models["dat"])
    lines = random_sentences(3, seed=10)
    got = translator.translate_nbest(lines, 4, "sample", max_tokens=1, seed=11, temperature=2.0)
    for line, hyps in zip(lines, got, strict=True):
        tensors = _single_sentence_tensors(translator.model, translator.sp, line)
        draws = [decode(*tensors, "sample", seed=11 + k, temperature=2.0)[0] for k in range(4)]
        expected = {}
        for d in draws:
            expected[tuple(d.tokens)] = max(expected.get(tuple(d.tokens), -1e9), d.score)
        assert {tuple(h.tokens): h.score for h in hyps} == pytest.approx(expected)
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


def test_empty_lines_keep_alignment(models, capsys, monkeypatch):
    lines = ["ab cd", "", "   ", "ef gh ij"]
    stdin = ("\n".join(lines) + "\n").encode()
    code, out, err = run_cli(
        ["translate", "--model", str(models["dat"])], capsys, monkeypatch, stdin
    )
    assert code == 0, err
    outputs = out.split("\n")[:-1]
    assert len(outputs) == 4
    assert outputs[1] == outputs[2] == ""
    translator = Translator.from_pretrained(models["dat"])
    assert outputs[0] == translator.translate(["ab cd"])[0]
    assert outputs[3] == translator.translate(["ef gh ij"])[0]


def test_overlong_line_truncated_with_warning(models, capsys, monkeypatch, tmp_path):
    long_line = " ".join(random_sentences(1, seed=12, low=12, high=12))  # 12 words + </s> > 8
    path = tmp_path / "in.txt"
    path.write_text("ab cd\n" + long_line + "\n", encoding="utf-8")
    code, out, err = run_cli(
        ["translate", "--model", str(models["dat"]), "--input", str(path)], capsys, monkeypatch
    )
    assert code == 0
    assert err.count("\n") == 1 and "line 2" in err and "truncated" in err
    assert "line 1" not in err
    # Word-level pieces: the first 7 words + </s> are exactly the truncated input.
    translator = Translator.from_pretrained(models["dat"])
    truncated = " ".join(long_line.split()[:7])
    assert out.split("\n")[1] == translator.translate([truncated])[0]


def test_print_scores_and_nbest_format(models, capsys, monkeypatch):
    stdin = b"ab cd\n\nef gh\n"
    argv = ["translate", "--model", str(models["dat"]), "--print-scores"]
    code, out, _ = run_cli(argv, capsys, monkeypatch, stdin)
    assert code == 0
    rows = [line.split("\t") for line in out.split("\n")[:-1]]
    assert len(rows) == 3 and all(len(r) == 2 for r in rows)
    assert rows[1] == ["nan", ""]
    translator = Translator.from_pretrained(models["dat"])
    best = translator.translate_nbest(["ab cd"], 1)[0][0]
    assert float(rows[0][0]) == pytest.approx(best.score, abs=1e-4)
    argv = [
        "translate",
        "--model",
        str(models["dat"]),
        "--strategy",
        "sample",
        "--nbest",
        "3",
        "--seed",
        "1",
        "--temperature",
        "3",
    ]
    code, out, _ = run_cli(argv, capsys, monkeypatch, stdin)
    assert code == 0
    numbers = [int(line.split("\t")[0]) for line in out.split("\n")[:-1]]
    assert numbers == sorted(numbers) and set(numbers) == {1, 2, 3}
    assert 1 <= numbers.count(1) <= 3 and numbers.count(2) == 1


# ----------------------------------------------------------------------------------------------
# Input problems: one line on stderr, exit 2


def _assert_one_error_line(code: int, err: str, *needles: str) -> None:
    assert code == 2
    assert err.startswith("fadat: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err


def test_invalid_utf8_exit_2(models, capsys, monkeypatch, tmp_path):
    code, _, err = run_cli(
        ["translate", "--model", str(models["dat"])], capsys, monkeypatch, b"ab cd\nef \xff gh\n"
    )
    _assert_one_error_line(code, err, "<stdin>:2:", "invalid UTF-8", "byte offset 9", "byte 3")
    path = tmp_path / "bad.txt"
    path.write_bytes(b"ab\ncd\n\xc3(\n")
    code, _, err = run_cli(
        ["translate", "--model", str(models["dat"]), "--input", str(path)], capsys, monkeypatch
    )
    _assert_one_error_line(code, err, f"{path}:3:")


def test_missing_and_corrupt_model_exit_2(models, capsys, monkeypatch, tmp_path):
    code, _, err = run_cli(
        ["translate", "--model", str(tmp_path / "nope")], capsys, monkeypatch, b"ab\n"
    )
    _assert_one_error_line(code, err, "does not exist")
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "model.safetensors", "spm.model"):
        (broken / name).write_bytes((models["dat"] / name).read_bytes())
    (broken / "model.safetensors").write_bytes(b"\x00" * 20)
    code, _, err = run_cli(["translate", "--model", str(broken)], capsys, monkeypatch, b"ab\n")
    _assert_one_error_line(code, err, "model.safetensors")
    (broken / "config.json").write_text("{not json", encoding="utf-8")
    code, _, err = run_cli(["score", "--model", str(broken)], capsys, monkeypatch, b"a\tb\n")
    _assert_one_error_line(code, err, "config.json")


def test_vocabulary_mismatch_exit_2(models, capsys, monkeypatch, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    for name in ("config.json", "model.safetensors"):
        (other / name).write_bytes((models["dat"] / name).read_bytes())
    train_sentencepiece(
        random_sentences(50, 1) + ["zz yy xx ww vv"],
        tmp_path / "sp20",
        vocab_size=20,
        model_type="word",
    )
    (other / "spm.model").write_bytes((tmp_path / "sp20.model").read_bytes())
    code, _, err = run_cli(["translate", "--model", str(other)], capsys, monkeypatch, b"ab\n")
    _assert_one_error_line(code, err, "vocabulary mismatch", "20", "16")
    with pytest.raises(InputError, match="vocabulary mismatch"):
        Translator.from_pretrained(other)


def test_bad_strategy_options_exit_2(models, capsys, monkeypatch):
    cases = [
        (["--strategy", "greedy", "--beta", "2"], "does not take --beta"),
        (["--strategy", "sample", "--top-p", "2"], "top_p"),
        (["--strategy", "nope"], "nope"),
        (["--nbest", "2"], "--nbest 2"),
        (["--device", "cuda:7"] if not torch.cuda.is_available() else ["--device", "x"], "device"),
    ]
    for extra, needle in cases:
        code, _, err = run_cli(
            ["translate", "--model", str(models["dat"]), *extra], capsys, monkeypatch, b"ab\n"
        )
        _assert_one_error_line(code, err, needle)
    code, _, err = run_cli(
        ["translate", "--model", str(models["at"]), "--strategy", "lookahead"],
        capsys,
        monkeypatch,
        b"ab\n",
    )
    _assert_one_error_line(code, err, "lookahead")


def test_real_cli_no_traceback(models, tmp_path):
    """The installed entry point: exit 2 and one stderr line, in a fresh process."""
    proc = subprocess.run(
        [sys.executable, "-m", "fadat.cli", "translate", "--model", str(tmp_path / "missing")],
        input=b"ab\n",
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.decode().count("\n") == 1 and b"Traceback" not in proc.stderr


def test_read_lines_conventions(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes(b"\xef\xbb\xbfa b\r\n\nc")
    assert read_lines(str(path)) == ["a b", "", "c"]
    path.write_bytes(b"")
    assert read_lines(str(path)) == []
    with pytest.raises(InputError, match="cannot read"):
        read_lines(str(tmp_path / "missing.txt"))


def test_read_lines_reads_stdin_only_when_asked(tmp_path, monkeypatch):
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x\r\ny")))
    assert read_lines("-", stdin=True) == ["x", "y"]
    monkeypatch.chdir(tmp_path)  # "-" is a file name like any other, and there is none here
    with pytest.raises(InputError, match="-: cannot read"):
        read_lines("-")


def test_lazy_translator_export():
    code = (
        "import sys, fadat; assert 'torch' not in sys.modules; "
        "T = fadat.Translator; assert T.__module__ == 'fadat.translation.translator'; print('ok')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert proc.stdout.strip() == b"ok", proc.stderr
    assert fadat.Translator is Translator


# ----------------------------------------------------------------------------------------------
# Scoring


def test_score_equals_dag_log_likelihood(models, capsys, monkeypatch, tmp_path):
    sources = random_sentences(6, seed=13)
    targets = random_sentences(6, seed=14, low=0, high=7)
    (tmp_path / "s.txt").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "t.txt").write_text("\n".join(targets) + "\n", encoding="utf-8")
    code, out, err = run_cli(
        [
            "score",
            "--model",
            str(models["dat"]),
            "--source",
            str(tmp_path / "s.txt"),
            "--target",
            str(tmp_path / "t.txt"),
        ],
        capsys,
        monkeypatch,
    )
    assert code == 0, err
    rows = [tuple(map(float, line.split("\t"))) for line in out.split("\n")[:-1]]
    model, sp = load_model(models["dat"])
    for (log_prob, per_token), src, tgt in zip(rows, sources, targets, strict=True):
        token_logprobs, links, graph_lengths = _single_sentence_tensors(model, sp, src)
        target = torch.tensor([encode_target(sp, tgt)])  # (1, T)
        expected = dag_log_likelihood(
            token_logprobs.double(),
            links.double(),
            target,
            graph_lengths,
            torch.tensor([target.shape[1]]),
        )
        assert log_prob == pytest.approx(float(expected[0]), abs=1e-4)
        assert per_token == pytest.approx(-float(expected[0]) / target.shape[1], abs=1e-4)
    # The same pairs as TSV on stdin.
    tsv = "".join(f"{s}\t{t}\n" for s, t in zip(sources, targets, strict=True)).encode()
    code, out2, _ = run_cli(["score", "--model", str(models["dat"])], capsys, monkeypatch, tsv)
    assert code == 0 and out2 == out


@pytest.mark.parametrize("kind", ["dat", "at"])
def test_score_cli_prints_what_translator_score_gives(kind, models, capsys, monkeypatch):
    """``fadat score`` is the command line of :meth:`Translator.score`: the same numbers."""
    sources = random_sentences(5, seed=17)
    targets = random_sentences(5, seed=18, low=0, high=6)
    tsv = "".join(f"{s}\t{t}\n" for s, t in zip(sources, targets, strict=True)).encode()
    code, out, err = run_cli(["score", "--model", str(models[kind])], capsys, monkeypatch, tsv)
    assert code == 0, err
    scores = Translator.from_pretrained(models[kind]).score(sources, targets)
    assert out == "".join(f"{s.log_prob:.6f}\t{s.nll_per_token:.6f}\n" for s in scores)


def test_score_dag_target_longer_than_graph_is_minus_inf(models):
    model, sp = load_model(models["dat"])
    # Source "ab </s>": L = 4·2 = 8 vertices; a 12-word target needs 14.
    messages: list[str] = []
    scores = score_pairs(model, sp, ["ab"], [" ".join(["ab", "cd"] * 6)], warn=messages.append)
    assert scores[0].log_prob == float("-inf") and len(messages) == 1 and "line 1" in messages[0]


def test_score_at_equals_chain_rule(models):
    translator = Translator.from_pretrained(models["at"])
    model, sp = translator.model, translator.sp
    sources = random_sentences(4, seed=15)
    targets = random_sentences(4, seed=16, low=0, high=5)
    got = translator.score(sources, targets)
    for s, src, tgt in zip(got, sources, targets, strict=True):
        source = torch.tensor([encode_source(sp, src)])
        ids = encode_target(sp, tgt)  # <s> y </s>
        total = 0.0
        with torch.no_grad():
            for t in range(1, len(ids)):  # one prefix at a time: P(y_t | y_<t, x)
                lp = model(source, torch.tensor([ids[:t]]))[0, -1]  # (V,)
                total += float(lp[ids[t]])
        assert s.log_prob == pytest.approx(total, abs=1e-4)
        assert s.tokens == len(ids) - 1


# ----------------------------------------------------------------------------------------------
# Acceptance: a copy-task model reproduces held-out inputs exactly


@pytest.mark.slow
def test_copy_model_reproduces_heldout_inputs(copy_model, capsys, monkeypatch, tmp_path):
    inputs = read_lines(str(copy_model["test_src"]))
    out_path = tmp_path / "out.txt"
    code, _, err = run_cli(
        [
            "translate",
            "--model",
            str(copy_model["model"]),
            "--input",
            str(copy_model["test_src"]),
            "--output",
            str(out_path),
        ],
        capsys,
        monkeypatch,
    )
    assert code == 0, err
    assert read_lines(str(out_path)) == inputs
    translator = fadat.Translator.from_pretrained(copy_model["model"])
    for strategy in ("greedy", "lookahead", "joint-viterbi"):
        assert translator.translate(inputs, strategy=strategy) == inputs
    meta = json.loads((copy_model["model"] / "config.json").read_text(encoding="utf-8"))
    assert meta["model_type"] == "dat"


def test_decode_upsample_ratio_changes_the_graph(models, capsys, monkeypatch):
    """--upsample-ratio / Translator.from_pretrained(upsample_ratio=) set the decoding λ (the
    reference's --decode-upsample-scale) as an argument: the graph size and the scores follow
    it, the loaded model's config does not change; AT models refuse it; λ <= 0 is bad input."""
    from fadat.data.contract import PAD_ID
    from fadat.data.spm import encode_source

    default = Translator.from_pretrained(models["dat"])
    wide = Translator.from_pretrained(models["dat"], upsample_ratio=6.0)
    assert wide.upsample_ratio == 6.0 and default.upsample_ratio is None
    assert wide.model.config == default.model.config
    assert wide.model.config.decoding_upsample_ratio != 6.0
    source = torch.tensor([list(encode_source(wide.sp, "ab cd ef"))])
    assert wide.model.batch_cost(source.shape[1], 6.0) == int(6.0 * source.shape[1])
    _, _, graph_lengths = wide.model.graph_outputs(source, 6.0)
    assert int(graph_lengths[0]) == int(6.0 * int(source.ne(PAD_ID).sum()))
    scores = [t.translate_nbest(["ab cd"], 1)[0][0].score for t in (default, wide)]
    assert scores[0] != scores[1]
    config = wide.model.config
    assert wide.model.config is config  # the calls above left it alone
    lines = ["ab cd", "ef ab cd", "cd"]
    code, out, err = run_cli(
        ["translate", "--model", str(models["dat"]), "--upsample-ratio", "6", "--print-scores"],
        capsys,
        monkeypatch,
        "".join(line + "\n" for line in lines).encode(),
    )
    assert code == 0, err
    # the verb decodes at λ = 6 too: the scores of Translator(upsample_ratio=6), not the default
    want = [f"{h[0].score:.4f}\t{h[0].text}" for h in wide.translate_nbest(lines, 1)]
    assert out.splitlines() == want
    assert [f"{h[0].score:.4f}\t{h[0].text}" for h in default.translate_nbest(lines, 1)] != want
    with pytest.raises(DecodingOptionError, match="AT model does not use one"):  # not ignored
        Translator.from_pretrained(models["at"], upsample_ratio=6.0)
    code, _, err = run_cli(
        ["translate", "--model", str(models["dat"]), "--upsample-ratio", "0"],
        capsys,
        monkeypatch,
        b"ab\n",
    )
    _assert_one_error_line(code, err, "--upsample-ratio")
