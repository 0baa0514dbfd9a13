"""Objective, metrics and training logs: masked-token loss, metrics.jsonl, TensorBoard, FLOPs.

The loss and metrics count masked positions only (``masked_weights`` 1.0); padding slots weigh 0.
"""

from __future__ import annotations

import json
import math
import time

import keras
from keras import ops

from tpulm import distribute, rundir, storage


@keras.saving.register_keras_serializable(package="tpulm")
class MaskedLMLoss(keras.losses.Loss):
    """Mean cross-entropy over the real masked tokens of the *global* batch.

    Each replica returns (sum of its weighted token losses) / (real masked tokens summed over all
    replicas); the optimizer sums gradients over replicas, so the gradient is that of the global
    token mean, whatever the split of masked tokens between replicas.
    """

    def __init__(self, name: str = "masked_lm_loss"):
        super().__init__(name=name, reduction="sum")

    def __call__(self, y_true, y_pred, sample_weight=None):
        # y_true (B, P) int ids, y_pred (B, P, V) float32 logits, sample_weight (B, P) 0/1.
        tokens = ops.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)
        weights = ops.ones_like(tokens) if sample_weight is None else ops.cast(sample_weight, tokens.dtype)
        count = distribute.all_reduce_sum(ops.sum(weights))
        return ops.sum(tokens * weights) / ops.maximum(ops.stop_gradient(count), 1.0)

    def call(self, y_true, y_pred):  # used by Loss.__call__ only; kept for get_config users
        return ops.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)


def weighted_metrics() -> list:
    """Token accuracy and token-mean cross-entropy over masked positions, exact over a dataset."""
    return [
        keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
        keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="token_loss"),
    ]


def train_flops_per_sequence(cfg, seq_len: int, predictions: int) -> float:
    """Training FLOPs (forward + backward = 3 x forward) of one sequence.

    Matmuls: 6 x parameters-in-matmuls x tokens for the encoder (attention projections 4H^2 and
    the FFN 2HI per layer, per token), the LM head (H^2 + HV) only on the ``predictions`` gathered
    slots; attention scores and values 2 x 2 S^2 H per layer forward. Embedding lookups, norms and
    softmaxes are not counted.

    Args:
        cfg: a ``tpulm.model.ModelConfig``.
        seq_len: tokens per sequence.
        predictions: masked slots per sequence (P).
    """
    h, i, v, layers = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_layers
    encoder = 6.0 * seq_len * layers * (4 * h * h + 2 * h * i)
    head = 6.0 * predictions * (h * h + h * v)
    attention = 3.0 * layers * 4 * seq_len * seq_len * h
    return encoder + head + attention


def matmul_flops(n: int = 2048, repeats: int = 5, dtype: str = "float32") -> float:
    """FLOP/s of an (n, n) x (n, n) matmul on the default device: the peak for MFU estimates."""
    import tensorflow as tf

    a = tf.random.stateless_normal((n, n), seed=(0, 1), dtype=dtype)
    b = tf.random.stateless_normal((n, n), seed=(0, 2), dtype=dtype)
    matmul = tf.function(tf.linalg.matmul)
    matmul(a, b).numpy()  # warm-up (tracing, thread pools)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        matmul(a, b).numpy()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


class MetricsLog:
    """Appends ``metrics.jsonl`` lines (format in ``tpulm.rundir``) and TensorBoard scalars.

    On resume, lines past the checkpoint's step (written by the interrupted run, and about to be
    redone) are dropped, so the file reads as one uninterrupted run.

    Args:
        run_dir: the run dir.
        resume_step: step of the checkpoint training starts from (0 for a fresh run).
        time_offset: training seconds already spent before ``resume_step``.
    """

    def __init__(self, run_dir: str, resume_step: int = 0, time_offset: float = 0.0):
        self.path = storage.join(run_dir, rundir.METRICS_NAME)
        self.start = time.monotonic() - time_offset
        self._writers: dict = {}
        self._tb_dir = storage.join(run_dir, rundir.TENSORBOARD_DIR)
        self._lines = self._kept_lines(resume_step)
        storage.write_text(self.path, "".join(self._lines))

    def _kept_lines(self, resume_step: int) -> list[str]:
        if not storage.exists(self.path):
            return []
        kept = []
        for text in storage.read_text(self.path).splitlines(keepends=True):
            try:
                if json.loads(text)["step"] <= resume_step:
                    kept.append(text if text.endswith("\n") else text + "\n")
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line of a killed run
        return kept

    def elapsed(self) -> float:
        """Training seconds, including those of earlier (resumed) sessions."""
        return time.monotonic() - self.start

    def write(self, split: str, step: int, tokens: int, values: dict[str, float]) -> dict:
        """Append one line and the matching TensorBoard scalars; returns the line."""
        line = {"split": split, "step": step, "time": round(self.elapsed(), 3), "tokens": tokens}
        line.update({k: float(v) for k, v in values.items()})
        text = json.dumps(line) + "\n"
        self._lines.append(text)
        if storage.is_remote(self.path):  # object stores cannot append: rewrite (small file)
            storage.write_text(self.path, "".join(self._lines))
        else:
            with storage.open_file(self.path, "a") as f:
                f.write(text)
        self._scalars(split, step, values)
        return line

    def _scalars(self, split: str, step: int, values: dict[str, float]) -> None:
        import tensorflow as tf

        if split not in self._writers:
            self._writers[split] = tf.summary.create_file_writer(storage.join(self._tb_dir, split))
        # tf.summary.write with the scalars plugin's metadata is what tf.summary.scalar does,
        # without needing the tensorboard package installed.
        metadata = tf.compat.v1.SummaryMetadata(
            plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars")
        )
        with self._writers[split].as_default():
            for key, value in values.items():
                if math.isfinite(value):
                    tf.summary.write(key, tf.constant(value, tf.float32), step=step, metadata=metadata)
            self._writers[split].flush()
