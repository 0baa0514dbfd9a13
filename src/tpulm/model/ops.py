"""``keras.ops`` helpers shared by the networks."""

from __future__ import annotations

from keras import ops


def gather_positions(x, positions):
    """The rows of ``x`` (batch, seq, hidden) at ``positions`` (batch, P): (batch, P, hidden).

    The masked-LM heads run on these gathered slots only, not on every position.
    """
    index = ops.cast(positions, "int32")[:, :, None]
    index = ops.broadcast_to(index, (*ops.shape(index)[:2], ops.shape(x)[-1]))
    return ops.take_along_axis(x, index, axis=1)
