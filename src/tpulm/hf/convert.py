"""Keras <-> Transformers conversion for every architecture: weights, config.json, checks.

Each architecture's map lives in its own module (:mod:`tpulm.hf.roberta`,
:mod:`tpulm.hf.modernbert`) with the same names: ``ARCHITECTURE``, ``MODEL_TYPE``, ``TIED`` (decoder
tensors tied to others, left out on export), ``TOLERATED`` (buffers accepted on import),
``weight_map`` (rows of Keras path, Transformers key, transposed), ``canonical_state`` (the
form written on export), ``hf_shapes``,
``hf_model_kwargs``, ``hf_config`` and ``model_config_from_hf``. This module picks the map by
``ModelConfig.architecture`` (or ``config.json``'s ``model_type``) and does the rest once.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from tpulm.data.tokenizer import SpecialTokens
from tpulm.errors import TpulmError
from tpulm.hf import modernbert, roberta
from tpulm.model import weights
from tpulm.model.config import ModelConfig

MAPS: dict[str, ModuleType] = {"roberta": roberta, "modernbert": modernbert}


def _map(cfg: ModelConfig) -> ModuleType:
    return MAPS[cfg.architecture]


def keras_to_hf(arrays: dict[str, np.ndarray], cfg: ModelConfig,
                where: str = "the checkpoint") -> dict[str, np.ndarray]:
    """tpulm weights (``{variable path: array}``, as :mod:`tpulm.model.weights` writes them) as a
    Transformers state dict of float32 contiguous arrays (tied decoder tensors left out), in the
    architecture's canonical form (RoBERTa: the token-type row folded into the positions).

    Args:
        arrays: Keras variable path -> array; the leading model-name component is ignored.
        cfg: the model config.
        where: what to name in error messages.
    """
    short = {path.split("/", 1)[-1]: value for path, value in arrays.items()}
    rows = _map(cfg).weight_map(cfg)
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
    return _map(cfg).canonical_state(state, cfg)


def hf_to_keras(state: dict[str, np.ndarray], cfg: ModelConfig, where: str = "the checkpoint",
                prefix: str | None = None) -> dict[str, np.ndarray]:
    """A Transformers state dict as tpulm weights keyed by Keras variable path.

    Args:
        state: tensor name -> array.
        cfg: the model config (from :func:`model_config_from_hf`).
        where: what to name in error messages (a file or folder).
        prefix: the model-name component of the variable paths (default: the architecture's).
    """
    check_state_dict(state, cfg, where)
    prefix = prefix or cfg.model_name
    arrays = {}
    for keras_path, hf_key, transpose in _map(cfg).weight_map(cfg):
        value = np.asarray(state[hf_key], dtype=np.float32)
        arrays[f"{prefix}/{keras_path}"] = np.ascontiguousarray(value.T if transpose else value)
    return arrays


def from_hf_state_dict(model, cfg: ModelConfig, state: dict[str, np.ndarray],
                       where: str = "the checkpoint") -> None:
    """Assign a Transformers state dict to the Keras model, checking every tensor.

    Args:
        model: a model from :func:`tpulm.model.networks.build_model` built with ``cfg``.
        cfg: the model config.
        state: tensor name -> numpy array.
        where: what to name in error messages (a file or folder).
    """
    prefix = model.weights[0].path.split("/", 1)[0]
    weights.assign(model.weights, hf_to_keras(state, cfg, where, prefix), where)


def check_state_dict(state: dict[str, np.ndarray], cfg: ModelConfig, where: str) -> None:
    """Raise a TpulmError listing missing/unexpected tensors, wrong shapes or untied decoders."""
    arch = _map(cfg)
    expected = {hf_key for _, hf_key, _ in arch.weight_map(cfg)}
    missing = sorted(expected - set(state))
    unexpected = sorted(set(state) - expected - set(arch.TIED) - set(arch.TOLERATED))
    if missing or unexpected:
        raise TpulmError(
            f"{where} is not a {arch.ARCHITECTURE} checkpoint of its config: missing tensors "
            f"{missing or 'none'}; unexpected tensors {unexpected or 'none'}"
        )
    shapes = arch.hf_shapes(cfg)
    wrong = [f"{k} {tuple(np.shape(state[k]))} (expected {shapes[k]})"
             for k in sorted(expected) if tuple(np.shape(state[k])) != shapes[k]]
    if wrong:
        raise TpulmError(f"{where}: tensors with wrong shapes for its config: {'; '.join(wrong)}")
    for tied, target in arch.TIED.items():
        if tied in state and not np.array_equal(state[tied], state[target]):
            raise TpulmError(
                f"{where}: {tied} differs from {target}; tpulm ties them (untied decoders are "
                "not supported)"
            )


def parameter_count(cfg: ModelConfig) -> int:
    """Parameters of the Transformers model of ``cfg`` (tied tensors counted once)."""
    return sum(int(np.prod(shape)) for shape in _map(cfg).hf_shapes(cfg).values())


def hf_model_kwargs(cfg: ModelConfig) -> dict[str, Any]:
    """Keyword arguments of the Transformers config class for the sizes of ``cfg``."""
    return _map(cfg).hf_model_kwargs(cfg)


def hf_config(cfg: ModelConfig, special_tokens: SpecialTokens) -> dict[str, Any]:
    """The ``config.json`` of the Transformers model equal to the tpulm model.

    Args:
        cfg: the model config.
        special_tokens: the tokenizer's special token ids (RoBERTa's positions depend on pad).
    """
    return _map(cfg).hf_config(cfg, special_tokens)


def model_config_from_hf(hf: dict[str, Any], where: str) -> ModelConfig:
    """The tpulm model config of a Transformers ``config.json`` (RoBERTa or ModernBERT MLM).

    Args:
        hf: the parsed ``config.json``.
        where: the file, for error messages.
    """
    for arch in MAPS.values():
        if hf.get("model_type") == arch.MODEL_TYPE:
            return arch.model_config_from_hf(hf, where)
    names = ", ".join(f"{a.MODEL_TYPE} ({a.ARCHITECTURE})" for a in MAPS.values())
    raise TpulmError(
        f"{where} describes model_type {hf.get('model_type')!r} with architectures "
        f"{hf.get('architectures') or []}; tpulm imports {names}")
