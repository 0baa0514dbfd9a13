"""File access for local paths and every ``tf.io.gfile`` scheme (``gs://``, ``ram://`` ...).

Local paths use the standard library (no TensorFlow import for commands that need none); any
path with a ``scheme://`` goes through ``tf.io.gfile``. Writes are atomic: data goes to a
temporary name in the same folder and is renamed over the final name once complete, so an
interrupted run never leaves a half-written file under a final name.
"""

from __future__ import annotations

import glob as _glob
import json
import os
import shutil
import uuid
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import IO, Any

from tpulm.errors import TpulmError

TMP_MARKER = ".tmp-"
# tpulm's record of what it wrote in a folder (read and written by tpulm.ownership): never a
# user's file, so it never stops a folder from being replaced.
WRITTEN_RECORD = ".tpulm-written.json"


def is_remote(path: str) -> bool:
    """True for ``scheme://`` paths other than ``file://``."""
    return "://" in path and not path.startswith("file://")


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def join(base: str, *parts: str) -> str:
    """Join path parts with '/', for local and remote paths alike."""
    if not is_remote(base):
        return os.path.join(_local(base), *parts)
    return "/".join([base.rstrip("/"), *parts])


def exists(path: str) -> bool:
    return _gfile().exists(path) if is_remote(path) else os.path.exists(_local(path))


def isdir(path: str) -> bool:
    return _gfile().isdir(path) if is_remote(path) else os.path.isdir(_local(path))


def makedirs(path: str) -> None:
    if is_remote(path):
        _gfile().makedirs(path)
    else:
        os.makedirs(_local(path), exist_ok=True)


def listdir(path: str) -> list[str]:
    """Names (not paths) in a folder, sorted; folders of remote schemes lose their trailing '/'."""
    if is_remote(path):
        return sorted(name.rstrip("/") for name in _gfile().listdir(path))
    return sorted(os.listdir(_local(path)))


def glob(pattern: str) -> list[str]:
    """Sorted matches of a glob pattern."""
    if is_remote(pattern):
        return sorted(_gfile().glob(pattern))
    return sorted(_glob.glob(_local(pattern), recursive=True))


def remove(path: str) -> None:
    if is_remote(path):
        _gfile().remove(path)
    else:
        os.remove(_local(path))


def rmtree(path: str) -> None:
    if is_remote(path):
        _gfile().rmtree(path)
    else:
        shutil.rmtree(_local(path))


def rename(src: str, dst: str, overwrite: bool = True) -> None:
    if is_remote(src):
        _gfile().rename(src, dst, overwrite=overwrite)
    elif overwrite:
        os.replace(_local(src), _local(dst))
    else:
        if os.path.exists(_local(dst)):
            raise FileExistsError(dst)
        os.rename(_local(src), _local(dst))


def size(path: str) -> int:
    return _gfile().stat(path).length if is_remote(path) else os.path.getsize(_local(path))


def mtime(path: str) -> float:
    """Seconds since the epoch of the last change of ``path``."""
    if is_remote(path):
        return _gfile().stat(path).mtime_nsec / 1e9
    return os.path.getmtime(_local(path))


def open_file(path: str, mode: str = "r") -> IO:
    if is_remote(path):
        return _gfile().GFile(path, mode)
    return open(_local(path), mode, encoding=None if "b" in mode else "utf-8")


def read_text(path: str) -> str:
    with open_file(path, "r") as f:
        return f.read()


def read_bytes(path: str) -> bytes:
    with open_file(path, "rb") as f:
        return f.read()


def _store_reason(err: BaseException) -> str:
    """The first line of a store's own error (TensorFlow's message without its C++ context)."""
    text = getattr(err, "message", None) or str(err) or type(err).__name__
    return text.strip().splitlines()[0].strip()


def _bucket(path: str) -> str | None:
    """``gs://bucket`` of a ``gs://bucket/...`` path; None for other schemes (no buckets)."""
    if not path.startswith("gs://"):
        return None
    return "gs://" + path[len("gs://"):].split("/", 1)[0]


def _nearest_existing(path: str) -> str:
    """``path`` or its closest ancestor that exists (local paths)."""
    current = os.path.abspath(path)
    while not os.path.exists(current) and os.path.dirname(current) != current:
        current = os.path.dirname(current)
    return current


def check_reachable(path: str | None, what: str, write: bool = False) -> None:
    """Fail in seconds, before any heavy work, when ``path`` cannot be used.

    Each stage calls this at its start for every path it reads or writes: a ``gs://`` path
    without network or credentials otherwise fails only when first touched (after tokenizing a
    corpus, say) with a raw TensorFlow error. Remote paths get one metadata request, and the
    store's own reason is reported; a local output must be writable.

    Args:
        path: the path (None or "" is skipped: not set).
        what: the setting it comes from, for the message (``--output``).
        write: the stage writes there: the bucket must exist, a local place must be writable.

    Raises:
        TpulmError: one line naming the setting, the path and the store's reason.
    """
    if not path:
        return
    if not is_remote(path):
        if write:
            _check_writable(_local(path), what)
        return
    try:
        bucket = _bucket(path) if write else None
        if bucket and not _gfile().exists(bucket):
            raise TpulmError(f"{what} {path}: bucket {bucket} does not exist (or these credentials "
                             "cannot see it); create it or fix the path")
        _gfile().exists(path)
    except TpulmError:
        raise
    except Exception as err:  # tf.errors.OpError and friends: network, credentials, permissions
        raise TpulmError(
            f"{what} {path} cannot be reached: {_store_reason(err)}; check the network, the path "
            "and the credentials (gcloud auth application-default login)") from None


def _check_writable(path: str, what: str) -> None:
    """A local output whose place cannot be written says so before any work."""
    if os.path.islink(path) and not os.path.exists(path):
        raise TpulmError(f"{what} {path} is a symbolic link to {os.readlink(path)}, which does not "
                         "exist; create that folder or choose another output")
    existing = _nearest_existing(path)
    if not os.path.isdir(existing):
        if existing != os.path.abspath(path):
            raise TpulmError(f"{what} {path}: {existing} is a file, not a folder; choose another "
                             "output")
        existing = os.path.dirname(existing) or "."
    if not os.access(existing, os.W_OK | os.X_OK):
        raise TpulmError(f"{what} {path} is read-only ({existing} cannot be written); choose a "
                         "writable place or fix its permissions")
    try:  # os.access ignores read-only mounts for root; statvfs sees them
        if os.statvfs(existing).f_flag & os.ST_RDONLY:
            raise TpulmError(f"{what} {path} is on a read-only file system ({existing}); choose a "
                             "writable place")
    except (OSError, AttributeError):
        pass


def temporary_name(path: str) -> str:
    """A unique sibling name for ``path`` that readers of the folder recognise as unfinished."""
    head, tail = os.path.split(path) if not is_remote(path) else path.rsplit("/", 1)
    return join(head, f"{tail}{TMP_MARKER}{uuid.uuid4().hex[:12]}")


def is_temporary(name: str) -> bool:
    return TMP_MARKER in os.path.basename(name)


def _remove_any(path: str) -> None:
    rmtree(path) if isdir(path) else remove(path)


def _replace(tmp: str, path: str) -> None:
    """Rename ``tmp`` to ``path``, replacing what is there, a folder included."""
    if isdir(tmp) and exists(path):  # rename cannot put a folder over a path: move it aside
        old = temporary_name(path)
        rename(path, old)
        rename(tmp, path)
        _remove_any(old)
    else:
        rename(tmp, path, overwrite=True)


def _name_path(err: BaseException, path: str) -> None:
    """Give an OSError raised while writing ``path`` (a full disk, a file-size limit: ``write``
    names no file) that path, so the one-line message says where."""
    if isinstance(err, OSError) and err.errno is not None and not err.filename:
        err.filename = path


@contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yield a temporary path to write to (a file, or a folder the caller creates); on success
    it replaces ``path`` by rename, a folder included, else it is deleted.

    A local ``path`` that is a symbolic link is followed: what it points to is replaced and the
    link stays (renaming over the link would swap it for a folder or leave it renamed aside).
    """
    if not is_remote(path) and os.path.islink(_local(path)):
        path = os.path.realpath(_local(path))
    tmp = temporary_name(path)
    try:
        yield tmp
        _replace(tmp, path)
    except BaseException as err:
        if exists(tmp):
            _remove_any(tmp)
        _name_path(err, path)
        raise


def write_bytes(path: str, data: bytes) -> None:
    """Atomically write ``data`` to ``path``."""
    with atomic_path(path) as tmp:
        with open_file(tmp, "wb") as f:
            f.write(data)


def write_text(path: str, text: str) -> None:
    """Atomically write ``text`` (UTF-8) to ``path``."""
    write_bytes(path, text.encode("utf-8"))


def read_json(path: str, missing: Any = None) -> Any:
    """The JSON value in ``path``; ``missing`` if there is no such file.

    Raises:
        TpulmError: the file is not valid JSON (the message names it).
    """
    if not exists(path):
        return missing
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as err:
        raise TpulmError(f"{path} is not valid JSON: {err}; fix or delete it") from None


def write_json(path: str, value: Any, sort_keys: bool = False) -> None:
    """Atomically write ``value`` as indented UTF-8 JSON with a final newline."""
    write_text(path, json.dumps(value, indent=2, ensure_ascii=False, sort_keys=sort_keys) + "\n")


def check_replaceable(path: str, overwrite: bool, ours: Collection[str] | None = (),
                      what: str = "files") -> None:
    """Refuse to replace ``path`` unless doing so deletes nothing a user owns.

    The one rule for every command that writes a folder: a missing path or an empty folder may
    be written; a regular file never is; a non-empty folder is replaced only with ``overwrite``
    and only when every entry in it is one of ``ours`` (the names the writer itself puts there,
    so the folder was written by tpulm). Anything else is named in the error and left untouched.

    Args:
        path: the folder about to be (re)written.
        overwrite: the user asked to replace an existing folder (``--overwrite``).
        ours: top-level names this writer creates (files or folders); None: not known yet, so
            only the file and ``overwrite`` rules are checked.
        what: what the folder holds, for the message ("a tokenizer").

    Raises:
        TpulmError: ``path`` is a file, holds foreign entries, or is non-empty without overwrite.
    """
    if not exists(path):
        return
    if not isdir(path):
        raise TpulmError(f"{path} is a file, not a folder; choose another output folder "
                         "(nothing was changed)")
    names = listdir(path)
    if not names:
        return
    foreign = [] if ours is None else [n for n in names if n not in ours and n != WRITTEN_RECORD]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise TpulmError(f"{path} holds files tpulm did not write ({shown}); choose another "
                         "output folder (nothing was changed)")
    if not overwrite:
        raise TpulmError(f"{path} already holds {what}; pass --overwrite to replace it or "
                         "choose another folder")


@contextmanager
def atomic_folder(path: str, overwrite: bool, ours: Collection[str] = ()) -> Iterator[str]:
    """Yield a new temporary sibling folder that replaces ``path`` (by rename) once complete.

    On error it is deleted, so no half-written folder appears under ``path``. What may be
    replaced is decided by :func:`check_replaceable` (checked before and again just before the
    swap, in case the folder changed meanwhile); by default ``ours`` is the names of the new
    folder's entries.
    """
    check_replaceable(path, overwrite, ours or None)
    with atomic_path(path) as tmp:
        makedirs(tmp)
        yield tmp
        check_replaceable(path, overwrite, set(ours) | set(listdir(tmp)))
