"""The TFRecord shard format shared by `data prepare` (writer) and training (reader).

A split folder holds ``dataset-<shard index>-<records in shard>.tfrecord`` files, each a series of
``tf.train.Example`` records with two int64 features of length ``max_length``: ``input_ids`` and
``attention_mask`` (the reference recipe's schema, so its shards train here too), plus
``manifest.json`` describing them. Readers take record counts from the manifest when there is one,
else from the file names, as the reference recipe's trainer does.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

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


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    file: str  # name inside the split folder
    records: int
    tokens: int  # positions with attention_mask 1


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
