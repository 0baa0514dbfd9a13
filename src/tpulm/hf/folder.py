"""Transformers model folders: the file names, reading weights, writing weights and tokenizer.

The one place that reads or writes the files of a Transformers checkpoint folder
(``config.json``, ``model.safetensors`` or its sharded index, ``pytorch_model.bin``, tokenizer).
"""

from __future__ import annotations

import json

import numpy as np

from tpulm import storage
from tpulm.data.tokenizer import (
    FOLDER_FILES,
    SPECIAL_ROLES,
    SPECIAL_TOKENS_MAP_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
)
from tpulm.errors import TpulmError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PICKLE_FILE = "pytorch_model.bin"
CARD_FILE = "README.md"
# What `tpulm export` writes: the only names `export --overwrite` may replace.
EXPORT_FILES = frozenset({CONFIG_FILE, WEIGHTS_FILE, CARD_FILE, *FOLDER_FILES})


def read_hf_weights(hf_dir: str, allow_pickle: bool | None = None) -> dict[str, np.ndarray]:
    """All tensors of a Transformers checkpoint folder as float32 numpy arrays.

    Reads ``model.safetensors`` or the shards of ``model.safetensors.index.json``; a PyTorch
    pickle (``pytorch_model.bin``) only with ``allow_pickle``, since unpickling can run code.

    Args:
        hf_dir: the folder (local or remote).
        allow_pickle: permit reading ``pytorch_model.bin`` (needs torch); None for a command
            without ``--allow-pickle`` (its message then names no such flag).
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
            remedy = ("pass --allow-pickle if you trust its source, or convert it to safetensors"
                      if allow_pickle is not None else "this command reads only safetensors: "
                      "convert it (model.save_pretrained(folder, safe_serialization=True))")
            raise TpulmError(f"{hf_dir} holds only {PICKLE_FILE}, a pickle that can run code "
                             f"when loaded; {remedy}")
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


def write_tokenizer(src_dir: str, dst_dir: str, max_positions: int | None) -> None:
    """Copy the tokenizer files; complete ``tokenizer_config.json`` with the special-token roles
    (from ``special_tokens_map.json``) and a ``model_max_length`` the model can take."""
    storage.makedirs(dst_dir)
    tok_config = storage.read_json(storage.join(src_dir, TOKENIZER_CONFIG_FILE), {})
    token_map = storage.read_json(storage.join(src_dir, SPECIAL_TOKENS_MAP_FILE), {})
    for role in SPECIAL_ROLES:
        if role not in tok_config and role in token_map:
            tok_config[role] = token_map[role]
    tok_config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    if max_positions and tok_config.get("model_max_length", 1 << 62) > max_positions:
        tok_config["model_max_length"] = max_positions
    storage.write_bytes(storage.join(dst_dir, TOKENIZER_FILE),
                        storage.read_bytes(storage.join(src_dir, TOKENIZER_FILE)))
    storage.write_json(storage.join(dst_dir, TOKENIZER_CONFIG_FILE), tok_config)
    roles = {r: tok_config[r] for r in SPECIAL_ROLES if r in tok_config}
    storage.write_json(storage.join(dst_dir, SPECIAL_TOKENS_MAP_FILE), {**token_map, **roles})


def save_safetensors(folder: str, name: str, arrays: dict[str, np.ndarray]) -> None:
    from safetensors.numpy import save as save_bytes

    storage.makedirs(folder)
    path = storage.join(folder, name)
    # Transformers checks the "format" metadata of safetensors files it loads.
    storage.write_bytes(path, save_bytes(arrays, metadata={"format": "pt"}))


def read_config(hf_dir: str) -> tuple[dict, str]:
    """``(config.json as a dict, its path)`` of a Transformers folder."""
    path = storage.join(hf_dir, CONFIG_FILE)
    if not storage.exists(path):
        raise TpulmError(f"{hf_dir} has no {CONFIG_FILE}; is it a Transformers model folder?")
    return storage.read_json(path), path
