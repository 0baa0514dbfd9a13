"""Preemption: SIGTERM (then SIGINT on the rerun) during real `tpulm train` processes finishes the
step, checkpoints it, exits naming the checkpoint; rerunning ends identical to an uninterrupted run.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

from support.training import (
    comparable_metrics,
    logged_train_steps,
    small_corpus,
    subprocess_env,
    train_command,
)

from tpulm import rundir
from tpulm.training import checkpoint

STEPS, EVERY = 30, 10


def _interrupt(command: list[str], run_dir: Path, past: int, sig: signal.Signals) -> tuple[int, str]:
    """Start training, send ``sig`` once a step after ``past`` is logged; (exit code, stderr)."""
    proc = subprocess.Popen(command, env=subprocess_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not any(s > past for s in logged_train_steps(run_dir)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.002)
    proc.send_signal(sig)
    return proc.wait(timeout=120), proc.stderr.read()


def _stopped_at(stderr: str, name: str, code: int, expected_code: int, run_dir: Path) -> int:
    assert code == expected_code, stderr[-3000:]
    match = re.search(rf"tpulm: stopped by {name} after step (\d+); saved checkpoint (\S+);", stderr)
    assert match, stderr[-3000:]
    step = int(match.group(1))
    assert match.group(2) == rundir.checkpoint_dir(str(run_dir), step)
    assert checkpoint.problem(match.group(2), step) is None  # complete and valid
    assert max(logged_train_steps(run_dir)) == step  # finished the step it was in, no more
    return step


def test_sigterm_and_sigint_checkpoint_then_rerun_is_bit_identical(tmp_path, wikitext_dir):
    corpus = small_corpus(tmp_path / "data", wikitext_dir)
    reference, stopped = tmp_path / "reference", tmp_path / "stopped"
    command = train_command(corpus, stopped, STEPS, EVERY)
    ref_proc = subprocess.Popen(train_command(corpus, reference, STEPS, EVERY), env=subprocess_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    code, err = _interrupt(command, stopped, EVERY + 2, signal.SIGTERM)
    first = _stopped_at(err, "SIGTERM", code, 143, stopped)
    assert first % EVERY and first < 2 * EVERY, first  # between periodic checkpoints
    assert [s for s, _ in rundir.list_checkpoints(str(stopped))] == [EVERY, first]
    assert not (stopped / rundir.LOCK_NAME).exists()  # released on the way out

    code, err = _interrupt(command, stopped, 2 * EVERY + 2, signal.SIGINT)
    assert f"steps {first} -> {STEPS}" in err  # resumed from the SIGTERM checkpoint
    second = _stopped_at(err, "SIGINT", code, 130, stopped)
    assert second % EVERY and second < STEPS, second

    rerun = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"steps {second} -> {STEPS}" in rerun.stderr
    assert ref_proc.wait(timeout=600) == 0, ref_proc.stderr.read()[-3000:]
    for name in (rundir.MODEL_WEIGHTS, rundir.OPTIMIZER_WEIGHTS):
        a = Path(rundir.checkpoint_dir(str(reference), STEPS)) / name
        b = Path(rundir.checkpoint_dir(str(stopped), STEPS)) / name
        assert a.read_bytes() == b.read_bytes(), f"{name} of step {STEPS} differs"
    assert comparable_metrics(stopped) == comparable_metrics(reference)  # one line per step
