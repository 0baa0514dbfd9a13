"""Test data for training tests: a tokenizer trained on WikiText-2 and shards in the reference schema.

Shards are written exactly as the reference recipe writes them (``tf.train.Example`` with int64
``input_ids`` and ``attention_mask``, files ``dataset-<i>-<n>.tfrecord``, no manifest): each line
tokenized with ``[CLS] ... [SEP]``, all concatenated and cut into blocks of ``max_length``; the
last partial block is padded, so padding is exercised too. No test functions here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from support.models import train_reference_tokenizer


def wikitext_lines(wikitext_dir: Path, split: str = "valid", limit: int | None = None) -> list[str]:
    """Non-empty lines of a WikiText-2 split."""
    lines = [
        ln.strip() for ln in (wikitext_dir / f"{split}.txt").read_text(encoding="utf-8").splitlines()
    ]
    lines = [ln for ln in lines if ln]
    return lines[:limit] if limit else lines


def make_tokenizer(out_dir: Path, lines: list[str], vocab_size: int = 1000) -> Path:
    """Train the reference recipe's Unigram tokenizer and save it as a tokenizer folder."""
    return train_reference_tokenizer(lines, out_dir, vocab_size)


def blocks(tokenizer_dir: Path, lines: list[str], max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask), each (n, max_length): lines packed into blocks."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    ids = np.concatenate([np.asarray(e.ids) for e in tok.encode_batch(lines)])
    n_full, rest = divmod(len(ids), max_length)
    pad = tok.token_to_id("<pad>")
    padded = np.concatenate([ids, np.full(max_length - rest, pad)]) if rest else ids
    input_ids = padded.reshape(-1, max_length).astype(np.int64)
    mask = np.ones_like(input_ids)
    if rest:
        mask[-1, rest:] = 0
    return input_ids, mask


def write_shards(
    split_dir: Path, input_ids: np.ndarray, attention_mask: np.ndarray, num_shards: int
) -> list[Path]:
    """Write blocks into ``num_shards`` reference-schema TFRecord files (no manifest)."""
    import tensorflow as tf

    split_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, rows in enumerate(np.array_split(np.arange(len(input_ids)), num_shards)):
        path = split_dir / f"dataset-{index}-{len(rows)}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as writer:
            for r in rows:
                feature = {
                    name: tf.train.Feature(int64_list=tf.train.Int64List(value=values[r].tolist()))
                    for name, values in (("input_ids", input_ids), ("attention_mask", attention_mask))
                }
                writer.write(
                    tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
                )
        paths.append(path)
    return paths


def small_corpus(out: Path, wikitext_dir: Path, max_length: int = 32, train_lines: int = 120,
                 valid_lines: int = 40, vocab_size: int = 500) -> dict[str, Path]:
    """Tokenizer + train (3 shards) and valid (2 shards) splits of real WikiText-2 text."""
    tok = make_tokenizer(out / "tokenizer", wikitext_lines(wikitext_dir, "valid", 2000), vocab_size)
    ids, mask = blocks(tok, wikitext_lines(wikitext_dir, "valid", train_lines), max_length)
    write_shards(out / "train", ids, mask, 3)
    ids, mask = blocks(tok, wikitext_lines(wikitext_dir, "test", valid_lines), max_length)
    write_shards(out / "valid", ids, mask, 2)
    return {"tokenizer": tok, "train": out / "train", "valid": out / "valid"}


def train_command(corpus: dict, run_dir: Path, steps: int, every: int) -> list[str]:
    """A ``tpulm train`` command line: tiny model, one log line a step, checkpoints every ``every``."""
    import sys

    return [
        sys.executable, "-m", "tpulm", "train", "--model", "tiny",
        "--train-data", str(corpus["train"]), "--eval-data", str(corpus["valid"]),
        "--tokenizer", str(corpus["tokenizer"]), "--run-dir", str(run_dir),
        "--batch-size", "8", "--max-steps", str(steps), "--checkpoint-every", str(every),
        "--keep-checkpoints", "5", "--log-every", "1", "--eval-every", "15",
        "--learning-rate", "1e-3", "--progress", "false", "--peak-tflops", "1",
    ]


def subprocess_env() -> dict:
    """This process's environment, with its import path (so subprocesses import this tree)."""
    import os
    import sys

    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def logged_train_steps(run_dir: Path) -> list[int]:
    """Steps of the train lines in ``metrics.jsonl`` so far (a line being written is skipped)."""
    import json

    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record["split"] == "train":
            steps.append(record["step"])
    return steps


def comparable_metrics(run_dir: Path) -> list[dict]:
    """``metrics.jsonl`` lines without their timings (which differ between runs)."""
    import json

    drop = {"time", "tokens_per_second"}
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in x.items() if k not in drop} for x in lines]
