"""The Keras <-> Transformers map for RoBERTa MLM (``RobertaForMaskedLM``): config keys and weight
names; :mod:`tpulm.hf.convert` dispatches to it on ``ModelConfig.architecture``.

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

On export the token-type row (one type: every token adds it) is folded into every position row
and written as zeros (:func:`canonical_state`): the same function in Transformers, and readers
without a token-type table (keras-hub's ``RobertaBackbone``) then agree with it.

The tied decoder tensors are not written on export (Transformers re-ties them on load, and its
own ``save_pretrained`` leaves them out too); on import they are accepted when they equal the
tensors they are tied to.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from tpulm import config
from tpulm.data.tokenizer import SpecialTokens
from tpulm.errors import TpulmError
from tpulm.model.config import ModelConfig

log = logging.getLogger(__name__)

ARCHITECTURE = "RobertaForMaskedLM"

# Decoder tensors Transformers ties to other tensors: tied key -> the key it shares storage with.
MODEL_TYPE = "roberta"
# Tensors Transformers may save that tpulm does not keep (a buffer, not a weight).
TOLERATED = {"roberta.embeddings.position_ids"}
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


def canonical_state(state: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, np.ndarray]:
    """The exported tensors with the token-type row folded into the position table.

    With one token type every token adds the same row 0, so adding it to every position row and
    writing zeros in its place is the same function in Transformers (to float rounding). Readers
    that have no token-type table (keras-hub's ``RobertaBackbone``) then compute what Transformers
    does; released RoBERTa checkpoints have that row at zero too.

    Args:
        state: the Transformers state dict (float32 arrays).
        cfg: the model config (folding needs ``type_vocab_size`` 1).
    """
    if cfg.type_vocab_size != 1:
        return state
    types, positions = (f"roberta.embeddings.{t}_embeddings.weight"
                        for t in ("token_type", "position"))
    folded = dict(state)
    folded[positions] = np.ascontiguousarray(state[positions] + state[types][0])
    folded[types] = np.zeros_like(state[types])
    return folded


def hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
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
    if special_tokens.pad_id != cfg.pad_token_id:
        raise TpulmError(
            f"the model was built with pad_token_id {cfg.pad_token_id} but the tokenizer's pad "
            f"token has id {special_tokens.pad_id}; positions would not match"
        )
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        **hf_model_kwargs(cfg),
        "bos_token_id": special_tokens.cls_id,
        "eos_token_id": special_tokens.sep_id,
        "position_embedding_type": "absolute",
        "dtype": "float32",
    }


def model_config_from_hf(hf: dict[str, Any], where: str) -> ModelConfig:
    """The tpulm model config of a Transformers ``config.json`` (RobertaForMaskedLM only).

    Args:
        hf: the parsed ``config.json``.
        where: the file, for error messages.
    """
    architectures = hf.get("architectures") or []
    if hf.get("model_type") != MODEL_TYPE or ARCHITECTURE not in architectures:
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
