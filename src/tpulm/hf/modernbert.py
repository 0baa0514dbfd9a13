"""The Keras <-> Transformers map for ModernBERT MLM (``ModernBertForMaskedLM``): config keys and
weight names, with the same functions as :mod:`tpulm.hf.roberta`; :mod:`tpulm.hf.convert` dispatches on
``ModelConfig.architecture``.

Keras variable paths (without the ``modernbert_mlm/`` prefix) map to state-dict keys as follows
(``i`` = block index; "T" = transposed: Keras ``Dense`` kernels are (in, out), ``torch.nn.Linear``
weights (out, in); "beta"/"bias" rows exist only when the config switches the bias on):

=======================================  ==============================================
Keras path                               Transformers key
=======================================  ==============================================
tok_embeddings/embeddings                model.embeddings.tok_embeddings.weight
embedding_norm/gamma | beta              model.embeddings.norm.weight | bias
layer_i/attn_norm/gamma | beta (i > 0)   model.layers.i.attn_norm.weight | bias
layer_i/wqkv/kernel (T) | bias           model.layers.i.attn.Wqkv.weight | bias
layer_i/attn_out/kernel (T) | bias       model.layers.i.attn.Wo.weight | bias
layer_i/mlp_norm/gamma | beta            model.layers.i.mlp_norm.weight | bias
layer_i/wi/kernel (T) | bias             model.layers.i.mlp.Wi.weight | bias
layer_i/mlp_out/kernel (T) | bias        model.layers.i.mlp.Wo.weight | bias
final_norm/gamma | beta                  model.final_norm.weight | bias
head/dense/kernel (T) | bias             head.dense.weight | bias
head/norm/gamma | beta                   head.norm.weight | bias
head/decoder_bias                        decoder.bias
(tied: tok_embeddings)                   decoder.weight
=======================================  ==============================================

``decoder.weight`` is not written on export (Transformers re-ties it on load); on import it is
accepted when it equals the embedding table.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from tpulm import config
from tpulm.data.tokenizer import SpecialTokens
from tpulm.errors import TpulmError
from tpulm.model.config import GELU_APPROXIMATE, ModelConfig

log = logging.getLogger(__name__)

ARCHITECTURE = "ModernBertForMaskedLM"
MODEL_TYPE = "modernbert"
TOLERATED: set[str] = set()
TIED = {"decoder.weight": "model.embeddings.tok_embeddings.weight"}


def weight_map(cfg: ModelConfig) -> list[tuple[str, str, bool]]:
    """``(keras path without model prefix, transformers key, transpose)`` for every weight.

    Args:
        cfg: the model config (blocks and bias switches decide the rows).
    """
    rows: list[tuple[str, str, bool]] = [
        ("tok_embeddings/embeddings", "model.embeddings.tok_embeddings.weight", False)]

    def norm(keras_layer: str, hf_module: str) -> None:
        rows.append((f"{keras_layer}/gamma", f"{hf_module}.weight", False))
        if cfg.norm_bias:
            rows.append((f"{keras_layer}/beta", f"{hf_module}.bias", False))

    def dense(keras_layer: str, hf_module: str, bias: bool) -> None:
        rows.append((f"{keras_layer}/kernel", f"{hf_module}.weight", True))
        if bias:
            rows.append((f"{keras_layer}/bias", f"{hf_module}.bias", False))

    norm("embedding_norm", "model.embeddings.norm")
    for i in range(cfg.num_layers):
        hf = f"model.layers.{i}"
        if i > 0:  # block 0's attn_norm is the identity
            norm(f"layer_{i}/attn_norm", f"{hf}.attn_norm")
        dense(f"layer_{i}/wqkv", f"{hf}.attn.Wqkv", cfg.attention_bias)
        dense(f"layer_{i}/attn_out", f"{hf}.attn.Wo", cfg.attention_bias)
        norm(f"layer_{i}/mlp_norm", f"{hf}.mlp_norm")
        dense(f"layer_{i}/wi", f"{hf}.mlp.Wi", cfg.mlp_bias)
        dense(f"layer_{i}/mlp_out", f"{hf}.mlp.Wo", cfg.mlp_bias)
    norm("final_norm", "model.final_norm")
    dense("head/dense", "head.dense", cfg.classifier_bias)
    norm("head/norm", "head.norm")
    if cfg.decoder_bias:
        rows.append(("head/decoder_bias", "decoder.bias", False))
    return rows


def canonical_state(state: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, np.ndarray]:
    """The exported tensors as they are (ModernBERT has nothing to fold; see the RoBERTa map)."""
    return state


def hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The Transformers shape of every tensor of ``cfg`` (Linear weights are (out, in))."""
    h, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    matrices = {"Wqkv": (3 * h, h), "attn.Wo": (h, h), "Wi": (2 * f, h), "mlp.Wo": (h, f),
                "head.dense": (h, h), "tok_embeddings": (v, h)}
    shapes = {}
    for _, key, _ in weight_map(cfg):
        module, param = key.rsplit(".", 1)
        found = [shape for name, shape in matrices.items() if module.endswith(name)]
        if key == "decoder.bias":
            shapes[key] = (v,)
        elif found:
            shapes[key] = found[0] if param == "weight" else (found[0][0],)
        else:
            shapes[key] = (h,)  # LayerNorm weight / bias
    return shapes


def hf_model_kwargs(cfg: ModelConfig) -> dict[str, Any]:
    """``ModernBertConfig`` keyword arguments for ``cfg`` (no token roles but pad).

    Layer kinds and RoPE bases use the keys of the released answerdotai configs
    (``global_attn_every_n_layers``, ``global_rope_theta``, ``local_rope_theta``), which
    Transformers 4.48+ and 5 both read.
    """
    return {
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "hidden_activation": cfg.activation,
        "classifier_activation": cfg.activation,
        "max_position_embeddings": cfg.max_position_embeddings,
        "initializer_range": cfg.initializer_range,
        "initializer_cutoff_factor": cfg.initializer_cutoff_factor, "norm_eps": cfg.layer_norm_eps,
        "norm_bias": cfg.norm_bias, "attention_bias": cfg.attention_bias,
        "mlp_bias": cfg.mlp_bias, "classifier_bias": cfg.classifier_bias,
        "decoder_bias": cfg.decoder_bias, "attention_dropout": cfg.attention_dropout,
        "embedding_dropout": cfg.hidden_dropout, "mlp_dropout": cfg.hidden_dropout,
        "global_attn_every_n_layers": cfg.global_attn_every_n_layers,
        "global_rope_theta": cfg.global_rope_theta, "local_rope_theta": cfg.local_rope_theta,
        "local_attention": cfg.local_attention, "pad_token_id": cfg.pad_token_id,
        "bos_token_id": None, "eos_token_id": None, "cls_token_id": None, "sep_token_id": None,
        "tie_word_embeddings": True,
    }


def hf_config(cfg: ModelConfig, special_tokens: SpecialTokens) -> dict[str, Any]:
    """The ``config.json`` of a Transformers ``ModernBertForMaskedLM`` equal to the tpulm model.

    Args:
        cfg: the model config.
        special_tokens: the tokenizer's special token ids (roles as in the answerdotai configs:
            bos = cls, eos = sep).
    """
    if special_tokens.pad_id != cfg.pad_token_id:
        raise TpulmError(f"the model was built with pad_token_id {cfg.pad_token_id} but the "
                         f"tokenizer's pad token has id {special_tokens.pad_id}; rebuild the "
                         "model config from the tokenizer")
    roles = {"bos_token_id": special_tokens.cls_id, "eos_token_id": special_tokens.sep_id,
             "cls_token_id": special_tokens.cls_id, "sep_token_id": special_tokens.sep_id,
             "mask_token_id": special_tokens.mask_id}
    return {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, **hf_model_kwargs(cfg),
            **roles, "classifier_pooling": "cls", "sparse_prediction": False, "dtype": "float32"}


def _layer_pattern(hf: dict[str, Any], layers: int, where: str) -> int:
    """``global_attn_every_n_layers`` of a config: the old key, or read off ``layer_types``."""
    types = hf.get("layer_types")
    if not types:
        return int(hf.get("global_attn_every_n_layers", 3))
    every = next((n for n in range(1, layers + 1) if types == [
        "sliding_attention" if i % n else "full_attention" for i in range(layers)]), None)
    if every is None:
        raise TpulmError(f"{where}: layer_types {types} is not 'full every n-th layer from 0', "
                         "the only pattern tpulm supports")
    return every


def _rope_thetas(hf: dict[str, Any], where: str) -> tuple[float, float]:
    """``(global, local)`` RoPE bases: ``rope_parameters`` (Transformers 5) or the old keys."""
    params = hf.get("rope_parameters") or {}
    thetas = []
    for kind, old_key, default in (("full_attention", "global_rope_theta", 160000.0),
                                   ("sliding_attention", "local_rope_theta", 10000.0)):
        entry = params.get(kind) or {}
        if entry.get("rope_type", "default") != "default" or hf.get("rope_scaling"):
            raise TpulmError(f"{where}: scaled RoPE ({kind}: {entry}) is not supported")
        thetas.append(float(entry.get("rope_theta", hf.get(old_key, default))))
    return thetas[0], thetas[1]


def model_config_from_hf(hf: dict[str, Any], where: str) -> ModelConfig:
    """The tpulm model config of a Transformers ``config.json`` (``ModernBertForMaskedLM``).

    Args:
        hf: the parsed ``config.json``.
        where: the file, for error messages.
    """
    architectures = hf.get("architectures") or []
    if hf.get("model_type") != MODEL_TYPE or ARCHITECTURE not in architectures:
        raise TpulmError(f"{where} describes model_type {hf.get('model_type')!r} with "
                         f"architectures {architectures}; expected {MODEL_TYPE!r} / {ARCHITECTURE}")
    activation = hf.get("hidden_activation", "gelu")
    if hf.get("classifier_activation", "gelu") != activation or activation not in GELU_APPROXIMATE:
        raise TpulmError(f"{where}: hidden_activation {activation!r} and classifier_activation "
                         f"{hf.get('classifier_activation')!r} must be equal and one of "
                         f"{sorted(GELU_APPROXIMATE)}")
    if not hf.get("tie_word_embeddings", True):
        raise TpulmError(f"{where}: tie_word_embeddings=false is not supported")
    required = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size")
    missing = [k for k in required if hf.get(k) is None]
    if missing:
        raise TpulmError(f"{where} lacks {', '.join(missing)}")
    layers = hf["num_hidden_layers"]
    global_theta, local_theta = _rope_thetas(hf, where)
    dropouts = {k: float(hf.get(k, 0.0)) for k in ("embedding_dropout", "mlp_dropout")}
    if len(set(dropouts.values())) > 1:
        log.warning("%s: embedding_dropout and mlp_dropout differ (%s); tpulm uses one "
                    "hidden_dropout, their maximum", where, dropouts)
    table = {
        "architecture": "modernbert", "vocab_size": hf["vocab_size"],
        "hidden_size": hf["hidden_size"], "num_layers": layers,
        "num_heads": hf["num_attention_heads"], "intermediate_size": hf["intermediate_size"],
        "max_position_embeddings": hf.get("max_position_embeddings", 8192),
        "pad_token_id": hf.get("pad_token_id", 0),
        "layer_norm_eps": float(hf.get("norm_eps", 1e-5)),
        "hidden_dropout": max(dropouts.values()),
        "attention_dropout": float(hf.get("attention_dropout", 0.0)),
        "initializer_range": float(hf.get("initializer_range", 0.02)),
        "initializer_cutoff_factor": float(hf.get("initializer_cutoff_factor") or 2.0),
        "global_rope_theta": global_theta, "local_rope_theta": local_theta,
        "local_attention": hf.get("local_attention", 128),
        "global_attn_every_n_layers": _layer_pattern(hf, layers, where), "activation": activation,
        **{k: bool(hf.get(k, default)) for k, default in (
            ("norm_bias", False), ("attention_bias", False), ("mlp_bias", False),
            ("classifier_bias", False), ("decoder_bias", True))},
    }
    return config.from_mapping(ModelConfig, table, where)
