"""The optimizer: AdamW with linear warmup then linear decay to zero, global-norm clipping.

Everything here is ``keras.ops``, so the JAX backend reuses it unchanged. Across ``tf.distribute``
replicas the gradient is summed *before* clipping, so the clipped norm is the norm of the global
gradient, exactly as on one device (Keras clips per replica otherwise), and embedding gradients
are made dense first (Keras' norm of TensorFlow's ``IndexedSlices`` double-counts repeated rows).
"""

from __future__ import annotations

import keras
from keras import ops

from tpulm.training import replicas


def warmup_steps(warmup: float, total_steps: int) -> int:
    """``warmup`` below 1 is a fraction of ``total_steps``, otherwise a number of steps."""
    return int(round(warmup * total_steps)) if warmup < 1 else int(warmup)


class LinearWarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """``peak * min((s + 1) / warmup, (total - s) / (total - warmup))``, clipped to [0, peak].

    ``s`` is the optimizer update step (0-based): the first update already gets ``peak / warmup``
    (Transformers' schedule gives it 0) and the last one ``peak / (total - warmup)``.

    Args:
        peak: learning rate at the end of warmup.
        warmup: warmup steps.
        total: total update steps.
        accumulation: micro-batches per update (Keras counts micro-batches in ``iterations``).
    """

    def __init__(self, peak: float, warmup: int, total: int, accumulation: int = 1):
        self.peak, self.warmup, self.total, self.accumulation = peak, warmup, total, accumulation

    def __call__(self, iteration):
        step = ops.cast(ops.floor_divide(iteration, self.accumulation), "float32")
        rise = (step + 1.0) / max(self.warmup, 1)
        fall = (self.total - step) / max(self.total - self.warmup, 1)
        return self.peak * ops.clip(ops.minimum(rise, fall), 0.0, 1.0)

    def at(self, step: int) -> float:
        """The learning rate of update step ``step``, in Python (for logs)."""
        rise = (step + 1.0) / max(self.warmup, 1)
        fall = (self.total - step) / max(self.total - self.warmup, 1)
        return self.peak * min(max(min(rise, fall), 0.0), 1.0)

    def get_config(self) -> dict:
        return {k: getattr(self, k) for k in ("peak", "warmup", "total", "accumulation")}


class AdamW(keras.optimizers.AdamW):
    """Keras AdamW whose global-norm clipping sees the gradient summed over all replicas."""

    def _clip_gradients(self, grads):
        return super()._clip_gradients(replicas.all_reduce_sum(replicas.densify(list(grads))))

    def _all_reduce_sum_gradients(self, grads_and_vars):
        return grads_and_vars  # TF backend hook: already summed in _clip_gradients


def make_optimizer(
    model: keras.Model,
    *,
    learning_rate,
    weight_decay: float,
    clip_norm: float | None,
    accumulation: int = 1,
) -> keras.optimizers.Optimizer:
    """AdamW (β 0.9/0.98, ε 1e-6) for ``model``, weight decay on matrices only; not yet built.

    LayerNorm scales/offsets and biases (all 1-D variables) get no weight decay.

    Args:
        model: the built model whose trainable variables the optimizer updates.
        learning_rate: a float or a schedule (e.g. ``LinearWarmupDecay``).
        weight_decay: decoupled weight decay on kernels and embeddings.
        clip_norm: global gradient-norm bound; 0 or None for none.
        accumulation: micro-batches per update (gradient accumulation when > 1).
    """
    optimizer = AdamW(
        learning_rate=learning_rate,
        weight_decay=weight_decay,
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-6,
        global_clipnorm=clip_norm or None,
        gradient_accumulation_steps=accumulation if accumulation > 1 else None,
    )
    optimizer.exclude_from_weight_decay(
        var_list=[v for v in model.trainable_variables if len(v.shape) <= 1]
    )
    return optimizer
