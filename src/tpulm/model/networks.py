"""Build the network of a ``ModelConfig``: a registry of architectures (RoBERTa, ModernBERT)."""

from __future__ import annotations

import keras

from tpulm.model.config import ModelConfig
from tpulm.model.modernbert import ModernBertMaskedLM
from tpulm.model.roberta import RobertaMaskedLM, roberta_kwargs


def _roberta(cfg: ModelConfig, dtype: str | None) -> keras.Model:
    return RobertaMaskedLM(**roberta_kwargs(cfg), name=cfg.model_name, dtype=dtype)


def _modernbert(cfg: ModelConfig, dtype: str | None) -> keras.Model:
    return ModernBertMaskedLM(cfg, name=cfg.model_name, dtype=dtype)


# architecture -> (cfg, dtype) -> unbuilt keras.Model
BUILDERS = {"roberta": _roberta, "modernbert": _modernbert}


def build_model(cfg: ModelConfig, *, dtype: str | None = None) -> keras.Model:
    """A built (weights created) model of ``cfg.architecture``.

    Args:
        cfg: model sizes; ``vocab_size`` and ``pad_token_id`` must come from the tokenizer.
        dtype: a Keras dtype policy name (e.g. ``"float32"`` for exact inference); by default the
            global policy (``keras.mixed_precision.set_global_policy``).

    Returns:
        The Keras model; call it on ``{"input_ids", "attention_mask"[, "masked_positions",
        "segment_ids", "position_ids"]}``.
    """
    model = BUILDERS[cfg.architecture](cfg, dtype)
    model.build()
    return model
