"""The fine-tuning loop: encode a task, train a head + encoder with AdamW, score every epoch.

AdamW with linear warmup and linear decay (``tpulm.training.schedule``, as pretraining), full batches in
an order drawn from the seed (the last partial batch of an epoch is dropped, as in training, so
every step has one static shape), the validation split scored after every epoch with the task's
metrics; the best epoch by the main metric is the run's result (as GLUE papers report).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tpulm import config
from tpulm.errors import TpulmError
from tpulm.evaluate import metrics
from tpulm.evaluate.tasks import CLASSIFICATION, Split, Task
from tpulm.training.distribution import JIT_MODES, check_jit_mode

log = logging.getLogger(__name__)

# RoBERTa's GLUE learning rate is ~2e-5 at hidden size 768; narrower models take larger steps, so
# the default scales as 1/hidden from there (1.2e-4 at hidden 128), between 1e-5 and 1e-3. A rule
# of thumb, not a tuned value: pass --learning-rate for a sweep.
BASE_LEARNING_RATE, BASE_HIDDEN = 2e-5, 768


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """Hyper-parameters of fine-tuning (shared by every task of a run)."""

    learning_rate: float | None = config.setting(
        None, "peak learning rate (default: 2e-5 x 768 / hidden size, within [1e-5, 1e-3])")
    epochs: int = config.setting(3, "passes over the train split")
    batch_size: int = config.setting(32, "examples per step")
    max_length: int = config.setting(128, "tokens per example, pair included (longer: truncated)")
    warmup: float = config.setting(0.06, "warmup: a fraction of the steps if < 1, else steps")
    weight_decay: float = config.setting(0.1, "AdamW weight decay (not on LayerNorm and biases)")
    clip_norm: float = config.setting(1.0, "global gradient-norm clipping (0: off)")
    dropout: float = config.setting(0.1, "dropout of the classification head")
    jit_compile: str = config.setting(
        "auto", "XLA: auto (as tpulm train: on, off on CPU with TensorFlow in bfloat16), true, false",
        choices=JIT_MODES)

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "max_length"):
            if getattr(self, name) < 1:
                raise TpulmError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.learning_rate is not None and self.learning_rate <= 0:
            raise TpulmError(f"learning_rate must be positive, got {self.learning_rate}")
        if self.warmup < 0 or self.weight_decay < 0 or self.clip_norm < 0:
            raise TpulmError("warmup, weight_decay and clip_norm must be >= 0")
        if not 0 <= self.dropout < 1:
            raise TpulmError(f"dropout must be in [0, 1), got {self.dropout}")
        check_jit_mode(self.jit_compile)


def peak_learning_rate(cfg: FinetuneConfig, hidden_size: int) -> float:
    """``cfg.learning_rate``, or the default for a model of width ``hidden_size``."""
    if cfg.learning_rate is not None:
        return cfg.learning_rate
    return min(max(BASE_LEARNING_RATE * BASE_HIDDEN / hidden_size, 1e-5), 1e-3)


@dataclasses.dataclass(frozen=True)
class Encoded:
    """A task tokenized: per split ``(input_ids, attention_mask)``, (examples, width) int32."""

    train: dict[str, np.ndarray]
    validation: dict[str, np.ndarray]
    width: int


def _encode_split(tokenizer, split: Split) -> list[list[int]]:
    items = list(zip(split.texts, split.pairs)) if split.pairs is not None else list(split.texts)
    return [e.ids for e in tokenizer.encode_batch(items)]


def _pad(rows: list[list[int]], width: int, pad_id: int) -> dict[str, np.ndarray]:
    ids = np.full((len(rows), width), pad_id, np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    return {"input_ids": ids, "attention_mask": (ids != pad_id).astype(np.int32)}


def encode(tokenizer, task: Task, max_length: int, pad_id: int) -> Encoded:
    """Tokenize both splits, pairs with the tokenizer's pair template (``[CLS] A [SEP] B [SEP]``).

    Rows are truncated to ``max_length`` (longest text first) and padded to one width for the
    task: the longest row rounded up to a multiple of 8, so short tasks run short sequences.
    """
    tokenizer.enable_truncation(max_length)
    tokenizer.no_padding()
    rows = {name: _encode_split(tokenizer, getattr(task, name)) for name in ("train", "validation")}
    longest = max(len(r) for split in rows.values() for r in split)
    width = min(max_length, 8 * math.ceil(longest / 8))
    return Encoded(_pad(rows["train"], width, pad_id), _pad(rows["validation"], width, pad_id), width)


@dataclasses.dataclass
class SeedRun:
    """One fine-tuning run: the scores of every epoch and the best one (1-based epoch)."""

    seed: int
    epochs: list[dict[str, float]]
    best_epoch: int
    best: dict[str, float]
    tokens_per_second: float
    learning_rate: float


def _jit(mode: str) -> bool:
    """XLA or not, by the rule pretraining uses for this process's devices."""
    from tpulm.training import strategies

    return strategies.local().use_xla(mode)


def _compile(model, task: Task, cfg: FinetuneConfig, peak: float, total_steps: int) -> None:
    import keras

    from tpulm.training import schedule

    lr = schedule.LinearWarmupDecay(peak, schedule.warmup_steps(cfg.warmup, total_steps), total_steps)
    optimizer = schedule.make_optimizer(model, learning_rate=lr, weight_decay=cfg.weight_decay,
                                        clip_norm=cfg.clip_norm)
    loss = (keras.losses.SparseCategoricalCrossentropy(from_logits=True)
            if task.kind == CLASSIFICATION else keras.losses.MeanSquaredError())
    model.compile(optimizer=optimizer, loss=loss, jit_compile=_jit(cfg.jit_compile))


def predict(model, inputs: dict[str, np.ndarray], batch_size: int, kind: str) -> np.ndarray:
    """Class ids (classification) or values (regression); batches padded to one shape."""
    count = len(inputs["input_ids"])
    padded = -count % batch_size
    batch = {k: np.concatenate([v, np.repeat(v[-1:], padded, axis=0)]) for k, v in inputs.items()}
    outputs = np.asarray(model.predict(batch, batch_size=batch_size, verbose=0))[:count]
    return outputs.argmax(axis=-1) if kind == CLASSIFICATION else outputs[:, 0]


def _targets(task: Task, labels: np.ndarray) -> np.ndarray:
    return labels if task.kind == CLASSIFICATION else labels.astype(np.float32)[:, None]


def finetune(build_network: Callable[[], Any], task: Task, encoded: Encoded,
             cfg: FinetuneConfig, seed: int) -> SeedRun:
    """Fine-tune a fresh network from ``build_network()`` plus a new head on ``task``.

    Args:
        build_network: returns a built tpulm network (pretrained or freshly initialised); called
            after the seed is set.
        task: the task; ``encoded`` its tokenized splits.
        cfg: hyper-parameters.
        seed: seed of the head's initialisation, dropout and the batch order.
    """
    import keras

    from tpulm.evaluate.heads import SequenceClassifier

    keras.utils.set_random_seed(seed)
    network = build_network()
    model = SequenceClassifier(network, task.num_outputs, cfg.dropout, name="sequence_classifier")
    count = len(task.train)
    batch = min(cfg.batch_size, count)
    steps = count // batch
    peak = peak_learning_rate(cfg, network.cfg.hidden_size)
    _compile(model, task, cfg, peak, steps * cfg.epochs)
    rng = np.random.default_rng(seed)
    targets = _targets(task, task.train.labels)
    epochs, speeds = [], []
    for _ in range(cfg.epochs):
        order = rng.permutation(count)[: steps * batch]
        started = time.perf_counter()
        history = model.fit({k: v[order] for k, v in encoded.train.items()}, targets[order],
                            batch_size=batch, epochs=1, shuffle=False, verbose=0)
        seconds = time.perf_counter() - started
        speeds.append(steps * batch * encoded.width / seconds)
        predictions = predict(model, encoded.validation, batch, task.kind)
        scores = metrics.compute(task.metrics, task.validation.labels, predictions)
        epochs.append({**scores, "train_loss": float(history.history["loss"][-1]),
                       "seconds": seconds})
        log.info("%s seed %d epoch %d: %s", task.name, seed, len(epochs),
                 ", ".join(f"{k} {v:.4f}" for k, v in scores.items()))
    main = task.metrics[0]
    best = max(range(len(epochs)), key=lambda e: -math.inf if math.isnan(epochs[e][main])
               else epochs[e][main])
    # The first epoch includes compilation: leave it out of the speed when there are more.
    speed = float(np.median(speeds[1:] if len(speeds) > 1 else speeds))
    return SeedRun(seed, epochs, best + 1, {m: epochs[best][m] for m in task.metrics}, speed, peak)
