"""tf.data pipelines over real shards: order, epochs, exact resume, per-worker sharding, eval."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from support.training import blocks, make_tokenizer, wikitext_lines, write_shards

from tpulm.data.tokenizer import special_tokens
from tpulm.errors import TpulmError
from tpulm.training.inputs import eval_dataset, open_shards, training_dataset
from tpulm.training.masking import Masker

LENGTH = 32


@pytest.fixture(scope="module")
def shards(tmp_path_factory, wikitext_dir):
    """4 reference-schema shards (no manifest) of real text; the last block is padded."""
    root = tmp_path_factory.mktemp("inputs")
    tok = make_tokenizer(root / "tok", wikitext_lines(wikitext_dir, "valid", 1500), 400)
    ids, mask = blocks(tok, wikitext_lines(wikitext_dir, "test", 60), LENGTH)
    write_shards(root / "train", ids, mask, 4)
    return root, tok, ids, mask


def _masker(tok, p=0.0) -> Masker:
    special = special_tokens(str(tok))
    return Masker(vocab_size=400, mask_id=special.mask_id, special_ids=special.ids,
                  num_predictions=8, mlm_probability=p)


def _rows(ds, n) -> list[tuple]:
    return [tuple(r) for x, _, _ in ds.take(n) for r in x["input_ids"].numpy().tolist()]


def test_open_shards_without_manifest(shards):
    root, _, ids, _ = shards
    shard_set = open_shards(str(root / "train"))
    assert shard_set.records == len(ids) and shard_set.max_length == LENGTH
    assert shard_set.manifest is None and len(shard_set.files) == 4
    glob_set = open_shards(str(root / "train" / "dataset-[01]-*.tfrecord"))
    assert len(glob_set.files) == 2
    with pytest.raises(TpulmError, match="no shards"):
        open_shards(str(root / "tok"))


def test_epochs_cover_every_record_once_in_a_seeded_order(shards):
    root, tok, ids, _ = shards
    shard_set = open_shards(str(root / "train"))
    batch = 8
    per_epoch = len(ids) // batch
    ds = training_dataset(shard_set, batch_size=batch, masker=_masker(tok), seed=3, shuffle_buffer=16)
    rows = _rows(ds, 2 * per_epoch)
    first, second = rows[: per_epoch * batch], rows[per_epoch * batch :]
    written = {tuple(r) for r in ids.tolist()}
    for epoch in (first, second):
        assert len(set(epoch)) == len(epoch) and set(epoch) <= written
        assert len(written - set(epoch)) == len(ids) % batch  # only the remainder is dropped
    assert first != second  # reshuffled each epoch
    again = training_dataset(shard_set, batch_size=batch, masker=_masker(tok), seed=3, shuffle_buffer=16)
    assert _rows(again, 2 * per_epoch) == rows
    other = training_dataset(shard_set, batch_size=batch, masker=_masker(tok), seed=4, shuffle_buffer=16)
    assert _rows(other, per_epoch) != first


def test_start_batch_resumes_the_exact_stream_across_epochs(shards):
    root, tok, ids, _ = shards
    shard_set = open_shards(str(root / "train"))
    per_epoch = len(ids) // 8
    make = lambda start: training_dataset(  # noqa: E731
        shard_set, batch_size=8, masker=_masker(tok, 0.15), seed=1, start_batch=start, shuffle_buffer=16
    )
    full = list(make(0).take(2 * per_epoch + 3))
    for start in (1, per_epoch - 1, per_epoch + 2):
        resumed = list(make(start).take(len(full) - start))
        for (xa, ya, wa), (xb, yb, wb) in zip(full[start:], resumed):
            for key in xa:
                np.testing.assert_array_equal(xa[key].numpy(), xb[key].numpy())
            np.testing.assert_array_equal(ya.numpy(), yb.numpy())
            np.testing.assert_array_equal(wa.numpy(), wb.numpy())


def test_input_pipelines_read_disjoint_files(shards):
    root, tok, ids, _ = shards
    shard_set = open_shards(str(root / "train"))
    seen = []
    for i in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i,
                                             num_replicas_in_sync=2)
        ds = training_dataset(shard_set, batch_size=8, masker=_masker(tok), seed=0,
                              input_context=context)
        x, _, _ = next(iter(ds))
        assert x["input_ids"].shape == (4, LENGTH)  # per-replica batch
        files = shard_set.files[i::2]
        per_epoch = sum(int(f.rsplit("-", 1)[1].split(".")[0]) for f in files) // 4
        seen.append(set(_rows(ds, per_epoch)))
    assert not seen[0] & seen[1]
    context = tf.distribute.InputContext(num_input_pipelines=5, input_pipeline_id=0)
    with pytest.raises(TpulmError, match="one shard per worker"):
        training_dataset(shard_set, batch_size=10, masker=_masker(tok), seed=0, input_context=context)


def test_eval_counts_every_record_once_and_fillers_weigh_nothing(shards):
    root, tok, ids, mask = shards
    special = special_tokens(str(tok))
    shard_set = open_shards(str(root / "train"))
    ds = eval_dataset(shard_set, batch_size=16, masker=_masker(tok, 1.0), seed=0,
                      filler_ids=(special.cls_id, special.pad_id))
    assert ds.cardinality().numpy() == -(-len(ids) // 16)
    weights, rows = 0.0, []
    for x, y, w in ds:
        weights += float(tf.reduce_sum(w))
        rows += [tuple(r) for r, m in zip(x["attention_mask"].numpy().tolist(), x["input_ids"].numpy()) if sum(r) > 1]
    maskable = (mask == 1) & ~np.isin(ids, special.ids)
    expected = np.minimum(maskable.sum(1), 8).sum()  # 8 slots, every maskable token selected
    assert weights == expected
    assert len(rows) == len(ids)
