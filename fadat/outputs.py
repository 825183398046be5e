"""Where fadat writes, and what it may replace: never what it did not create.

Every directory a verb creates carries a marker file, :data:`MARKER` (``.fadat-output.json``),
naming the kind of output: ``dataset`` (``fadat prepare``), ``run`` (``fadat train``), ``model``
(a model directory), ``analysis``, ``hypotheses``, or a new verb's own kind. A verb writes into
or replaces an existing directory only when its marker (or, for directories written before the
marker existed, the kind's own metadata file, see :func:`output_kind`) says it is a fadat output
of the same kind; a non-empty directory of anything else, or a regular file where a directory is
expected, is refused with :class:`~fadat.errors.InputError` whatever the flags (``--force``
included). Replacing a whole directory (:func:`replace_dir`) also refuses while the old one
holds files that fadat did not write there, so a file a user put into a dataset directory
survives ``fadat prepare --force``.

Usage, in every verb that writes:

1. before any work: :func:`check_output_dir` (a directory) or :func:`check_output_file` (a
   file); both also check that the location can be written (by creating and removing a probe
   file: permission bits do not tell for root or read-only mounts);
2. at the end: :func:`mark_dir` (a directory filled in place: run, model, analysis),
   :func:`replace_dir` (a directory built in a staging directory: dataset), or
   :func:`atomic_path` / :func:`atomic_write` (a file, all-or-nothing).

A single file (``--output out.txt``, ``--report report.json``) lies in a directory that fadat
did not create; the verb records it there after writing it, in :data:`RECORD`
(``.fadat-files.json``: name, inode, size and modification time of every file fadat wrote in that
directory). An existing file is replaced without ``--force`` only when the record says fadat wrote
it and nothing changed it since (:func:`fadat_wrote`); a file of a user, another program or an
older fadat is replaced only with ``--force``. A file output is never an input, a file inside a
fadat dataset, model or run directory, or a name ending in ``/`` (which names a directory), with
or without ``--force`` (:func:`check_output_file`).

A directory filled in place by a long-running process (a run of ``fadat train``) is held by one
process at a time: :func:`directory_lock` (``fcntl.flock`` on :data:`LOCK` inside it, holding the
holder's PID; the kernel releases it when the process dies, so no lock outlives its process).

Temporaries (``.NAME.tmp-PID-*`` staging directories and files, ``.NAME.old-PID-*`` directories
being replaced) carry the id of the process that made them: they are removed when their block
ends, on an error or on SIGTERM (``fadat.cli`` turns it into ``KeyboardInterrupt``), and those of
a process that no longer runs (SIGKILL, power loss) are removed by the next check of the same
output (:func:`remove_stale`). A write that fails (disk full, a directory that vanished) is an
:class:`~fadat.errors.InputError` naming the output and the OS error. :func:`output_lock` keeps
two processes from building one output at the same time.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from fadat.errors import InputError

#: The marker file of every fadat output directory: ``{"kind": ..., "files": [...]}``.
MARKER = ".fadat-output.json"

#: The record of the single files that verbs wrote into a directory they did not create:
#: ``{"files": {NAME: [inode, size, mtime_ns]}}`` (:func:`fadat_wrote`).
RECORD = ".fadat-files.json"

#: The lock file of a directory that one process fills in place (:func:`directory_lock`).
LOCK = ".fadat-output.lock"

#: Kinds of directories that hold what other verbs read, so that no verb writes into one it did
#: not create.
_PROTECTED = ("dataset", "model", "run")

#: Files of directories written before the marker existed, per kind: how such a directory is
#: recognised (a file whose JSON has these keys) and which of its files fadat wrote.
_LEGACY: dict[str, tuple[str, tuple[str, ...], re.Pattern[str]]] = {
    "dataset": (
        "meta.json",
        ("fingerprint", "format"),
        re.compile(
            r"meta\.json|spm\.(model|vocab)|(train|valid|test)\.(src|tgt)\.(ids|off)\.npy"
            r"|raw/(valid|test)\.(src|ref\d*)\.txt"
        ),
    ),
    "model": (
        "config.json",
        ("model_type", "format_version"),
        re.compile(r"config\.json|model\.safetensors|spm\.model|shortlist\.safetensors"),
    ),
}


def _temp_prefix(path: Path, what: str = "tmp") -> str:
    """Name prefix of a temporary next to ``path``: ``.NAME.tmp-PID-`` (:func:`remove_stale`)."""
    return f".{path.name}.{what}-{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


_TEMP = re.compile(r"\.(?P<name>.+)\.(tmp|old)-(?P<pid>\d+)-[^/]*")


def remove_stale(path: str | Path) -> list[Path]:
    """Remove the temporaries of ``path`` (``.NAME.tmp-PID-*``, ``.NAME.old-PID-*`` next to it)
    left by processes that no longer run; returns what was removed. Temporaries of a running
    process, and anything else, stay."""
    path = Path(path)
    parent = path.absolute().parent
    removed = []
    try:
        candidates = list(parent.glob(f".{glob_escape(path.name)}.*-*-*"))
    except OSError:
        return removed
    for temp in candidates:
        match = _TEMP.fullmatch(temp.name)
        if not match or match["name"] != path.name or _alive(int(match["pid"])):
            continue
        if temp.is_dir() and not temp.is_symlink():
            shutil.rmtree(temp, ignore_errors=True)
        else:
            temp.unlink(missing_ok=True)
        removed.append(temp)
    return removed


def glob_escape(name: str) -> str:
    """``name`` with glob's special characters escaped."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def write_error(path: str | Path, err: OSError, option: str | None = None) -> InputError:
    """The :class:`InputError` for an ``OSError`` while writing ``path``: names the output (and
    the flag) and the OS error, e.g. ``--output out.txt: cannot write (No space left on
    device)``."""
    what = f"{option} {path}" if option else str(path)
    reason = err.strerror or str(err)
    if err.errno == errno.ENOENT:
        reason += "; was its directory removed?"
    return InputError(f"{what}: cannot write ({reason})")


@contextmanager
def output_lock(path: str | Path, option: str = "--output") -> Iterator[None]:
    """Hold an exclusive lock on the output ``path`` for the block: a second fadat process that
    wants to write the same output is refused at once instead of racing the first.

    The lock is ``fcntl.flock`` on ``.NAME.lock`` next to ``path``, removed when the block
    ends; the operating system releases it if the process dies.

    Raises:
        InputError: another process holds the lock, or the lock file cannot be created.
    """
    path = Path(path)
    parent = path.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise write_error(parent, err, option) from None
    lock = parent / f".{path.name}.lock"
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, _umask_mode(0o666))
        except OSError as err:
            raise write_error(lock, err, option) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise InputError(
                f"{option} {path}: another fadat process is writing it (lock {lock}); wait for "
                f"it to finish or give another {option}"
            ) from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:
            same = False
        if same:  # not a lock file that its holder removed just before we locked it
            break
        os.close(fd)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)
        os.close(fd)


def _lock_holder(fd: int) -> str:
    """``PID n`` from a lock file's content (its holder writes it once it holds the lock)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return f"PID {text}" if text.isdigit() else "a PID not yet written"


def _try_lock(lock: Path, fd: int, path: Path, kind: str, option: str) -> None:
    """``flock`` ``fd`` (the open ``lock``) exclusively without waiting; on failure close it and
    raise the InputError naming the directory and the holder's PID."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = _lock_holder(fd)
        os.close(fd)
        raise InputError(
            f"{option} {path}: this {kind} directory is in use by another fadat process "
            f"({holder}, lock {lock}); wait for it to end or give another {option}"
        ) from None


@contextmanager
def directory_lock(path: str | Path, kind: str, option: str = "--output") -> Iterator[bool]:
    """Check ``path`` as a ``kind`` output (:func:`check_output_dir`) and hold it for the block:
    one process at a time fills a directory in place (a run of ``fadat train``).

    The lock is ``fcntl.flock`` on :data:`LOCK` inside ``path`` (created with the directory if
    needed), and the file holds the holder's PID. The kernel releases the lock when the process
    ends, however it ends (SIGKILL included), so a lock never outlives its holder; the file stays.
    When the block fails before anything but the lock was written into a directory this call
    created, the directory is removed again.

    Yields:
        ``True`` when ``path`` already was a fadat ``kind`` directory (as checked under the lock).

    Raises:
        InputError: as :func:`check_output_dir`; another process holds the lock (the message
            names ``path`` and the holder's PID); the lock file cannot be created or written.
    """
    path = Path(path)
    lock = path / LOCK
    flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0)
    fd = None
    if lock.is_file():
        # Tried before the check: a directory another process created and locked, but has not
        # marked yet, would otherwise look like a directory that fadat did not create.
        try:
            fd = os.open(lock, flags)
        except OSError:
            fd = None
        else:
            _try_lock(lock, fd, path, kind, option)
    created = False
    try:
        existed = check_output_dir(path, kind, option)
        if fd is None:
            created = not path.exists()
            try:
                path.mkdir(parents=True, exist_ok=True)
                fd = os.open(lock, flags | os.O_CREAT, _umask_mode(0o666))
            except OSError as err:
                raise write_error(lock, err, option) from None
            _try_lock(lock, fd, path, kind, option)
            existed = check_output_dir(path, kind, option)  # as it is under the lock
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        except OSError as err:
            raise write_error(lock, err, option) from None
        yield existed
    except BaseException:
        with suppress(OSError):
            if created and fd is not None and [p.name for p in path.iterdir()] == [LOCK]:
                lock.unlink()
                path.rmdir()
        raise
    finally:
        if fd is not None:
            with suppress(OSError):
                os.close(fd)


def remove_temporaries(path: str | Path) -> list[Path]:
    """Remove the temporaries (``.NAME.tmp-PID-*``, ``.NAME.old-PID-*``) directly inside the
    directory ``path``, whatever their PID; returns what was removed.

    Call it only while holding :func:`directory_lock` on ``path``, before writing anything:
    then every temporary there was left by a process that held the lock before and died
    (SIGKILL, power loss). The PID alone cannot tell, because a PID is reused (a restarted
    container gives its new process the old one's PID).
    """
    path = Path(path)
    removed = []
    try:
        entries = list(path.iterdir())
    except OSError:
        return removed
    for temp in entries:
        if not _TEMP.fullmatch(temp.name):
            continue
        if temp.is_dir() and not temp.is_symlink():
            shutil.rmtree(temp, ignore_errors=True)
        else:
            temp.unlink(missing_ok=True)
        removed.append(temp)
    return removed


def silence_stdout() -> None:
    """Point file descriptor 1 at /dev/null, so that the interpreter's last flush of a closed or
    full stdout does not print a second error (after fadat reported the first)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real stdout (a test's capture)
        pass


def _umask_mode(mode: int) -> int:
    """``mode`` less the process umask (what ``open``/``mkdir`` would give)."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def output_kind(path: str | Path) -> str | None:
    """The kind of fadat output directory ``path`` is, or ``None`` if it is not one.

    Read from :data:`MARKER`; a directory without one is recognised by its kind's metadata
    (``meta.json`` with a fingerprint: ``dataset``; ``config.json`` with ``model_type`` and
    ``format_version``: ``model``; ``config.yaml`` next to ``train.log`` or
    ``checkpoint_last.pt``: ``run``).
    """
    path = Path(path)
    if not path.is_dir():
        return None
    marker = _read_json(path / MARKER)
    if isinstance(marker, dict) and isinstance(marker.get("kind"), str):
        return marker["kind"]
    for kind, (name, keys, _) in _LEGACY.items():
        meta = _read_json(path / name) if (path / name).is_file() else None
        if isinstance(meta, dict) and all(k in meta for k in keys):
            return kind
    if (path / "config.yaml").is_file() and (
        (path / "train.log").is_file() or (path / "checkpoint_last.pt").is_file()
    ):
        return "run"
    return None


def _files(path: Path) -> list[str]:
    """Relative paths (``/``-separated) of every file and empty directory below ``path``."""
    out = []
    for root, dirs, files in os.walk(path):
        rel = Path(root).relative_to(path)
        out += [(rel / f).as_posix() for f in files]
        out += [(rel / d).as_posix() + "/" for d in dirs if not os.listdir(Path(root) / d)]
    return sorted(out)


def _foreign_files(path: Path, kind: str, also: set[str] = frozenset()) -> list[str]:
    """Files in the ``kind`` directory ``path`` that fadat did not write there: neither in
    the marker's list, nor (without a list) matching the kind's legacy file names, nor in
    ``also``."""
    marker = _read_json(path / MARKER)
    recorded = marker.get("files") if isinstance(marker, dict) else None
    pattern = _LEGACY.get(kind, (None, None, None))[2]
    foreign = []
    for name in _files(path):
        if name in (MARKER, LOCK, RECORD) or name in also:
            continue
        if isinstance(recorded, list):
            if name in recorded:
                continue
        elif pattern is not None and pattern.fullmatch(name):
            continue
        foreign.append(name)
    return foreign


def _probe_writable(directory: Path, what: str) -> None:
    """Create and remove a file in ``directory``; InputError naming ``what`` if that fails."""
    try:
        fd, name = tempfile.mkstemp(dir=directory, prefix=".fadat-probe-")
        try:
            os.close(fd)
        finally:
            os.unlink(name)  # also when SIGTERM (a KeyboardInterrupt in fadat) lands here
    except OSError as err:
        raise InputError(f"{what}: cannot write in {directory} ({err.strerror or err})") from None


def _check_location(path: Path, what: str) -> None:
    """The nearest existing ancestor of ``path`` is a directory that can be written."""
    ancestor = path.absolute().parent
    while not os.path.lexists(ancestor):
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InputError(f"{what}: {ancestor} is a file, not a directory")
    _probe_writable(ancestor, what)


def check_output_dir(path: str | Path, kind: str, option: str = "--output") -> bool:
    """Check, before any work, that ``path`` can become (or be updated as) a ``kind`` output.

    Args:
        path: the output directory; absent, empty, or a fadat ``kind`` directory.
        kind: the kind of output (``dataset``, ``run``, ``model``, ``analysis``, ...).
        option: the flag that named ``path``, for messages.

    Returns:
        ``True`` when ``path`` already is a fadat ``kind`` directory (the verb decides whether it
        may update or replace it), ``False`` when it is absent or empty.

    Raises:
        InputError: ``path`` is a file (or other non-directory); a non-empty directory that is
            not a fadat output; a fadat output of another kind; a directory inside a fadat
            dataset, model or run directory; a location that cannot be written. Nothing is
            created or deleted.
    """
    path = Path(path)
    what = f"{option} {path}"
    remove_stale(path)
    if os.path.lexists(path) and not path.is_dir():
        raise InputError(
            f"{what}: exists and is not a directory; fadat does not replace it "
            f"(give another {option})"
        )
    _refuse_protected(path, what, option)
    if not path.exists():
        _check_location(path, what)
        return False
    found = output_kind(path)
    if found is None:
        try:
            # A lock left by a process that died before it marked the directory.
            empty = all(entry.name == LOCK for entry in path.iterdir())
        except OSError as err:
            raise InputError(f"{what}: cannot read ({err.strerror or err})") from None
        if not empty:
            raise InputError(
                f"{what}: a directory that fadat did not create (no {MARKER}); fadat never "
                f"writes into or deletes it, with or without --force (give a new or empty "
                f"{option})"
            )
    elif found != kind:
        raise InputError(
            f"{what}: a fadat {found} directory, not a {kind} directory (give another {option})"
        )
    _probe_writable(path, what)
    return found is not None


def check_replaceable(path: str | Path, kind: str, option: str = "--output") -> None:
    """Before any work: a ``kind`` directory at ``path`` may be replaced as a whole.

    Raises:
        InputError: as :func:`check_output_dir`, or the directory holds files that fadat did not
            write there (the message names the first).
    """
    path = Path(path)
    if check_output_dir(path, kind, option):
        _refuse_foreign(path, kind, option, set())


def check_whole_replacement(path: str | Path, kind: str, option: str, force: bool) -> None:
    """Before any work: ``path`` can become a ``kind`` directory written whole (staged, then
    renamed into place): absent or empty, or an existing fadat ``kind`` directory replaced as a
    whole, only with ``force`` (``fadat average``, ``fadat snapshot``).

    Raises:
        InputError: as :func:`check_output_dir`; an existing ``kind`` directory without
            ``force``; one holding files that fadat did not write there (the first named).
    """
    path = Path(path)
    if check_output_dir(path, kind, option):
        if not force:
            raise InputError(
                f"{option} {path}: an existing {kind} directory; pass --force to replace it "
                f"(as a whole), or give another {option}"
            )
        _refuse_foreign(path, kind, option, set())


def _refuse_foreign(path: Path, kind: str, option: str, also: set[str]) -> None:
    foreign = _foreign_files(path, kind, also)
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise InputError(
            f"{option} {path}: holds {foreign[0]}{more}, which fadat did not write there; "
            f"fadat does not delete it (move it away or give another {option})"
        )


def _write_marker(path: Path, kind: str, files: list[str] | None) -> None:
    data: dict[str, object] = {"kind": kind}
    if files is not None:
        data["files"] = files
    atomic_write(path / MARKER, json.dumps(data, indent=1) + "\n")


def mark_dir(path: str | Path, kind: str) -> Path:
    """Create ``path`` (and parents) if needed and give it the ``kind`` marker; returns it.

    For directories that a verb fills in place (a run, a model, an analysis): it writes only its
    own files there, so anything else in the directory stays.

    Raises:
        InputError: as :func:`check_output_dir` (checked again here, as a last line of defence).
    """
    path = Path(path)
    check_output_dir(path, kind, "output directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"{path}: cannot create the directory ({err.strerror or err})") from None
    marker = _read_json(path / MARKER)
    if not (isinstance(marker, dict) and marker.get("kind") == kind):
        _write_marker(path, kind, None)
    return path


def add_own_file(path: str | Path, name: str) -> None:
    """Add ``name`` (relative, ``/``-separated) to the file list of the marker of the fadat
    directory ``path``, after a verb wrote that file there (``fadat shortlist`` into a model
    directory), so that replacing the directory as a whole does not take it for a user's file.
    A marker without a list (files recognised by their names) is left as it is."""
    path = Path(path)
    marker = _read_json(path / MARKER)
    if not isinstance(marker, dict) or not isinstance(marker.get("kind"), str):
        return
    files = marker.get("files")
    if isinstance(files, list) and name not in files:
        _write_marker(path, marker["kind"], sorted([*files, name]))


def staging_dir(path: str | Path) -> Path:
    """A new empty directory next to ``path`` to build a replacement in (see :func:`replace_dir`;
    the caller removes it on failure)."""
    path = Path(path)
    path.absolute().parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(dir=path.absolute().parent, prefix=_temp_prefix(path)))
    staged.chmod(_umask_mode(0o777))  # mkdtemp's 0700 would make the output private
    return staged


def replace_dir(staged: str | Path, path: str | Path, kind: str, option: str = "--output") -> None:
    """Move the finished directory ``staged`` to ``path``, replacing a ``kind`` directory there.

    ``staged`` gets the marker (with the list of its files) first. The old directory is renamed
    aside, the new one renamed into place, then the old one removed: a reader sees the old or
    the new directory, never a mixture.

    Raises:
        InputError: ``path`` is no longer replaceable (:func:`check_output_dir`), or it holds
            files that fadat did not write there and the new build does not write either.
            ``staged`` is left for the caller to remove.
    """
    staged, path = Path(staged), Path(path)
    files = [f for f in _files(staged) if f != MARKER]
    _write_marker(staged, kind, files)
    if check_output_dir(path, kind, option):
        _refuse_foreign(path, kind, option, set(files))
        old = Path(tempfile.mkdtemp(dir=path.absolute().parent, prefix=_temp_prefix(path, "old")))
        os.replace(path, old / "d")
        os.replace(staged, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        if path.exists():  # an empty directory, or one holding only a dead process's lock
            (path / LOCK).unlink(missing_ok=True)
            path.rmdir()
        os.replace(staged, path)


#: Files of a training run directory (``fadat train``), which has no list in its marker.
_RUN_FILES = re.compile(r"config\.yaml|train\.log|best\.json|checkpoint[^/]*\.pt")


def _protected_owner(path: Path) -> tuple[Path, str, bool] | None:
    """The fadat dataset, model or run directory that ``path`` lies inside (symbolic links
    resolved), as ``(directory, kind, own)``: ``own`` when ``path`` is one of its own files (the
    marker, a file of the marker's list, or a file name the kind writes); or ``None``."""
    resolved = Path(os.path.realpath(path))
    for directory in resolved.parents:
        kind = output_kind(directory)
        if kind in _PROTECTED:
            name = resolved.relative_to(directory).as_posix()
            marker = _read_json(directory / MARKER)
            recorded = marker.get("files") if isinstance(marker, dict) else None
            pattern = _RUN_FILES if kind == "run" else _LEGACY[kind][2]
            own = (
                name in (MARKER, LOCK)
                or (isinstance(recorded, list) and name in recorded)
                or bool(pattern.fullmatch(name))
            )
            return directory, kind, own
        if directory.parent == directory:
            break
    return None


def _refuse_protected(path: Path, what: str, option: str) -> None:
    """InputError when ``path`` is a file of, or lies inside, a fadat dataset, model or run
    directory: a verb writes nothing into one that it did not create."""
    owner = _protected_owner(path)
    if owner is None:
        return
    directory, kind, own = owner
    if own:
        raise InputError(
            f"{what}: is a file of the fadat {kind} directory {directory}; fadat does not "
            f"write over it (give another {option})"
        )
    raise InputError(
        f"{what}: lies inside the fadat {kind} directory {directory}, which this command did "
        f"not create; fadat writes nothing into it (give another {option})"
    )


def check_not_input(
    output: str | Path,
    inputs: Iterable[tuple[str, str | Path | None]],
    option: str = "--output",
) -> None:
    """Before any work: ``output`` is not one of the verb's ``inputs``, does not lie inside one
    (a model directory, a dataset, a run), and does not hold one. Paths are compared after
    resolving symbolic links, and existing files by identity (hard links).

    Args:
        output: the output file or directory.
        inputs: ``(what, path)`` for every file or directory the verb reads, e.g.
            ``("--input", "in.txt")``, ``("--model", "models/fadat")``; ``None`` and ``"-"``
            (stdin) are skipped.
        option: the flag that named ``output``, for messages.

    Raises:
        InputError: naming the output, the input and how they overlap. Nothing is created.
    """
    out = Path(os.path.realpath(output))
    for what, given in inputs:
        if given is None or str(given) == "-":
            continue
        inp = Path(os.path.realpath(given))
        if out == inp or (out.exists() and inp.exists() and os.path.samefile(out, inp)):
            how = f"is the {what} {given}"
        elif inp in out.parents:
            how = f"lies inside the {what} {given}"
        elif out in inp.parents:
            how = f"holds the {what} {given}"
        else:
            continue
        raise InputError(
            f"{option} {output}: {how}, which this command reads; fadat never writes over "
            f"its input (give another {option})"
        )


def check_output_file(
    path: str | Path,
    option: str = "--output",
    inputs: Iterable[tuple[str, str | Path | None]] = (),
    force: bool = False,
) -> Path:
    """Check, before any work, that ``path`` can be written as a file; returns it.

    An existing regular file is replaced at the end when fadat wrote it and nothing changed it
    since (:func:`fadat_wrote`), or with ``force``; the file is then written with
    ``atomic_path(..., record=True)`` so that the next run may replace it.

    Args:
        path: the output file; a name that ends in ``/`` names a directory and is refused.
        option: the flag that named ``path``, for messages.
        inputs: ``(what, path)`` of everything the verb reads (:func:`check_not_input`).
        force: replace an existing file that fadat did not write (``--force``).

    Raises:
        InputError: ``path`` ends in ``/`` or is a directory; it is an input or lies inside one;
            it is a file of, or lies inside, a fadat dataset, model or run directory; an
            existing file that fadat did not write, without ``force``; a location that cannot
            be written. Nothing is created.
    """
    what = f"{option} {path}"
    if str(path).endswith(("/", os.sep)):
        raise InputError(f"{what}: names a directory (it ends in '/'), expected a file name")
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{what}: is a directory, expected a file name")
    if os.path.lexists(path) and not path.is_file():
        raise InputError(f"{what}: exists and is not a regular file")
    check_not_input(path, inputs, option)
    remove_stale(path)
    _refuse_protected(path, what, option)
    if os.path.lexists(path) and not force and not fadat_wrote(path):
        raise InputError(
            f"{what}: exists and fadat did not write it; pass --force to replace it "
            f"(or give another {option})"
        )
    _check_location(path, what)
    return path


def _identity(path: Path) -> list[int] | None:
    """``[inode, size, mtime_ns]`` of ``path`` itself (a symbolic link is not followed)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def _recorded(directory: Path) -> dict[str, object]:
    record = _read_json(directory / RECORD)
    files = record.get("files") if isinstance(record, dict) else None
    return files if isinstance(files, dict) else {}


def fadat_wrote(path: str | Path) -> bool:
    """Whether the file ``path`` is one that a verb wrote (``atomic_path(..., record=True)``)
    and that nothing replaced or changed since: its name, inode, size and modification time
    are in its directory's :data:`RECORD`."""
    path = Path(path)
    identity = _identity(path)
    return identity is not None and _recorded(path.absolute().parent).get(path.name) == identity


def _record(path: Path) -> None:
    """Add the file ``path`` to its directory's :data:`RECORD` (and drop the entries of files
    that are gone or changed). The record is a convenience for the next run: when it cannot be
    written, that run asks for ``--force``, so an ``OSError`` here is not an error."""
    directory = path.absolute().parent
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # two verbs writing files into one directory
        files = {
            name: identity
            for name, identity in _recorded(directory).items()
            if name != path.name and _identity(directory / name) == identity
        }
        identity = _identity(path)
        if identity is not None:
            files[path.name] = identity
        atomic_write(directory / RECORD, json.dumps({"files": files}, indent=1) + "\n")
    except (OSError, InputError):
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_path(
    path: str | Path, option: str | None = None, record: bool = False
) -> Iterator[Path]:
    """A temporary path next to ``path`` (same suffix) that is renamed onto ``path`` when the
    block ends without an error, and removed otherwise: ``path`` is never half-written. With
    ``record`` (a verb's output file, checked by :func:`check_output_file`), the file is then
    recorded as fadat's (:func:`fadat_wrote`).

    Raises:
        InputError: an ``OSError`` while writing (disk full, directory removed), naming
            ``path`` (and ``option``, the flag that named it).

    Example::

        with atomic_path("graph.png") as tmp:
            fig.savefig(tmp)
    """
    path = Path(path)
    try:
        path.absolute().parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(
            dir=path.absolute().parent, prefix=_temp_prefix(path), suffix=path.suffix
        )
        os.close(fd)
    except OSError as err:
        raise write_error(path, err, option) from None
    tmp = Path(name)
    try:
        try:
            yield tmp
            # mkstemp's 0600 would make the output private; set after the block, since a writer
            # may create the file anew (safetensors' save_file does, again 0600)
            tmp.chmod(_umask_mode(0o666))
            os.replace(tmp, path)
        except OSError as err:
            # Disk full, a directory that vanished, ...: the output's name, not the
            # temporary's; and a read error of something else still names its own file.
            if err.filename not in (None, str(tmp), str(path), name):
                raise
            raise write_error(path, err, option) from None
    finally:
        tmp.unlink(missing_ok=True)
    if record:
        _record(path)


def atomic_write(
    path: str | Path, data: str | bytes, option: str | None = None, record: bool = False
) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` all-or-nothing (see :func:`atomic_path`)."""
    with atomic_path(path, option, record) as tmp:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8", newline="\n")
        else:
            tmp.write_bytes(data)
