"""``tpulm train --init-from``: a new run starting from trained weights (context extension).

ModernBERT is pretrained at 1,024 tokens, then trained on at 8,192 from those weights with a
fresh optimizer and schedule. ``--init-from`` takes a run dir (its latest checkpoint), one of its
checkpoint folders, or an export folder; the new run's model is that model's config (the
``[model]`` table may change what does not shape a weight: dropout, RoPE bases, the window),
its weights are copied before step 0, and nothing else (optimizer, step, data position) carries
over. RoPE models extend directly: ``max_position_embeddings`` is raised to the new shards'
length. RoBERTa's learned position table cannot grow: longer shards are refused.

Only the first session of the new run copies weights; a resumed session restores its own
checkpoint as any run does.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from tpulm import config
from tpulm.errors import TpulmError

log = logging.getLogger(__name__)


def _source_config(path: str):
    # An export folder is read through tpulm.hf's weight maps: imported here, when asked for.
    from tpulm import trained_model

    return trained_model.model_config(path)


def model_table(path: str, overrides: Mapping[str, Any], max_length: int) -> dict[str, Any]:
    """The new run's ``[model]`` table: the source's config < ``overrides``, positions extended.

    Args:
        path: ``--init-from`` (run dir, checkpoint folder or export folder).
        overrides: the ``[model]`` table of the new run's config.
        max_length: tokens per sequence of the new run's shards.

    Raises:
        TpulmError: a setting that would change a weight's shape, or a RoBERTa model asked for
            longer sequences than its position table holds.
    """
    source = _source_config(path)
    table = {**dataclasses.asdict(source), **overrides}
    shaping = ("architecture", "hidden_size", "num_layers", "num_heads", "intermediate_size",
               "vocab_size", "type_vocab_size", "norm_bias", "attention_bias", "mlp_bias",
               "classifier_bias", "decoder_bias")
    changed = [name for name in shaping if table[name] != getattr(source, name)]
    if source.architecture == "roberta":
        changed += ["max_position_embeddings"] * (
            table["max_position_embeddings"] != source.max_position_embeddings)
    if changed:
        raise TpulmError(f"[model] {', '.join(changed)} differs from --init-from {path}: the "
                         "weights could not be copied; drop those settings")
    if source.architecture == "roberta" and max_length > source.max_positions:
        raise TpulmError(
            f"--init-from {path} is a RoBERTa model whose learned position table holds "
            f"{source.max_positions} tokens, the shards have {max_length}: RoBERTa cannot be "
            "extended; prepare shards of at most that length")
    if table["max_position_embeddings"] < max_length:  # RoPE: any length, nothing to learn
        log.info("extending the context of %s from %d to %d tokens", path,
                 table["max_position_embeddings"], max_length)
        table["max_position_embeddings"] = max_length
    return table


def check_tokenizer(path: str, tokenizer_dir: str) -> None:
    """Refuse a tokenizer other than the one ``path`` was trained with (token ids would mean
    other words); a source without a tokenizer copy is taken on trust."""
    from tpulm import storage, trained_model
    from tpulm.data import tokenizer

    source = trained_model.tokenizer_folder(path)
    if not storage.exists(storage.join(source, tokenizer.TOKENIZER_FILE)):
        return
    if tokenizer.fingerprint(source) != tokenizer.fingerprint(tokenizer_dir):
        raise TpulmError(f"--init-from {path} was trained with the tokenizer {source}, not "
                         f"{tokenizer_dir}: pass --tokenizer {source}")


def copy_weights(model, path: str) -> None:
    """Assign the weights of ``path`` to ``model`` (same variable paths and shapes)."""
    from tpulm import trained_model
    from tpulm.model import weights

    weights.assign(model.weights, trained_model.read_weights(path), f"--init-from {path}")
    log.info("initialised from %s (fresh optimizer and schedule)", path)


def resolved_config(path: str, overrides: Mapping[str, Any], max_length: int):
    """:func:`model_table` as a checked ``ModelConfig``."""
    from tpulm.model.config import ModelConfig

    return config.from_mapping(ModelConfig, model_table(path, overrides, max_length),
                               f"--init-from {path}")
