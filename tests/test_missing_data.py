"""Missing or damaged data is named: a shard the manifest lists that is gone or has another size
stops training (naming it and the repair command), and a rerun of `prepare` verifies the shards
against the manifest and rewrites the bad ones instead of calling the split complete."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpulm.data import prepare, shards, tokenizer
from tpulm.data.prepare import PrepareConfig
from tpulm.errors import TpulmError
from tpulm.training import inputs

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory, wikitext_dir) -> str:
    out = str(tmp_path_factory.mktemp("tok") / "tok")
    tokenizer.run(tokenizer.TokenizerConfig(inputs=(str(wikitext_dir / "valid.txt"),), output=out,
                                            vocab_size=2000, unk_rate_samples=1))
    return out


def prepare_config(tok_dir: str, out: Path, wikitext_dir: Path) -> PrepareConfig:
    return PrepareConfig(tokenizer=tok_dir, output=str(out), train_files=(str(wikitext_dir / "valid.txt"),),
                         max_length=64, shard_size=500, progress=False)


@pytest.fixture
def prepared(tmp_path, tok_dir, wikitext_dir) -> tuple[PrepareConfig, Path]:
    cfg = prepare_config(tok_dir, tmp_path / "data", wikitext_dir)
    prepare.run(cfg)
    return cfg, tmp_path / "data" / "train"


def contents(split: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(split.iterdir())}


def test_manifest_records_each_shard_size(prepared):
    _, split = prepared
    manifest = shards.read_manifest(str(split))
    assert len(manifest.shards) >= 3
    for info in manifest.shards:
        assert info.bytes == (split / info.file).stat().st_size


def test_training_stops_on_a_missing_shard_naming_it_and_the_repair(prepared):
    cfg, split = prepared
    victim = shards.read_manifest(str(split)).shards[1].file
    (split / victim).unlink()
    with pytest.raises(TpulmError) as caught:
        inputs.open_shards(str(split))
    message = str(caught.value)
    assert f"{victim} is missing" in message and "\n" not in message
    assert f"`tpulm data prepare --output {split.parent} --tokenizer {cfg.tokenizer}" in message


def test_training_stops_on_a_truncated_shard(prepared):
    _, split = prepared
    info = shards.read_manifest(str(split)).shards[0]
    path = split / info.file
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(TpulmError, match=rf"{info.file} has 1000 bytes, not the {info.bytes} it was written with"):
        inputs.open_shards(str(split))


def test_manifest_without_sizes_still_reads_and_names_missing_shards(prepared):
    """Manifests written before sizes were recorded stay readable (and still list the shards)."""
    _, split = prepared
    path = split / shards.MANIFEST_NAME
    data = json.loads(path.read_text())
    for entry in data["shards"]:
        entry.pop("bytes")
    path.write_text(json.dumps(data))
    shard_set = inputs.open_shards(str(split))
    assert shard_set.records == sum(s["records"] for s in data["shards"])
    (split / data["shards"][-1]["file"]).unlink()
    with pytest.raises(TpulmError, match=f"{data['shards'][-1]['file']} is missing"):
        inputs.open_shards(str(split))


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_prepare_rerun_rewrites_damaged_shards(prepared, damage, caplog):
    cfg, split = prepared
    before = contents(split)
    victim = split / shards.read_manifest(str(split)).shards[1].file
    if damage == "truncate":
        victim.write_bytes(victim.read_bytes()[:-7])
    else:
        victim.unlink()
    with caplog.at_level("WARNING"):
        again = prepare.run(cfg)
    assert again.splits["train"].resumed_at_shard == 0  # prepared again, not "already complete"
    assert victim.name in caplog.text
    assert contents(split) == before  # every shard and the manifest, byte for byte
    assert prepare.run(cfg).splits["train"].resumed_at_shard == -1  # now complete


def test_cli_train_on_a_split_with_a_missing_shard_is_one_line(prepared, tmp_path):
    cfg, split = prepared
    victim = shards.read_manifest(str(split)).shards[0].file
    (split / victim).unlink()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "tpulm", "train", "--model", "tiny", "--train-data", str(split),
         "--tokenizer", cfg.tokenizer, "--run-dir", str(tmp_path / "run"), "--max-steps", "1",
         "--progress", "false"],
        capture_output=True, text=True, env=env, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("tpulm: error: ")
    assert f"{victim} is missing" in lines[0] and "tpulm data prepare" in lines[0]


def test_inspect_reports_a_shard_of_another_size(prepared):
    from tpulm.data import inspect

    _, split = prepared
    info = shards.read_manifest(str(split)).shards[0]
    path = split / info.file
    path.write_bytes(path.read_bytes()[:-5])
    report = inspect.run(inspect.InspectConfig(path=str(split), decode=0))
    assert not report.ok
    assert any(f"{info.file} has {info.bytes - 5} bytes" in p for p in report.splits[0].problems)
