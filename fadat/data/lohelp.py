"""The built-in ``lohelp-en-de`` / ``lohelp-en-es`` corpora: LibreOffice help paragraphs.

Source: Debian's ``libreoffice-help-en-us`` and ``libreoffice-help-<lang>`` (MPL-2.0). The packages
are fetched with ``apt-get download`` into a cache directory and unpacked with ``dpkg-deb -x``, so
LibreOffice itself is never installed. The help pages are HTML files under
``usr/share/libreoffice/help/<lang>/text/``, one identical file tree per language; paragraphs
(``<p>``, ``<h1>``…``<h6>``, ``<td>`` whose id starts with ``par_id`` or ``hd_id``) are paired by
(file, paragraph id), tags stripped (platform alternatives hidden with ``hidden="true"`` are
skipped), pairs de-duplicated, untranslated pairs (same text) dropped.

Split by a stable hash of the help-file path: ``sha1(path) mod 1000`` below
:data:`TEST_PER_MILLE` is test, below :data:`VALID_PER_MILLE` valid (Python's ``hash()`` is salted
per process, so it is never used). The corpus records of ``fadat prepare lohelp-en-de`` /
``lohelp-en-es`` are :data:`LOHELP_EN_DE`, :data:`LOHELP_EN_ES` (:func:`lohelp_corpus`).
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import subprocess
from dataclasses import dataclass, field
from html.parser import HTMLParser
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

LANG_DIRS = {"en": "en-US", "de": "de", "es": "es"}
PACKAGES = {
    "en": "libreoffice-help-en-us",
    "de": "libreoffice-help-de",
    "es": "libreoffice-help-es",
}
DEFAULT_CACHE = Path.home() / ".cache" / "fadat" / "debs"
TEST_PER_MILLE = 37
VALID_PER_MILLE = 66  # [37, 66) is valid (≈ 1.4k test, 1k valid en-de pairs)
LICENCE = "MPL-2.0"
ATTRIBUTION = (
    "LibreOffice help pages (The Document Foundation and contributors), MPL-2.0, from Debian's "
    "{packages} packages."
)

_COLLECTED = frozenset({"p", "h1", "h2", "h3", "h4", "h5", "h6", "td"})
# Tags that separate words (paragraph, list, table boundaries); inline tags (span, a) do not.
_BREAKS = _COLLECTED | frozenset("li ul ol div table tr th pre section dl dt dd".split())
_VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())


@dataclass
class HelpCorpus:
    """Paired help paragraphs.

    Attributes:
        keys: ``"<relative path>#<paragraph id>"`` per pair, sorted by path then document order.
        english, other: the paired texts.
        files: the relative path of each pair's help file (the split key).
        counts: paragraphs seen, pairs before filtering, untranslated and duplicate drops.
    """

    keys: list[str] = field(default_factory=list)
    english: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


def split_of(path: str) -> str:
    """``"test"``, ``"valid"`` or ``"train"`` for a help file path (stable sha1 hash)."""
    bucket = int(hashlib.sha1(path.encode("utf-8")).hexdigest(), 16) % 1000
    if bucket < TEST_PER_MILLE:
        return "test"
    if bucket < VALID_PER_MILLE:
        return "valid"
    return "train"


class _ParagraphParser(HTMLParser):
    """Collect the text of id'd paragraphs, skipping hidden platform alternatives."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: dict[str, str] = {}
        self.order: list[str] = []
        self._stack: list[tuple[str, bool, str | None]] = []  # (tag, hidden, collector id)
        self._parts: dict[str, list[str]] = {}

    def _hidden(self) -> bool:
        return any(hidden for _, hidden, _ in self._stack)

    def _collector(self) -> str | None:
        for _, _, pid in reversed(self._stack):
            if pid is not None:
                return pid
        return None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _VOID:
            if tag == "br":
                self._data(" ")
            return
        a = dict(attrs)
        hidden = "hidden" in a and a["hidden"] != "false"
        pid = a.get("id") or ""
        collect = tag in _COLLECTED and (pid.startswith("par_id") or pid.startswith("hd_id"))
        if collect and pid not in self._parts:
            self._parts[pid] = []
            self.order.append(pid)
        else:
            collect = False
        self._stack.append((tag, hidden, pid if collect else None))
        if tag in _BREAKS:
            self._data(" ")

    def handle_endtag(self, tag: str) -> None:
        for k in range(len(self._stack) - 1, -1, -1):
            if self._stack[k][0] == tag:
                del self._stack[k:]
                break
        if tag in _BREAKS:
            self._data(" ")

    def _data(self, text: str) -> None:
        pid = self._collector()
        if pid is not None and not self._hidden():
            self._parts[pid].append(text)

    def handle_data(self, data: str) -> None:
        self._data(data)

    def close(self) -> None:
        super().close()
        for pid in self.order:
            self.paragraphs[pid] = " ".join("".join(self._parts[pid]).split())


def parse_help_file(path: Path) -> tuple[list[str], dict[str, str]]:
    """Paragraph ids in document order and their plain text (tags stripped, entities decoded)."""
    parser = _ParagraphParser()
    parser.feed(path.read_text(encoding="utf-8", errors="strict"))
    parser.close()
    return parser.order, parser.paragraphs


def fetch_packages(langs: list[str], cache_dir: Path = DEFAULT_CACHE) -> dict[str, Path]:
    """Download (if not cached) and unpack the help packages; return the help root per language.

    Raises:
        InputError: ``apt-get``/``dpkg-deb`` is missing or the download fails; the message names
            the package and the command to run.
    """
    roots: dict[str, Path] = {}
    for lang in langs:
        pkg = PACKAGES[lang]
        root = cache_dir / "extracted" / pkg / "usr/share/libreoffice/help" / LANG_DIRS[lang]
        if (root / "text").is_dir():
            roots[lang] = root
            continue
        debs = sorted(cache_dir.glob(f"{pkg}_*.deb"))
        if not debs:
            if shutil.which("apt-get") is None:
                raise InputError(
                    f"the lohelp corpus needs the Debian package {pkg} and apt-get is not "
                    f"available: download {pkg}_*.deb into {cache_dir}"
                )
            cache_dir.mkdir(parents=True, exist_ok=True)
            result = subprocess.run(
                ["apt-get", "download", pkg], cwd=cache_dir, capture_output=True, text=True
            )
            debs = sorted(cache_dir.glob(f"{pkg}_*.deb"))
            if result.returncode != 0 or not debs:
                last = (result.stderr.strip().splitlines() or ["no output"])[-1]
                raise InputError(
                    f"cannot download the Debian package {pkg} ({last}): run "
                    f"`sudo apt-get update && cd {cache_dir} && apt-get download {pkg}`"
                )
        target = cache_dir / "extracted" / pkg
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        result = subprocess.run(
            ["dpkg-deb", "-x", str(debs[-1]), str(tmp)], capture_output=True, text=True
        )
        if result.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise InputError(f"cannot unpack {debs[-1]} with dpkg-deb: {result.stderr.strip()}")
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        if not (root / "text").is_dir():
            raise InputError(f"{debs[-1]} holds no help pages under {root}")
        roots[lang] = root
    return roots


def deb_files(langs: list[str], cache_dir: Path = DEFAULT_CACHE) -> list[Path]:
    """The cached .deb files used for ``langs`` (for meta.json's sha256 list)."""
    return [sorted(cache_dir.glob(f"{PACKAGES[lang]}_*.deb"))[-1] for lang in langs]


def build_help(other: str, cache_dir: Path = DEFAULT_CACHE) -> HelpCorpus:
    """Pair English help paragraphs with language ``other`` (``"de"`` or ``"es"``).

    Raises:
        InputError: unknown language or a package that cannot be obtained.
    """
    if other not in PACKAGES or other == "en":
        raise InputError(f"no LibreOffice help corpus for en-{other}")
    roots = fetch_packages(["en", other], cache_dir)
    corpus = HelpCorpus(counts={"paragraphs": 0, "untranslated": 0, "duplicates": 0, "empty": 0})
    seen: set[tuple[str, str]] = set()
    files = sorted(p.relative_to(roots["en"]).as_posix() for p in roots["en"].rglob("*.html"))
    for rel in files:
        other_path = roots[other] / rel
        if not other_path.is_file():
            continue
        order, en = parse_help_file(roots["en"] / rel)
        _, tr = parse_help_file(other_path)
        for pid in order:
            corpus.counts["paragraphs"] += 1
            if pid not in tr:
                continue
            e, t = en[pid], tr[pid]
            if not e or not t:
                corpus.counts["empty"] += 1
            elif e == t:
                corpus.counts["untranslated"] += 1
            elif (e, t) in seen:
                corpus.counts["duplicates"] += 1
            else:
                seen.add((e, t))
                corpus.keys.append(f"{rel}#{pid}")
                corpus.english.append(e)
                corpus.other.append(t)
                corpus.files.append(rel)
    return corpus


# ----------------------------------------------------------------------------------------------
# The corpus records (fadat.data.corpora.REGISTRY)


def lohelp_files(other: str, cache_dir: str | Path | None = None) -> list[Path]:
    """The .deb files lohelp-en-``other`` is read from, downloaded and unpacked first if they are
    not in ``cache_dir`` (default :data:`DEFAULT_CACHE`) yet.

    Raises:
        InputError: from :func:`fetch_packages`.
    """
    cache = Path(cache_dir) if cache_dir else DEFAULT_CACHE
    fetch_packages(["en", other], cache)
    return deb_files(["en", other], cache)


def lohelp_corpus(
    other: str, direction: str | None = None, cache_dir: str | Path | None = None
) -> Corpus:
    """lohelp-en-``other`` as a :class:`~fadat.data.corpora.Corpus`: paired help paragraphs
    split by help file.

    Args:
        other: ``"de"`` or ``"es"``.
        direction: ``"en-<other>"`` (default) or ``"<other>-en"``.
        cache_dir: where the .deb files are downloaded (default :data:`DEFAULT_CACHE`).

    Raises:
        InputError: another direction, or a package that cannot be obtained.
    """
    src_lang, tgt_lang = direction_of(direction, "en", other)
    cache = Path(cache_dir) if cache_dir else DEFAULT_CACHE
    corpus = build_help(other, cache)
    text = {"en": corpus.english, other: corpus.other}
    splits = {s: SplitText() for s in SPLITS}
    for i, key in enumerate(corpus.keys):
        part = splits[split_of(corpus.files[i])]
        part.source.append(text[src_lang][i])
        part.target.append(text[tgt_lang][i])
        part.where.append(key)
    packages = [PACKAGES["en"], PACKAGES[other]]
    return Corpus(
        name=f"lohelp-en-{other}",
        source_lang=src_lang,
        target_lang=tgt_lang,
        splits=splits,
        source_files=deb_files(["en", other], cache),
        licence=LICENCE,
        attribution=ATTRIBUTION.format(packages=", ".join(packages)),
        extra={"pairing": corpus.counts},
    )


_CACHE_DIR = CorpusOption(
    "cache_dir",
    str,
    None,
    "lohelp: where .deb files are downloaded (default ~/.cache/fadat/debs)",
    path="dir",
)
LOHELP_EN_DE = CorpusSpec(
    name="lohelp-en-de",
    help="LibreOffice help paragraphs, English-German (Debian's libreoffice-help packages)",
    make=functools.partial(lohelp_corpus, "de"),
    options=(DIRECTION, _CACHE_DIR),
    inputs=lambda direction, cache_dir: lohelp_files("de", cache_dir),
)
LOHELP_EN_ES = CorpusSpec(
    name="lohelp-en-es",
    help="LibreOffice help paragraphs, English-Spanish (Debian's libreoffice-help packages)",
    make=functools.partial(lohelp_corpus, "es"),
    options=(DIRECTION, _CACHE_DIR),
    inputs=lambda direction, cache_dir: lohelp_files("es", cache_dir),
)
