"""Stopping cleanly on SIGTERM (preemption) and SIGINT (Ctrl-C): finish the step, save, exit.

A preemptible TPU/GPU VM gets SIGTERM about 30 s before it goes. While training runs, both
signals only set a flag; the callback checks it after every compiled call (one step, or one
block of ``steps_per_execution`` steps), stops ``fit``, and the trainer writes a checkpoint of
that step and raises ``errors.Interrupted`` naming it. A second signal stops at once
(KeyboardInterrupt), losing the steps since the last checkpoint, as before.

Several processes must stop after the same step, or the ones still training wait forever in a
collective. On JAX each process's flag is combined with an all-gather after every call when
there is more than one process (``multihost_utils.process_allgather``), and JAX's own
preemption notice (``multihost_utils.reached_preemption_sync_point``, available when the
coordination service runs the preemption sync manager) is honoured too. Neither is exercised
by the test suite (it has no multi-process setup); TensorFlow multi-worker runs
(``MultiWorkerMirroredStrategy``) rely on every worker receiving the signal, as a whole-slice
preemption does, and are also not verified (``tf.distribute.experimental.
PreemptionCheckpointHandler`` does this for ``tf.train.Checkpoint``, which tpulm does not use).
"""

from __future__ import annotations

import logging
import signal
import threading

import keras
import numpy as np

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preemption:
    """A context that turns SIGTERM / SIGINT into a request to stop after the current call.

    Handlers are installed only in the main thread (Python allows no other) and the previous
    ones are put back on exit.
    """

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> Preemption:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:  # asked twice: stop now
            raise KeyboardInterrupt
        self.signum = signum
        log.warning("%s received: finishing the current step, then saving a checkpoint "
                    "(send it again to stop at once)", signal.Signals(signum).name)

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum or 0)

    def agreed(self, step: int) -> bool:
        """Whether to stop after ``step``: this process's flag, combined across processes."""
        local = self.signum is not None
        if keras.backend.backend() != "jax":
            return local
        import jax

        if jax.process_count() == 1:
            return local
        from jax.experimental import multihost_utils

        try:  # the coordination service's own notice, when it runs the preemption sync manager
            local = local or bool(multihost_utils.reached_preemption_sync_point(step))
        except Exception:  # not initialised for preemption: the all-gather alone decides
            pass
        flags = multihost_utils.process_allgather(np.asarray([int(local)], np.int32))
        if flags.max() and self.signum is None:
            self.signum = signal.SIGTERM  # another process was told
        return bool(flags.max())

    def callback(self, accumulation: int = 1) -> StopOnSignal:
        return StopOnSignal(self, accumulation)


class StopOnSignal(keras.callbacks.Callback):
    """Stops ``fit`` after the compiled call during which a signal came (see ``Preemption``).

    With gradient accumulation it stops only after a call that ends on an optimizer update
    (``batch`` counts micro-batches within the Keras epoch, which starts on an update), so the
    checkpoint never holds half-accumulated gradients.
    """

    def __init__(self, preemption: Preemption, accumulation: int = 1):
        super().__init__()
        self.preemption = preemption
        self.accumulation = accumulation
        self.stopped = False

    def on_train_batch_end(self, batch, logs=None):
        from tpulm.training.callbacks import optimizer_step

        if self.stopped or (batch + 1) % self.accumulation:
            return
        if self.preemption.agreed(optimizer_step(self.model)):
            self.stopped = True
            self.model.stop_training = True
