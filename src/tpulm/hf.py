"""The whole Keras <-> Transformers map for RoBERTa MLM: config keys and weight names, one place.

Keras variable paths (without the model-name prefix, e.g. ``roberta_mlm/``) map to
``RobertaForMaskedLM`` state-dict keys as follows (``i`` = block index; "T" = transposed, since
Keras ``Dense`` kernels are (in, out) and ``torch.nn.Linear`` weights are (out, in)):

=============================================  ====================================================
Keras path                                     Transformers key
=============================================  ====================================================
embeddings/word_embeddings/embeddings          roberta.embeddings.word_embeddings.weight
embeddings/position_embeddings/embeddings      roberta.embeddings.position_embeddings.weight
embeddings/token_type_embeddings/embeddings    roberta.embeddings.token_type_embeddings.weight
embeddings/layer_norm/gamma | beta             roberta.embeddings.LayerNorm.weight | bias
layer_i/query/kernel (T) | bias                roberta.encoder.layer.i.attention.self.query.weight | bias
layer_i/key/kernel (T) | bias                  roberta.encoder.layer.i.attention.self.key.weight | bias
layer_i/value/kernel (T) | bias                roberta.encoder.layer.i.attention.self.value.weight | bias
layer_i/attention_output/kernel (T) | bias     roberta.encoder.layer.i.attention.output.dense.weight | bias
layer_i/attention_layer_norm/gamma | beta      roberta.encoder.layer.i.attention.output.LayerNorm.weight | bias
layer_i/intermediate/kernel (T) | bias         roberta.encoder.layer.i.intermediate.dense.weight | bias
layer_i/output/kernel (T) | bias               roberta.encoder.layer.i.output.dense.weight | bias
layer_i/output_layer_norm/gamma | beta         roberta.encoder.layer.i.output.LayerNorm.weight | bias
lm_head/dense/kernel (T) | bias                lm_head.dense.weight | bias
lm_head/layer_norm/gamma | beta                lm_head.layer_norm.weight | bias
lm_head/bias                                   lm_head.bias
(tied: word_embeddings, lm_head/bias)          lm_head.decoder.weight, lm_head.decoder.bias
=============================================  ====================================================

The tied decoder tensors are not written on export (Transformers re-ties them on load, and its
own ``save_pretrained`` leaves them out too); on import they are accepted when they equal the
tensors they are tied to.
"""

from __future__ import annotations

import json
import logging
import os
import string
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from tpulm import config, hf_modernbert, rundir, storage, weights
from tpulm.errors import TpulmError
from tpulm.model import MODEL_NAME, ModelConfig, run_checkpoint, run_model_config
from tpulm.tokenizer import (SPECIAL_ROLES, SPECIAL_TOKENS_MAP_FILE, TOKENIZER_CONFIG_FILE,
                             TOKENIZER_FILE, SpecialTokens, fingerprint, load_tokenizer,
                             special_tokens)

log = logging.getLogger(__name__)

ARCHITECTURE = "RobertaForMaskedLM"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PICKLE_FILE = "pytorch_model.bin"
CARD_FILE = "README.md"

# Decoder tensors Transformers ties to other tensors: tied key -> the key it shares storage with.
TIED = {
    "lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
    "lm_head.decoder.bias": "lm_head.bias",
}
_LAYER_NORM = (("gamma", "weight", False), ("beta", "bias", False))
_DENSE = (("kernel", "weight", True), ("bias", "bias", False))


def weight_map(cfg: ModelConfig) -> list[tuple[str, str, bool]]:
    """``(keras path without model prefix, transformers key, transpose)`` for every weight.

    Args:
        cfg: the model sizes (the number of blocks decides the rows).
    """
    rows: list[tuple[str, str, bool]] = []

    def add(keras_layer: str, hf_module: str, params) -> None:
        rows.extend((f"{keras_layer}/{k}", f"{hf_module}.{h}", t) for k, h, t in params)

    for table in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        rows.append((f"embeddings/{table}/embeddings", f"roberta.embeddings.{table}.weight", False))
    add("embeddings/layer_norm", "roberta.embeddings.LayerNorm", _LAYER_NORM)
    for i in range(cfg.num_layers):
        hf = f"roberta.encoder.layer.{i}"
        for name in ("query", "key", "value"):
            add(f"layer_{i}/{name}", f"{hf}.attention.self.{name}", _DENSE)
        add(f"layer_{i}/attention_output", f"{hf}.attention.output.dense", _DENSE)
        add(f"layer_{i}/attention_layer_norm", f"{hf}.attention.output.LayerNorm", _LAYER_NORM)
        add(f"layer_{i}/intermediate", f"{hf}.intermediate.dense", _DENSE)
        add(f"layer_{i}/output", f"{hf}.output.dense", _DENSE)
        add(f"layer_{i}/output_layer_norm", f"{hf}.output.LayerNorm", _LAYER_NORM)
    add("lm_head/dense", "lm_head.dense", _DENSE)
    add("lm_head/layer_norm", "lm_head.layer_norm", _LAYER_NORM)
    rows.append(("lm_head/bias", "lm_head.bias", False))
    return rows


def keras_to_hf(arrays: dict[str, np.ndarray], cfg: ModelConfig,
                where: str = "the checkpoint") -> dict[str, np.ndarray]:
    """tpulm weights (``{variable path: array}``, as :mod:`tpulm.weights` writes them) as a
    ``RobertaForMaskedLM`` state dict of float32 contiguous arrays.

    Args:
        arrays: Keras variable path -> array; the leading model-name component is ignored.
        cfg: the model config.
        where: what to name in error messages.
    """
    if cfg.architecture == "modernbert":
        return hf_modernbert.keras_to_hf(arrays, cfg, where)
    short = {path.split("/", 1)[-1]: value for path, value in arrays.items()}
    rows = weight_map(cfg)
    expected = {keras_path for keras_path, _, _ in rows}
    missing, unexpected = sorted(expected - set(short)), sorted(set(short) - expected)
    if missing or unexpected:
        raise TpulmError(
            f"{where} does not hold the weights of this model config: missing "
            f"{missing or 'nothing'}, unexpected {unexpected or 'nothing'}"
        )
    state = {}
    for keras_path, hf_key, transpose in rows:
        value = np.asarray(short[keras_path], dtype=np.float32)
        state[hf_key] = np.ascontiguousarray(value.T if transpose else value)
    check_state_dict(state, cfg, where)  # shapes against the config
    return state


def hf_to_keras(state: dict[str, np.ndarray], cfg: ModelConfig, where: str = "the checkpoint",
                prefix: str | None = None) -> dict[str, np.ndarray]:
    """A ``RobertaForMaskedLM`` state dict as tpulm weights keyed by Keras variable path.

    Args:
        state: tensor name -> array.
        cfg: the model config (from :func:`model_config_from_hf`).
        where: what to name in error messages (a file or folder).
        prefix: the model-name component of the variable paths (default: the architecture's).
    """
    if cfg.architecture == "modernbert":
        return hf_modernbert.hf_to_keras(state, cfg, where, prefix or hf_modernbert.MODEL_NAME)
    prefix = prefix or MODEL_NAME
    check_state_dict(state, cfg, where)
    arrays = {}
    for keras_path, hf_key, transpose in weight_map(cfg):
        value = np.asarray(state[hf_key], dtype=np.float32)
        arrays[f"{prefix}/{keras_path}"] = np.ascontiguousarray(value.T if transpose else value)
    return arrays


def to_hf_state_dict(model, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """The Keras model's weights as a ``RobertaForMaskedLM`` state dict (float32).

    Args:
        model: a model from :func:`tpulm.model.build_model`.
        cfg: its config.
    """
    return keras_to_hf(weights.to_arrays(model.weights), cfg, "the model")


def from_hf_state_dict(model, cfg: ModelConfig, state: dict[str, np.ndarray],
                       where: str = "the checkpoint") -> None:
    """Assign a ``RobertaForMaskedLM`` state dict to the Keras model, checking every tensor.

    Args:
        model: a model from :func:`tpulm.model.build_model` built with ``cfg``.
        cfg: the model config.
        state: tensor name -> numpy array.
        where: what to name in error messages (a file or folder).
    """
    prefix = model.weights[0].path.split("/", 1)[0]
    weights.assign(model.weights, hf_to_keras(state, cfg, where, prefix), where)


def check_state_dict(state: dict[str, np.ndarray], cfg: ModelConfig, where: str) -> None:
    """Raise a TpulmError listing missing/unexpected tensors, wrong shapes or untied decoders."""
    rows = weight_map(cfg)
    expected = {hf_key for _, hf_key, _ in rows}
    tolerated = set(TIED) | {"roberta.embeddings.position_ids"}
    missing = sorted(expected - set(state))
    unexpected = sorted(set(state) - expected - tolerated)
    if missing or unexpected:
        raise TpulmError(
            f"{where} is not a {ARCHITECTURE} checkpoint of its config: missing tensors "
            f"{missing or 'none'}; unexpected tensors {unexpected or 'none'}"
        )
    shapes = _hf_shapes(cfg)
    wrong = [f"{k} {tuple(np.shape(state[k]))} (expected {shapes[k]})"
             for k in sorted(expected) if tuple(np.shape(state[k])) != shapes[k]]
    if wrong:
        raise TpulmError(f"{where}: tensors with wrong shapes for its config: {'; '.join(wrong)}")
    for tied, target in TIED.items():
        if tied in state and not np.array_equal(state[tied], state[target]):
            raise TpulmError(
                f"{where}: {tied} differs from {target}; tpulm ties them (untied decoders are "
                "not supported)"
            )


def _hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The Transformers shape of every tensor of ``cfg`` (Linear weights are (out, in))."""
    h, f = cfg.hidden_size, cfg.intermediate_size
    shapes = {
        "roberta.embeddings.word_embeddings.weight": (cfg.vocab_size, h),
        "roberta.embeddings.position_embeddings.weight": (cfg.max_position_embeddings, h),
        "roberta.embeddings.token_type_embeddings.weight": (cfg.type_vocab_size, h),
        "lm_head.bias": (cfg.vocab_size,),
    }
    for _, key, _ in weight_map(cfg):
        if key in shapes:
            continue
        module, param = key.rsplit(".", 1)
        if module.endswith(".intermediate.dense"):
            out, inp = f, h
        elif module.endswith(".output.dense") and ".attention." not in module:
            out, inp = h, f  # the feed-forward output projection
        else:
            out, inp = h, h  # q/k/v, attention output, LM-head dense, LayerNorms
        is_matrix = param == "weight" and "LayerNorm" not in module and "layer_norm" not in module
        shapes[key] = (out, inp) if is_matrix else (out,)
    return shapes


def hf_model_kwargs(cfg: ModelConfig) -> dict[str, Any]:
    """``RobertaConfig`` keyword arguments for the sizes of ``cfg`` (no token roles but pad)."""
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.intermediate_size,
        "hidden_act": "gelu",
        "hidden_dropout_prob": cfg.hidden_dropout,
        "attention_probs_dropout_prob": cfg.attention_dropout,
        "max_position_embeddings": cfg.max_position_embeddings,
        "type_vocab_size": cfg.type_vocab_size,
        "initializer_range": cfg.initializer_range,
        "layer_norm_eps": cfg.layer_norm_eps,
        "pad_token_id": cfg.pad_token_id,
        "tie_word_embeddings": True,
    }


def hf_config(cfg: ModelConfig, special_tokens: SpecialTokens) -> dict[str, Any]:
    """The ``config.json`` of a Transformers ``RobertaForMaskedLM`` equal to the tpulm model.

    Token roles come from *this* tokenizer: RoBERTa derives position ids from ``pad_token_id``,
    so a wrong pad id (e.g. roberta-base's 1 with the reference Unigram's ``<pad>`` = 3) would
    silently shift every position after a ``[SEP]``.

    Args:
        cfg: the model config.
        special_tokens: the tokenizer's special token ids.
    """
    if cfg.architecture == "modernbert":
        return hf_modernbert.hf_config(cfg, special_tokens)
    if special_tokens.pad_id != cfg.pad_token_id:
        raise TpulmError(
            f"the model was built with pad_token_id {cfg.pad_token_id} but the tokenizer's pad "
            f"token has id {special_tokens.pad_id}; positions would not match"
        )
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "roberta",
        **hf_model_kwargs(cfg),
        "bos_token_id": special_tokens.cls_id,
        "eos_token_id": special_tokens.sep_id,
        "position_embedding_type": "absolute",
        "dtype": "float32",
    }


def model_config_from_hf(hf: dict[str, Any], where: str) -> ModelConfig:
    """The tpulm model config of a Transformers ``config.json``: RobertaForMaskedLM, or
    ModernBertForMaskedLM (:mod:`tpulm.hf_modernbert`).

    Args:
        hf: the parsed ``config.json``.
        where: the file, for error messages.
    """
    if hf.get("model_type") == hf_modernbert.MODEL_TYPE:
        return hf_modernbert.model_config_from_hf(hf, where)
    architectures = hf.get("architectures") or []
    if hf.get("model_type") != "roberta" or ARCHITECTURE not in architectures:
        raise TpulmError(
            f"{where} describes model_type {hf.get('model_type')!r} with architectures "
            f"{architectures}; tpulm imports only model_type 'roberta' / {ARCHITECTURE}"
        )
    unsupported = {
        "hidden_act": (hf.get("hidden_act", "gelu"), "gelu"),
        "position_embedding_type": (hf.get("position_embedding_type", "absolute"), "absolute"),
        "is_decoder": (hf.get("is_decoder", False), False),
        "tie_word_embeddings": (hf.get("tie_word_embeddings", True), True),
    }
    bad = [f"{k}={got!r} (needs {want!r})" for k, (got, want) in unsupported.items() if got != want]
    if bad:
        raise TpulmError(f"{where}: unsupported settings {', '.join(bad)}")
    names = {"vocab_size": "vocab_size", "hidden_size": "hidden_size",
             "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
             "intermediate_size": "intermediate_size",
             "max_position_embeddings": "max_position_embeddings",
             "type_vocab_size": "type_vocab_size", "pad_token_id": "pad_token_id",
             "layer_norm_eps": "layer_norm_eps", "hidden_dropout": "hidden_dropout_prob",
             "attention_dropout": "attention_probs_dropout_prob",
             "initializer_range": "initializer_range"}
    missing = sorted(hf_name for hf_name in names.values() if hf.get(hf_name) is None)
    if missing:
        raise TpulmError(f"{where} lacks {', '.join(missing)}")
    table = {ours: hf[theirs] for ours, theirs in names.items()}
    for key in ("layer_norm_eps", "hidden_dropout", "attention_dropout", "initializer_range"):
        table[key] = float(table[key])
    return config.from_mapping(ModelConfig, table, where)


# ---------------------------------------------------------------------------------------------
# Transformers folders: reading weights, export, import
# ---------------------------------------------------------------------------------------------


def read_hf_weights(hf_dir: str, allow_pickle: bool = False) -> dict[str, np.ndarray]:
    """All tensors of a Transformers checkpoint folder as float32 numpy arrays.

    Reads ``model.safetensors`` or the shards of ``model.safetensors.index.json``; a PyTorch
    pickle (``pytorch_model.bin``) only with ``allow_pickle``, since unpickling can run code.

    Args:
        hf_dir: the folder (local or remote).
        allow_pickle: permit reading ``pytorch_model.bin`` (needs torch).
    """
    from safetensors.numpy import load as load_bytes

    single, index = storage.join(hf_dir, WEIGHTS_FILE), storage.join(hf_dir, INDEX_FILE)
    if storage.exists(single):
        files = [single]
    elif storage.exists(index):
        names = sorted(set(json.loads(storage.read_text(index))["weight_map"].values()))
        files = [storage.join(hf_dir, name) for name in names]
    elif storage.exists(storage.join(hf_dir, PICKLE_FILE)):
        if not allow_pickle:
            raise TpulmError(
                f"{hf_dir} holds only {PICKLE_FILE}, a pickle that can run code when loaded; pass "
                "--allow-pickle if you trust its source, or convert it to safetensors"
            )
        return _read_pickle(storage.join(hf_dir, PICKLE_FILE))
    else:
        raise TpulmError(f"{hf_dir} has no {WEIGHTS_FILE}, {INDEX_FILE} or {PICKLE_FILE}")
    state: dict[str, np.ndarray] = {}
    for path in files:
        try:
            state.update(load_bytes(storage.read_bytes(path)))
        except Exception as err:  # safetensors raises several types for corrupt/unsupported data
            raise TpulmError(f"cannot read {path}: {err}") from None
    return {k: v.astype(np.float32) if v.dtype != np.float32 else v for k, v in state.items()}


def _read_pickle(path: str) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError:
        raise TpulmError(f"reading {path} needs torch: pip install 'tpulm[hf]'") from None
    with storage.open_file(path, "rb") as f:
        state = torch.load(f, map_location="cpu", weights_only=True)
    return {k: v.float().numpy() for k, v in state.items()}


def _write_tokenizer(src_dir: str, dst_dir: str, max_positions: int | None) -> None:
    """Copy the tokenizer files; complete ``tokenizer_config.json`` with the special-token roles
    (from ``special_tokens_map.json``) and a ``model_max_length`` the model can take."""
    storage.makedirs(dst_dir)
    tok_config = _read_json(storage.join(src_dir, TOKENIZER_CONFIG_FILE))
    token_map = _read_json(storage.join(src_dir, SPECIAL_TOKENS_MAP_FILE))
    for role in SPECIAL_ROLES:
        if role not in tok_config and role in token_map:
            tok_config[role] = token_map[role]
    tok_config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    if max_positions and tok_config.get("model_max_length", 1 << 62) > max_positions:
        tok_config["model_max_length"] = max_positions
    storage.write_bytes(storage.join(dst_dir, TOKENIZER_FILE),
                        storage.read_bytes(storage.join(src_dir, TOKENIZER_FILE)))
    storage.write_text(storage.join(dst_dir, TOKENIZER_CONFIG_FILE), _dumps(tok_config))
    roles = {r: tok_config[r] for r in SPECIAL_ROLES if r in tok_config}
    storage.write_text(storage.join(dst_dir, SPECIAL_TOKENS_MAP_FILE), _dumps({**token_map, **roles}))


def _read_json(path: str) -> dict[str, Any]:
    if not storage.exists(path):
        return {}
    try:
        return json.loads(storage.read_text(path))
    except json.JSONDecodeError as err:
        raise TpulmError(f"{path} is not valid JSON: {err}") from None


def _dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def _save_safetensors(folder: str, name: str, arrays: dict[str, np.ndarray]) -> None:
    from safetensors.numpy import save as save_bytes

    storage.makedirs(folder)
    path = storage.join(folder, name)
    # Transformers checks the "format" metadata of safetensors files it loads.
    storage.write_bytes(path, save_bytes(arrays, metadata={"format": "pt"}))


@contextmanager
def _atomic_folder(out_dir: str, overwrite: bool) -> Iterator[str]:
    """Yield a temporary sibling folder that replaces ``out_dir`` (by rename) once complete; on
    error it is deleted, so no half-written folder appears under ``out_dir``."""
    if storage.exists(out_dir) and (not storage.isdir(out_dir) or storage.listdir(out_dir)):
        if not overwrite:
            raise TpulmError(
                f"{out_dir} already exists and is not empty; pass --overwrite or choose another "
                "folder")
    with storage.atomic_path(out_dir) as tmp:
        storage.makedirs(tmp)
        yield tmp


# ---------------------------------------------------------------------------------------------
# Export: run dir -> Transformers folder (+ model card, + optional Hub upload)
# ---------------------------------------------------------------------------------------------


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
    step = write_export(settings.run_dir, out_dir, settings.step, settings.overwrite,
                        repo_id=settings.push_to_hub)
    log.info("exported step %d of %s to %s", step, settings.run_dir, out_dir)
    if settings.push_to_hub:
        url = push_folder(out_dir, settings.push_to_hub, private=settings.private)
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
    model_cfg = run_model_config(run_dir)
    step, weights_path = run_checkpoint(run_dir, step)
    tok_dir = storage.join(run_dir, rundir.TOKENIZER_DIR)
    state = keras_to_hf(weights.read(weights_path), model_cfg, weights_path)
    hf_cfg = hf_config(model_cfg, special_tokens(tok_dir))
    card = model_card(run_dir, step, model_cfg, state, os.path.basename(out_dir.rstrip("/")),
                      repo_id)
    with _atomic_folder(out_dir, overwrite) as tmp:
        _save_safetensors(tmp, WEIGHTS_FILE, state)
        storage.write_text(storage.join(tmp, CONFIG_FILE), _dumps(hf_cfg))
        _write_tokenizer(tok_dir, tmp, model_cfg.max_positions)
        storage.write_text(storage.join(tmp, CARD_FILE), card)
    return step


def _metrics_at(run_dir: str, step: int) -> tuple[dict | None, dict | None]:
    """The last train and eval lines of ``metrics.jsonl`` at or before ``step``."""
    path = storage.join(run_dir, rundir.METRICS_NAME)
    last: dict[str, dict | None] = {"train": None, "eval": None}
    if storage.exists(path):
        for line in storage.read_text(path).splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash: the earlier lines still count
            if record.get("split") in last and record.get("step", 0) <= step:
                last[record["split"]] = record
    return last["train"], last["eval"]


def _evaluation_text(record: dict | None) -> str:
    if not record:
        return "No evaluation was recorded for this checkpoint."
    rows = [f"| {k} | {record[k]:.4f} |" for k in ("loss", "accuracy", "perplexity") if k in record]
    return (f"On the validation shards at step {record['step']}, over masked positions only:\n\n"
            "| metric | value |\n|---|---|\n" + "\n".join(rows))


def model_card(run_dir: str, step: int, model_cfg: ModelConfig, state: dict[str, np.ndarray],
               folder_name: str, repo_id: str | None = None) -> str:
    """The ``README.md`` model card of an export (data, tokenizer, steps, metrics, usage).

    Args:
        run_dir: the run dir being exported.
        step: the exported checkpoint's step.
        model_cfg: its model config.
        state: the exported tensors (for the parameter count).
        folder_name: the export folder's name.
        repo_id: the Hub repo id, when the export is uploaded.
    """
    from importlib import resources

    tok_dir = storage.join(run_dir, rundir.TOKENIZER_DIR)
    special = special_tokens(tok_dir)
    tok = load_tokenizer(tok_dir)
    tokens = [tok.id_to_token(i) for i in special.ids]
    train, evaluation = _metrics_at(run_dir, step)
    settings = storage.read_text(storage.join(run_dir, rundir.CONFIG_NAME))
    template = (resources.files("tpulm") / "templates" / "model_card.md").read_text("utf-8")
    return string.Template(template).substitute(
        name=repo_id or folder_name, num_layers=model_cfg.num_layers, hidden_size=model_cfg.hidden_size,
        num_heads=model_cfg.num_heads, intermediate_size=model_cfg.intermediate_size,
        max_positions=model_cfg.max_positions, vocab_size=model_cfg.vocab_size,
        parameters=f"{sum(v.size for v in state.values()):,}",
        tokenizer_kind=json.loads(tok.to_str())["model"]["type"],
        tokenizer_vocab=tok.get_vocab_size(), special_tokens=", ".join(f"`{t}`" for t in tokens),
        pad_id=special.pad_id, fingerprint=fingerprint(tok_dir), step=step,
        tokens=f"{train['tokens']:,}" if train and "tokens" in train else "not recorded",
        training_config=settings.strip(), evaluation=_evaluation_text(evaluation),
        model_ref=repo_id or f"path/to/{folder_name}", folder_name=folder_name,
        mask_token=tokens[-1])


def hub_files(folder: str) -> list[str]:
    """The files an upload of ``folder`` sends: exactly the export's files, nothing else."""
    return [name for name in storage.listdir(folder) if not storage.isdir(storage.join(folder, name))]


def check_hub_access(repo_id: str) -> None:
    """Fail early, with a clear message, when an upload to ``repo_id`` cannot work.

    Call it before long work (training) whose result is to be pushed. The token is looked up
    where Hugging Face tools keep it (``HF_TOKEN``, ``hf auth login``) and never shown.

    Args:
        repo_id: the Hub repository id (``user/name``).
    """
    import huggingface_hub
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise TpulmError(f"--push-to-hub {repo_id!r} is not a valid Hub repo id: {err}") from None
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    if offline or huggingface_hub.constants.HF_HUB_OFFLINE:
        raise TpulmError(
            f"cannot push to {repo_id}: HF_HUB_OFFLINE is set; unset it on a machine with network "
            "access")
    if not huggingface_hub.get_token():
        raise TpulmError(
            f"cannot push to {repo_id}: no Hugging Face token found; run `hf auth login` or set "
            "HF_TOKEN")


def push_folder(folder: str, repo_id: str, private: bool = True) -> str:
    """Upload exactly the files of ``folder`` to the Hub model repo ``repo_id``; returns its URL.

    Args:
        folder: a local export folder.
        repo_id: the Hub repository id; created (private by default) when missing.
        private: create the repository as private.
    """
    from huggingface_hub import HfApi

    keep = f"the export stays in {folder}; upload it later with `hf upload {repo_id} {folder}`"
    try:
        check_hub_access(repo_id)
    except TpulmError as err:
        raise TpulmError(f"{err}; {keep}") from None
    if storage.is_remote(folder):
        raise TpulmError(f"uploading needs a local folder, not {folder}; {keep}")
    api = HfApi()
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(folder_path=folder, repo_id=repo_id, repo_type="model",
                          allow_patterns=hub_files(folder),
                          commit_message="Upload model exported by tpulm")
    except Exception as err:  # network, auth and HTTP errors of huggingface_hub
        first_line = str(err).splitlines()[0] if str(err) else ""
        raise TpulmError(f"upload to {repo_id} failed ({type(err).__name__}: {first_line}); "
                         f"{keep}") from None
    return str(url)


# ---------------------------------------------------------------------------------------------
# Import: Transformers folder -> run dir that `tpulm train` continues from
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImportConfig:
    """Settings of ``tpulm import``."""

    hf_dir: str = config.setting("", "Transformers RobertaForMaskedLM folder")
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
    config_path = storage.join(hf_dir, CONFIG_FILE)
    if not storage.exists(config_path):
        raise TpulmError(f"{hf_dir} has no {CONFIG_FILE}; is it a Transformers model folder?")
    model_cfg = model_config_from_hf(_read_json(config_path), config_path)
    if not storage.exists(storage.join(hf_dir, TOKENIZER_FILE)):
        raise TpulmError(f"{hf_dir} has no {TOKENIZER_FILE}; tpulm needs the fast tokenizer "
                         "(save it with a recent transformers: tokenizer.save_pretrained)")
    arrays = hf_to_keras(read_hf_weights(hf_dir, settings.allow_pickle), model_cfg, hf_dir)
    with _atomic_folder(run_dir, settings.overwrite) as tmp:
        tok_dir = storage.join(tmp, rundir.TOKENIZER_DIR)
        _write_tokenizer(hf_dir, tok_dir, model_cfg.max_positions)
        pad_id = special_tokens(tok_dir).pad_id
        if pad_id != model_cfg.pad_token_id:
            raise TpulmError(
                f"{config_path} says pad_token_id {model_cfg.pad_token_id} but its tokenizer's pad "
                f"token has id {pad_id}; positions depend on it: fix {CONFIG_FILE}")
        storage.write_text(storage.join(tmp, rundir.CONFIG_NAME),
                           config.to_toml({"model": config.as_table(model_cfg)}))
        _save_safetensors(rundir.checkpoint_dir(tmp, 0), rundir.MODEL_WEIGHTS, arrays)
    return storage.join(rundir.checkpoint_dir(run_dir, 0), rundir.MODEL_WEIGHTS)
