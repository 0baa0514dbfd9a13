"""Helpers of the JAX tests: a small real corpus, and jobs run on the JAX backend in a subprocess.

The test process imports Keras on TensorFlow, and Keras fixes its backend at import, so JAX runs
happen in ``tests/support/jax_worker.py`` subprocesses with ``KERAS_BACKEND=jax`` and 4 virtual CPU
devices (``--xla_force_host_platform_device_count=4``). No test functions here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.training import blocks, make_tokenizer, wikitext_lines, write_shards

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
SRC = TESTS.parent / "src"
DEVICES = 4


def corpus(out: Path, wikitext_dir: Path, max_length: int = 32) -> dict[str, str]:
    """Tokenizer (vocab 500) + train (3 shards, ~830 blocks) and valid (2 shards) of WikiText-2."""
    tok = make_tokenizer(out / "tokenizer", wikitext_lines(wikitext_dir, "valid", 2000), 500)
    ids, mask = blocks(tok, wikitext_lines(wikitext_dir, "valid", 120), max_length)
    write_shards(out / "train", ids, mask, 3)
    ids, mask = blocks(tok, wikitext_lines(wikitext_dir, "test", 20), max_length)
    write_shards(out / "valid", ids, mask, 2)
    return {"tokenizer": str(tok), "train_data": str(out / "train"), "eval_data": str(out / "valid")}


def train_config(data: dict[str, str], run_dir: Path, **overrides) -> dict:
    """``TrainConfig`` fields of a short tiny-model run (6 steps, checkpoints every 3, no eval).

    A fixed ``peak_tflops`` skips the matmul measurement for the MFU estimate (seconds per run).
    """
    return {
        "train_data": data["train_data"], "tokenizer": data["tokenizer"], "run_dir": str(run_dir),
        "peak_tflops": 1.0, "model": "tiny", "batch_size": 8, "max_steps": 6,
        "learning_rate": 1e-3, "warmup": 2.0, "log_every": 1, "eval_every": 6,
        "checkpoint_every": 3, "keep_checkpoints": 5, "shuffle_buffer": 100, "progress": False,
        **overrides,
    }


def start_jax(jobs: list[dict], work: Path, devices: int = DEVICES,
              env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
    """Start ``jobs`` (see ``jax_worker``) on the JAX backend in a subprocess; see ``finish_jax``.

    Args:
        jobs: the jobs.
        work: folder for the job and result files (one per subprocess).
        devices: virtual CPU devices of the subprocess.
        env: extra environment (e.g. ``JAX_COORDINATOR_ADDRESS`` for a multi-process run).
    """
    work.mkdir(parents=True, exist_ok=True)
    jobs_path, results_path = work / "jobs.json", work / "results.json"
    jobs_path.write_text(json.dumps(jobs))
    env = {
        **os.environ,
        "KERAS_BACKEND": "jax",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "TF_CPP_MIN_LOG_LEVEL": "3",
        **(env or {}),
    }
    proc = subprocess.Popen(
        [sys.executable, str(SUPPORT / "jax_worker.py"), str(jobs_path), str(results_path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    return proc, results_path


def finish_jax(started: tuple[subprocess.Popen, Path], timeout: float = 300) -> list[dict]:
    """Wait for a ``start_jax`` subprocess; the results of its jobs."""
    proc, results_path = started
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    if proc.returncode != 0:
        raise AssertionError(f"JAX worker failed ({proc.returncode}):\n{stderr[-6000:]}")
    results = json.loads(results_path.read_text())
    for result in results:
        if "losses" in result:
            result["losses"] = {int(k): v for k, v in result["losses"].items()}
    return results


def free_port() -> int:
    """A TCP port free on localhost now (for the JAX coordinator)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def run_jax(jobs: list[dict], work: Path, timeout: float = 300) -> list[dict]:
    """Run ``jobs`` on the JAX backend in one subprocess and wait; their results."""
    return finish_jax(start_jax(jobs, work), timeout)
