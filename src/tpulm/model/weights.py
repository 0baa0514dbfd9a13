"""Save and load Keras variables as safetensors keyed by ``variable.path``.

The format is backend-neutral (plain arrays keyed by the stable names the layers declare), so a
checkpoint written under TensorFlow loads under JAX and the reverse.
"""

from __future__ import annotations

import numpy as np

from tpulm import storage
from tpulm.errors import TpulmError


def to_arrays(variables) -> dict[str, np.ndarray]:
    """``{variable.path: numpy value}``; duplicate paths are a bug in layer naming."""
    arrays: dict[str, np.ndarray] = {}
    for variable in variables:
        if variable.path in arrays:
            raise ValueError(f"two variables share the path {variable.path}; name the layers")
        arrays[variable.path] = np.asarray(variable.numpy() if hasattr(variable, "numpy") else variable)
    return arrays


def save(variables, path: str, metadata: dict[str, str] | None = None) -> None:
    """Atomically write ``variables`` to a safetensors file (local or remote)."""
    from safetensors.numpy import save as save_bytes

    storage.write_bytes(path, save_bytes(to_arrays(variables), metadata=metadata))


def read(path: str) -> dict[str, np.ndarray]:
    """All tensors of a safetensors file (local or remote)."""
    from safetensors.numpy import load as load_bytes

    if not storage.exists(path):
        raise TpulmError(f"weights file {path} does not exist")
    return load_bytes(storage.read_bytes(path))


def assign(variables, arrays: dict[str, np.ndarray], where: str) -> None:
    """Assign ``arrays`` to ``variables`` by path; missing, extra or misshapen entries are errors."""
    by_path = {v.path: v for v in variables}
    missing = sorted(set(by_path) - set(arrays))
    unexpected = sorted(set(arrays) - set(by_path))
    if missing or unexpected:
        raise TpulmError(
            f"{where} does not match the model: missing {missing or 'nothing'}, "
            f"unexpected {unexpected or 'nothing'}"
        )
    for name, variable in by_path.items():
        if tuple(variable.shape) != arrays[name].shape:
            raise TpulmError(
                f"{where}: {name} has shape {arrays[name].shape}, the model expects "
                f"{tuple(variable.shape)}"
            )
        variable.assign(arrays[name])


def load(variables, path: str) -> None:
    """Load a safetensors file written by ``save`` into ``variables``."""
    assign(variables, read(path), path)
