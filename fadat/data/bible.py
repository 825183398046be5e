"""The built-in ``bible-en-es`` corpus: verse pairs from Debian's SWORD modules.

Sources (Debian packages, all public domain):

- ``sword-text-web`` → module ``engWEB2015eb``: English, derived from the World English Bible (WEB).
  "World English Bible" is a trademark of eBible.org and our cleaned copy is a *changed* text, so
  the name is used only in attribution.
- ``sword-text-sparv`` → ``spaRV1909eb``: Spanish, Reina-Valera 1909.
- ``sword-text-kjv`` → ``engKJV2006eb``: King James Version, the second English reference (es→en).

The modules are read with pysword (raw OSIS, ``clean=False``) and the markup is stripped here,
because pysword's own cleaning glues words together where a footnote sat ("Godcreated"). Every
pitfall of /work/shared/reference/corpora.md §1 is handled in :func:`clean_osis` and
:func:`build_bible`:

- notes (footnotes, cross references) are removed with their content, leaving a word break;
  Song of Songs speaker labels and non-canonical titles (KJV epistle subscriptions, Ps 119's
  Hebrew-letter headings in the KJV) are removed; canonical psalm titles are kept (RV1909 has them
  inline in verse 1); everything after a chapter's end (the WEB glossary after Rev 22:21) and the
  WEB's Rom 16:25-27 appended to Rom 14:23 are cut; KJV pilcrows and stray USFM codes are removed;
- RV1909's epistle subscriptions ("Amén. Fué escrita de Corinto…") are cut after the final "Amén.";
- RV1909's capitalised chapter openings ("EN el principio") are recased with casing counts from
  the rest of the RV1909 text;
- RV1909 glues some words at ``<w>``/``<transChange>`` boundaries ("conformeal testimonio");
  a space is inserted unless the added word is an enclitic pronoun ("sáca" + "lo" → "sácalo");
- verses are aligned on the KJV versification (the WEB module leaves the two NRSVA-only verses
  empty); verses that RV1909 numbers differently are detected by comparing its Strong's numbers
  with the KJV's in the same verse and its neighbours, and dropped, like empty verses.

The split is by whole book (no adjacent-verse leakage), see :data:`TEST_BOOKS`, :data:`VALID_BOOKS`.
The corpus record of ``fadat prepare bible-en-es`` is :data:`BIBLE_EN_ES` (:func:`bible_corpus`).
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from fadat.data.corpora import (
    DIRECTION,
    SPLITS,
    Corpus,
    CorpusOption,
    CorpusSpec,
    SplitText,
    direction_of,
)
from fadat.errors import InputError

DEFAULT_SWORD_DIR = Path("/usr/share/sword")

# module name -> Debian package that provides it
MODULES: dict[str, str] = {
    "engWEB2015eb": "sword-text-web",
    "spaRV1909eb": "sword-text-sparv",
    "engKJV2006eb": "sword-text-kjv",
}
WEB, RV1909, KJV = "engWEB2015eb", "spaRV1909eb", "engKJV2006eb"

TEST_BOOKS = frozenset({"John", "Ruth", "Eccl", "Joel", "Gal", "Jas"})
VALID_BOOKS = frozenset({"Esth", "Lam", "Phil", "1Pet", "Hab", "Titus", "Dan"})

# Books whose last verse carries a (non-canonical) subscription in RV1909 and the KJV.
SUBSCRIBED_BOOKS = frozenset(
    "Rom 1Cor 2Cor Gal Eph Phil Col 1Thess 2Thess 1Tim 2Tim Titus Phlm Heb".split()
)
# Ps 119's acrostic headings are printed in capitals on purpose (the WEB has them as titles too).
HEBREW_LETTERS = frozenset(
    "ALEPH BETH GIMEL DALETH HE VAU ZAIN CHETH TETH JOD CAPH LAMED MEM NUN SAMECH AIN PE "
    "TZADDI COPH RESH SIN TAU".split()
)
ENCLITICS = frozenset("lo la los las le les me te se nos os".split())

ATTRIBUTION = (
    "English: derived from the World English Bible (WEB), public domain (eBible.org; "
    '"World English Bible" is a trademark of eBible.org, this cleaned text is not the WEB). '
    "Spanish: Reina-Valera 1909, public domain. Second English reference: King James Version "
    "(1769 text), public domain outside the United Kingdom. Read from Debian's SWORD modules "
    "engWEB2015eb (sword-text-web), spaRV1909eb (sword-text-sparv), engKJV2006eb "
    "(sword-text-kjv); Debian packaging GPL-2+."
)
LICENCE = "public domain"

_TOKEN = re.compile(r"<[^>]*>|[^<]+")
_TAG_NAME = re.compile(r"</?\s*([A-Za-z]+)")
_STRONG = re.compile(r'lemma="([^"]*)"')
_USFM = re.compile(r"\\\+?[a-z]+\d*\*?")
_WORD_START = re.compile(r"[\w“‘(¿¡]")
_SPACE_BEFORE_PUNCT = re.compile(r" (?=[,.;:!?](?:[\s”’]|$))")
_CAPS_WORD = re.compile(r"\b[^\W\d_]{2,}\b")

# Elements whose content is not verse text.
_SKIPPED = frozenset({"note", "speaker"})
# Elements that mark a word break (line, paragraph, list, title boundaries).
_BLOCKS = frozenset({"l", "lg", "lb", "div", "item", "list", "title", "milestone", "chapter"})


@dataclass
class BibleCorpus:
    """Aligned, cleaned verse pairs.

    Attributes:
        ids: OSIS verse ids (``"Gen.1.1"``), in canonical order.
        english: WEB-derived English text per verse.
        spanish: RV1909 text per verse.
        kjv: KJV text per verse (second English reference).
        dropped: reason -> list of OSIS ids that were not paired.
        slots: number of verse slots in the KJV versification (31,102).
    """

    ids: list[str] = field(default_factory=list)
    english: list[str] = field(default_factory=list)
    spanish: list[str] = field(default_factory=list)
    kjv: list[str] = field(default_factory=list)
    dropped: dict[str, list[str]] = field(default_factory=dict)
    slots: int = 0


def book_of(osis_id: str) -> str:
    """The OSIS book of a verse id: ``"1Cor.13.4"`` → ``"1Cor"``."""
    return osis_id.split(".", 1)[0]


def split_of(osis_id: str) -> str:
    """``"test"``, ``"valid"`` or ``"train"`` for a verse id (split by whole book)."""
    book = book_of(osis_id)
    if book in TEST_BOOKS:
        return "test"
    if book in VALID_BOOKS:
        return "valid"
    return "train"


def check_sword_dir(sword_dir: Path) -> None:
    """Raise InputError naming the missing Debian package(s) and the apt command."""
    missing = [
        pkg
        for module, pkg in MODULES.items()
        if not (sword_dir / "mods.d" / f"{module}.conf").is_file()
        and not (sword_dir / "mods.d" / f"{module.lower()}.conf").is_file()
    ]
    if missing:
        raise InputError(
            f"the bible-en-es corpus needs the Debian package(s) {', '.join(missing)} "
            f"(SWORD modules under {sword_dir}): run `sudo apt-get install {' '.join(missing)}`"
        )


def read_modules(sword_dir: Path = DEFAULT_SWORD_DIR) -> tuple[list[str], dict[str, list[str]]]:
    """Raw OSIS text of every KJV-versification verse slot of the three modules.

    Returns:
        ``(ids, raw)``: the 31,102 OSIS ids in canonical order and, per module name, the raw
        OSIS markup of each id (same order; ``""`` for an empty slot).

    Raises:
        InputError: a module (Debian package) is missing or unreadable.
    """
    from pysword.modules import SwordModules

    check_sword_dir(sword_dir)
    try:
        modules = SwordModules(str(sword_dir))
        modules.parse_modules()
        bibles = {name: modules.get_bible_from_module(name) for name in MODULES}
    except Exception as err:  # pysword raises bare exceptions for broken modules
        raise InputError(f"cannot read the SWORD modules under {sword_dir}: {err}") from err
    for bible in bibles.values():
        # pysword decompresses a whole block for every verse; caching the last blocks makes
        # reading a module take ~1 s instead of ~30 s. Plain speed-up: the text is unchanged.
        if hasattr(bible, "_decompressed_text"):
            bible._decompressed_text = functools.lru_cache(maxsize=8)(bible._decompressed_text)

    books = [b for part in ("ot", "nt") for b in bibles[KJV].get_structure().get_books()[part]]
    ids = [
        f"{b.osis_name}.{c}.{v}"
        for b in books
        for c, n in enumerate(b.chapter_lengths, 1)
        for v in range(1, n + 1)
    ]
    raw: dict[str, list[str]] = {}
    for name, bible in bibles.items():
        texts: list[str] = []
        for b in books:
            for c, n in enumerate(b.chapter_lengths, 1):
                chapter = list(bible.get_iter(books=[b.name], chapters=[c], clean=False))
                # The WEB (NRSVA) has one more verse than the KJV in 3John 1 and Rev 12; both
                # extra slots are empty in the module, so the first n verses line up.
                if len(chapter) < n:
                    raise InputError(f"SWORD module {name}: {b.osis_name} {c} has too few verses")
                texts.extend(t or "" for t in chapter[:n])
        raw[name] = texts
    return ids, raw


def _tag_name(tag: str) -> str:
    m = _TAG_NAME.match(tag)
    return m.group(1) if m else ""


def _glue_enclitic(previous: str, enclitic: str, vocabulary: frozenset[str] | None) -> bool:
    """Whether an RV1909 added word is an enclitic pronoun to attach to the previous word."""
    if enclitic.lower() not in ENCLITICS:
        return False
    word = re.search(r"\w+$", previous)
    if not word:
        return False
    prev = word.group(0)
    before = previous[: word.start()].rstrip()
    if prev[0].isupper() and before and before[-1] not in ".:;!?¿¡":
        return False  # a proper noun inside a sentence (Jehová los acose)
    if vocabulary is not None and (prev + enclitic).lower() in vocabulary:
        return True
    # Infinitives (sacar|la) and gerunds / imperatives written with an accent for the enclitic
    # (sabiéndo|lo, sáca|lo, Dígan|lo) take the pronoun; the rest are separate words (que la).
    return prev.endswith("r") or bool(re.search(r"[áéíóú]", prev)) and len(prev) > 2


def clean_osis(raw: str, vocabulary: frozenset[str] | None = None) -> str:
    """Plain verse text from a SWORD module's OSIS markup.

    Removes notes (with their content), speaker labels, non-canonical titles, every tag, USFM
    codes and pilcrows; keeps canonical psalm titles; stops at the chapter end and at a second
    verse start inside the verse (WEB Rom 14:23). Inserts a space where removed markup separated
    two words, never inside a word (``<w>with tear</w>s``).

    One function of about 90 lines on purpose: it is one scanner whose five state variables
    (skip depth, pending break, last closed inline element, junction, text seen) are read and
    written by both the tag and the text branch of every token; split, they would have to travel
    as a state object through every part.

    Args:
        raw: the verse's OSIS markup.
        vocabulary: lower-cased words known from the corpus, used to decide whether an RV1909
            ``<transChange>`` pronoun is an enclitic (``None``: spelling rules only).

    Returns:
        The verse as one line with single spaces (``""`` for an empty verse).
    """
    out: list[str] = []
    skip_depth = 0
    pending_break = False
    last_closed_inline = ""  # inline element closed with no text after it yet
    junction = ""  # inline element opened right after another one closed (no space between)
    seen_text = False
    for m in _TOKEN.finditer(raw):
        token = m.group(0)
        if token[0] == "<":
            # Fast paths for the most frequent tags (Strong's-tagged words).
            if token == "</w>":
                if not skip_depth:
                    last_closed_inline = "w"
                continue
            if token.startswith("<w "):
                if not skip_depth:
                    junction = "w" if last_closed_inline else ""
                    last_closed_inline = ""
                continue
            name = _tag_name(token)
            closing = token[1] == "/"
            self_closing = token[-2] == "/"
            if name == "chapter" and "eID" in token:
                break  # subscriptions, glossary: not verse text
            if name == "div" and "x-preverse" in token and "sID" in token and seen_text:
                break  # WEB appends Rom 16:25-27 to Rom 14:23 as a new "verse"
            skip = not closing and (
                name in _SKIPPED or (name == "title" and 'canonical="true"' not in token)
            )
            if skip and not self_closing:
                skip_depth += 1
                pending_break = True
                continue
            if skip_depth:
                # Skipped elements never nest inside each other's kind in these modules, but
                # canonical titles may contain notes: count every closing of a skippable kind.
                if closing and (name in _SKIPPED or name == "title"):
                    skip_depth -= 1
                elif not closing and not self_closing and name in _SKIPPED | {"title"}:
                    skip_depth += 1
                continue
            if name in _BLOCKS:
                pending_break = True
                last_closed_inline = ""
            elif closing:
                last_closed_inline = name
            elif not self_closing:
                junction = name if last_closed_inline else ""
                last_closed_inline = ""
            continue
        if skip_depth:
            continue
        text = _USFM.sub(" ", token).replace("¶", " ")
        if not text:
            continue
        prev_char = out[-1][-1] if out and out[-1] else " "
        if prev_char.isspace() or text[0].isspace():
            pass
        elif pending_break and _WORD_START.match(text[0]) and prev_char not in "“‘(¿¡":
            out.append(" ")
        elif junction and prev_char.isalnum() and text[0].isalnum():
            first = re.match(r"\w+", text)
            enclitic = first.group(0) if first and first.end() == len(text.rstrip()) else ""
            if not (
                junction == "transChange"
                and _glue_enclitic("".join(out[-8:]), enclitic, vocabulary)
            ):
                out.append(" ")
        out.append(text)
        seen_text = seen_text or bool(text.strip())
        pending_break = False
        junction = ""
        last_closed_inline = ""
    text = " ".join("".join(out).split())
    # A removed note or line break before punctuation leaves "coins ?": close the gap.
    return _SPACE_BEFORE_PUNCT.sub("", text)


def strongs(raw: str) -> set[str]:
    """Strong's numbers tagged in a verse's markup, e.g. ``{"H7225", "H1254"}``."""
    numbers: set[str] = set()
    head = raw.split("<chapter eID", 1)[0]
    head = re.sub(r"<note\b.*?</note>", "", head, flags=re.S)
    for value in _STRONG.findall(head):
        numbers.update(
            x.split(":", 1)[-1] for x in value.split() if "strong:" in x or x[:1] in "HG"
        )
    return {n for n in numbers if re.fullmatch(r"[HG]\d+", n)}


def cut_subscription(text: str) -> str:
    """Cut an RV1909 epistle subscription: everything after the last "Amén." of the verse."""
    at = text.rfind("Amén.")
    if at < 0 or not text[at + len("Amén.") :].strip():
        return text
    return text[: at + len("Amén.")]


def recase_opening(text: str, casing: dict[str, str], keep: frozenset[str]) -> str:
    """Recase RV1909's capitalised chapter opening ("EN el principio" → "En el principio").

    Every all-capitals word of the verse (except those in ``keep``) takes its most frequent
    spelling elsewhere in RV1909 (``casing``: lower-cased word → spelling), or is lower-cased
    when it has none; a word that starts a sentence gets a capital first letter.
    """

    def fix(m: re.Match[str]) -> str:
        word = m.group(0)
        if not word.isupper() or word in keep:
            return word
        spelled = casing.get(word.lower())
        new = spelled if spelled else word.lower()
        before = text[: m.start()].rstrip(" ¡¿“(")
        if not before or before[-1] in ".!?:;":
            new = new[0].upper() + new[1:]
        return new

    return _CAPS_WORD.sub(fix, text)


def _misaligned(rv: list[set[str]], kjv: list[set[str]], ids: list[str], i: int) -> bool:
    """Whether RV1909 verse ``i`` holds other content than the KJV verse of its slot.

    RV1909 keeps Hebrew/Spanish numbering in some chapters but stores it in KJV slots. Both
    modules tag words with Strong's numbers: with coverage ``c(j)`` = share of the RV1909 verse's
    numbers found in KJV verse ``j``, the verse is misaligned when ``c(i) < 0.3`` or a neighbour
    ``j`` within two verses of the same chapter has ``c(j) >= c(i) + 0.2``. (Thresholds chosen on
    this corpus: 192 verses dropped, including whole shifted chapters such as Num 13.)
    """
    if not rv[i] or not kjv[i]:
        return False

    def coverage(j: int) -> float:
        return len(rv[i] & kjv[j]) / len(rv[i])

    own = coverage(i)
    chapter = _chapter_of(ids[i])
    neighbours = [
        coverage(j)
        for j in (i - 2, i - 1, i + 1, i + 2)
        if 0 <= j < len(ids) and _chapter_of(ids[j]) == chapter
    ]
    return own < 0.3 or max(neighbours, default=0.0) >= own + 0.2


def _chapter_of(osis_id: str) -> str:
    return osis_id.rsplit(".", 1)[0]


def build_bible(sword_dir: Path = DEFAULT_SWORD_DIR) -> BibleCorpus:
    """Read, clean and align the three SWORD modules.

    Returns:
        The aligned pairs plus the KJV reference; verses empty in either edition or
        misaligned (RV1909 numbering) are listed in ``dropped``.

    Raises:
        InputError: a Debian package is missing.
    """
    ids, raw = read_modules(sword_dir)
    return build_bible_from_raw(ids, raw)


def build_bible_from_raw(ids: list[str], raw: dict[str, list[str]]) -> BibleCorpus:
    """:func:`build_bible` on the output of :func:`read_modules`."""
    web = [clean_osis(t) for t in raw[WEB]]
    kjv = [clean_osis(t) for t in raw[KJV]]
    # RV1909's enclitic test needs its vocabulary; tags are replaced by spaces here, so words
    # glued only at a tag junction ("conformeal") are not in it.
    vocabulary = frozenset(
        w.lower() for t in raw[RV1909] for w in re.findall(r"\w+", re.sub(r"<[^>]*>", " ", t))
    )
    rv = [clean_osis(t, vocabulary) for t in raw[RV1909]]

    # Subscriptions: the last non-empty verse of each subscribed book.
    last: dict[str, int] = {}
    for i, osis in enumerate(ids):
        if rv[i] and book_of(osis) in SUBSCRIBED_BOOKS:
            last[book_of(osis)] = i
    for i in last.values():
        rv[i] = cut_subscription(rv[i])

    _recase_rv1909(ids, rv)

    rv_strongs = [strongs(t) for t in raw[RV1909]]
    kjv_strongs = [strongs(t) for t in raw[KJV]]
    corpus = BibleCorpus(slots=len(ids), dropped={"empty_en": [], "empty_es": [], "misaligned": []})
    for i, osis in enumerate(ids):
        if not web[i]:
            corpus.dropped["empty_en"].append(osis)
        elif not rv[i]:
            corpus.dropped["empty_es"].append(osis)
        elif _misaligned(rv_strongs, kjv_strongs, ids, i):
            corpus.dropped["misaligned"].append(osis)
        else:
            corpus.ids.append(osis)
            corpus.english.append(web[i])
            corpus.spanish.append(rv[i])
            corpus.kjv.append(kjv[i])
    return corpus


def _opens_with_capitals(text: str) -> bool:
    """Whether a verse starts with a word in capitals ("HUBO en los días", "Y SARAI")."""
    m = re.match(r"[¡¿]?(?:[YAEO] )?([^\W\d_]{2,})\b", text)
    return bool(m) and m.group(1).isupper() and m.group(1) not in HEBREW_LETTERS


def _recase_rv1909(ids: list[str], rv: list[str]) -> None:
    """Recase RV1909's capitalised chapter openings in place (see :func:`recase_opening`).

    Scope: the first non-empty verse of each chapter and any verse that opens with a word in
    capitals (a section start such as Luke 1:5 "HUBO"). Casing counts come from the other
    verses; a word printed in capitals there at least as often as otherwise (JAH, MENE) keeps
    its capitals, as do Ps 119's Hebrew-letter headings.
    """
    scope: set[int] = set()
    seen: set[str] = set()
    for i, osis in enumerate(ids):
        if rv[i] and _chapter_of(osis) not in seen:
            seen.add(_chapter_of(osis))
            scope.add(i)
        elif _opens_with_capitals(rv[i]):
            scope.add(i)
    spellings: dict[str, Counter[str]] = {}
    capitals: Counter[str] = Counter()
    for i, t in enumerate(rv):
        if i in scope:
            continue
        for w in re.findall(r"[^\W\d_]+", t):
            if w.isupper() and len(w) > 1:
                capitals[w] += 1
            elif not w.isupper():
                spellings.setdefault(w.lower(), Counter())[w] += 1
    best = {k: c.most_common(1)[0][0] for k, c in spellings.items()}
    keep = frozenset(
        w for w, n in capitals.items() if n >= sum(spellings.get(w.lower(), Counter()).values())
    )
    for i in sorted(scope):
        psalm119 = ids[i].startswith("Ps.119.")
        rv[i] = recase_opening(rv[i], best, keep | HEBREW_LETTERS if psalm119 else keep)


# ----------------------------------------------------------------------------------------------
# The corpus record (fadat.data.corpora.REGISTRY)


def bible_files(sword_dir: str | Path = DEFAULT_SWORD_DIR) -> list[Path]:
    """The SWORD module files bible-en-es is read from (their sha256 go into meta.json).

    Raises:
        InputError: a Debian package is missing (:func:`check_sword_dir`).
    """
    sword = Path(sword_dir)
    check_sword_dir(sword)
    return sorted(
        {
            p
            for module in MODULES
            for p in [sword / "mods.d" / f"{module}.conf"]
            + sorted((sword / "modules" / "texts" / "ztext" / module.lower()).glob("*"))
            + sorted((sword / "modules" / "texts" / "ztext" / module).glob("*"))
            if p.is_file()
        }
    )


def bible_corpus(direction: str | None = None, sword_dir: str | Path | None = None) -> Corpus:
    """bible-en-es as a :class:`~fadat.data.corpora.Corpus`: verse pairs split by book, the KJV
    as the second reference of valid/test when the target is English.

    Args:
        direction: ``"en-es"`` (default) or ``"es-en"``.
        sword_dir: the SWORD modules (default :data:`DEFAULT_SWORD_DIR`).

    Raises:
        InputError: another direction, or a missing Debian package.
    """
    src_lang, tgt_lang = direction_of(direction, "en", "es")
    sword = Path(sword_dir or DEFAULT_SWORD_DIR)
    corpus = build_bible(sword)
    files = bible_files(sword)
    text = {"en": corpus.english, "es": corpus.spanish}
    splits = {s: SplitText() for s in SPLITS}
    for i, osis in enumerate(corpus.ids):
        part = splits[split_of(osis)]
        part.source.append(text[src_lang][i])
        part.target.append(text[tgt_lang][i])
        part.where.append(osis)
        if tgt_lang == "en":
            if not part.extra_refs:
                part.extra_refs = [[]]
            part.extra_refs[0].append(corpus.kjv[i])
    splits["train"].extra_refs = []  # the KJV is a reference for evaluation only
    return Corpus(
        name="bible-en-es",
        source_lang=src_lang,
        target_lang=tgt_lang,
        splits=splits,
        source_files=files,
        licence=LICENCE,
        attribution=ATTRIBUTION,
        extra={
            "verse_slots": corpus.slots,
            "dropped_verses": {k: {"count": len(v), "ids": v} for k, v in corpus.dropped.items()},
            "split_books": {"test": sorted(TEST_BOOKS), "valid": sorted(VALID_BOOKS)},
            "ref2": "King James Version" if tgt_lang == "en" else None,
        },
    )


BIBLE_EN_ES = CorpusSpec(
    name="bible-en-es",
    help="verse pairs of the World English Bible and the Reina-Valera 1909 (SWORD modules)",
    make=bible_corpus,
    options=(
        DIRECTION,
        CorpusOption(
            "sword_dir", str, None, f"bible-en-es: SWORD modules ({DEFAULT_SWORD_DIR})", path="dir"
        ),
    ),
    inputs=lambda direction, sword_dir: bible_files(sword_dir or DEFAULT_SWORD_DIR),
)
