"""The layout of a run dir, shared by training (writer), export, fill-mask and reports (readers).

```
RUN_DIR/
  config.toml                    resolved settings; its [model] table rebuilds the model
  tokenizer/                     copy of the tokenizer folder the model was trained with
  checkpoints/ckpt-<step>/       one folder per checkpoint, written under a temporary name and
    model.safetensors            renamed when complete (tpulm.model.weights format, keyed by variable path)
    optimizer.safetensors
    state.json                   step, epoch, data position, tokens seen, seed ...
  metrics.jsonl                  one JSON object a line (tpulm.metrics_log)
  tensorboard/                   TensorBoard event files
  export/                        Transformers checkpoint written by `tpulm export`
  lock.json                      held by the training process (tpulm.lock)
```

``metrics.jsonl``: format, writer and reader in :mod:`tpulm.metrics_log`.
"""

from __future__ import annotations

import posixpath
import re

from tpulm import storage
from tpulm.errors import TpulmError

CONFIG_NAME = "config.toml"
TOKENIZER_DIR = "tokenizer"
CHECKPOINTS_DIR = "checkpoints"
METRICS_NAME = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
EXPORT_DIR = "export"
MODEL_WEIGHTS = "model.safetensors"
OPTIMIZER_WEIGHTS = "optimizer.safetensors"
STATE_NAME = "state.json"
LOCK_NAME = "lock.json"
# `tpulm run` keeps a record per stage in WORK/stages/, beside its run dir WORK/run
# (tpulm.pipeline.engine.STAGES_DIR): how a run dir tells which command made it.
PIPELINE_RECORDS = ("stages", "train.json")
# Everything tpulm writes at the top of a run dir (what `import --overwrite` may replace).
NAMES = frozenset({CONFIG_NAME, TOKENIZER_DIR, CHECKPOINTS_DIR, METRICS_NAME, TENSORBOARD_DIR,
                   EXPORT_DIR, LOCK_NAME})
_CHECKPOINT = re.compile(r"^ckpt-(\d+)$")


def made_by(run_dir: str) -> str:
    """The command that made ``run_dir``, as a user would type it."""
    work_dir = posixpath.dirname(run_dir.rstrip("/"))
    if storage.exists(storage.join(work_dir or ".", *PIPELINE_RECORDS)):
        return f"tpulm run --work-dir {work_dir or '.'}"
    return f"tpulm train --run-dir {run_dir.rstrip('/')}"


def checkpoint_dir(run_dir: str, step: int) -> str:
    """Folder of the checkpoint taken after ``step`` optimizer steps."""
    return storage.join(run_dir, CHECKPOINTS_DIR, f"ckpt-{step:09d}")


def list_checkpoints(run_dir: str) -> list[tuple[int, str]]:
    """Complete checkpoints as (step, folder), oldest first; unfinished temporaries are skipped."""
    root = storage.join(run_dir, CHECKPOINTS_DIR)
    if not storage.isdir(root):
        return []
    found = []
    for name in storage.listdir(root):
        match = _CHECKPOINT.match(name)
        if match:
            found.append((int(match.group(1)), storage.join(root, name)))
    return sorted(found)


def latest_checkpoint(run_dir: str) -> tuple[int, str] | None:
    """The newest complete checkpoint as (step, folder), or None."""
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1] if checkpoints else None


def run_checkpoint(run_dir: str, step: int | None = None) -> tuple[int, str]:
    """``(step, path of model.safetensors)`` of checkpoint ``step``, or of the latest one.

    Args:
        run_dir: a run dir (local or remote).
        step: the checkpoint's step; None for the latest.
    """
    found = dict(list_checkpoints(run_dir))
    if not found:
        raise TpulmError(f"run dir {run_dir} has no checkpoint yet; train first (`tpulm train`)")
    if step is None:
        step = max(found)
    elif step not in found:
        raise TpulmError(
            f"run dir {run_dir} has no checkpoint of step {step}; it has steps {sorted(found)}"
        )
    return step, storage.join(found[step], MODEL_WEIGHTS)
