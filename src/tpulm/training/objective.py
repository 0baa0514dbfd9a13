"""The training objective: masked-token loss and metrics.

The loss and metrics count masked positions only (``masked_weights`` 1.0); padding slots weigh 0.
"""

from __future__ import annotations

import keras
from keras import ops

from tpulm.training import replicas


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
        count = replicas.all_reduce_sum(ops.sum(weights))
        return ops.sum(tokens * weights) / ops.maximum(ops.stop_gradient(count), 1.0)

    def call(self, y_true, y_pred):  # used by Loss.__call__ only; kept for get_config users
        return ops.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)


def weighted_metrics() -> list:
    """Token accuracy and token-mean cross-entropy over masked positions, exact over a dataset."""
    return [
        keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
        keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="token_loss"),
    ]
