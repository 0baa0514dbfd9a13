"""Checks and set-up before training: tokenizer, model config, shards, run dir.

Everything a user can get wrong (missing tokenizer, shards of another tokenizer, sequences longer
than the model's positions, ids outside the vocabulary, a run dir of a different model) stops
here with one clear message, before any model is built.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from tpulm import config, ownership, rundir, storage
from tpulm.data import tokenizer
from tpulm.errors import TpulmError
from tpulm.training.inputs import ShardSet

log = logging.getLogger(__name__)
_ID_SCAN_RECORDS = 2000  # records scanned for out-of-vocabulary ids when a split has no manifest


def resolve_tokenizer(run_dir: str, given: str | None) -> str:
    """The tokenizer folder: the run dir's copy if it has one (it must match ``given``), else ``given``.

    Args:
        run_dir: the run dir.
        given: the ``--tokenizer`` setting, or None.
    """
    storage.check_reachable(run_dir, "--run-dir", write=True)  # first: before any heavy work
    storage.check_reachable(given, "--tokenizer")
    copy = storage.join(run_dir, rundir.TOKENIZER_DIR)
    has_copy = storage.exists(storage.join(copy, tokenizer.TOKENIZER_FILE))
    if has_copy and given and tokenizer.fingerprint(given) != tokenizer.fingerprint(copy):
        raise TpulmError(
            f"--tokenizer {given} differs from the tokenizer {copy} this run was started with; "
            "use a new --run-dir to train with another tokenizer"
        )
    if has_copy:
        return copy
    if not given:
        raise TpulmError("no tokenizer: pass --tokenizer DIR (a folder from `tpulm tokenizer train`)")
    return given


def resolve_model(
    run_dir: str, preset: str, overrides: Mapping[str, Any], vocab_size: int, pad_id: int
):
    """The ``ModelConfig``: the run dir's ``[model]`` if it has one, else preset < overrides.

    Vocab size and pad id always come from the tokenizer. A run dir trained with different sizes
    than the ones asked for is an error (resuming must not silently change the model).

    Args:
        run_dir: the run dir.
        preset: preset name or TOML path (``--model``).
        overrides: a ``[model]`` table from ``--config`` or the caller.
        vocab_size: the tokenizer's vocabulary size.
        pad_id: the tokenizer's pad id.
    """
    from tpulm.model.config import ModelConfig, load_model_preset

    table = {**load_model_preset(preset), **overrides, "vocab_size": vocab_size, "pad_token_id": pad_id}
    wanted = config.from_mapping(ModelConfig, table, f"model {preset!r}")
    path = storage.join(run_dir, rundir.CONFIG_NAME)
    saved = config.load_toml(path).get("model") if storage.exists(path) else None
    if not saved:
        return wanted
    existing = config.from_mapping(ModelConfig, saved, f"[model] of {path}")
    _check_same_shape(run_dir, preset, wanted, existing)
    # An imported model may have a padded vocabulary: at least the tokenizer's is enough.
    if existing.vocab_size < vocab_size or existing.pad_token_id != pad_id:
        raise TpulmError(
            f"[model] of {path} (vocab_size {existing.vocab_size}, pad_token_id "
            f"{existing.pad_token_id}) does not fit the tokenizer (vocab {vocab_size}, pad {pad_id})"
        )
    if overrides and config.from_mapping(ModelConfig, {**saved, **overrides}, "overrides") != existing:
        raise TpulmError(
            f"{run_dir} holds a model with other sizes than asked for ({path}); "
            "use a new --run-dir, or drop the [model] settings to resume it"
        )
    return existing


_SHAPE_FIELDS = ("architecture", "hidden_size", "num_layers", "num_heads", "intermediate_size")


def _check_same_shape(run_dir: str, preset: str, wanted, existing) -> None:
    """A run dir resumed with another ``--model`` stops, naming the sizes that differ.

    The default preset counts as "not given" (rerunning ``tpulm train --run-dir DIR`` resumes
    whatever DIR holds), so only a preset the user named is compared.
    """
    from tpulm.training.config import TrainConfig

    if preset == TrainConfig.model:  # the dataclass default: not chosen by the user
        return
    differ = [f"{name} {getattr(existing, name)} (--model {preset}: {getattr(wanted, name)})"
              for name in _SHAPE_FIELDS if getattr(existing, name) != getattr(wanted, name)]
    if differ:
        raise TpulmError(
            f"{run_dir} holds another model than --model {preset}: " + ", ".join(differ)
            + "; use a new --run-dir, or drop --model to resume the model it holds")


def check_shards(shard_set: ShardSet, tok: tokenizer.TokenizerFolder, model_cfg, what: str) -> None:
    """Stop with a clear message if the shards do not fit the tokenizer and the model.

    Args:
        shard_set: the shards to check.
        tok: the tokenizer of the run.
        model_cfg: the ``ModelConfig`` of the run.
        what: flag naming the shards in messages (``--train-data``).
    """
    manifest = shard_set.manifest
    if manifest is not None:
        if manifest.tokenizer_fingerprint != tok.fingerprint:
            raise TpulmError(
                f"{what} {shard_set.spec} was tokenized with another tokenizer than {tok.path} "
                "(fingerprints differ): prepare the shards with this tokenizer or pass the other one"
            )
    if shard_set.max_length > model_cfg.max_positions:
        raise TpulmError(
            f"{what} {shard_set.spec} has sequences of {shard_set.max_length} tokens but the model "
            f"takes at most {model_cfg.max_positions} (max_position_embeddings "
            f"{model_cfg.max_position_embeddings} - pad_token_id - 1): raise "
            "max_position_embeddings or prepare shorter shards"
        )
    largest = manifest.vocab_size - 1 if manifest is not None else _largest_id(shard_set)
    if largest >= model_cfg.vocab_size:
        raise TpulmError(
            f"{what} {shard_set.spec} holds token id {largest} but the vocabulary has "
            f"{model_cfg.vocab_size} entries: the shards come from a larger tokenizer"
        )


def _largest_id(shard_set: ShardSet) -> int:
    """Largest token id in the first records of the first shard (splits without a manifest)."""
    import tensorflow as tf

    from tpulm.data.shards import feature_spec

    ds = tf.data.TFRecordDataset(shard_set.files[0]).take(_ID_SCAN_RECORDS).batch(_ID_SCAN_RECORDS)
    try:
        for raw in ds:
            return int(tf.reduce_max(tf.io.parse_example(raw, feature_spec(shard_set.max_length))["input_ids"]))
    except tf.errors.OpError as err:
        raise TpulmError(f"cannot read {shard_set.files[0]}: {err.message}") from None
    return -1


# Who may have written the run dir files training replaces: itself, or `tpulm import`.
RUN_DIR_WRITERS = ("train", "import")


def check_run_dir_files(run_dir: str) -> None:
    """Before any work: the files training rewrites in ``run_dir`` (``config.toml``,
    ``metrics.jsonl``, the tokenizer copy) are missing or tpulm's (:mod:`tpulm.ownership`).

    A run dir of an older tpulm (checkpoints, but no record of what it wrote) is trusted.

    Raises:
        TpulmError: naming the files tpulm did not write (or that changed since).
    """
    if not storage.isdir(run_dir):
        return
    if not ownership.read(run_dir) and rundir.latest_checkpoint(run_dir):
        return
    copy = storage.join(run_dir, rundir.TOKENIZER_DIR)
    names = [rundir.CONFIG_NAME, rundir.METRICS_NAME]
    if storage.isdir(copy):
        names += [f"{rundir.TOKENIZER_DIR}/{name}" for name in storage.listdir(copy)]
    ownership.check_files(run_dir, names, RUN_DIR_WRITERS, "tpulm train would overwrite",
                          "choose another --run-dir")


def prepare_run_dir(run_dir: str, tokenizer_dir: str, tables: dict[str, dict]) -> None:
    """Write ``config.toml`` (atomically) and copy the tokenizer into the run dir if needed;
    both recorded as training's (:mod:`tpulm.ownership`)."""
    storage.makedirs(run_dir)
    copy = storage.join(run_dir, rundir.TOKENIZER_DIR)
    written = [rundir.CONFIG_NAME]
    if tokenizer_dir != copy:
        storage.makedirs(copy)
        for name in storage.listdir(tokenizer_dir):
            source = storage.join(tokenizer_dir, name)
            if not storage.isdir(source) and name not in ownership.IGNORED:
                storage.write_bytes(storage.join(copy, name), storage.read_bytes(source))
                written.append(f"{rundir.TOKENIZER_DIR}/{name}")
    storage.write_text(storage.join(run_dir, rundir.CONFIG_NAME), config.to_toml(tables))
    ownership.record(run_dir, written, "train")


def changed_settings(cfg, run_dir: str) -> list[tuple[str, Any, Any]]:
    """``(name, recorded, now)`` for each ``[train]`` setting that differs from the run's
    ``config.toml`` and changes what is trained (not ``config.BOOKKEEPING``).

    Args:
        cfg: the ``TrainConfig`` about to continue the run.
        run_dir: the run dir (its ``config.toml`` may be missing: nothing to compare).
    """
    from tpulm.training.config import BOOKKEEPING

    path = storage.join(run_dir, rundir.CONFIG_NAME)
    saved = config.load_toml(path).get("train", {}) if storage.exists(path) else {}
    now = config.as_table(cfg)
    if not saved:
        return []
    return [(name, saved.get(name), now.get(name)) for name in sorted({*saved, *now})
            if name not in BOOKKEEPING and saved.get(name) != now.get(name)]


def say_changed_settings(cfg, step: int) -> None:
    """Warn, naming each one, when a run continues with other training settings than it had."""
    changed = changed_settings(cfg, cfg.run_dir)
    if changed:
        log.warning("continuing %s from step %d with other settings than it was trained with: "
                    "%s (config.toml records the new values)", cfg.run_dir, step,
                    ", ".join(f"{name} {old!r} -> {new!r}" for name, old, new in changed))
