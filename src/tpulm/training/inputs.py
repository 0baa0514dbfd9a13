"""``tf.data`` pipelines from shard folders or globs (local or ``gs://``) to masked batches.

Training data is an endless sequence of epochs. Each epoch is a pure function of (seed, epoch):
the file order is a stateless shuffle, files are read in parallel with a deterministic interleave,
records are permuted within windows of ``shuffle_buffer`` records (a stateless, seeded stand-in
for a shuffle buffer, whose seed cannot depend on the epoch tensor), are batched with ``drop_remainder`` (static shapes), then
parsed and masked with a seed derived from (seed, epoch, batch index). So a fixed seed gives a
fixed order, and a run resumed after ``n`` batches rebuilds the exact same stream from batch ``n``
(``start_batch``) — the data position of a checkpoint is one integer.

Elements are Keras ``(x, y, sample_weight)`` triples: ``x`` = {``input_ids``, ``attention_mask``,
``masked_positions``}, ``y`` = ``masked_ids`` (B, P), ``sample_weight`` = ``masked_weights``
(B, P). With ``document_cls_id`` set, ``x`` also holds ``segment_ids`` and ``position_ids`` (B, S)
(see :mod:`tpulm.training.documents`), computed from the unmasked ids.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tpulm import storage
from tpulm.data import shards
from tpulm.errors import TpulmError
from tpulm.training.documents import document_features
from tpulm.training.masking import Masker

AUTOTUNE = tf.data.AUTOTUNE
_CYCLE_LENGTH = 16  # files read at once; TFRecord reads are I/O bound, gs:// especially


@dataclasses.dataclass(frozen=True)
class ShardSet:
    """The shard files of one split, with what is known about them.

    Attributes:
        spec: the folder or glob the files came from (for messages).
        files: shard paths, ordered by shard index.
        records: number of records (from the manifest, else from the file names).
        max_length: tokens per record.
        manifest: the folder's manifest, or None (e.g. shards of the reference recipe).
    """

    spec: str
    files: tuple[str, ...]
    records: int
    max_length: int
    manifest: shards.Manifest | None


def open_shards(spec: str) -> ShardSet:
    """Find the shards of ``spec`` (a split folder or a glob) and read their manifest if any.

    Args:
        spec: a folder of ``dataset-<i>-<n>.tfrecord`` files or a glob of such files.

    Raises:
        TpulmError: the path cannot be reached, holds no shards, or a shard its manifest lists is
            missing or has another size than written (named, with the command that repairs it).
    """
    storage.check_reachable(spec, "shards")
    files = tuple(shards.resolve_shards(spec))
    manifest = shards.read_manifest(spec) if storage.isdir(spec) else None
    if manifest is not None:
        # The manifest is the list of what the split holds: training on the others without a
        # word would silently train on less (and other) data than prepared.
        shards.check_complete(spec, manifest)
        listed = tuple(storage.join(spec, info.file) for info in manifest.shards)
        return ShardSet(spec, listed, manifest.records, manifest.max_length, manifest)
    return ShardSet(spec, files, shards.records_in(list(files)), _peek_length(files[0]), manifest)


def _peek_length(path: str) -> int:
    """Length of ``input_ids`` in the first record of a shard (shards without manifest)."""
    try:
        for raw in tf.data.TFRecordDataset(path).take(1):
            example = tf.train.Example.FromString(raw.numpy())
            return len(example.features.feature["input_ids"].int64_list.value)
    except tf.errors.OpError as err:
        raise TpulmError(f"cannot read shard {path}: {err.message}") from None
    raise TpulmError(f"shard {path} is empty; rewrite it with `tpulm data prepare`")


def batches_per_epoch(records: int, batch_size: int) -> int:
    """Full batches in one pass over ``records`` records (the remainder is dropped)."""
    return records // batch_size


def _shard_for_pipeline(
    shard_set: ShardSet, batch_size: int, context: tf.distribute.InputContext | None
) -> tuple[tuple[str, ...], int, int]:
    """(files, records, per-pipeline batch size) of this input pipeline."""
    if context is None or context.num_input_pipelines == 1:
        per_pipeline = batch_size if context is None else context.get_per_replica_batch_size(batch_size)
        return shard_set.files, shard_set.records, per_pipeline
    n, i = context.num_input_pipelines, context.input_pipeline_id
    if len(shard_set.files) < n:
        raise TpulmError(
            f"{shard_set.spec} has {len(shard_set.files)} shard files but training runs {n} input "
            "pipelines (workers/hosts): write at least one shard per worker (`--num-shards`)"
        )
    files = shard_set.files[i::n]
    return files, shards.records_in(list(files)), context.get_per_replica_batch_size(batch_size)


def _parse_and_mask(max_length: int, masker: Masker, document_cls_id: int | None = None):
    spec = shards.feature_spec(max_length)

    def fn(seed, serialized):
        features = tf.io.parse_example(serialized, spec)  # (B, max_length) int64 each
        out = masker(features["input_ids"], features["attention_mask"], seed)
        x = {k: out[k] for k in ("input_ids", "attention_mask", "masked_positions")}
        if document_cls_id is not None:  # from the original ids: a masked [CLS] cannot happen
            x.update(document_features(
                features["input_ids"], features["attention_mask"], document_cls_id))
        return x, out["masked_ids"], out["masked_weights"]

    return fn


def training_dataset(
    shard_set: ShardSet,
    *,
    batch_size: int,
    masker: Masker,
    seed: int,
    start_batch: int = 0,
    shuffle_buffer: int = 10_000,
    input_context: tf.distribute.InputContext | None = None,
    document_cls_id: int | None = None,
) -> tf.data.Dataset:
    """Endless masked training batches, starting at batch ``start_batch`` of the stream.

    Args:
        shard_set: the training shards.
        batch_size: global batch size (divided among input pipelines by ``input_context``).
        masker: the masking to apply.
        seed: fixes file order, sample order and masks.
        start_batch: batches of this pipeline already consumed (resume position).
        shuffle_buffer: records per window of the sample shuffle.
        input_context: set by ``tf.distribute`` for per-worker file sharding.
        document_cls_id: the ``[CLS]`` id, to add ``segment_ids`` and ``position_ids``; None: off.
    """
    files, records, batch = _shard_for_pipeline(shard_set, batch_size, input_context)
    per_epoch = batches_per_epoch(records, batch)
    if per_epoch == 0:
        raise TpulmError(
            f"{shard_set.spec} has {records} records, fewer than one batch of {batch}: "
            "lower --batch-size or prepare more data"
        )
    pipeline = 0 if input_context is None else input_context.input_pipeline_id
    first_epoch, skip = divmod(start_batch, per_epoch)
    parse_and_mask = _parse_and_mask(shard_set.max_length, masker, document_cls_id)
    epoch = _epoch_fn(files, batch, parse_and_mask, seed, pipeline, shuffle_buffer,
                      first_epoch, skip)
    ds = tf.data.Dataset.range(first_epoch, 2**62).flat_map(epoch)
    return ds.prefetch(AUTOTUNE)


def _epoch_fn(files, batch, parse_and_mask, seed, pipeline, shuffle_buffer, first_epoch, skip):
    """epoch (int64 tensor) -> that epoch's masked batches; ``skip`` batches off ``first_epoch``."""
    files_t = tf.constant(files)

    def epoch(e):
        epoch_seed = tf.stack([tf.constant(seed, tf.int64), e * 1024 + pipeline])
        order = tf.random.experimental.stateless_shuffle(files_t, seed=epoch_seed)
        ds = tf.data.Dataset.from_tensor_slices(order).interleave(
            tf.data.TFRecordDataset,
            cycle_length=min(len(files), _CYCLE_LENGTH),
            num_parallel_calls=AUTOTUNE,
            deterministic=True,
        )
        # Sample shuffle: windows of `shuffle_buffer` records, each permuted by a stateless
        # shuffle seeded per (epoch, window); tf.data's shuffle takes no tensor seed.
        ds = ds.batch(shuffle_buffer).enumerate().map(
            lambda w, records: tf.random.experimental.stateless_shuffle(
                records, seed=tf.random.experimental.stateless_fold_in(epoch_seed, -1 - w)
            )
        ).unbatch()
        ds = ds.batch(batch, drop_remainder=True).enumerate()
        ds = ds.skip(tf.where(e == first_epoch, tf.constant(skip, tf.int64), 0))
        return ds.map(
            lambda i, raw: parse_and_mask(
                tf.random.experimental.stateless_fold_in(epoch_seed, i), raw
            ),
            num_parallel_calls=AUTOTUNE,
            deterministic=True,
        )

    return epoch


def eval_dataset(
    shard_set: ShardSet,
    *,
    batch_size: int,
    masker: Masker,
    seed: int,
    filler_ids: tuple[int, int],
    input_context: tf.distribute.InputContext | None = None,
    document_cls_id: int | None = None,
) -> tf.data.Dataset:
    """All records once, in file order, with fixed masks (comparable across evaluations).

    The last batch is completed with filler rows (``[CLS]`` then padding) that have no maskable
    position, so every record counts once, shapes stay static, and the fillers weigh nothing.

    Args:
        shard_set: the validation shards.
        batch_size: global batch size.
        masker: the masking to apply.
        seed: fixes the masks.
        filler_ids: (cls id, pad id) for the filler rows.
        input_context: set by ``tf.distribute`` for per-worker file sharding.
        document_cls_id: the ``[CLS]`` id, to add ``segment_ids`` and ``position_ids``; None: off.
    """
    files, records, batch = _shard_for_pipeline(shard_set, batch_size, input_context)
    length = shard_set.max_length
    cls_id, pad_id = filler_ids
    filler = tf.train.Example(
        features=tf.train.Features(
            feature={
                "input_ids": _int64s([cls_id] + [pad_id] * (length - 1)),
                "attention_mask": _int64s([1] + [0] * (length - 1)),
            }
        )
    ).SerializeToString()
    ds = tf.data.TFRecordDataset(list(files), num_parallel_reads=min(len(files), _CYCLE_LENGTH))
    ds = ds.concatenate(tf.data.Dataset.from_tensors(filler).repeat(batch - 1))
    ds = ds.batch(batch, drop_remainder=True).enumerate()
    ds = ds.apply(tf.data.experimental.assert_cardinality(-(-records // batch)))
    base_seed = tf.constant([seed, 2**31 - 1], tf.int64)  # disjoint from training epochs
    parse_and_mask = _parse_and_mask(length, masker, document_cls_id)
    ds = ds.map(
        lambda i, raw: parse_and_mask(tf.random.experimental.stateless_fold_in(base_seed, i), raw),
        num_parallel_calls=AUTOTUNE,
        deterministic=True,
    )
    return ds.prefetch(AUTOTUNE)


def _int64s(values: list[int]) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def find_corrupt_shard(files: list[str]) -> tuple[str, str] | None:
    """The first shard that cannot be read to its end, and TensorFlow's reason; None if all can.

    Reading a whole shard takes about as long as one pass of ``tpulm data inspect`` over it: this
    runs only after training has failed on unreadable data, to name the file.
    """
    import tensorflow as tf

    for path in files:
        try:
            tf.data.TFRecordDataset(path).reduce(0, lambda count, _: count + 1)
        except tf.errors.OpError as err:
            return path, err.message.splitlines()[0]
    return None
