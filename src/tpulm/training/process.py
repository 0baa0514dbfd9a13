"""Settings of this training process, made before TensorFlow runs its first op.

CPU threads, op determinism and the Keras dtype policy are process-wide: the set-up
(``tpulm.training.setup.prepare``) applies them once, first.
"""

from __future__ import annotations

import logging
import os

from tpulm.errors import TpulmError

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "mixed_bfloat16", "mixed_float16")


def configure(precision: str, deterministic: bool) -> None:
    """CPU threads, then op determinism if asked, then the dtype policy (in that order)."""
    import tensorflow as tf

    configure_cpu_threads()  # first: before any TensorFlow op runs
    if deterministic:
        tf.config.experimental.enable_op_determinism()
    set_precision(precision)


def configure_cpu_threads() -> None:
    """On CPU-only machines run one op at a time, each op on all cores (before TF starts).

    TensorFlow's default runs as many ops in parallel as there are cores, each itself
    multi-threaded: on a few cores the oversubscription halves training speed. A
    ``TF_NUM_INTEROP_THREADS`` set by the user wins; a runtime already started is left alone.
    """
    import tensorflow as tf

    if os.environ.get("TF_NUM_INTEROP_THREADS") or tf.config.list_physical_devices("GPU"):
        return
    try:
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:  # the runtime is already initialised (e.g. a second run in-process)
        log.debug("TensorFlow already started: inter-op threads left at %d",
                  tf.config.threading.get_inter_op_parallelism_threads())


def set_precision(precision: str) -> None:
    """Set the global Keras dtype policy (``fp32`` = ``float32``); fp16 gets loss scaling in compile."""
    import keras

    if precision not in PRECISIONS:
        raise TpulmError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    keras.config.set_dtype_policy("float32" if precision == "fp32" else precision)
