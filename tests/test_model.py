"""The Keras RoBERTa MLM computes the same function as Transformers' RobertaForMaskedLM."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import keras  # noqa: E402
from support.models import (  # noqa: E402
    PAD_ID,
    hf_model,
    packed_batch,
    padded_batch,
    sentences,
    torch_logits,
    torch_state,
    train_reference_tokenizer,
    wikitext_lines,
)

from tpulm import config  # noqa: E402
from tpulm.errors import TpulmError  # noqa: E402
from tpulm.hf import convert
from tpulm.model import weights  # noqa: E402
from tpulm.model.config import ModelConfig, load_model_preset  # noqa: E402
from tpulm.model.networks import build_model  # noqa: E402

TOL = 1e-5


@pytest.fixture(scope="module")
def tokenizer(wikitext_dir, tmp_path_factory):
    from tokenizers import Tokenizer

    folder = train_reference_tokenizer(
        wikitext_lines(wikitext_dir), tmp_path_factory.mktemp("tok"))
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


@pytest.fixture(scope="module")
def cfg(tokenizer):
    table = load_model_preset("tiny")
    return config.resolve(ModelConfig, table=table, vocab_size=tokenizer.get_vocab_size(),
                          pad_token_id=PAD_ID)


@pytest.fixture(scope="module")
def pair(cfg):
    """(torch model, keras model) holding the same random weights."""
    torch_model = hf_model(cfg)
    model = build_model(cfg)
    convert.from_hf_state_dict(model, cfg, torch_state(torch_model))
    return torch_model, model


@pytest.fixture(scope="module")
def texts(wikitext_dir):
    # Sentences from lines the tokenizer saw last, in their text order.
    return sentences(wikitext_lines(wikitext_dir, 1500)[-40:], 60)


def _keras_logits(model, batch, **extra):
    return keras.ops.convert_to_numpy(model({**batch, **extra}, training=False))


def test_padded_batch_matches_transformers(pair, tokenizer, texts):
    torch_model, model = pair
    batch = padded_batch(tokenizer, texts[:6], max_len=48)
    assert (batch["attention_mask"] == 0).any(), "the batch must contain padding"
    ref, got = torch_logits(torch_model, batch), _keras_logits(model, batch)
    real = batch["attention_mask"].astype(bool)
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_allclose(got[real], ref[real], atol=TOL, rtol=0)


def test_packed_block_with_sep_inside_matches_transformers(pair, tokenizer, texts):
    torch_model, model = pair
    batch = packed_batch(tokenizer, texts, rows=3, length=128)
    inner = batch["input_ids"][:, 1:-1]
    assert (inner == tokenizer.token_to_id("[SEP]")).any(), "need [SEP] inside a block"
    np.testing.assert_allclose(
        _keras_logits(model, batch), torch_logits(torch_model, batch), atol=TOL, rtol=0)


def test_gathered_positions_equal_full_logits(pair, tokenizer, texts):
    _, model = pair
    batch = padded_batch(tokenizer, texts[6:10], max_len=40)
    positions = np.array([[1, 2, 5], [0, 3, 3], [4, 1, 2], [2, 7, 1]], dtype=np.int32)
    full = _keras_logits(model, batch)
    got = _keras_logits(model, batch, masked_positions=positions)
    assert got.shape == (4, 3, full.shape[-1])
    np.testing.assert_allclose(got, np.take_along_axis(full, positions[..., None], 1),
                               atol=1e-6, rtol=0)
    # Offsets past a row's end name the next rows' tokens (rows sharing masking slots).
    seq = full.shape[1]
    shared = np.array([[seq + 2, 2 * seq + 1, 3 * seq + 5], [-seq + 4, 6, 0],
                       [1, seq + 3, -2 * seq], [-3 * seq + 7, -1, 2]], dtype=np.int32)
    flat = (np.arange(4)[:, None] * seq + shared).ravel()
    np.testing.assert_allclose(_keras_logits(model, batch, masked_positions=shared).reshape(12, -1),
                               full.reshape(4 * seq, -1)[flat], atol=1e-6, rtol=0)


def test_jax_backend_gives_same_logits(pair, tokenizer, texts, tmp_path):
    torch_model, model = pair
    batch = padded_batch(tokenizer, texts[10:14], max_len=40)
    weights.save(model.weights, str(tmp_path / "w.safetensors"))
    np.savez(tmp_path / "batch.npz", **batch)
    cfg = model.cfg
    script = f"""
import numpy as np, keras
from tpulm.model import weights
from tpulm.model.config import ModelConfig
from tpulm.model.networks import build_model
assert keras.backend.backend() == "jax"
model = build_model(ModelConfig(**{dict(vars(cfg))!r}))
weights.load(model.weights, {str(tmp_path / "w.safetensors")!r})
batch = dict(np.load({str(tmp_path / "batch.npz")!r}))
np.save({str(tmp_path / "jax.npy")!r}, np.asarray(model(batch, training=False)))
"""
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=300)
    got = np.load(tmp_path / "jax.npy")
    real = batch["attention_mask"].astype(bool)
    np.testing.assert_allclose(got[real], _keras_logits(model, batch)[real], atol=TOL, rtol=0)
    np.testing.assert_allclose(got[real], torch_logits(torch_model, batch)[real], atol=TOL, rtol=0)


def test_explicit_attention_path_equals_fused(cfg, tokenizer, texts):
    """The training-time softmax path (taken when attention dropout is on) is the same function."""
    model = build_model(cfg)
    batch = padded_batch(tokenizer, texts[:3], max_len=32)
    for block in model.backbone.blocks:  # keep the explicit path, switch its dropout off
        block.attention_probs_dropout.rate = 0.0
        block.attention_output_dropout.rate = 0.0
        block.output_dropout.rate = 0.0
    model.backbone.embeddings.dropout_layer.rate = 0.0
    real = batch["attention_mask"].astype(bool)
    train = keras.ops.convert_to_numpy(model(batch, training=True))
    np.testing.assert_allclose(train[real], _keras_logits(model, batch)[real], atol=1e-6, rtol=0)


def test_dropout_only_in_training(pair, tokenizer, texts):
    _, model = pair
    batch = padded_batch(tokenizer, texts[:2], max_len=32)
    a, b = _keras_logits(model, batch), _keras_logits(model, batch)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(keras.ops.convert_to_numpy(model(batch, training=True)), a, atol=1e-3)


def test_mixed_bfloat16_computes_in_bf16_with_float32_logits(cfg, pair, tokenizer, texts):
    _, reference = pair
    batch = padded_batch(tokenizer, texts[:3], max_len=32)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = build_model(cfg)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert {v.dtype for v in model.weights} == {"float32"}
    assert model.backbone.blocks[0].query.compute_dtype == "bfloat16"
    model.set_weights(reference.get_weights())
    got = _keras_logits(model, batch)
    assert got.dtype == np.float32
    real = batch["attention_mask"].astype(bool)
    ref = _keras_logits(reference, batch)
    np.testing.assert_allclose(got[real], ref[real], atol=0.1, rtol=0)
    assert np.mean(np.argmax(got[real], -1) == np.argmax(ref[real], -1)) > 0.8


def test_parameter_count_equals_transformers_roberta_base():
    from transformers import RobertaConfig, RobertaForMaskedLM

    cfg = ModelConfig(vocab_size=50265, **load_model_preset("base"))
    torch_model = RobertaForMaskedLM(RobertaConfig(**convert.hf_model_kwargs(cfg)))
    hf_count = sum(p.numel() for p in torch_model.parameters())  # tied tensors counted once
    del torch_model
    assert hf_count == 124_697_433
    assert build_model(cfg).count_params() == hf_count


@pytest.mark.parametrize("name", ["tiny", "small", "base", "large"])
def test_presets_build_valid_configs(name):
    table = load_model_preset(name)
    assert "vocab_size" not in table and "pad_token_id" not in table
    cfg = config.resolve(ModelConfig, table=table, vocab_size=1000)
    assert cfg.max_positions >= 128


def test_preset_errors():
    with pytest.raises(TpulmError, match="neither"):
        load_model_preset("huge")
    with pytest.raises(TpulmError, match="not divisible"):
        config.resolve(ModelConfig, table={"hidden_size": 30, "num_heads": 4}, vocab_size=10)
    with pytest.raises(TpulmError, match="pad_token_id"):
        ModelConfig(vocab_size=4, pad_token_id=7)


def test_xla_compiled_model_matches_eager(pair, tokenizer, texts):
    """Training compiles the model with XLA (jit_compile): same logits, gathered path too."""
    tf = pytest.importorskip("tensorflow")
    _, model = pair
    batch = padded_batch(tokenizer, texts[:4], max_len=64)
    batch["masked_positions"] = np.array([[1, 4], [2, 3], [0, 5], [6, 1]], dtype=np.int32)
    compiled = tf.function(lambda b: model(b, training=False), jit_compile=True)
    np.testing.assert_allclose(compiled(batch).numpy(), _keras_logits(model, batch),
                               atol=1e-6, rtol=0)
    train = tf.function(lambda b: model(b, training=True), jit_compile=True)
    assert train(batch).shape == (4, 2, model.cfg.vocab_size)
