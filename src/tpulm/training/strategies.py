"""Pick the ``tf.distribute`` strategy for the machine, precision and XLA, and cross-replica sums.

Strategies are found through a registry of (name, applies, build) entries tried in order: a TPU
when ``--tpu`` is given, ``MultiWorkerMirroredStrategy`` when ``TF_CONFIG`` names a cluster,
``MirroredStrategy`` over several GPUs, else the default single device (CPU or one GPU; nothing
is hard-coded). On Keras' JAX backend the ``jax_mesh`` entry applies instead: a device mesh
(``tpulm.training.jax_mesh``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable

from tpulm.errors import TpulmError
from tpulm.training import flops

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "mixed_bfloat16", "mixed_float16")


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where training runs.

    Attributes:
        tpu: ``local`` for a TPU VM, a TPU name, or None.
        tpu_zone: GCP zone of a named TPU.
        gcp_project: GCP project of a named TPU.
        mesh: ``data=D,model=M`` device mesh (JAX backend only), or None for data parallelism.
        model: the ``tpulm.model.config.ModelConfig`` (sizes the JAX mesh's layout map).
    """

    tpu: str | None = None
    tpu_zone: str | None = None
    gcp_project: str | None = None
    mesh: str | None = None
    model: object = None


@dataclasses.dataclass(frozen=True)
class _Entry:
    name: str
    applies: Callable[[Placement], bool]
    build: Callable[[Placement], object]


def _tpu(placement: Placement):
    import tensorflow as tf

    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu=placement.tpu, zone=placement.tpu_zone, project=placement.gcp_project
        )
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, tf.errors.OpError) as err:
        raise TpulmError(
            f"cannot reach TPU {placement.tpu!r} (--tpu, --tpu-zone, --gcp-project): {err}"
        ) from None
    return tf.distribute.TPUStrategy(resolver)


def _multi_worker(_: Placement):
    import tensorflow as tf

    return tf.distribute.MultiWorkerMirroredStrategy()


def _mirrored(_: Placement):
    import tensorflow as tf

    return tf.distribute.MirroredStrategy()


def _single(_: Placement):
    import tensorflow as tf

    return tf.distribute.get_strategy()  # the default strategy: one device, CPU or GPU


def _on_jax(placement: Placement) -> bool:
    import keras

    if keras.backend.backend() == "jax":
        return True
    if placement.mesh is not None:
        raise TpulmError("--mesh needs the JAX backend: add --backend jax (or drop --mesh)")
    return False


def _jax_mesh(placement: Placement):
    from tpulm.training import jax_mesh

    return jax_mesh.build(placement)


def _has_cluster(_: Placement) -> bool:
    spec = os.environ.get("TF_CONFIG")
    if not spec:
        return False
    try:
        cluster = json.loads(spec).get("cluster", {})
    except ValueError:
        raise TpulmError("TF_CONFIG is not valid JSON; fix or unset it") from None
    return sum(len(v) for v in cluster.values()) > 1


def _several_gpus(_: Placement) -> bool:
    import tensorflow as tf

    return len(tf.config.list_logical_devices("GPU")) > 1


STRATEGIES: list[_Entry] = [
    _Entry("jax_mesh", _on_jax, _jax_mesh),
    _Entry("tpu", lambda p: p.tpu is not None, _tpu),
    _Entry("multi_worker_mirrored", _has_cluster, _multi_worker),
    _Entry("mirrored", _several_gpus, _mirrored),
    _Entry("single_device", lambda p: True, _single),
]


def make_strategy(placement: Placement) -> tuple[object, str]:
    """The first registered strategy that applies, and its registry name.

    Args:
        placement: TPU settings; without a TPU the hardware decides.
    """
    for entry in STRATEGIES:
        if entry.applies(placement):
            strategy = entry.build(placement)
            log.info("strategy %s with %d replica(s)", entry.name, strategy.num_replicas_in_sync)
            return strategy, entry.name
    raise AssertionError("the single-device entry always applies")


def is_chief_task(task_type: str | None, task_id: int | None, cluster: dict | None) -> bool:
    """Whether a TensorFlow cluster task is the chief: the ``chief`` task, else worker 0 of a
    cluster without one, else (no cluster at all) the only process (as ``multi_worker_util``)."""
    if not cluster or task_type is None:
        return True
    if task_type == "chief":
        return True
    return task_type == "worker" and int(task_id or 0) == 0 and "chief" not in cluster


def is_chief(strategy) -> bool:
    """Whether this process writes the run dir's shared files (checkpoints, metrics.jsonl,
    config.toml, TensorBoard, the lock): JAX process 0, or the TensorFlow chief.

    A TPUStrategy has one client process (the chief); MultiWorkerMirroredStrategy asks its
    cluster resolver (TF_CONFIG); every other strategy runs in one process.
    """
    import keras

    if keras.backend.backend() == "jax":
        import jax

        return jax.process_index() == 0
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or type(strategy).__name__.startswith("TPUStrategy"):
        return True
    spec = resolver.cluster_spec().as_dict() if resolver.cluster_spec() else {}
    return is_chief_task(resolver.task_type, resolver.task_id, spec)


def data_loss_error() -> type:
    """TensorFlow's error for unreadable TFRecord data (tf.data reads the shards on every backend)."""
    import tensorflow as tf

    return tf.errors.DataLossError


JIT_MODES = ("auto", "true", "false")


def use_xla(strategy, mode: str = "auto", precision: str = "fp32") -> bool:
    """Whether to compile the train step with XLA under ``strategy``.

    ``auto``: XLA on GPUs and TPUs. On CPUs it depends on the precision (measured on 2 cores,
    TensorFlow 2.21, fused steps vs one op at a time): in float32 XLA:CPU's fusion wins (ModernBERT
    1.4x, RoBERTa 1.1x faster than oneDNN graph mode), but XLA:CPU runs bfloat16 matmuls without
    the AVX512-BF16/AMX instructions oneDNN uses, so ``mixed_bfloat16`` stays in graph mode
    (RoBERTa 1.5x, ModernBERT 1.2x faster there). ``true`` forces XLA where it works; ``false``
    turns it off. ``MirroredStrategy`` over CPU devices cannot place variables under XLA and
    always falls back (with one log line).

    Args:
        strategy: the ``tf.distribute`` strategy.
        mode: ``auto``, ``true`` or ``false`` (``--jit-compile``).
        precision: the training precision (``--precision``).
    """
    import tensorflow as tf

    if mode not in JIT_MODES:
        raise TpulmError(f"jit_compile must be one of {', '.join(JIT_MODES)}, got {mode!r}")
    if hasattr(strategy, "use_xla"):  # a JAX mesh
        return strategy.use_xla(mode)
    if mode == "false":
        return False
    on_cpu = not tf.config.list_logical_devices("GPU") and not isinstance(strategy, tf.distribute.TPUStrategy)
    several = strategy.num_replicas_in_sync > 1
    if several and any("CPU" in d.upper() for d in strategy.extended.worker_devices):
        log.info("XLA off: %s over CPU devices cannot place variables under XLA", type(strategy).__name__)
        return False
    if mode == "auto" and on_cpu and precision == "mixed_bfloat16":
        log.info("XLA off on CPU for mixed_bfloat16: oneDNN's bfloat16 kernels train faster than "
                 "XLA:CPU (--jit-compile true forces it)")
        return False
    return True


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


def needs_input_pipelines(strategy) -> bool:
    """True when each worker/host must read its own share of files (several input pipelines)."""
    import tensorflow as tf

    if hasattr(strategy, "needs_input_pipelines"):  # a JAX mesh: one pipeline per process
        return strategy.needs_input_pipelines()
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return strategy.extended.num_hosts > 1
    return False


def peak_flops(strategy) -> float:
    """Peak FLOP/s for MFU: a matmul measured on the strategy's devices, all of them together."""
    if hasattr(strategy, "peak_flops"):  # a JAX mesh measures its own devices
        return strategy.peak_flops()

    return flops.matmul_flops() * strategy.num_replicas_in_sync


def densify(values: list) -> list:
    """Dense tensors for gradients that TensorFlow returns as ``IndexedSlices`` (embeddings).

    Keras' global-norm clipping squares the slices as they are, so a row gathered twice counts
    as two rows instead of their sum: the norm is wrong unless the gradients are dense.
    """
    import keras

    if keras.backend.backend() != "tensorflow":
        return values
    import tensorflow as tf

    return [tf.convert_to_tensor(v) if isinstance(v, tf.IndexedSlices) else v for v in values]


def all_reduce_sum(values):
    """Sum a tensor or list of tensors over the replicas of a ``tf.distribute`` replica context.

    Identity on one replica, outside a replica context and on backends whose batches are global
    (JAX): there the local value already is the global one.
    """
    import keras

    if keras.backend.backend() != "tensorflow":
        return values
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return values
    return context.all_reduce(tf.distribute.ReduceOp.SUM, values)
