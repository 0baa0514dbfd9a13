"""``run(TrainConfig) -> TrainResult``: train a masked language model from shards."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpulm import quiet
from tpulm.training import backends
from tpulm.training.config import TrainConfig, TrainResult


def run(cfg: TrainConfig, model: Mapping[str, Any] | None = None) -> TrainResult:
    """Train (or resume) the run in ``cfg.run_dir``.

    Args:
        cfg: training settings.
        model: a ``[model]`` table overriding the preset named by ``cfg.model`` (sizes only;
            vocab size and pad id come from the tokenizer).

    Returns:
        What was done; see ``TrainResult``. On a run that already reached its steps nothing is
        trained or written: its last step, tokens and recorded evaluation are returned.

    Logs through :mod:`logging` (``tpulm.*`` loggers); TensorFlow's native start-up lines are
    kept off stderr as the command line does (:mod:`tpulm.quiet`).

    Raises:
        backends.BackendMismatch: Keras was imported with another backend than ``cfg.backend``.
    """
    backends.activate(cfg.backend)  # before tpulm.training.loop imports Keras
    from tpulm.hf import export, hub
    from tpulm import lock

    if cfg.push_to_hub:  # offline or no token: say so before hours of training, not after
        hub.check_hub_access(cfg.push_to_hub)
    with quiet.while_native_start():  # TensorFlow starts here: its C++ banners off stderr
        from tpulm.training import loop, preflight, setup

        preflight.check_run_dir_files(cfg.run_dir)  # nothing of the user's gets overwritten
        prepared = setup.prepare(cfg, dict(model or {}))  # checks, data, strategy: writes nothing
    with lock.hold(cfg.run_dir, enabled=prepared.writer):  # one trainer per run dir
        result = loop.Trainer(prepared).fit()  # build, restore, write the run dir; then train
    if cfg.push_to_hub:
        export.export(export.ExportConfig(run_dir=cfg.run_dir, overwrite=True, push_to_hub=cfg.push_to_hub))
    return result
