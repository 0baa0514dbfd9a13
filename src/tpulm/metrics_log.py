"""``metrics.jsonl``: its one writer (``MetricsLog``, training) and its one reader (``read_metrics``).

Each line is a JSON object ``{"split": "train" | "eval", "step": int, "time": seconds since the
run started, "tokens": tokens seen so far, ...}`` plus the figures of that split (``FIELDS``):
train lines carry ``loss``, ``accuracy``, ``learning_rate``, ``tokens_per_second``; eval lines
carry ``loss``, ``accuracy``, ``perplexity`` (all over masked positions only). A run killed
mid-write may leave an unterminated last line: every reader skips it, and a resumed run drops it.

Keras-free; TensorFlow is imported only to write TensorBoard scalars.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any

from tpulm import ownership, rundir, storage
from tpulm.errors import TpulmError

log = logging.getLogger(__name__)

# The figures every line of a split carries (besides split, step, time, tokens).
FIELDS = {
    "train": ("loss", "accuracy", "learning_rate", "tokens_per_second"),
    "eval": ("loss", "accuracy", "perplexity"),
}
COMMON = ("step", "time", "tokens")

def _parse_line(line: str, where: str) -> dict[str, Any] | None:
    """One record, or None for a split this report does not know (the format may grow)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise TpulmError(f"{where}: not valid JSON ({err.msg}); fix or delete this line") from None
    if not isinstance(record, dict):
        raise TpulmError(f"{where}: expected a JSON object, got {type(record).__name__}")
    split = record.get("split")
    if split not in FIELDS:
        log.debug("%s: skipping split %r", where, split)
        return None
    for name in (*COMMON, *FIELDS[split]):
        value = record.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TpulmError(f"{where}: {split} record needs a number {name!r}, got {value!r}")
    if not isinstance(record["step"], int):
        raise TpulmError(f"{where}: 'step' must be an integer, got {record['step']!r}")
    return record


def read_metrics(path: str) -> list[dict[str, Any]]:
    """The train and eval records of a ``metrics.jsonl`` file, in file order.

    Args:
        path: the file, local or any ``tf.io.gfile`` scheme.

    Returns:
        One dict per train or eval line; lines of other splits are skipped.

    Raises:
        TpulmError: the file is missing, or a line is empty, not JSON or lacks a figure (the
            message names the file and the line number). Only an unterminated last line, as a
            run killed mid-write leaves, is skipped with a warning.
    """
    if not storage.exists(path):
        raise TpulmError(f"{path} does not exist: train a model into this run dir first")
    text = storage.read_text(path)
    lines = text.split("\n")
    records = []
    for number, line in enumerate(lines, start=1):
        where = f"{path}:{number}"
        last = number == len(lines)
        if last and not line:
            break  # the file ends with a newline, as it should
        if not line.strip():
            raise TpulmError(f"{where}: empty line; delete it")
        try:
            record = _parse_line(line, where)
        except TpulmError:
            if last:  # unterminated: the writer was killed in the middle of this line
                log.warning("%s: skipping the unfinished last line", where)
                break
            raise
        if record is not None:
            records.append(record)
    return records


class MetricsLog:
    """Appends ``metrics.jsonl`` lines (format in ``tpulm.rundir``) and TensorBoard scalars.

    On resume, lines past the checkpoint's step (written by the interrupted run, and about to be
    redone) are dropped, so the file reads as one uninterrupted run.

    Args:
        run_dir: the run dir.
        resume_step: step of the checkpoint training starts from (0 for a fresh run).
        time_offset: training seconds already spent before ``resume_step``.
        writer: this process writes the run dir's shared files (the chief); others write nothing.
    """

    def __init__(self, run_dir: str, resume_step: int = 0, time_offset: float = 0.0,
                 writer: bool = True):
        self.path = storage.join(run_dir, rundir.METRICS_NAME)
        self.writer = writer
        self.start = time.monotonic() - time_offset
        self._writers: dict = {}
        self._tb_dir = storage.join(run_dir, rundir.TENSORBOARD_DIR)
        self._lines = self._kept_lines(resume_step) if writer else []
        if writer:
            storage.write_text(self.path, "".join(self._lines))
            ownership.record(run_dir, (rundir.METRICS_NAME,), "train", append=True)  # grows

    def _kept_lines(self, resume_step: int) -> list[str]:
        if not storage.exists(self.path):
            return []
        return [json.dumps(r) + "\n" for r in read_metrics(self.path) if r["step"] <= resume_step]

    def last(self, split: str) -> dict[str, Any] | None:
        """The last line of ``split`` kept or written so far (None if there is none)."""
        records = [json.loads(line) for line in self._lines]
        return next((r for r in reversed(records) if r["split"] == split), None)

    def elapsed(self) -> float:
        """Training seconds, including those of earlier (resumed) sessions."""
        return time.monotonic() - self.start

    def write(self, split: str, step: int, tokens: int, values: dict[str, float]) -> dict:
        """Append one line and the matching TensorBoard scalars; returns the line."""
        line = {"split": split, "step": step, "time": round(self.elapsed(), 3), "tokens": tokens}
        line.update({k: float(v) for k, v in values.items()})
        text = json.dumps(line) + "\n"
        if not self.writer:
            return line
        self._lines.append(text)
        if storage.is_remote(self.path):  # object stores cannot append: rewrite (small file)
            storage.write_text(self.path, "".join(self._lines))
        else:
            with storage.open_file(self.path, "a") as f:
                f.write(text)
        self._scalars(split, step, values)
        return line

    def _scalars(self, split: str, step: int, values: dict[str, float]) -> None:
        import tensorflow as tf

        if split not in self._writers:
            self._writers[split] = tf.summary.create_file_writer(storage.join(self._tb_dir, split))
        # tf.summary.write with the scalars plugin's metadata is what tf.summary.scalar does,
        # without needing the tensorboard package installed.
        metadata = tf.compat.v1.SummaryMetadata(
            plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars")
        )
        with self._writers[split].as_default():
            for key, value in values.items():
                if math.isfinite(value):
                    tf.summary.write(key, tf.constant(value, tf.float32), step=step, metadata=metadata)
            self._writers[split].flush()
