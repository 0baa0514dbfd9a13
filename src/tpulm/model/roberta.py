"""RoBERTa backbone + masked-LM head in Keras 3 ops, the same function as Transformers'
``RobertaForMaskedLM`` for the same weights, on any Keras backend (TensorFlow, JAX).

Only ``keras.ops`` and ``keras.layers`` are used, so the JAX backend runs this code unchanged.
Every sublayer has an explicit ``name=``: the resulting variable paths (``model.weights[i].path``)
are the contract that checkpoints (:mod:`tpulm.model.weights`) and the Transformers weight map
(:mod:`tpulm.hf.roberta`) rely on. Do not rename layers without updating ``tpulm.hf``.

Inputs, outputs and the backbone/head split are those of :mod:`tpulm.model.masked_lm`; with
``segment_ids`` attention is block-diagonal (same nonzero segment only) and ``position_ids``
number the tokens of each document from 0.
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from tpulm.model.attention import attend
from tpulm.model.config import ModelConfig
from tpulm.model.masked_lm import Backbone, ConfigLayer, MaskedLM, MaskedLMHead


def _initializer(cfg_range: float) -> keras.initializers.Initializer:
    return keras.initializers.TruncatedNormal(stddev=cfg_range)


def _gelu(x):
    """Exact (erf) GELU, as Transformers' ``"gelu"``."""
    return ops.gelu(x, approximate=False)


class RobertaEmbeddings(ConfigLayer):
    """Word + learned absolute position + token-type embeddings, LayerNorm, dropout.

    Position ids follow Transformers' ``create_position_ids_from_input_ids``: non-pad tokens are
    numbered ``pad_token_id + 1, pad_token_id + 2, ...`` and padding gets ``pad_token_id``. Only
    row 0 of the token-type table is used.

    Args:
        cfg: the model config (sizes, ``pad_token_id``, ``hidden_dropout`` on the output).
    """

    def __init__(self, cfg: ModelConfig | dict[str, Any], **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        cfg = self.cfg
        init = _initializer(cfg.initializer_range)
        common = dict(output_dim=cfg.hidden_size, embeddings_initializer=init,
                      dtype=self.dtype_policy)
        self.word_embeddings = keras.layers.Embedding(
            cfg.vocab_size, name="word_embeddings", **common)
        self.position_embeddings = keras.layers.Embedding(
            cfg.max_position_embeddings, name="position_embeddings", **common)
        self.token_type_embeddings = keras.layers.Embedding(
            cfg.type_vocab_size, name="token_type_embeddings", **common)
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=cfg.layer_norm_eps, name="layer_norm", dtype=self.dtype_policy)
        self.dropout_layer = keras.layers.Dropout(
            cfg.hidden_dropout, name="dropout", dtype=self.dtype_policy)

    def build(self, input_shape) -> None:
        self.word_embeddings.build(input_shape)
        self.position_embeddings.build(input_shape)
        self.token_type_embeddings.build(input_shape)
        self.layer_norm.build((*input_shape, self.cfg.hidden_size))

    def call(self, input_ids, position_ids=None, training=None):
        pad = self.cfg.pad_token_id
        # (batch, seq): 1 for real tokens, 0 for padding, as RoBERTa derives it from the ids.
        not_pad = ops.cast(ops.not_equal(input_ids, pad), "int32")
        if position_ids is None:  # one document per row: number the real tokens 1, 2, ...
            position_ids = ops.cumsum(not_pad, axis=1)
        else:  # packed documents: per-document positions from 0, shifted to RoBERTa's 1, 2, ...
            position_ids = ops.cast(position_ids, "int32") + 1
        position_ids = position_ids * not_pad + pad
        # Token type 0 everywhere: add row 0 of the table, (hidden,) broadcast over (batch, seq).
        token_type = ops.take(self.token_type_embeddings.embeddings, 0, axis=0)
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        x = x + ops.cast(token_type, x.dtype)
        return self.dropout_layer(self.layer_norm(x), training=training)


class RobertaBlock(ConfigLayer):
    """One post-LayerNorm transformer block: self-attention, then a GELU feed-forward layer.

    Attention runs through :func:`tpulm.model.attention.attend` (global: the backend's fused
    kernel where one applies under ``attention="auto"``, else ``keras.ops.dot_product_attention``
    with the padding / document mask); with dropout on the probabilities while training it
    computes the softmax explicitly (as ``keras.layers.MultiHeadAttention`` does).

    Args:
        cfg: the model config (sizes, ``hidden_dropout`` after the attention output and
            feed-forward projections, ``attention_dropout`` on attention probabilities).
        attention: ``"auto"`` or ``"dense"``.
    """

    def __init__(self, cfg: ModelConfig | dict[str, Any], attention: str = "auto",
                 **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        self.attention = attention
        cfg = self.cfg
        self.head_dim = cfg.hidden_size // cfg.num_heads

        def dense(units: int, name: str, activation=None) -> keras.layers.Dense:
            return keras.layers.Dense(units, activation=activation, name=name,
                                      kernel_initializer=_initializer(cfg.initializer_range),
                                      dtype=self.dtype_policy)

        def norm(name: str) -> keras.layers.LayerNormalization:
            return keras.layers.LayerNormalization(epsilon=cfg.layer_norm_eps, name=name,
                                                   dtype=self.dtype_policy)

        def dropout(rate: float, name: str) -> keras.layers.Dropout:
            return keras.layers.Dropout(rate, name=name, dtype=self.dtype_policy)

        self.query = dense(cfg.hidden_size, "query")
        self.key = dense(cfg.hidden_size, "key")
        self.value = dense(cfg.hidden_size, "value")
        self.attention_output = dense(cfg.hidden_size, "attention_output")
        self.attention_layer_norm = norm("attention_layer_norm")
        self.intermediate = dense(cfg.intermediate_size, "intermediate", activation=_gelu)
        self.output_dense = dense(cfg.hidden_size, "output")
        self.output_layer_norm = norm("output_layer_norm")
        self.attention_probs_dropout = dropout(cfg.attention_dropout, "attention_probs_dropout")
        self.attention_output_dropout = dropout(cfg.hidden_dropout, "attention_output_dropout")
        self.output_dropout = dropout(cfg.hidden_dropout, "output_dropout")

    def build(self, input_shape) -> None:
        for layer in (self.query, self.key, self.value, self.attention_output,
                      self.intermediate):
            layer.build(input_shape)
        self.attention_layer_norm.build(input_shape)
        self.output_dense.build((*input_shape[:-1], self.cfg.intermediate_size))
        self.output_layer_norm.build(input_shape)

    def _split_heads(self, x):
        # (batch, seq, hidden) -> (batch, seq, heads, head_dim)
        return ops.reshape(x, (ops.shape(x)[0], ops.shape(x)[1], self.cfg.num_heads,
                               self.head_dim))

    def _attend(self, x, attention_mask, segment_ids, training):
        """Multi-head attention over the real keys (of the query's own document)."""
        q, k, v = (self._split_heads(layer(x)) for layer in (self.query, self.key, self.value))
        dropout = None
        if training and self.cfg.attention_dropout > 0:
            dropout = lambda probs: self.attention_probs_dropout(  # noqa: E731
                probs, training=training)
        context = attend(q, k, v, attention_mask=attention_mask, segment_ids=segment_ids,
                         scale=1.0 / self.head_dim**0.5, mode=self.attention,
                         probs_dropout=dropout)
        # (batch, seq, heads, head_dim) -> (batch, seq, hidden)
        return ops.reshape(context, ops.shape(x))

    def call(self, x, attention_mask, segment_ids=None, training=None):
        attended = self.attention_output(self._attend(x, attention_mask, segment_ids, training))
        attended = self.attention_output_dropout(attended, training=training)
        x = self.attention_layer_norm(x + attended)
        ffn = self.output_dense(self.intermediate(x))
        ffn = self.output_dropout(ffn, training=training)
        return self.output_layer_norm(x + ffn)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "attention": self.attention}


class RobertaHead(MaskedLMHead):
    """dense -> GELU -> LayerNorm -> decoder tied to the word embeddings, plus ``bias``."""

    def dense_and_norm(self) -> tuple[keras.layers.Dense, keras.layers.LayerNormalization]:
        dense = keras.layers.Dense(
            self.cfg.hidden_size, activation=_gelu, name="dense", dtype=self.dtype_policy,
            kernel_initializer=_initializer(self.cfg.initializer_range))
        norm = keras.layers.LayerNormalization(
            epsilon=self.cfg.layer_norm_eps, name="layer_norm", dtype=self.dtype_policy)
        return dense, norm


class RobertaBackbone(Backbone):
    """Embeddings, then ``num_layers`` :class:`RobertaBlock` s: the encoder's hidden states.

    Args:
        cfg: the model config.
    """

    def __init__(self, cfg: ModelConfig | dict[str, Any], **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        self.embeddings = RobertaEmbeddings(self.cfg, name="embeddings", dtype=self.dtype_policy)
        self.blocks = [RobertaBlock(self.cfg, attention=self.attention, name=f"layer_{i}",
                                    dtype=self.dtype_policy) for i in range(self.cfg.num_layers)]

    @property
    def token_embedding(self) -> keras.layers.Embedding:
        return self.embeddings.word_embeddings

    def build_layers(self) -> None:
        self.embeddings.build((None, None))
        for block in self.blocks:
            block.build((None, None, self.cfg.hidden_size))

    def encode(self, inputs, training=None):
        """The last hidden states, (batch, seq, hidden), as Transformers' ``RobertaModel``."""
        x = self.embeddings(inputs["input_ids"], inputs.get("position_ids"), training=training)
        mask, segments = inputs["attention_mask"], inputs.get("segment_ids")
        for block in self.blocks:
            x = self.run_block(block, x, mask, segments, training=training)
        return x


class RobertaMaskedLM(MaskedLM):
    """RoBERTa backbone + MLM head (variable paths ``roberta_mlm/embeddings/...``,
    ``roberta_mlm/layer_i/...``, ``roberta_mlm/lm_head/...``).

    Args:
        cfg: the model config (``architecture = "roberta"``), or its fields as a dict.
    """

    backbone_class = RobertaBackbone
    head_class = RobertaHead
    head_name = "lm_head"
