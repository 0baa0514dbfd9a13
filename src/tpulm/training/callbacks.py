"""Keras callbacks of the training loop: per-step monitoring and segment-end bookkeeping."""

from __future__ import annotations

import math
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
    """Adds ``lr`` and ``tokens_per_second`` to the logs, stops on a non-finite loss or at the end.

    Args:
        learning_rate: update step -> learning rate (Python, no device round trip).
        tokens_per_step: token positions per optimizer step (global batch x sequence length).
        total_steps: the step to stop at.
    """

    def __init__(self, learning_rate: Callable[[int], float], tokens_per_step: int, total_steps: int):
        super().__init__()
        self.learning_rate = learning_rate
        self.tokens_per_step = tokens_per_step
        self.total_steps = total_steps
        self.step = 0
        self.tokens_per_second = float("nan")

    def on_epoch_begin(self, epoch, logs=None):
        self._start_time = time.monotonic()
        self._start_step = optimizer_step(self.model)

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
        if self.step >= self.total_steps:
            self.model.stop_training = True


class SegmentEnd(keras.callbacks.Callback):
    """Calls ``handler(step, logs)`` at the end of every segment (Keras epoch)."""

    def __init__(self, handler: Callable[[int, dict], None]):
        super().__init__()
        self.handler = handler

    def on_epoch_end(self, epoch, logs=None):
        self.handler(optimizer_step(self.model), dict(logs or {}))
