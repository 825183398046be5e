"""``synth-multimodal``: a synthetic translation corpus whose valid translations are known exactly.

A corpus in the spirit of the synthetic multi-modality studies of non-autoregressive MT
(Gu et al., 2018; Zhou et al., 2020): a toy language pair where the *set* of correct
translations of every source sentence is known, so that a model's output can be checked for
membership, and an invalid output can be recognised as a *mixture* of valid ones.

Generation (all randomness from ``seed``; :class:`SynthConfig` holds the defaults):

- **Source words**: ``source_types`` pseudo-words (two or three syllables over ``b d g k p t``).
  A fraction ``phrase_final_fraction`` of them is *phrase-final*; the rest is *phrase-internal*.
  Within each class, word ``r`` (rank from 1) has frequency ∝ ``1 / r**zipf``.
- **Source sentences**: a length drawn uniformly from ``[min_words, max_words]`` words, filled
  left to right with phrases of 1–3 words (uniform, shortened at the end): ``k − 1``
  phrase-internal words and one phrase-final word. A sentence in which a word could stand next
  to itself in some phrase order is drawn again (:func:`adjacent_repeat`): no valid translation
  repeats a token, which DA-Transformer decoders could not output (they drop repeats). Phrase
  boundaries are a function of the source words alone (a phrase ends after its phrase-final
  word), which makes the valid set a function of the source sentence.
- **Lexicon** (fixed by the seed): every source word has one translation; a fraction
  ``synonym_prob`` (Q) of the source word types, chosen at random, has two equally valid
  synonyms (lexical multi-modality); a fraction ``fertility2_fraction`` translates to two target
  tokens (fertility 2, for both synonyms). Target tokens are pseudo-words over other consonants
  (``l m n r s v z``), each used by one lexicon entry only.
- **Target order**: the phrases' translations in source order, except that the adjacent phrase
  pairs are visited left to right and each is swapped with probability ``swap_prob`` (P),
  unless its first phrase already moved in the previous swap (swaps do not overlap).
- **Valid set** of a source sentence: every combination of a non-overlapping set of adjacent
  phrase swaps (all of them when P > 0, only "no swap" when P = 0) with a synonym choice for
  every word; :meth:`ValidSet.count` such combinations (``F(K + 1) · 2^s`` for K phrases and s
  words with synonyms, F the Fibonacci numbers, when P > 0).
- **Training pairs** sample their target from the generating process (swaps with probability P,
  each synonym with probability 1/2). Sampling *uniformly over the valid set* would make P
  meaningless (any valid set with swaps is the same set); the synonym choice is uniform.
- **valid / test** keep one sampled target as the single reference (``raw/{split}.ref.txt``) and
  the valid set's structure (``raw/{split}.validset.jsonl``, one JSON object per sentence:
  ``phrases`` as lists of words, each word a list of options, each option a list of target
  tokens; ``swaps``; ``count``; ``references``, all distinct valid translations when there are at
  most ``max_listed`` combinations, else ``max_listed`` combinations drawn uniformly, duplicates
  removed; ``complete``). Membership is decided exactly from the structure
  (:meth:`ValidSet.contains`), never from the listed references.

P = Q = 0 gives a deterministic corpus (every valid set has one element): the control in which
NLL training should lose nothing.

The corpus record of ``fadat prepare synth-multimodal`` is :data:`SYNTH_MULTIMODAL`
(:func:`synth_corpus`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from itertools import product
from pathlib import Path

import numpy as np

from fadat.data.corpora import Corpus, CorpusOption, CorpusSpec, SplitText
from fadat.errors import InputError
from fadat.options import MAX_SEED

NAME = "synth-multimodal"
VALIDSET_SUFFIX = "validset.jsonl"
SOURCE_CONSONANTS = "bdgkpt"
TARGET_CONSONANTS = "lmnrsvz"
VOWELS = "aeiou"

# A word is a tuple of options; an option is a tuple of target tokens (fertility 1 or 2).
Option = tuple[str, ...]
Word = tuple[Option, ...]
Phrase = tuple[Word, ...]


@dataclass(frozen=True)
class SynthConfig:
    """Options of the generator (defaults are the ``fadat prepare synth-multimodal`` defaults).

    Attributes:
        seed: everything random follows from it (lexicon, sentences, targets).
        swap_prob: P, probability that an adjacent phrase pair is swapped, in [0, 1].
        synonym_prob: Q, fraction of source word types with two synonyms, in [0, 1].
        train_size / valid_size / test_size: sentence pairs per split.
        source_types: source vocabulary size (words).
        phrase_final_fraction: fraction of source word types that end a phrase.
        fertility2_fraction: fraction of source word types that translate to two tokens.
        zipf: exponent of the rank-frequency law within each word class.
        min_words / max_words: source sentence length range in words (inclusive).
        max_listed: valid translations listed per valid/test sentence at most.
    """

    seed: int = 1
    swap_prob: float = 0.25
    synonym_prob: float = 0.25
    train_size: int = 20000
    valid_size: int = 500
    test_size: int = 500
    source_types: int = 300
    phrase_final_fraction: float = 0.5
    fertility2_fraction: float = 0.2
    zipf: float = 1.0
    min_words: int = 5
    max_words: int = 25
    max_listed: int = 64

    def check(self) -> None:
        """Raises InputError naming the option for out-of-range values."""
        if not 0 <= self.seed <= MAX_SEED:  # numpy's generators take no negative seed
            raise InputError(f"--seed must be >= 0 and at most {MAX_SEED}, got {self.seed}")
        for name in ("swap_prob", "synonym_prob", "phrase_final_fraction", "fertility2_fraction"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise InputError(f"--{name.replace('_', '-')} must be in [0, 1], got {value}")
        if self.train_size < 1:
            raise InputError(f"--train-size must be >= 1, got {self.train_size}")
        if self.valid_size < 1 or self.test_size < 1:
            raise InputError("--valid-size and --test-size must be >= 1")
        if not 1 <= self.min_words <= self.max_words:
            raise InputError(
                f"--min-words {self.min_words} and --max-words {self.max_words}: empty range"
            )
        if self.source_types < 4:
            raise InputError(f"--source-types must be >= 4, got {self.source_types}")


# ----------------------------------------------------------------------------- valid sets


def fibonacci(n: int) -> int:
    """F(n) with F(1) = F(2) = 1 (F(0) = 0)."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def swap_orders(k: int, swaps: bool) -> list[tuple[int, ...]]:
    """Every phrase order of ``k`` phrases under non-overlapping adjacent swaps (brute force).

    Returns ``F(k + 1)`` orders when ``swaps`` (1 when not, or k ≤ 1), each a permutation of
    ``range(k)``, the unswapped order first.
    """
    if not swaps or k <= 1:
        return [tuple(range(k))]
    out: list[tuple[int, ...]] = []

    def extend(i: int, order: tuple[int, ...]) -> None:
        if i >= k:
            out.append(order)
            return
        extend(i + 1, order + (i,))
        if i + 1 < k:
            extend(i + 2, order + (i + 1, i))

    extend(0, ())
    return out


@dataclass(frozen=True)
class ValidSet:
    """The valid translations of one source sentence, as a structure.

    Attributes:
        phrases: the source phrases in source order, each a tuple of words, each word a tuple of
            its options (synonyms), each option a tuple of target tokens.
        swaps: whether adjacent phrases may swap (P > 0).
    """

    phrases: tuple[Phrase, ...]
    swaps: bool

    def count(self) -> int:
        """Number of (swap pattern, synonym choice) combinations."""
        orders = fibonacci(len(self.phrases) + 1) if self.swaps else 1
        return orders * math.prod(len(w) for p in self.phrases for w in p)

    def length(self) -> int:
        """Target length in tokens (the same for every valid translation)."""
        return sum(len(w[0]) for p in self.phrases for w in p)

    def _realisations(self, phrase: Phrase) -> Iterator[tuple[str, ...]]:
        for choice in product(*phrase):
            yield tuple(t for option in choice for t in option)

    def enumerate(self) -> Iterator[tuple[str, ...]]:
        """Every combination as a token tuple (duplicates possible when a phrase repeats)."""
        for order in swap_orders(len(self.phrases), self.swaps):
            for parts in product(*(list(self._realisations(self.phrases[i])) for i in order)):
                yield tuple(t for part in parts for t in part)

    def sample(self, swap_prob: float, rng: np.random.Generator) -> tuple[str, ...]:
        """One target of the generating process (swaps with ``swap_prob``, synonyms 1/2 each)."""
        k = len(self.phrases)
        order: list[int] = []
        i = 0
        while i < k:
            if i + 1 < k and swap_prob > 0 and rng.random() < swap_prob:
                order += [i + 1, i]
                i += 2
            else:
                order.append(i)
                i += 1
        out: list[str] = []
        for j in order:
            for word in self.phrases[j]:
                out.extend(word[int(rng.integers(len(word)))] if len(word) > 1 else word[0])
        return tuple(out)

    def sample_uniform(self, rng: np.random.Generator) -> tuple[str, ...]:
        """One combination drawn uniformly (for listing large sets)."""
        k = len(self.phrases)
        order: list[int] = []
        i = 0
        while i < k:
            # Orders of the phrases i.. number F(k − i + 1); a swap at i leaves F(k − i − 1).
            if self.swaps and i + 1 < k:
                p_swap = fibonacci(k - i - 1) / fibonacci(k - i + 1)
                if rng.random() < p_swap:
                    order += [i + 1, i]
                    i += 2
                    continue
            order.append(i)
            i += 1
        out: list[str] = []
        for j in order:
            for word in self.phrases[j]:
                out.extend(word[int(rng.integers(len(word)))])
        return tuple(out)

    def _matches(self, phrase: Phrase, tokens: Sequence[str], start: int) -> bool:
        """Whether some realisation of ``phrase`` equals ``tokens[start : start + len]``."""
        pos = start
        for word in phrase:
            # Options of one word are distinct lexicon entries: at most one can match here,
            # and all options of a word have the same length.
            n = len(word[0])
            if tuple(tokens[pos : pos + n]) not in word:
                return False
            pos += n
        return True

    def contains(self, tokens: Sequence[str]) -> bool:
        """Exact membership of a token sequence (dynamic programming over the phrase blocks)."""
        if len(tokens) != self.length():
            return False
        lengths = [sum(len(w[0]) for w in p) for p in self.phrases]
        k = len(self.phrases)
        # ok[i]: phrases 0..i-1 (as blocks) realise tokens[:offset[i]] for some order.
        offset = [0]
        for n in lengths:
            offset.append(offset[-1] + n)
        ok = [False] * (k + 1)
        ok[0] = True
        for i in range(k):
            if not ok[i]:
                continue
            if self._matches(self.phrases[i], tokens, offset[i]):
                ok[i + 1] = True
            if self.swaps and i + 1 < k:
                first, second = self.phrases[i + 1], self.phrases[i]
                if self._matches(first, tokens, offset[i]) and self._matches(
                    second, tokens, offset[i] + lengths[i + 1]
                ):
                    ok[i + 2] = True
        return ok[k]

    def bigrams(self) -> set[tuple[str, str]]:
        """Every token bigram that occurs in some valid translation."""
        out: set[tuple[str, str]] = set()
        firsts = [{o[0] for o in p[0]} for p in self.phrases]
        lasts = [{o[-1] for o in p[-1]} for p in self.phrases]
        for phrase in self.phrases:
            for word in phrase:
                for option in word:
                    out.update(zip(option, option[1:], strict=False))
            for a, b in zip(phrase, phrase[1:], strict=False):
                out.update((x[-1], y[0]) for x in a for y in b)
        k = len(self.phrases)
        # Phrase x directly followed by phrase y in some order (blocks [i] and [i+1, i]).
        pairs = {(i, i + 1) for i in range(k - 1)}
        if self.swaps:
            pairs |= {(i + 1, i) for i in range(k - 1)}
            pairs |= {(i, i + 2) for i in range(k - 2)}
            pairs |= {(i, i + 3) for i in range(k - 3)}
        for x, y in pairs:
            out.update((a, b) for a in lasts[x] for b in firsts[y])
        return out

    def to_json(self) -> dict:
        return {
            "phrases": [[[list(o) for o in w] for w in p] for p in self.phrases],
            "swaps": self.swaps,
        }

    @staticmethod
    def from_json(obj: dict) -> ValidSet:
        return ValidSet(
            tuple(tuple(tuple(tuple(o) for o in w) for w in p) for p in obj["phrases"]),
            bool(obj["swaps"]),
        )


def read_valid_sets(data_dir: str | Path, split: str) -> list[ValidSet] | None:
    """The valid sets of a split (``raw/{split}.validset.jsonl``), or None when there are none.

    Raises:
        InputError: an unreadable file or a line that is not a valid set (file:line).
    """
    path = Path(data_dir) / "raw" / f"{split}.{VALIDSET_SUFFIX}"
    if not path.is_file():
        return None
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            try:
                out.append(ValidSet.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError) as err:
                raise InputError(f"{path}:{i}: not a valid-set line ({err})") from err
    return out


def read_listed_references(data_dir: str | Path, split: str) -> list[list[str]]:
    """The listed valid translations of every sentence of a split (strings, space-joined)."""
    path = Path(data_dir) / "raw" / f"{split}.{VALIDSET_SUFFIX}"
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["references"] for line in f]


# ----------------------------------------------------------------------------- generation


def _pseudo_words(n: int, consonants: str, rng: np.random.Generator) -> list[str]:
    """``n`` distinct pseudo-words of 2 (then 3) consonant-vowel syllables, in random order."""
    syllables = [c + v for c in consonants for v in VOWELS]
    two = [a + b for a in syllables for b in syllables]
    pool = two if n <= len(two) // 2 else two + [a + b for a in syllables for b in two]
    if n > len(pool):
        raise InputError(f"cannot make {n} distinct pseudo-words")
    picked = rng.choice(len(pool), size=n, replace=False)
    return [pool[i] for i in picked]


@dataclass(frozen=True)
class Lexicon:
    """Source words, their class and their translation options."""

    words: tuple[str, ...]
    final: tuple[bool, ...]
    options: tuple[Word, ...]
    internal_ids: tuple[int, ...]
    final_ids: tuple[int, ...]
    internal_probs: tuple[float, ...]
    final_probs: tuple[float, ...]


def _zipf(n: int, exponent: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** exponent
    return w / w.sum()


def make_lexicon(cfg: SynthConfig, rng: np.random.Generator) -> Lexicon:
    """The fixed random lexicon of a seed (see the module docstring)."""
    v = cfg.source_types
    words = _pseudo_words(v, SOURCE_CONSONANTS, rng)
    n_final = min(v - 1, max(1, round(cfg.phrase_final_fraction * v)))
    final = np.zeros(v, dtype=bool)
    final[rng.choice(v, size=n_final, replace=False)] = True
    # Ranks of a fixed random order, so that a larger Q adds synonyms to the words of a smaller
    # Q (and fertility does not depend on Q).
    synonym_rank = rng.permutation(v)
    fertile_rank = rng.permutation(v)
    synonyms = synonym_rank < round(cfg.synonym_prob * v)
    fertile = fertile_rank < round(cfg.fertility2_fraction * v)
    n_tokens = int(sum((1 + synonyms[i]) * (1 + fertile[i]) for i in range(v)))
    targets = iter(_pseudo_words(n_tokens, TARGET_CONSONANTS, rng))
    options = []
    for i in range(v):
        options.append(
            tuple(
                tuple(next(targets) for _ in range(1 + int(fertile[i])))
                for _ in range(1 + int(synonyms[i]))
            )
        )
    internal_ids = tuple(int(i) for i in np.flatnonzero(~final))
    final_ids = tuple(int(i) for i in np.flatnonzero(final))
    return Lexicon(
        words=tuple(words),
        final=tuple(bool(x) for x in final),
        options=tuple(options),
        internal_ids=internal_ids,
        final_ids=final_ids,
        internal_probs=tuple(_zipf(len(internal_ids), cfg.zipf).tolist()),
        final_probs=tuple(_zipf(len(final_ids), cfg.zipf).tolist()),
    )


def sample_sentence(lex: Lexicon, cfg: SynthConfig, rng: np.random.Generator) -> list[list[int]]:
    """One source sentence as phrases of source word ids."""
    remaining = int(rng.integers(cfg.min_words, cfg.max_words + 1))
    phrases = []
    while remaining > 0:
        k = min(int(rng.integers(1, 4)), remaining)
        internal = rng.choice(len(lex.internal_ids), size=k - 1, p=lex.internal_probs)
        last = rng.choice(len(lex.final_ids), p=lex.final_probs)
        phrases.append([lex.internal_ids[j] for j in internal] + [lex.final_ids[last]])
        remaining -= k
    return phrases


def adjacent_repeat(phrases: list[list[int]]) -> bool:
    """Whether the same source word can stand next to itself in some phrase order (swaps
    allowed whatever P is), i.e. whether some valid translation would repeat a target token.

    DA-Transformer decoders drop a token equal to the previous one (as the reference's do), so
    such a translation could never be produced; the generator redraws these sentences.
    """
    ids = ValidSet(tuple(tuple(((str(i),),) for i in p) for p in phrases), swaps=True)
    return any(a == b for a, b in ids.bigrams())


def valid_set(phrases: list[list[int]], lex: Lexicon, cfg: SynthConfig) -> ValidSet:
    return ValidSet(
        tuple(tuple(lex.options[i] for i in p) for p in phrases), swaps=cfg.swap_prob > 0
    )


def listed_references(vs: ValidSet, max_listed: int, rng: np.random.Generator) -> list[str]:
    """All distinct valid translations, or those among ``max_listed`` uniform draws."""
    if vs.count() <= max_listed:
        seen = dict.fromkeys(" ".join(t) for t in vs.enumerate())
    else:
        seen = dict.fromkeys(" ".join(vs.sample_uniform(rng)) for _ in range(max_listed))
    return list(seen)


@dataclass
class GeneratedSplit:
    sources: list[str]
    targets: list[str]
    valid_sets: list[ValidSet]


def generate(cfg: SynthConfig) -> tuple[Lexicon, dict[str, GeneratedSplit]]:
    """The lexicon and the three splits of a config (deterministic in ``cfg``).

    Each part draws from its own random stream (lexicon, train, valid, test, listing), so the
    lexicon and the valid/test sets do not change with ``train_size``.
    """
    cfg.check()
    lex = make_lexicon(cfg, np.random.default_rng([cfg.seed, 0]))
    sizes = {"train": cfg.train_size, "valid": cfg.valid_size, "test": cfg.test_size}
    out = {}
    for k, (split, size) in enumerate(sizes.items(), 1):
        # Sources and targets draw from separate streams: the same seed gives the same source
        # sentences at every (P, Q).
        source_rng = np.random.default_rng([cfg.seed, k, 0])
        target_rng = np.random.default_rng([cfg.seed, k, 1])
        part = GeneratedSplit([], [], [])
        for _ in range(size):
            phrases = sample_sentence(lex, cfg, source_rng)
            while adjacent_repeat(phrases):
                phrases = sample_sentence(lex, cfg, source_rng)
            vs = valid_set(phrases, lex, cfg)
            part.sources.append(" ".join(lex.words[i] for p in phrases for i in p))
            part.targets.append(" ".join(vs.sample(cfg.swap_prob, target_rng)))
            part.valid_sets.append(vs)
        out[split] = part
    return lex, out


def write_valid_sets(
    path: Path, valid_sets: Sequence[ValidSet], max_listed: int, rng: np.random.Generator
) -> None:
    """Write ``raw/{split}.validset.jsonl`` (format: the module docstring)."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for vs in valid_sets:
            refs = listed_references(vs, max_listed, rng)
            obj = {
                **vs.to_json(),
                "count": vs.count(),
                "complete": vs.count() <= max_listed,
                "references": refs,
            }
            f.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")


def corpus_stats(lex: Lexicon, splits: dict[str, GeneratedSplit], cfg: SynthConfig) -> dict:
    """Facts about the generated corpus for meta.json."""
    train = splits["train"]
    words = [w for s in train.sources for w in s.split()]
    index = {w: i for i, w in enumerate(lex.words)}
    ids = [index[w] for w in words]
    stats = {
        "config": asdict(cfg),
        "source_types_used": len(set(ids)),
        "target_types": sum(len(o) for opts in lex.options for o in opts),
        "synonym_token_rate": round(sum(len(lex.options[i]) > 1 for i in ids) / len(ids), 4),
        "fertility2_token_rate": round(sum(len(lex.options[i][0]) > 1 for i in ids) / len(ids), 4),
    }
    for split in ("valid", "test"):
        counts = np.array([vs.count() for vs in splits[split].valid_sets], dtype=np.float64)
        stats[f"{split}_valid_set_size"] = {
            "median": float(np.median(counts)),
            "max": float(counts.max()),
            "singletons": int((counts == 1).sum()),
            "listed_completely": int((counts <= cfg.max_listed).sum()),
        }
    return stats


# ----------------------------------------------------------------------------------------------
# The corpus record (fadat.data.corpora.REGISTRY)


def _write_split_valid_sets(
    out: Path, measured: dict, valid_sets: dict[str, list[ValidSet]], seed: int
) -> None:
    """``raw/{split}.validset.jsonl`` of valid and test in the dataset directory ``out``,
    aligned with ``raw/{split}.*.txt`` (``measured``: :func:`fadat.data.build.build`'s result).

    Raises:
        InputError: pairs of the split were dropped (the sets would no longer align).
    """
    for k, (split, sets) in enumerate(valid_sets.items()):
        if len(sets) != measured["splits"][split]["pairs"]:
            raise InputError(f"{split}: pairs were dropped, the valid sets no longer align")
        rng = np.random.default_rng([seed, 10 + k])
        path = out / "raw" / f"{split}.{VALIDSET_SUFFIX}"
        write_valid_sets(path, sets, SynthConfig.max_listed, rng)


def synth_corpus(cfg: SynthConfig) -> Corpus:
    """The generated corpus of ``cfg`` as a :class:`~fadat.data.corpora.Corpus` with a
    word-level vocabulary (one piece per word of the training text, plus the 4 special pieces)
    and, written after the build, the valid sets of valid and test.

    Raises:
        InputError: an option out of range (:meth:`SynthConfig.check`).
    """
    lex, generated = generate(cfg)
    splits = {}
    for split, part in generated.items():
        splits[split] = SplitText(
            list(part.sources),
            list(part.targets),
            [],
            [f"{split}:{i + 1}" for i in range(len(part.sources))],
        )
    train = generated["train"]
    valid_sets = {s: generated[s].valid_sets for s in ("valid", "test")}
    return Corpus(
        name=NAME,
        source_lang="src",
        target_lang="tgt",
        splits=splits,
        source_files=[],
        licence="generated (no third-party text)",
        attribution="synthetic corpus generated by fadat.data.synth",
        extra={"synth": corpus_stats(lex, generated, cfg)},
        model_type="word",
        vocab_size=len({w for line in train.sources + train.targets for w in line.split()}) + 4,
        write_files=lambda out, measured: _write_split_valid_sets(
            out, measured, valid_sets, cfg.seed
        ),
        timings=False,
    )


def _synth_options() -> tuple[CorpusOption, ...]:
    """The options of :class:`SynthConfig` that ``fadat prepare synth-multimodal`` takes."""
    d = SynthConfig
    helps = {
        "seed": f"random seed ({d.seed})",
        "swap_prob": f"P: adjacent phrase pairs swapped with this probability ({d.swap_prob})",
        "synonym_prob": f"Q: fraction of source word types with two synonyms ({d.synonym_prob})",
        "source_types": f"source vocabulary in words ({d.source_types})",
        "min_words": f"shortest source ({d.min_words})",
        "max_words": f"longest source ({d.max_words})",
        "train_size": f"train pairs ({d.train_size})",
        "valid_size": f"valid pairs ({d.valid_size})",
        "test_size": f"test pairs ({d.test_size})",
    }
    types = {f.name: f.type for f in fields(SynthConfig)}
    return tuple(
        CorpusOption(name, float if types[name] == "float" else int, getattr(d, name), text)
        for name, text in helps.items()
    )


SYNTH_MULTIMODAL = CorpusSpec(
    name=NAME,
    help="a generated corpus whose valid translations are all known (phrase swaps, synonyms)",
    make=lambda **options: synth_corpus(SynthConfig(**options)),
    options=_synth_options(),
    inputs=lambda **options: [],  # generated: the options (in the fingerprint) are the input
    check=lambda **options: SynthConfig(**options).check(),
    excludes=("vocab_size", "model_type", "spm_model"),
    excludes_reason="a word-level vocabulary of its own",
    group=f"{NAME} (fadat.data.synth)",
)
