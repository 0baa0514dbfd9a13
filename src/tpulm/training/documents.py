"""Document boundaries inside packed blocks, computed in the ``tf.data`` graph from ``input_ids``.

Shards hold blocks cut from the concatenation of ``[CLS] ... [SEP]`` documents, so a block may
hold several documents and begin in the middle of one. For document-aware attention (a
block-diagonal mask, as unpadded training does on GPUs) and per-document positions the model
needs, per token:

* ``segment_ids`` (B, S) int32: 1-based index of the document inside the block. A new document
  starts at each ``[CLS]``; tokens before the first ``[CLS]`` (the tail of a document cut by the
  block boundary) form segment 1 of their own. Padding (``attention_mask`` 0) gets 0.
* ``position_ids`` (B, S) int32: position inside the document, from 0 at its ``[CLS]`` (and from
  0 at the block start for a cut-off leading tail); 0 for padding.

No shard field is added: everything follows from ``input_ids``, ``attention_mask`` and the
``[CLS]`` id, so shards of the reference recipe work too.
"""

from __future__ import annotations

import tensorflow as tf


def document_features(input_ids: tf.Tensor, attention_mask: tf.Tensor, cls_id: int) -> dict:
    """``segment_ids`` and ``position_ids`` of packed blocks (see the module docstring).

    Args:
        input_ids: (B, S) int token ids.
        attention_mask: (B, S) int, 1 for real tokens, 0 for padding.
        cls_id: id of the token that opens every document.

    Returns:
        dict of (B, S) int32 ``segment_ids`` and ``position_ids``.
    """
    input_ids = tf.cast(input_ids, tf.int32)
    real = tf.equal(tf.cast(attention_mask, tf.int32), 1)
    opens = tf.logical_and(real, tf.equal(input_ids, cls_id))
    # Non-decreasing (B, S) document count; +1 on rows whose first token is not [CLS], so the
    # cut-off leading tail is segment 1 and every segment id is >= 1.
    lead = tf.cast(tf.logical_not(opens[:, :1]), tf.int32)
    count = tf.cumsum(tf.cast(opens, tf.int32), axis=-1) + lead
    # First index of each token's segment: where its count value first appears in the row.
    first = tf.searchsorted(count, count, side="left", out_type=tf.int32)
    positions = tf.range(tf.shape(input_ids)[1], dtype=tf.int32)[None, :] - first
    zero = tf.zeros_like(count)
    return {
        "segment_ids": tf.where(real, count, zero),
        "position_ids": tf.where(real, positions, zero),
    }
