"""``tpulm export``: a run dir's checkpoint -> a Transformers folder with a model card."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from tpulm import config, ownership, rundir, storage
from tpulm.data.tokenizer import open_folder
from tpulm.hf import card, folder, hub
from tpulm.hf.convert import hf_config, keras_to_hf
from tpulm.model import weights
from tpulm.model.config import run_model_config
from tpulm.rundir import run_checkpoint

log = logging.getLogger(__name__)

WRITERS = ("export",)  # whose files an export with --overwrite may replace (tpulm.ownership)


@dataclass(frozen=True)
class ExportConfig:
    """Settings of ``tpulm export``."""

    run_dir: str = config.setting("", "run dir to export (local or gs://)")
    out_dir: str | None = config.setting(None, "output folder (default: RUN_DIR/export)")
    step: int | None = config.setting(None, "checkpoint step to export (default: the latest)")
    overwrite: bool = config.setting(False, "replace OUT_DIR if it exists")
    push_to_hub: str | None = config.setting(None, "also upload the export to this Hub repo id")
    private: bool = config.setting(True, "create the Hub repo as private")


def export(settings: ExportConfig) -> str:
    """Write the Transformers export of a run dir, then upload it if asked; returns OUT_DIR.

    The export folder appears atomically (temporary sibling + rename). The Hub upload comes
    after it, so an upload failure (offline, no token) leaves the complete local export.

    Args:
        settings: what to export and where.
    """
    out_dir = settings.out_dir or storage.join(settings.run_dir, rundir.EXPORT_DIR)
    storage.check_reachable(settings.run_dir, "--run-dir")
    storage.check_reachable(out_dir, "--out-dir", write=True)
    step = write_export(settings.run_dir, out_dir, settings.step, settings.overwrite,
                        repo_id=settings.push_to_hub)
    log.info("exported step %d of %s to %s", step, settings.run_dir, out_dir)
    if settings.push_to_hub:
        url = hub.push_folder(out_dir, settings.push_to_hub, private=settings.private)
        log.info("uploaded %s to %s", out_dir, url)
    return out_dir


def write_export(run_dir: str, out_dir: str, step: int | None = None, overwrite: bool = False,
                 repo_id: str | None = None) -> int:
    """Write ``model.safetensors``, ``config.json``, tokenizer files and ``README.md``.

    Args:
        run_dir: the run dir (local or remote).
        out_dir: the export folder to create.
        step: checkpoint step; None for the latest.
        overwrite: replace ``out_dir`` if it exists.
        repo_id: Hub repo id to name in the model card.

    Returns:
        The exported checkpoint's step.
    """
    if overwrite:  # a hand-edited model card is the user's
        ownership.check_folder(out_dir, WRITERS, "tpulm export --overwrite would remove",
                               "choose another --out-dir")
    model_cfg = run_model_config(run_dir)
    step, weights_path = run_checkpoint(run_dir, step)
    tok = open_folder(storage.join(run_dir, rundir.TOKENIZER_DIR))
    state = keras_to_hf(weights.read(weights_path), model_cfg, weights_path)
    hf_cfg = hf_config(model_cfg, tok.special)
    parameters = sum(v.size for v in state.values())
    text = card.model_card(run_dir, step, hf_cfg, parameters, tok,
                           os.path.basename(out_dir.rstrip("/")), repo_id)
    with storage.atomic_folder(out_dir, overwrite, ours=folder.EXPORT_FILES) as tmp:
        folder.save_safetensors(tmp, folder.WEIGHTS_FILE, state)
        storage.write_json(storage.join(tmp, folder.CONFIG_FILE), hf_cfg)
        folder.write_tokenizer(tok.path, tmp, model_cfg.max_positions)
        storage.write_text(storage.join(tmp, folder.CARD_FILE), text)
        ownership.record(tmp, storage.listdir(tmp), "export")
    _log_keras_hub(hf_cfg, out_dir)
    return step


def _log_keras_hub(hf_cfg: dict, out_dir: str) -> None:
    """One line where keras-hub would read the export differently from Transformers."""
    pad = hf_cfg.get("pad_token_id")
    if hf_cfg["model_type"] == "roberta" and pad != card.KERAS_HUB_ROBERTA_PAD_ID:
        log.info("note: keras-hub 0.32 reads %s with RoBERTa's pad id %d, not its own %d, so its "
                 "positions differ (Transformers and tpulm read it right; see its README.md)",
                 out_dir, card.KERAS_HUB_ROBERTA_PAD_ID, pad)
