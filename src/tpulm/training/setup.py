"""Everything a training run needs before its first step; nothing here runs a step.

* :func:`prepare` reads and checks: process settings, tokenizer, model settings, shards,
  masking, strategy and the step counts. It writes nothing (the run dir is written under the
  lock, by ``tpulm.training.loop``).
* :func:`build_for_training` and :func:`compile_for_training` make the model, optimizer, loss
  and metrics exactly as training uses them, from settings alone (no data, no run dir), so
  other tools (``tpulm plan``) can lower the very train step ``tpulm train`` runs.
"""

from __future__ import annotations

import dataclasses
import logging

from tpulm import rundir, storage
from tpulm.data import tokenizer
from tpulm.errors import TpulmError
from tpulm.training import (
    init_from,
    inputs,
    objective,
    preflight,
    process,
    schedule,
    strategies,
    words,
)
from tpulm.training.config import TrainConfig, segment_length
from tpulm.training.distribution import Strategy
from tpulm.training.masking import (
    Masker,
    WholeWordMasker,
    max_predictions,
    whole_word_predictions,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A checked training run, before anything is built or written.

    Attributes:
        cfg: training settings.
        model_cfg: the resolved ``tpulm.model.config.ModelConfig`` (vocab from the tokenizer).
        tokenizer_dir: the tokenizer folder (the run dir's copy when it has one).
        special: the tokenizer's special token ids.
        train_set: the training shards.
        eval_set: the validation shards, or None.
        masker: the masking applied in the input pipelines.
        document_cls_id: id that starts a packed document (document attention), or None.
        strategy: where training runs.
        writer: whether this process writes the run dir's shared files (the chief).
        global_batch: sequences per micro-step, all replicas together.
        total_steps: the optimizer step to train to.
        tokens_per_step: token positions per optimizer step (accumulation included).
        segment: optimizer steps per Keras epoch (``config.segment_length``, at most the total).
    """

    cfg: TrainConfig
    model_cfg: object
    tokenizer_dir: str
    special: object
    train_set: inputs.ShardSet
    eval_set: inputs.ShardSet | None
    masker: Masker
    document_cls_id: int | None
    strategy: Strategy
    writer: bool
    global_batch: int
    total_steps: int
    tokens_per_step: int
    segment: int


def prepare(cfg: TrainConfig, model_table: dict) -> Prepared:
    """Check the settings against the tokenizer and shards, and pick the strategy.

    Args:
        cfg: training settings.
        model_table: ``[model]`` overrides of the preset ``cfg.model``.

    Raises:
        TpulmError: anything a user can get wrong, named with what to do.
    """
    process.configure(cfg.precision, cfg.deterministic)  # first: before any TensorFlow op runs
    tokenizer_dir = preflight.resolve_tokenizer(cfg.run_dir, cfg.tokenizer)
    tok = tokenizer.open_folder(tokenizer_dir)
    vocab = tok.tokenizer.get_vocab_size()
    if cfg.init_from:
        init_from.check_tokenizer(cfg.init_from, tokenizer_dir)
    model_cfg = _model_config(cfg, model_table, vocab, tok.special.pad_id)
    train_set, eval_set = _open_data(cfg, tok, model_cfg)
    strategy = strategies.make_strategy(strategies.Placement(
        cfg.tpu, cfg.tpu_zone, cfg.gcp_project, mesh=cfg.mesh, model=model_cfg))
    global_batch = cfg.batch_size * strategy.num_replicas_in_sync
    total_steps = _total_steps(cfg, train_set.records, global_batch)
    return Prepared(
        cfg=cfg, model_cfg=model_cfg, tokenizer_dir=tokenizer_dir, special=tok.special,
        train_set=train_set, eval_set=eval_set,
        masker=_masker(cfg, tok, vocab, train_set.max_length),
        document_cls_id=tok.special.cls_id if cfg.document_attention else None,
        strategy=strategy, writer=strategy.is_chief(), global_batch=global_batch,
        total_steps=total_steps,
        tokens_per_step=global_batch * cfg.gradient_accumulation * train_set.max_length,
        segment=min(segment_length(cfg), total_steps),
    )


def _model_config(cfg: TrainConfig, model_table: dict, vocab: int, pad_id: int):
    """The run's ``ModelConfig``: the run dir's, else ``--init-from``'s, else the preset's."""
    saved = storage.exists(storage.join(cfg.run_dir, rundir.CONFIG_NAME))
    if saved or not cfg.init_from:
        return preflight.resolve_model(cfg.run_dir, cfg.model, model_table, vocab, pad_id)
    if not cfg.train_data:
        raise TpulmError("no training data: pass --train-data (a shard folder or glob)")
    length = inputs.open_shards(cfg.train_data).max_length
    model_cfg = init_from.resolved_config(cfg.init_from, model_table, length)
    if model_cfg.vocab_size < vocab or model_cfg.pad_token_id != pad_id:
        raise TpulmError(
            f"--init-from {cfg.init_from} (vocab_size {model_cfg.vocab_size}, pad_token_id "
            f"{model_cfg.pad_token_id}) does not fit the tokenizer (vocab {vocab}, pad {pad_id}): "
            "use the tokenizer that model was trained with")
    return model_cfg


def _open_data(cfg: TrainConfig, tok, model_cfg):
    """(train, eval) shard sets, checked against the tokenizer and model."""
    if not cfg.train_data:
        raise TpulmError("no training data: pass --train-data (a shard folder or glob)")
    train_set = inputs.open_shards(cfg.train_data)
    preflight.check_shards(train_set, tok, model_cfg, "--train-data")
    if not cfg.eval_data:
        return train_set, None
    eval_set = inputs.open_shards(cfg.eval_data)
    preflight.check_shards(eval_set, tok, model_cfg, "--eval-data")
    if eval_set.max_length != train_set.max_length:
        raise TpulmError(
            f"--eval-data has sequences of {eval_set.max_length} tokens, --train-data of "
            f"{train_set.max_length}: prepare both with the same --max-length"
        )
    return train_set, eval_set


def head_slots(cfg: TrainConfig, length: int) -> int:
    """LM-head slots per row: what the masker budgets, so shapes stay static.

    Token-level masking shares the slots of one replica's batch (``--batch-size`` rows): at seq
    128 and 30% masking, 44 slots a row for a batch of 32 instead of 70 for each row alone.
    Whole-word masking budgets per row (its cap never splits a word).
    """
    if cfg.whole_word_mask:
        return whole_word_predictions(length, cfg.mlm_probability)
    return max_predictions(length, cfg.mlm_probability, group_rows=cfg.batch_size)


def _masker(cfg: TrainConfig, tok, vocab: int, length: int) -> Masker:
    """Token-level or whole-word masking, as ``cfg.whole_word_mask`` says."""
    special = tok.special
    common = dict(
        vocab_size=vocab, mask_id=special.mask_id, special_ids=special.ids,
        mlm_probability=cfg.mlm_probability, mask_token_rate=cfg.mask_token_rate,
        random_token_rate=cfg.random_token_rate, num_predictions=head_slots(cfg, length),
    )
    if not cfg.whole_word_mask:
        return Masker(group_rows=cfg.batch_size, **common)
    return WholeWordMasker(
        word_starts=tuple(words.word_start_table(tok.tokenizer).tolist()), **common)


def _total_steps(cfg: TrainConfig, records: int, global_batch: int) -> int:
    """``--max-steps``, else ``--epochs`` (default 1) passes of full optimizer steps."""
    if cfg.max_steps:
        return cfg.max_steps
    per_step = global_batch * cfg.gradient_accumulation
    per_epoch = records // per_step
    if per_epoch == 0:
        raise TpulmError(
            f"--train-data has {records} records, fewer than one step of {per_step}: lower "
            "--batch-size or add data"
        )
    return (cfg.epochs or 1) * per_epoch


def build_for_training(cfg: TrainConfig, model_cfg, strategy: Strategy, total_steps: int):
    """The model and its built optimizer, in the strategy's scope, as ``tpulm train`` makes them.

    Seeds Keras with ``cfg.seed`` first (initial weights and dropout). The learning rate is
    linear warmup then decay over ``total_steps``; AdamW with clipping and gradient accumulation;
    ``mixed_float16`` wraps it in a ``LossScaleOptimizer``. Needs no data and no run dir (restoring
    a checkpoint is the loop's job).

    Args:
        cfg: training settings (seed, learning rate, warmup, weight decay, clipping,
            accumulation, precision; ``process.configure`` should have set the precision policy).
        model_cfg: a ``tpulm.model.config.ModelConfig``.
        strategy: where the variables live (``strategies.local()`` for this process alone).
        total_steps: optimizer steps the schedule spans.

    Returns:
        ``(model, optimizer, learning_rate)``; ``learning_rate.at(step)`` is the schedule in Python.
    """
    import keras

    from tpulm.model.networks import build_model

    keras.utils.set_random_seed(cfg.seed)
    with strategy.scope():
        model = build_model(model_cfg, attention=cfg.attention, remat=cfg.remat)
        lr = schedule.LinearWarmupDecay(
            cfg.learning_rate, schedule.warmup_steps(cfg.warmup, total_steps), total_steps,
            cfg.gradient_accumulation,
        )
        optimizer = schedule.make_optimizer(
            model, learning_rate=lr, weight_decay=cfg.weight_decay, clip_norm=cfg.clip_norm,
            accumulation=cfg.gradient_accumulation,
        )
        if cfg.precision == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
    return model, optimizer, lr


def compile_for_training(model, optimizer, cfg: TrainConfig, strategy: Strategy,
                         steps_per_execution: int = 1) -> bool:
    """``model.compile`` with the masked-LM loss and weighted metrics, XLA as the strategy decides.

    Args:
        model: from :func:`build_for_training`.
        optimizer: from :func:`build_for_training`.
        cfg: training settings (``jit_compile``, ``precision``).
        strategy: the strategy the model was built under.
        steps_per_execution: micro-steps per compiled call (``config.steps_per_execution``).

    Returns:
        Whether the train step compiles with XLA.
    """
    jit = strategy.use_xla(cfg.jit_compile, cfg.precision)
    with strategy.scope():
        model.compile(
            optimizer=optimizer,
            loss=objective.MaskedLMLoss(),
            weighted_metrics=objective.weighted_metrics(),
            jit_compile=jit,
            steps_per_execution=steps_per_execution,
        )
    log.info("XLA %s, %d step(s) per execution", "on" if jit else "off", steps_per_execution)
    return jit
