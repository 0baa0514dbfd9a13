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

from typing import Any

import numpy as np

from tpulm.errors import TpulmError
from tpulm.model import ModelConfig

ARCHITECTURE = "RobertaForMaskedLM"
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


def _by_short_path(model) -> dict[str, Any]:
    """Model variables keyed by their path without the leading model name."""
    return {v.path.split("/", 1)[1]: v for v in model.weights}


def to_hf_state_dict(model, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """The Keras model's weights as a ``RobertaForMaskedLM`` state dict (float32, contiguous).

    Args:
        model: a model from :func:`tpulm.model.build_model`.
        cfg: its config.
    """
    variables = _by_short_path(model)
    state = {}
    for keras_path, hf_key, transpose in weight_map(cfg):
        value = np.asarray(variables[keras_path].numpy(), dtype=np.float32)
        state[hf_key] = np.ascontiguousarray(value.T if transpose else value)
    return state


def check_state_dict(state: dict[str, np.ndarray], cfg: ModelConfig, where: str) -> None:
    """Raise a TpulmError listing missing/unexpected tensors or wrong shapes/untied decoders."""
    expected = {hf_key for _, hf_key, _ in weight_map(cfg)}
    tolerated = set(TIED) | {"roberta.embeddings.position_ids"}
    missing = sorted(expected - set(state))
    unexpected = sorted(set(state) - expected - tolerated)
    if missing or unexpected:
        raise TpulmError(
            f"{where} is not a {ARCHITECTURE} checkpoint of this config: missing tensors "
            f"{missing or 'none'}; unexpected tensors {unexpected or 'none'}"
        )
    for tied, target in TIED.items():
        if tied in state and not np.array_equal(state[tied], state[target]):
            raise TpulmError(
                f"{where}: {tied} differs from {target}; tpulm ties them (untied decoders are "
                "not supported)"
            )


def from_hf_state_dict(model, cfg: ModelConfig, state: dict[str, np.ndarray],
                       where: str = "the checkpoint") -> None:
    """Assign a ``RobertaForMaskedLM`` state dict to the Keras model, checking every tensor.

    Args:
        model: a model from :func:`tpulm.model.build_model` built with ``cfg``.
        cfg: the model config (from :func:`model_config_from_hf`).
        state: tensor name -> array (numpy; torch tensors are converted by the caller).
        where: what to name in error messages (a file or folder).
    """
    check_state_dict(state, cfg, where)
    variables = _by_short_path(model)
    for keras_path, hf_key, transpose in weight_map(cfg):
        value = np.asarray(state[hf_key])
        value = value.T if transpose else value
        variable = variables[keras_path]
        if tuple(variable.shape) != value.shape:
            raise TpulmError(
                f"{where}: {hf_key} has shape {tuple(np.asarray(state[hf_key]).shape)}, the "
                f"config implies {tuple(variable.shape)[::-1] if transpose else tuple(variable.shape)}"
            )
        variable.assign(value.astype(np.float32))


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
