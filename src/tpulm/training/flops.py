"""FLOP counts of training, and the measured matmul peak that MFU estimates divide by."""

from __future__ import annotations

import time


def train_flops_per_sequence(cfg, seq_len: int, predictions: int) -> float:
    """Training FLOPs (forward + backward = 3 x forward) of one sequence.

    Matmuls: 6 x parameters-in-matmuls x tokens for the encoder (attention projections 4H^2 and
    the FFN 2HI per layer, per token; 3HI for ModernBERT's GLU), the LM head (H^2 + HV) only on the ``predictions`` gathered
    slots; attention scores and values 2 x 2 S^2 H per layer forward. Embedding lookups, norms and
    softmaxes are not counted.

    Args:
        cfg: a ``tpulm.model.config.ModelConfig``.
        seq_len: tokens per sequence.
        predictions: masked slots per sequence (P).
    """
    h, i, v, layers = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_layers
    ffn = 3 * h * i if cfg.architecture == "modernbert" else 2 * h * i  # GLU: Wi is (h, 2i)
    encoder = 6.0 * seq_len * layers * (4 * h * h + ffn)
    head = 6.0 * predictions * (h * h + h * v)
    attention = 3.0 * layers * 4 * seq_len * seq_len * h
    return encoder + head + attention


def matmul_flops(n: int = 2048, repeats: int = 5, dtype: str = "float32") -> float:
    """FLOP/s of an (n, n) x (n, n) matmul on the default device: the peak for MFU estimates."""
    import tensorflow as tf

    a = tf.random.stateless_normal((n, n), seed=(0, 1), dtype=dtype)
    b = tf.random.stateless_normal((n, n), seed=(0, 2), dtype=dtype)
    matmul = tf.function(tf.linalg.matmul)
    matmul(a, b).numpy()  # warm-up (tracing, thread pools)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        matmul(a, b).numpy()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best
