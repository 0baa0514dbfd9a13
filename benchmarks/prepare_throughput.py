"""Throughput and memory of `tpulm data prepare` versus bare tokenization and the reference recipe.

On WikiText-2 (valid + test; ../shared/data/wikitext-2 where present, else the repository's
tests/data/wikitext-2, see bench_data.py) repeated to about 20 MB, in one run:

* bare ``tokenizers.Tokenizer.encode_batch`` over the same (non-empty) lines, batches of 1000
  (and ``encode_batch_fast``, which tpulm uses, for reference);
* ``tpulm.data.prepare.run`` end to end: read the file, tokenize, pack, write TFRecord shards;
* the reference recipe: 🤗 datasets ``map`` with the transformers tokenizer, list-sum grouping per
  1000-sample batch, Python ``tf.train.Example`` serialisation and ``tf.io.TFRecordWriter``;
* peak RSS of ``tpulm data prepare`` at 1x and 4x the corpus, each in a fresh subprocess.

Bare and tpulm runs alternate ``--repeats`` times (the machine is shared and noisy); the best
wall time of each gives tokens/s (median shown too), and CPU seconds (user + system, all threads)
give a load-insensitive cost ratio. Usage: ``.venv/bin/python benchmarks/prepare_throughput.py [--mb 20] [--vocab-size 32000]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
import bench_data  # noqa: E402

from tpulm.data import prepare, tokenizer  # noqa: E402

MAX_LENGTH, SHARD_SIZE, BATCH = 128, 1000, 1000


def make_corpus(folder: Path, megabytes: float, name: str, wikitext: Path) -> Path:
    text = (wikitext / "valid.txt").read_text(encoding="utf-8") + (wikitext / "test.txt").read_text(encoding="utf-8")
    copies = max(1, round(megabytes * 1e6 / len(text.encode("utf-8"))))
    path = folder / name
    path.write_text(text * copies, encoding="utf-8")
    return path


def cpu_seconds() -> float:
    """User + system CPU time of this process, all threads (the Rust tokenizer's included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def bare(tok, lines: list[str], fast: bool) -> tuple[float, float]:
    """(wall, CPU) seconds of encode_batch(_fast) alone over the lines, in batches of BATCH."""
    encode = tok.encode_batch_fast if fast else tok.encode_batch
    wall, cpu = time.perf_counter(), cpu_seconds()
    for i in range(0, len(lines), BATCH):
        encode(lines[i : i + BATCH])
    return time.perf_counter() - wall, cpu_seconds() - cpu


def tpulm_prepare(tok_dir: str, corpus: Path, out: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of prepare.run end to end (TensorFlow already imported)."""
    cfg = prepare.PrepareConfig(tokenizer=tok_dir, output=str(out), train_files=(str(corpus),),
                                max_length=MAX_LENGTH, shard_size=SHARD_SIZE, batch_size=BATCH, progress=False)
    wall, cpu = time.perf_counter(), cpu_seconds()
    prepare.run(cfg)
    return time.perf_counter() - wall, cpu_seconds() - cpu


def reference_recipe(tok_dir: str, corpus: Path, out: Path, cache: Path) -> tuple[float, int]:
    """The reference prepare_tfrecord_shards.py on the text file (it keeps empty lines)."""
    import datasets
    import tensorflow as tf
    import transformers
    from transformers import AutoTokenizer

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    hf = AutoTokenizer.from_pretrained(tok_dir)
    start = time.perf_counter()
    dataset = datasets.load_dataset("text", data_files=str(corpus), split="train", cache_dir=str(cache))
    tokenized = dataset.map(lambda ex: hf(ex["text"]), batched=True, num_proc=os.cpu_count(), remove_columns=["text"])

    def group_texts(examples):
        concatenated = {k: sum(examples[k], []) for k in examples.keys()}
        total = (len(concatenated["input_ids"]) // MAX_LENGTH) * MAX_LENGTH
        return {k: [t[i : i + MAX_LENGTH] for i in range(0, total, MAX_LENGTH)] for k, t in concatenated.items()}

    grouped = tokenized.map(group_texts, batched=True, batch_size=1000, num_proc=os.cpu_count())
    out.mkdir(parents=True)
    for count, shard in enumerate(range(0, len(grouped), SHARD_SIZE)):
        snapshot = grouped[shard : shard + SHARD_SIZE]
        n = len(snapshot["input_ids"])
        with tf.io.TFRecordWriter(str(out / f"dataset-{count}-{n}.tfrecord")) as writer:
            for i in range(n):
                feature = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=snapshot[k][i]))
                           for k in ("input_ids", "attention_mask")}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    seconds = time.perf_counter() - start
    tokens = sum(len(ids) for ids in tokenized["input_ids"])
    return tokens / seconds, tokens


PEAK_SCRIPT = """
import resource, sys, time
sys.path.insert(0, {src!r})
from tpulm.data import prepare
cfg = prepare.PrepareConfig(tokenizer={tok!r}, output={out!r}, train_files=({corpus!r},),
                            max_length={L}, shard_size={S}, progress=False)
start = time.perf_counter()
s = prepare.run(cfg).splits["train"]
print(s.tokens, time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_rss(tok_dir: str, corpus: Path, out: Path) -> tuple[int, float, float]:
    """(tokens, seconds, peak RSS in MiB) of prepare in a fresh interpreter."""
    code = PEAK_SCRIPT.format(src=str(REPO / "src"), tok=tok_dir, out=str(out), corpus=str(corpus), L=MAX_LENGTH, S=SHARD_SIZE)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    tokens, seconds, rss_kib = result.stdout.split()[-3:]
    return int(tokens), float(seconds), int(rss_kib) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=20.0, help="corpus size in MB")
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-reference", action="store_true")
    args = parser.parse_args()
    import tensorflow  # noqa: F401  - imported once up front, not timed

    wikitext = bench_data.wikitext_dir()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = make_corpus(tmp, args.mb, "corpus.txt", wikitext)
        tok_dir = str(tmp / "tok")
        trained = tokenizer.run(tokenizer.TokenizerConfig(
            inputs=(str(wikitext / "valid.txt"), str(wikitext / "test.txt")), output=tok_dir,
            vocab_size=args.vocab_size, unk_rate_samples=1000))
        print(f"corpus {corpus.stat().st_size / 1e6:.1f} MB; Unigram vocab {trained.vocab_size} "
              f"trained in {trained.seconds:.1f} s; {os.cpu_count()} cores")
        tok = tokenizer.load_tokenizer(tok_dir)
        lines = [l for l in corpus.read_text(encoding="utf-8").split("\n") if l.strip()]
        tokens = sum(len(e) for i in range(0, len(lines), BATCH) for e in tok.encode_batch_fast(lines[i : i + BATCH]))
        runs = {"bare encode_batch": [], "tpulm prepare": [], "bare encode_batch_fast": []}
        for r in range(args.repeats):  # interleaved, so load from other processes hits all alike
            runs["bare encode_batch"].append(bare(tok, lines, fast=False))
            runs["tpulm prepare"].append(tpulm_prepare(tok_dir, corpus, tmp / f"out{r}"))
            runs["bare encode_batch_fast"].append(bare(tok, lines, fast=True))
        print(f"{tokens:,} tokens (non-empty lines) per run, {args.repeats} interleaved runs each")
        best, per_cpu = {}, {}
        for name, times in runs.items():
            best[name] = tokens / min(w for w, _ in times)
            per_cpu[name] = tokens / min(c for _, c in times)
            print(f"{name:24s} best {best[name]:>10,.0f} tokens/s  median {tokens / statistics.median(w for w, _ in times):>10,.0f}"
                  f"  per CPU-second {per_cpu[name]:>10,.0f}  (walls: {', '.join(f'{w:.2f}' for w, _ in times)} s)")
        print(f"ratio tpulm prepare / bare encode_batch: {best['tpulm prepare'] / best['bare encode_batch']:.2f} (best wall), "
              f"{per_cpu['tpulm prepare'] / per_cpu['bare encode_batch']:.2f} (CPU); vs encode_batch_fast: "
              f"{best['tpulm prepare'] / best['bare encode_batch_fast']:.2f} (best wall), "
              f"{per_cpu['tpulm prepare'] / per_cpu['bare encode_batch_fast']:.2f} (CPU)")
        if not args.skip_reference:
            ref_rate, ref_tokens = reference_recipe(tok_dir, corpus, tmp / "ref", tmp / "cache")
            print(f"{'reference recipe':24s} {ref_rate:>12,.0f} tokens/s   ({ref_tokens:,} tokens incl. empty-line noise)")
            print(f"ratio reference / bare encode_batch: {ref_rate / best['bare encode_batch']:.2f}; "
                  f"tpulm prepare / reference: {best['tpulm prepare'] / ref_rate:.1f}x")
        big = make_corpus(tmp, args.mb * 4, "corpus4x.txt", wikitext)
        for label, path in (("1x", corpus), ("4x", big)):
            tokens, seconds, rss = peak_rss(tok_dir, path, tmp / f"rss-{label}")
            print(f"peak RSS prepare {label} ({path.stat().st_size / 1e6:.0f} MB, {tokens:,} tokens, "
                  f"{seconds:.1f} s incl. TensorFlow import): {rss:,.0f} MiB")


if __name__ == "__main__":
    main()
