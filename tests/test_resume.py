"""Exact resume: a training process killed with SIGKILL between checkpoints, then rerun, ends
bit-identical to an uninterrupted run (CPU, fixed seed, dropout on, XLA on)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from support.training import (
    comparable_metrics as _comparable,
)
from support.training import (
    logged_train_steps as _train_steps,
)
from support.training import (
    small_corpus,
    train_command,
)
from support.training import (
    subprocess_env as _env,
)

from tpulm import rundir

STEPS, EVERY = 30, 10


def _command(corpus: dict, run_dir: Path) -> list[str]:
    return train_command(corpus, run_dir, STEPS, EVERY)


def test_sigkill_between_checkpoints_then_rerun_is_bit_identical(tmp_path, wikitext_dir):
    corpus = small_corpus(tmp_path / "data", wikitext_dir)
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    ref_proc = subprocess.Popen(_command(corpus, reference), env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc = subprocess.Popen(_command(corpus, killed), env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not any(s > EVERY + 2 for s in _train_steps(killed)):  # past ckpt 10, well before 20
        assert proc.poll() is None and time.monotonic() < deadline, "training ended before the kill"
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    at_kill = max(_train_steps(killed))
    assert at_kill < 2 * EVERY, f"killed too late (step {at_kill})"
    assert [s for s, _ in rundir.list_checkpoints(str(killed))] == [EVERY]

    rerun = subprocess.run(_command(corpus, killed), env=_env(), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"steps {EVERY} -> {STEPS}" in rerun.stderr  # lost only the steps after ckpt 10
    assert "steps        30 (20 this run)" in rerun.stdout
    assert ref_proc.wait(timeout=600) == 0, ref_proc.stderr.read()[-3000:]

    for step in (2 * EVERY, STEPS):
        for name in (rundir.MODEL_WEIGHTS, rundir.OPTIMIZER_WEIGHTS):
            a = Path(rundir.checkpoint_dir(str(reference), step)) / name
            b = Path(rundir.checkpoint_dir(str(killed), step)) / name
            assert a.read_bytes() == b.read_bytes(), f"{name} of step {step} differs"
    assert _comparable(killed) == _comparable(reference)  # same losses, evals, one line per step
