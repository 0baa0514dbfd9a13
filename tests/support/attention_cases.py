"""Inputs of the attention tests, shared by the TensorFlow tests and the JAX worker (numpy only).

No test functions here: ``tests/test_attention.py`` and ``tests/support/attention_jax.py`` use it.
"""

from __future__ import annotations

import numpy as np

HEADS, HEAD_DIM = 2, 16
SCALE = HEAD_DIM**-0.5


def case(seq: int, *, padding: bool, documents: bool, batch: int = 2, seed: int = 0) -> dict:
    """q, k, v (batch, seq, heads, head_dim) float32, masks, and a weight on the real rows.

    Row 0 is full; row 1 ends in 25% padding. With ``documents`` row 0 holds three documents and
    row 1 two (ids 1.., 0 on padding), so windows cross document edges.
    """
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=(batch, seq, HEADS, HEAD_DIM)).astype(np.float32)
               for _ in range(3))
    mask = np.ones((batch, seq), np.int32)
    if padding:
        mask[1:, seq - seq // 4:] = 0
    segments = None
    if documents:
        segments = np.zeros((batch, seq), np.int32)
        cuts = [(0, seq // 3, 2 * seq // 3, seq), (0, seq // 2, seq)]
        for row in range(batch):
            edges = cuts[row % 2]
            for doc, (start, end) in enumerate(zip(edges[:-1], edges[1:]), start=1):
                segments[row, start:end] = doc
        segments *= mask
    # Only real rows count: padding queries' outputs are unspecified (see tpulm.model.attention).
    weight = rng.normal(size=q.shape).astype(np.float32) * mask[:, :, None, None]
    return {"q": q, "k": k, "v": v, "attention_mask": mask, "segment_ids": segments,
            "weight": weight}


def reference_mask(mask: np.ndarray, segments: np.ndarray | None, window: int | None):
    """(batch, seq, seq) bool by loops: what a real query may attend (padding rows: anything)."""
    batch, seq = mask.shape
    out = np.zeros((batch, seq, seq), bool)
    for b in range(batch):
        for i in range(seq):
            for j in range(seq):
                ok = mask[b, j] != 0
                if segments is not None:
                    ok = ok and segments[b, i] == segments[b, j] != 0
                if window is not None:
                    ok = ok and abs(i - j) <= window // 2
                out[b, i, j] = ok
    return out


def reference_attention(c: dict, window: int | None) -> np.ndarray:
    """Masked softmax attention in float64 numpy, (batch, seq, heads, head_dim)."""
    allowed = reference_mask(c["attention_mask"], c["segment_ids"], window)[:, None]
    logits = np.einsum("bqhd,bkhd->bhqk", c["q"].astype(np.float64), c["k"]) * SCALE
    logits = np.where(allowed, logits, -1e30)  # finite: rows of padding may allow nothing
    logits -= logits.max(axis=-1, keepdims=True)
    probs = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", probs, c["v"])
