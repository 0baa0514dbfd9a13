"""`tpulm data inspect`: a good folder passes; each kind of damage is reported and exits 1."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tpulm import cli
from tpulm.data import inspect, preparation, prepare, shards, tokenizer
from tpulm.data.inspect import InspectConfig


@pytest.fixture(scope="module")
def good(tmp_path_factory, wikitext_dir) -> Path:
    """A tokenizer and a prepared folder (train + validation) of real text."""
    root = tmp_path_factory.mktemp("inspect")
    corpus = root / "small.txt"
    corpus.write_text("\n".join((wikitext_dir / "valid.txt").read_text(encoding="utf-8").split("\n")[:400]), encoding="utf-8")
    tokenizer.run(tokenizer.TokenizerConfig(inputs=(str(corpus),), output=str(root / "tok"), vocab_size=800, unk_rate_samples=1))
    prepare.run(prepare.PrepareConfig(tokenizer=str(root / "tok"), output=str(root / "data"), train_files=(str(corpus),),
                                      validation_files=(str(corpus),), max_length=64, shard_size=100, progress=False))
    return root


@pytest.fixture
def damaged(good, tmp_path) -> Path:
    """A copy of the train split to break."""
    shutil.copytree(good / "data" / "train", tmp_path / "train")
    return tmp_path / "train"


def problems(path: Path, tok: Path | None = None) -> list[str]:
    report = inspect.run(InspectConfig(path=str(path), tokenizer=str(tok) if tok else None))
    return [p for split in report.splits for p in split.problems]


def test_good_folder_passes_and_decodes(good, capsys, wikitext_dir):
    report = inspect.run(InspectConfig(path=str(good / "data"), decode=2))
    assert report.ok and [Path(s.path).name for s in report.splits] == ["train", "validation"]
    train = report.splits[0]
    manifest = shards.read_manifest(str(good / "data" / "train"))
    assert (train.records, train.tokens, train.shards) == (manifest.records, manifest.tokens, len(manifest.shards))
    assert len(train.decoded) == 2 and train.decoded[0].startswith("[CLS] = Homarus gammarus = [SEP][CLS] Homarus")
    assert cli.main(["data", "inspect", str(good / "data" / "train"), "--decode", "1"]) == 0
    out = capsys.readouterr().out
    assert "train: OK: " in out and "block 0: [CLS] = Homarus" in out


def test_corrupt_bytes(damaged):
    path = damaged / "dataset-1-100.tfrecord"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    found = problems(damaged)
    assert any("dataset-1-100.tfrecord is corrupt" in p for p in found), found
    assert cli.main(["data", "inspect", str(damaged)]) == 1


def test_truncated_shard(damaged):
    path = damaged / "dataset-0-100.tfrecord"
    path.write_bytes(path.read_bytes()[:-10])
    found = problems(damaged)
    assert any("dataset-0-100.tfrecord is corrupt" in p for p in found)
    assert not any("but the folder holds" in p for p in found), found  # it does hold it


def test_count_in_name_differs_from_records(damaged):
    (damaged / "dataset-1-100.tfrecord").rename(damaged / "dataset-1-99.tfrecord")
    found = problems(damaged)
    assert "dataset-1-99.tfrecord: name says 99 records, file holds 100" in found
    assert any(p.startswith("manifest lists") for p in found)


def test_missing_shard_index(damaged):
    (damaged / "dataset-0-100.tfrecord").unlink()
    found = problems(damaged)
    assert any(p.startswith("shard indices are [1, 2") for p in found), found


def test_manifest_disagrees(damaged, good):
    manifest = json.loads((damaged / "manifest.json").read_text())
    manifest["shards"][0]["tokens"] -= 1
    manifest["vocab_size"] += 1
    (damaged / "manifest.json").write_text(json.dumps(manifest))
    found = problems(damaged, good / "tok")
    assert "dataset-0-100.tfrecord: manifest says 100 records/6399 tokens, file holds 100/6400" in found
    assert f"manifest vocab_size {manifest['vocab_size']}, tokenizer {manifest['vocab_size'] - 1}" in found


def rewrite_shard(path: Path, ids: np.ndarray, mask: np.ndarray) -> None:
    """Replace a shard's content (same name) with these blocks."""
    writer = shards.ShardWriter(str(path.parent), shard_size=len(ids), first_index=int(path.name.split("-")[1]))
    path.unlink()
    writer.add(ids, mask)


def test_ids_beyond_vocab_and_bad_mask(damaged):
    ids, mask = next(shards.iter_blocks(str(damaged / "dataset-0-100.tfrecord"), 64))
    ids[3, 5], ids[7, 0], mask[9, 9] = 800, 5000, 2
    rewrite_shard(damaged / "dataset-0-100.tfrecord", ids, mask)
    found = problems(damaged)
    assert "dataset-0-100.tfrecord: 2 ids outside [0, vocab size 800)" in found
    assert "dataset-0-100.tfrecord: 1 attention_mask values other than 0/1" in found


def test_wrong_schema(damaged):
    ids, mask = next(shards.iter_blocks(str(damaged / "dataset-2-100.tfrecord"), 64))
    rewrite_shard(damaged / "dataset-2-100.tfrecord", ids[:, :32], mask[:, :32])
    found = problems(damaged)
    assert any("dataset-2-100.tfrecord: first record has features {'attention_mask': 32, 'input_ids': 32}" in p for p in found)


def test_interrupted_run_and_leftovers(damaged):
    (damaged / "manifest.json").unlink()
    (damaged / preparation.PROGRESS_NAME).write_text("{}")
    (damaged / "dataset-9.tmp-0123456789ab").write_bytes(b"partial")
    found = problems(damaged)
    assert "`tpulm data prepare` was interrupted here: rerun it to finish" in found
    assert any(p.startswith("unfinished temporary files ['dataset-9.tmp-") for p in found)


def test_reference_shards_without_manifest(damaged, good):
    (damaged / "manifest.json").unlink()  # the reference recipe writes none
    report = inspect.run(InspectConfig(path=str(damaged), tokenizer=str(good / "tok"), decode=1))
    assert report.ok and report.splits[0].max_length == 64 and len(report.splits[0].decoded) == 1


def test_not_a_shard_folder(tmp_path, capsys):
    assert cli.main(["data", "inspect", str(tmp_path)]) == 2
    assert "no shards (dataset-<i>-<n>.tfrecord) or manifest.json in" in capsys.readouterr().err
