"""Pick where training runs: a registry of strategies, each built as a ``distribution.Strategy``.

Strategies are found through a registry of (name, applies, build) entries tried in order. On
Keras' JAX backend the ``jax_mesh`` entry applies: a device mesh (``tpulm.training.jax_mesh``).
Otherwise a ``tf.distribute`` strategy wrapped in ``TFStrategy``: a TPU when ``--tpu`` is given,
``MultiWorkerMirroredStrategy`` when ``TF_CONFIG`` names a cluster, ``MirroredStrategy`` over
several GPUs, else the default single device (CPU or one GPU; nothing is hard-coded).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable

from tpulm.errors import TpulmError
from tpulm.training import flops
from tpulm.training.distribution import Strategy, check_jit_mode

log = logging.getLogger(__name__)


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


class TFStrategy:
    """A ``tf.distribute`` strategy behind the ``distribution.Strategy`` interface.

    Args:
        strategy: the ``tf.distribute.Strategy``.
        name: registry name, for logs.
    """

    def __init__(self, strategy, name: str):
        self.strategy = strategy
        self.name = name
        self.num_replicas_in_sync = strategy.num_replicas_in_sync

    def scope(self):
        return self.strategy.scope()

    def _is_tpu(self) -> bool:
        import tensorflow as tf

        return isinstance(self.strategy, tf.distribute.TPUStrategy)

    def is_chief(self) -> bool:
        """The TensorFlow chief: a TPUStrategy has one client process (the chief);
        MultiWorkerMirroredStrategy asks its cluster resolver (TF_CONFIG); every other strategy
        runs in one process."""
        resolver = getattr(self.strategy, "cluster_resolver", None)
        if resolver is None or self._is_tpu():
            return True
        spec = resolver.cluster_spec().as_dict() if resolver.cluster_spec() else {}
        return is_chief_task(resolver.task_type, resolver.task_id, spec)

    def use_xla(self, mode: str = "auto", precision: str = "fp32") -> bool:
        """``auto``: XLA on GPUs and TPUs. On CPUs it depends on the precision (measured on 2
        cores, TensorFlow 2.21, fused steps vs one op at a time): in float32 XLA:CPU's fusion wins
        (ModernBERT 1.4x, RoBERTa 1.1x faster than oneDNN graph mode), but XLA:CPU runs bfloat16
        matmuls without the AVX512-BF16/AMX instructions oneDNN uses, so ``mixed_bfloat16`` stays
        in graph mode (RoBERTa 1.5x, ModernBERT 1.2x faster there). ``true`` forces XLA where it
        works; ``false`` turns it off. ``MirroredStrategy`` over CPU devices cannot place
        variables under XLA and always falls back (with one log line).
        """
        import tensorflow as tf

        check_jit_mode(mode)
        if mode == "false":
            return False
        on_cpu = not tf.config.list_logical_devices("GPU") and not self._is_tpu()
        several = self.num_replicas_in_sync > 1  # the default strategy has no worker_devices
        if several and any("CPU" in d.upper() for d in self.strategy.extended.worker_devices):
            log.info("XLA off: %s over CPU devices cannot place variables under XLA",
                     type(self.strategy).__name__)
            return False
        if mode == "auto" and on_cpu and precision == "mixed_bfloat16":
            log.info("XLA off on CPU for mixed_bfloat16: oneDNN's bfloat16 kernels train faster "
                     "than XLA:CPU (--jit-compile true forces it)")
            return False
        return True

    def needs_input_pipelines(self) -> bool:
        """Multi-worker: every worker reads its own files; a TPU pod slice: every host."""
        import tensorflow as tf

        if isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy):
            return True
        return self._is_tpu() and self.strategy.extended.num_hosts > 1

    def distribute_datasets_from_function(self, dataset_fn):
        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def peak_flops(self) -> float:
        return flops.matmul_flops() * self.num_replicas_in_sync


@dataclasses.dataclass(frozen=True)
class _Entry:
    name: str
    applies: Callable[[Placement], bool]
    build: Callable[[Placement], object]  # a tf.distribute strategy, or a ready Strategy (JAX)


def first_line(err: Exception) -> str:
    """The first line of an error: TensorFlow's go on with kernel registries and graph nodes."""
    text = getattr(err, "message", None) or str(err)
    return text.strip().splitlines()[0] if text.strip() else type(err).__name__


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
            f"cannot reach TPU {placement.tpu!r} (--tpu, --tpu-zone, --gcp-project): "
            f"{first_line(err)}"
        ) from None
    return TFStrategy(tf.distribute.TPUStrategy(resolver), "tpu")


def _multi_worker(_: Placement):
    import tensorflow as tf

    return TFStrategy(tf.distribute.MultiWorkerMirroredStrategy(), "multi_worker_mirrored")


def _mirrored(_: Placement):
    import tensorflow as tf

    return TFStrategy(tf.distribute.MirroredStrategy(), "mirrored")


def _single(_: Placement):
    import tensorflow as tf

    # The default strategy: one device, CPU or GPU.
    return TFStrategy(tf.distribute.get_strategy(), "single_device")


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


def make_strategy(placement: Placement) -> Strategy:
    """The first registered strategy that applies.

    Args:
        placement: TPU and mesh settings; without them the hardware decides.
    """
    for entry in STRATEGIES:
        if entry.applies(placement):
            strategy = entry.build(placement)
            log.info("strategy %s with %d replica(s)", strategy.name, strategy.num_replicas_in_sync)
            return strategy
    raise AssertionError("the single-device entry always applies")


def local() -> Strategy:
    """This process alone, without a cluster or mesh: TensorFlow's default strategy, or JAX on
    one device (what fine-tuning and ``tpulm plan`` use)."""
    import keras

    if keras.backend.backend() == "jax":
        from tpulm.training import jax_mesh

        return jax_mesh.MeshStrategy(None, 1, "jax_single_device")
    return _single(Placement())


def is_chief_task(task_type: str | None, task_id: int | None, cluster: dict | None) -> bool:
    """Whether a TensorFlow cluster task is the chief: the ``chief`` task, else worker 0 of a
    cluster without one, else (no cluster at all) the only process (as ``multi_worker_util``)."""
    if not cluster or task_type is None:
        return True
    if task_type == "chief":
        return True
    return task_type == "worker" and int(task_id or 0) == 0 and "chief" not in cluster


def data_loss_error() -> type:
    """TensorFlow's error for unreadable TFRecord data (tf.data reads the shards on every backend)."""
    import tensorflow as tf

    return tf.errors.DataLossError
