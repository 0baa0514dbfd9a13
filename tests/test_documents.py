"""Document-aware packing: segment and position ids from packed blocks, block-diagonal attention
(each document's logits as if alone), and training with --document-attention / --whole-word-mask."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf
from support.training import write_shards
from support.words import demo_lines, packed_blocks, train_family

from tpulm.data import tokenizer
from tpulm.training import inputs
from tpulm.training.documents import document_features
from tpulm.training.masking import Masker

CLS, PAD = 0, 3


def _features(ids, mask):
    out = document_features(tf.constant(ids), tf.constant(mask), CLS)
    return out["segment_ids"].numpy(), out["position_ids"].numpy()


def test_segments_and_positions_of_packed_rows():
    ids = np.array([
        [0, 7, 8, 1, 0, 9, 1, 0, 5, 3, 3],  # starts with [CLS]: three documents, then padding
        [6, 7, 1, 0, 8, 8, 8, 8, 8, 8, 1],  # starts mid-document: the tail is segment 1
        [0, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5],  # one long document
    ])
    mask = (ids != PAD).astype(np.int64)
    segments, positions = _features(ids, mask)
    np.testing.assert_array_equal(segments, [[1, 1, 1, 1, 2, 2, 2, 3, 3, 0, 0],
                                             [1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2],
                                             [1] * 11])
    np.testing.assert_array_equal(positions, [[0, 1, 2, 3, 0, 1, 2, 0, 1, 0, 0],
                                              [0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7],
                                              list(range(11))])


@pytest.fixture(scope="module")
def lines():
    return demo_lines(2000)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory, lines):
    return train_family(tmp_path_factory.mktemp("tok"), lines, "unigram", vocab_size=500)


def _model(tok_dir):
    from tpulm.model.config import ModelConfig
    from tpulm.model.networks import build_model

    special = tokenizer.special_tokens(tok_dir)
    cfg = ModelConfig(vocab_size=500, hidden_size=32, num_layers=2, num_heads=2,
                      intermediate_size=64, max_position_embeddings=72,
                      pad_token_id=special.pad_id, hidden_dropout=0.0, attention_dropout=0.0)
    return build_model(cfg, dtype="float32"), special


def test_each_packed_document_gives_the_logits_it_has_alone(tok_dir, lines):
    model, special = _model(tok_dir)
    tok = tokenizer.load_tokenizer(tok_dir)
    a, b = (tok.encode(t).ids for t in (lines[3], lines[4]))
    tail = a[len(a) // 2:]  # a document cut by the block boundary: no [CLS]
    width = 64
    assert len(tail) + len(b) + 2 <= width, "pick shorter lines"

    def row(*docs):
        ids = np.full(width, special.pad_id, np.int32)
        joined = np.concatenate(docs)
        ids[: len(joined)] = joined
        return ids

    packed = np.stack([row(tail, b), row(tail), row(b)])
    mask = (packed != special.pad_id).astype(np.int32)
    x = {"input_ids": packed, "attention_mask": mask}
    doc = {k: v.numpy() for k, v in document_features(packed, mask, special.cls_id).items()}
    together = np.asarray(model({**x, **doc}, training=False))[0]
    alone = np.asarray(model(x, training=False))  # rows 1 and 2: one document each, as before
    n = len(tail)
    np.testing.assert_allclose(together[:n], alone[1, :n], atol=1e-5)
    np.testing.assert_allclose(together[n:n + len(b)], alone[2, :len(b)], atol=1e-5)
    # Without segment ids the second document sees the first: its logits change.
    plain = np.asarray(model(x, training=False))[0]
    assert np.abs(plain[n:n + len(b)] - alone[2, :len(b)]).max() > 1e-3


@pytest.fixture(scope="module")
def data(tmp_path_factory, tok_dir, lines):
    out = tmp_path_factory.mktemp("data")
    ids, mask = packed_blocks(tok_dir, lines[:300], 32)
    write_shards(out / "train", ids, mask, 2)
    ids, mask = packed_blocks(tok_dir, lines[300:360], 32)
    write_shards(out / "valid", ids, mask, 1)
    return out


def test_training_dataset_carries_document_features(data, tok_dir):
    special = tokenizer.special_tokens(tok_dir)
    masker = Masker(vocab_size=500, mask_id=special.mask_id, special_ids=special.ids,
                    num_predictions=12)
    shard_set = inputs.open_shards(str(data / "train"))
    ds = inputs.training_dataset(shard_set, batch_size=4, masker=masker, seed=0,
                                 document_cls_id=special.cls_id)
    x, _, _ = next(iter(ds))
    assert x["segment_ids"].shape == x["input_ids"].shape == (4, 32)
    # Recompute from the unmasked ids: [MASK] never replaces [CLS], so the ids' [CLS] agree.
    segments = x["segment_ids"].numpy()
    opens = (x["input_ids"].numpy() == special.cls_id)
    starts = np.diff(segments, axis=1, prepend=segments[:, :1]) == 1
    np.testing.assert_array_equal(starts[:, 1:], opens[:, 1:])
    assert (x["position_ids"].numpy()[opens] == 0).all()
    plain = next(iter(inputs.training_dataset(shard_set, batch_size=4, masker=masker, seed=0)))[0]
    assert set(plain) == {"input_ids", "attention_mask", "masked_positions"}


def test_a_few_training_steps_with_each_option(tmp_path, data, tok_dir):
    from tpulm.training import run
    from tpulm.training.config import TrainConfig

    common = dict(model="tiny", batch_size=4, learning_rate=1e-3, progress=False, peak_tflops=1.0,
                  train_data=str(data / "train"), eval_data=str(data / "valid"),
                  tokenizer=str(tok_dir), max_steps=4, log_every=4, seed=3,
                  jit_compile="false")  # 4 steps: XLA compiles would be most of the time
    losses = {}
    for name, flags in (("plain", {}), ("documents", {"document_attention": True}),
                        ("words", {"whole_word_mask": True})):
        result = run(TrainConfig(run_dir=str(tmp_path / name), **flags, **common))
        assert result.step == 4 and math.isfinite(result.eval["loss"])
        losses[name] = result.eval["loss"]
    # Same seed, data and masks: only the attention mask and positions differ, so a different
    # loss shows the segment and position ids reached the model through fit and evaluate.
    assert losses["documents"] != pytest.approx(losses["plain"], abs=1e-6)
    assert losses["words"] != pytest.approx(losses["plain"], abs=1e-6)
