"""Device meshes for Keras' JAX backend: data parallelism, sharded weights, multi-host pods.

``tpulm.training.strategies`` finds this module through its strategy registry when Keras runs on JAX.
Without ``--mesh`` every device holds a replica (``keras.distribution.DataParallel``); with
``--mesh data=D,model=M`` the devices form a D x M mesh (``ModelParallel``): the batch is split
over ``data`` and the large weights over ``model`` (:func:`layout_map`), each device holding
1/M of them (FSDP-style: XLA's SPMD partitioner gathers or reduces around each matmul).

On a multi-host TPU pod slice the same command runs on every host; ``jax.distributed`` joins
them into one program (:func:`initialize_cluster`), and each host reads its own share of the
shard files (``distribute_datasets_from_function`` hands ``tpulm.training.inputs`` an ``InputContext``
with one input pipeline per process), assembled into global batches by Keras.

:class:`MeshStrategy` implements ``tpulm.training.distribution.Strategy``, the interface the
training loop uses on both backends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time

from tpulm.errors import TpulmError
from tpulm.training.distribution import check_jit_mode

log = logging.getLogger(__name__)

DATA_AXIS, MODEL_AXIS = "data", "model"
_AXES = (DATA_AXIS, MODEL_AXIS)


def parse_mesh(spec: str, device_count: int) -> tuple[int, int]:
    """``(data, model)`` sizes of a ``--mesh`` spec such as ``data=2,model=4`` or ``model=4``.

    An axis left out takes the devices left over (``model=4`` on 16 devices is ``data=4``).

    Args:
        spec: comma-separated ``axis=size`` items, axes ``data`` and ``model``.
        device_count: devices available (all processes together).

    Returns:
        The sizes; their product may be below ``device_count`` (the mesh then uses the first
        devices, on a single host only).
    """
    sizes: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        axis, _, value = item.partition("=")
        axis = axis.strip()
        if axis not in _AXES or not value.strip().isdigit() or int(value) < 1 or axis in sizes:
            raise TpulmError(
                f"--mesh {spec!r}: expected comma-separated data=D,model=M with positive sizes, "
                f"each axis at most once (got {item!r})"
            )
        sizes[axis] = int(value)
    if not sizes:
        raise TpulmError(f"--mesh {spec!r} is empty: give data=D,model=M")
    for axis, other in ((DATA_AXIS, MODEL_AXIS), (MODEL_AXIS, DATA_AXIS)):
        if axis not in sizes:
            if device_count % sizes[other]:
                raise TpulmError(
                    f"--mesh {spec!r}: {device_count} devices cannot be split into {other}="
                    f"{sizes[other]}; give both axes"
                )
            sizes[axis] = device_count // sizes[other]
    data, model = sizes[DATA_AXIS], sizes[MODEL_AXIS]
    if data * model > device_count:
        raise TpulmError(
            f"--mesh {spec!r} needs {data * model} devices but only {device_count} are available"
        )
    return data, model


def layout_rules(model_cfg, model_parallel: int) -> dict[str, tuple[str | None, ...]]:
    """Variable-path regex -> axis per dimension, for the weights sharded over ``model``.

    Kernels follow the Megatron split so that the attention and feed-forward pairs need one
    reduction each: q/k/v and the FFN input are split by output column, the attention output and
    FFN output by input row. The word table (also the tied LM-head decoder) is split by vocabulary
    row when the vocabulary divides evenly, else by hidden column. Everything else (positions,
    LayerNorms, biases, the LM-head dense) is small and replicated. Optimizer slots take the layout
    of their variable (Keras ``add_variable_from_reference``).

    Args:
        model_cfg: the ``tpulm.model.config.ModelConfig``.
        model_parallel: size of the ``model`` axis.

    Raises:
        TpulmError: hidden or intermediate size not divisible by the ``model`` axis.
    """
    for name in ("hidden_size", "intermediate_size"):
        if getattr(model_cfg, name) % model_parallel:
            raise TpulmError(
                f"--mesh model={model_parallel} does not divide the model's {name} "
                f"{getattr(model_cfg, name)}: choose a model axis that divides it"
            )
    root = re.escape(model_cfg.model_name)
    column, row = (None, MODEL_AXIS), (MODEL_AXIS, None)
    vocab_split = row if model_cfg.vocab_size % model_parallel == 0 else column
    if model_cfg.architecture == "modernbert":  # fused q/k/v (Wqkv) and GLU input (Wi)
        return {
            f"{root}/tok_embeddings/embeddings": vocab_split,
            rf"{root}/layer_\d+/(wqkv|wi)/kernel": column,
            rf"{root}/layer_\d+/(attn_out|mlp_out)/kernel": row,
        }
    return {
        f"{root}/embeddings/word_embeddings/embeddings": vocab_split,
        rf"{root}/layer_\d+/(query|key|value)/kernel": column,
        rf"{root}/layer_\d+/attention_output/kernel": row,
        rf"{root}/layer_\d+/intermediate/kernel": column,
        rf"{root}/layer_\d+/output/kernel": row,
    }


def layout_map(device_mesh, model_cfg):
    """The ``keras.distribution.LayoutMap`` of :func:`layout_rules` on ``device_mesh``.

    Args:
        device_mesh: a ``keras.distribution.DeviceMesh`` with axes ``data`` and ``model``.
        model_cfg: the ``tpulm.model.config.ModelConfig``.
    """
    import keras

    model_parallel = device_mesh.shape[device_mesh.axis_names.index(MODEL_AXIS)]
    layouts = keras.distribution.LayoutMap(device_mesh)
    for pattern, axes in layout_rules(model_cfg, model_parallel).items():
        layouts[pattern] = axes
    return layouts


def cluster_requested(tpu: str | None) -> bool:
    """Whether to join a multi-process JAX cluster: on a TPU VM, or with a coordinator address."""
    return tpu is not None or bool(os.environ.get("JAX_COORDINATOR_ADDRESS"))


def initialize_cluster(tpu: str | None) -> None:
    """``jax.distributed.initialize()`` once, before any device is used (no-op when not asked).

    On Cloud TPU VMs JAX finds the other hosts of the slice itself; elsewhere set
    ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``.

    Args:
        tpu: the ``--tpu`` setting; JAX reaches TPUs only from the VMs they are attached to.
    """
    import jax

    if tpu not in (None, "local"):
        raise TpulmError(
            f"--tpu {tpu!r}: on the JAX backend run tpulm on the TPU VM itself (on every host of "
            "a pod slice) with --tpu local"
        )
    if not cluster_requested(tpu) or jax.distributed.is_initialized():
        return
    env = {k: os.environ.get(f"JAX_{k.upper()}") for k in ("coordinator_address", "num_processes",
                                                           "process_id")}
    kwargs = {k: (int(v) if k != "coordinator_address" else v) for k, v in env.items() if v}
    try:
        jax.distributed.initialize(**kwargs)
    except (RuntimeError, ValueError) as err:
        raise TpulmError(f"cannot join the JAX cluster (--tpu, JAX_COORDINATOR_ADDRESS): {err}") from None
    log.info("JAX process %d of %d, %d local of %d devices", jax.process_index(),
             jax.process_count(), jax.local_device_count(), jax.device_count())


class MeshStrategy:
    """A Keras JAX ``Distribution`` behind the ``distribution.Strategy`` interface.

    Args:
        distribution: the ``keras.distribution`` distribution (set globally by :func:`build`).
        data_parallel: size of the ``data`` axis: the number of model replicas.
        name: registry name for logs.
    """

    def __init__(self, distribution, data_parallel: int, name: str):
        self.distribution = distribution
        self.num_replicas_in_sync = data_parallel
        self.name = name

    @property
    def devices(self) -> list:
        """The mesh's devices, all processes together."""
        if self.distribution is None:
            import jax

            return jax.devices()[:1]
        return list(self.distribution.device_mesh.devices.flat)

    def scope(self):
        """Variables created inside get the distribution's layouts."""
        return contextlib.nullcontext() if self.distribution is None else self.distribution.scope()

    def is_chief(self) -> bool:
        """JAX process 0 writes the run dir's shared files."""
        import jax

        return jax.process_index() == 0

    def use_xla(self, mode: str = "auto", precision: str = "fp32") -> bool:
        """XLA unless ``--jit-compile false`` (eager JAX: for debugging only, very slow).

        On JAX, XLA is the only compiler: unlike TensorFlow's CPU graph mode there is nothing
        faster to fall back to on CPUs, so ``auto`` compiles everywhere, in every precision.
        """
        check_jit_mode(mode)
        return mode != "false"

    def needs_input_pipelines(self) -> bool:
        """True with several processes: each reads its own files."""
        import jax

        return jax.process_count() > 1

    def distribute_datasets_from_function(self, dataset_fn):
        """This process's dataset: its share of the files and of the global batch.

        ``dataset_fn`` gets a ``tf.distribute.InputContext`` with one pipeline per process whose
        ``get_per_replica_batch_size(global)`` is the per-process batch; Keras joins the
        per-process batches into global arrays sharded over ``data``.
        """
        import jax
        import tensorflow as tf

        processes = jax.process_count()
        context = tf.distribute.InputContext(
            num_input_pipelines=processes,
            input_pipeline_id=jax.process_index(),
            num_replicas_in_sync=processes,
        )
        return dataset_fn(context)

    def peak_flops(self, n: int = 2048, repeats: int = 3) -> float:
        """FLOP/s of float32 matmuls on all mesh devices at once (one (n, n) x (n, n) each)."""
        import jax
        import jax.numpy as jnp
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        devices = self.devices
        mesh = Mesh(devices, ("d",))
        a = jax.device_put(jnp.ones((len(devices) * n, n), jnp.float32),
                           NamedSharding(mesh, PartitionSpec("d", None)))
        b = jax.device_put(jnp.ones((n, n), jnp.float32), NamedSharding(mesh, PartitionSpec()))
        matmul = jax.jit(jnp.matmul)
        matmul(a, b).block_until_ready()  # compile and warm up
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            matmul(a, b).block_until_ready()
            best = min(best, time.perf_counter() - t0)
        return 2.0 * len(devices) * n**3 / best


def build(placement) -> MeshStrategy:
    """Join the cluster if asked, make the mesh and set it as Keras' global distribution.

    Args:
        placement: a ``tpulm.training.strategies.Placement``; ``mesh`` (``data=D,model=M``) selects
            ``ModelParallel`` and ``model`` (a ``ModelConfig``) sizes its layout map.
    """
    import jax
    import keras

    initialize_cluster(placement.tpu)
    devices = jax.devices()
    data, model = parse_mesh(placement.mesh, len(devices)) if placement.mesh else (len(devices), 1)
    if data * model == 1 and jax.process_count() == 1:
        # One device needs no mesh; a 1-device mesh would even compile the step twice (the
        # variables come back from the first step with a single-device sharding).
        keras.distribution.set_distribution(None)
        log.info("jax_single_device on %s%s", devices[0],
                 f" ({len(devices) - 1} other devices idle)" if len(devices) > 1 else "")
        return MeshStrategy(None, 1, "jax_single_device")
    if placement.mesh is None:
        distribution = keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False)
        strategy = MeshStrategy(distribution, len(devices), "jax_data_parallel")
    else:
        _check_process_layout(data * model, model, len(devices))
        mesh = keras.distribution.DeviceMesh(
            (data, model), _AXES, devices=devices[: data * model]
        )
        distribution = keras.distribution.ModelParallel(
            layout_map=layout_map(mesh, placement.model),
            batch_dim_name=DATA_AXIS,
            auto_shard_dataset=False,
        )
        strategy = MeshStrategy(distribution, data, "jax_model_parallel")
    keras.distribution.set_distribution(distribution)
    log.info("%s over %d device(s) (%s): %s", strategy.name, len(strategy.devices),
             devices[0].platform, dict(zip(distribution.device_mesh.axis_names,
                                           distribution.device_mesh.shape)))
    return strategy


def _check_process_layout(used: int, model: int, device_count: int) -> None:
    """Several processes: the mesh spans all devices and a model replica stays on one host."""
    import jax

    if jax.process_count() == 1:
        if used < device_count:
            log.warning("the mesh uses %d of %d devices; the others stay idle", used, device_count)
        return
    if used != device_count or jax.local_device_count() % model:
        raise TpulmError(
            f"--mesh on {jax.process_count()} hosts must use all {device_count} devices and keep "
            f"a model replica on one host (model axis dividing {jax.local_device_count()} local "
            "devices)"
        )
