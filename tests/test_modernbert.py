"""The Keras ModernBERT MLM computes the same function as Transformers' ModernBertForMaskedLM,
its weights and config travel both ways, and its document-aware inputs isolate packed documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import keras  # noqa: E402

from tpulm import config  # noqa: E402
from tpulm.data.tokenizer import SpecialTokens  # noqa: E402
from tpulm.errors import TpulmError  # noqa: E402
from tpulm.hf import convert, export, folder, importer  # noqa: E402
from tpulm.hf import modernbert as hf_modernbert  # noqa: E402
from tpulm.model import config as model_config  # noqa: E402
from tpulm.model import weights  # noqa: E402
from tpulm.model.config import ModelConfig, load_model_preset  # noqa: E402
from tpulm.model.networks import build_model  # noqa: E402

TOL = 1e-4
PAD = 3
VOCAB = 300
# Blocks 0 and 2 attend globally, block 1 in a window of 8 (4 each side); sequences are 32 long.
TINY = dict(vocab_size=VOCAB, pad_token_id=PAD, architecture="modernbert", hidden_size=64,
            num_layers=3, num_heads=4, intermediate_size=96, max_position_embeddings=128,
            local_attention=8, global_attn_every_n_layers=2, hidden_dropout=0.0,
            attention_dropout=0.0)
ALL_BIASES = dict(norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True,
                  activation="gelu_pytorch_tanh", global_rope_theta=500.0, local_rope_theta=50.0)


def torch_model(cfg: ModelConfig, seed: int = 0):
    """A ``ModernBertForMaskedLM`` (eager attention) with random values in every parameter."""
    import torch
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    torch.manual_seed(seed)
    hf_cfg = ModernBertConfig(**hf_modernbert.hf_model_kwargs(cfg))
    hf_cfg._attn_implementation = "eager"
    model = ModernBertForMaskedLM(hf_cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # norm gains near 1, the rest near 0
            base = 1.0 if name.endswith("norm.weight") else 0.0
            param.copy_(base + 0.05 * torch.randn(param.shape, generator=gen))
    return model.eval()


def torch_logits(model, batch: dict[str, np.ndarray]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(input_ids=torch.from_numpy(batch["input_ids"].astype(np.int64)),
                     attention_mask=torch.from_numpy(batch["attention_mask"].astype(np.int64))
                     ).logits.numpy()


def state_of(model) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def keras_logits(model, batch: dict[str, np.ndarray], **extra) -> np.ndarray:
    return keras.ops.convert_to_numpy(model({**batch, **extra}, training=False))


def padded_batch(seed: int = 0, lengths=(32, 20, 5, 13)) -> dict[str, np.ndarray]:
    """Random ids (no pad id inside), right-padded rows of the given lengths."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(PAD + 1, VOCAB, (len(lengths), max(lengths))).astype(np.int32)
    mask = (np.arange(ids.shape[1])[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
    return {"input_ids": np.where(mask == 1, ids, PAD).astype(np.int32), "attention_mask": mask}


def make_pair(**settings):
    """(config, torch model, keras model) with the same random weights."""
    cfg = ModelConfig(**TINY, **settings)
    reference = torch_model(cfg)
    model = build_model(cfg, dtype="float32")
    convert.from_hf_state_dict(model, cfg, state_of(reference))
    return cfg, reference, model


@pytest.fixture(scope="module", params=["defaults", "all_biases"])
def pair(request):
    return make_pair(**(ALL_BIASES if request.param == "all_biases" else {}))


def test_padded_batch_longer_than_window_matches_transformers(pair):
    cfg, reference, model = pair
    batch = padded_batch()
    ref, got = torch_logits(reference, batch), keras_logits(model, batch)
    real = batch["attention_mask"].astype(bool)
    assert got.dtype == np.float32 and got.shape == ref.shape == (4, 32, VOCAB)
    np.testing.assert_allclose(got[real], ref[real], atol=TOL, rtol=0)
    # The window matters here: the same weights attending globally everywhere differ.
    wide = build_model(ModelConfig(**{**vars(cfg), "local_attention": 1000}), dtype="float32")
    wide.set_weights(model.get_weights())
    assert np.abs(keras_logits(wide, batch)[real] - ref[real]).max() > 100 * TOL


def test_gathered_positions_equal_full_logits(pair):
    _, _, model = pair
    batch = padded_batch(1)
    positions = np.array([[1, 31, 5], [0, 3, 3], [4, 1, 2], [12, 7, 1]], dtype=np.int32)
    full = keras_logits(model, batch)
    got = keras_logits(model, batch, masked_positions=positions)
    assert got.shape == (4, 3, VOCAB)
    np.testing.assert_allclose(got, np.take_along_axis(full, positions[..., None], 1),
                               atol=1e-5, rtol=0)


def _packed(docs: list[np.ndarray], length: int) -> dict[str, np.ndarray]:
    """One block holding ``docs`` back to back, padded to ``length``, with document inputs."""
    ids = np.full((1, length), PAD, np.int32)
    segments, positions = np.zeros_like(ids), np.zeros_like(ids)
    start = 0
    for index, doc in enumerate(docs, 1):
        end = start + len(doc)
        ids[0, start:end], segments[0, start:end] = doc, index
        positions[0, start:end] = np.arange(len(doc))
        start = end
    return {"input_ids": ids, "attention_mask": (segments > 0).astype(np.int32),
            "segment_ids": segments, "position_ids": positions}


def test_packed_documents_equal_each_document_alone(pair):
    _, _, model = pair
    rng = np.random.default_rng(2)
    docs = [rng.integers(PAD + 1, VOCAB, n).astype(np.int32) for n in (17, 11)]
    block = _packed(docs, 32)  # 17 + 11 tokens, then 4 padding
    got = keras_logits(model, block)[0]
    start = 0
    for doc in docs:
        ones = np.ones((1, len(doc)), np.int32)
        alone = keras_logits(model, {"input_ids": doc[None], "attention_mask": ones})
        np.testing.assert_allclose(got[start:start + len(doc)], alone[0], atol=TOL, rtol=0)
        start += len(doc)
    # Without the document inputs the second document sees the first one and is shifted.
    plain = keras_logits(model, {k: block[k] for k in ("input_ids", "attention_mask")})[0]
    assert np.abs(plain[17:28] - got[17:28]).max() > 100 * TOL


def test_document_inputs_default_to_plain_positions(pair):
    _, _, model = pair
    batch = padded_batch(3)
    seq = batch["input_ids"].shape[1]
    extra = {"segment_ids": batch["attention_mask"].copy(),  # one document per row
             "position_ids": np.broadcast_to(np.arange(seq, dtype=np.int32), (4, seq)).copy()}
    real = batch["attention_mask"].astype(bool)
    np.testing.assert_allclose(keras_logits(model, batch, **extra)[real],
                               keras_logits(model, batch)[real], atol=1e-5, rtol=0)
    shifted = {**extra, "position_ids": extra["position_ids"] + 3}
    # RoPE is relative: shifting every position leaves the logits, up to float error.
    np.testing.assert_allclose(keras_logits(model, batch, **shifted)[real],
                               keras_logits(model, batch)[real], atol=TOL, rtol=0)


def test_export_round_trip_through_transformers_is_bit_exact(tmp_path):
    from transformers import ModernBertForMaskedLM

    cfg = ModelConfig(**TINY, decoder_bias=True, norm_bias=True)
    model = build_model(cfg, dtype="float32")
    rng = np.random.default_rng(4)
    for variable in model.weights:  # LayerNorm gains/biases and the decoder bias nonzero too
        variable.assign(rng.normal(0, 0.05, variable.shape).astype("float32")
                        + (1.0 if variable.path.endswith("gamma") else 0.0))
    state = convert.keras_to_hf(weights.to_arrays(model.weights), cfg, "the model")
    special = SpecialTokens(cls_id=0, sep_id=1, unk_id=2, pad_id=PAD, mask_id=4)
    folder.save_safetensors(str(tmp_path), folder.WEIGHTS_FILE, state)
    hf_cfg = convert.hf_config(cfg, special)
    (tmp_path / folder.CONFIG_FILE).write_text(json.dumps(hf_cfg))
    loaded, info = ModernBertForMaskedLM.from_pretrained(
        str(tmp_path), output_loading_info=True, attn_implementation="eager")
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    assert loaded.config.layer_types == ["full_attention", "sliding_attention", "full_attention"]
    assert loaded.config.mask_token_id == 4 and loaded.config.sliding_window == 4
    back = convert.hf_to_keras(state_of(loaded.eval()), cfg, "loaded")
    for variable in model.weights:
        np.testing.assert_array_equal(back[variable.path], keras.ops.convert_to_numpy(variable))
    batch = padded_batch(5)
    real = batch["attention_mask"].astype(bool)
    np.testing.assert_allclose(keras_logits(model, batch)[real],
                               torch_logits(loaded.eval(), batch)[real], atol=TOL, rtol=0)
    # Both config spellings read back: ours (old keys) and Transformers 5's own save.
    assert convert.model_config_from_hf(hf_cfg, "ours") == cfg
    loaded.save_pretrained(str(tmp_path / "resaved"))
    saved = json.loads((tmp_path / "resaved" / folder.CONFIG_FILE).read_text())
    assert "layer_types" in saved and convert.model_config_from_hf(saved, "resaved") == cfg


def test_state_dict_errors_name_the_problem():
    cfg = ModelConfig(**TINY)
    state = state_of(torch_model(cfg))
    with pytest.raises(TpulmError, match="missing tensors.*model.final_norm.weight"):
        convert.hf_to_keras({k: v for k, v in state.items() if k != "model.final_norm.weight"}, cfg)
    untied = {**state, "decoder.weight": state["decoder.weight"] + 1.0}
    with pytest.raises(TpulmError, match="differs"):
        convert.hf_to_keras(untied, cfg)
    with pytest.raises(TpulmError, match="layer_types"):
        convert.model_config_from_hf({**convert.hf_config(cfg, SpecialTokens(0, 1, 2, PAD, 4)),
                                 "layer_types": ["sliding_attention"] * 3}, "x.json")


@pytest.mark.parametrize("sizes, expected", [
    (dict(hidden_size=768, num_layers=22, num_heads=12, intermediate_size=1152), 149_655_232),
    (dict(hidden_size=1024, num_layers=28, num_heads=16, intermediate_size=2624), 395_881_664),
])
def test_released_sizes_have_transformers_parameter_count(sizes, expected):
    """Base and large (vocab 50368) on torch's meta device: same tensors, shapes and count."""
    import torch
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    cfg = ModelConfig(vocab_size=50368, pad_token_id=50283, architecture="modernbert", **sizes)
    with torch.device("meta"):
        reference = ModernBertForMaskedLM(ModernBertConfig(**hf_modernbert.hf_model_kwargs(cfg)))
    shapes = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    assert shapes.pop("decoder.weight") == shapes["model.embeddings.tok_embeddings.weight"]
    assert shapes == hf_modernbert.hf_shapes(cfg)
    assert sum(p.numel() for p in reference.parameters()) == expected
    assert convert.parameter_count(cfg) == expected


@pytest.mark.parametrize("name", ["modernbert-tiny", "modernbert-small", "modernbert-base",
                                  "modernbert-large"])
def test_presets(name):
    table = load_model_preset(name)
    assert "vocab_size" not in table and table["architecture"] == "modernbert"
    cfg = config.resolve(ModelConfig, table=table, vocab_size=512, pad_token_id=PAD)
    assert cfg.max_positions == cfg.max_position_embeddings >= 512
    if name == "modernbert-base":
        assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.intermediate_size,
                cfg.local_attention, cfg.global_attn_every_n_layers) == (22, 768, 12, 1152, 128, 3)


def test_tiny_preset_counts_like_transformers():
    cfg = config.resolve(ModelConfig, table=load_model_preset("modernbert-tiny"),
                         vocab_size=VOCAB, pad_token_id=PAD)
    reference = torch_model(cfg)
    count = sum(p.numel() for p in reference.parameters())
    assert build_model(cfg).count_params() == count == convert.parameter_count(cfg)


def test_config_errors():
    with pytest.raises(TpulmError, match="architecture"):
        config.resolve(ModelConfig, table={"architecture": "gpt"}, vocab_size=10)
    with pytest.raises(TpulmError, match="even head size"):
        ModelConfig(**{**TINY, "hidden_size": 60, "num_heads": 4})
    with pytest.raises(TpulmError, match="activation"):
        ModelConfig(**{**TINY, "activation": "relu"})
    assert ModelConfig(vocab_size=10).architecture == "roberta"  # RoBERTa configs unchanged


def test_training_step_has_finite_gradients_with_dropout():
    """The explicit-softmax path (attention dropout on) trains; dropout only in training."""
    import tensorflow as tf

    cfg = ModelConfig(**{**TINY, "hidden_dropout": 0.1, "attention_dropout": 0.1})
    model = build_model(cfg, dtype="float32")
    batch = padded_batch(6)
    batch["masked_positions"] = np.array([[1, 2], [3, 4], [0, 4], [5, 6]], np.int32)
    labels = tf.constant(np.arange(8).reshape(4, 2) + PAD + 1)
    with tf.GradientTape() as tape:
        logits = model(batch, training=True)
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
            labels, logits, from_logits=True))
    grads = tape.gradient(loss, model.trainable_variables)
    assert all(g is not None and np.isfinite(g.numpy()).all() for g in grads)
    assert not np.allclose(logits.numpy(), keras_logits(model, batch), atol=1e-4)
    np.testing.assert_array_equal(keras_logits(model, batch), keras_logits(model, batch))


def test_jax_backend_gives_same_logits(tmp_path):
    cfg, reference, model = make_pair(**ALL_BIASES)
    batch = padded_batch(7)
    weights.save(model.weights, str(tmp_path / "w.safetensors"))
    docs = _packed([np.arange(5, 25, dtype=np.int32), np.arange(30, 42, dtype=np.int32)], 36)
    np.savez(tmp_path / "batch.npz", **batch)
    np.savez(tmp_path / "docs.npz", **docs)
    script = f"""
import numpy as np, keras
from tpulm.model import weights
from tpulm.model.config import ModelConfig
from tpulm.model.networks import build_model
assert keras.backend.backend() == "jax"
model = build_model(ModelConfig(**{dict(vars(cfg))!r}), dtype="float32")
weights.load(model.weights, {str(tmp_path / "w.safetensors")!r})
for name in ("batch", "docs"):
    inputs = dict(np.load({str(tmp_path)!r} + f"/{{name}}.npz"))
    np.save({str(tmp_path)!r} + f"/{{name}}_jax.npy", np.asarray(model(inputs, training=False)))
"""
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=300)
    real = batch["attention_mask"].astype(bool)
    got = np.load(tmp_path / "batch_jax.npy")
    np.testing.assert_allclose(got[real], torch_logits(reference, batch)[real], atol=TOL, rtol=0)
    in_doc = docs["segment_ids"] > 0
    np.testing.assert_allclose(np.load(tmp_path / "docs_jax.npy")[in_doc],
                               keras_logits(model, docs)[in_doc], atol=TOL, rtol=0)


def test_xla_and_mixed_bfloat16():
    """Training compiles with XLA (same logits); mixed_bfloat16 keeps float32 weights and logits."""
    tf = pytest.importorskip("tensorflow")
    cfg, _, model = make_pair(**ALL_BIASES)
    batch = {**padded_batch(8), "masked_positions": np.array([[1, 4], [2, 3], [0, 5], [6, 1]],
                                                             np.int32)}
    compiled = tf.function(lambda b: model(b, training=False), jit_compile=True)
    np.testing.assert_allclose(compiled(batch).numpy(), keras_logits(model, batch),
                               atol=1e-5, rtol=0)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        half = build_model(cfg)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert {v.dtype for v in half.weights} == {"float32"}
    assert half.backbone.blocks[1].wqkv.compute_dtype == "bfloat16"
    half.set_weights(model.get_weights())
    got, ref = keras_logits(half, batch), keras_logits(model, batch)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref, atol=0.1, rtol=0)


def test_initialisation_follows_transformers_init_weights():
    """Truncated normals cut at +-cutoff x std: "in" std for embeddings/Wqkv/Wi, "out" std
    (range / sqrt(2 layers)) for both Wo and the head dense; LayerNorm gains 1, biases 0."""
    cfg = ModelConfig(**{**TINY, "hidden_size": 128, "intermediate_size": 256,
                         "initializer_cutoff_factor": 1.5}, norm_bias=True, mlp_bias=True)
    model = build_model(cfg, dtype="float32")
    std_in, std_out = 0.02, 0.02 / np.sqrt(2 * cfg.num_layers)
    # Variance of a standard normal cut at +-1.5: 1 - 2 c phi(c) / (2 Phi(c) - 1).
    shrink = np.sqrt(1 - 2 * 1.5 * 0.1295176 / (2 * 0.9331928 - 1))
    values = {v.path.split("/", 1)[1]: keras.ops.convert_to_numpy(v) for v in model.weights}
    for path, std in (("tok_embeddings/embeddings", std_in), ("layer_1/wqkv/kernel", std_in),
                      ("layer_1/wi/kernel", std_in), ("layer_1/attn_out/kernel", std_out),
                      ("layer_2/mlp_out/kernel", std_out), ("head/dense/kernel", std_out)):
        assert np.abs(values[path]).max() <= 1.5 * std + 1e-9, path
        assert abs(values[path].std() / (std * shrink) - 1) < 0.08, path
    np.testing.assert_array_equal(values["layer_1/mlp_norm/gamma"], 1.0)
    for path in ("layer_1/mlp_norm/beta", "layer_1/wi/bias", "head/decoder_bias"):
        np.testing.assert_array_equal(values[path], 0.0)


def test_run_dir_export_and_import_dispatch_on_architecture(wikitext_dir, tmp_path):
    """`tpulm export` / `tpulm import` code paths carry a ModernBERT run dir both ways."""
    from support.models import (
        make_run_dir,
        train_reference_tokenizer,
        wikitext_lines,
    )
    from transformers import AutoModelForMaskedLM

    tok_dir = train_reference_tokenizer(wikitext_lines(wikitext_dir, 300), tmp_path / "tok", 300)
    table = {k: v for k, v in TINY.items() if k not in ("vocab_size", "pad_token_id")}
    model, cfg = make_run_dir(tmp_path / "run", tok_dir, table, steps=(5,))
    export.write_export(str(tmp_path / "run"), str(tmp_path / "export"))
    loaded = AutoModelForMaskedLM.from_pretrained(str(tmp_path / "export"),
                                                  attn_implementation="eager").eval()
    assert type(loaded).__name__ == "ModernBertForMaskedLM"
    card = (tmp_path / "export" / "README.md").read_text()  # written from config.json
    for fact in ("A ModernBERT masked language model", "`ModernBertForMaskedLM`",
                 "\n- modernbert\n", f"| layers | {cfg.num_layers} |",
                 f"| longest input (tokens) | {cfg.max_position_embeddings} |",
                 f"sliding window of {cfg.local_attention} tokens", "rotary (base 160000 global",
                 "no ModernBERT converter"):
        assert fact in card, fact
    assert "RoBERTa" not in card and "Roberta" not in card
    batch = padded_batch(9)
    real = batch["attention_mask"].astype(bool)
    np.testing.assert_allclose(torch_logits(loaded, batch)[real],
                               keras_logits(model, batch)[real], atol=TOL, rtol=0)
    written = importer.import_checkpoint(importer.ImportConfig(hf_dir=str(tmp_path / "export"),
                                                   run_dir=str(tmp_path / "imported")))
    assert model_config.run_model_config(str(tmp_path / "imported")) == cfg
    back = weights.read(written)
    for variable in model.weights:
        np.testing.assert_array_equal(back[variable.path], keras.ops.convert_to_numpy(variable))
