"""Shared by tests/test_long_context.py and its JAX worker: a tiny ModernBERT whose local layers
take the blocked path, batches with padding and packed documents, and the quantities compared."""

from __future__ import annotations

import numpy as np

PAD, CLS, VOCAB = 3, 0, 97
# Block 0 global, blocks 1 and 2 in a window of 40 (20 each side): at SEQ = 200 (not a multiple
# of the blocked path's 64, longer than the 192 keys its blocks read) the local layers take the
# blocked path, reaching one block each side.
TINY = dict(vocab_size=VOCAB, pad_token_id=PAD, architecture="modernbert", hidden_size=32,
            num_layers=3, num_heads=2, intermediate_size=48, max_position_embeddings=512,
            local_attention=40, global_attn_every_n_layers=3, hidden_dropout=0.0,
            attention_dropout=0.0)
ROBERTA = dict(vocab_size=VOCAB, pad_token_id=PAD, hidden_size=32, num_layers=2, num_heads=2,
               intermediate_size=48, max_position_embeddings=240, hidden_dropout=0.0,
               attention_dropout=0.0)
SEQ = 200


def batch(documents: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """Rows of lengths 200, 141, 9 (right padding); with ``documents`` every row packs documents
    opened by [CLS] (``segment_ids``, ``position_ids`` as tpulm.training.documents makes them)."""
    rng = np.random.default_rng(seed)
    lengths = np.array([SEQ, 141, 9])
    ids = rng.integers(PAD + 1, VOCAB, (len(lengths), SEQ)).astype(np.int32)
    mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)
    out = {"input_ids": np.where(mask == 1, ids, PAD).astype(np.int32), "attention_mask": mask}
    if documents:
        starts = [[0, 30, 77, 150], [0, 12, 50], [0, 4]]
        segments, positions = np.zeros_like(ids), np.zeros_like(ids)
        for row, row_starts in enumerate(starts):
            ends = [*row_starts[1:], lengths[row]]
            for doc, (start, end) in enumerate(zip(row_starts, ends), start=1):
                out["input_ids"][row, start] = CLS
                segments[row, start:end] = doc
                positions[row, start:end] = np.arange(end - start)
        out.update(segment_ids=segments, position_ids=positions)
    return out


def loss_weights(seed: int = 1) -> np.ndarray:
    """(batch, seq, vocab) random weights, zero at padding: the loss is a weighted logit sum over
    real positions only (padding queries' outputs are unspecified in the sparse paths)."""
    weights = np.random.default_rng(seed).normal(size=(3, SEQ, VOCAB)).astype(np.float32)
    return weights * batch(False)["attention_mask"][:, :, None]
