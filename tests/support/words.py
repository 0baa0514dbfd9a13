"""Helpers for the whole-word and document tests (no tests here): real text from the built-in
demo corpus (CPython's own docstrings: no download, nothing beside the repository) and tokenizers trained on it."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from tpulm.data import builtin_corpus, tokenizer

FAMILIES = ("unigram", "bpe", "wordpiece")


def demo_lines(texts: int = 5000) -> list[str]:
    """Prose lines from the first ``texts`` documentation strings of the demo corpus (~1.5 s)."""
    return builtin_corpus.prose_lines(itertools.islice(builtin_corpus.source_texts(), texts))


def train_family(out: Path, lines: list[str], family: str, vocab_size: int = 1000) -> str:
    """Train one of tpulm's tokenizer recipes on ``lines``; returns the tokenizer folder."""
    text = out / "corpus.txt"
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    folder = str(out / family)
    tokenizer.run(tokenizer.TokenizerConfig(
        inputs=(str(text),), output=folder, model=family, vocab_size=vocab_size,
        unk_rate_samples=100))
    return folder


def packed_blocks(tok_dir: str, lines: list[str], max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask) int64 (n, max_length): documents concatenated and cut into
    blocks, as ``tpulm data prepare`` writes them; the last block is padded."""
    tok = tokenizer.load_tokenizer(tok_dir)
    pad = tokenizer.special_tokens(tok_dir).pad_id
    ids = np.concatenate([np.asarray(e.ids) for e in tok.encode_batch(lines)])
    rest = -len(ids) % max_length
    mask = np.concatenate([np.ones(len(ids), np.int64), np.zeros(rest, np.int64)])
    ids = np.concatenate([ids, np.full(rest, pad)]).astype(np.int64)
    return ids.reshape(-1, max_length), mask.reshape(-1, max_length)
