"""A classification or regression head on the pretrained encoder (RoBERTa-style), keras.ops only.

The head reads the hidden state of the first token (``[CLS]`` / ``<s>``): dropout, dense + tanh,
dropout, dense to the outputs, as Transformers' ``RobertaClassificationHead`` (same sublayer
names, ``dense`` and ``out_proj``). The network's parts are reached by attribute, the same for
every architecture (:class:`tpulm.model.masked_lm.MaskedLM`): ``network.backbone.encode`` gives
the hidden states and ``network.lm_head`` is the head left unused.
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from tpulm.model.masked_lm import MaskedLM

HEAD_NAME = "classifier"


def freeze_lm_head(network: MaskedLM) -> None:
    """Make the masked-LM head's own variables non-trainable: fine-tuning never uses them.

    Variable by variable, not ``lm_head.trainable``: the head holds the tied word embedding as a
    sublayer, and freezing the layer would freeze the embeddings too.
    """
    for variable in network.lm_head.own_weights():
        variable.trainable = False


class ClassificationHead(keras.layers.Layer):
    """dropout -> dense(hidden, tanh) -> dropout -> dense(outputs), on (batch, hidden).

    Args:
        hidden_size: width of the encoder's hidden states.
        num_outputs: classes, or 1 for regression.
        dropout: dropout rate before each dense layer.
        initializer_range: stddev of the truncated-normal kernel initializer.
    """

    def __init__(self, hidden_size: int, num_outputs: int, dropout: float,
                 initializer_range: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.num_outputs = num_outputs
        self.dropout = dropout
        self.initializer_range = initializer_range
        init = keras.initializers.TruncatedNormal(stddev=initializer_range)
        self.dense = keras.layers.Dense(hidden_size, activation="tanh", kernel_initializer=init,
                                        name="dense", dtype=self.dtype_policy)
        self.out_proj = keras.layers.Dense(num_outputs, kernel_initializer=init, name="out_proj",
                                           dtype=self.dtype_policy)
        self.dropout_layer = keras.layers.Dropout(dropout, name="dropout", dtype=self.dtype_policy)

    def build(self, input_shape) -> None:
        self.dense.build(input_shape)
        self.out_proj.build((*input_shape[:-1], self.hidden_size))
        self.built = True

    def call(self, x, training=None):
        x = self.dense(self.dropout_layer(x, training=training))
        return self.out_proj(self.dropout_layer(x, training=training))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), **{k: getattr(self, k) for k in (
            "hidden_size", "num_outputs", "dropout", "initializer_range")}}


class SequenceClassifier(keras.Model):
    """A tpulm network's encoder plus a :class:`ClassificationHead` on its first token.

    Inputs are ``{"input_ids", "attention_mask"}`` (batch, seq); the output is float32,
    (batch, num_outputs): logits, or the predicted value for regression.

    Args:
        network: a built tpulm masked-LM network (its LM head is frozen and unused).
        num_outputs: classes, or 1 for regression.
        dropout: the head's dropout rate.
    """

    def __init__(self, network: MaskedLM, num_outputs: int, dropout: float = 0.1,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.network = network
        freeze_lm_head(network)
        self.head = ClassificationHead(
            network.cfg.hidden_size, num_outputs, dropout, network.cfg.initializer_range,
            name=HEAD_NAME, dtype=self.dtype_policy)
        self.head.build((None, network.cfg.hidden_size))

    def call(self, inputs, training=None):
        states = self.network.backbone.encode(inputs, training=training)
        return ops.cast(self.head(states[:, 0, :], training=training), "float32")
