"""FLOP counts of training, and the measured matmul peak that MFU estimates divide by."""

from __future__ import annotations

import time

import numpy as np


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


def _keys_seen(seq_len: int, window: int | None, block: int | None) -> int:
    """(query, key) pairs one head of one layer computes: every pair for a global layer; for a
    sliding window the pairs at distance ``<= window // 2``, or with ``block`` the pairs of
    every (query block, key block) tile that holds one (block-sparse kernels compute whole
    tiles; the sequence is padded up to a multiple of ``block``)."""
    if window is None or window // 2 >= seq_len - 1:
        window = None
    if block is None:
        if window is None:
            return seq_len * seq_len
        radius = window // 2
        index = np.arange(seq_len)
        return int((np.minimum(index + radius, seq_len - 1)
                    - np.maximum(index - radius, 0) + 1).sum())
    blocks = -(-seq_len // block)
    if window is None:
        return blocks * blocks * block * block
    reach = -(-(window // 2) // block)  # key blocks within reach on each side of a query block
    index = np.arange(blocks)
    tiles = (np.minimum(index + reach, blocks - 1) - np.maximum(index - reach, 0) + 1).sum()
    return int(tiles) * block * block


def attention_flops(cfg, seq_len: int, batch: int = 1, *, training: bool = True,
                    sparse: bool = True, block: int | None = None) -> float:
    """FLOPs of the attention scores and weighted values (QK^T and PV) of ``batch`` sequences.

    For what a compiler cannot count: XLA's ``cost_analysis()`` gives 0 FLOPs for the splash
    kernel (a Mosaic custom call), so ``tpulm plan`` adds this. Each (query, key) pair costs
    2 x head_dim FLOPs in QK^T and as many in PV, per head: 4 x hidden per pair and layer.

    Args:
        cfg: a ``tpulm.model.config.ModelConfig`` (ModernBERT's sliding-window layers are
            ``local_attention`` wide, every ``global_attn_every_n_layers``-th layer global;
            RoBERTa is global everywhere).
        seq_len: tokens per sequence.
        batch: sequences.
        training: forward + backward (3 x forward), else forward only.
        sparse: count only the pairs inside each layer's window (False: seq^2 everywhere, what a
            dense masked path computes).
        block: with ``sparse``, count whole ``block x block`` tiles as a block-sparse kernel
            does (splash: 128); None = the exact pairs.

    Returns:
        The FLOPs, a float.
    """
    pairs = 0
    for layer in range(cfg.num_layers):
        local = (cfg.architecture == "modernbert"
                 and layer % cfg.global_attn_every_n_layers != 0)
        window = cfg.local_attention if (local and sparse) else None
        pairs += _keys_seen(seq_len, window, block if sparse else None)
    forward = 4.0 * cfg.hidden_size * pairs * batch
    return 3.0 * forward if training else forward


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
