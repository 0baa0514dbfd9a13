"""``tpulm export``: a run dir's checkpoint -> a Transformers folder with a model card."""

from __future__ import annotations

import json
import logging
import os
import string
from dataclasses import dataclass

import numpy as np

from tpulm import config, ownership, rundir, storage
from tpulm.data.tokenizer import TokenizerFolder, open_folder
from tpulm.hf import folder, hub
from tpulm.hf.convert import hf_config, keras_to_hf
from tpulm.metrics_log import read_metrics
from tpulm.model import weights
from tpulm.model.config import ModelConfig, run_model_config
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
    card = model_card(run_dir, step, model_cfg, state, tok, os.path.basename(out_dir.rstrip("/")),
                      repo_id)
    with storage.atomic_folder(out_dir, overwrite, ours=folder.EXPORT_FILES) as tmp:
        folder.save_safetensors(tmp, folder.WEIGHTS_FILE, state)
        storage.write_json(storage.join(tmp, folder.CONFIG_FILE), hf_cfg)
        folder.write_tokenizer(tok.path, tmp, model_cfg.max_positions)
        storage.write_text(storage.join(tmp, folder.CARD_FILE), card)
        ownership.record(tmp, storage.listdir(tmp), "export")
    return step


def _metrics_at(run_dir: str, step: int) -> tuple[dict | None, dict | None]:
    """The last train and eval lines of ``metrics.jsonl`` at or before ``step``."""
    path = storage.join(run_dir, rundir.METRICS_NAME)
    last: dict[str, dict | None] = {"train": None, "eval": None}
    for record in read_metrics(path) if storage.exists(path) else []:
        if record["step"] <= step:
            last[record["split"]] = record
    return last["train"], last["eval"]


def _evaluation_text(record: dict | None) -> str:
    if not record:
        return "No evaluation was recorded for this checkpoint."
    rows = [f"| {k} | {record[k]:.4f} |" for k in ("loss", "accuracy", "perplexity") if k in record]
    return (f"On the validation shards at step {record['step']}, over masked positions only:\n\n"
            "| metric | value |\n|---|---|\n" + "\n".join(rows))


def model_card(run_dir: str, step: int, model_cfg: ModelConfig, state: dict[str, np.ndarray],
               tok: TokenizerFolder, folder_name: str, repo_id: str | None = None) -> str:
    """The ``README.md`` model card of an export (data, tokenizer, steps, metrics, usage).

    Args:
        run_dir: the run dir being exported.
        step: the exported checkpoint's step.
        model_cfg: its model config.
        state: the exported tensors (for the parameter count).
        tok: the run's tokenizer.
        folder_name: the export folder's name.
        repo_id: the Hub repo id, when the export is uploaded.
    """
    from importlib import resources

    special = tok.special
    tokens = [tok.tokenizer.id_to_token(i) for i in special.ids]
    train, evaluation = _metrics_at(run_dir, step)
    settings = storage.read_text(storage.join(run_dir, rundir.CONFIG_NAME))
    template = (resources.files("tpulm") / "templates" / "model_card.md").read_text("utf-8")
    return string.Template(template).substitute(
        name=repo_id or folder_name, num_layers=model_cfg.num_layers, hidden_size=model_cfg.hidden_size,
        num_heads=model_cfg.num_heads, intermediate_size=model_cfg.intermediate_size,
        max_positions=model_cfg.max_positions, vocab_size=model_cfg.vocab_size,
        parameters=f"{sum(v.size for v in state.values()):,}",
        tokenizer_kind=json.loads(tok.tokenizer.to_str())["model"]["type"],
        tokenizer_vocab=tok.tokenizer.get_vocab_size(), special_tokens=", ".join(f"`{t}`" for t in tokens),
        pad_id=special.pad_id, fingerprint=tok.fingerprint, step=step,
        tokens=f"{train['tokens']:,}" if train and "tokens" in train else "not recorded",
        training_config=settings.strip(), evaluation=_evaluation_text(evaluation),
        model_ref=repo_id or f"path/to/{folder_name}", folder_name=folder_name,
        mask_token=tokens[-1])
