"""One writer per output folder: ``lock.json`` in the folder names the process holding it.

Held by ``tpulm train`` on its run dir, ``tpulm run`` on its work dir and ``tpulm data prepare``
on its output; commands that remove a folder (``tpulm run --restart``, ``import --overwrite``)
first check that no live process holds it (:func:`check_free`).

Locally the lock file is created atomically (a complete temporary file hard-linked to the final
name, which fails if it exists), so of two writers started together exactly one gets it. The
other is refused with the holder's command, host and pid. A lock whose holder is on this host and no
longer running (killed, VM restarted) is taken over with a warning; a lock from another host is
never taken over automatically, since this host cannot tell whether that process still runs:
delete ``lock.json`` once you know it is gone. The lock is removed when its holder ends, however
it ends, except when the process is killed outright (SIGKILL, power loss): that is the stale case.

On object stores (``gs://``) there is no create-if-absent through ``tf.io.gfile``: the lock is
best effort. A writer checks for the file and writes it when absent, so two writers started
within the same second or so can both get it, and a stale lock from a machine that is gone must
be deleted by hand (its host, pid and start time are in the file). Only the chief process (see
``Strategy.is_chief``) takes a run dir's lock.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tpulm import storage
from tpulm.errors import TpulmError

log = logging.getLogger(__name__)

LOCK_NAME = "lock.json"


def _me(holder: str) -> dict:
    return {"holder": holder, "host": socket.gethostname(), "pid": os.getpid(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _create(path: str, holder: dict) -> bool:
    """Write the lock if there is none; False when one is there."""
    text = json.dumps(holder) + "\n"
    if storage.is_remote(path):
        if storage.exists(path):
            return False
        storage.write_text(path, text)  # best effort: no create-if-absent on object stores
        return True
    tmp = storage.temporary_name(path)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    try:
        os.link(tmp, path)  # atomic, fails if the lock exists; the file is complete already
        return True
    except FileExistsError:
        return False
    finally:
        os.remove(tmp)


def _holder(path: str) -> dict:
    try:
        found = json.loads(storage.read_text(path))
        return found if isinstance(found, dict) else {}
    except (ValueError, OSError):
        return {}


def _stale(held: dict) -> bool:
    """True for a lock left by a process of this host that is gone (killed, VM restarted)."""
    pid = held.get("pid")
    return held.get("host") == socket.gethostname() and isinstance(pid, int) and not _alive(pid)


def _in_use(folder: str, path: str, held: dict) -> TpulmError:
    return TpulmError(
        f"{folder} is in use by another {held.get('holder', 'trainer')} (host "
        f"{held.get('host', '?')}, pid {held.get('pid', '?')}, since {held.get('time', '?')}); "
        f"wait for it, or delete {path} if that process is gone")


def acquire(folder: str, holder: str = "trainer") -> str:
    """Take the folder's lock; returns the lock file.

    Args:
        folder: the output folder (created if missing).
        holder: what holds it, for the message another process gets ("tpulm run").

    Raises:
        TpulmError: another live process holds it (the message names it, its host, pid and
            start time).
    """
    storage.makedirs(folder)
    path = storage.join(folder, LOCK_NAME)
    me = _me(holder)
    for _ in range(2):
        if _create(path, me):
            return path
        held = _holder(path)
        if _stale(held):
            log.warning("taking over %s, left by process %d on this host, which is gone", path,
                        held["pid"])
            storage.remove(path)
            continue
        raise _in_use(folder, path, held)
    raise TpulmError(f"cannot take the lock {path}: another process took it just now")


def check_free(folder: str) -> None:
    """Refuse to go on while a live process holds ``folder`` (before removing or replacing it).

    Raises:
        TpulmError: the folder's lock names a live process, or one on another host.
    """
    path = storage.join(folder, LOCK_NAME)
    if storage.exists(path):
        held = _holder(path)
        if held.get("pid") == os.getpid() and held.get("host") == socket.gethostname():
            return  # this process holds it (tpulm run removing its own output)
        if not _stale(held):
            raise _in_use(folder, path, held)
        log.warning("%s was left by process %s on this host, which is gone; going on",
                    path, held.get("pid"))


def release(path: str) -> None:
    """Remove the lock if it is still ours."""
    held = _holder(path)
    if held.get("pid") == os.getpid() and held.get("host") == socket.gethostname():
        storage.remove(path)


@contextmanager
def hold(folder: str, holder: str = "trainer", enabled: bool = True) -> Iterator[None]:
    """Hold the folder's lock for the duration of the block (no-op when not ``enabled``); a
    folder made only to hold the lock is removed again if the block left it empty (a command
    that failed early writes nothing)."""
    if not enabled:
        yield
        return
    created = not storage.exists(folder)
    path = acquire(folder, holder)
    try:
        yield
    finally:
        release(path)
        if created and storage.isdir(folder) and not storage.listdir(folder):
            storage.rmtree(folder)
