"""RoBERTa encoder + masked-LM head in Keras 3 ops, the same function as Transformers'
``RobertaForMaskedLM`` for the same weights, on any Keras backend (TensorFlow, JAX).

Only ``keras.ops`` and ``keras.layers`` are used, so the JAX backend runs this code unchanged.
Every sublayer has an explicit ``name=``: the resulting variable paths (``model.weights[i].path``)
are the contract that checkpoints (:mod:`tpulm.model.weights`) and the Transformers weight map
(:mod:`tpulm.hf`) rely on. Do not rename layers without updating ``tpulm.hf``.

Model inputs are a dict::

    input_ids        (batch, seq) int32
    attention_mask   (batch, seq) int, 1 = real token
    masked_positions (batch, P) int32, optional: the LM head then runs on these positions only
                     (offsets into the flattened batch: see ``tpulm.model.ops.gather_positions``)
    segment_ids      (batch, seq) int32, optional: document of each token in a packed block (0 =
                     padding); attention is then block-diagonal (same nonzero segment only)
    position_ids     (batch, seq) int32, optional: position inside the document, from 0

and the output is float32 logits, (batch, P, vocab) or (batch, seq, vocab).
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from tpulm.model.config import ModelConfig
from tpulm.model.ops import gather_positions


def _initializer(cfg_range: float) -> keras.initializers.Initializer:
    return keras.initializers.TruncatedNormal(stddev=cfg_range)


class RobertaEmbeddings(keras.layers.Layer):
    """Word + learned absolute position + token-type embeddings, LayerNorm, dropout.

    Position ids follow Transformers' ``create_position_ids_from_input_ids``: non-pad tokens are
    numbered ``pad_token_id + 1, pad_token_id + 2, ...`` and padding gets ``pad_token_id``.

    Args:
        vocab_size: rows of the word table.
        hidden_size: embedding width.
        max_position_embeddings: rows of the position table.
        type_vocab_size: rows of the token-type table (only row 0 is used).
        pad_token_id: id of the padding token.
        layer_norm_eps: LayerNorm epsilon.
        dropout: dropout rate on the output.
        initializer_range: stddev of the truncated-normal initializer.
    """

    def __init__(self, vocab_size: int, hidden_size: int, max_position_embeddings: int,
                 type_vocab_size: int, pad_token_id: int, layer_norm_eps: float, dropout: float,
                 initializer_range: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.pad_token_id = pad_token_id
        self.layer_norm_eps = layer_norm_eps
        self.dropout = dropout
        self.initializer_range = initializer_range
        init = _initializer(initializer_range)
        common = dict(output_dim=hidden_size, embeddings_initializer=init, dtype=self.dtype_policy)
        self.word_embeddings = keras.layers.Embedding(vocab_size, name="word_embeddings", **common)
        self.position_embeddings = keras.layers.Embedding(
            max_position_embeddings, name="position_embeddings", **common)
        self.token_type_embeddings = keras.layers.Embedding(
            type_vocab_size, name="token_type_embeddings", **common)
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=layer_norm_eps, name="layer_norm", dtype=self.dtype_policy)
        self.dropout_layer = keras.layers.Dropout(dropout, name="dropout", dtype=self.dtype_policy)

    def build(self, input_shape) -> None:
        self.word_embeddings.build(input_shape)
        self.position_embeddings.build(input_shape)
        self.token_type_embeddings.build(input_shape)
        self.layer_norm.build((*input_shape, self.hidden_size))
        self.built = True

    def call(self, input_ids, position_ids=None, training=None):
        # (batch, seq): 1 for real tokens, 0 for padding, as RoBERTa derives it from the ids.
        not_pad = ops.cast(ops.not_equal(input_ids, self.pad_token_id), "int32")
        if position_ids is None:  # one document per row: number the real tokens 1, 2, ...
            position_ids = ops.cumsum(not_pad, axis=1)
        else:  # packed documents: per-document positions from 0, shifted to RoBERTa's 1, 2, ...
            position_ids = ops.cast(position_ids, "int32") + 1
        position_ids = position_ids * not_pad + self.pad_token_id
        # Token type 0 everywhere: add row 0 of the table, (hidden,) broadcast over (batch, seq).
        token_type = ops.take(self.token_type_embeddings.embeddings, 0, axis=0)
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        x = x + ops.cast(token_type, x.dtype)
        return self.dropout_layer(self.layer_norm(x), training=training)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), **{k: getattr(self, k) for k in (
            "vocab_size", "hidden_size", "max_position_embeddings", "type_vocab_size",
            "pad_token_id", "layer_norm_eps", "dropout", "initializer_range")}}


class RobertaBlock(keras.layers.Layer):
    """One post-LayerNorm transformer block: self-attention, then a GELU feed-forward layer.

    Attention runs through ``keras.ops.dot_product_attention`` (fused kernels where the backend
    has them). That op has no dropout on the attention probabilities, so while training with
    ``attention_dropout > 0`` the block computes softmax attention explicitly (as
    ``keras.layers.MultiHeadAttention`` does); at inference both paths are the same function.

    Args:
        hidden_size: width of the hidden states.
        num_heads: attention heads.
        intermediate_size: width of the feed-forward layer.
        layer_norm_eps: LayerNorm epsilon.
        hidden_dropout: dropout rate after the attention output and feed-forward projections.
        attention_dropout: dropout rate on attention probabilities.
        initializer_range: stddev of the truncated-normal initializer.
    """

    def __init__(self, hidden_size: int, num_heads: int, intermediate_size: int,
                 layer_norm_eps: float, hidden_dropout: float, attention_dropout: float,
                 initializer_range: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.intermediate_size = intermediate_size
        self.layer_norm_eps = layer_norm_eps
        self.hidden_dropout = hidden_dropout
        self.attention_dropout = attention_dropout
        self.initializer_range = initializer_range
        self.head_dim = hidden_size // num_heads

        def dense(units: int, name: str, activation=None) -> keras.layers.Dense:
            return keras.layers.Dense(units, activation=activation, name=name,
                                      kernel_initializer=_initializer(initializer_range),
                                      dtype=self.dtype_policy)

        def norm(name: str) -> keras.layers.LayerNormalization:
            return keras.layers.LayerNormalization(epsilon=layer_norm_eps, name=name,
                                                   dtype=self.dtype_policy)

        self.query = dense(hidden_size, "query")
        self.key = dense(hidden_size, "key")
        self.value = dense(hidden_size, "value")
        self.attention_output = dense(hidden_size, "attention_output")
        self.attention_layer_norm = norm("attention_layer_norm")
        self.intermediate = dense(intermediate_size, "intermediate", activation=_gelu)
        self.output_dense = dense(hidden_size, "output")
        self.output_layer_norm = norm("output_layer_norm")
        self.attention_probs_dropout = keras.layers.Dropout(
            attention_dropout, name="attention_probs_dropout", dtype=self.dtype_policy)
        self.attention_output_dropout = keras.layers.Dropout(
            hidden_dropout, name="attention_output_dropout", dtype=self.dtype_policy)
        self.output_dropout = keras.layers.Dropout(
            hidden_dropout, name="output_dropout", dtype=self.dtype_policy)

    def build(self, input_shape) -> None:
        for layer in (self.query, self.key, self.value, self.attention_output,
                      self.intermediate):
            layer.build(input_shape)
        self.attention_layer_norm.build(input_shape)
        self.output_dense.build((*input_shape[:-1], self.intermediate_size))
        self.output_layer_norm.build(input_shape)
        self.built = True

    def _split_heads(self, x):
        # (batch, seq, hidden) -> (batch, seq, heads, head_dim)
        return ops.reshape(x, (ops.shape(x)[0], ops.shape(x)[1], self.num_heads, self.head_dim))

    def _attend(self, x, mask, training):
        """Multi-head attention; ``mask`` is (batch, 1, 1 or seq, seq) bool, True = attend."""
        q, k, v = (self._split_heads(layer(x)) for layer in (self.query, self.key, self.value))
        scale = 1.0 / self.head_dim**0.5
        if training and self.attention_dropout > 0:
            # (batch, heads, seq_q, seq_k); softmax in float32 as dot_product_attention does.
            logits = ops.einsum("bqhd,bkhd->bhqk", q, k)
            logits = ops.cast(logits, "float32") * scale
            logits = ops.where(mask, logits, ops.cast(-1e9, "float32"))
            probs = ops.cast(ops.softmax(logits, axis=-1), v.dtype)
            probs = self.attention_probs_dropout(probs, training=training)
            context = ops.einsum("bhqk,bkhd->bqhd", probs, v)
        else:
            context = ops.dot_product_attention(q, k, v, mask=mask, scale=scale)
        # (batch, seq, heads, head_dim) -> (batch, seq, hidden)
        return ops.reshape(context, ops.shape(x))

    def call(self, x, mask, training=None):
        attended = self.attention_output(self._attend(x, mask, training))
        attended = self.attention_output_dropout(attended, training=training)
        x = self.attention_layer_norm(x + attended)
        ffn = self.output_dense(self.intermediate(x))
        ffn = self.output_dropout(ffn, training=training)
        return self.output_layer_norm(x + ffn)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), **{k: getattr(self, k) for k in (
            "hidden_size", "num_heads", "intermediate_size", "layer_norm_eps", "hidden_dropout",
            "attention_dropout", "initializer_range")}}


def _gelu(x):
    """Exact (erf) GELU, as Transformers' ``"gelu"``."""
    return ops.gelu(x, approximate=False)


class MaskedLMHead(keras.layers.Layer):
    """dense -> GELU -> LayerNorm -> decoder tied to the word embeddings, plus a bias.

    Args:
        vocab_size: output vocabulary size.
        hidden_size: width of the hidden states.
        layer_norm_eps: LayerNorm epsilon.
        initializer_range: stddev of the truncated-normal initializer.
        token_embedding: the ``keras.layers.Embedding`` whose table is the decoder (tied weights;
            its variable lives in the embedding layer only).
    """

    def __init__(self, vocab_size: int, hidden_size: int, layer_norm_eps: float,
                 initializer_range: float, token_embedding: keras.layers.Embedding,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.layer_norm_eps = layer_norm_eps
        self.initializer_range = initializer_range
        self.token_embedding = token_embedding
        self.dense = keras.layers.Dense(
            hidden_size, activation=_gelu, kernel_initializer=_initializer(initializer_range),
            name="dense", dtype=self.dtype_policy)
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=layer_norm_eps, name="layer_norm", dtype=self.dtype_policy)

    def build(self, input_shape) -> None:
        self.dense.build(input_shape)
        self.layer_norm.build(input_shape)
        self.bias = self.add_weight(shape=(self.vocab_size,), initializer="zeros", name="bias")
        self.built = True

    def call(self, x):
        x = self.layer_norm(self.dense(x))
        table = ops.cast(self.token_embedding.embeddings, x.dtype)  # (vocab, hidden)
        logits = ops.matmul(x, ops.transpose(table)) + ops.cast(self.bias, x.dtype)
        return ops.cast(logits, "float32")

    def get_config(self) -> dict[str, Any]:
        # The tied embedding is a live layer, not a setting: RobertaMaskedLM passes it in.
        return {**super().get_config(), **{k: getattr(self, k) for k in (
            "vocab_size", "hidden_size", "layer_norm_eps", "initializer_range")}}


class RobertaMaskedLM(keras.Model):
    """RoBERTa encoder + MLM head; see the module docstring for inputs and outputs.

    Args:
        **model_config: the fields of :class:`ModelConfig`.
    """

    def __init__(self, vocab_size: int, hidden_size: int, num_layers: int, num_heads: int,
                 intermediate_size: int, max_position_embeddings: int, type_vocab_size: int,
                 pad_token_id: int, layer_norm_eps: float, hidden_dropout: float,
                 attention_dropout: float, initializer_range: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cfg = ModelConfig(
            vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers,
            num_heads=num_heads, intermediate_size=intermediate_size,
            max_position_embeddings=max_position_embeddings, type_vocab_size=type_vocab_size,
            pad_token_id=pad_token_id, layer_norm_eps=layer_norm_eps,
            hidden_dropout=hidden_dropout, attention_dropout=attention_dropout,
            initializer_range=initializer_range)
        cfg = self.cfg
        self.embeddings = RobertaEmbeddings(
            vocab_size=vocab_size, hidden_size=hidden_size,
            max_position_embeddings=max_position_embeddings, type_vocab_size=type_vocab_size,
            pad_token_id=pad_token_id, layer_norm_eps=layer_norm_eps, dropout=hidden_dropout,
            initializer_range=initializer_range, name="embeddings", dtype=self.dtype_policy)
        self.blocks = [
            RobertaBlock(
                hidden_size=hidden_size, num_heads=num_heads, intermediate_size=intermediate_size,
                layer_norm_eps=layer_norm_eps, hidden_dropout=hidden_dropout,
                attention_dropout=attention_dropout, initializer_range=initializer_range,
                name=f"layer_{i}", dtype=self.dtype_policy)
            for i in range(cfg.num_layers)
        ]
        self.lm_head = MaskedLMHead(
            vocab_size=vocab_size, hidden_size=hidden_size, layer_norm_eps=layer_norm_eps,
            initializer_range=initializer_range, token_embedding=self.embeddings.word_embeddings,
            name="lm_head", dtype=self.dtype_policy)

    def build(self, input_shape=None) -> None:
        shape = (None, None)
        self.embeddings.build(shape)
        for block in self.blocks:
            block.build((None, None, self.cfg.hidden_size))
        self.lm_head.build((None, None, self.cfg.hidden_size))
        self.built = True

    def encode(self, inputs, training=None):
        """The encoder's last hidden states, (batch, seq, hidden), without the LM head."""
        segments = inputs.get("segment_ids")
        if segments is None:
            # (batch, 1, 1, seq) bool: every query attends to the real (non-padding) keys only.
            mask = ops.not_equal(inputs["attention_mask"], 0)[:, None, None, :]
        else:
            # (batch, 1, seq, seq) bool, block-diagonal: a token attends to its own document only
            # (padding, segment 0, attends to padding: finite softmax, outputs unused).
            mask = ops.equal(segments[:, None, :, None], segments[:, None, None, :])
        x = self.embeddings(inputs["input_ids"], inputs.get("position_ids"), training=training)
        for block in self.blocks:
            x = block(x, mask, training=training)
        return x

    def call(self, inputs, training=None):
        x = self.encode(inputs, training=training)
        positions = inputs.get("masked_positions")
        if positions is not None:  # the head then runs on (batch, P, hidden) only
            x = gather_positions(x, positions)
        return self.lm_head(x)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), **roberta_kwargs(self.cfg)}


# The ModelConfig fields RobertaMaskedLM takes (the others belong to other architectures).
_ROBERTA_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                   "max_position_embeddings", "type_vocab_size", "pad_token_id", "layer_norm_eps",
                   "hidden_dropout", "attention_dropout", "initializer_range")


def roberta_kwargs(cfg: ModelConfig) -> dict[str, Any]:
    """The constructor arguments of :class:`RobertaMaskedLM` for ``cfg``."""
    return {name: getattr(cfg, name) for name in _ROBERTA_FIELDS}
