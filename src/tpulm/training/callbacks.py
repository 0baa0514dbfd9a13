"""Keras callbacks of the training loop: per-step monitoring and segment-end bookkeeping."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable

import keras


def optimizer_step(model) -> int:
    """Optimizer updates done (Keras divides by the accumulation steps), as a Python int."""
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


class NonFiniteLoss(Exception):
    """The training loss became NaN or Inf; ``step`` is the first step seen with it."""

    def __init__(self, step: int):
        super().__init__(step)
        self.step = step


class StepMonitor(keras.callbacks.Callback):
    """Adds ``lr`` and ``tokens_per_second`` to the logs, stops on a non-finite loss or at the end,
    and shows one progress line over the whole run (Keras' own per-"epoch" bars are off: its
    epochs are only segments of one run).

    Args:
        learning_rate: update step -> learning rate (Python, no device round trip).
        tokens_per_step: token positions per optimizer step (global batch x sequence length).
        total_steps: the step to stop at.
        progress: 0 silent, 1 a line redrawn in place (a terminal), 2 plain lines (logs, pipes).
        every: seconds between progress updates.
    """

    def __init__(self, learning_rate: Callable[[int], float], tokens_per_step: int,
                 total_steps: int, progress: int = 0, every: float = 5.0):
        super().__init__()
        self.learning_rate = learning_rate
        self.tokens_per_step = tokens_per_step
        self.total_steps = total_steps
        self.progress, self.every = progress, (1.0 if progress == 1 else every)
        self.step = 0
        self.tokens_per_second = float("nan")
        self._run_start: tuple[float, int] | None = None  # (time, step) of the first batch seen
        self._shown = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._start_time = time.monotonic()
        self._start_step = optimizer_step(self.model)
        if self._run_start is None:
            self._run_start = (self._start_time, self._start_step)

    def on_train_batch_end(self, batch, logs=None):
        logs = logs if logs is not None else {}
        self.step = optimizer_step(self.model)
        loss = logs.get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            raise NonFiniteLoss(self.step)
        seconds = max(time.monotonic() - self._start_time, 1e-9)
        logs["lr"] = self.learning_rate(max(self.step - 1, 0))
        self.tokens_per_second = (self.step - self._start_step) * self.tokens_per_step / seconds
        logs["tokens_per_second"] = self.tokens_per_second
        self._show(logs)
        if self.step >= self.total_steps:
            self.model.stop_training = True

    def _show(self, logs: dict) -> None:
        now, last = time.monotonic(), self.step >= self.total_steps
        if not self.progress or (now - self._shown < self.every and not last):
            return
        self._shown = now
        line = progress_line(self.step, self.total_steps, logs, self.tokens_per_second,
                             self._eta(now))
        if self.progress == 1:
            sys.stdout.write("\r" + line.ljust(100) + ("\n" if last else ""))
        else:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def _eta(self, now: float) -> float | None:
        start_time, start_step = self._run_start or (now, self.step)
        done = self.step - start_step
        return (now - start_time) / done * (self.total_steps - self.step) if done > 0 else None


def progress_line(step: int, total: int, logs: dict, tokens_per_second: float,
                  eta: float | None) -> str:
    """``step 120/2000 (6%)  loss 6.1234  masked acc 0.1234  12,345 tokens/s  ETA 3m20s``."""
    parts = [f"step {step}/{total} ({100 * step / max(total, 1):.0f}%)"]
    if "loss" in logs:
        parts.append(f"loss {float(logs['loss']):.4f}")
    if "accuracy" in logs:
        parts.append(f"masked acc {float(logs['accuracy']):.4f}")
    if math.isfinite(tokens_per_second):
        parts.append(f"{tokens_per_second:,.0f} tokens/s")
    if eta is not None:
        minutes, secs = divmod(int(eta), 60)
        parts.append(f"ETA {minutes // 60}h{minutes % 60:02d}m" if minutes >= 60
                     else f"ETA {minutes}m{secs:02d}s")
    return "  ".join(parts)


class SegmentEnd(keras.callbacks.Callback):
    """Calls ``handler(step, logs)`` at the end of every segment (Keras epoch)."""

    def __init__(self, handler: Callable[[int, dict], None]):
        super().__init__()
        self.handler = handler

    def on_epoch_end(self, epoch, logs=None):
        self.handler(optimizer_step(self.model), dict(logs or {}))
