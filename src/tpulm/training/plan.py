"""``tpulm plan``: compile the JAX train step for a Cloud TPU topology, on any machine.

With ``libtpu`` installed, JAX describes the devices of a TPU slice without one
(``jax.experimental.topologies.get_topology_desc``), and the TPU compiler lowers a function for
a mesh of them: its ``memory_analysis()`` gives what each chip holds (arguments, outputs,
temporaries) and ``cost_analysis()`` the FLOPs and bytes each chip moves per step. The compiler
itself refuses a step that does not fit in HBM, naming both figures.

What is compiled is the step ``tpulm train --backend jax`` runs, not a copy of it: the Keras
model of ``build_model``, compiled with the trainer's AdamW (schedule, clipping, accumulation),
``MaskedLMLoss`` and weighted metrics under the chosen precision policy, then Keras' own pure
``train_step(state, data)`` (``keras/src/backend/jax/trainer.py``) jitted as Keras jits it
(state donated, state shardings in and out), for the batch the tf.data pipeline makes
(``tpulm.training.inputs``: ids, mask, head slots, labels, weights). The model is built on the
host CPU (its weights are not needed, only their shapes), under a one-device mesh that carries
the trainer's layout rules (``jax_mesh.layout_rules``), so every variable and optimizer slot
gets the layout the trainer would give it; those layouts are then placed on the TPU mesh.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import os
import re
import tempfile
from collections.abc import Mapping
from typing import Any

from tpulm import config
from tpulm.errors import TpulmError
from tpulm.training import backends, flops, jax_mesh
from tpulm.training.config import TrainConfig
from tpulm.training.tpu_chips import CHIPS, Topology, parse_topology

log = logging.getLogger(__name__)
setting = config.setting
GIB = 2.0**30
AXES = (jax_mesh.DATA_AXIS, jax_mesh.MODEL_AXIS)
LIBTPU_PIN = "libtpu==0.0.42.1"  # pairs with jax 0.10.2 (what `jax[tpu]==0.10.2` installs)
# The TPU compiler's refusal: "... HLO temporaries (70.38G) exceeds available HBM (15.75G)".
_OOM = re.compile(r"total memory required for HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds "
                  r"available HBM \(([\d.]+)([KMGT]?)\)", re.S)
_UNITS = {"": 1.0, "K": 2.0**10, "M": 2.0**20, "G": 2.0**30, "T": 2.0**40}


@dataclasses.dataclass(frozen=True)
class PlanConfig:
    """Settings of ``tpulm plan`` beside those of ``tpulm train`` (the ``[plan]`` table)."""

    topology: str = setting(
        "v5litepod-8",
        "Cloud TPU type to compile for: v4-8, v5litepod-4, v5p-8, v6e-8, 2xv5p-8, ...")
    max_length: int = setting(512, "tokens per sequence (the shards' --max-length)")
    vocab_size: int | None = setting(None, "vocabulary size when no --tokenizer is given")
    tokens: float | None = setting(None, "tokens to train: prints the hours and cost of the run")
    price_per_chip_hour: float | None = setting(
        None, "USD per chip-hour (default: the on-demand price in tpulm.training.tpu_chips)")
    mfu: float = setting(0.5, "model FLOPs utilisation assumed for hours and cost beside the bound")

    def __post_init__(self) -> None:
        if self.max_length < 2:
            raise TpulmError(f"max_length must be at least 2, got {self.max_length}")
        if self.vocab_size is not None and self.vocab_size < 8:
            raise TpulmError(f"vocab_size must be at least 8, got {self.vocab_size}")
        if not 0.0 < self.mfu <= 1.0:
            raise TpulmError(f"mfu must be in (0, 1], got {self.mfu}")
        for name in ("tokens", "price_per_chip_hour"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise TpulmError(f"{name} must be positive, got {getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class PlanResult:
    """What one chip needs and does per train step (one micro-batch), and what it costs.

    Byte and FLOP figures are per chip. Where the compiler refused the step, FLOPs and the bound
    are None, ``temporaries_gib`` and ``hbm_usable_gib`` are the figures of its message, and
    ``hbm_needed_gib`` adds the state and batch to its temporaries.
    """

    topology: str
    chips: int
    chip: str
    mesh: dict[str, int]
    batch_size: int
    global_batch: int
    max_length: int
    head_slots: int
    precision: str
    fits: bool
    hbm_gib: float
    hbm_usable_gib: float | None
    hbm_needed_gib: float
    parameters_gib: float
    optimizer_gib: float
    batch_gib: float
    temporaries_gib: float | None
    flops_per_step: float | None
    model_flops_per_step: float
    bytes_per_step: float | None
    step_seconds_bound: float | None
    tokens_per_second_bound: float | None
    mfu_at_bound: float | None
    mfu: float
    tokens_per_second_at_mfu: float
    price_per_chip_hour: float
    hours_at_bound: float | None
    cost_at_bound: float | None
    hours_at_mfu: float | None
    cost_at_mfu: float | None
    suggestions: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``tpulm plan --json``)."""
        out = dataclasses.asdict(self)
        out["suggestions"] = list(self.suggestions)
        return out


class _Refused(Exception):
    """The TPU compiler refused the step: it needs ``need`` bytes of ``capacity``."""

    def __init__(self, need: float, capacity: float):
        super().__init__(f"{need} > {capacity}")
        self.need, self.capacity = need, capacity


def require_libtpu() -> None:
    """One line naming the install when ``libtpu`` (the TPU compiler) is missing."""
    if importlib.util.find_spec("libtpu") is None:
        raise TpulmError(
            "tpulm plan compiles with the TPU compiler, libtpu, which is not installed: "
            f"pip install 'tpulm[tpu]' (or pip install '{LIBTPU_PIN}')"
        )


@contextlib.contextmanager
def _quiet_fd2():
    """Hold fd 2 while libtpu works: it prints errors about TPU_WORKER_HOSTNAMES and the
    accelerator type on machines without a TPU, harmless for compilation. Shown on failure
    (but for the compiler's refusal to exceed HBM, which the plan reports itself)."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        except BaseException as err:
            os.dup2(saved, 2)
            if _refusal(str(err)) is None:  # a refusal is reported as such; anything else in full
                sink.seek(0)
                os.write(2, sink.read())
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def tpu_devices(topology: Topology) -> list:
    """The device descriptions of ``topology`` (no TPU needed, only libtpu)."""
    require_libtpu()
    # libtpu takes /tmp/libtpu_lockfile, one process per TPU VM, or fails ("Internal error when
    # accessing libtpu multi-process lockfile"); compiling uses no TPU, so plans run side by side.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    with _quiet_fd2():
        desc = topologies.get_topology_desc(
            platform="tpu",
            topology_name=topology.jax_topology,
            chip_config_name=topology.chip_config,
            chips_per_host_bounds=topology.chips_per_host,
            num_slices=topology.slices,
        )
    return list(desc.devices)


def model_config(train: TrainConfig, plan: PlanConfig, model_table: Mapping[str, Any]):
    """The ``ModelConfig`` the trainer would build: preset < ``[model]``, vocabulary and pad id
    from ``--tokenizer`` if given, else ``--vocab-size`` (pad id: the preset's, else 1)."""
    from tpulm.model.config import ModelConfig, load_model_preset

    table = {**load_model_preset(train.model), **model_table}
    if train.tokenizer:
        from tpulm.data import tokenizer

        tok = tokenizer.open_folder(train.tokenizer)
        table.update(vocab_size=tok.tokenizer.get_vocab_size(), pad_token_id=tok.special.pad_id)
    elif plan.vocab_size:
        table["vocab_size"] = plan.vocab_size
    else:
        raise TpulmError(
            "tpulm plan needs the vocabulary size: pass --tokenizer DIR or --vocab-size N")
    cfg = config.from_mapping(ModelConfig, table, f"model {train.model!r}")
    if plan.max_length > cfg.max_positions:
        raise TpulmError(
            f"--max-length {plan.max_length} exceeds the {cfg.max_positions} positions of model "
            f"{train.model!r}: raise max_position_embeddings or lower --max-length"
        )
    return cfg


def mesh_sizes(train: TrainConfig, chips: int) -> tuple[int, int]:
    """(data, model) axis sizes: ``--mesh`` on the slice's chips, else all data parallel."""
    return jax_mesh.parse_mesh(train.mesh, chips) if train.mesh else (chips, 1)


def build_trainer_model(model_cfg, train: TrainConfig, model_parallel: int, batch: dict):
    """The model, built and compiled by the trainer's own ``setup`` functions, every variable
    with the layout ``tpulm train --backend jax`` gives it.

    Built on one CPU device under a (1, 1) ``ModelParallel`` mesh whose layout map holds the
    trainer's rules for a model axis of ``model_parallel`` (optimizer slots inherit them); the
    plan then places those layouts on the TPU mesh.
    """
    import jax
    import keras

    from tpulm.training import process, setup

    process.set_precision(train.precision)
    cpu = keras.distribution.DeviceMesh((1, 1), AXES, devices=jax.devices("cpu")[:1])
    layouts = keras.distribution.LayoutMap(cpu)
    if train.mesh:
        for pattern, axes in jax_mesh.layout_rules(model_cfg, model_parallel).items():
            layouts[pattern] = axes
    distribution = keras.distribution.ModelParallel(
        layout_map=layouts, batch_dim_name=jax_mesh.DATA_AXIS, auto_shard_dataset=False)
    strategy = jax_mesh.MeshStrategy(distribution, data_parallel=1, name="tpulm plan")
    total = 1000  # the schedule's length changes no shape of the step
    model, optimizer, _ = setup.build_for_training(train, model_cfg, strategy, total)
    setup.compile_for_training(model, optimizer, train, strategy)
    with strategy.scope():
        model._symbolic_build(data_batch=batch)  # metrics variables, as fit's first step does
    return model


def batch_structs(train: TrainConfig, global_batch: int, length: int, slots: int) -> tuple:
    """``(x, y, sample_weight)`` shapes and dtypes of one batch of ``inputs.training_dataset``."""
    import jax
    import numpy as np

    def ints(width):
        return jax.ShapeDtypeStruct((global_batch, width), np.int32)

    x = {"input_ids": ints(length), "attention_mask": ints(length), "masked_positions": ints(slots)}
    if train.document_attention:
        x.update(segment_ids=ints(length), position_ids=ints(length))
    return x, ints(slots), jax.ShapeDtypeStruct((global_batch, slots), np.float32)


def _state_variables(model) -> tuple[list, list, list, list]:
    """The four lists of Keras' JAX train state, in its order."""
    return (list(model.trainable_variables), list(model.non_trainable_variables),
            list(model.optimizer.variables), list(model.metrics_variables))


def state_structs(model, mesh) -> tuple:
    """Keras' JAX train state as sharded ``ShapeDtypeStruct``s, each variable's layout on ``mesh``."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    def struct(variable):
        layout = getattr(variable, "_layout", None)
        axes = layout.axes if layout is not None else (None,) * len(variable.shape)
        return jax.ShapeDtypeStruct(variable.shape, variable.dtype,
                                    sharding=NamedSharding(mesh, PartitionSpec(*axes)))

    return tuple([struct(v) for v in group] for group in _state_variables(model))


def compile_step(model, mesh, state: tuple, batch: tuple):
    """Lower and compile Keras' ``train_step`` for ``mesh`` as ``make_train_function`` jits it.

    Returns:
        ``(compiled, kernel)``: the compiled step, and whether it calls a Mosaic kernel (splash
        attention), whose FLOPs the compiler's ``cost_analysis()`` leaves out.

    Raises:
        _Refused: the TPU compiler ran out of HBM.
    """
    import jax

    data = jax.tree.unflatten(jax.tree.structure(batch), _on_rows(batch, mesh))
    state_shardings = jax.tree.map(lambda s: s.sharding, state)
    step = jax.jit(model.train_step, donate_argnums=0, out_shardings=(None, state_shardings))
    with _on_tpu(mesh):
        lowered = step.lower(state, data)
    kernel = "tpu_custom_call" in lowered.as_text()
    try:
        with _quiet_fd2():
            return lowered.compile(), kernel
    except Exception as err:  # XlaRuntimeError: RESOURCE_EXHAUSTED names both figures
        found = _refusal(str(err))
        if found is None:
            raise
        raise _Refused(*found) from None


@contextlib.contextmanager
def _on_tpu(mesh):
    """Trace as the TPU run does: attention takes its TPU path (splash, a Mosaic kernel run per
    device under ``shard_map`` over the Keras mesh), here the TPU mesh being compiled for."""
    import keras

    from tpulm.model import attention

    device_mesh = keras.distribution.DeviceMesh(mesh.devices.shape, AXES, devices=mesh.devices)
    distribution = keras.distribution.ModelParallel(
        layout_map=keras.distribution.LayoutMap(device_mesh),
        batch_dim_name=jax_mesh.DATA_AXIS, auto_shard_dataset=False)
    with attention.target_platform("tpu"), distribution.scope():
        yield


def _refusal(message: str) -> tuple[float, float] | None:
    """(needed, available) bytes from the TPU compiler's out-of-memory message, or None."""
    match = _OOM.search(message)
    if match is None:
        return None
    return (float(match.group(1)) * _UNITS[match.group(2)],
            float(match.group(3)) * _UNITS[match.group(4)])


def sharded_bytes(structs) -> float:
    """Bytes one device holds of these sharded ``ShapeDtypeStruct``s."""
    import jax
    import numpy as np

    total = 0.0
    for s in jax.tree.leaves(structs):
        shard = s.sharding.shard_shape(s.shape)
        total += float(np.prod(shard, dtype=np.float64)) * np.dtype(s.dtype).itemsize
    return total


@dataclasses.dataclass(frozen=True)
class StepMeasure:
    """The compiler's figures of one step on one chip (bytes, FLOPs).

    When it refused the step, ``capacity`` is the HBM it said was available (else None),
    ``temp`` the temporaries it said it needed, and ``flops`` and ``bytes_accessed`` are None.
    """

    parameters: float
    optimizer: float
    batch: float
    temp: float | None
    needed: float
    capacity: float | None
    flops: float | None
    bytes_accessed: float | None


def measure(model_cfg, train: TrainConfig, topology: Topology, devices: list, batch_size: int,
            length: int) -> StepMeasure:
    """Build, lower and compile the step for ``batch_size`` rows per replica; read the analyses."""
    import keras
    import numpy as np
    from jax.sharding import Mesh

    from tpulm.training import setup

    train = dataclasses.replace(train, batch_size=batch_size)
    data, model_parallel = mesh_sizes(train, topology.chips)
    batch = batch_structs(train, batch_size * data, length, setup.head_slots(train, length))
    mesh = Mesh(np.array(devices[: data * model_parallel]).reshape(data, model_parallel),
                AXES)
    try:
        model = build_trainer_model(model_cfg, train, model_parallel, batch)
        state = state_structs(model, mesh)
        sizes = dict(parameters=sharded_bytes(state[:2] + state[3:]),
                     optimizer=sharded_bytes(state[2]), batch=sharded_bytes(_on_rows(batch, mesh)))
        compiled, kernel = compile_step(model, mesh, state, batch)
    except _Refused as refused:  # it names the temporaries; the state and batch come on top
        held = sizes["parameters"] + sizes["optimizer"] + sizes["batch"]
        return StepMeasure(**sizes, temp=refused.need, needed=refused.need + held,
                           capacity=refused.capacity, flops=None, bytes_accessed=None)
    finally:
        keras.backend.clear_session()
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    # Donated state aliases the updated state: count it once.
    needed = (memory.argument_size_in_bytes + memory.output_size_in_bytes
              - memory.alias_size_in_bytes + memory.temp_size_in_bytes
              + memory.generated_code_size_in_bytes)
    step_flops = float(cost.get("flops", 0.0))
    if kernel:
        step_flops += _kernel_flops(model_cfg, train, length, model_parallel)
    return StepMeasure(**sizes, temp=float(memory.temp_size_in_bytes), needed=float(needed),
                       capacity=None, flops=step_flops,
                       bytes_accessed=float(cost.get("bytes accessed", 0.0)))


def _kernel_flops(model_cfg, train: TrainConfig, length: int, model_parallel: int) -> float:
    """Attention FLOPs per chip inside the splash kernel, which ``cost_analysis()`` counts as 0:
    whole 128 x 128 tiles within each layer's reach, for the chip's rows and its share of heads."""
    per_replica = flops.attention_flops(model_cfg, length, train.batch_size, sparse=True, block=128)
    return per_replica / model_parallel  # one compiled step is one micro-batch


def _on_rows(batch: tuple, mesh) -> list:
    """The batch's structs with rows split over ``data`` (as Keras distributes batches)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    rows = NamedSharding(mesh, PartitionSpec(jax_mesh.DATA_AXIS))
    return [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=rows) for s in jax.tree.leaves(batch)]


def run(plan: PlanConfig, train: TrainConfig,
        model_table: Mapping[str, Any] | None = None) -> PlanResult:
    """Compile ``tpulm train --backend jax``'s step for ``plan.topology``; fit, speed and cost.

    Args:
        plan: topology, sequence length, vocabulary, and the run's tokens and price.
        train: the training settings (batch per replica, mesh, precision, accumulation, masking).
        model_table: ``[model]`` overrides of the preset ``train.model``.

    Raises:
        backends.BackendMismatch: Keras was imported with TensorFlow (the CLI restarts itself).
        TpulmError: libtpu missing, a bad topology, mesh, model or length.
    """
    topology = parse_topology(plan.topology)
    backends.activate("jax")  # the plan is of the JAX step, whatever train.backend says
    require_libtpu()
    model_cfg = model_config(train, plan, dict(model_table or {}))
    data, model_parallel = mesh_sizes(train, topology.chips)
    if train.mesh:
        jax_mesh.layout_rules(model_cfg, model_parallel)  # says which size the axis must divide
    devices = tpu_devices(topology)
    length, batch = plan.max_length, train.batch_size
    step = measure(model_cfg, train, topology, devices, batch, length)
    capacity = topology.chip.hbm_gib * GIB
    fits = step.capacity is None and step.needed <= capacity
    suggestions = () if fits else _suggestions(model_cfg, train, topology, devices, length, step,
                                               data, model_parallel)
    return _result(plan, train, topology, model_cfg, step, fits, suggestions, data, model_parallel)


def _result(plan, train, topology, model_cfg, step: StepMeasure, fits, suggestions, data,
            model_parallel) -> PlanResult:
    """The figures of ``step`` with the roofline bound, hours and cost."""
    from tpulm.training import setup

    chip, chips, length = topology.chip, topology.chips, plan.max_length
    slots = setup.head_slots(train, length)
    tokens_per_step = train.batch_size * data * length  # one micro-batch of the global batch
    model_flops = train.batch_size * data * flops.train_flops_per_sequence(model_cfg, length, slots)
    model_flops_per_chip = model_flops / chips  # replicas of the model axis share the work
    peak, bandwidth = chip.bf16_tflops * 1e12, chip.hbm_gbps * 1e9
    bound = None
    if step.flops is not None:
        bound = max(step.flops / peak, step.bytes_accessed / bandwidth)
    tps_bound = tokens_per_step / bound if bound else None
    tps_mfu = tokens_per_step * plan.mfu * peak / model_flops_per_chip
    price = plan.price_per_chip_hour or chip.price_per_chip_hour
    hours = {}
    for key, tps in (("bound", tps_bound), ("mfu", tps_mfu)):
        h = plan.tokens / tps / 3600 if plan.tokens and tps else None
        hours[key] = (h, h * chips * price if h is not None else None)
    gib = lambda b: None if b is None else b / GIB  # noqa: E731
    return PlanResult(
        topology=topology.name, chips=chips, chip=chip.name,
        mesh={"data": data, "model": model_parallel}, batch_size=train.batch_size,
        global_batch=train.batch_size * data, max_length=length, head_slots=slots,
        precision=train.precision, fits=fits, hbm_gib=chip.hbm_gib,
        hbm_usable_gib=gib(step.capacity),
        hbm_needed_gib=step.needed / GIB, parameters_gib=step.parameters / GIB,
        optimizer_gib=step.optimizer / GIB, batch_gib=step.batch / GIB,
        temporaries_gib=gib(step.temp), flops_per_step=step.flops,
        model_flops_per_step=model_flops_per_chip, bytes_per_step=step.bytes_accessed,
        step_seconds_bound=bound, tokens_per_second_bound=tps_bound,
        mfu_at_bound=model_flops_per_chip / (bound * peak) if bound else None, mfu=plan.mfu,
        tokens_per_second_at_mfu=tps_mfu, price_per_chip_hour=price,
        hours_at_bound=hours["bound"][0], cost_at_bound=hours["bound"][1],
        hours_at_mfu=hours["mfu"][0], cost_at_mfu=hours["mfu"][1], suggestions=tuple(suggestions),
    )


def _suggestions(model_cfg, train, topology, devices, length, step: StepMeasure, data,
                 model_parallel) -> list[str]:
    """What to change when the step does not fit: a batch estimate, remat, sparse attention, a
    model axis, a bigger chip.

    The largest batch is estimated from the temporaries' growth: one more compile at batch 1,
    then a straight line through the two requirements (activations grow linearly with rows).
    """
    capacity = topology.chip.hbm_gib * GIB
    out = []
    if train.batch_size > 1:
        one = measure(model_cfg, train, topology, devices, 1, length)
        if one.capacity is None and one.needed <= capacity:
            slope = (step.needed - one.needed) / (train.batch_size - 1)
            rows = max(1, int(1 + (capacity - one.needed) // slope)) if slope > 0 else 1
            rows = min(rows, train.batch_size - 1)
            accumulate = -(-train.batch_size * train.gradient_accumulation // rows)
            out.append(f"--batch-size {rows} (estimated from the growth of temporaries; "
                       f"--gradient-accumulation {accumulate} keeps about the same global batch)")
    if train.remat != "block" and train.remat != "full":
        out.append("--remat block (each transformer block's activations recomputed in the "
                   "backward pass instead of kept)")
    if train.attention == "dense":
        out.append("--attention auto (splash attention: no (seq, seq) scores in HBM)")
    if model_parallel * 2 <= topology.chips and _divides(model_cfg, model_parallel * 2):
        out.append(f"--mesh data={max(data // 2, 1)},model={model_parallel * 2} (weights, "
                   "optimizer state and their gradients split over twice as many chips)")
    bigger = "v5p (95 GiB per chip)" if topology.chip.name != "v5p" else None
    out.append("a shorter --max-length"
               + (f", or a chip with more HBM: {bigger}" if bigger else ""))
    return out


def _divides(model_cfg, model_parallel: int) -> bool:
    return not (model_cfg.hidden_size % model_parallel
                or model_cfg.intermediate_size % model_parallel)


def summary(result: PlanResult) -> str:
    """The plan in lines a person reads (``tpulm plan`` without ``--json``)."""
    r = result
    chip = CHIPS[r.chip]
    lines = [
        f"topology     {r.topology}: {r.chips} {r.chip} chips ({chip.hbm_gib:g} GiB HBM, "
        f"{chip.bf16_tflops:g} TFLOP/s bf16, {chip.hbm_gbps:g} GB/s), mesh data={r.mesh['data']} "
        f"model={r.mesh['model']}",
        f"step         {r.batch_size} x {r.max_length} tokens per replica (global batch "
        f"{r.global_batch}), {r.head_slots} head slots per row, {r.precision}",
        f"per chip     parameters {r.parameters_gib:.2f} GiB, optimizer {r.optimizer_gib:.2f} GiB, "
        f"batch {r.batch_gib:.3f} GiB, temporaries {r.temporaries_gib:.2f} GiB",
    ]
    if r.fits:
        lines.append(f"HBM          {r.hbm_needed_gib:.2f} of {r.hbm_gib:g} GiB per chip: fits")
        bound_by = "compute" if r.flops_per_step / (chip.bf16_tflops * 1e12) >= (
            r.bytes_per_step / (chip.hbm_gbps * 1e9)) else "HBM bandwidth"
        lines += [
            f"compute      {r.flops_per_step / 1e12:.3f} TFLOP per chip per step (model FLOPs "
            f"{r.model_flops_per_step / 1e12:.3f}), {r.bytes_per_step / 1e9:.2f} GB accessed",
            f"bound        {1e3 * r.step_seconds_bound:.2f} ms per step ({bound_by}-bound), "
            f"{r.tokens_per_second_bound:,.0f} tokens/s, MFU {100 * r.mfu_at_bound:.0f}%",
        ]
    else:
        usable = f" ({r.hbm_usable_gib:.2f} GiB usable)" if r.hbm_usable_gib else ""
        lines.append(f"HBM          needs {r.hbm_needed_gib:.2f} GiB per chip, has "
                     f"{r.hbm_gib:g} GiB{usable}: does NOT fit")
    beyond = (" (beyond the bound: this step cannot reach it)"
              if r.mfu_at_bound is not None and r.mfu > r.mfu_at_bound else "")
    lines.append(f"at {100 * r.mfu:g}% MFU   {r.tokens_per_second_at_mfu:,.0f} tokens/s{beyond}")
    if r.hours_at_mfu is not None:
        at_bound = (f"{r.hours_at_bound:,.1f} h (${r.cost_at_bound:,.0f}) at the bound, "
                    if r.hours_at_bound is not None else "")
        lines.append(f"run          {at_bound}{r.hours_at_mfu:,.1f} h (${r.cost_at_mfu:,.0f}) at "
                     f"{100 * r.mfu:g}% MFU, ${r.price_per_chip_hour:.2f} per chip-hour")
    lines += [f"try          {s}" for s in r.suggestions]
    return "\n".join(lines)
