"""Built-in corpora on the real Debian packages: golden verses, invariants, split sizes.

bible-en-es needs sword-text-{web,sparv,kjv} (scripts/setup.sh installs them); the LibreOffice
help tests run only when the .deb files are already cached (no test downloads anything).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from fadat.data import bible, lohelp

pytestmark = pytest.mark.corpus

HAVE_SWORD = all(
    (bible.DEFAULT_SWORD_DIR / "mods.d" / f"{m}.conf").is_file() for m in bible.MODULES
)


@pytest.fixture(scope="session")
def raw() -> tuple[list[str], dict[str, list[str]]]:
    if not HAVE_SWORD:
        pytest.skip("sword-text-web/sparv/kjv not installed (run scripts/setup.sh)")
    return bible.read_modules()


@pytest.fixture(scope="session")
def corpus(raw) -> bible.BibleCorpus:
    return bible.build_bible_from_raw(*raw)


def verse(corpus: bible.BibleCorpus, osis: str) -> tuple[str, str, str]:
    i = corpus.ids.index(osis)
    return corpus.english[i], corpus.spanish[i], corpus.kjv[i]


GOLDEN = {
    "Gen.1.1": (
        "In the beginning, God created the heavens and the earth.",
        "En el principio crió Dios los cielos y la tierra.",
        "In the beginning God created the heaven and the earth.",
    ),
    "Ps.3.1": (
        "A Psalm by David, when he fled from Absalom his son. Yahweh, how my adversaries have "
        "increased! Many are those who rise up against me.",
        "Salmo de David, cuando huía de delante de Absalom su hijo. ¡Oh Jehová, cuánto se han "
        "multiplicado mis enemigos! muchos se levantan contra mí.",
        "A Psalm of David, when he fled from Absalom his son. LORD, how are they increased that "
        "trouble me! many are they that rise up against me.",
    ),
    "Rom.14.23": (
        "But he who doubts is condemned if he eats, because it isn’t of faith; and whatever is "
        "not of faith is sin.",
        "Mas el que hace diferencia, si comiere, es condenado, porque no comió por fe: y todo lo "
        "que no es de fe, es pecado.",
        "And he that doubteth is damned if he eat, because he eateth not of faith: for "
        "whatsoever is not of faith is sin.",
    ),
    "Rev.22.21": (
        "The grace of the Lord Jesus Christ be with all the saints. Amen.",
        "La gracia de nuestro Señor Jesucristo sea con todos vosotros. Amén.",
        "The grace of our Lord Jesus Christ be with you all. Amen.",
    ),
    "Rom.16.27": None,  # WEB has no text here (moved to Rom 14:23): dropped
    "Gal.6.18": (
        "The grace of our Lord Jesus Christ be with your spirit, brothers. Amen.",
        "Hermanos, la gracia de nuestro Señor Jesucristo sea con vuestro espíritu. Amén.",
        "Brethren, the grace of our Lord Jesus Christ be with your spirit. Amen.",
    ),
    "Ps.122.4": (
        "where the tribes go up, even Yah’s tribes, according to an ordinance for Israel, to "
        "give thanks to Yahweh’s name.",
        "Y allá subieron las tribus, las tribus de JAH, conforme al testimonio dado á Israel, "
        "para alabar el nombre de Jehová.",
        "Whither the tribes go up, the tribes of the LORD, unto the testimony of Israel, to give "
        "thanks unto the name of the LORD.",
    ),
    "Song.1.2": (
        "Let him kiss me with the kisses of his mouth; for your love is better than wine.",
        "¡Oh si él me besara con ósculos de su boca! porque mejores son tus amores que el vino.",
        "Let him kiss me with the kisses of his mouth: for thy love is better than wine.",
    ),
}


@pytest.mark.parametrize("osis", sorted(GOLDEN))
def test_golden_verses(corpus, osis):
    if GOLDEN[osis] is None:
        assert osis not in corpus.ids
    else:
        assert verse(corpus, osis) == GOLDEN[osis]


def test_counts_and_split_sizes(corpus):
    assert corpus.slots == 31102
    assert len(corpus.dropped["empty_en"]) == 7 and len(corpus.dropped["empty_es"]) == 18
    assert abs(len(corpus.ids) - 30862) <= 0.01 * 30862
    sizes = Counter(bible.split_of(i) for i in corpus.ids)
    for split, expected in {"test": 1516, "valid": 989, "train": 28357}.items():
        assert abs(sizes[split] - expected) <= 0.01 * expected, (split, sizes[split])
    books = {bible.book_of(i) for i in corpus.ids if bible.split_of(i) == "test"}
    assert books == set(bible.TEST_BOOKS)


def test_no_markup_or_noise(corpus):
    for texts in (corpus.english, corpus.spanish, corpus.kjv):
        for osis, t in zip(corpus.ids, texts, strict=True):
            assert t and t == t.strip() and "  " not in t, osis
            assert not re.search(r"[<>¶\\\d]|strong:[HG]|lemma=|\+nd|&[a-z]+;", t), (osis, t)
            assert not re.search(r" [,.;:!?](\s|$)", t), (osis, t)
    assert not any("Glossary" in t or "Fué escrita" in t for t in corpus.english + corpus.spanish)
    # No capitalised chapter openings left ("EN el principio").
    assert not any(re.match(r"[¡¿]?[A-ZÁÉÍÓÚÑ]{2,} [a-záéíóúñ]", t) for t in corpus.spanish)


def test_no_words_glued_by_removed_markup(corpus, raw):
    """Every word of a cleaned verse occurs in the verse's markup with the tags deleted (notes'
    text kept). A word glued where a note sat ("God<note>…</note>created" → "Godcreated") does
    not; a word split by a tag inside it ("<w>with tear</w>s") does."""
    ids, markup = raw
    where = {osis: i for i, osis in enumerate(ids)}
    for name, texts in (
        (bible.WEB, corpus.english),
        (bible.RV1909, corpus.spanish),
        (bible.KJV, corpus.kjv),
    ):
        bad = []
        for osis, text in zip(corpus.ids, texts, strict=True):
            plain = re.sub(r"<[^>]*>", "", markup[name][where[osis]])
            bad += [(osis, w) for w in re.findall(r"\w+", text) if w not in plain]
        # Recased RV1909 chapter openings differ in case only.
        if name == bible.RV1909:
            bad = [(o, w) for o, w in bad if w.upper() not in markup[name][where[o]]]
        assert bad == [], (name, bad[:10])


def test_es_en_has_kjv_second_reference(corpus, monkeypatch, tmp_path):
    monkeypatch.setattr(bible, "build_bible", lambda sword: corpus)
    c = bible.bible_corpus(direction="es-en", sword_dir=str(bible.DEFAULT_SWORD_DIR))
    test = c.splits["test"]
    i = test.where.index("John.3.16")
    assert test.extra_refs[0][i].startswith("For God so loved the world")
    assert test.target[i].startswith("For God so loved the world") and "Dios" in test.source[i]
    assert c.splits["train"].extra_refs == []


def test_missing_package_error_names_package(tmp_path):
    from fadat.errors import InputError

    with pytest.raises(InputError, match=r"sword-text-web.*apt-get install sword-text-web"):
        bible.check_sword_dir(tmp_path)


# ------------------------------------------------------------------------------- LibreOffice


def test_help_parser_pairs_and_strips(tmp_path):
    page = (
        '<html><body><h1 id="hd_id1">Find <span class="menuitem">Toolbar</span></h1>'
        '<p id="par_id2">Use <span hidden="true" class="MAC">Command+F</span>'
        '<span class="default">Ctrl+F</span> &amp; go.<br/>Next line.</p>'
        '<p id="other">not collected</p><table><tr><td id="par_id3"><p>cell</p></td></tr>'
        "</table></body></html>"
    )
    path = tmp_path / "x.html"
    path.write_text(page, encoding="utf-8")
    order, paras = lohelp.parse_help_file(path)
    assert order == ["hd_id1", "par_id2", "par_id3"]
    assert paras == {
        "hd_id1": "Find Toolbar",
        "par_id2": "Use Ctrl+F & go. Next line.",
        "par_id3": "cell",
    }


def test_split_hash_is_stable():
    # sha1 of the path, not Python's salted hash(): fixed expectations.
    import hashlib

    for path in ("text/shared/01/01010000.html", "text/swriter/guide/smarttags.html"):
        bucket = int(hashlib.sha1(path.encode()).hexdigest(), 16) % 1000
        expected = "test" if bucket < 37 else "valid" if bucket < 66 else "train"
        assert lohelp.split_of(path) == expected


CACHE = lohelp.DEFAULT_CACHE
HAVE_DEBS = all(list(CACHE.glob(f"{lohelp.PACKAGES[x]}_*.deb")) for x in ("en", "de"))


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_DEBS, reason=f"LibreOffice help .debs not cached in {CACHE}")
def test_lohelp_en_de_corpus():
    c = lohelp.build_help("de", CACHE)
    assert abs(len(c.keys) - 35253) <= 0.05 * 35253
    assert len(set(zip(c.english, c.other, strict=True))) == len(c.keys)  # de-duplicated
    assert all(e != t for e, t in zip(c.english, c.other, strict=True))  # translated
    # (the help text itself mentions tags such as "<h1>": look for attributes)
    tag = r'<[a-z]+\s[^>]*(class|id|href|src|hidden)="'
    assert not any(re.search(tag, t) for t in c.english + c.other)
    sizes = Counter(lohelp.split_of(f) for f in c.files)
    assert 1200 <= sizes["test"] <= 1800 and 800 <= sizes["valid"] <= 1200
    by_file: dict[str, set[str]] = {}
    for f in c.files:
        by_file.setdefault(lohelp.split_of(f), set()).add(f)
    assert not (by_file["test"] & by_file["train"])


def test_lohelp_missing_package_is_clear_error(tmp_path, monkeypatch):
    from fadat.errors import InputError

    monkeypatch.setattr(lohelp.shutil, "which", lambda name: None)
    with pytest.raises(InputError, match="libreoffice-help-en-us"):
        lohelp.fetch_packages(["en"], Path(tmp_path))
