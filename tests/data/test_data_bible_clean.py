"""The OSIS cleaner and RV1909 fixes on hand-written markup (no corpus needed)."""

from __future__ import annotations

import pytest

from fadat.data import bible


@pytest.mark.parametrize(
    "markup, expected",
    [
        # A footnote between two words leaves a space, not "Godcreated".
        (
            '<w lemma="strong:H0430">God</w><note placement="foot"><reference>1:1 </reference>'
            "Elohim.</note><w>created</w> it.",
            "God created it.",
        ),
        # ... and none before punctuation.
        ("the coins<note>Greek: assaria.</note> ? No", "the coins? No"),
        # A tag inside a word is no word break.
        ("<w>with tear</w>s and <w>afrai</w>d", "with tears and afraid"),
        # Speaker labels and non-canonical titles go; canonical psalm titles stay.
        ("<speaker>Beloved</speaker> <l/>Let him kiss me", "Let him kiss me"),
        (
            '<title canonical="true" type="psalm">A Psalm.</title> <l/>Yahweh, hear.',
            "A Psalm. Yahweh, hear.",
        ),
        ("<title><foreign>ב BETH.</foreign></title> <l/>Wherewithal", "Wherewithal"),
        # Everything after the chapter end (subscriptions, glossary) is cut.
        ('Amen. <chapter eID="Rom.16"/> <title>Written to the Romans</title>', "Amen."),
        # A second verse start inside the verse (WEB Rom 14:23 + 16:25-27) is cut.
        ('is sin. <div type="x-milestone" subType="x-preverse" sID="p1"/>Now to him', "is sin."),
        # KJV pilcrows and stray USFM codes.
        ("¶ Because the \\nd <w>LORD</w></divineName> hath sworn", "Because the LORD hath sworn"),
        # RV1909 junctions: separate words get a space, enclitic pronouns are attached.
        (
            '<w>conforme</w><transChange type="added">dado</transChange><w>á Israel</w>',
            "conforme dado á Israel",
        ),
        ('<w>sáca</w><transChange type="added">lo</transChange> de aquí', "sácalo de aquí"),
        (
            '<w>para que</w><transChange type="added">la</transChange><w>tengan</w>',
            "para que la tengan",
        ),
        (
            'el ángel de <w>Jehová</w><transChange type="added">los</transChange><w>acose</w>',
            "el ángel de Jehová los acose",
        ),
    ],
)
def test_clean_osis(markup, expected):
    assert bible.clean_osis(markup) == expected


def test_cut_subscription():
    text = "La gracia sea con vosotros. Amén. Fué escrita de Roma."
    assert bible.cut_subscription(text) == "La gracia sea con vosotros. Amén."
    assert bible.cut_subscription("Paz. Amén.") == "Paz. Amén."
    assert bible.cut_subscription("Sin amén aquí.") == "Sin amén aquí."


def test_recase_opening():
    casing = {
        "principio": "principio",
        "descendiendo": "descendiendo",
        "sarai": "Sarai",
        "oh": "oh",
    }
    keep = frozenset({"JAH"})
    assert bible.recase_opening("EN el principio", casing, keep) == "En el principio"
    assert bible.recase_opening("Y DESCENDIENDO Samsón", casing, keep) == "Y descendiendo Samsón"
    assert bible.recase_opening("Y SARAI, mujer", casing, keep) == "Y Sarai, mujer"
    assert bible.recase_opening("Salmo. ¡OH JAH", casing, keep) == "Salmo. ¡Oh JAH"


def test_strongs_ignore_notes():
    markup = (
        '<w lemma="strong:H7225">EN el principio</w> <w lemma="strong:G2424 G5547">X</w>'
        '<note><w lemma="strong:H9999">n</w></note>'
    )
    assert bible.strongs(markup) == {"H7225", "G2424", "G5547"}


def test_split_of_books():
    assert bible.split_of("John.3.16") == "test" and bible.split_of("1Pet.1.1") == "valid"
    assert bible.split_of("Gen.1.1") == "train" and bible.split_of("1John.1.1") == "train"
