"""The JAX side of tests/test_long_context.py, run in a subprocess (Keras fixes its backend at
import). Usage: ``KERAS_BACKEND=jax python tests/support/model_jax.py OUT.json``. Writes the
largest differences of logits (real positions) and gradients of the tiny ModernBERT's ``auto``
and remat variants from ``dense`` without remat. Not a test module.
"""

from __future__ import annotations

import json
import sys

import jax
import keras
import numpy as np
from model_cases import TINY, batch, loss_weights

from tpulm.model.config import ModelConfig
from tpulm.model.networks import build_model


def _logits_and_grads(model, inputs: dict, weights: np.ndarray):
    """Logits and the gradients of their weighted sum, through ``stateless_call`` (as training)."""
    trainable = [v.value for v in model.trainable_variables]
    frozen = [v.value for v in model.non_trainable_variables]

    def loss(params):
        logits, _ = model.stateless_call(params, frozen, inputs, training=True)
        return (logits * weights).sum(), logits

    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(trainable)
    return np.asarray(logits), [np.asarray(g) for g in grads]


def main(out: str) -> None:
    """Differences from dense without remat, on the documents batch: logits at real positions
    (absolute) and gradients (relative to the largest gradient: XLA fuses a rematerialized
    block differently, so float32 sums round differently)."""
    assert keras.backend.backend() == "jax"
    cfg = ModelConfig(**TINY)
    inputs, weights = batch(True), loss_weights()
    real = inputs["attention_mask"].astype(bool)
    reference = build_model(cfg, dtype="float32", attention="dense")
    ref_logits, ref_grads = _logits_and_grads(reference, inputs, weights)
    scale = max(float(np.abs(g).max()) for g in ref_grads)
    results = {}
    for name, variant in {"auto": {"attention": "auto"}, "remat_block": {"remat": "block"},
                          "remat_full": {"attention": "auto", "remat": "full"}}.items():
        model = build_model(cfg, dtype="float32", **variant)
        for mine, theirs in zip(model.weights, reference.weights):
            mine.assign(theirs)
        logits, grads = _logits_and_grads(model, inputs, weights)
        results[name] = {
            "logits": float(np.abs(logits - ref_logits)[real].max()),
            "grads": max(float(np.abs(a - b).max()) for a, b in zip(grads, ref_grads)) / scale}
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1])
