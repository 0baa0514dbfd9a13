"""``keras.ops`` helpers shared by the networks."""

from __future__ import annotations

from keras import ops


def gather_positions(x, positions):
    """The rows of ``x`` (batch, seq, hidden) at ``positions`` (batch, P): (batch, P, hidden).

    A position is an offset from the start of its slot's own row in the flattened (batch x seq)
    states, so ``0..seq-1`` are the row's own columns and a slot may also name a token of another
    row (masking lets a group of rows share its slots: :class:`tpulm.training.masking.Masker`).
    The masked-LM heads run on these gathered slots only, not on every position.
    """
    batch, seq, hidden = ops.shape(x)[0], ops.shape(x)[1], ops.shape(x)[2]
    index = ops.arange(batch, dtype="int32")[:, None] * seq + ops.cast(positions, "int32")
    return ops.take(ops.reshape(x, (-1, hidden)), index, axis=0)
