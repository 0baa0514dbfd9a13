"""The ``README.md`` model card of an export, written from the export's own ``config.json``.

Every fact about the network (class, ``model_type`` tag, sizes, attention and positions) is read
from the ``config.json`` written beside it, so the card cannot describe another architecture
than the one Transformers loads; the recipe comes from the run's resolved ``config.toml``.
"""

from __future__ import annotations

import json
import string
import tomllib
from typing import Any

from tpulm import rundir, storage
from tpulm.data.tokenizer import TokenizerFolder
from tpulm.metrics_log import read_metrics

# config.json's model_type -> the architecture's name in prose.
FAMILIES = {"roberta": "RoBERTa", "modernbert": "ModernBERT"}
# keras-hub 0.32's RoBERTa converter drops the first 2 rows of the position table (RoBERTa's pad
# id 1 + 1) whatever config.json's pad_token_id says; Transformers starts at pad_token_id + 1.
KERAS_HUB_ROBERTA_PAD_ID = 1


def keras_hub_note(hf_cfg: dict[str, Any]) -> str:
    """What a keras-hub 0.32 user must know about this export (one paragraph)."""
    pad = hf_cfg.get("pad_token_id")
    if hf_cfg["model_type"] == "modernbert":
        return ("keras-hub 0.32 has no ModernBERT converter: load this folder with Transformers "
                "or tpulm.")
    if pad == KERAS_HUB_ROBERTA_PAD_ID:
        return ("keras-hub 0.32 loads this folder as `RobertaBackbone` "
                "(`keras_hub.models.RobertaBackbone.from_preset(folder)`) with the same hidden "
                "states as Transformers: its pad id is RoBERTa's 1.")
    return (f"keras-hub 0.32's `RobertaBackbone.from_preset(folder)` loads this folder but "
            f"assumes RoBERTa's pad id {KERAS_HUB_ROBERTA_PAD_ID} (positions from row "
            f"{KERAS_HUB_ROBERTA_PAD_ID + 1} of the position table), while this tokenizer's pad "
            f"id is {pad} (positions from row {pad + 1}, as Transformers computes them from "
            f"`pad_token_id`): its hidden states differ from Transformers'. Load this folder "
            "with Transformers or tpulm; a tokenizer whose pad id is 1 (tpulm's byte-level BPE) "
            "gives exports keras-hub reads the same.")


def _size_rows(hf_cfg: dict[str, Any], parameters: int) -> list[tuple[str, str]]:
    """``(setting, value)`` rows of the model table, from ``config.json``."""
    rows = [("architecture", f"`{hf_cfg['architectures'][0]}`"),
            ("layers", hf_cfg["num_hidden_layers"]), ("hidden size", hf_cfg["hidden_size"]),
            ("attention heads", hf_cfg["num_attention_heads"]),
            ("feed-forward size", hf_cfg["intermediate_size"])]
    if hf_cfg["model_type"] == "modernbert":
        every = hf_cfg["global_attn_every_n_layers"]
        rows += [("attention", f"global every {every} layers (from layer 0), the others a "
                               f"sliding window of {hf_cfg['local_attention']} tokens"),
                 ("positions", f"rotary (base {hf_cfg['global_rope_theta']:g} global, "
                               f"{hf_cfg['local_rope_theta']:g} local)"),
                 ("longest input (tokens)", hf_cfg["max_position_embeddings"])]
    else:
        offset = hf_cfg["pad_token_id"] + 1
        rows += [("positions", f"learned, from row {offset} (`pad_token_id` + 1)"),
                 ("longest input (tokens)", hf_cfg["max_position_embeddings"] - offset)]
    rows += [("vocabulary", hf_cfg["vocab_size"]), ("parameters", f"{parameters:,}")]
    return [(name, str(value)) for name, value in rows]


def recipe_lines(train: dict[str, Any]) -> list[str]:
    """The pretraining recipe of a run's ``[train]`` table, as bullet lines (what is recorded)."""
    lines = []
    if "mlm_probability" in train:
        unit = "whole words" if train.get("whole_word_mask") else "tokens"
        lines.append(f"masked-LM objective: {train['mlm_probability']:.0%} of the {unit} "
                     f"selected, dynamic masking")
    if "document_attention" in train:
        lines.append("document attention (each packed document attends only to itself, "
                     "positions restart per document): "
                     + ("on" if train["document_attention"] else "off"))
    named = (("batch_size", "batch size per replica"), ("max_steps", "steps"),
             ("learning_rate", "peak learning rate"), ("precision", "precision"),
             ("backend", "Keras backend"))
    lines += [f"{label}: {train[key]}" for key, label in named if train.get(key) is not None]
    return lines


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


def model_card(run_dir: str, step: int, hf_cfg: dict[str, Any], parameters: int,
               tok: TokenizerFolder, folder_name: str, repo_id: str | None = None) -> str:
    """The ``README.md`` model card of an export (model, tokenizer, recipe, metrics, usage).

    Args:
        run_dir: the run dir being exported.
        step: the exported checkpoint's step.
        hf_cfg: the export's ``config.json`` (the card's source for the network).
        parameters: the exported tensors' parameter count.
        tok: the run's tokenizer.
        folder_name: the export folder's name.
        repo_id: the Hub repo id, when the export is uploaded.
    """
    from importlib import resources

    special = tok.special
    tokens = [tok.tokenizer.id_to_token(i) for i in special.ids]
    train, evaluation = _metrics_at(run_dir, step)
    settings = storage.read_text(storage.join(run_dir, rundir.CONFIG_NAME))
    recipe = recipe_lines(tomllib.loads(settings).get("train", {}))
    family = FAMILIES[hf_cfg["model_type"]]
    template = (resources.files("tpulm") / "templates" / "model_card.md").read_text("utf-8")
    return string.Template(template).substitute(
        name=repo_id or folder_name, family=family, model_type=hf_cfg["model_type"],
        architecture=hf_cfg["architectures"][0],
        model_rows="\n".join(f"| {k} | {v} |" for k, v in _size_rows(hf_cfg, parameters)),
        tokenizer_kind=json.loads(tok.tokenizer.to_str())["model"]["type"],
        tokenizer_vocab=tok.tokenizer.get_vocab_size(),
        special_tokens=", ".join(f"`{t}`" for t in tokens), pad_id=special.pad_id,
        fingerprint=tok.fingerprint, step=step,
        tokens=f"{train['tokens']:,}" if train and "tokens" in train else "not recorded",
        recipe="\n".join(f"- {line}" for line in recipe) or "- not recorded",
        training_config=settings.strip(), evaluation=_evaluation_text(evaluation),
        keras_hub=keras_hub_note(hf_cfg), model_ref=repo_id or f"path/to/{folder_name}",
        folder_name=folder_name, mask_token=tok.tokenizer.id_to_token(special.mask_id))
