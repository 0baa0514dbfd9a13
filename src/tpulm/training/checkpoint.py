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
import math
import time

from tpulm import rundir, storage
from tpulm.errors import TpulmError
from tpulm.model import weights

log = logging.getLogger(__name__)

INCOMPLETE_SUFFIX = ".incomplete"


class _Keyed:
    """A variable under a stable checkpoint key (``weights`` reads ``.path``)."""

    def __init__(self, key: str, variable):
        self.path, self.variable, self.shape = key, variable, variable.shape

    def numpy(self):
        return self.variable.numpy()

    def assign(self, value) -> None:
        self.variable.assign(value)


def training_state_variables(model, optimizer) -> list[_Keyed]:
    """Optimizer slots and the dropout seed-generator states under stable keys.

    Keras names these variables with process-wide counters (``adam_w_3/...``,
    ``seed_generator_35/...``) that change with what was built before, so they are keyed by
    position and the name without its counter: ``optimizer/0003/<slot>``, ``rng/0002``.
    """
    keyed = [
        _Keyed(f"optimizer/{i:04d}/{v.path.split('/', 1)[-1]}", v)
        for i, v in enumerate(optimizer.variables)
    ]
    weight_ids = {id(v) for v in model.weights}
    rng = [v for v in model.variables if id(v) not in weight_ids]
    return keyed + [_Keyed(f"rng/{i:04d}", v) for i, v in enumerate(rng)]


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
            training_state_variables(model, optimizer), storage.join(tmp, rundir.OPTIMIZER_WEIGHTS)
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


def set_aside(folder: str) -> str:
    """Rename an incomplete checkpoint out of the way (kept for inspection, never deleted), so
    it is neither resumed from nor mistaken for the save of its step later."""
    aside = f"{folder}{INCOMPLETE_SUFFIX}"
    if storage.exists(aside):
        aside = f"{aside}-{int(time.time())}"
    storage.rename(folder, aside, overwrite=False)
    return aside


def problem(folder: str, step: int) -> str | None:
    """Why training cannot resume from checkpoint ``folder`` of ``step``; None when it can.

    Complete means ``model.safetensors``, ``optimizer.safetensors`` and ``state.json`` present,
    the two weight files as long as their headers say, and ``state.json`` valid JSON naming the
    folder's step. A step-0 folder with only ``model.safetensors`` (``tpulm import``) is complete:
    it starts a run from those weights.
    """
    names = set(storage.listdir(folder))
    needed = (rundir.MODEL_WEIGHTS,) if names == {rundir.MODEL_WEIGHTS} and step == 0 else (
        rundir.MODEL_WEIGHTS, rundir.OPTIMIZER_WEIGHTS, rundir.STATE_NAME)
    for name in needed:
        path = storage.join(folder, name)
        if name == rundir.STATE_NAME:
            try:
                state = storage.read_json(path)
            except TpulmError:
                return f"{name} is not valid JSON"
            if state is None:
                return f"{name} is missing"
            if not isinstance(state, dict) or state.get("step") != step:
                return f"{name} does not say step {step}"
        else:
            broken = weights.file_problem(path)
            if broken:
                return f"{name} is {broken}"
    return None


def resumable(run_dir: str) -> tuple[int, str, list[str]] | None:
    """The newest complete checkpoint as (step, folder, newer ones skipped with why), or None.

    Raises:
        TpulmError: the run dir has checkpoints but none is complete (all are named).
    """
    skipped = []
    for step, folder in reversed(rundir.list_checkpoints(run_dir)):
        found = problem(folder, step)
        if found is None:
            return step, folder, skipped
        skipped.append(f"{folder} ({found})")
    if skipped:
        raise TpulmError(
            f"run dir {run_dir} has no complete checkpoint: {'; '.join(skipped)}. Restore the "
            "files, or move the checkpoints folder away to start over"
        )
    return None


def _pick(run_dir: str, writer: bool) -> tuple[int, str] | None:
    """The newest complete checkpoint; newer incomplete ones are reported and set aside."""
    found = resumable(run_dir)
    if found is None:
        return None
    step, folder, skipped = found
    for reason in skipped:
        log.warning("skipping incomplete checkpoint %s", reason)
    if skipped and writer:
        for folder_step, newer in rundir.list_checkpoints(run_dir):
            if folder_step > step:
                log.warning("moved %s aside to %s", newer, set_aside(newer))
    return step, folder


def restore(run_dir: str, model, optimizer, writer: bool = True) -> dict | None:
    """Load the newest complete checkpoint of ``run_dir`` into ``model`` and ``optimizer``.

    Newer incomplete checkpoints (a file missing, truncated or unreadable: see
    ``problem``) are skipped with a warning naming each and why, and, by the
    writing process, renamed to ``ckpt-<step>.incomplete``. A checkpoint with only
    ``model.safetensors`` at step 0 (as ``tpulm import`` writes) gives the model its weights and
    leaves the optimizer fresh.

    Args:
        run_dir: the run dir.
        model: the built model.
        optimizer: its built optimizer.
        writer: this process writes the run dir's shared files (the chief).

    Returns:
        The saved ``state.json`` with the folder under ``"checkpoint"`` (``{"step": 0}`` for
        weights-only checkpoints), or None when the run dir has no checkpoint.

    Raises:
        TpulmError: there are checkpoints but none is complete.
    """
    latest = _pick(run_dir, writer)
    if latest is None:
        return None
    _, folder = latest
    weights.load(model.weights, storage.join(folder, rundir.MODEL_WEIGHTS))
    state_path = storage.join(folder, rundir.STATE_NAME)
    if not storage.exists(state_path):
        log.info("starting from the weights in %s with a fresh optimizer", folder)
        return {"step": 0, "initial_weights": folder}
    weights.load(
        training_state_variables(model, optimizer), storage.join(folder, rundir.OPTIMIZER_WEIGHTS)
    )
    return {**storage.read_json(state_path), "checkpoint": folder}


def last_good(run_dir: str, before: int) -> tuple[str, float] | None:
    """The checkpoint to go back to after a NaN/Inf loss at step ``before``, and its logged loss.

    The newest complete checkpoint before that step whose train loss (the last ``metrics.jsonl``
    train line at or before its step) was finite and not diverging: at most twice the lowest
    loss logged up to it. Without metrics, the newest complete one.
    """
    from tpulm.metrics_log import read_metrics

    path = storage.join(run_dir, rundir.METRICS_NAME)
    try:
        train = [r for r in read_metrics(path) if r["split"] == "train"] if storage.exists(path) else []
    except TpulmError:
        train = []
    for step, folder in reversed(rundir.list_checkpoints(run_dir)):
        if step >= before or problem(folder, step):
            continue
        upto = [float(r["loss"]) for r in train if r["step"] <= step]
        finite = [x for x in upto if math.isfinite(x)]
        if not upto:
            return folder, float("nan")
        if math.isfinite(upto[-1]) and upto[-1] <= 2 * min(finite):
            return folder, upto[-1]
    return None
