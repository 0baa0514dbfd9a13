"""Load a trained model from a run dir, one of its checkpoint folders, or an export folder.

Fill-mask and downstream evaluation take any of the three: a run dir (its latest checkpoint, or
``step``), ``RUN_DIR/checkpoints/ckpt-<step>`` or a Transformers folder written by ``tpulm export``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from tpulm import rundir, storage
from tpulm.errors import TpulmError
from tpulm.hf import convert, folder
from tpulm.model import weights
from tpulm.model.config import run_model_config


def _parent(path: str) -> str:
    path = path.rstrip("/")
    return path.rsplit("/", 1)[0] if storage.is_remote(path) else os.path.dirname(path)


def _locate(path: str, step: int | None) -> tuple[str, str, str]:
    """``(kind, weights file, tokenizer dir)`` for a run dir, checkpoint or export folder."""
    if storage.exists(storage.join(path, rundir.CONFIG_NAME)):
        return "run", rundir.run_checkpoint(path, step)[1], storage.join(path, rundir.TOKENIZER_DIR)
    run_dir = _parent(_parent(path))
    if storage.exists(storage.join(path, rundir.MODEL_WEIGHTS)) and storage.exists(
            storage.join(run_dir, rundir.CONFIG_NAME)):
        return ("checkpoint", storage.join(path, rundir.MODEL_WEIGHTS),
                storage.join(run_dir, rundir.TOKENIZER_DIR))
    if storage.exists(storage.join(path, folder.CONFIG_FILE)):
        return "export", storage.join(path, folder.WEIGHTS_FILE), path
    raise TpulmError(
        f"{path} is neither a run dir (config.toml), a checkpoint folder of one, nor an exported "
        "Transformers folder (config.json)")


@dataclass
class LoadedModel:
    """A model read from a run dir, checkpoint or export folder (see :func:`load`)."""

    kind: str  # "run", "checkpoint" or "export"
    model: Any  # tpulm.model.masked_lm.MaskedLM from tpulm.model.networks.build_model, float32
    config: Any  # tpulm.model.config.ModelConfig
    tokenizer_dir: str
    run_dir: str | None  # the run dir of a run or checkpoint; None for an export folder


def load(path: str, step: int | None = None) -> LoadedModel:
    """Build the model of a run dir, a checkpoint folder or an export folder, with its weights.

    Args:
        path: the folder (local or remote).
        step: checkpoint step when ``path`` is a run dir; None for the latest.
    """
    from tpulm.model.networks import (
        build_model,  # imports Keras: only when a model is built
    )

    kind, weights_path, tok_dir = _locate(path, step)
    run_dir = {"run": path, "checkpoint": _parent(_parent(path))}.get(kind)
    cfg = model_config(path)
    model = build_model(cfg, dtype="float32")
    weights.assign(model.weights, read_weights(path, step), weights_path)
    return LoadedModel(kind, model, cfg, tok_dir, run_dir)


def model_config(path: str):
    """The ``ModelConfig`` of a run dir, checkpoint or export folder (no Keras, no weights)."""
    is_run = storage.exists(storage.join(path, rundir.CONFIG_NAME))
    kind = "run" if is_run else _locate(path, None)[0]  # a run dir need not have a checkpoint
    if kind == "export":
        return convert.model_config_from_hf(*folder.read_config(path))
    return run_model_config(path if kind == "run" else _parent(_parent(path)))


def tokenizer_folder(path: str) -> str:
    """The tokenizer folder that goes with a run dir, checkpoint or export folder."""
    if storage.exists(storage.join(path, rundir.CONFIG_NAME)):
        return storage.join(path, rundir.TOKENIZER_DIR)
    return _locate(path, None)[2]


def read_weights(path: str, step: int | None = None) -> dict:
    """The weights of a run dir (``step``, default latest), checkpoint or export folder, as
    arrays keyed by the Keras variable paths."""
    kind, weights_path, _ = _locate(path, step)
    if kind == "export":
        return convert.hf_to_keras(folder.read_hf_weights(path), model_config(path), path)
    return weights.read(weights_path)
