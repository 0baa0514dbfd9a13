"""The training loop: build and restore the model (``Trainer``), then ``fit`` by segments.

Reading order: ``Trainer.__init__`` creates all the state of a run (model, optimizer, metrics log,
the schedule of periodic actions); ``Trainer.fit`` only runs it: one ``model.fit`` call per run of
whole segments (``config.fit_calls``), the hooks of ``_schedule`` at every segment end, a
checkpoint and ``Interrupted`` after a SIGTERM / SIGINT, and the summary. One optimizer step is
Keras' train step (``gradient_accumulation`` micro-batches, ``steps_per_execution`` of them per
compiled call).
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from tpulm import rundir, storage
from tpulm.config import as_table
from tpulm.errors import Interrupted, TpulmError
from tpulm.metrics_log import MetricsLog
from tpulm.training import (
    checkpoint,
    flops,
    init_from,
    inputs,
    preemption,
    preflight,
    setup,
    strategies,
)
from tpulm.training.callbacks import NonFiniteLoss, SegmentEnd, StepMonitor, optimizer_step
from tpulm.training.config import TrainResult, fit_calls, progress_verbosity, steps_per_execution
from tpulm.training.hooks import Hooks

log = logging.getLogger(__name__)


class Trainer:
    """A run ready to train: built, restored from the run dir, compiled. Writes the run dir
    (``config.toml``, the tokenizer copy), so construct it under the run dir's lock.

    Args:
        run: the checked run, from ``setup.prepare``.
    """

    def __init__(self, run: setup.Prepared):
        self.started = time.monotonic()
        self.run, cfg = run, run.cfg
        self.model, self.optimizer, self.lr = setup.build_for_training(
            cfg, run.model_cfg, run.strategy, run.total_steps)
        with run.strategy.scope():
            state = checkpoint.restore(cfg.run_dir, self.model, self.optimizer, run.writer)
            if state is None and cfg.init_from:  # a new run from trained weights, at step 0
                init_from.copy_weights(self.model, cfg.init_from)
        state = state or {"step": 0}  # no checkpoint: a fresh run
        self.start = int(state["step"])
        # Tokens trained before this session, as counted then (the batch size may have changed).
        self.start_tokens = int(state.get("tokens", self.start * run.tokens_per_step))
        self.complete = self.start >= run.total_steps
        if self.start and not self.complete:
            preflight.say_changed_settings(cfg, self.start)
        if run.writer and not self.complete:  # a finished run keeps the config it trained with
            preflight.prepare_run_dir(cfg.run_dir, run.tokenizer_dir,
                                      {"model": as_table(run.model_cfg), "train": as_table(cfg)})
        self.log = MetricsLog(cfg.run_dir, self.start, float(state.get("time", 0.0)), run.writer)
        self._say_where_it_stands(state)
        self.calls = fit_calls(self.start, run.total_steps, run.segment)
        setup.compile_for_training(
            self.model, self.optimizer, cfg, run.strategy,
            steps_per_execution(cfg, self.calls, run.total_steps, cfg.gradient_accumulation))
        self.preemption = preemption.Preemption()
        self.monitor = StepMonitor(self.lr.at, run.tokens_per_step, run.total_steps,
                                   progress=progress_verbosity(cfg.progress))
        self.hooks = self._schedule()
        self.last_eval: dict[str, float] | None = None
        self.last_checkpoint: str | None = None
        self.eval_ds = None  # made by the first fit call, or on demand by a final-only evaluation
        self.marks: list[tuple[float, int]] = []  # (training clock, step) at each segment end
        self.rates: list[float] = []  # tokens/s of each train line of this session
        self.overhead = 0.0  # seconds spent in hooks (evaluations, saves), off the training clock

    def _schedule(self) -> Hooks:
        """The actions due every N optimizer steps (and at the last), run at segment ends.

        The per-call actions are in ``_callbacks``; together they are the loop's whole schedule.
        """
        cfg = self.run.cfg
        hooks = Hooks(last_step=self.run.total_steps)
        hooks.add("train line", self._log_train, every=cfg.log_every)
        if self.run.eval_set is not None:
            hooks.add("evaluation", self._evaluate, every=cfg.eval_every)
        hooks.add("checkpoint", self._save, every=cfg.checkpoint_every)
        return hooks

    def _callbacks(self) -> list:
        """Keras callbacks of one ``model.fit`` call, in the order they run."""
        return [
            # Every compiled call: learning rate, tokens/s, progress line; stop on NaN or at the end.
            self.monitor,
            # Every compiled call ending on an optimizer update: stop after SIGTERM / SIGINT.
            self.preemption.callback(self.run.cfg.gradient_accumulation),
            # Every segment end (Keras epoch): the hooks of ``_schedule`` that are due.
            SegmentEnd(self._segment_end),
        ]

    # -- running --------------------------------------------------------------------------

    def fit(self) -> TrainResult:
        """Train from the restored step to ``total_steps``; checkpoint and raise on a signal."""
        run = self.run
        if self.start < run.total_steps:
            log.info("training %s: steps %d -> %d, global batch %d x %d tokens, %s",
                     run.cfg.run_dir, self.start, run.total_steps, run.global_batch,
                     run.train_set.max_length, run.strategy.name)
        fit_started = time.monotonic()
        try:
            with self.preemption:
                self._run_calls()
            self._stop_if_preempted()
        except strategies.data_loss_error() as err:  # a corrupt or truncated shard
            raise self._corrupt_data(err) from None
        except NonFiniteLoss as err:
            raise self._diverged(err.step) from None
        if self.complete:  # nothing trained: report the state as recorded, append nothing
            recorded = self.log.last("eval")
            self.last_eval = {k: recorded[k] for k in ("loss", "accuracy", "perplexity")
                              if k in recorded} if recorded else None
            if recorded is None and run.eval_set is not None:
                self._evaluate(self.start)  # a finished run never evaluated: do it once
        return self._summary(self._tokens_per_second(fit_started))

    def _tokens(self, step: int) -> int:
        """Token positions trained on by ``step``: earlier sessions' count, then this one's."""
        return self.start_tokens + (step - self.start) * self.run.tokens_per_step

    def _run_calls(self) -> None:
        """One ``model.fit`` per entry of ``config.fit_calls``; each Keras epoch is a segment."""
        a = self.run.cfg.gradient_accumulation
        for first, steps, epochs in self.calls:
            train_ds, self.eval_ds = self._datasets(first * a)
            initial = first // self.run.segment
            self.model.fit(
                train_ds,
                initial_epoch=initial,
                epochs=initial + epochs,
                steps_per_epoch=steps * a,
                callbacks=self._callbacks(),
                verbose=0,  # StepMonitor shows one progress line over the whole run
                shuffle=False,  # the dataset is shuffled, deterministically
            )
            if self.preemption.signum is not None:
                return

    def _segment_end(self, step: int, logs: dict) -> None:
        """Run the hooks due at ``step``, off the training clock."""
        if self.preemption.signum is not None and step % self.run.segment:
            return  # stopped inside a segment: no partial-segment line; _stop_if_preempted saves
        t0 = time.monotonic()
        self.marks.append((t0 - self.overhead, step))
        self.hooks.run(step, logs)
        self.overhead += time.monotonic() - t0

    def _datasets(self, start_batch: int):
        """(train, eval) datasets for Keras; per-worker pipelines where the strategy needs them."""
        run = self.run

        def train(context=None):
            return inputs.training_dataset(
                run.train_set, batch_size=run.global_batch, masker=run.masker,
                seed=run.cfg.seed, start_batch=start_batch,
                shuffle_buffer=run.cfg.shuffle_buffer, input_context=context,
                document_cls_id=run.document_cls_id,
            )

        def evaluate(context=None):
            return inputs.eval_dataset(
                run.eval_set, batch_size=run.global_batch, masker=run.masker,
                seed=run.cfg.seed, input_context=context,
                filler_ids=(run.special.cls_id, run.special.pad_id),
                document_cls_id=run.document_cls_id,
            )

        make_eval = evaluate if run.eval_set is not None else None
        if run.strategy.needs_input_pipelines():
            spread = run.strategy.distribute_datasets_from_function
            return spread(train), spread(make_eval) if make_eval else None
        return train(), make_eval() if make_eval else None

    # -- the hooks ------------------------------------------------------------------------

    def _log_train(self, step: int, logs: dict) -> None:
        """A ``train`` line: the segment's mean loss and masked accuracy, learning rate, tokens/s."""
        if "loss" not in logs:
            return
        if not math.isfinite(float(logs["loss"])):
            raise NonFiniteLoss(step)
        self.log.write("train", step, self._tokens(step), {
            "loss": logs["loss"], "accuracy": logs.get("accuracy", float("nan")),
            "learning_rate": self.lr.at(step - 1),
            "tokens_per_second": self.monitor.tokens_per_second,
        })
        self.rates.append(self.monitor.tokens_per_second)

    def _evaluate(self, step: int, logs: dict | None = None) -> dict[str, float]:
        """An ``eval`` line over the whole validation split."""
        if self.eval_ds is None:
            _, self.eval_ds = self._datasets(0)
        result = self.model.evaluate(self.eval_ds, verbose=0, return_dict=True)
        loss = float(result["token_loss"])
        values = {"loss": loss, "accuracy": float(result["accuracy"]),
                  "perplexity": math.exp(min(loss, 700.0))}
        self.log.write("eval", step, self._tokens(step), values)
        log.info("eval at step %d: loss %.4f, accuracy %.4f, perplexity %.2f",
                 step, values["loss"], values["accuracy"], values["perplexity"])
        self.last_eval = values
        return values

    def _save(self, step: int, logs: dict | None = None) -> None:
        """A checkpoint of ``step`` (the chief writes it; every process checks the weights)."""
        bad = [v.path for v in self.model.weights
               if not np.isfinite(np.asarray(v.numpy(), np.float32)).all()]
        if bad:
            raise NonFiniteLoss(step)  # the update of this step produced NaN/Inf weights
        run = self.run
        state = {
            "step": step,
            "data_position": step * run.cfg.gradient_accumulation,  # batches each pipeline read
            "tokens": self._tokens(step),
            "time": round(self.log.elapsed(), 3),
            "seed": run.cfg.seed,
            "total_steps": run.total_steps,
        }
        if run.writer:
            self.last_checkpoint = checkpoint.save(
                run.cfg.run_dir, self.model, self.optimizer, state, run.cfg.keep_checkpoints)

    # -- ends -----------------------------------------------------------------------------

    def _say_where_it_stands(self, state: dict) -> None:
        """Log a finished run (and its export), or the checkpoint a run resumes from and a
        schedule stretched to a new step count."""
        run_dir, total = self.run.cfg.run_dir, self.run.total_steps
        if self.complete:
            export = storage.join(run_dir, rundir.EXPORT_DIR)
            has_export = storage.exists(storage.join(export, rundir.MODEL_WEIGHTS))
            log.info("run %s is complete at step %d (of %d)%s; raise --max-steps to train longer",
                     run_dir, self.start, total, f", its export is in {export}" if has_export else "")
            return
        if not self.start:
            return
        log.info("resuming from %s (step %d)", state["checkpoint"], self.start)
        saved_total = state.get("total_steps")
        if saved_total and saved_total != total:
            log.info("continuing from step %d with the schedule extended from %d to %d steps "
                     "(learning rate now %.3g)", self.start, saved_total, total,
                     self.lr.at(self.start))

    def _stop_if_preempted(self) -> None:
        """After a SIGTERM / SIGINT: checkpoint the step reached and raise ``Interrupted``."""
        step = optimizer_step(self.model)
        if self.preemption.signum is None or step >= self.run.total_steps:
            return  # no signal, or it came after the last step: the run is complete
        self._save(step)
        log.warning("stopped by %s after step %d; checkpoint %s", self.preemption.signal_name,
                    step, self.last_checkpoint)
        raise Interrupted(self.preemption.signal_name, self.preemption.exit_code, step,
                          self.last_checkpoint)

    def _corrupt_data(self, err) -> TpulmError:
        """The error to raise when reading the shards failed: which file, and what to run."""
        run = self.run
        files = [*run.train_set.files, *(run.eval_set.files if run.eval_set else ())]
        found = inputs.find_corrupt_shard(files)
        where = f"{found[0]} is corrupt or truncated ({found[1]})" if found else (
            f"a shard could not be read ({err.message.splitlines()[0]})")
        return TpulmError(f"{where}; check the folder with `tpulm data inspect`, then prepare "
                          "the data again (or remove that file) and rerun to resume")

    def _diverged(self, step: int) -> TpulmError:
        """The error to raise after a NaN/Inf loss: the checkpoint to go back to."""
        good = checkpoint.last_good(self.run.cfg.run_dir, step)
        named = f"{good[0]} (loss {good[1]:.4g})" if good else "none"
        return TpulmError(
            f"the training loss became NaN/Inf at step {step}; last good checkpoint: "
            f"{named}. Lower --learning-rate (or raise --warmup), delete the checkpoints "
            "after it, and rerun to resume from it"
        )

    def _tokens_per_second(self, fit_started: float) -> float:
        """Steady throughput: the mean of this session's train lines after the first (which
        includes compilation), as ``tpulm report`` reads them back, so both say one number."""
        if self.rates:
            steady = self.rates[1:] or self.rates
            return sum(steady) / len(steady)
        marks = [m for m in self.marks if m[1] > self.start]
        if len(marks) >= 2:
            (t0, s0), (t1, s1) = marks[0], marks[-1]
        elif marks:
            (t0, s0), (t1, s1) = (fit_started, self.start), marks[-1]
        else:
            return 0.0
        return (s1 - s0) * self.run.tokens_per_step / max(t1 - t0, 1e-9)

    def _summary(self, tps: float) -> TrainResult:
        run, cfg = self.run, self.run.cfg
        steps = max(run.total_steps - self.start, 0)
        step = max(run.total_steps, self.start)  # a finished run stays at its own last step
        seq_flops = flops.train_flops_per_sequence(
            run.model_cfg, run.train_set.max_length, run.masker.num_predictions)
        achieved = tps / run.train_set.max_length * seq_flops
        peak = cfg.peak_tflops * 1e12 if cfg.peak_tflops else run.strategy.peak_flops()
        latest = rundir.latest_checkpoint(cfg.run_dir)
        result = TrainResult(
            run_dir=cfg.run_dir, step=step, steps_this_session=steps,
            tokens=self._tokens(step), wall_time=time.monotonic() - self.started,
            tokens_per_second=tps, mfu=achieved / peak if peak else 0.0, peak_flops=peak,
            eval=self.last_eval, checkpoint=latest[1] if latest else None,
        )
        if not steps:  # a finished run: "is complete at step N" said it all
            return result
        log.info(
            "done: step %d (%d this session), %d tokens, %.1f s, %.0f tokens/s, MFU %.1f%% "
            "of %.1f GFLOP/s%s", result.step, steps, result.tokens, result.wall_time, tps,
            100 * result.mfu, peak / 1e9,
            f", eval loss {self.last_eval['loss']:.4f}" if self.last_eval else "",
        )
        return result
