"""One trainer per run dir: a live holder is named and refused; a dead one's lock is taken over."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tpulm import rundir
from tpulm.errors import TpulmError
from tpulm import lock

HOLD = "import sys, time; from tpulm import lock; lock.acquire(sys.argv[1]); print('held', flush=True); time.sleep(120)"


def _holder(run_dir) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_process_is_refused_then_takes_over_a_dead_holders_lock(tmp_path, caplog):
    run_dir = tmp_path / "run"
    holder = _holder(run_dir)
    try:
        with pytest.raises(TpulmError, match=rf"in use by another trainer \(host "
                                             rf"{socket.gethostname()}, pid {holder.pid}, since"):
            lock.acquire(str(run_dir))
    finally:
        holder.send_signal(signal.SIGKILL)  # dies without releasing: a stale lock
        holder.wait()
    assert json.loads((run_dir / rundir.LOCK_NAME).read_text())["pid"] == holder.pid
    with lock.hold(str(run_dir)):
        assert f"left by process {holder.pid} on this host" in caplog.text
        assert json.loads((run_dir / rundir.LOCK_NAME).read_text())["pid"] == os.getpid()
    assert not (run_dir / rundir.LOCK_NAME).exists()  # released
    assert sorted(p.name for p in run_dir.iterdir()) == []  # no temporaries left


def test_lock_of_another_host_is_never_taken_over(tmp_path):
    (tmp_path / rundir.LOCK_NAME).write_text(json.dumps(
        {"host": "elsewhere", "pid": 1, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}))
    with pytest.raises(TpulmError, match=r"host elsewhere, pid 1,.*delete .*lock.json if that process"):
        lock.acquire(str(tmp_path))
    assert (tmp_path / rundir.LOCK_NAME).exists()
