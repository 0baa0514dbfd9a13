"""Save and load Keras variables as safetensors keyed by ``variable.path``.

The format is backend-neutral (plain arrays keyed by the stable names the layers declare), so a
checkpoint written under TensorFlow loads under JAX and the reverse.
"""

from __future__ import annotations

import json

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


def file_problem(path: str) -> str | None:
    """Why ``path`` is not a complete safetensors file (None when it is), from its header alone.

    The format is an 8-byte little-endian header length, a JSON header giving each tensor's byte
    range, then the data: a complete file is exactly as long as the header says. This catches a
    file truncated by a full disk or a killed copy without reading the tensors.
    """
    if not storage.exists(path):
        return "missing"
    total = storage.size(path)
    with storage.open_file(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"truncated ({total} bytes)"
        length = int.from_bytes(head, "little")
        if length > total - 8:
            return f"truncated ({total} bytes, header says more)"
        try:
            header = json.loads(f.read(length))
            end = max([t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"] or [0])
        except (ValueError, TypeError, KeyError, IndexError):
            return "not a safetensors file (unreadable header)"
    if total != 8 + length + end:
        return f"truncated or padded ({total} bytes, header says {8 + length + end})"
    return None


def read(path: str) -> dict[str, np.ndarray]:
    """All tensors of a safetensors file (local or remote).

    Raises:
        TpulmError: the file is missing, truncated or not safetensors (the message names it).
    """
    from safetensors.numpy import load as load_bytes

    problem = file_problem(path)
    if problem:
        raise TpulmError(f"weights file {path} is {problem}; delete its checkpoint folder (an "
                         "earlier one is used) or restore the file")
    try:
        return load_bytes(storage.read_bytes(path))
    except Exception as err:  # safetensors raises its own SafetensorError for corrupt data
        raise TpulmError(f"weights file {path} cannot be read ({err}); delete its checkpoint "
                         "folder or restore the file") from None


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
