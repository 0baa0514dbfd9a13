"""The training session behind ``tpulm.training.run``: build, restore, fit by segments, summarise."""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from tpulm import rundir, storage
from tpulm.config import as_table
from tpulm.data import tokenizer
from tpulm.errors import Interrupted, TpulmError
from tpulm.metrics_log import MetricsLog
from tpulm.training import (
    checkpoint,
    flops,
    inputs,
    objective,
    preemption,
    preflight,
    schedule,
    strategies,
    words,
)
from tpulm.training.callbacks import NonFiniteLoss, SegmentEnd, StepMonitor
from tpulm.training.config import (
    TrainConfig,
    TrainResult,
    fit_calls,
    progress_verbosity,
    segment_length,
    steps_per_execution,
)
from tpulm.training.masking import (
    Masker,
    WholeWordMasker,
    max_predictions,
    whole_word_predictions,
)

log = logging.getLogger(__name__)


class Trainer:
    """One call of ``tpulm.training.run``: checks, strategy, model, then ``fit``.

    Args:
        cfg: training settings.
        model_table: ``[model]`` overrides of the preset ``cfg.model``.
    """

    def __init__(self, cfg: TrainConfig, model_table: dict):
        import tensorflow as tf

        self.cfg = cfg
        strategies.configure_cpu_threads()  # first: before any TensorFlow op runs
        if cfg.deterministic:
            tf.config.experimental.enable_op_determinism()
        strategies.set_precision(cfg.precision)
        self.tokenizer_dir = preflight.resolve_tokenizer(cfg.run_dir, cfg.tokenizer)
        self.tokenizer = tokenizer.open_folder(self.tokenizer_dir)
        self.special = self.tokenizer.special
        vocab = self.tokenizer.tokenizer.get_vocab_size()
        self.model_cfg = preflight.resolve_model(
            cfg.run_dir, cfg.model, model_table, vocab, self.special.pad_id
        )
        self.train_set, self.eval_set = self._open_data()
        self.masker = self._masker(self.tokenizer.tokenizer, vocab)
        self.document_cls_id = self.special.cls_id if cfg.document_attention else None
        placement = strategies.Placement(
            cfg.tpu, cfg.tpu_zone, cfg.gcp_project, mesh=cfg.mesh, model=self.model_cfg)
        self.strategy, self.strategy_name = strategies.make_strategy(placement)
        self.writer = strategies.is_chief(self.strategy)  # only it writes the run dir's files
        self.preemption = preemption.Preemption()
        self.global_batch = cfg.batch_size * self.strategy.num_replicas_in_sync
        self.accumulation = cfg.gradient_accumulation
        self.total_steps = self._total_steps()
        self.tokens_per_step = self.global_batch * self.accumulation * self.train_set.max_length
        self.segment = min(segment_length(cfg), self.total_steps)

    def _masker(self, tok, vocab: int) -> Masker:
        """Token-level or whole-word masking, as ``cfg.whole_word_mask`` says."""
        cfg, length = self.cfg, self.train_set.max_length
        common = dict(
            vocab_size=vocab, mask_id=self.special.mask_id, special_ids=self.special.ids,
            mlm_probability=cfg.mlm_probability, mask_token_rate=cfg.mask_token_rate,
            random_token_rate=cfg.random_token_rate,
        )
        if not cfg.whole_word_mask:
            # The rows of one replica's batch share their LM-head slots: at seq 128 and 30%
            # masking, 44 slots a row for a batch of 32 instead of 70 for each row alone.
            rows = cfg.batch_size
            return Masker(num_predictions=max_predictions(length, cfg.mlm_probability, group_rows=rows),
                          group_rows=rows, **common)
        return WholeWordMasker(
            num_predictions=whole_word_predictions(length, cfg.mlm_probability),
            word_starts=tuple(words.word_start_table(tok).tolist()), **common)

    def _open_data(self):
        cfg = self.cfg
        if not cfg.train_data:
            raise TpulmError("no training data: pass --train-data (a shard folder or glob)")
        train_set = inputs.open_shards(cfg.train_data)
        preflight.check_shards(train_set, self.tokenizer, self.model_cfg, "--train-data")
        eval_set = None
        if cfg.eval_data:
            eval_set = inputs.open_shards(cfg.eval_data)
            preflight.check_shards(eval_set, self.tokenizer, self.model_cfg, "--eval-data")
            if eval_set.max_length != train_set.max_length:
                raise TpulmError(
                    f"--eval-data has sequences of {eval_set.max_length} tokens, --train-data of "
                    f"{train_set.max_length}: prepare both with the same --max-length"
                )
        return train_set, eval_set

    def _total_steps(self) -> int:
        per_epoch = self.train_set.records // (self.global_batch * self.accumulation)
        if self.cfg.max_steps:
            return self.cfg.max_steps
        if per_epoch == 0:
            raise TpulmError(
                f"--train-data has {self.train_set.records} records, fewer than one step of "
                f"{self.global_batch * self.accumulation}: lower --batch-size or add data"
            )
        return (self.cfg.epochs or 1) * per_epoch

    # -- building -------------------------------------------------------------------------

    def _build(self):
        """Model and built optimizer in the strategy scope, restored from the run dir if any."""
        import keras

        from tpulm.model.networks import build_model

        keras.utils.set_random_seed(self.cfg.seed)
        with self.strategy.scope():
            model = build_model(self.model_cfg)
            lr = schedule.LinearWarmupDecay(
                self.cfg.learning_rate,
                schedule.warmup_steps(self.cfg.warmup, self.total_steps),
                self.total_steps,
                self.accumulation,
            )
            optimizer = schedule.make_optimizer(
                model, learning_rate=lr, weight_decay=self.cfg.weight_decay,
                clip_norm=self.cfg.clip_norm, accumulation=self.accumulation,
            )
            if self.cfg.precision == "mixed_float16":
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            optimizer.build(model.trainable_variables)
            state = checkpoint.restore(self.cfg.run_dir, model, optimizer, self.writer) or {"step": 0}
        return model, optimizer, lr, state

    def _compile(self, model, optimizer, calls) -> None:
        jit = strategies.use_xla(self.strategy, self.cfg.jit_compile, self.cfg.precision)
        spe = steps_per_execution(self.cfg, calls, self.total_steps, self.accumulation)
        with self.strategy.scope():
            model.compile(
                optimizer=optimizer,
                loss=objective.MaskedLMLoss(),
                weighted_metrics=objective.weighted_metrics(),
                jit_compile=jit,
                steps_per_execution=spe,
            )
        log.info("XLA %s, %d step(s) per execution", "on" if jit else "off", spe)

    def _datasets(self, start_batch: int):
        """(train, eval) datasets for Keras; per-worker pipelines where the strategy needs them."""

        def train(context=None):
            return inputs.training_dataset(
                self.train_set, batch_size=self.global_batch, masker=self.masker,
                seed=self.cfg.seed, start_batch=start_batch,
                shuffle_buffer=self.cfg.shuffle_buffer, input_context=context,
                document_cls_id=self.document_cls_id,
            )

        def evaluate(context=None):
            return inputs.eval_dataset(
                self.eval_set, batch_size=self.global_batch, masker=self.masker,
                seed=self.cfg.seed, input_context=context,
                filler_ids=(self.special.cls_id, self.special.pad_id),
                document_cls_id=self.document_cls_id,
            )

        make_eval = evaluate if self.eval_set is not None else None
        if strategies.needs_input_pipelines(self.strategy):
            spread = self.strategy.distribute_datasets_from_function
            return spread(train), spread(make_eval) if make_eval else None
        return train(), make_eval() if make_eval else None

    # -- the loop -------------------------------------------------------------------------

    def fit(self) -> TrainResult:
        """Train from the latest checkpoint (or from scratch) to ``total_steps``."""
        started = time.monotonic()
        model, optimizer, lr, state = self._build()
        self.model, self.optimizer, self.lr = model, optimizer, lr
        start = int(state["step"])
        if self.writer:
            preflight.prepare_run_dir(
                self.cfg.run_dir, self.tokenizer_dir,
                {"model": as_table(self.model_cfg), "train": as_table(self.cfg)},
            )
        self.log = MetricsLog(self.cfg.run_dir, start, float(state.get("time", 0.0)), self.writer)
        self.last_eval, self.overhead, self.last_checkpoint, self.marks = None, 0.0, None, []
        self.eval_ds = None  # made by the first fit call, or on demand by a final-only evaluation
        self._say_where_it_stands(start, state.get("total_steps"))
        calls = fit_calls(start, self.total_steps, self.segment)
        self._compile(model, optimizer, calls)
        if start < self.total_steps:
            log.info(
                "training %s: steps %d -> %d, global batch %d x %d tokens, %s",
                self.cfg.run_dir, start, self.total_steps, self.global_batch,
                self.train_set.max_length, self.strategy_name,
            )
        self.monitor = StepMonitor(lr.at, self.tokens_per_step, self.total_steps,
                                   progress=progress_verbosity(self.cfg.progress))
        fit_started = time.monotonic()
        try:
            with self.preemption:
                self._run_calls(calls)
            self._stop_if_preempted()
        except strategies.data_loss_error() as err:  # a corrupt or truncated shard
            raise self._corrupt_data(err) from None
        except NonFiniteLoss as err:
            good = checkpoint.last_good(self.cfg.run_dir, err.step)
            named = f"{good[0]} (loss {good[1]:.4g})" if good else "none"
            raise TpulmError(
                f"the training loss became NaN/Inf at step {err.step}; last good checkpoint: "
                f"{named}. Lower --learning-rate (or raise --warmup), delete the checkpoints "
                "after it, and rerun to resume from it"
            ) from None
        if start >= self.total_steps:  # nothing left to train: report the final state
            self._segment_end(start, {}, final_only=True)
        return self._summary(start, started, self._tokens_per_second(start, fit_started))

    def _say_where_it_stands(self, start: int, saved_total: int | None) -> None:
        """Log a finished run (and its export) or a schedule stretched to a new step count."""
        if start >= self.total_steps:
            export = storage.join(self.cfg.run_dir, rundir.EXPORT_DIR)
            has_export = storage.exists(storage.join(export, rundir.MODEL_WEIGHTS))
            log.info("run %s is complete at step %d (of %d)%s; raise --max-steps to train longer",
                     self.cfg.run_dir, start, self.total_steps,
                     f", its export is in {export}" if has_export else "")
        elif start and saved_total and saved_total != self.total_steps:
            log.info("continuing from step %d with the schedule extended from %d to %d steps "
                     "(learning rate now %.3g)", start, saved_total, self.total_steps,
                     self.lr.at(start))

    def _run_calls(self, calls) -> None:
        a = self.accumulation
        for first, steps, epochs in calls:
            train_ds, self.eval_ds = self._datasets(first * a)
            initial = first // self.segment
            self.model.fit(
                train_ds,
                initial_epoch=initial,
                epochs=initial + epochs,
                steps_per_epoch=steps * a,
                callbacks=[self.monitor, SegmentEnd(self._segment_end),
                           self.preemption.callback(a)],
                verbose=0,  # StepMonitor shows one progress line over the whole run
                shuffle=False,  # the dataset is shuffled, deterministically
            )
            if self.preemption.signum is not None:
                return

    def _segment_end(self, step: int, logs: dict, final_only: bool = False) -> None:
        """Log, evaluate and checkpoint when due (always at the last step)."""
        if self.preemption.signum is not None and step % self.segment:
            return  # stopped inside a segment: no partial-segment line; _stop_if_preempted saves
        t0 = time.monotonic()
        self.marks.append((t0 - self.overhead, step))  # training clock, without evals and saves
        cfg, tokens = self.cfg, step * self.tokens_per_step
        last = step >= self.total_steps
        if not final_only and "loss" in logs:
            if not math.isfinite(float(logs["loss"])):
                raise NonFiniteLoss(step)
            self.log.write("train", step, tokens, {
                "loss": logs["loss"], "accuracy": logs.get("accuracy", float("nan")),
                "learning_rate": self.lr.at(step - 1),
                "tokens_per_second": self.monitor.tokens_per_second,
            })
        if self.eval_set is not None and (last or step % cfg.eval_every == 0):
            self.last_eval = self._evaluate(step, tokens, record=not final_only)
        if not final_only and (last or step % cfg.checkpoint_every == 0):
            self._save(step, tokens)
        self.overhead += time.monotonic() - t0

    def _corrupt_data(self, err) -> TpulmError:
        """The error to raise when reading the shards failed: which file, and what to run."""
        files = [*self.train_set.files, *(self.eval_set.files if self.eval_set else ())]
        found = inputs.find_corrupt_shard(files)
        where = f"{found[0]} is corrupt or truncated ({found[1]})" if found else (
            f"a shard could not be read ({err.message.splitlines()[0]})")
        return TpulmError(f"{where}; check the folder with `tpulm data inspect`, then prepare "
                          "the data again (or remove that file) and rerun to resume")

    def _stop_if_preempted(self) -> None:
        """After a SIGTERM / SIGINT: checkpoint the step reached and raise ``Interrupted``."""
        from tpulm.training.callbacks import optimizer_step

        step = optimizer_step(self.model)
        if self.preemption.signum is None or step >= self.total_steps:
            return  # no signal, or it came after the last step: the run is complete
        self._save(step, step * self.tokens_per_step)
        log.warning("stopped by %s after step %d; checkpoint %s", self.preemption.signal_name,
                    step, self.last_checkpoint)
        raise Interrupted(self.preemption.signal_name, self.preemption.exit_code, step,
                          self.last_checkpoint)

    def _evaluate(self, step: int, tokens: int, record: bool = True) -> dict[str, float]:
        """Evaluate; the line goes to metrics.jsonl only when ``record`` (a finished run that
        is only reported on already has it)."""
        if self.eval_ds is None:
            _, self.eval_ds = self._datasets(0)
        result = self.model.evaluate(self.eval_ds, verbose=0, return_dict=True)
        loss = float(result["token_loss"])
        values = {"loss": loss, "accuracy": float(result["accuracy"]),
                  "perplexity": math.exp(min(loss, 700.0))}
        if record:
            self.log.write("eval", step, tokens, values)
        log.info("eval at step %d: loss %.4f, accuracy %.4f, perplexity %.2f",
                 step, values["loss"], values["accuracy"], values["perplexity"])
        return values

    def _save(self, step: int, tokens: int) -> None:
        bad = [v.path for v in self.model.weights if not np.isfinite(np.asarray(v.numpy(), np.float32)).all()]
        if bad:
            raise NonFiniteLoss(step)  # the update of this step produced NaN/Inf weights
        state = {
            "step": step,
            "data_position": step * self.accumulation,  # batches consumed by each input pipeline
            "tokens": tokens,
            "time": round(self.log.elapsed(), 3),
            "seed": self.cfg.seed,
            "total_steps": self.total_steps,
        }
        if not self.writer:
            return  # the chief writes the checkpoints
        self.last_checkpoint = checkpoint.save(
            self.cfg.run_dir, self.model, self.optimizer, state, self.cfg.keep_checkpoints
        )

    def _tokens_per_second(self, start: int, fit_started: float) -> float:
        """Steady throughput: after the first segment (which includes compilation) if possible."""
        marks = [m for m in self.marks if m[1] > start]
        if len(marks) >= 2:
            (t0, s0), (t1, s1) = marks[0], marks[-1]
        elif marks:
            (t0, s0), (t1, s1) = (fit_started, start), marks[-1]
        else:
            return 0.0
        return (s1 - s0) * self.tokens_per_step / max(t1 - t0, 1e-9)

    def _summary(self, start: int, started: float, tps: float) -> TrainResult:
        steps = max(self.total_steps - start, 0)
        seq_flops = flops.train_flops_per_sequence(
            self.model_cfg, self.train_set.max_length, self.masker.num_predictions
        )
        achieved = tps / self.train_set.max_length * seq_flops
        peak = (self.cfg.peak_tflops * 1e12 if self.cfg.peak_tflops
                else strategies.peak_flops(self.strategy))
        latest = rundir.latest_checkpoint(self.cfg.run_dir)
        result = TrainResult(
            run_dir=self.cfg.run_dir, step=self.total_steps, steps_this_session=steps,
            tokens=self.total_steps * self.tokens_per_step, wall_time=time.monotonic() - started,
            tokens_per_second=tps, mfu=achieved / peak if peak else 0.0, peak_flops=peak,
            eval=self.last_eval, checkpoint=latest[1] if latest else None,
        )
        log.info(
            "done: step %d (%d this session), %d tokens, %.1f s, %.0f tokens/s, MFU %.1f%% "
            "of %.1f GFLOP/s%s", result.step, steps, result.tokens, result.wall_time, tps,
            100 * result.mfu, peak / 1e9,
            f", eval loss {self.last_eval['loss']:.4f}" if self.last_eval else "",
        )
        return result
