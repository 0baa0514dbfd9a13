"""One writer per output, in real processes: a second `tpulm run` on a work dir in use, a
`--restart train` under a live trainer, and a second `data prepare` into an output being written
stop at once, in one line naming the holder; nothing of the first one's work is touched.

The first process is frozen (SIGSTOP) as soon as its lock is observed, so the second always meets
a live holder however fast or slow this machine is.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.runs import tpulm_run_argv
from support.training import make_tokenizer, wikitext_lines

from tpulm import lock

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "HF_HUB_OFFLINE": "1",
       "PYTHONPATH": os.pathsep.join(sys.path)}


def _wait_for(path: Path, process: subprocess.Popen, log: Path, timeout: float = 400) -> dict:
    """The holder named in lock file ``path`` once it appears (the process must still run)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            pass
        if process.poll() is not None:
            pytest.fail(f"{process.args[3:5]} ended before {path} appeared: {log.read_text()}")
        time.sleep(0.05)
    pytest.fail(f"{path} did not appear")


def _refused(argv: list[str]) -> str:
    """Run ``argv``, which must stop with exit 2 and one line on stderr; returns that line."""
    started = time.monotonic()
    done = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert time.monotonic() - started < 120  # at once: no stage work before the refusal
    return lines[0]


def test_second_run_and_restart_under_a_live_trainer_are_refused(tmp_path):
    work, log = tmp_path / "work", tmp_path / "first.log"
    with open(log, "wb") as out:
        first = subprocess.Popen(tpulm_run_argv(work, max_steps=400), env=ENV, stdout=out,
                                 stderr=subprocess.STDOUT)
    try:
        assert _wait_for(work / lock.LOCK_NAME, first, log)["pid"] == first.pid
        line = _refused(tpulm_run_argv(work))  # two `tpulm run` on one new work dir
        assert f"is in use by another tpulm run (host " in line and f"pid {first.pid}," in line
        trainer = _wait_for(work / "run" / lock.LOCK_NAME, first, log)  # training now
        first.send_signal(signal.SIGSTOP)
        assert trainer["pid"] == first.pid and trainer["holder"] == "trainer"
        before = sorted(os.listdir(work / "run"))
        line = _refused(tpulm_run_argv(work, "--restart=train", max_steps=400))
        assert f"pid {first.pid}," in line and "in use by another tpulm run" in line
        assert sorted(os.listdir(work / "run")) == before  # the live run dir was left alone
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()


def test_two_prepares_into_one_output(tmp_path, wikitext_dir):
    tok = make_tokenizer(tmp_path / "tok", wikitext_lines(wikitext_dir, "valid", 2000), 500)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((wikitext_dir / "valid.txt").read_text(encoding="utf-8"), encoding="utf-8")
    out, log = tmp_path / "out", tmp_path / "first.log"

    def prepare(max_length: int) -> list[str]:
        return [sys.executable, "-m", "tpulm", "data", "prepare", "--tokenizer", str(tok),
                "--output", str(out), "--train-files", str(corpus), "--max-length",
                str(max_length), "--shard-size", "40", "--progress", "false"]

    with open(log, "wb") as stream:
        first = subprocess.Popen(prepare(100), env=ENV, stdout=stream, stderr=subprocess.STDOUT)
    try:
        assert _wait_for(out / lock.LOCK_NAME, first, log)["pid"] == first.pid
        first.send_signal(signal.SIGSTOP)
        line = _refused(prepare(50))
        assert f"out is in use by another tpulm data prepare (host " in line
        assert f"pid {first.pid}," in line
    finally:
        first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=300) == 0, log.read_text()
    manifest = json.loads((out / "train" / "manifest.json").read_text())
    assert manifest["max_length"] == 100 and not (out / lock.LOCK_NAME).exists()
    line = _refused(prepare(50))  # after it: the settings differ, said as before
    assert "max_length" in line or "max-length" in line
