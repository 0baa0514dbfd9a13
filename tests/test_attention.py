"""Attention paths against the dense reference (tpulm.model.attention), fp32, outputs and gradients.

* The dense path is the masked softmax the networks compute (checked against numpy loops).
* TensorFlow: the blocked sliding window and the chunked global path (its hand-written backward
  pass) equal dense (eager, graph and XLA) for padding, documents, lengths that are not a
  multiple of the block and windows wider than a block.
* JAX (one subprocess): blocked, chunked and splash (Pallas interpret mode, alone and under a
  Keras ModelParallel mesh through shard_map) equal dense; on CPU ``auto`` picks chunked and
  blocked.
* The registry: which path each backend and platform gets; unknown modes are user errors.
* With ``-m slow`` and libtpu: splash compiles for a v5e slice ahead of time (Mosaic, sharded).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from support.attention_cases import SCALE, case, reference_attention, reference_mask

from tpulm.errors import TpulmError
from tpulm.model import attention

TOLERANCE = 1e-5  # fp32; measured differences are below 1e-6
SUPPORT = Path(__file__).resolve().parent / "support"


def _real(c: dict) -> np.ndarray:
    return c["attention_mask"].astype(bool)


def _dense(c: dict, window: int | None):
    mask = attention.dense_mask(c["attention_mask"], c["segment_ids"], window)
    return lambda q, k, v: attention.dense_attention(q, k, v, mask, scale=SCALE)


def _blocked(c: dict, window: int):
    segments = attention.token_segments(c["attention_mask"], c["segment_ids"])
    return lambda q, k, v: attention.blocked_local_attention(q, k, v, segments, window=window,
                                                             scale=SCALE)


def _output_and_grads(fn, c: dict):
    """``fn(q, k, v)`` and the gradients of its weighted sum over real rows, under TensorFlow."""
    q, k, v = (tf.constant(c[name]) for name in "qkv")
    with tf.GradientTape() as tape:
        tape.watch([q, k, v])
        out = fn(q, k, v)
        loss = tf.reduce_sum(out * c["weight"])
    return np.asarray(out), [np.asarray(g) for g in tape.gradient(loss, [q, k, v])]


def _assert_matches(fn, reference, c: dict) -> None:
    out, grads = _output_and_grads(fn, c)
    ref_out, ref_grads = _output_and_grads(reference, c)
    assert np.abs(out - ref_out)[_real(c)].max() <= TOLERANCE
    for grad, ref_grad in zip(grads, ref_grads):
        assert np.abs(grad - ref_grad).max() <= TOLERANCE


@pytest.mark.parametrize("window", [None, 20])
def test_dense_mask_is_padding_documents_and_window(window):
    c = case(24, padding=True, documents=True)
    mask = np.broadcast_to(np.asarray(attention.dense_mask(c["attention_mask"], c["segment_ids"],
                                                           window)), (2, 1, 24, 24))[:, 0]
    expected = reference_mask(c["attention_mask"], c["segment_ids"], window)
    np.testing.assert_array_equal(mask, expected)
    plain = np.asarray(attention.dense_mask(c["attention_mask"]))  # padding keys only
    assert plain.shape == (2, 1, 1, 24) and not plain[1, 0, 0, -1] and plain[1, 0, 0, 0]


@pytest.mark.parametrize("window", [None, 16])
def test_dense_attention_is_the_masked_softmax(window):
    c = case(40, padding=True, documents=True)
    out = np.asarray(_dense(c, window)(c["q"], c["k"], c["v"]))
    expected = reference_attention(c, window)
    assert np.abs(out - expected)[_real(c)].max() <= TOLERANCE


def test_dense_attention_with_dropout_is_the_same_softmax():
    """The explicit-softmax branch (dropout on the probabilities) equals the fused op's."""
    c = case(40, padding=True, documents=True)
    mask = attention.dense_mask(c["attention_mask"], c["segment_ids"], 16)
    _assert_matches(lambda q, k, v: attention.dense_attention(
        q, k, v, mask, scale=SCALE, probs_dropout=lambda p: p), _dense(c, 16), c)


@pytest.mark.parametrize("seq, window, padding, documents", [
    (256, 128, False, False),  # a multiple of the block, window reaching one block each side
    (200, 128, True, False),  # padding, a length that is not a multiple of the block
    (200, 128, True, True),  # documents: windows cross document edges
    (200, 40, True, True),  # a window narrower than the block
    (300, 300, True, True),  # a window reaching three blocks each side
])
def test_blocked_local_equals_dense(seq, window, padding, documents):
    c = case(seq, padding=padding, documents=documents)
    _assert_matches(_blocked(c, window), _dense(c, window), c)


def _chunked(c: dict, block: int):
    return lambda q, k, v: attention.chunked_attention(
        q, k, v, c["attention_mask"], c["segment_ids"], scale=SCALE, block=block)


@pytest.mark.parametrize("seq, block, padding, documents", [
    (256, 64, False, False),  # a multiple of the chunk
    (200, 64, True, False),  # padding, a last chunk of 8 queries
    (200, 64, True, True),  # documents
    (200, 512, True, True),  # one chunk longer than the sequence
])
def test_chunked_global_equals_dense(seq, block, padding, documents):
    c = case(seq, padding=padding, documents=documents)
    _assert_matches(_chunked(c, block), _dense(c, None), c)


@pytest.mark.parametrize("path", ["blocked_local", "chunked_global"])
@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_paths_equal_dense_in_tf_function(path, jit_compile):
    c = case(200, padding=True, documents=True)
    fn, window = (_blocked(c, 128), 128) if path == "blocked_local" else (_chunked(c, 64), None)
    _assert_matches(tf.function(fn, jit_compile=jit_compile), _dense(c, window), c)


def test_chunked_global_keeps_a_row_of_padding_finite():
    """A row that is all padding attends only masked keys: finite outputs and gradients."""
    c = case(64, padding=True, documents=False)
    c["attention_mask"][1] = 0
    out, grads = _output_and_grads(_chunked(c, 16), c)
    assert np.isfinite(out).all() and all(np.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("window", [128, None], ids=["local", "global"])
@pytest.mark.parametrize("seq", [200, None], ids=["static-length", "unknown-length"])
def test_attend_in_graph_with_unknown_batch(seq, window, monkeypatch):
    """Keras traces with an unknown batch; with an unknown length both paths stay dense."""
    monkeypatch.setattr(attention, "GLOBAL_BLOCK", 64)
    c = case(200, padding=True, documents=True)
    spec, ids = tf.TensorSpec((None, seq, 2, 16)), tf.TensorSpec((None, seq), tf.int32)
    fn = tf.function(lambda q, k, v, m, s: attention.attend(
        q, k, v, attention_mask=m, segment_ids=s, window=window),
        input_signature=[spec] * 3 + [ids] * 2)
    _assert_matches(lambda q, k, v: fn(q, k, v, c["attention_mask"], c["segment_ids"]),
                    _dense(c, window), c)


@pytest.mark.parametrize("window", [None, 128, 64, 512])
def test_attend_auto_equals_attend_dense(window, monkeypatch):
    """Globals go chunked on TensorFlow (in chunks of 64 here), windows blocked, a window
    spanning the whole sequence is a global layer."""
    monkeypatch.setattr(attention, "GLOBAL_BLOCK", 64)
    c = case(200, padding=True, documents=True)
    kwargs = dict(attention_mask=c["attention_mask"], segment_ids=c["segment_ids"],
                  window=window, scale=SCALE)
    _assert_matches(lambda q, k, v: attention.attend(q, k, v, **kwargs),
                    lambda q, k, v: attention.attend(q, k, v, mode="dense", **kwargs), c)


def test_attend_dense_mode_is_the_reference_exactly():
    c = case(64, padding=True, documents=True)
    got = attention.attend(c["q"], c["k"], c["v"], attention_mask=c["attention_mask"],
                           segment_ids=c["segment_ids"], window=32, mode="dense")
    expected = _dense(c, 32)(c["q"], c["k"], c["v"])
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_global_layers_up_to_one_chunk_stay_dense(monkeypatch):
    """A sequence of one chunk or less takes the dense path: chunks would save nothing."""
    calls = []
    monkeypatch.setattr(attention, "chunked_attention", lambda *a, **k: calls.append(k))
    c = case(attention.GLOBAL_BLOCK, padding=True, documents=False)
    attention.attend(c["q"], c["k"], c["v"], attention_mask=c["attention_mask"], scale=SCALE)
    assert calls == []
    longer = case(attention.GLOBAL_BLOCK + 1, padding=True, documents=False)
    attention.attend(longer["q"], longer["k"], longer["v"],
                     attention_mask=longer["attention_mask"], scale=SCALE)
    assert [k["block"] for k in calls] == [attention.GLOBAL_BLOCK]


def test_registry_picks_paths_by_backend_and_platform():
    chunked, blocked = attention._chunked, attention._blocked
    picks = {key: attention.select_paths("auto", *key) for key in (
        ("tensorflow", None), ("jax", "cpu"), ("jax", "gpu"), ("jax", "tpu"))}
    assert (picks["tensorflow", None].global_, picks["tensorflow", None].local) == (chunked,
                                                                                  blocked)
    assert (picks["jax", "cpu"].global_, picks["jax", "cpu"].local) == (chunked, blocked)
    assert (picks["jax", "gpu"].global_, picks["jax", "gpu"].local) == (attention._cudnn, blocked)
    assert picks["jax", "tpu"].global_ is picks["jax", "tpu"].local is attention._splash
    assert attention.select_paths("dense", "jax", "tpu") is attention.DENSE
    with pytest.raises(TpulmError, match="--attention"):
        attention.select_paths("flash")


def test_cudnn_applies_to_16_bit_padding_only_inputs():
    bf16 = tf.zeros((1, 64, 2, 64), tf.bfloat16)
    assert attention.cudnn_applies(bf16, None)
    assert not attention.cudnn_applies(tf.zeros((1, 64, 2, 64)), None)  # float32
    assert not attention.cudnn_applies(bf16, np.ones((1, 64), np.int32))  # documents
    assert not attention.cudnn_applies(tf.zeros((1, 64, 2, 12), tf.bfloat16), None)  # head_dim


def _run_jax_worker(out: Path, *extra: str) -> dict:
    """tests/support/attention_jax.py's results, on 4 virtual CPU devices."""
    path = [str(Path(attention.__file__).parents[2]), str(SUPPORT),
            os.environ.get("PYTHONPATH", "")]
    # libtpu's lock file would make a second process compiling for TPU fail, not wait
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "TF_CPP_MIN_LOG_LEVEL": "3",
           "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "PYTHONPATH": os.pathsep.join(path)}
    proc = subprocess.run([sys.executable, str(SUPPORT / "attention_jax.py"), str(out), *extra],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def jax_results(tmp_path_factory) -> dict:
    return _run_jax_worker(tmp_path_factory.mktemp("attention_jax") / "results.json")


@pytest.mark.parametrize("check", ["blocked_local", "chunked_global", "chunked_documents",
                                   "splash_local", "splash_global",
                                   "splash_sharded", "auto_on_cpu"])
def test_jax_paths_equal_dense(jax_results, check):
    result = jax_results[check]
    for name in ("output", "grad_q", "grad_k", "grad_v"):
        assert result[name] <= TOLERANCE, (check, name, result[name])


def test_jax_splash_runs_under_the_keras_mesh(jax_results):
    result = jax_results["splash_sharded"]
    assert result["mesh"] == {"data": 2, "model": 2}
    assert (result["batch_axis"], result["head_axis"]) == ("data", "model")


def test_jax_auto_on_cpu_is_chunked_global_and_blocked_local(jax_results):
    result = jax_results["auto_on_cpu"]
    assert (result["platform"], result["global"], result["local"]) == ("cpu", "_chunked",
                                                                       "_blocked")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu beside jax")
def test_splash_compiles_for_a_tpu_slice(tmp_path, request):
    """Mosaic lowers the kernel for v5e (seq 1000 padded to 1024, window, documents, sharded):
    what interpret mode does not check. ~30 s of libtpu compilation: opt in with -m slow."""
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("opt in with -m slow")
    result = _run_jax_worker(tmp_path / "tpu.json", "tpu")
    assert result["platform"] == "tpu" and result["temp_bytes"] < 2**30
