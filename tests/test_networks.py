"""Both architectures have one shape: a ModelConfig in, ``backbone`` + ``lm_head`` out, variable
paths that checkpoints and the Transformers weight maps rely on, a config that round-trips."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from tpulm.evaluate.heads import freeze_lm_head
from tpulm.hf import convert
from tpulm.model.config import ModelConfig
from tpulm.model.networks import build_model
from tpulm.model.ops import gather_positions

SIZES = dict(vocab_size=40, hidden_size=16, num_layers=3, num_heads=2, intermediate_size=32,
             max_position_embeddings=40)
# A few paths per architecture, pinned: checkpoints on disk, tpulm.hf and the JAX layout rules
# key on them (a "backbone/" component must never appear).
PINNED = {
    "roberta": ("roberta_mlm/embeddings/word_embeddings/embeddings",
                "roberta_mlm/embeddings/layer_norm/gamma",
                "roberta_mlm/layer_2/attention_output/kernel",
                "roberta_mlm/layer_0/output_layer_norm/beta",
                "roberta_mlm/lm_head/bias", "roberta_mlm/lm_head/layer_norm/gamma"),
    "modernbert": ("modernbert_mlm/tok_embeddings/embeddings",
                   "modernbert_mlm/layer_1/attn_norm/gamma", "modernbert_mlm/layer_2/wqkv/kernel",
                   "modernbert_mlm/final_norm/gamma", "modernbert_mlm/head/decoder_bias",
                   "modernbert_mlm/head/dense/kernel"),
}
TABLE = {"roberta": "roberta_mlm/embeddings/word_embeddings/embeddings",
         "modernbert": "modernbert_mlm/tok_embeddings/embeddings"}


def _model(architecture: str):
    return build_model(ModelConfig(**SIZES, architecture=architecture), dtype="float32")


def _batch():
    rng = np.random.default_rng(0)
    ids = rng.integers(5, SIZES["vocab_size"], size=(2, 9)).astype(np.int32)
    mask = np.ones_like(ids)
    ids[1, 6:], mask[1, 6:] = 1, 0  # padding (pad_token_id 1)
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("architecture", ["roberta", "modernbert"])
def test_variable_paths_are_the_weight_map_and_pinned(architecture):
    model = _model(architecture)
    paths = [v.path for v in model.weights]
    assert len(set(paths)) == len(paths)
    assert set(PINNED[architecture]) <= set(paths)
    assert not [p for p in paths if "backbone" in p]
    assert paths[0] == TABLE[architecture]  # the backbone first, the head's variables last
    head = [v.path for v in model.lm_head.own_weights()]
    assert paths[-len(head):] == head
    rows = convert.MAPS[architecture].weight_map(model.cfg)
    assert {p.split("/", 1)[1] for p in paths} == {keras_path for keras_path, _, _ in rows}


@pytest.mark.parametrize("architecture", ["roberta", "modernbert"])
def test_backbone_and_head_by_attribute(architecture):
    model = _model(architecture)
    batch = _batch()
    states = model.backbone.encode(batch, training=False)
    assert tuple(states.shape) == (2, 9, SIZES["hidden_size"])
    positions = np.array([[0, 3], [5, 2]], dtype=np.int32)
    logits = model({**batch, "masked_positions": positions}, training=False)
    by_parts = model.lm_head(gather_positions(states, positions))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(logits),
                                  keras.ops.convert_to_numpy(by_parts))
    # The head's decoder is the backbone's word table, shared, not copied.
    assert model.lm_head.token_embedding is model.backbone.token_embedding
    assert model.backbone.token_embedding.embeddings.path == TABLE[architecture]

    freeze_lm_head(model)
    frozen = {v.path for v in model.weights if not v.trainable}
    assert frozen == {v.path for v in model.lm_head.own_weights()}
    assert frozen and all(f"/{model.lm_head.name}/" in path for path in frozen)
    assert TABLE[architecture] not in frozen  # the tied table still trains with the encoder


@pytest.mark.parametrize("architecture", ["roberta", "modernbert"])
def test_config_round_trips(architecture):
    model = _model(architecture)
    config = model.get_config()
    clone = type(model).from_config(config)
    clone.build()
    assert clone.cfg == model.cfg and clone.name == model.name
    assert [v.path for v in clone.weights] == [v.path for v in model.weights]
    clone.set_weights(model.get_weights())
    batch = _batch()
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(clone(batch, training=False)),
                                  keras.ops.convert_to_numpy(model(batch, training=False)))
    backbone = model.backbone
    again = type(backbone).from_config(backbone.get_config())
    assert again.cfg == model.cfg and len(again.blocks) == SIZES["num_layers"]
