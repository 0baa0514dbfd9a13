"""`tpulm data prepare` on Apache Beam's DirectRunner versus the single-machine path, tokens/s.

The corpus is WikiText-2 (valid + test: ../shared/data/wikitext-2 where present, else the
repository's tests/data/wikitext-2, see bench_data.py), or with ``--builtin`` the built-in corpus
(``tpulm.data.builtin_corpus``, Python's own docstrings); the script says which. The text is
split into ``--files`` files of about ``--mb`` MB in total (Beam spreads work per file). Both
paths write the same shards (checked each round, byte for byte); rounds alternate local and Beam
(the machine is shared), and the median wall time gives tokens/s. The machine's load average is
printed before and after. Usage: ``.venv/bin/python benchmarks/prepare_beam.py [--mb 10] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
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

from tpulm import storage
from tpulm.data import builtin_corpus, prepare, shards, tokenizer

MAX_LENGTH, SHARD_SIZE, BATCH = 128, 1000, 1000


def corpus_text(builtin: bool) -> tuple[str, str]:
    """(name, text) of the benchmark corpus."""
    if not builtin:
        wikitext = bench_data.wikitext_dir()
        text = "".join((wikitext / f"{split}.txt").read_text(encoding="utf-8")
                       for split in ("valid", "test"))
        return f"WikiText-2 valid+test ({wikitext})", text
    return "the built-in corpus (tpulm.data.builtin_corpus)", "".join(f"{line}\n" for line in builtin_corpus.demo_lines())


def write_files(folder: Path, text: str, megabytes: float, files: int) -> list[str]:
    """``files`` files holding ``text`` repeated to about ``megabytes`` MB, cut at line ends."""
    copies = max(1, round(megabytes * 1e6 / len(text.encode("utf-8"))))
    lines = (text * copies).splitlines(keepends=True)
    per = -(-len(lines) // files)
    paths = []
    for i in range(files):
        path = folder / f"part-{i:03d}.txt"
        path.write_text("".join(lines[i * per : (i + 1) * per]), encoding="utf-8")
        paths.append(str(path))
    return paths


def run_once(tok_dir: str, files: list[str], out: Path, runner: str | None) -> tuple[float, int]:
    cfg = prepare.PrepareConfig(tokenizer=tok_dir, output=str(out), train_files=tuple(files), runner=runner,
                                max_length=MAX_LENGTH, shard_size=SHARD_SIZE, batch_size=BATCH, progress=False)
    start = time.perf_counter()
    summary = prepare.run(cfg).splits["train"]
    return time.perf_counter() - start, summary.tokens


def shard_bytes(out: Path) -> list[bytes]:
    return [storage.read_bytes(p) for p in shards.list_shards(str(out / "train"))]


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=10.0, help="corpus size in MB")
    parser.add_argument("--files", type=int, default=8, help="files the corpus is split into")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--builtin", action="store_true",
                        help="the built-in corpus instead of WikiText-2")
    args = parser.parse_args()
    import apache_beam  # noqa: F401  - imported once up front, not timed
    import tensorflow  # noqa: F401

    print(f"load average (1/5/15 min) before: {load()}; {os.cpu_count()} cores")
    name, text = corpus_text(args.builtin)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        files = write_files(tmp, text, args.mb, args.files)
        tok_dir = str(tmp / "tok")
        tokenizer.run(tokenizer.TokenizerConfig(inputs=tuple(files[:1]), output=tok_dir,
                                                vocab_size=args.vocab_size, unk_rate_samples=1))
        size = sum(Path(f).stat().st_size for f in files) / 1e6
        print(f"corpus: {name}, {size:.1f} MB in {len(files)} files; vocab {args.vocab_size}")
        walls: dict[str, list[float]] = {"local": [], "beam DirectRunner": []}
        tokens = 0
        for r in range(args.rounds):
            for label, runner in (("local", None), ("beam DirectRunner", "DirectRunner")):
                seconds, tokens = run_once(tok_dir, files, tmp / f"{r}-{runner}", runner)
                walls[label].append(seconds)
            same = shard_bytes(tmp / f"{r}-None") == shard_bytes(tmp / f"{r}-DirectRunner")
            print(f"round {r}: local {walls['local'][-1]:.2f} s, beam {walls['beam DirectRunner'][-1]:.2f} s, "
                  f"identical shards: {same}")
        rates = {label: tokens / statistics.median(w) for label, w in walls.items()}
        for label, rate in rates.items():
            print(f"{label:18s} median {rate:>10,.0f} tokens/s  best {tokens / min(walls[label]):>10,.0f}"
                  f"  (walls: {', '.join(f'{w:.2f}' for w in walls[label])} s)")
        best = min(walls["beam DirectRunner"]) / min(walls["local"])
        print(f"{tokens:,} tokens per run; local / beam: {rates['local'] / rates['beam DirectRunner']:.2f}x "
              f"(median), {best:.2f}x (best)")
    print(f"load average after: {load()}")


if __name__ == "__main__":
    main()
