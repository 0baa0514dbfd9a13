"""The one interface the training loop sees of where it runs: ``Strategy``.

Two kinds implement it: ``strategies.TFStrategy`` (a thin wrapper over a ``tf.distribute``
strategy: TPU, multi-worker, mirrored, single device) and ``jax_mesh.MeshStrategy`` (a Keras JAX
distribution over a device mesh). The loop asks only these questions, so it is the same code on
both backends and never checks which kind it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

from tpulm.errors import TpulmError

# --jit-compile: auto (each strategy's rule), true (XLA where it works), false (no XLA).
JIT_MODES = ("auto", "true", "false")


def check_jit_mode(mode: str) -> None:
    """Refuse a ``--jit-compile`` value that is not one of ``JIT_MODES``."""
    if mode not in JIT_MODES:
        raise TpulmError(f"jit_compile must be one of {', '.join(JIT_MODES)}, got {mode!r}")


@runtime_checkable
class Strategy(Protocol):
    """Where training runs: devices, replicas, processes.

    Attributes:
        name: registry name, for logs and results (``single_device``, ``jax_data_parallel`` ...).
        num_replicas_in_sync: model replicas; the global batch is the per-replica batch times this.
    """

    name: str
    num_replicas_in_sync: int

    def scope(self) -> AbstractContextManager:
        """Variables created inside are placed (mirrored, sharded) for this strategy."""

    def is_chief(self) -> bool:
        """Whether this process writes the run dir's shared files (checkpoints, metrics, lock)."""

    def use_xla(self, mode: str = "auto", precision: str = "fp32") -> bool:
        """Whether to compile the train step with XLA for ``--jit-compile mode``."""

    def needs_input_pipelines(self) -> bool:
        """True when each worker or host reads its own share of the files."""

    def distribute_datasets_from_function(self, dataset_fn: Callable) -> object:
        """The dataset Keras trains on, from ``dataset_fn(input_context)``."""

    def peak_flops(self) -> float:
        """Peak FLOP/s for MFU, all replicas together (a matmul measured on the devices)."""
