"""`tpulm data prepare --runner DirectRunner`: the Beam pipeline writes the local path's shards."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("apache_beam")

from tpulm import cli, storage
from tpulm.data import beam as beam_prepare
from tpulm.data import builtin_corpus, inspect, preparation, prepare, shards, tokenizer
from tpulm.data.prepare import PrepareConfig
from tpulm.errors import TpulmError

PACKAGES = ("email", "logging", "unittest")  # real English prose from the stdlib's docstrings


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory) -> list[str]:
    """Three text files of the built-in demo corpus (one per stdlib package), ~1400 lines."""
    out = tmp_path_factory.mktemp("corpus")
    files = []
    for name in PACKAGES:
        lines = builtin_corpus.demo_lines(root=os.path.join(builtin_corpus.stdlib_dir(), name), runtime=False)
        path = out / f"{name}.txt"
        path.write_text("".join(line + "\n" for line in lines) + "\n\n", encoding="utf-8")
        files.append(str(path))
    return files


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory, corpus_files) -> str:
    out = str(tmp_path_factory.mktemp("tok") / "tok")
    tokenizer.run(tokenizer.TokenizerConfig(
        inputs=tuple(corpus_files), output=out, vocab_size=1000, unk_rate_samples=1))
    return out


def settings(tok_dir: str, corpus_files: list[str], output: Path, **kw) -> PrepareConfig:
    base = {"tokenizer": tok_dir, "output": str(output), "train_files": tuple(corpus_files[:2]),
                "validation_files": (corpus_files[2],), "max_length": 64, "shard_size": 40,
                "batch_size": 100, "progress": False}
    return PrepareConfig(**{**base, **kw})


def folder_bytes(root: str) -> dict[str, bytes]:
    """Relative path -> content of every file under ``root``."""
    found = {}
    for split in sorted(os.listdir(root)):
        for name in storage.listdir(os.path.join(root, split)):
            found[f"{split}/{name}"] = Path(root, split, name).read_bytes()
    return found


@pytest.fixture(scope="module")
def local_and_beam(tmp_path_factory, tok_dir, corpus_files):
    out = tmp_path_factory.mktemp("out")
    local = prepare.run(settings(tok_dir, corpus_files, out / "local"))
    beam = prepare.run(settings(tok_dir, corpus_files, out / "beam", runner="DirectRunner"))
    return out, local, beam


def test_beam_writes_the_local_shards_byte_for_byte(local_and_beam, tok_dir):
    out, local, beam = local_and_beam
    want, got = folder_bytes(str(out / "local")), folder_bytes(str(out / "beam"))
    assert sorted(got) == sorted(want)  # same shard names, manifest, no leftovers
    assert len([n for n in got if n.startswith("train/dataset-")]) > 3  # several shards, 2 files
    for name in want:  # shards and manifests alike
        assert got[name] == want[name], name
    for split in ("train", "validation"):
        a = shards.read_manifest(str(out / "local" / split))
        b = shards.read_manifest(str(out / "beam" / split))
        assert a == b  # counts, stats, fingerprint, arguments
        assert b.tokenizer_fingerprint == tokenizer.fingerprint(tok_dir)
        assert beam.splits[split].tokens == local.splits[split].tokens > 0
        assert beam.splits[split].tokens_dropped == local.splits[split].tokens_dropped < 64
        assert beam.splits[split].samples == local.splits[split].samples


def test_inspect_accepts_beam_shards_and_decodes_text(local_and_beam, tok_dir):
    out, _, _ = local_and_beam
    report = inspect.run(inspect.InspectConfig(path=str(out / "beam"), tokenizer=tok_dir))
    assert report.ok, [s.problems for s in report.splits]
    assert {s.path.rsplit("/", 1)[-1] for s in report.splits} == {"train", "validation"}
    assert all(len(s.decoded[0]) > 100 for s in report.splits)


@pytest.mark.parametrize("pad_remainder", [False, True])
def test_rerun_other_batches_and_padding_give_identical_bytes(
    tmp_path, tok_dir, corpus_files, local_and_beam, pad_remainder
):
    """Another batch size (other bundles and keys) and a rerun over an interrupted folder give the
    same bytes; a padded last block too."""
    out, _, _ = local_and_beam
    cfg = settings(tok_dir, corpus_files, tmp_path / "a", runner="DirectRunner", batch_size=7,
                   pad_remainder=pad_remainder, validation_files=())
    prepare.run(cfg)
    first = folder_bytes(cfg.output)
    # As if interrupted: the driver's progress file, no manifest, a shard missing.
    plan = beam_prepare._plans(cfg, tokenizer.fingerprint(tok_dir))[0]
    preparation.write_progress(plan, preparation.Resume())
    storage.remove(str(tmp_path / "a" / "train" / shards.MANIFEST_NAME))
    storage.remove(str(tmp_path / "a" / "train" / "dataset-0-40.tfrecord"))
    result = prepare.run(cfg)
    assert folder_bytes(cfg.output) == first and result.splits["train"].resumed_at_shard == 0
    local = settings(tok_dir, corpus_files, tmp_path / "l", pad_remainder=pad_remainder,
                     batch_size=7, validation_files=())
    prepare.run(local)
    assert {k: v for k, v in folder_bytes(local.output).items() if "manifest" not in k} == {
        k: v for k, v in first.items() if "manifest" not in k}
    if not pad_remainder:
        assert first["train/dataset-0-40.tfrecord"] == folder_bytes(str(out / "beam"))[
            "train/dataset-0-40.tfrecord"]
    again = prepare.run(cfg)  # complete: nothing to do
    assert again.splits["train"].resumed_at_shard == -1


def test_bad_inputs_are_one_line_errors(tmp_path, tok_dir, corpus_files):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n\n", encoding="utf-8")
    short = tmp_path / "short.txt"
    short.write_text("A few words.\n", encoding="utf-8")
    invalid = tmp_path / "invalid.txt"
    invalid.write_bytes(b"A few words.\n\xff\n")
    cases = [
        ({"runner": "NoSuchRunner"}, "unknown Beam runner 'NoSuchRunner'"),
        ({"runner": "DirectRunner", "train_files": (str(tmp_path / "missing.txt"),)}, "matches no file"),
        ({"runner": "DirectRunner", "beam_options": ("=1",)}, "must look like KEY=VALUE"),
        ({"runner": "DirectRunner", "train_files": (str(empty),)}, "no (non-empty) samples"),
        ({"runner": "DirectRunner", "train_files": (str(short),)}, "fewer than one block"),
        ({"runner": "DirectRunner", "train_files": (str(invalid),)}, "not valid UTF-8 at byte 13"),
    ]
    for i, (kw, message) in enumerate(cases):
        cfg = settings(tok_dir, corpus_files, tmp_path / f"out{i}", validation_files=(), **kw)
        with pytest.raises(TpulmError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
            prepare.run(cfg)
        assert "\n" not in str(err.value)
        assert not list((tmp_path / f"out{i}").glob("*/dataset-*"))  # no shard written


def test_cli_runner_and_beam_options(tmp_path, tok_dir, corpus_files, capsys):
    config_file = tmp_path / "data.toml"
    config_file.write_text(f'[data]\ntokenizer = "{tok_dir}"\nrunner = "DirectRunner"\n'
                           f'beam_options = ["direct_num_workers=1"]\n', encoding="utf-8")
    out = tmp_path / "out"
    code = cli.main(["data", "prepare", "--config", str(config_file), "--output", str(out),
                     "--train-files", corpus_files[2], "--max-length", "64",
                     "--beam-option", "direct_running_mode=in_memory", "--progress", "false"])
    assert code == 0
    assert "train: written" in capsys.readouterr().out
    assert shards.read_manifest(str(out / "train")).records > 0
    assert cli.main(["data", "prepare", "--config", str(config_file), "--output", str(out / "x"),
                     "--train-files", corpus_files[2], "--runner", "Nope"]) == 2
    assert "unknown Beam runner 'Nope'" in capsys.readouterr().err


def test_runner_names_and_options_reach_beam(tmp_path):
    for name in ("DataflowRunner", "FlinkRunner", "SparkRunner", "PortableRunner", "PrismRunner"):
        assert type(beam_prepare.create_runner(name)).__name__ == name
    assert type(beam_prepare.create_runner("DirectRunner")).__name__ == "FnApiRunner"  # in-process
    cfg = PrepareConfig(train_files=("x",), runner="DataflowRunner", beam_options=(
        "project=my-project", "--region=europe-west4", "direct_num_workers=2", "save_main_session"))
    options = beam_prepare.pipeline_options(cfg).get_all_options()
    assert (options["project"], options["region"]) == ("my-project", "europe-west4")
    assert options["direct_num_workers"] == 2 and options["save_main_session"] is True


def test_worker_processes_write_the_local_shards_byte_for_byte(tmp_path, tok_dir, corpus_files):
    """`direct_running_mode=multi_processing`: the steps are pickled and run in two worker
    processes of their own, as on a cluster, and still give the local path's bytes."""
    lines = Path(corpus_files[2]).read_text(encoding="utf-8").splitlines()
    small = tmp_path / "small.txt"
    small.write_text("\n".join(lines[:300]) + "\n", encoding="utf-8")  # a few hundred lines
    base = PrepareConfig(tokenizer=tok_dir, output=str(tmp_path / "local"),
                         train_files=(str(small),), max_length=64, shard_size=20, batch_size=100,
                         progress=False)
    prepare.run(base)
    processes = PrepareConfig(**{**base.__dict__, "output": str(tmp_path / "workers"),
                                 "runner": "DirectRunner", "beam_options": (
                                     "direct_running_mode=multi_processing",
                                     "direct_num_workers=2")})
    result = prepare.run(processes)
    assert result.splits["train"].shards >= 2  # more than one shard, so both workers write
    assert folder_bytes(str(tmp_path / "workers")) == folder_bytes(str(tmp_path / "local"))
