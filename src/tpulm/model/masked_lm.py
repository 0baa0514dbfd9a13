"""The masked-LM network every architecture shares: a backbone (the encoder) and a tied head.

The split follows keras-hub: a :class:`Backbone` turns the input dict into hidden states
(``encode(inputs, training)``), and one task, :class:`MaskedLM`, runs it, gathers the masked
positions and applies the architecture's :class:`MaskedLMHead` (a decoder tied to the backbone's
word table). Callers reach the parts by attribute, the same for every architecture:
``model.backbone.encode(...)``, ``model.lm_head``, ``model.cfg``. An architecture
(:mod:`tpulm.model.roberta`, :mod:`tpulm.model.modernbert`) supplies a backbone, a head, and a
:class:`MaskedLM` subclass naming them; every layer takes the :class:`ModelConfig`
(:class:`ConfigLayer`).

Model inputs are a dict::

    input_ids        (batch, seq) int32
    attention_mask   (batch, seq) int, 1 = real token
    masked_positions (batch, P) int32, optional: the LM head then runs on these positions only
                     (offsets into the flattened batch: see ``tpulm.model.ops.gather_positions``)
    segment_ids      (batch, seq) int32, optional: document of each token in a packed block (0 =
                     padding); a token then attends to its own document only
    position_ids     (batch, seq) int32, optional: position inside the document, from 0

and the output is float32 logits, (batch, P, vocab) or (batch, seq, vocab).

Two settings change how the network computes, never what (both are constructor arguments of
the task, passed down to the backbone; neither is part of the :class:`ModelConfig`, so saved
configs and variable paths do not depend on them):

* ``attention``: ``"auto"`` (the cheapest exact path for the backend and platform: blocked
  sliding windows, splash on TPU, cuDNN on GPU) or ``"dense"`` (the masked reference); see
  :func:`tpulm.model.attention.attend`;
* ``remat``: ``"none"``, ``"block"`` (each transformer block recomputed from its input in the
  backward pass: only block inputs are kept) or ``"full"`` (the masked-LM head as well: its
  (batch, P, hidden) intermediates are not kept either); see :func:`remat_call`.

Variable paths are ``<model name>/<layer>/...`` (``roberta_mlm/layer_0/query/kernel``,
``roberta_mlm/lm_head/bias``), without a ``backbone/`` component: checkpoints, the
:mod:`tpulm.hf` weight maps and the JAX layout rules key on them (see :meth:`MaskedLM.build`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import keras
from keras import ops

from tpulm.errors import TpulmError
from tpulm.model.config import ATTENTION_MODES, REMAT_MODES, ModelConfig
from tpulm.model.ops import gather_positions


def check_compute_settings(attention: str, remat: str) -> None:
    """Raise :class:`TpulmError` naming the setting when ``attention`` or ``remat`` is unknown."""
    if attention not in ATTENTION_MODES:
        raise TpulmError(f"attention {attention!r} is not one of {', '.join(ATTENTION_MODES)} "
                         "(--attention): use auto or dense")
    if remat not in REMAT_MODES:
        raise TpulmError(f"remat {remat!r} is not one of {', '.join(REMAT_MODES)} (--remat)")


def check_remat_dropout(cfg: ModelConfig, remat: str) -> None:
    """Refuse remat with dropout on TensorFlow: ``tf.recompute_grad`` reruns the block, and
    Keras' dropout draws its seed from a stateful generator, so the recomputed block would drop
    other units than the forward pass did (wrong gradients). ``jax.checkpoint`` replays the
    traced computation, seeds included, so JAX is exact."""
    dropout = cfg.hidden_dropout > 0 or cfg.attention_dropout > 0
    if remat != "none" and dropout and keras.backend.backend() == "tensorflow":
        raise TpulmError(f"remat {remat!r} with dropout (hidden_dropout {cfg.hidden_dropout}, "
                         f"attention_dropout {cfg.attention_dropout}) is exact on JAX only: "
                         "use --backend jax, --remat none, or dropout 0")


def remat_call(fn, x, enabled: bool):
    """``fn(x)``, recomputed in the backward pass instead of keeping its activations when
    ``enabled`` (``keras.remat``: ``jax.checkpoint`` on JAX, ``tf.recompute_grad`` on TF).

    Only ``x`` is an argument of the recomputed function: everything else ``fn`` needs (masks,
    RoPE tables, the training flag) is closed over, since no gradient flows into it.
    """
    return keras.remat(fn)(x) if enabled else fn(x)


def as_model_config(cfg: ModelConfig | dict[str, Any]) -> ModelConfig:
    """``cfg``, or the config of its fields (a dict, as ``get_config`` saves it)."""
    return cfg if isinstance(cfg, ModelConfig) else ModelConfig(**cfg)


class ConfigLayer(keras.layers.Layer):
    """A layer whose one setting is the model config; ``get_config``/``from_config`` round-trip.

    Args:
        cfg: the model config, or its fields as a dict (as ``get_config`` saves it).
    """

    def __init__(self, cfg: ModelConfig | dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cfg = as_model_config(cfg)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "cfg": dataclasses.asdict(self.cfg)}


class Backbone(ConfigLayer):
    """An encoder: ``encode(inputs, training)`` -> hidden states (batch, seq, hidden).

    Subclasses create their sublayers in ``__init__``, build them in :meth:`build_layers`, name
    the word-table layer ``token_embedding`` (the head's decoder is tied to it) and define
    ``encode`` on the input dict of the module docstring, running each block through
    :meth:`run_block`.

    Args:
        cfg: the model config, or its fields as a dict.
        attention: ``"auto"`` or ``"dense"`` (see the module docstring).
        remat: ``"none"``, ``"block"`` or ``"full"`` (see the module docstring).
    """

    def __init__(self, cfg: ModelConfig | dict[str, Any], attention: str = "auto",
                 remat: str = "none", **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        check_compute_settings(attention, remat)
        check_remat_dropout(self.cfg, remat)
        self.attention = attention
        self.remat = remat

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "attention": self.attention, "remat": self.remat}

    def run_block(self, block, x, *args, training=None):
        """``block(x, *args, training=training)``, rematerialized unless ``remat`` is none."""
        return remat_call(lambda h: block(h, *args, training=training), x, self.remat != "none")

    def run_layer(self, fn, x):
        """``fn(x)`` for a layer after the blocks (the head): rematerialized under ``"full"``."""
        return remat_call(fn, x, self.remat == "full")

    def build(self, input_shape=None) -> None:
        self.build_layers()

    def build_layers(self) -> None:
        """Create the sublayers' variables in the caller's name scope (:meth:`MaskedLM.build`)."""
        raise NotImplementedError(f"{type(self).__name__} must define build_layers")


class MaskedLMHead(ConfigLayer):
    """``norm(dense(x))``, then the decoder tied to the word table, plus an optional bias.

    Subclasses define :meth:`dense_and_norm` (layers named as the weight maps expect) and
    ``bias_name``, the decoder bias variable's name (None: no decoder bias).

    Args:
        cfg: the model config.
        token_embedding: the ``keras.layers.Embedding`` whose table is the decoder (tied weights;
            its variable lives in the embedding layer only).
    """

    bias_name: str | None = "bias"

    def __init__(self, cfg: ModelConfig | dict[str, Any], token_embedding: keras.layers.Embedding,
                 **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        self.token_embedding = token_embedding
        self.dense, self.norm = self.dense_and_norm()

    def dense_and_norm(self) -> tuple[keras.layers.Dense, keras.layers.LayerNormalization]:
        """The head's transform before the decoder: ``(dense with activation, LayerNorm)``."""
        raise NotImplementedError(f"{type(self).__name__} must define dense_and_norm")

    def build(self, input_shape) -> None:
        self.dense.build(input_shape)
        self.norm.build(input_shape)
        self.bias = (self.add_weight(shape=(self.cfg.vocab_size,), initializer="zeros",
                                     name=self.bias_name) if self.bias_name else None)

    def call(self, x):
        x = self.norm(self.dense(x))
        table = ops.cast(self.token_embedding.embeddings, x.dtype)  # (vocab, hidden)
        logits = ops.matmul(x, ops.transpose(table))
        if self.bias is not None:
            logits = logits + ops.cast(self.bias, x.dtype)
        return ops.cast(logits, "float32")

    def own_weights(self) -> list:
        """The head's variables without the tied word table (which belongs to the backbone)."""
        tied = {id(v) for v in self.token_embedding.weights}
        return [v for v in self.weights if id(v) not in tied]


class MaskedLM(keras.Model):
    """A backbone plus a masked-LM head; see the module docstring for inputs and outputs.

    Subclasses name their parts: ``backbone_class``, ``head_class`` and ``head_name`` (the head's
    layer name, part of its variable paths).

    Args:
        cfg: the model config, or its fields as a dict (as ``get_config`` saves it).
        attention: ``"auto"`` or ``"dense"``: how attention is computed (module docstring).
        remat: ``"none"``, ``"block"`` or ``"full"``: what the backward pass recomputes.
    """

    backbone_class: ClassVar[type[Backbone]]
    head_class: ClassVar[type[MaskedLMHead]]
    head_name: ClassVar[str]

    def __init__(self, cfg: ModelConfig | dict[str, Any], attention: str = "auto",
                 remat: str = "none", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cfg = as_model_config(cfg)
        self.attention, self.remat = attention, remat
        self.backbone = self.backbone_class(self.cfg, attention=attention, remat=remat,
                                            name="backbone", dtype=self.dtype_policy)
        self.lm_head = self.head_class(self.cfg, self.backbone.token_embedding,
                                       name=self.head_name, dtype=self.dtype_policy)

    def build(self, input_shape=None) -> None:
        # The backbone's layers are built here, in this model's name scope, not by
        # ``backbone.build()``: a layer's own build would add ``backbone/`` to every variable path.
        self.backbone.build_layers()
        self.backbone.built = True
        self.lm_head.build((None, None, self.cfg.hidden_size))

    def call(self, inputs, training=None):
        x = self.backbone.encode(inputs, training=training)
        positions = inputs.get("masked_positions")
        if positions is not None:  # the head then runs on (batch, P, hidden) only
            x = gather_positions(x, positions)
        return self.backbone.run_layer(self.lm_head, x)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "cfg": dataclasses.asdict(self.cfg),
                "attention": self.attention, "remat": self.remat}
