"""Build the network of a ``ModelConfig``: a registry of architectures (RoBERTa, ModernBERT)."""

from __future__ import annotations

from tpulm.model.config import ModelConfig
from tpulm.model.masked_lm import MaskedLM
from tpulm.model.modernbert import ModernBertMaskedLM
from tpulm.model.roberta import RobertaMaskedLM

# architecture -> its masked-LM task class (each takes the ModelConfig)
NETWORKS: dict[str, type[MaskedLM]] = {"roberta": RobertaMaskedLM,
                                       "modernbert": ModernBertMaskedLM}


def build_model(cfg: ModelConfig, *, dtype: str | None = None, attention: str = "auto",
                remat: str = "none") -> MaskedLM:
    """A built (weights created) model of ``cfg.architecture``.

    Args:
        cfg: model sizes; ``vocab_size`` and ``pad_token_id`` must come from the tokenizer.
        dtype: a Keras dtype policy name (e.g. ``"float32"`` for exact inference); by default the
            global policy (``keras.mixed_precision.set_global_policy``).
        attention: ``"auto"`` (the cheapest exact attention for the backend and platform) or
            ``"dense"`` (the masked reference); the same function either way.
        remat: ``"none"``, ``"block"`` or ``"full"``: what the backward pass recomputes instead
            of keeping (see :mod:`tpulm.model.masked_lm`).

    Returns:
        The Keras model (:class:`tpulm.model.masked_lm.MaskedLM`: ``model.backbone``,
        ``model.lm_head``, ``model.cfg``); call it on ``{"input_ids", "attention_mask"[,
        "masked_positions", "segment_ids", "position_ids"]}``.
    """
    model = NETWORKS[cfg.architecture](cfg, attention=attention, remat=remat,
                                       name=cfg.model_name, dtype=dtype)
    model.build()
    return model
