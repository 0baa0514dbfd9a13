"""One trainer per run dir: ``lock.json`` names the process holding it.

Locally the lock file is created atomically (a complete temporary file hard-linked to the final
name, which fails if it exists), so of two trainers started together exactly one gets it. The
other is refused with the holder's host and pid. A lock whose holder is on this host and no
longer running (killed, VM restarted) is taken over with a warning; a lock from another host is
never taken over automatically, since this host cannot tell whether that process still runs:
delete ``lock.json`` once you know it is gone. The lock is removed when training ends, however
it ends, except when the process is killed outright (SIGKILL, power loss): that is the stale case.

On object stores (``gs://``) there is no create-if-absent through ``tf.io.gfile``: the lock is
best effort. A trainer checks for the file and writes it when absent, so two trainers started
within the same second or so can both get it, and a stale lock from a machine that is gone must
be deleted by hand (its host, pid and start time are in the file). Only the chief process (see
``Strategy.is_chief``) takes the lock.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tpulm import rundir, storage
from tpulm.errors import TpulmError

log = logging.getLogger(__name__)


def _me() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "time": time.strftime(
        "%Y-%m-%dT%H:%M:%S%z")}


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


def acquire(run_dir: str) -> str:
    """Take the run dir's lock; returns the lock file.

    Raises:
        TpulmError: another live process holds it (the message names host, pid and start time).
    """
    storage.makedirs(run_dir)
    path = storage.join(run_dir, rundir.LOCK_NAME)
    me = _me()
    for _ in range(2):
        if _create(path, me):
            return path
        held = _holder(path)
        same_host = held.get("host") == me["host"]
        pid = held.get("pid")
        if same_host and isinstance(pid, int) and not _alive(pid):
            log.warning("taking over %s, left by process %d on this host, which is gone", path, pid)
            storage.remove(path)
            continue
        raise TpulmError(
            f"{run_dir} is in use by another trainer (host {held.get('host', '?')}, pid "
            f"{held.get('pid', '?')}, since {held.get('time', '?')}); wait for it, or delete "
            f"{path} if that process is gone")
    raise TpulmError(f"cannot take the lock {path}: another trainer took it just now")


def release(path: str) -> None:
    """Remove the lock if it is still ours."""
    held = _holder(path)
    if held.get("pid") == os.getpid() and held.get("host") == socket.gethostname():
        storage.remove(path)


@contextmanager
def hold(run_dir: str, enabled: bool = True) -> Iterator[None]:
    """Hold the run dir's lock for the duration of the block (no-op when not ``enabled``)."""
    if not enabled:
        yield
        return
    path = acquire(run_dir)
    try:
        yield
    finally:
        release(path)
