"""Checkpoints in the run dir: atomic save, keep the last K, restore for exact resume.

A checkpoint folder (``tpulm.rundir`` layout) holds the model weights, the optimizer state plus
the random-number state of the dropout layers (``optimizer.safetensors``; the model file holds only
what an exported model needs), and ``state.json`` (step, data position, tokens, time, seed). It is
written under a temporary name and renamed when complete, so a run killed while saving leaves the
previous checkpoint as the latest one.
"""

from __future__ import annotations

import json
import logging

from tpulm import rundir, storage, weights
from tpulm.errors import TpulmError

log = logging.getLogger(__name__)


def rng_variables(model) -> list:
    """Seed-generator states of the model's layers (dropout), not part of its weights."""
    weight_ids = {id(v) for v in model.weights}
    return [v for v in model.variables if id(v) not in weight_ids]


def save(run_dir: str, model, optimizer, state: dict, keep: int) -> str:
    """Write the checkpoint of ``state["step"]`` atomically and prune to the last ``keep``.

    Args:
        run_dir: the run dir.
        model: the Keras model.
        optimizer: its optimizer (built).
        state: JSON-able training state; must hold ``step``.
        keep: number of checkpoints to keep (older ones are deleted).

    Returns:
        The checkpoint folder.
    """
    final = rundir.checkpoint_dir(run_dir, state["step"])
    if storage.exists(final):
        return final
    storage.makedirs(storage.join(run_dir, rundir.CHECKPOINTS_DIR))
    with storage.atomic_path(final) as tmp:
        storage.makedirs(tmp)
        weights.save(model.weights, storage.join(tmp, rundir.MODEL_WEIGHTS))
        weights.save(
            list(optimizer.variables) + rng_variables(model),
            storage.join(tmp, rundir.OPTIMIZER_WEIGHTS),
        )
        storage.write_text(storage.join(tmp, rundir.STATE_NAME), json.dumps(state, indent=2) + "\n")
    prune(run_dir, keep)
    return final


def prune(run_dir: str, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints and leftovers of interrupted saves."""
    root = storage.join(run_dir, rundir.CHECKPOINTS_DIR)
    for _, folder in rundir.list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        storage.rmtree(folder)
    if storage.isdir(root):
        for name in storage.listdir(root):
            if storage.is_temporary(name):
                storage.rmtree(storage.join(root, name))


def restore(run_dir: str, model, optimizer) -> dict | None:
    """Load the newest checkpoint of ``run_dir`` into ``model`` and ``optimizer``.

    A checkpoint with only ``model.safetensors`` (as ``tpulm import`` writes) gives the model its
    weights and leaves the optimizer fresh at step 0.

    Returns:
        The saved ``state.json`` (``{"step": 0}`` for weights-only checkpoints), or None when
        the run dir has no checkpoint.
    """
    latest = rundir.latest_checkpoint(run_dir)
    if latest is None:
        return None
    step, folder = latest
    weights.load(model.weights, storage.join(folder, rundir.MODEL_WEIGHTS))
    state_path = storage.join(folder, rundir.STATE_NAME)
    if not storage.exists(state_path):
        log.info("starting from the weights in %s with a fresh optimizer", folder)
        return {"step": 0, "initial_weights": folder}
    weights.load(
        list(optimizer.variables) + rng_variables(model),
        storage.join(folder, rundir.OPTIMIZER_WEIGHTS),
    )
    try:
        state = json.loads(storage.read_text(state_path))
    except ValueError as err:
        raise TpulmError(f"{state_path} is not valid JSON ({err}); delete {folder} to resume from the one before") from None
    if state.get("step") != step:
        raise TpulmError(f"{state_path} says step {state.get('step')} but the folder says {step}")
    log.info("resuming from %s (step %d)", folder, step)
    return state
