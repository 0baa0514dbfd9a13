"""What tpulm wrote, so that it replaces or removes only that: ``.tpulm-written.json``.

The one rule for every path a command writes or removes: tpulm replaces or removes a file only
when it wrote it and the file has not changed since. Each writer records the files it writes in
the record of its output folder (``FOLDER/.tpulm-written.json``: for each file below the folder,
its size, its SHA-256 when small, and the writer). A file is *tpulm's* when an unchanged entry
for it sits in a record of its folder or a folder above it (up to the folder being replaced); a
hand-edited model card, a notes file dropped into a run dir or a ``config.toml`` the user had
there are not, and a command that would replace or remove them stops before any work, naming
them (:func:`refuse`).

An ``append`` entry (``metrics.jsonl``) stays tpulm's while the file starts with the recorded
bytes: training appends to it after recording. Files larger than ``HASH_LIMIT`` are compared by
size only (checkpoints: hashing gigabytes at every save costs more than an edit of a weight file
that keeps its size is likely). Locks and tpulm's temporaries are never a user's file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable
from typing import Any

from tpulm import storage
from tpulm.errors import TpulmError

RECORD_NAME = storage.WRITTEN_RECORD
FORMAT = 1
HASH_LIMIT = 4 << 20  # bytes: larger files are compared by size
IGNORED = frozenset({RECORD_NAME, "lock.json"})  # never a user's file


def _record_path(folder: str) -> str:
    return storage.join(folder, RECORD_NAME)


def read(folder: str) -> dict[str, dict[str, Any]]:
    """The entries of ``folder``'s record, keyed by path relative to it; {} when there is none
    (or it is damaged: then nothing in it counts as tpulm's, the safe side)."""
    path = _record_path(folder)
    if not storage.exists(path):
        return {}
    try:
        files = json.loads(storage.read_text(path)).get("files", {})
    except (ValueError, AttributeError):
        return {}
    return files if isinstance(files, dict) else {}


def _write(folder: str, entries: dict[str, dict[str, Any]]) -> None:
    text = json.dumps({"format": FORMAT, "files": entries}, indent=1, sort_keys=True)
    storage.write_text(_record_path(folder), text + "\n")


def _digest(path: str, length: int) -> str:
    """SHA-256 of the first ``length`` bytes of ``path``."""
    digest = hashlib.sha256()
    with storage.open_file(path, "rb") as f:
        digest.update(f.read(length))
    return digest.hexdigest()


def _entry(path: str, by: str, append: bool) -> dict[str, Any]:
    size = storage.size(path)
    entry: dict[str, Any] = {"size": size, "by": by}
    if size <= HASH_LIMIT:
        entry["sha256"] = _digest(path, size)
    if append:
        entry["append"] = True
    return entry


def unchanged(path: str, entry: dict[str, Any]) -> bool:
    """True when ``path`` still holds what its ``entry`` recorded (or, for an ``append`` entry,
    starts with it)."""
    if not storage.exists(path) or storage.isdir(path):
        return False
    size, recorded = storage.size(path), entry.get("size")
    if not isinstance(recorded, int) or size < recorded or (size > recorded
                                                            and not entry.get("append")):
        return False
    return "sha256" not in entry or _digest(path, recorded) == entry["sha256"]


def record(folder: str, names: Iterable[str], by: str, append: bool = False) -> None:
    """Record files just written below ``folder`` (``names`` relative to it) as ``by``'s.

    Args:
        folder: the writer's output folder, where the record lives.
        names: the files, relative to ``folder`` ("results.json", "tokenizer/tokenizer.json").
        by: the writer ("train", "export", "evaluate" ...).
        append: the files grow after this (``metrics.jsonl``); a longer file is still tpulm's
            while it starts with the recorded bytes.
    """
    entries = read(folder)
    for name in names:
        entries[name] = _entry(storage.join(folder, name), by, append)
    _write(folder, entries)


def check_files(folder: str, names: Iterable[str], writers: Collection[str], doing: str,
                remedy: str) -> None:
    """Refuse to replace files ``names`` (relative to ``folder``) unless each is missing or
    tpulm's: recorded in ``folder``'s record by one of ``writers`` and unchanged since.

    Raises:
        TpulmError: naming the files that are not tpulm's (see :func:`refuse`).
    """
    entries = read(folder)
    bad = []
    for name in names:
        path, entry = storage.join(folder, name), entries.get(name)
        if storage.exists(path) and not (entry is not None and entry.get("by") in writers
                                         and unchanged(path, entry)):
            bad.append(path)
    if bad:
        raise refuse(bad, doing, remedy)


def check_folder(folder: str, writers: Collection[str] | None, doing: str, remedy: str) -> None:
    """Refuse to replace ``folder`` (``--overwrite``) when it holds files that are not
    ``writers``' or changed since; a folder without a record (an older tpulm's) is left to the
    caller's rules of names.

    Raises:
        TpulmError: naming the files (see :func:`refuse`).
    """
    if storage.isdir(folder) and read(folder):
        found = foreign(folder, writers)
        if found:
            raise refuse(found, doing, remedy)


def _files(folder: str, skip: Collection[str] = ()) -> Iterable[str]:
    """Every file below ``folder`` (recursively; folders in ``skip`` left out), but records,
    locks and tpulm's temporaries."""
    for name in storage.listdir(folder):
        path = storage.join(folder, name)
        if path in skip or name in IGNORED or storage.is_temporary(name):
            continue
        if storage.isdir(path):
            yield from _files(path, skip)
        else:
            yield path


def _recorded(folder: str) -> dict[str, dict[str, Any]]:
    """Every entry of the records in ``folder`` and the folders below it, by full path."""
    found = {storage.join(folder, rel): entry for rel, entry in read(folder).items()}
    for name in storage.listdir(folder):
        path = storage.join(folder, name)
        if not storage.is_temporary(name) and storage.isdir(path):
            found.update(_recorded(path))
    return found


def foreign(folder: str, writers: Collection[str] | None = None,
            since: float | None = None) -> list[str]:
    """Files below ``folder`` that are not tpulm's: not recorded, changed since, or recorded by
    a writer not in ``writers`` (None: any writer).

    Args:
        folder: the folder about to be removed or replaced (missing: nothing is foreign).
        writers: the writers whose files may go.
        since: start time of an interrupted run of the writer: files modified at or after it
            were written by that run before it could record them.
    """
    if not storage.isdir(folder):
        return []
    recorded = _recorded(folder)
    found = []
    for path in _files(folder):
        entry = recorded.get(path)
        ours = (entry is not None and (writers is None or entry.get("by") in writers)
                and unchanged(path, entry))
        if not ours and not (since is not None and storage.mtime(path) >= since):
            found.append(path)
    return found


def snapshot(folder: str, by: str, skip: Collection[str] = (), keep: Collection[str] = ()) -> None:
    """Record as ``by``'s every file below ``folder`` that its writer has just finished writing.

    Files recorded unchanged by another writer stay that writer's; ``keep`` (files that were
    not tpulm's before the writer ran) and folders in ``skip`` (other writers' outputs nested in
    this one) are left out, and so is any subfolder with a record of its own.
    """
    if not storage.isdir(folder):
        return
    entries = read(folder)
    nested = set(_subfolders_with_records(folder)) | set(skip)
    fresh = {}
    for path in _files(folder, nested):
        rel = path[len(folder.rstrip("/")) + 1:]
        old = entries.get(rel)
        if path in keep:  # not claimed; another writer's entry (changed or not) stays as it was
            if old is not None and old.get("by") != by:
                fresh[rel] = old
            continue
        if old is not None and old.get("by") != by:
            if unchanged(path, old):  # another writer's file; changed since: nobody's now
                fresh[rel] = old
        else:
            fresh[rel] = _entry(path, by, bool(old and old.get("append")))
    _write(folder, fresh)


def _subfolders_with_records(folder: str) -> Iterable[str]:
    for name in storage.listdir(folder):
        path = storage.join(folder, name)
        if storage.is_temporary(name) or not storage.isdir(path):
            continue
        if storage.exists(_record_path(path)):
            yield path
        else:
            yield from _subfolders_with_records(path)


def describe(paths: list[str]) -> str:
    """Up to five paths, then how many more."""
    shown = ", ".join(paths[:5])
    return shown + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")


def refuse(paths: list[str], doing: str, remedy: str) -> TpulmError:
    """The error for a command that would replace or remove files tpulm did not write.

    Args:
        paths: the files (see :func:`foreign`).
        doing: what the command was about to do ("stage export would remove").
        remedy: the flag that allows it, or what else to do.
    """
    return TpulmError(f"{doing} {describe(paths)}, which tpulm did not write or which changed "
                      f"since; nothing was changed. Move them away, or {remedy}")
