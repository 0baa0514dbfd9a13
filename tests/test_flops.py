"""Attention FLOP counts (tpulm.training.flops.attention_flops), which ``tpulm plan`` adds where
the TPU compiler counts none (the splash kernel)."""

from __future__ import annotations

import numpy as np
import pytest

from tpulm.model.config import ModelConfig
from tpulm.training.flops import attention_flops, train_flops_per_sequence

MODERNBERT = ModelConfig(vocab_size=100, architecture="modernbert", hidden_size=64, num_layers=3,
                         num_heads=4, intermediate_size=96, local_attention=8,
                         global_attn_every_n_layers=3, max_position_embeddings=4096)


def _pairs_by_loop(seq: int, window: int | None) -> int:
    return sum(1 for q in range(seq) for k in range(seq)
               if window is None or abs(q - k) <= window // 2)


def test_dense_count_is_the_s_squared_term_of_train_flops():
    roberta = ModelConfig(vocab_size=100, hidden_size=64, num_layers=2, num_heads=4,
                          intermediate_size=96)
    encoder = 6.0 * 128 * 2 * (4 * 64 * 64 + 2 * 64 * 96)
    total = train_flops_per_sequence(roberta, 128, predictions=0)
    assert attention_flops(roberta, 128) == pytest.approx(total - encoder)
    assert attention_flops(roberta, 128) == 3.0 * 2 * 4 * 128**2 * 64


@pytest.mark.parametrize("seq", [5, 37, 100])
def test_window_counts_the_pairs_inside_it(seq):
    pairs = _pairs_by_loop(seq, None) + 2 * _pairs_by_loop(seq, 8)  # 1 global, 2 local layers
    assert attention_flops(MODERNBERT, seq, batch=3, training=False) == 3 * 4 * 64 * pairs
    assert attention_flops(MODERNBERT, seq, batch=3) == 3 * 3 * 4 * 64 * pairs
    dense = attention_flops(MODERNBERT, seq, training=False, sparse=False)
    assert dense == 3 * 4 * 64 * seq**2


def test_block_sparse_counts_whole_tiles():
    # seq 300 -> 3 tiles of 128; window 8 reaches one tile on each side: 3 + 2 + 2 = 7 tiles.
    flops = attention_flops(MODERNBERT, 300, training=False, block=128)
    assert flops == 4 * 64 * 128 * 128 * (9 + 2 * 7)
    long = ModelConfig(**{**vars(MODERNBERT), "local_attention": 128})
    ratio = attention_flops(long, 4096, sparse=False) / attention_flops(long, 4096)
    assert ratio == pytest.approx(3 / (1 + 2 * (np.mean(
        [min(i + 64, 4095) - max(i - 64, 0) + 1 for i in range(4096)]) / 4096)), rel=1e-9)
