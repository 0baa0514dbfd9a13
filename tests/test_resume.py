"""Exact resume: a training process killed with SIGKILL between checkpoints, then rerun, ends
bit-identical to an uninterrupted run (CPU, fixed seed, dropout on, XLA on)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from support.training import small_corpus

from tpulm import rundir

STEPS, EVERY = 30, 10


def _command(corpus: dict, run_dir: Path) -> list[str]:
    return [
        sys.executable, "-m", "tpulm", "train", "--model", "tiny",
        "--train-data", str(corpus["train"]), "--eval-data", str(corpus["valid"]),
        "--tokenizer", str(corpus["tokenizer"]), "--run-dir", str(run_dir),
        "--batch-size", "8", "--max-steps", str(STEPS), "--checkpoint-every", str(EVERY),
        "--keep-checkpoints", "5", "--log-every", "1", "--eval-every", "15",
        "--learning-rate", "1e-3", "--progress", "false", "--peak-tflops", "1",
    ]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def _train_steps(run_dir: Path) -> list[int]:
    path = run_dir / rundir.METRICS_NAME
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line being written
        if record["split"] == "train":
            steps.append(record["step"])
    return steps


def _comparable(run_dir: Path) -> list[dict]:
    drop = {"time", "tokens_per_second"}
    lines = [json.loads(x) for x in (run_dir / rundir.METRICS_NAME).read_text().splitlines()]
    return [{k: v for k, v in x.items() if k not in drop} for x in lines]


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
