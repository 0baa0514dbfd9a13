"""ModernBERT backbone + masked-LM head in Keras 3 ops, the same function as Transformers'
``ModernBertForMaskedLM`` for the same weights, on any Keras backend (TensorFlow, JAX).

The network (Warner et al. 2024, "Smarter, Better, Faster, Longer"), as Transformers builds it:

* token embeddings -> LayerNorm -> dropout (no position table: positions enter through RoPE);
* pre-norm blocks: ``x + Wo(attention(attn_norm(x)))`` then ``x + mlp(mlp_norm(x))``; block 0's
  ``attn_norm`` is the identity (the embedding LayerNorm just ran);
* attention with one fused ``Wqkv`` projection and rotary position embeddings; layers
  ``0, n, 2n, ...`` (``n = global_attn_every_n_layers``) attend globally with RoPE base
  ``global_rope_theta``, the others attend to keys at distance ``<= local_attention // 2`` with
  base ``local_rope_theta``;
* GeGLU MLP: ``Wo(act(a) * g)`` with ``a, g = chunk(Wi(x), 2)``;
* final LayerNorm, head ``norm(act(dense(x)))``, decoder tied to the token embeddings (+ bias).

Biases follow the config switches (``attention_bias``, ``mlp_bias``, ``norm_bias``,
``classifier_bias``, ``decoder_bias``), all off but the decoder's by default, as in Transformers.

Inputs, outputs and the backbone/head split are those of :mod:`tpulm.model.masked_lm`; with
``segment_ids`` a query attends only to keys of its own (nonzero) document, on local layers inside
the sliding window too, and RoPE uses ``position_ids`` (from 0 in each document) instead of
``0..seq-1``.

Attention goes through :func:`tpulm.model.attention.attend`: with ``attention="auto"`` the
sliding-window layers cost seq x window (blocked, or splash on TPU) and global layers take the
backend's fused kernel where one applies; ``"dense"`` is the masked (seq, seq) reference.

Initialisation follows Transformers' ``ModernBertPreTrainedModel._init_weights``: truncated
normal cut at ``+-initializer_cutoff_factor x std``; std ``initializer_range`` for the token
embeddings, ``Wqkv`` and ``Wi``; ``initializer_range / sqrt(2 x num_layers)`` for both ``Wo`` and
the head's dense; biases 0, LayerNorm gains 1. The decoder shares the embedding table, which
keeps the embedding std (Transformers would re-initialise the tied tensor with the "out" std
last; the table is the input embedding first).

Variable paths (``modernbert_mlm/...``) are the contract of :mod:`tpulm.hf.modernbert` and of
checkpoints: do not rename layers without updating it.
"""

from __future__ import annotations

import math
from typing import Any

import keras
import numpy as np
from keras import ops

from tpulm.model.attention import attend
from tpulm.model.config import GELU_APPROXIMATE, ModelConfig
from tpulm.model.masked_lm import Backbone, ConfigLayer, MaskedLM, MaskedLMHead


def is_global(cfg: ModelConfig, layer: int) -> bool:
    """Whether block ``layer`` attends globally (Transformers: ``layer % n == 0``)."""
    return layer % cfg.global_attn_every_n_layers == 0


@keras.saving.register_keras_serializable(package="tpulm")
class CutTruncatedNormal(keras.initializers.Initializer):
    """Normal(0, std) truncated to ``[-cutoff x std, cutoff x std]`` (as
    ``torch.nn.init.trunc_normal_`` with ``a = -b``), by the inverse CDF of a uniform draw.

    Keras' own ``TruncatedNormal`` always cuts at 2 std; ModernBERT's cut is a setting.

    Args:
        std: standard deviation before truncation.
        cutoff: the cut, in standard deviations.
        seed: an int seed, or None.
    """

    def __init__(self, std: float, cutoff: float, seed: int | None = None) -> None:
        self.std, self.cutoff, self.seed = std, cutoff, seed
        self._seed = keras.random.SeedGenerator(seed) if seed is not None else None

    def __call__(self, shape, dtype=None):
        edge = 0.5 * (1.0 + math.erf(self.cutoff / math.sqrt(2.0)))  # Phi(cutoff)
        u = keras.random.uniform(shape, 1.0 - edge, edge, dtype="float32", seed=self._seed)
        x = math.sqrt(2.0) * ops.erfinv(2.0 * u - 1.0) * self.std
        return ops.cast(ops.clip(x, -self.cutoff * self.std, self.cutoff * self.std), dtype)

    def get_config(self) -> dict[str, Any]:
        return {"std": self.std, "cutoff": self.cutoff, "seed": self.seed}


def _activation(name: str):
    approximate = GELU_APPROXIMATE[name]
    return lambda x: ops.gelu(x, approximate=approximate)


def rope_tables(positions, head_dim: int, theta: float):
    """``(cos, sin)`` of rotary embeddings, float32 (batch or 1, seq, 1, head_dim).

    Args:
        positions: (batch or 1, seq) int positions.
        head_dim: size of one attention head (even).
        theta: the RoPE base.
    """
    # As Transformers: inv_freq in float32, frequencies repeated as [f, f] over the head.
    exponent = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    inv_freq = (1.0 / (np.float32(theta) ** exponent)).astype(np.float32)
    freqs = ops.cast(positions, "float32")[..., None] * ops.convert_to_tensor(inv_freq)
    angles = ops.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
    return ops.cos(angles), ops.sin(angles)


def apply_rope(x, cos, sin):
    """Rotate (batch, seq, heads, head_dim) ``x`` in float32: ``x cos + rotate_half(x) sin``.

    Under mixed precision Keras hands the block ``cos``/``sin`` in the compute dtype (float inputs
    of a layer call are autocast); Transformers also casts them to the activations' dtype.
    """
    xf = ops.cast(x, "float32")
    cos, sin = ops.cast(cos, "float32"), ops.cast(sin, "float32")
    half = ops.shape(x)[-1] // 2
    rotated = ops.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    return ops.cast(xf * cos + rotated * sin, x.dtype)


class ModernBertBlock(ConfigLayer):
    """One pre-norm block: RoPE self-attention (global or sliding window), then a GeGLU MLP.

    Args:
        cfg: the model config.
        layer: the block's index (block 0 has no attention LayerNorm; see :func:`is_global`).
        attention: ``"auto"`` or ``"dense"`` (:func:`tpulm.model.attention.attend`).
    """

    def __init__(self, cfg: ModelConfig | dict[str, Any], layer: int, attention: str = "auto",
                 **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        self.layer = layer
        self.attention = attention
        cfg = self.cfg
        self.head_dim = cfg.hidden_size // cfg.num_heads
        std_in = cfg.initializer_range
        std_out = cfg.initializer_range / math.sqrt(2.0 * cfg.num_layers)

        def dense(units: int, bias: bool, std: float, name: str) -> keras.layers.Dense:
            return keras.layers.Dense(
                units, use_bias=bias, name=name, dtype=self.dtype_policy,
                kernel_initializer=CutTruncatedNormal(std, cfg.initializer_cutoff_factor))

        def norm(name: str) -> keras.layers.LayerNormalization:
            return keras.layers.LayerNormalization(
                epsilon=cfg.layer_norm_eps, center=cfg.norm_bias, name=name,
                dtype=self.dtype_policy)

        def dropout(rate: float, name: str) -> keras.layers.Dropout:
            return keras.layers.Dropout(rate, name=name, dtype=self.dtype_policy)

        self.attn_norm = norm("attn_norm") if layer > 0 else None
        self.wqkv = dense(3 * cfg.hidden_size, cfg.attention_bias, std_in, "wqkv")
        self.attn_out = dense(cfg.hidden_size, cfg.attention_bias, std_out, "attn_out")
        self.mlp_norm = norm("mlp_norm")
        self.wi = dense(2 * cfg.intermediate_size, cfg.mlp_bias, std_in, "wi")
        self.mlp_out = dense(cfg.hidden_size, cfg.mlp_bias, std_out, "mlp_out")
        self.act = _activation(cfg.activation)
        self.probs_dropout = dropout(cfg.attention_dropout, "attention_probs_dropout")
        self.attn_dropout = dropout(cfg.attention_dropout, "attention_output_dropout")
        self.mlp_dropout = dropout(cfg.hidden_dropout, "mlp_dropout")

    def build(self, input_shape) -> None:
        for layer in (self.attn_norm, self.wqkv, self.attn_out, self.mlp_norm, self.wi):
            if layer is not None:
                layer.build(input_shape)
        self.mlp_out.build((*input_shape[:-1], self.cfg.intermediate_size))

    def _attend(self, x, rope, attention_mask, segment_ids, training):
        """Attention context (batch, seq, hidden): global, or in the sliding window."""
        batch, seq = ops.shape(x)[0], ops.shape(x)[1]
        qkv = ops.reshape(self.wqkv(x), (batch, seq, 3, self.cfg.num_heads, self.head_dim))
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # (batch, seq, heads, head_dim)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        dropout = None
        if training and self.cfg.attention_dropout > 0:
            dropout = lambda probs: self.probs_dropout(probs, training=training)  # noqa: E731
        window = None if is_global(self.cfg, self.layer) else self.cfg.local_attention
        context = attend(q, k, v, attention_mask=attention_mask, segment_ids=segment_ids,
                         window=window, scale=self.head_dim**-0.5, mode=self.attention,
                         probs_dropout=dropout)
        return ops.reshape(context, (batch, seq, self.cfg.hidden_size))

    def call(self, x, rope, attention_mask, segment_ids=None, training=None):
        h = x if self.attn_norm is None else self.attn_norm(x)
        attended = self.attn_out(self._attend(h, rope, attention_mask, segment_ids, training))
        x = x + self.attn_dropout(attended, training=training)
        gate_in, gate = ops.split(self.wi(self.mlp_norm(x)), 2, axis=-1)
        return x + self.mlp_out(self.mlp_dropout(self.act(gate_in) * gate, training=training))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "layer": self.layer, "attention": self.attention}


class ModernBertHead(MaskedLMHead):
    """``norm(act(dense(x)))`` then the decoder tied to the token embeddings, plus
    ``decoder_bias`` when ``cfg.decoder_bias``."""

    @property
    def bias_name(self) -> str | None:
        return "decoder_bias" if self.cfg.decoder_bias else None

    def dense_and_norm(self) -> tuple[keras.layers.Dense, keras.layers.LayerNormalization]:
        cfg = self.cfg
        std_out = cfg.initializer_range / math.sqrt(2.0 * cfg.num_layers)
        dense = keras.layers.Dense(
            cfg.hidden_size, use_bias=cfg.classifier_bias, activation=_activation(cfg.activation),
            kernel_initializer=CutTruncatedNormal(std_out, cfg.initializer_cutoff_factor),
            name="dense", dtype=self.dtype_policy)
        norm = keras.layers.LayerNormalization(
            epsilon=cfg.layer_norm_eps, center=cfg.norm_bias, name="norm", dtype=self.dtype_policy)
        return dense, norm


class ModernBertBackbone(Backbone):
    """Token embeddings, LayerNorm, dropout, ``num_layers`` :class:`ModernBertBlock` s, final
    LayerNorm: the encoder's hidden states.

    Args:
        cfg: the model config (``architecture = "modernbert"``).
    """

    def __init__(self, cfg: ModelConfig | dict[str, Any], **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)  # attention, remat: see Backbone
        cfg = self.cfg
        common = dict(dtype=self.dtype_policy)
        self.tok_embeddings = keras.layers.Embedding(
            cfg.vocab_size, cfg.hidden_size, name="tok_embeddings", **common,
            embeddings_initializer=CutTruncatedNormal(cfg.initializer_range,
                                                      cfg.initializer_cutoff_factor))
        self.embedding_norm = keras.layers.LayerNormalization(
            epsilon=cfg.layer_norm_eps, center=cfg.norm_bias, name="embedding_norm", **common)
        self.embedding_dropout = keras.layers.Dropout(
            cfg.hidden_dropout, name="embedding_dropout", **common)
        self.blocks = [ModernBertBlock(cfg, i, attention=self.attention, name=f"layer_{i}",
                                       **common)
                       for i in range(cfg.num_layers)]
        self.final_norm = keras.layers.LayerNormalization(
            epsilon=cfg.layer_norm_eps, center=cfg.norm_bias, name="final_norm", **common)

    @property
    def token_embedding(self) -> keras.layers.Embedding:
        return self.tok_embeddings

    def build_layers(self) -> None:
        hidden = (None, None, self.cfg.hidden_size)
        self.tok_embeddings.build((None, None))
        for layer in (self.embedding_norm, self.final_norm, *self.blocks):
            layer.build(hidden)

    def _ropes(self, inputs):
        """``{is_global: (cos, sin)}`` for the layer kinds present."""
        positions = inputs.get("position_ids")
        if positions is None:
            positions = ops.arange(ops.shape(inputs["input_ids"])[1], dtype="int32")[None, :]
        head_dim = self.cfg.hidden_size // self.cfg.num_heads
        kinds = {is_global(self.cfg, i) for i in range(self.cfg.num_layers)}
        return {kind: rope_tables(positions, head_dim, self.cfg.global_rope_theta if kind
                                  else self.cfg.local_rope_theta) for kind in kinds}

    def encode(self, inputs, training=None):
        """The last hidden states after the final norm, (batch, seq, hidden), as Transformers'
        ``ModernBertModel`` gives them."""
        x = self.tok_embeddings(inputs["input_ids"])  # (batch, seq, hidden)
        x = self.embedding_dropout(self.embedding_norm(x), training=training)
        ropes = self._ropes(inputs)
        mask, segments = inputs["attention_mask"], inputs.get("segment_ids")
        for i, block in enumerate(self.blocks):
            x = self.run_block(block, x, ropes[is_global(self.cfg, i)], mask, segments,
                               training=training)
        return self.final_norm(x)


class ModernBertMaskedLM(MaskedLM):
    """ModernBERT backbone + MLM head (variable paths ``modernbert_mlm/tok_embeddings/...``,
    ``modernbert_mlm/layer_i/...``, ``modernbert_mlm/final_norm/...``, ``modernbert_mlm/head/...``).

    Args:
        cfg: the model config (``architecture = "modernbert"``), or its fields as a dict.
    """

    backbone_class = ModernBertBackbone
    head_class = ModernBertHead
    head_name = "head"
