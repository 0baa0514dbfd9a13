"""Tokenize a corpus and pack it into fixed-length blocks in TFRecord shards (`tpulm data prepare`).

Per split, samples are tokenized in batches by the Rust tokenizer (all cores, GIL released) in a
reader thread, while the calling thread concatenates the per-sample ids (each already
``[CLS] ... [SEP]``) into one stream, cuts it into ``max_length`` blocks and writes shards. Only the
stream's final remainder (< ``max_length`` tokens) is dropped, or padded with ``attention_mask``
0 under ``pad_remainder``.

Interruption and resume: shards are renamed into place when complete, and after each one a
progress file records where in the corpus its last token came from (sample index + tokens of that
sample already used). A rerun with the same settings continues after the last recorded shard and
rewrites anything later with identical bytes; the manifest is written last.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from tpulm import lock, storage
from tpulm.data import corpus, preparation, shards
from tpulm.data.preparation import PrepareConfig

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Tokenizing (reader thread) and packing (calling thread)


_DONE = object()


def _tokenize(tok, batches: Iterator[list[str]], out: queue.Queue, stop: threading.Event) -> None:
    """Reader thread: put the encodings of each batch, then _DONE, or the exception raised.

    ``encode_batch_fast`` (no character offsets, which packing never needs) runs in Rust on all
    cores without the GIL, so it overlaps with packing and writing in the calling thread.
    """

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    try:
        for batch in batches:
            if not put(tok.encode_batch_fast(batch)):
                return
        put(_DONE)
    except BaseException as err:  # noqa: BLE001 - handed to the calling thread, raised there
        put(err)


def _batches(tok, source: corpus.Source, cfg: PrepareConfig, start: int) -> Iterator[list]:
    """Encodings per batch, tokenized ahead in a thread (at most 4 batches in flight)."""
    batches = corpus.iter_batches(source, cfg.batch_size, keep_empty=cfg.keep_empty, start=start)
    out: queue.Queue = queue.Queue(maxsize=4)
    stop = threading.Event()
    thread = threading.Thread(target=_tokenize, args=(tok, batches, out, stop), daemon=True)
    thread.start()
    try:
        while (item := out.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


class _Packer:
    """Cuts the token stream into blocks, writes them, and records resume points per shard.

    Positions are offsets in the split's whole token stream; ``pos`` is where the next batch
    starts, counting the skipped tokens of a resumed sample.
    """

    def __init__(self, plan: preparation.SplitPlan, cfg: PrepareConfig, resume: preparation.Resume, pad_id: int):
        self.plan, self.cfg, self.pad_id = plan, cfg, pad_id
        self.block_tokens = cfg.shard_size * cfg.max_length  # tokens per full shard
        self.done = [  # infos of the finished shards; full ones are all alike
            shards.finished_shard(plan.split_dir, i, cfg.shard_size, self.block_tokens)
            for i in range(resume.shards)
        ]
        self.sample = resume.next_sample  # index of the next batch's first sample
        self.pos = resume.shards * self.block_tokens - resume.skip_tokens
        self.skip = resume.skip_tokens
        self.carry = np.zeros(0, np.int64)  # (< max_length,) tokens waiting for a block
        self.writer = shards.ShardWriter(plan.split_dir, cfg.shard_size, first_index=len(self.done))
        self.writer.before_rename = self._save_identity
        self.writer.after_rename = self._record
        self._lengths = np.zeros(0, np.int64)  # (samples,) token counts of the current batch

    def _save_identity(self) -> None:
        if not self.done:  # before the first shard is renamed into place
            preparation.write_progress(self.plan, preparation.Resume())

    def add(self, encodings: list) -> int:
        """Pack one batch; returns the number of tokens it added to the stream."""
        flat, lengths = preparation.flatten(encodings)
        stream = np.concatenate([self.carry, flat[self.skip :]])
        n = len(stream) // self.cfg.max_length
        blocks = stream[: n * self.cfg.max_length].reshape(n, self.cfg.max_length)
        self.carry = stream[n * self.cfg.max_length :].copy()
        self._lengths = lengths
        self.writer.add(blocks, np.ones_like(blocks))  # calls _record per finished shard
        self.sample += len(lengths)
        self.pos += int(lengths.sum())
        added = len(flat) - self.skip
        self.skip = 0
        return added

    def _record(self, info: shards.ShardInfo) -> None:
        """Note where the stream stands at the end of a shard just renamed into place; a full
        shard ends in the current batch."""
        end = len(self.done) + 1
        offset = end * self.block_tokens - self.pos  # into this batch, in (0, batch tokens]
        cum = np.cumsum(self._lengths)
        used = int(np.searchsorted(cum, offset, side="right"))  # samples wholly in the shards
        skip = offset - (int(cum[used - 1]) if used else 0)
        self.done.append(info)
        preparation.write_progress(self.plan, preparation.Resume(len(self.done), self.sample + used, skip))

    def finish(self) -> None:
        """Write the last (partial) shard, with the remainder padded under ``pad_remainder``."""
        self.writer.after_rename = self._record_last  # no resume point needed after this
        if self.cfg.pad_remainder and len(self.carry):
            self.writer.add(*preparation.pad_block(self.carry, self.cfg.max_length, self.pad_id))
        self.writer.close()

    def _record_last(self, info: shards.ShardInfo) -> None:
        self.done.append(info)


# ---------------------------------------------------------------------------------------------
# One split, all splits


def _progress_bar(cfg: PrepareConfig, split: str):
    from tqdm import tqdm

    try:  # a terminal reporting no size (0 x 0) makes tqdm draw blank lines instead of a bar
        sized = os.get_terminal_size(sys.stderr.fileno()).columns > 0
    except (OSError, ValueError, AttributeError):
        sized = False
    return tqdm(desc=split, unit="tok", unit_scale=True, file=sys.stderr,
                disable=None if cfg.progress else True, dynamic_ncols=sized,
                ncols=None if sized else 80, nrows=None if sized else 24)


def _pack_all(plan: preparation.SplitPlan, cfg: PrepareConfig, tok, resume: preparation.Resume, pad_id: int):
    """Run the packer over the split's remaining samples; returns (packer, tokens added by this
    run)."""
    packer = _Packer(plan, cfg, resume, pad_id)
    added = 0
    bar = _progress_bar(cfg, plan.split)
    try:
        for encodings in _batches(tok, plan.source, cfg, resume.next_sample):
            n = packer.add(encodings)
            added += n
            bar.update(n)
        packer.finish()
    except BaseException:
        packer.writer.abort()
        raise
    finally:
        bar.close()
    return packer, added


def prepare_split(plan: preparation.SplitPlan, cfg: PrepareConfig, tok, pad_id: int,
                  vocab_size: int) -> preparation.SplitSummary:
    """Prepare (or finish preparing) one split folder and write its manifest last."""
    state = preparation.reopen(plan, resume=True)
    if isinstance(state, shards.Manifest):
        log.info("%s is already complete; nothing to do", plan.split_dir)
        return preparation.summary(plan, state, seconds=0.0, added=0, resumed=-1)
    if state.shards:
        log.info("%s: resuming after %d finished shards", plan.split_dir, state.shards)
    start = time.perf_counter()
    packer, added = _pack_all(plan, cfg, tok, state, pad_id)
    manifest = preparation.finish_split(plan, cfg, packer.done, packer.sample, packer.pos,
                                        vocab_size)
    seconds = time.perf_counter() - start
    return preparation.summary(plan, manifest, seconds, added, resumed=state.shards)


def check_paths(cfg: PrepareConfig) -> None:
    """The tokenizer and the output can be reached (and written): fail in seconds, not after
    tokenizing a corpus."""
    storage.check_reachable(cfg.tokenizer, "--tokenizer")
    storage.check_reachable(cfg.output, "--output", write=True)


def run(cfg: PrepareConfig) -> preparation.PrepareResult:
    """Tokenize and pack every split ``cfg`` names into ``cfg.output/<split>/``, holding the
    output's lock (:mod:`tpulm.lock`): one prepare per output, or its shards would mix.

    Args:
        cfg: the resolved settings.

    Returns:
        A :class:`preparation.PrepareResult` with one :class:`preparation.SplitSummary` per split.
    """
    check_paths(cfg)
    with lock.hold(cfg.output, "tpulm data prepare"):
        return _prepare(cfg)


def _prepare(cfg: PrepareConfig) -> preparation.PrepareResult:
    if cfg.runner:
        from tpulm.data import beam

        return beam.run(cfg)
    folder = preparation.packing_tokenizer(cfg.tokenizer)
    summaries = {}
    for plan in preparation.plan_splits(cfg, folder.fingerprint):
        summaries[plan.split] = prepare_split(plan, cfg, folder.tokenizer, folder.special.pad_id,
                                              folder.vocab_size)
    return preparation.PrepareResult(output=cfg.output, splits=summaries)
