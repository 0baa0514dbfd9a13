"""Gradient and count reductions across ``tf.distribute`` replicas (identity on JAX).

The loss (``objective``) and the clipping (``schedule``) need the *global* sum inside a replica
step; on JAX batches are already global, so both functions return their input there.
"""

from __future__ import annotations


def densify(values: list) -> list:
    """Dense tensors for gradients that TensorFlow returns as ``IndexedSlices`` (embeddings).

    Keras' global-norm clipping squares the slices as they are, so a row gathered twice counts
    as two rows instead of their sum: the norm is wrong unless the gradients are dense.
    """
    import keras

    if keras.backend.backend() != "tensorflow":
        return values
    import tensorflow as tf

    return [tf.convert_to_tensor(v) if isinstance(v, tf.IndexedSlices) else v for v in values]


def all_reduce_sum(values):
    """Sum a tensor or list of tensors over the replicas of a ``tf.distribute`` replica context.

    Identity on one replica, outside a replica context and on backends whose batches are global
    (JAX): there the local value already is the global one.
    """
    import keras

    if keras.backend.backend() != "tensorflow":
        return values
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return values
    return context.all_reduce(tf.distribute.ReduceOp.SUM, values)
