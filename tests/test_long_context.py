"""Long-context compute settings of the networks: ``attention="auto"`` computes the same function
as ``"dense"`` (the masked reference), and ``remat`` changes memory, not values.

* TensorFlow: a tiny ModernBERT (one global, two sliding-window layers taking the blocked path at
  a length that is not a multiple of its block) with padding and packed documents: logits at real
  positions and every weight gradient within 1e-5 of dense, fp32 (gradients larger than 1 in
  units of their largest entry); RoBERTa likewise.
* remat none / block / full: equal loss and gradients (eager and XLA).
* JAX (one subprocess): auto, remat and both against dense through ``stateless_call`` and
  ``jax.grad`` (gradients relative to the largest: XLA fuses rematerialized blocks differently).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from support.model_cases import ROBERTA, TINY, batch, loss_weights

from tpulm.errors import TpulmError
from tpulm.model import attention
from tpulm.model.config import ModelConfig
from tpulm.model.networks import build_model

TOLERANCE = 1e-5  # fp32
SUPPORT = Path(__file__).resolve().parent / "support"


def _twin(reference, cfg: ModelConfig, **settings):
    """A model of ``cfg`` built with ``settings``, holding ``reference``'s weights."""
    model = build_model(cfg, dtype="float32", **settings)
    assert [v.path for v in model.weights] == [v.path for v in reference.weights]
    for mine, theirs in zip(model.weights, reference.weights):
        mine.assign(theirs)
    return model


def _logits_and_grads(model, inputs: dict, weights: np.ndarray, jit: bool = False):
    def step(inputs):
        with tf.GradientTape() as tape:
            logits = model(inputs, training=True)
            loss = tf.reduce_sum(logits * weights)
        return logits, loss, tape.gradient(loss, model.trainable_variables)

    if jit:
        step = tf.function(step, jit_compile=True)
    logits, loss, grads = step(inputs)
    return logits.numpy(), float(loss), [tf.convert_to_tensor(g).numpy() for g in grads]


def _max_differences(model, reference, inputs: dict, jit: bool = False) -> tuple[float, float]:
    weights = loss_weights()
    logits, _, grads = _logits_and_grads(model, inputs, weights, jit)
    ref_logits, _, ref_grads = _logits_and_grads(reference, inputs, weights, jit)
    real = inputs["attention_mask"].astype(bool)
    return (float(np.abs(logits - ref_logits)[real].max()),
            max(_gradient_difference(a, b) for a, b in zip(grads, ref_grads)))


def _gradient_difference(grad: np.ndarray, reference: np.ndarray) -> float:
    """Largest absolute difference, in units of the reference's largest entry where that exceeds
    1: the head's gradients reach ~300 here, where one float32 step is 3e-5, so an absolute 1e-5
    would demand bit-equal sums; below 1 it is the absolute difference."""
    return float(np.abs(grad - reference).max()) / max(1.0, float(np.abs(reference).max()))


@pytest.fixture(scope="module")
def dense_modernbert():
    return build_model(ModelConfig(**TINY), dtype="float32", attention="dense")


@pytest.mark.parametrize("documents", [False, True], ids=["padding", "documents"])
def _count_calls(monkeypatch, name: str) -> list:
    """Calls of ``attention.<name>`` from now on (their keyword arguments)."""
    calls, fn = [], getattr(attention, name)
    monkeypatch.setattr(attention, name, lambda *a, **k: calls.append(k) or fn(*a, **k))
    return calls


@pytest.mark.parametrize("documents", [False, True], ids=["padding", "documents"])
def test_modernbert_auto_equals_dense(dense_modernbert, documents, monkeypatch):
    monkeypatch.setattr(attention, "GLOBAL_BLOCK", 64)  # chunks at this length: 4, the last part
    blocked = _count_calls(monkeypatch, "blocked_local_attention")
    chunked = _count_calls(monkeypatch, "chunked_attention")
    model = _twin(dense_modernbert, ModelConfig(**TINY), attention="auto")
    logits, grads = _max_differences(model, dense_modernbert, batch(documents))
    # the two local layers went blocked, the global one chunked (traced once, run twice)
    assert [c["window"] for c in blocked] == [TINY["local_attention"]] * 2
    assert [c["block"] for c in chunked] == [64]
    assert logits <= TOLERANCE and grads <= TOLERANCE, (logits, grads)


def test_roberta_auto_equals_dense(monkeypatch):
    monkeypatch.setattr(attention, "GLOBAL_BLOCK", 64)
    cfg = ModelConfig(**ROBERTA)
    dense = build_model(cfg, dtype="float32", attention="dense")
    logits, grads = _max_differences(_twin(dense, cfg, attention="auto"), dense, batch(True))
    assert logits <= TOLERANCE and grads <= TOLERANCE, (logits, grads)


@pytest.mark.parametrize("remat,jit", [("block", False), ("full", False), ("block", True)])
def test_remat_keeps_loss_and_gradients(dense_modernbert, remat, jit):
    model = _twin(dense_modernbert, ModelConfig(**TINY), attention="dense", remat=remat)
    inputs = {**batch(True), "masked_positions": np.array([[1, 150], [2, 140], [0, 8]], np.int32)}
    weights = np.random.default_rng(3).normal(size=(3, 2, TINY["vocab_size"]))
    _, loss, grads = _logits_and_grads(model, inputs, weights.astype(np.float32), jit)
    _, ref_loss, ref_grads = _logits_and_grads(dense_modernbert, inputs,
                                               weights.astype(np.float32), jit)
    assert loss == pytest.approx(ref_loss, abs=1e-6)
    for got, want in zip(grads, ref_grads):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


def test_remat_over_the_sparse_paths_equals_dense(dense_modernbert, monkeypatch):
    """``tf.recompute_grad`` around blocks whose attention has its own backward pass (chunked
    global, in chunks of 64 here) and the blocked window, under XLA as on CPU by default."""
    monkeypatch.setattr(attention, "GLOBAL_BLOCK", 64)
    chunked = _count_calls(monkeypatch, "chunked_attention")
    model = _twin(dense_modernbert, ModelConfig(**TINY), attention="auto", remat="block")
    logits, grads = _max_differences(model, dense_modernbert, batch(True), jit=True)
    assert chunked  # the global layer went chunked
    assert logits <= TOLERANCE and grads <= TOLERANCE, (logits, grads)


def test_unknown_settings_are_user_errors():
    with pytest.raises(TpulmError, match="--attention"):
        build_model(ModelConfig(**TINY), attention="sparse")
    with pytest.raises(TpulmError, match="--remat"):
        build_model(ModelConfig(**TINY), remat="layers")
    with pytest.raises(TpulmError, match="exact on JAX only"):  # tf.recompute_grad redraws
        build_model(ModelConfig(**{**TINY, "hidden_dropout": 0.1}), remat="block")


def test_settings_survive_get_config(dense_modernbert):
    model = build_model(ModelConfig(**TINY), attention="dense", remat="block")
    config = model.get_config()
    assert (config["attention"], config["remat"]) == ("dense", "block")
    assert model.backbone.blocks[1].get_config()["attention"] == "dense"


def test_jax_auto_and_remat_equal_dense(tmp_path):
    out = tmp_path / "results.json"
    path = [str(Path(attention.__file__).parents[2]), str(SUPPORT),
            os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
           "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": os.pathsep.join(path)}
    proc = subprocess.run([sys.executable, str(SUPPORT / "model_jax.py"), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    results = json.loads(out.read_text())
    assert set(results) == {"auto", "remat_block", "remat_full"}
    for name, result in results.items():
        assert result["logits"] <= TOLERANCE and result["grads"] <= TOLERANCE, (name, result)


def test_blocked_path_only_where_it_reads_fewer_keys_than_dense(monkeypatch):
    """ModernBERT's 128 window reads 3 blocks of 64 keys: blocked from seq 193 on, dense below."""
    calls = []
    blocked = attention.blocked_local_attention
    monkeypatch.setattr(attention, "blocked_local_attention",
                        lambda *a, **k: calls.append(a[0].shape[1]) or blocked(*a, **k))
    for seq in (128, 192, 256):
        x = tf.random.stateless_normal((1, seq, 2, 8), seed=(0, seq))
        attention.attend(x, x, x, attention_mask=tf.ones((1, seq), tf.int32), window=128)
    assert calls == [256]
