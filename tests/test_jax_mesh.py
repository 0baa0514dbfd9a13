"""JAX distribution set-up that needs no JAX device: mesh specs, layout map, backend choice."""

from __future__ import annotations

import re

import keras
import pytest

from tpulm.errors import TpulmError
from tpulm.model.config import ModelConfig
from tpulm.model.networks import build_model
from tpulm.training import backends, jax_mesh, strategies
from tpulm.training.config import TrainConfig


def tiny(vocab: int = 500, hidden: int = 64, ffn: int = 128) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, hidden_size=hidden, num_layers=2, num_heads=2,
                       intermediate_size=ffn, max_position_embeddings=40, pad_token_id=1)


@pytest.mark.parametrize("spec, devices, sizes", [
    ("data=2,model=2", 4, (2, 2)),
    ("model=2", 8, (4, 2)),
    ("data=4", 4, (4, 1)),
    (" model = 4 , data=1 ", 4, (1, 4)),
    ("data=1,model=1", 4, (1, 1)),  # a sub-mesh (single host only)
])
def test_parse_mesh(spec, devices, sizes):
    assert jax_mesh.parse_mesh(spec, devices) == sizes


@pytest.mark.parametrize("spec, message", [
    ("data=3,model=2", "needs 6 devices but only 4"),
    ("model=3", "cannot be split into model=3"),
    ("batch=2", "expected comma-separated data=D,model=M"),
    ("data=0,model=4", "positive sizes"),
    ("data=2,data=2", "each axis at most once"),
    ("", "is empty"),
])
def test_parse_mesh_errors_name_the_flag(spec, message):
    with pytest.raises(TpulmError, match=re.escape(message)) as err:
        jax_mesh.parse_mesh(spec, 4)
    assert "--mesh" in str(err.value)


def _matches(rules: dict, path: str) -> list[str]:
    return [p for p in rules if re.fullmatch(p, path)]


def test_layout_rules_shard_exactly_the_large_weights_of_the_real_model():
    """Every rule hits real variable paths; embeddings, q/k/v/output and FFN kernels are split."""
    model = build_model(tiny())
    rules = jax_mesh.layout_rules(model.cfg, 2)
    layouts = {}
    for variable in model.weights:
        hits = _matches(rules, variable.path)
        assert len(hits) <= 1, (variable.path, hits)  # Keras rejects ambiguous layout keys
        if hits:
            layouts[variable.path] = rules[hits[0]]
    expected = {"roberta_mlm/embeddings/word_embeddings/embeddings": ("model", None)}
    for i in range(2):
        for name in ("query", "key", "value", "intermediate"):
            expected[f"roberta_mlm/layer_{i}/{name}/kernel"] = (None, "model")
        for name in ("attention_output", "output"):
            expected[f"roberta_mlm/layer_{i}/{name}/kernel"] = ("model", None)
    assert layouts == expected
    for variable in model.weights:  # every split dimension divides evenly
        for size, axis in zip(variable.shape, layouts.get(variable.path, ())):
            assert axis is None or size % 2 == 0


def test_layout_rules_split_an_odd_vocabulary_by_hidden_column():
    rules = jax_mesh.layout_rules(tiny(vocab=501), 2)
    word = [axes for p, axes in rules.items() if p.endswith("word_embeddings/embeddings")]
    assert word == [(None, "model")]


@pytest.mark.parametrize("hidden, ffn, name", [(64, 96, "intermediate_size"), (60, 128, "hidden_size")])
def test_layout_rules_reject_a_model_axis_that_does_not_divide(hidden, ffn, name):
    cfg = ModelConfig(vocab_size=500, hidden_size=hidden, num_layers=1, num_heads=2,
                      intermediate_size=ffn, max_position_embeddings=40, pad_token_id=1)
    with pytest.raises(TpulmError, match=rf"--mesh model=64 does not divide the model's {name}"):
        jax_mesh.layout_rules(cfg, 64)


def test_backend_is_resolved_from_flag_then_environment(monkeypatch):
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    assert backends.resolve(None) == "tensorflow"
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    assert backends.resolve(None) == "jax"
    assert backends.resolve("tensorflow") == "tensorflow"
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    with pytest.raises(TpulmError, match="KERAS_BACKEND must be one of tensorflow, jax"):
        backends.resolve(None)


def test_switching_backend_after_keras_import_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    assert keras.backend.backend() == "tensorflow"
    assert backends.activate(None) == "tensorflow"
    assert backends.activate("tensorflow") == "tensorflow"
    with pytest.raises(backends.BackendMismatch, match="set KERAS_BACKEND=jax before importing"):
        backends.activate("jax")


def test_train_config_checks_backend_and_mesh_needs_jax():
    with pytest.raises(TpulmError, match="backend must be one of tensorflow, jax"):
        TrainConfig(backend="torch")
    with pytest.raises(TpulmError, match="--mesh needs the JAX backend"):
        strategies.make_strategy(strategies.Placement(mesh="data=1,model=1"))


def test_jax_tpu_must_be_local():
    with pytest.raises(TpulmError, match="run tpulm on the TPU VM itself"):
        jax_mesh.initialize_cluster("my-tpu")


def test_reexec_refuses_outside_the_tpulm_command():
    """pytest is not `tpulm`: re-executing it as `python -m tpulm` would run something else."""
    with pytest.raises(backends.BackendMismatch, match="KERAS_BACKEND=jax"):
        backends.reexec("jax")


def test_train_command_offers_backend_and_mesh(capsys):
    from tpulm.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--backend {tensorflow,jax} Keras backend, tensorflow or jax" in text
    assert "--mesh MESH" in text
