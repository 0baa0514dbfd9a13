"""`tpulm run` command lines with a tiny budget, shared by the end-to-end and concurrency tests."""

from __future__ import annotations

import sys
from pathlib import Path

TINY_BUDGET = [
    "tokenizer.vocab_size=2000",
    "data.shard_size=200",
    'train.model="tiny"',
    'train.jit_compile="false"',  # seconds of XLA:CPU compiles per run; XLA is tested elsewhere
    "train.batch_size=8",
    "train.log_every=2",
    "train.eval_every=6",
    "train.checkpoint_every=4",
    "train.shuffle_buffer=200",
    "evaluate.epochs=1",  # the demo's downstream stage, pretrained and from scratch, kept short
    "evaluate.max_length=32",
    "evaluate.batch_size=64",
]


def tpulm_run_argv(work_dir: Path, *overrides: str, max_steps: int = 12) -> list[str]:
    """``tpulm run`` of the demo into ``work_dir`` with the tiny budget; ``overrides`` are
    ``TABLE.KEY=VALUE`` settings or ``--flags``."""
    argv = [sys.executable, "-m", "tpulm", "run", "--work-dir", str(work_dir)]
    for assignment in [*TINY_BUDGET, f"train.max_steps={max_steps}", *overrides]:
        argv += [assignment] if assignment.startswith("--") else ["--set", assignment]
    return argv
