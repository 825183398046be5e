"""fadat's ARPA reader and its compiled n-gram scores (fadat.engine.ngram, _ngram_jit): the
scores against the back-off formula in float64 on random models of orders 1–5, and against
KenLM on the same files to the last bit; the compiled beam search with it against the reference
search and against the KenLM path; every refusal of a broken file naming its line."""

from __future__ import annotations

import gzip
import importlib.util
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from test_beam_compiled import assert_same, batch, random_options, reference, tricky_graph
from test_decoding_search import ARPA

from fadat.decoding import beam_search
from fadat.engine import beam_np
from fadat.engine.beam_np import LanguageModelError, _LanguageModel, _NgramLanguageModel
from fadat.engine.ngram import KENLM_BINARY_MAGIC, UNKNOWN_MISSING_LOGPROB, ArpaError, NgramModel


def _number(rng: np.random.Generator, low: float, high: float) -> str:
    """A log10 value as an ARPA file writes it (7 significant digits)."""
    return f"{rng.uniform(low, high):.7g}"


def random_arpa(rng: np.random.Generator, order: int, vocabulary: int, unk: bool = True) -> dict:
    """A random back-off model as ``{n-gram tuple: (prob, backoff or None)}`` with the shape of
    lmplz's: ``<s>`` only first, ``</s>`` only last, ``<unk>`` only as a 1-gram, and every
    n-gram's prefix and suffix (``n − 1`` words) in the model; the highest order without
    back-off weights. Values are decimal strings."""
    words = [f"w{i}" for i in range(vocabulary)]
    grams: dict[tuple[str, ...], tuple[str, str | None]] = {}
    for w in [*(["<unk>"] if unk else []), "<s>", "</s>", *words]:
        prob = "-99" if w == "<s>" else _number(rng, -4, -0.5)
        grams[(w,)] = (prob, None if order == 1 else _number(rng, -1.5, 0))
    for n in range(2, order + 1):
        lower = [g for g in grams if len(g) == n - 1]
        for prefix in lower:
            if prefix[-1] in ("</s>", "<unk>"):
                continue
            for w in rng.choice(["</s>", *words], size=int(rng.integers(1, 5)), replace=False):
                gram = (*prefix, str(w))
                if gram[1:] in grams and gram not in grams:
                    backoff = None if n == order else _number(rng, -1.5, 0)
                    if backoff is not None and rng.random() < 0.2:
                        backoff = "0"
                    grams[gram] = (_number(rng, -3, -0.01), backoff)
    if max(len(g) for g in grams) < order:  # no n-gram of the top order: draw again
        return random_arpa(rng, order, vocabulary, unk)
    return grams


def write_arpa(path: Path, grams: dict, *, backoff_zero_written: bool = True) -> Path:
    order = max(len(g) for g in grams)
    lines = ["\\data\\"]
    lines += [f"ngram {n}={sum(len(g) == n for g in grams)}" for n in range(1, order + 1)]
    for n in range(1, order + 1):
        lines += ["", f"\\{n}-grams:"]
        for gram, (prob, backoff) in grams.items():
            if len(gram) == n:
                tail = "" if backoff is None else f"\t{backoff}"
                if backoff == "0" and not backoff_zero_written:
                    tail = ""
                lines.append(f"{prob}\t{' '.join(gram)}{tail}")
    lines += ["", "\\end\\", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def backoff_score(grams: dict, context: tuple[str, ...], w: str) -> float:
    """log10 P(w | context) by the back-off formula, in float64."""
    order = max(len(g) for g in grams)
    w = w if (w,) in grams else "<unk>"
    context = context[max(0, len(context) - (order - 1)) :] if order > 1 else ()
    total = 0.0
    while True:
        if (*context, w) in grams:
            return total + float(grams[(*context, w)][0])
        entry = grams.get(context)
        if entry is not None and entry[1] is not None:
            total += float(entry[1])
        context = context[1:]


def random_sentences(rng: np.random.Generator, grams: dict, count: int) -> list[list[str]]:
    words = sorted({g[0] for g in grams if len(g) == 1} - {"<s>", "</s>", "<unk>"})
    out = []
    for _ in range(count):
        # walk the model's n-grams often, so that long matches happen; sometimes unknown words
        sentence = []
        for _ in range(int(rng.integers(0, 12))):
            r = rng.random()
            if r < 0.1:
                sentence.append("unknown")
            elif r < 0.15:
                sentence.append("<unk>")
            else:
                follow = [
                    g[-1] for g in grams if len(g) >= 2 and g[-2] == (sentence or ["<s>"])[-1]
                ]
                pool = [w for w in follow if w != "</s>"] or words
                sentence.append(str(rng.choice(pool)))
        out.append(sentence)
    return out


@pytest.mark.parametrize(("order", "seed"), [(1, 0), (2, 1), (3, 2), (4, 3), (5, 4), (3, 5)])
def test_scores_equal_the_backoff_formula(tmp_path, order, seed):
    rng = np.random.default_rng(seed)
    grams = random_arpa(rng, order, 6)
    model = NgramModel(write_arpa(tmp_path / "lm.arpa", grams))
    assert model.order == order
    assert model.counts == tuple(sum(len(g) == n for g in grams) for n in range(1, order + 1))
    for sentence in random_sentences(rng, grams, 60):
        context, history = model.begin(), ("<s>",)
        for w in [*sentence, "</s>"]:
            got, context = model.base_score(context, w)
            want = backoff_score(grams, history, w)
            assert got == pytest.approx(want, abs=2e-5)
            assert np.float32(got) == got  # a float32 sum, as KenLM's
            history = (*history, w if (w,) in grams else "<unk>")


@pytest.mark.parametrize(("order", "seed"), [(2, 10), (3, 11), (4, 12), (5, 13), (5, 14)])
def test_scores_equal_kenlm(tmp_path, order, seed):
    """To the last bit: the same float32 values summed in the same order (one machine)."""
    kenlm = pytest.importorskip("kenlm")
    rng = np.random.default_rng(seed)
    grams = random_arpa(rng, order, 8, unk=seed % 2 == 0)  # without <unk>: both give it −100
    path = write_arpa(tmp_path / "lm.arpa", grams, backoff_zero_written=seed % 2 == 1)
    model = NgramModel(path)
    config = kenlm.Config()
    config.arpa_complain = kenlm.ARPALoadComplain.NONE
    reference_lm = kenlm.Model(str(path), config)
    assert model.order == reference_lm.order
    if seed % 2 == 1:
        assert model.prob[model.unk] == np.float32(UNKNOWN_MISSING_LOGPROB)
    for word in ["w0", "w7", "<s>", "</s>", "<unk>", "unknown"]:
        assert (word in model) == (word in reference_lm)
    for sentence in random_sentences(rng, grams, 80):
        state = kenlm.State()
        reference_lm.BeginSentenceWrite(state)
        context = model.begin()
        for w in [*sentence, "</s>"]:
            out = kenlm.State()
            want = reference_lm.BaseScore(state, w, out)
            got, context = model.base_score(context, w)
            assert got == want
            state = out
        text = " ".join(sentence)
        for bos, eos in itertools.product([False, True], repeat=2):
            assert model.score(text, bos, eos) == pytest.approx(
                reference_lm.score(text, bos=bos, eos=eos), abs=1e-4
            )


def test_gzip_and_crlf_files_read_alike(tmp_path):
    rng = np.random.default_rng(3)
    grams = random_arpa(rng, 3, 5)
    plain = NgramModel(write_arpa(tmp_path / "lm.arpa", grams))
    text = (tmp_path / "lm.arpa").read_text(encoding="utf-8")
    (tmp_path / "lm.arpa.gz").write_bytes(gzip.compress(text.encode()))
    crlf = tmp_path / "crlf.arpa"
    crlf.write_bytes(text.replace("\n", "\r\n").encode())
    for other in (NgramModel(tmp_path / "lm.arpa.gz"), NgramModel(crlf)):
        assert other.vocabulary == plain.vocabulary
        np.testing.assert_array_equal(other.prob, plain.prob)
        np.testing.assert_array_equal(other.backoff, plain.backoff)
        np.testing.assert_array_equal(other.keys, plain.keys)


def test_large_sections_are_read_in_chunks(tmp_path, monkeypatch):
    """A chunk smaller than every section: the same model as when read at once."""
    import fadat.engine.ngram as ngram

    grams = random_arpa(np.random.default_rng(8), 4, 7)
    path = write_arpa(tmp_path / "lm.arpa", grams)
    whole = NgramModel(path)
    monkeypatch.setattr(ngram, "_CHUNK", 3)
    chunked = NgramModel(path)
    np.testing.assert_array_equal(chunked.prob, whole.prob)
    np.testing.assert_array_equal(chunked.backoff, whole.backoff)
    np.testing.assert_array_equal(chunked.keys, whole.keys)
    used = whole.keys >= 0
    np.testing.assert_array_equal(chunked.rows[used], whole.rows[used])


GOOD = ARPA.splitlines()  # tests/test_decoding_search.py's: 6 1-grams, 5 2-grams


def _edited(tmp_path: Path, edit) -> Path:
    lines = list(GOOD)
    edit(lines)
    path = tmp_path / "bad.arpa"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _line_of(text: str) -> int:
    return GOOD.index(text) + 1


W0 = "-0.50\tw0\t-0.20"  # lines of GOOD
W3 = "-0.60\tw3\t-0.25"
B1 = "-0.20\tw3 w0"
B5 = "-0.25\tw0 w3"


def _set(text: str, new: str):
    return lambda lines: lines.__setitem__(_line_of(text) - 1, new)


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (
            lambda ls: ls.__setitem__(0, "hello"),
            ':1: not an ARPA file: expected \\data\\, found "hello"',
        ),
        (lambda ls: ls.__setitem__(2, "ngram 3=5"), ":3: expected the count of 2-grams"),
        (lambda ls: ls.__setitem__(2, "ngrams"), ':3: expected "ngram N=COUNT", found "ngrams"'),
        (
            lambda ls: ls.__setitem__(1, "ngram 1=7"),
            f":{_line_of(W3) + 1}: 6 1-grams, the header says 7",
        ),
        (
            lambda ls: ls.__setitem__(1, "ngram 1=5"),
            f":{_line_of(W3)}: more 1-grams than the header's 5",
        ),
        (
            lambda ls: ls.__setitem__(4, "\\2-grams:"),
            ':5: expected "\\1-grams:", found "\\2-grams:"',
        ),
        (_set(B1, "x\tw3 w0"), f':{_line_of(B1)}: probability "x" is not a number'),
        (_set(W0, "-0.50\tw0\tb"), f':{_line_of(W0)}: back-off weight "b" is not a number'),
        (_set(B1, "-0.20\tw3 w0 w2 w2"), f":{_line_of(B1)}: expected a probability, 2 word(s)"),
        (_set(B1, "-0.20\tw3 w9"), f':{_line_of(B1)}: "w9" is not among the 1-grams'),
        (_set(W0, "-0.50\tw2\t-0.20"), f':{_line_of(W0) + 1}: the 1-gram "w2" appears twice'),
        (_set(B5, "-0.25\tw3 w0"), f':{_line_of(B5)}: the 2-gram "w3 w0" appears twice'),
        (_set("0\t<s>\t-0.30", "0\t<S>\t-0.30"), "no 1-gram <s>"),
        (
            lambda ls: ls.__setitem__(len(ls) - 1, "\\3-grams:"),
            'expected \\end\\, found "\\3-grams:"',
        ),
        (lambda ls: ls.__delitem__(len(ls) - 1), "the file ends without \\end\\"),
        (
            lambda ls: ls.__delitem__(slice(_line_of(B5) - 1, None)),
            "the file ends inside its 2-grams (4 of 5)",
        ),
    ],
)
def test_broken_files_are_refused_naming_the_line(tmp_path, edit, needle):
    path = _edited(tmp_path, edit)
    with pytest.raises(ArpaError) as raised:
        NgramModel(path)
    message = str(raised.value)
    assert message.startswith(str(path))
    assert needle in message


def test_an_ngram_without_its_prefix_is_refused(tmp_path):
    grams = {("<unk>",): ("-1", "0"), ("<s>",): ("-99", "-0.5"), ("</s>",): ("-1", "0")}
    grams |= {("a",): ("-1", "-0.2"), ("b",): ("-1", "-0.2"), ("a", "b"): ("-0.5", "-0.1")}
    grams |= {("b", "a", "b"): ("-0.3", None)}  # "b a" is missing
    path = write_arpa(tmp_path / "lm.arpa", grams)
    with pytest.raises(
        ArpaError, match=r':17: the 3-gram "b a b" has no 2-gram of its first 2 words \("b a"\)'
    ):
        NgramModel(path)


def test_empty_and_non_utf8_files(tmp_path):
    (tmp_path / "empty.arpa").write_text("\n\n")
    with pytest.raises(ArpaError, match="not an ARPA file: it is empty"):
        NgramModel(tmp_path / "empty.arpa")
    (tmp_path / "latin1.arpa").write_bytes(ARPA.replace("w0", "w\xe9").encode("latin-1"))
    with pytest.raises(ArpaError, match="latin1.arpa: not UTF-8 text"):
        NgramModel(tmp_path / "latin1.arpa")


def test_open_model_reads_arpa_without_kenlm(tmp_path, monkeypatch):
    """An ARPA file needs no kenlm; a KenLM binary does, and says so naming the file."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "kenlm" else find_spec(name, *a),
    )
    (tmp_path / "lm.arpa").write_text(ARPA)
    model = beam_np.open_model(tmp_path / "lm.arpa")
    assert isinstance(model, NgramModel)
    assert model.order == 2
    binary = tmp_path / "lm.bin"
    binary.write_bytes(KENLM_BINARY_MAGIC + b"http://kheafield.com/code format version 5\n\0")
    with pytest.raises(LanguageModelError, match="lm.bin: a KenLM binary language model") as raised:
        beam_np.open_model(binary, "--lm")
    assert 'needs the kenlm package, not installed: pip install -e ".[lm]"' in str(raised.value)
    assert "(--lm)" in str(raised.value)


def test_open_model_message_of_a_text_that_is_no_lm(tmp_path):
    (tmp_path / "text.arpa").write_text("ab cd ef\n")
    with pytest.raises(LanguageModelError) as raised:
        beam_np.open_model(tmp_path / "text.arpa", "--lm")
    assert str(raised.value) == (
        f'{tmp_path / "text.arpa"}:1: not an ARPA file: expected \\data\\, found "ab cd ef" '
        "(--lm takes an ARPA file or a KenLM binary)"
    )


def test_token_word_ids_are_computed_once_per_word_list(tmp_path):
    (tmp_path / "lm.arpa").write_text(ARPA)
    model = NgramModel(tmp_path / "lm.arpa")
    words = ("w0", "w1", "w2", "<unk>", "</s>")
    ids = model.token_word_ids(words)
    assert ids.tolist() == [
        model.vocabulary["w0"],
        model.unk,
        model.vocabulary["w2"],
        model.unk,
        model.eos,
    ]
    assert model.token_word_ids(words) is ids
    assert model.token_word_ids(list(words)) is not ids


def _graphs(rng, count, V):
    return [tricky_graph(rng, int(rng.integers(2, 13)), V) for _ in range(count)]


@pytest.mark.parametrize("seed", range(3))
def test_compiled_search_with_ngram_equals_reference(tmp_path, seed):
    """The whole search compiled (LM lookups inside) against the plain search scoring with the
    same model from Python, on models of orders 2–4."""
    rng = np.random.default_rng(200 + seed)
    grams = random_arpa(rng, 2 + seed, 4)
    model = NgramModel(write_arpa(tmp_path / "lm.arpa", grams))
    words = ["w0", "w1", "<unk>", "w3", "zz", "w2"]
    lm = _NgramLanguageModel(model, words)
    for _ in range(30):
        V = int(rng.integers(2, 7))
        graphs = _graphs(rng, 3, V)
        options = random_options(rng, max(lp.shape[0] for lp, _ in graphs), V)
        gamma = float(rng.choice([0.1, 1.0, 3.0]))
        hyps = beam_search(*batch(graphs), **options, lm=model, lm_words=words, gamma=gamma)
        for (lp, ln), h in zip(graphs, hyps, strict=True):
            assert_same(h, reference(lp, ln, options, lm, gamma))


@pytest.mark.parametrize("seed", range(3))
def test_compiled_search_with_ngram_equals_the_kenlm_path(tmp_path, seed):
    """The same file through KenLM (Python calls between compiled steps): identical
    hypotheses, scores to the last bit."""
    kenlm = pytest.importorskip("kenlm")
    rng = np.random.default_rng(300 + seed)
    path = write_arpa(tmp_path / "lm.arpa", random_arpa(rng, 3 + seed, 5))
    ours, theirs = NgramModel(path), kenlm.Model(str(path))
    words = ["w0", "w1", "w2", "<unk>", "w4", "nope"]
    for _ in range(30):
        V = int(rng.integers(2, 7))
        graphs = _graphs(rng, 3, V)
        options = random_options(rng, max(lp.shape[0] for lp, _ in graphs), V)
        kw = {"lm_words": words, "gamma": float(rng.choice([0.1, 1.0, 3.0]))}
        assert beam_search(*batch(graphs), **options, lm=ours, **kw) == beam_search(
            *batch(graphs), **options, lm=theirs, **kw
        )
        lm = _LanguageModel(theirs, words)
        (lp, ln) = graphs[0]
        assert_same(
            beam_search(*batch([graphs[0]]), **options, lm=ours, **kw)[0],
            reference(lp, ln, options, lm, kw["gamma"]),
        )


def test_compiled_ngram_search_grows_its_arena(monkeypatch, tmp_path):
    """From a tiny first capacity the arena and the nodes' contexts grow inside the compiled
    loop."""
    monkeypatch.setattr(beam_np, "_arena_capacity", lambda L: 4)
    rng = np.random.default_rng(7)
    lp, ln = tricky_graph(rng, 30, 6)
    options = {"beam_size": 200, "max_beam_per_length": 50, "top_cand_n": 4, "top_p": 1.0}
    options |= {"max_successors": None, "alpha": 1.1}
    model = NgramModel(write_arpa(tmp_path / "lm.arpa", random_arpa(rng, 4, 6)))
    words = ["w0", "w1", "w2", "w3", "w4", "w5"]
    (h,) = beam_search(*batch([(lp, ln)]), **options, lm=model, lm_words=words, gamma=1.0)
    assert_same(h, reference(lp, ln, options, _NgramLanguageModel(model, words), 1.0))
    assert len(h.tokens) > 5


def test_unigram_model_in_the_search(tmp_path):
    """Order 1: contexts of no columns; every word scored by its 1-gram."""
    rng = np.random.default_rng(5)
    model = NgramModel(write_arpa(tmp_path / "lm.arpa", random_arpa(rng, 1, 4)))
    assert model.begin().shape == (0,)
    assert model.base_score(model.begin(), "w1")[0] == float(
        np.float32(model.prob[model.vocabulary["w1"]])
    )
    words = ["w0", "w1", "w2", "w3"]
    for _ in range(10):
        graphs = _graphs(rng, 2, 4)
        options = random_options(rng, max(lp.shape[0] for lp, _ in graphs), 4)
        hyps = beam_search(*batch(graphs), **options, lm=model, lm_words=words, gamma=1.0)
        for (lp, ln), h in zip(graphs, hyps, strict=True):
            assert_same(h, reference(lp, ln, options, _NgramLanguageModel(model, words), 1.0))
    assert math.isfinite(model.score("w0 w1"))


def test_a_damaged_gzip_file_is_refused_naming_it(tmp_path):
    whole = gzip.compress(ARPA.encode())
    (tmp_path / "cut.arpa.gz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "bad.arpa.gz").write_bytes(whole[:10] + b"\0" * 40)
    for name in ("cut.arpa.gz", "bad.arpa.gz"):
        with pytest.raises(LanguageModelError, match="a damaged gzip file") as raised:
            beam_np.open_model(tmp_path / name, "--lm")
        assert str(raised.value).startswith(f"{tmp_path / name}: a damaged gzip file (")
        assert str(raised.value).endswith("(--lm takes an ARPA file or a KenLM binary)")
