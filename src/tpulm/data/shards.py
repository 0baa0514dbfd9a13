"""The TFRecord shard format shared by `data prepare` (writer) and training (reader).

A split folder holds ``dataset-<shard index>-<records in shard>.tfrecord`` files, each a series of
``tf.train.Example`` records with two int64 features of length ``max_length``: ``input_ids`` and
``attention_mask`` (the reference recipe's schema, so its shards train here too), plus
``manifest.json`` describing them. Readers take record counts from the manifest when there is one,
else from the file names, as the reference recipe's trainer does.

This module holds the names and manifest, the record encoder (:class:`ExampleEncoder`, numpy
varints, byte-identical to ``tf.train.Example.SerializeToString(deterministic=True)``), the
atomic :class:`ShardWriter`, and readers (:func:`iter_blocks`, :func:`first_record_schema`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from tpulm import storage
from tpulm.errors import TpulmError

FORMAT_VERSION = 1
FEATURES = ("input_ids", "attention_mask")
MANIFEST_NAME = "manifest.json"
_SHARD_NAME = re.compile(r"^dataset-(\d+)-(\d+)\.tfrecord$")


def shard_name(index: int, records: int) -> str:
    """File name of shard ``index`` holding ``records`` records."""
    return f"dataset-{index}-{records}.tfrecord"


def parse_shard_name(name: str) -> tuple[int, int] | None:
    """``dataset-3-1000.tfrecord`` -> (3, 1000); None for any other name."""
    match = _SHARD_NAME.match(name.rsplit("/", 1)[-1])
    return (int(match.group(1)), int(match.group(2))) if match else None


_RECORD_FRAMING = 16  # TFRecord: uint64 length, uint32 CRC of it, the data, uint32 CRC of it


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    file: str  # name inside the split folder
    records: int
    tokens: int  # positions with attention_mask 1
    bytes: int | None = None  # file size; None in manifests written before it was recorded


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What a split folder holds and how it was made."""

    tokenizer_fingerprint: str
    vocab_size: int
    max_length: int
    shards: tuple[ShardInfo, ...]
    source: Any = None
    arguments: dict[str, Any] = dataclasses.field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)  # samples, tokens, dropped

    @property
    def records(self) -> int:
        return sum(s.records for s in self.shards)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["records"] = self.records
        data["tokens"] = self.tokens
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> Manifest:
        try:
            data = json.loads(text)
            version = data.get("format_version")
            if version != FORMAT_VERSION:
                raise TpulmError(
                    f"{where} has format_version {version}; this tpulm reads {FORMAT_VERSION}"
                )
            data.pop("records", None)
            data.pop("tokens", None)
            data["shards"] = tuple(ShardInfo(**s) for s in data["shards"])
            return cls(**data)
        except (ValueError, KeyError, TypeError) as err:
            raise TpulmError(f"{where} is not a valid tpulm manifest: {err}") from None


def damaged_shards(split_dir: str, manifest: Manifest) -> list[str]:
    """What is wrong with the shards a manifest lists: one phrase per missing shard or shard of
    another size than recorded (sizes are checked where the manifest has them). Empty: all good.

    A stat per shard: cheap next to reading them, so training and ``prepare`` run it always.
    """
    present = set(storage.listdir(split_dir)) if storage.isdir(split_dir) else set()
    listed = [info for info in manifest.shards if info.file in present]
    problems = [f"{info.file} is missing" for info in manifest.shards if info.file not in present]
    sized = [info for info in listed if info.bytes is not None]
    paths = [storage.join(split_dir, info.file) for info in sized]
    for info, found in zip(sized, _sizes(paths)):
        if found != info.bytes:
            problems.append(f"{info.file} has {found} bytes, not the {info.bytes} it was written with")
    return problems


def _sizes(paths: list[str]) -> list[int]:
    """File sizes; remote stats run in parallel (each is a round trip)."""
    if not paths or not storage.is_remote(paths[0]):
        return [storage.size(p) for p in paths]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(storage.size, paths))


def check_complete(split_dir: str, manifest: Manifest) -> None:
    """Stop when a shard the manifest lists is missing or damaged, naming it and the repair.

    Raises:
        TpulmError: the first problems, and the ``tpulm data prepare`` command that rewrites them.
    """
    problems = damaged_shards(split_dir, manifest)
    if not problems:
        return
    shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
    raise TpulmError(f"{split_dir}: {shown}; rewrite them with {repair_command(split_dir, manifest)}")


def repair_command(split_dir: str, manifest: Manifest) -> str:
    """The ``tpulm data prepare`` command that rewrites a split (its rerun verifies the shards
    and rewrites damaged ones), from what the manifest recorded."""
    parent = split_dir.rstrip("/").rsplit("/", 1)[0] if "/" in split_dir.rstrip("/") else "."
    split = split_dir.rstrip("/").rsplit("/", 1)[-1]
    parts = ["tpulm data prepare", f"--output {parent}"]
    if manifest.arguments.get("tokenizer"):
        parts.append(f"--tokenizer {manifest.arguments['tokenizer']}")
    source = manifest.source if isinstance(manifest.source, dict) else {}
    if source.get("files") and split in ("train", "validation", "test"):
        parts.append(f"--{split}-files " + " ".join(source["files"]))
    elif source.get("dataset"):
        parts.append(f"--dataset {source['dataset']}")
    return "`" + " ".join(parts) + " ...` (the settings that wrote it)"


def read_manifest(split_dir: str) -> Manifest | None:
    """The manifest of a split folder, or None when it has none (e.g. reference-recipe shards)."""
    path = storage.join(split_dir, MANIFEST_NAME)
    if not storage.exists(path):
        return None
    return Manifest.from_json(storage.read_text(path), path)


def write_manifest(split_dir: str, manifest: Manifest) -> None:
    """Atomically write the manifest of a split folder."""
    storage.write_text(storage.join(split_dir, MANIFEST_NAME), manifest.to_json())


def list_shards(split_dir: str) -> list[str]:
    """Paths of the finished shards in a folder, ordered by shard index."""
    named = [(parse_shard_name(n), n) for n in storage.listdir(split_dir)]
    ordered = sorted((parsed[0], n) for parsed, n in named if parsed)
    return [storage.join(split_dir, n) for _, n in ordered]


def resolve_shards(spec: str) -> list[str]:
    """Shard paths from a split folder or a glob of shard files; an error if there are none."""
    if any(ch in spec for ch in "*?["):
        files = [f for f in storage.glob(spec) if parse_shard_name(f)]
    elif storage.isdir(spec):
        files = list_shards(spec)
    else:
        raise TpulmError(f"shard path {spec} is neither a folder nor a glob of .tfrecord files")
    if not files:
        raise TpulmError(
            f"no shards (dataset-<i>-<n>.tfrecord) found at {spec}; run `tpulm data prepare` first"
        )
    return files


def records_in(files: list[str]) -> int:
    """Number of records in shard files, read from their names."""
    return sum(parse_shard_name(f)[1] for f in files)


def feature_spec(max_length: int) -> dict:
    """``tf.io.parse_example`` spec of the shard schema."""
    import tensorflow as tf

    return {name: tf.io.FixedLenFeature([max_length], tf.int64) for name in FEATURES}


# ---------------------------------------------------------------------------------------------
# Serialising records. tf.train.Example(...).SerializeToString() costs ~50 µs a record in Python;
# the layout of our two-feature Example is fixed, so records are built from numpy-encoded packed
# varints and cached per-length headers instead (byte-identical, tested against protobuf).
#
#   Example  = 0x0A len Features
#   Features = entry("attention_mask") entry("input_ids")     (protobuf writes map keys sorted)
#   entry    = 0x0A len [0x0A len key] [0x12 len Feature]
#   Feature  = 0x1A len Int64List;   Int64List = 0x0A len packed-varints


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _entry_prefix(key: bytes, payload_len: int) -> bytes:
    """Bytes of a map entry ``key -> Int64List`` up to its packed payload of ``payload_len``."""
    int64_list = b"\x0a" + _varint(payload_len)
    feature = b"\x1a" + _varint(len(int64_list) + payload_len) + int64_list
    body = b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(len(feature) + payload_len)
    body += feature
    return b"\x0a" + _varint(len(body) + payload_len) + body


def encode_varints(rows: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Protobuf varints of a (records, length) array of non-negative ints, rows back to back.

    Returns the bytes and the (records + 1,) offsets where each row starts (and the last ends).
    """
    if rows.size == 0:
        return b"", np.zeros(len(rows) + 1, np.int64)
    if rows.min() < 0:
        raise ValueError("token ids must be non-negative")
    values = rows.astype(np.uint64, copy=False).ravel()  # (records * length,)
    top = int(values.max())
    nbytes = np.ones(values.shape, np.int64)  # varint length of each value
    for k in range(1, (top.bit_length() + 6) // 7):
        nbytes += values >= np.uint64(1 << (7 * k))
    ends = np.cumsum(nbytes)
    starts = ends - nbytes
    out = np.empty(int(ends[-1]), np.uint8)
    for k in range(int(nbytes.max())):
        sel = np.nonzero(nbytes > k)[0] if k else slice(None)
        group = (values[sel] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (nbytes[sel] > k + 1).astype(np.uint8) << 7  # continuation bit
        out[starts[sel] + k] = group.astype(np.uint8) | more
    offsets = np.zeros(len(rows) + 1, np.int64)
    offsets[1:] = ends.reshape(rows.shape)[:, -1]
    return out.tobytes(), offsets


class ExampleEncoder:
    """Serialises blocks as ``tf.train.Example`` bytes with int64 ``input_ids``/``attention_mask``."""

    def __init__(self) -> None:
        self._prefix: dict[tuple[bytes, int], bytes] = {}
        self._header: dict[int, bytes] = {}

    def _entry(self, key: bytes, payload_len: int) -> bytes:
        prefix = self._prefix.get((key, payload_len))
        if prefix is None:
            prefix = self._prefix[(key, payload_len)] = _entry_prefix(key, payload_len)
        return prefix

    def _example_header(self, features_len: int) -> bytes:
        header = self._header.get(features_len)
        if header is None:
            header = self._header[features_len] = b"\x0a" + _varint(features_len)
        return header

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> list[bytes]:
        """One serialised Example per row of the two (records, max_length) arrays."""
        ids_bytes, ids_off = encode_varints(input_ids)
        if (attention_mask == 1).all():  # full blocks (all but a padded last one): one row for all
            masks = [b"\x01" * attention_mask.shape[1]] * len(attention_mask)
        else:
            mask_bytes, mask_off = encode_varints(attention_mask)
            masks = [mask_bytes[a:b] for a, b in zip(mask_off[:-1], mask_off[1:])]
        records = []
        for i, mask in enumerate(masks):
            ids = ids_bytes[ids_off[i] : ids_off[i + 1]]
            mask_entry = self._entry(b"attention_mask", len(mask))
            ids_entry = self._entry(b"input_ids", len(ids))
            size = len(mask_entry) + len(mask) + len(ids_entry) + len(ids)
            records.append(b"".join((self._example_header(size), mask_entry, mask, ids_entry, ids)))
        return records


# ---------------------------------------------------------------------------------------------
# Writing shards


class ShardWriter:
    """Writes blocks into consecutive shards of ``shard_size`` records in ``split_dir``.

    Each shard is written under a temporary name and renamed to ``dataset-<i>-<n>.tfrecord`` when
    complete, so a folder never shows a half-written shard under a final name.
    """

    def __init__(self, split_dir: str, shard_size: int, first_index: int = 0):
        self.split_dir = split_dir
        self.shard_size = shard_size
        self.index = first_index  # index of the shard being written
        self._encoder = ExampleEncoder()
        self._writer = None
        self._tmp: str | None = None
        self._records = 0
        self._tokens = 0
        self._bytes = 0
        # Hooks around each shard's rename, e.g. to record progress the moment a shard is final.
        self.before_rename: Callable[[], None] | None = None
        self.after_rename: Callable[[ShardInfo], None] | None = None

    def _open(self) -> None:
        import tensorflow as tf

        storage.makedirs(self.split_dir)
        self._tmp = storage.temporary_name(storage.join(self.split_dir, f"dataset-{self.index}"))
        self._writer = tf.io.TFRecordWriter(self._tmp)

    def _finish(self) -> ShardInfo:
        self._writer.close()
        if self.before_rename is not None:
            self.before_rename()
        name = shard_name(self.index, self._records)
        storage.rename(self._tmp, storage.join(self.split_dir, name), overwrite=True)
        info = ShardInfo(file=name, records=self._records, tokens=self._tokens, bytes=self._bytes)
        self._writer, self._tmp = None, None
        self.index, self._records, self._tokens, self._bytes = self.index + 1, 0, 0, 0
        if self.after_rename is not None:
            self.after_rename(info)
        return info

    def add(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> list[ShardInfo]:
        """Append (records, max_length) blocks; returns the shards completed by this call."""
        done = []
        start = 0
        while start < len(input_ids):
            if self._writer is None:
                self._open()
            stop = min(len(input_ids), start + self.shard_size - self._records)
            mask = attention_mask[start:stop]
            for record in self._encoder.encode(input_ids[start:stop], mask):
                self._writer.write(record)
                self._bytes += len(record) + _RECORD_FRAMING
            self._records += stop - start
            self._tokens += int(mask.sum())
            start = stop
            if self._records == self.shard_size:
                done.append(self._finish())
        return done

    def close(self) -> ShardInfo | None:
        """Finish the last, partly filled shard (if any) and return it."""
        return self._finish() if self._writer is not None and self._records else None

    def abort(self) -> None:
        """Drop the shard being written (on error): close it and delete its temporary file."""
        if self._writer is not None:
            self._writer.close()
            if storage.exists(self._tmp):
                storage.remove(self._tmp)
            self._writer = None


def finished_shard(split_dir: str, index: int, records: int, tokens: int) -> ShardInfo:
    """The info of a full shard an earlier (interrupted) run finished, its size read back."""
    name = shard_name(index, records)
    return ShardInfo(name, records, tokens, bytes=storage.size(storage.join(split_dir, name)))


def remove_temporaries(split_dir: str) -> list[str]:
    """Delete unfinished (temporary) files an interrupted run left in a split folder."""
    stale = [n for n in storage.listdir(split_dir) if storage.is_temporary(n)]
    for name in stale:
        storage.remove(storage.join(split_dir, name))
    return stale


# ---------------------------------------------------------------------------------------------
# Reading shards back


def first_record_schema(path: str) -> dict[str, int]:
    """Feature name -> length of the first record of a shard (empty dict for an empty shard)."""
    import tensorflow as tf

    try:
        for raw in tf.data.TFRecordDataset(path).take(1):
            example = tf.train.Example.FromString(raw.numpy())
            features = example.features.feature
            return {k: len(features[k].int64_list.value) for k in sorted(features)}
    except tf.errors.DataLossError as err:
        raise TpulmError(f"{path} is corrupt: {err.message.splitlines()[0]}") from None
    except Exception as err:  # protobuf DecodeError: bytes that are no Example
        raise TpulmError(f"{path}: first record is not a tf.train.Example ({err})") from None
    return {}


def iter_blocks(path: str, max_length: int, batch: int = 1024) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(input_ids, attention_mask) of a shard, in (<= batch, max_length) int64 arrays, in order.

    Raises:
        TpulmError: a corrupt record (checksum) or a record that does not match the schema.
    """
    import tensorflow as tf

    dataset = tf.data.TFRecordDataset(path).batch(batch)
    spec = feature_spec(max_length)
    try:
        for raw in dataset:
            parsed = tf.io.parse_example(raw, spec)
            yield parsed["input_ids"].numpy(), parsed["attention_mask"].numpy()
    except tf.errors.DataLossError as err:
        raise TpulmError(f"{path} is corrupt: {err.message.splitlines()[0]}") from None
    except tf.errors.InvalidArgumentError as err:
        raise TpulmError(
            f"{path} has a record that is not two int64 features input_ids/attention_mask of "
            f"length {max_length}: {err.message.splitlines()[0]}"
        ) from None
