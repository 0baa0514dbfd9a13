"""`tpulm data prepare`: exact round trip of real text, schema bytes, ram://, resume, bad input."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tpulm import cli, storage
from tpulm.data import preparation, prepare, shards, tokenizer
from tpulm.data.prepare import PrepareConfig
from tpulm.errors import TpulmError

REPO = Path(__file__).resolve().parents[1]
SPECIAL = re.compile(r"(\[CLS\]|\[SEP\]|<unk>|<pad>|\[MASK\])")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory, wikitext_dir) -> str:
    """The reference Unigram recipe trained on both files prepared below (so no char is unknown)."""
    out = str(tmp_path_factory.mktemp("tok") / "tok")
    files = (str(wikitext_dir / "valid.txt"), str(wikitext_dir / "test.txt"))
    tokenizer.run(tokenizer.TokenizerConfig(inputs=files, output=out, vocab_size=6000, unk_rate_samples=1))
    return out


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tok_dir, wikitext_dir):
    out = str(tmp_path_factory.mktemp("data") / "data")
    cfg = PrepareConfig(
        tokenizer=tok_dir, output=out, train_files=(str(wikitext_dir / "valid.txt"),),
        validation_files=(str(wikitext_dir / "test.txt"),), shard_size=300, progress=False,
    )
    return cfg, prepare.run(cfg)


def nonempty_lines(path) -> list[str]:
    return [line for line in Path(path).read_text(encoding="utf-8").split("\n") if line.strip()]


def read_split(split_dir: str, max_length: int) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """All blocks of a split through tf.data, in shard order, and the records read per file."""
    ids, masks, counts = [], [], {}
    for path in shards.list_shards(split_dir):
        blocks = list(shards.iter_blocks(path, max_length))
        counts[path.rsplit("/", 1)[-1]] = sum(len(b[0]) for b in blocks)
        ids += [b[0] for b in blocks]
        masks += [b[1] for b in blocks]
    return np.concatenate(ids), np.concatenate(masks), counts


def expected_text(line: str) -> str:
    """What the Unigram + Metaspace tokenizer decodes one sample to, special tokens kept.

    Special tokens are matched in the raw text first; each text segment between them is
    normalized (`` and '' -> ") and Metaspace turns spaces into ▁ and prepends one to a segment
    that lacks it; decoding turns every ▁ back into a space. So a segment reads back as itself,
    with one leading space added when it had none. (Only the stream's first token would lose a
    leading space, and that token is [CLS].)
    """
    out = []
    for part in SPECIAL.split(line):
        if SPECIAL.fullmatch(part):
            out.append(part)
        elif part:
            part = part.replace("``", '"').replace("''", '"')
            out.append(part if part.startswith(" ") else " " + part)
    return "[CLS]" + "".join(out) + "[SEP]"


@pytest.mark.parametrize("split, source", [("train", "valid.txt"), ("validation", "test.txt")])
def test_shards_decode_back_to_the_source_text(prepared, tok_dir, wikitext_dir, split, source):
    cfg, result = prepared
    tok = tokenizer.load_tokenizer(tok_dir)
    lines = nonempty_lines(wikitext_dir / source)
    stream = [i for line in lines for i in tok.encode(line).ids]  # each [CLS] ... [SEP]
    ids, masks, counts = read_split(f"{cfg.output}/{split}", cfg.max_length)
    # Counts in file names equal the records in the files; shards are full but the last.
    assert counts == {shards.shard_name(i, n): n for i, n in enumerate(counts.values())}
    assert set(list(counts.values())[:-1]) == {cfg.shard_size}
    # The blocks are the token stream, in order; only the final remainder (< max_length) is missing.
    n = len(stream) // cfg.max_length
    assert ids.shape == (n, cfg.max_length) and masks.all()
    assert ids.ravel().tolist() == stream[: n * cfg.max_length]
    summary = result.splits[split]
    assert (summary.samples, summary.tokens, summary.blocks) == (len(lines), len(stream), n)
    assert summary.tokens_dropped == len(stream) - n * cfg.max_length < cfg.max_length
    assert summary.shards == len(counts) == -(-n // cfg.shard_size)
    # Text: the decoded stream is the normalized source lines; the shards hold all of it but
    # exactly the characters of the dropped tail tokens.
    expected = "".join(expected_text(line) for line in lines)
    assert tok.decode(stream, skip_special_tokens=False) == expected
    decoded = tok.decode(ids.ravel().tolist(), skip_special_tokens=False)
    tail = "".join(tok.id_to_token(i).replace("▁", " ") for i in stream[n * cfg.max_length :])
    assert decoded + tail == expected


def test_manifest_agrees_with_files(prepared, tok_dir):
    cfg, result = prepared
    manifest = shards.read_manifest(f"{cfg.output}/train")
    _, masks, counts = read_split(f"{cfg.output}/train", cfg.max_length)
    assert [(s.file, s.records) for s in manifest.shards] == list(counts.items())
    assert manifest.tokens == masks.sum() == manifest.records * cfg.max_length
    assert manifest.tokenizer_fingerprint == tokenizer.fingerprint(tok_dir)
    assert manifest.vocab_size == tokenizer.load_tokenizer(tok_dir).get_vocab_size()
    assert manifest.max_length == 128 and manifest.arguments["shard_size"] == 300
    assert manifest.source == {"files": [cfg.train_files[0]], "text_field": "text"}
    assert manifest.stats["tokens"] == result.splits["train"].tokens
    assert sorted(storage.listdir(f"{cfg.output}/train"))[-1] == "manifest.json"  # no leftovers


def test_records_are_byte_identical_to_protobuf():
    import tensorflow as tf

    rng = np.random.default_rng(0)
    encoder = shards.ExampleEncoder()
    for high in (2, 128, 16384, 50_000, 1 << 35, (1 << 63) - 1):
        ids = rng.integers(0, high, size=(6, 33))
        mask = np.ones_like(ids)
        if high == 50_000:
            mask[-1, 20:] = 0
        if high == 128:  # not a 0/1 mask: must not take the all-ones shortcut
            mask[0, 0] = 2
        for record, row, row_mask in zip(encoder.encode(ids, mask), ids, mask):
            example = tf.train.Example(features=tf.train.Features(feature={
                "input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=row.tolist())),
                "attention_mask": tf.train.Feature(int64_list=tf.train.Int64List(value=row_mask.tolist())),
            }))
            assert record == example.SerializeToString(deterministic=True)


def test_ram_output_is_byte_identical_to_local(prepared, tok_dir):
    cfg, _ = prepared
    ram = "ram://tpulm-test-prepare/out"
    again = prepare.run(PrepareConfig(**{**cfg.__dict__, "output": ram}))
    for split in ("train", "validation"):
        names = storage.listdir(f"{ram}/{split}")
        assert names == storage.listdir(f"{cfg.output}/{split}")
        for name in names:  # same inputs and arguments: same bytes, manifest included
            assert storage.read_bytes(f"{ram}/{split}/{name}") == storage.read_bytes(f"{cfg.output}/{split}/{name}")
    ids, _, _ = read_split(f"{ram}/validation", cfg.max_length)  # tf.data reads ram:// shards
    assert len(ids) == again.splits["validation"].blocks


def small_config(tok_dir: str, corpus: Path, out: Path, **kwargs) -> PrepareConfig:
    # max_length 100 and 7 blocks a shard: shard boundaries fall inside samples.
    return PrepareConfig(tokenizer=tok_dir, output=str(out), train_files=(str(corpus),),
                         max_length=100, shard_size=7, batch_size=50, progress=False, **kwargs)


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory, wikitext_dir) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "small.txt"
    path.write_text("\n".join((wikitext_dir / "valid.txt").read_text(encoding="utf-8").split("\n")[:600]), encoding="utf-8")
    return path


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def crash_on_call(monkeypatch, owner, name: str, call: int) -> None:
    """Make ``owner.name`` raise on its ``call``-th call, as a crash at that point would."""
    original = getattr(owner, name)
    calls = []

    def crashing(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise RuntimeError("simulated crash")
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, crashing)


@pytest.mark.parametrize("where", ["while writing shard 3", "between renaming shard 2 and saving progress"])
def test_resume_after_a_crash_gives_identical_shards(tmp_path, tok_dir, small_corpus, monkeypatch, where):
    clean = tmp_path / "clean"
    prepare.run(small_config(tok_dir, small_corpus, clean))
    crashed = tmp_path / "crashed"
    with monkeypatch.context() as patch:
        if where.startswith("while"):
            crash_on_call(patch, shards.ShardWriter, "_finish", 4)
        else:  # progress is saved once before shard 0 is renamed, then after each shard
            crash_on_call(patch, preparation, "write_progress", 4)
        with pytest.raises(RuntimeError, match="simulated crash"):
            prepare.run(small_config(tok_dir, small_corpus, crashed))
    names = sorted(os.listdir(crashed / "train"))
    assert names == ["dataset-0-7.tfrecord", "dataset-1-7.tfrecord", "dataset-2-7.tfrecord", preparation.PROGRESS_NAME]
    resume = json.loads((crashed / "train" / preparation.PROGRESS_NAME).read_text())["resume"]
    assert resume["shards"] == (3 if where.startswith("while") else 2)
    assert resume["skip_tokens"] > 0  # the boundary lies inside a sample
    result = prepare.run(small_config(tok_dir, small_corpus, crashed))
    assert result.splits["train"].resumed_at_shard == resume["shards"]
    assert files_of(crashed / "train") == files_of(clean / "train")
    again = prepare.run(small_config(tok_dir, small_corpus, crashed))
    assert again.splits["train"].resumed_at_shard == -1  # complete: nothing to do
    assert files_of(crashed / "train") == files_of(clean / "train")


def test_rerun_after_sigkill_finishes_identically(tmp_path, tok_dir, wikitext_dir):
    corpus = tmp_path / "corpus.txt"
    text = (wikitext_dir / "valid.txt").read_text(encoding="utf-8") + (wikitext_dir / "test.txt").read_text(encoding="utf-8")
    corpus.write_text(text * 2, encoding="utf-8")
    killed = tmp_path / "killed"
    args = [sys.executable, "-m", "tpulm", "data", "prepare", "--tokenizer", tok_dir, "--output", str(killed),
            "--train-files", str(corpus), "--max-length", "100", "--shard-size", "40", "--progress", "false"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    progress = killed / "train" / preparation.PROGRESS_NAME

    def finished_shards() -> int:  # the progress file is renamed into place: never half-written
        try:
            return json.loads(progress.read_text())["resume"]["shards"]
        except (FileNotFoundError, ValueError, KeyError):
            return 0

    deadline = time.monotonic() + 120
    while finished_shards() < 1 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "train" / "manifest.json").exists(), "finished before the kill; use more text"
    config = PrepareConfig(tokenizer=tok_dir, output=str(killed), train_files=(str(corpus),),
                           max_length=100, shard_size=40, progress=False)
    result = prepare.run(config)
    clean = tmp_path / "clean"
    prepare.run(PrepareConfig(**{**config.__dict__, "output": str(clean)}))
    assert result.splits["train"].resumed_at_shard >= 1
    assert files_of(killed / "train") == files_of(clean / "train")


def test_pad_remainder_and_keep_empty(tmp_path, tok_dir, small_corpus):
    tok = tokenizer.load_tokenizer(tok_dir)
    raw = small_corpus.read_text(encoding="utf-8").split("\n")
    padded = prepare.run(small_config(tok_dir, small_corpus, tmp_path / "a", pad_remainder=True)).splits["train"]
    stream = [i for line in raw if line.strip() for i in tok.encode(line).ids]
    ids, masks, _ = read_split(str(tmp_path / "a" / "train"), 100)
    rest = len(stream) % 100
    assert rest and padded.tokens_dropped == 0 and padded.blocks == len(stream) // 100 + 1
    assert ids.ravel()[: len(stream)].tolist() == stream
    assert (ids[-1, rest:] == 3).all() and masks[-1].tolist() == [1] * rest + [0] * (100 - rest)
    assert shards.read_manifest(str(tmp_path / "a" / "train")).tokens == len(stream)
    kept = prepare.run(small_config(tok_dir, small_corpus, tmp_path / "b", keep_empty=True)).splits["train"]
    noise = [tok.encode(line).ids for line in raw if not line.strip()]  # [CLS] (▁) [SEP] each
    assert len(noise) > 100 and all(ids[0] == 0 and ids[-1] == 1 and len(ids) <= 3 for ids in noise)
    assert kept.samples == len(raw) and kept.tokens == len(stream) + sum(map(len, noise))
    ids, _, _ = read_split(str(tmp_path / "b" / "train"), 100)
    full = [i for line in raw for i in tok.encode(line).ids]
    assert ids.ravel().tolist() == full[: ids.size]


def test_bad_inputs_are_clear_errors_and_write_nothing(tmp_path, tok_dir, wikitext_dir):
    out = tmp_path / "out"
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n\n", encoding="utf-8")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"A fine line\nbroken \xc3( byte\n")
    short = tmp_path / "short.txt"
    short.write_text("just a few words\n", encoding="utf-8")
    cases = [
        ({"train_files": (str(tmp_path / "missing.txt"),)}, r"missing.txt matches no file"),
        ({"train_files": (str(empty),)}, r"the corpus is empty: no \(non-empty\) samples in .*empty.txt"),
        ({"train_files": (str(bad),)}, r"bad.txt is not valid UTF-8 at byte 19 .*--encoding-errors replace"),
        ({"train_files": (str(short),)}, r"fewer than one block of max_length 128; lower --max-length"),
        ({}, r"no input: pass --train-files"),
    ]
    for kwargs, message in cases:
        with pytest.raises(TpulmError, match=message):
            prepare.run(PrepareConfig(tokenizer=tok_dir, output=str(out), progress=False, **kwargs))
        assert not out.exists()
    fixed = prepare.run(PrepareConfig(tokenizer=tok_dir, output=str(out), train_files=(str(bad),), max_length=4,
                                      encoding_errors="replace", progress=False))
    assert fixed.splits["train"].samples == 2
    for length in (0, 1, 65537):
        with pytest.raises(TpulmError, match=rf"max_length {length} is out of range \[2, 65536\]"):
            PrepareConfig(max_length=length)


def test_tokenizer_without_special_tokens_is_refused(tmp_path, tok_dir, small_corpus):
    broken = tmp_path / "tok"
    broken.mkdir()
    (broken / "tokenizer.json").write_bytes(Path(tok_dir, "tokenizer.json").read_bytes())
    config = json.loads(Path(tok_dir, "tokenizer_config.json").read_text())
    del config["mask_token"]
    (broken / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(TpulmError, match=r"lacks a mask_token .*needs cls, sep, unk, pad and mask"):
        prepare.run(small_config(str(broken), small_corpus, tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_output_with_other_shards_is_refused(tmp_path, tok_dir, small_corpus):
    out = tmp_path / "out"
    prepare.run(small_config(tok_dir, small_corpus, out))
    before = files_of(out / "train")
    other_tok = tmp_path / "other"
    tokenizer.run(tokenizer.TokenizerConfig(inputs=(str(small_corpus),), output=str(other_tok), vocab_size=600, unk_rate_samples=1))
    with pytest.raises(TpulmError, match=r"holds shards from another tokenizer \(fingerprint .*another --output"):
        prepare.run(small_config(str(other_tok), small_corpus, out))
    config = small_config(tok_dir, small_corpus, out)
    with pytest.raises(TpulmError, match=r"holds shards with max_length 100 \(this run: 64\)"):
        prepare.run(PrepareConfig(**{**config.__dict__, "max_length": 64}))
    with pytest.raises(TpulmError, match=r"with other settings \(shard_size: 7\)"):
        prepare.run(PrepareConfig(**{**config.__dict__, "shard_size": 8}))
    (out / "train" / "manifest.json").unlink()  # e.g. shards of the reference recipe
    with pytest.raises(TpulmError, match=r"holds shards of unknown origin"):
        prepare.run(config)
    assert {k: v for k, v in files_of(out / "train").items()} == {k: v for k, v in before.items() if k != "manifest.json"}


def test_cli_prepare_with_config_file(tmp_path, tok_dir, small_corpus, capsys):
    config_file = tmp_path / "run.toml"
    config_file.write_text(
        f'[data]\ntokenizer = "{tok_dir}"\ntrain_files = ["{small_corpus}"]\nmax_length = 64\n'
        f'output = "{tmp_path / "ignored"}"\n', encoding="utf-8")
    out = tmp_path / "out"
    assert cli.main(["data", "prepare", "--config", str(config_file), "--output", str(out),
                     "--shard-size", "50", "--progress", "false"]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"train: written -> .*out/train: \d+ samples, \d+ tokens, \d+ blocks in \d+ shards", printed)
    assert shards.read_manifest(str(out / "train")).max_length == 64
    assert not (tmp_path / "ignored").exists()
    assert cli.main(["data", "prepare", "--config", str(config_file), "--max-length", "1"]) == 2
    assert "max_length 1 is out of range" in capsys.readouterr().err


def test_jsonl_input_with_text_field(tmp_path, tok_dir, small_corpus):
    lines = [l for l in small_corpus.read_text(encoding="utf-8").split("\n") if l.strip()]
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i, "body": l}) + "\n" for i, l in enumerate(lines)), encoding="utf-8")
    from_jsonl = prepare.run(small_config(tok_dir, jsonl, tmp_path / "j", text_field="body"))
    from_text = prepare.run(small_config(tok_dir, small_corpus, tmp_path / "t"))
    assert from_jsonl.splits["train"].samples == from_text.splits["train"].samples == len(lines)
    names = sorted(os.listdir(tmp_path / "t" / "train"))
    for name in names[:-1]:  # shards; the manifests differ in their source only
        assert (tmp_path / "j" / "train" / name).read_bytes() == (tmp_path / "t" / "train" / name).read_bytes()


def test_the_shared_ending_pads_refuses_short_splits_and_writes_the_manifest_last(tmp_path, tok_dir, small_corpus):
    """What the local and the Beam runner both call to end a split (preparation.finish_split)."""
    ids, mask = preparation.pad_block(np.array([5, 6, 7]), 5, pad_id=1)
    assert ids.tolist() == [[5, 6, 7, 1, 1]] and mask.tolist() == [[1, 1, 1, 0, 0]]
    assert ids.dtype == mask.dtype == np.int64
    cfg = small_config(tok_dir, small_corpus, tmp_path / "out")
    plan, = preparation.plan_splits(cfg, tokenizer.fingerprint(tok_dir))
    assert plan.files == (str(small_corpus),)
    with pytest.raises(TpulmError, match=r"no \(non-empty\) samples in .*small.txt"):
        preparation.finish_split(plan, cfg, [], samples=0, tokens=0, vocab_size=600)
    with pytest.raises(TpulmError, match=r"has 99 tokens, fewer than one block of max_length 100"):
        preparation.finish_split(plan, cfg, [], samples=3, tokens=99, vocab_size=600)
    assert not (tmp_path / "out").exists()
    storage.makedirs(plan.split_dir)
    preparation.write_progress(plan, preparation.Resume(), error="stopped")
    assert preparation.recorded_error(plan) == "stopped"
    infos = [shards.ShardInfo(shards.shard_name(i, 7), 7, 700) for i in (1, 0)]  # as Beam gathers
    done = preparation.finish_split(plan, cfg, infos, samples=40, tokens=1450, vocab_size=600)
    assert [s.file for s in done.shards] == [shards.shard_name(0, 7), shards.shard_name(1, 7)]
    assert done.stats == {"samples": 40, "tokens": 1450, "tokens_dropped": 50}
    assert shards.read_manifest(plan.split_dir) == done
    assert os.listdir(plan.split_dir) == [shards.MANIFEST_NAME]  # the progress file is gone
