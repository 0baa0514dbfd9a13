"""``tpulm import``: a Transformers folder -> a run dir that ``tpulm train`` continues from."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tpulm import config, lock, ownership, rundir, storage
from tpulm.data.tokenizer import TOKENIZER_FILE, open_folder
from tpulm.errors import TpulmError
from tpulm.hf import folder
from tpulm.hf.convert import hf_to_keras, model_config_from_hf

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImportConfig:
    """Settings of ``tpulm import``."""

    hf_dir: str = config.setting(
        "", "Transformers RobertaForMaskedLM or ModernBertForMaskedLM folder")
    run_dir: str = config.setting("", "run dir to create")
    allow_pickle: bool = config.setting(False, "allow reading pytorch_model.bin (a pickle)")
    overwrite: bool = config.setting(False, "replace RUN_DIR if it exists")


def import_checkpoint(settings: ImportConfig) -> str:
    """Convert a Transformers checkpoint into a run dir (``config.toml``, ``tokenizer/``,
    ``checkpoints/ckpt-000000000/model.safetensors``), written atomically.

    Args:
        settings: source folder, run dir, and whether pickles may be read.

    Returns:
        The path of the written ``model.safetensors``.
    """
    hf_dir, run_dir = settings.hf_dir, settings.run_dir
    storage.check_reachable(hf_dir, "model folder")
    storage.check_reachable(run_dir, "--run-dir", write=True)
    if settings.overwrite:
        check_replaced_run_dir(run_dir)
    hf_cfg, config_path = folder.read_config(hf_dir)
    model_cfg = model_config_from_hf(hf_cfg, config_path)
    if not storage.exists(storage.join(hf_dir, TOKENIZER_FILE)):
        raise TpulmError(f"{hf_dir} has no {TOKENIZER_FILE}; tpulm needs the fast tokenizer "
                         "(save it with a recent transformers: tokenizer.save_pretrained)")
    arrays = hf_to_keras(folder.read_hf_weights(hf_dir, settings.allow_pickle), model_cfg, hf_dir)
    with storage.atomic_folder(run_dir, settings.overwrite, ours=rundir.NAMES) as tmp:
        tok_dir = storage.join(tmp, rundir.TOKENIZER_DIR)
        folder.write_tokenizer(hf_dir, tok_dir, model_cfg.max_positions)
        pad_id = open_folder(tok_dir).special.pad_id
        if pad_id != model_cfg.pad_token_id:
            raise TpulmError(
                f"{config_path} says pad_token_id {model_cfg.pad_token_id} but its tokenizer's pad "
                f"token has id {pad_id}; positions depend on it: fix {folder.CONFIG_FILE}")
        storage.write_text(storage.join(tmp, rundir.CONFIG_NAME),
                           config.to_toml({"model": config.as_table(model_cfg)}))
        folder.save_safetensors(rundir.checkpoint_dir(tmp, 0), rundir.MODEL_WEIGHTS, arrays)
        ownership.snapshot(tmp, "import")
    return storage.join(rundir.checkpoint_dir(run_dir, 0), rundir.MODEL_WEIGHTS)


def check_replaced_run_dir(run_dir: str) -> None:
    """Before ``--overwrite`` replaces ``run_dir``: no live trainer holds it, nothing in it was
    changed since tpulm wrote it, and what training it held is said to be dropped."""
    if not storage.isdir(run_dir):
        return
    lock.check_free(run_dir)
    ownership.check_folder(run_dir, None, "tpulm import --overwrite would remove",
                           "choose another --run-dir")
    trained = [step for step, _ in rundir.list_checkpoints(run_dir) if step > 0]
    if trained:
        log.warning("--overwrite: %s holds %d trained checkpoint(s) (latest step %d) and their "
                    "metrics; they are dropped and replaced by the imported weights at step 0",
                    run_dir, len(trained), trained[-1])
