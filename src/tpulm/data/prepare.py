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

import dataclasses
import itertools
import json
import logging
import queue
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from tpulm import config, storage
from tpulm.data import corpus, shards, tokenizer
from tpulm.errors import TpulmError

log = logging.getLogger(__name__)

PROGRESS_NAME = "prepare-progress.json"
MAX_LENGTH_RANGE = (2, 65536)
SPLITS = ("train", "validation", "test")


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
    """Settings of ``tpulm data prepare`` (TOML table ``[data]``)."""

    tokenizer: str = config.setting("tokenizer", "tokenizer folder (from `tpulm tokenizer train`)")
    output: str = config.setting("data", "output folder; one sub-folder per split (local or gs://)")
    train_files: tuple[str, ...] = config.setting((), "files/globs of the train split")
    validation_files: tuple[str, ...] = config.setting((), "files/globs of the validation split")
    test_files: tuple[str, ...] = config.setting((), "files/globs of the test split")
    dataset: str | None = config.setting(None, "🤗 datasets name to stream instead of files")
    dataset_config: str | None = config.setting(None, "🤗 dataset config, e.g. wikitext-2-raw-v1")
    dataset_splits: tuple[str, ...] = config.setting(SPLITS, "🤗 dataset splits to prepare")
    text_field: str = config.setting("text", "field holding the text in .jsonl/.parquet/datasets")
    encoding_errors: str = config.setting(
        "strict", "invalid UTF-8: strict (error) or replace", choices=corpus.ENCODING_ERRORS
    )
    max_length: int = config.setting(128, "tokens per block")
    shard_size: int = config.setting(1000, "records (blocks) per shard")
    batch_size: int = config.setting(1000, "samples tokenized per batch")
    keep_empty: bool = config.setting(
        False, "keep empty lines (reference behaviour: each adds a [CLS][SEP] pair)"
    )
    pad_remainder: bool = config.setting(
        False, "pad the final partial block (attention_mask 0) instead of dropping it"
    )
    progress: bool = config.setting(True, "show a progress bar")

    def __post_init__(self) -> None:
        low, high = MAX_LENGTH_RANGE
        if not low <= self.max_length <= high:
            raise TpulmError(f"max_length {self.max_length} is out of range [{low}, {high}]")
        if self.shard_size < 1 or self.batch_size < 1:
            raise TpulmError("shard_size and batch_size must be >= 1")

    def sources(self) -> dict[str, corpus.Source]:
        """Split name -> where its samples come from."""
        common = dict(text_field=self.text_field, encoding_errors=self.encoding_errors)
        files = {
            "train": self.train_files,
            "validation": self.validation_files,
            "test": self.test_files,
        }
        files = {split: patterns for split, patterns in files.items() if patterns}
        if files and self.dataset:
            raise TpulmError("give either split files (--train-files ...) or --dataset, not both")
        if files:
            return {split: corpus.Source(files=p, **common) for split, p in files.items()}
        if self.dataset:
            return {
                split: corpus.Source(
                    dataset=self.dataset, dataset_config=self.dataset_config, split=split, **common
                )
                for split in self.dataset_splits
            }
        raise TpulmError("no input: pass --train-files (and/or validation/test files) or --dataset")


@dataclasses.dataclass(frozen=True)
class SplitSummary:
    """Counts of one prepared split (whole split, including shards of an earlier, resumed run)."""

    split: str
    path: str
    samples: int
    tokens: int  # tokens of all samples, i.e. the length of the packed stream
    blocks: int
    shards: int
    tokens_dropped: int  # the final remainder (0 with pad_remainder)
    seconds: float  # this run only
    tokens_per_second: float  # tokens tokenized and written by this run / seconds
    resumed_at_shard: int  # 0 for a fresh run; -1 when the split was already complete


@dataclasses.dataclass(frozen=True)
class PrepareResult:
    output: str
    splits: dict[str, SplitSummary]


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Everything fixed for one split: where, what, and the identity a rerun must match."""

    split: str
    split_dir: str
    source: corpus.Source
    identity: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class _Resume:
    """Where a split continues: after ``shards`` full shards, at sample ``next_sample`` of which
    the first ``skip_tokens`` tokens are already in those shards."""

    shards: int = 0
    next_sample: int = 0
    skip_tokens: int = 0


# ---------------------------------------------------------------------------------------------
# Identity checks and resume


def _identity(cfg: PrepareConfig, source: corpus.Source, fp: str) -> dict[str, Any]:
    """Settings that decide the shards' bytes. encoding_errors is not among them: a prefix that
    decoded strictly decodes identically with 'replace', so switching it may resume a run."""
    return {
        "tokenizer_fingerprint": fp,
        "max_length": cfg.max_length,
        "shard_size": cfg.shard_size,
        "source": source.describe(),
        "keep_empty": cfg.keep_empty,
        "pad_remainder": cfg.pad_remainder,
    }


def _mismatch(found: dict[str, Any], wanted: dict[str, Any], split_dir: str) -> str | None:
    """A message saying how an existing split folder differs from this run, or None."""
    if found.get("tokenizer_fingerprint") != wanted["tokenizer_fingerprint"]:
        what = (
            f"from another tokenizer (fingerprint {str(found.get('tokenizer_fingerprint'))[:12]}…, "
            f"this one {wanted['tokenizer_fingerprint'][:12]}…)"
        )
    elif found.get("max_length") != wanted["max_length"]:
        what = f"with max_length {found.get('max_length')} (this run: {wanted['max_length']})"
    else:
        keys = sorted(k for k in wanted if found.get(k) != wanted[k])
        if not keys:
            return None
        what = "with other settings (" + ", ".join(f"{k}: {found.get(k)!r}" for k in keys) + ")"
    return f"{split_dir} holds shards {what}; choose another --output or delete that folder"


def _read_json(path: str) -> dict[str, Any]:
    try:
        return json.loads(storage.read_text(path))
    except ValueError as err:
        raise TpulmError(f"{path} is not valid JSON ({err}); delete the folder and rerun") from None


def _check_existing(plan: _Plan) -> _Resume | shards.Manifest:
    """The finished manifest, or where to resume; an error for a folder of other shards."""
    if not storage.isdir(plan.split_dir):
        return _Resume()
    manifest = shards.read_manifest(plan.split_dir)
    if manifest is not None:
        found = {**manifest.arguments, "tokenizer_fingerprint": manifest.tokenizer_fingerprint,
                 "max_length": manifest.max_length}
        problem = _mismatch(found, plan.identity, plan.split_dir)
        if problem:
            raise TpulmError(problem)
        return manifest
    progress_path = storage.join(plan.split_dir, PROGRESS_NAME)
    existing = shards.list_shards(plan.split_dir)
    if not storage.exists(progress_path):
        if existing:
            raise TpulmError(
                f"{plan.split_dir} holds shards of unknown origin (no manifest.json); "
                "choose another --output or delete that folder"
            )
        return _Resume()
    progress = _read_json(progress_path)
    problem = _mismatch(progress.get("identity", {}), plan.identity, plan.split_dir)
    if problem:
        raise TpulmError(problem)
    try:
        resume = _Resume(**progress["resume"])
    except (KeyError, TypeError):
        raise TpulmError(f"{progress_path} is damaged; delete the folder and rerun") from None
    names = {p.rsplit("/", 1)[-1] for p in existing}
    full = [shards.shard_name(i, plan.identity["shard_size"]) for i in range(resume.shards)]
    if not names.issuperset(full):  # a finished shard was deleted by hand: start over
        log.warning("%s: finished shards are missing; preparing the split again", plan.split_dir)
        return _Resume()
    return resume


def _write_progress(plan: _Plan, resume: _Resume) -> None:
    """Record the identity and the latest resume point (small: rewritten after every shard)."""
    state = {"identity": plan.identity, "resume": dataclasses.asdict(resume)}
    text = json.dumps(state, indent=1, sort_keys=True)
    storage.write_text(storage.join(plan.split_dir, PROGRESS_NAME), text + "\n")


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


def _flatten(encodings: list) -> tuple[np.ndarray, np.ndarray]:
    """Ids of a batch as one int64 stream (tokens,) and the per-sample token counts (samples,)."""
    ids = [e.ids for e in encodings]
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), np.int64, int(lengths.sum()))
    return flat, lengths


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

    def __init__(self, plan: _Plan, cfg: PrepareConfig, resume: _Resume, pad_id: int):
        self.plan, self.cfg, self.pad_id = plan, cfg, pad_id
        self.block_tokens = cfg.shard_size * cfg.max_length  # tokens per full shard
        self.done = [  # infos of the finished shards; full ones are all alike
            shards.ShardInfo(shards.shard_name(i, cfg.shard_size), cfg.shard_size, self.block_tokens)
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
            _write_progress(self.plan, _Resume())

    def add(self, encodings: list) -> int:
        """Pack one batch; returns the number of tokens it added to the stream."""
        flat, lengths = _flatten(encodings)
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
        _write_progress(self.plan, _Resume(len(self.done), self.sample + used, skip))

    def finish(self) -> int:
        """Write the last (partial) shard; returns the tokens dropped."""
        dropped = len(self.carry)
        self.writer.after_rename = self._record_last  # no resume point needed after this
        if self.cfg.pad_remainder and dropped:
            block = np.full((1, self.cfg.max_length), self.pad_id, np.int64)
            mask = np.zeros_like(block)
            block[0, :dropped], mask[0, :dropped] = self.carry, 1
            self.writer.add(block, mask)
            dropped = 0
        self.writer.close()
        return dropped

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


def _pack_all(plan: _Plan, cfg: PrepareConfig, tok, resume: _Resume, pad_id: int):
    """Run the packer over the split's remaining samples; returns (packer, tokens dropped,
    tokens added by this run)."""
    packer = _Packer(plan, cfg, resume, pad_id)
    added = 0
    bar = _progress_bar(cfg, plan.split)
    try:
        for encodings in _batches(tok, plan.source, cfg, resume.next_sample):
            n = packer.add(encodings)
            added += n
            bar.update(n)
        dropped = packer.finish()
    except BaseException:
        packer.writer.abort()
        raise
    finally:
        bar.close()
    return packer, dropped, added


def _manifest(plan: _Plan, cfg: PrepareConfig, packer: _Packer, vocab_size: int, dropped: int):
    keys = ("tokenizer_fingerprint", "max_length")
    arguments = {k: v for k, v in plan.identity.items() if k not in keys}
    arguments.update(tokenizer=cfg.tokenizer, batch_size=cfg.batch_size,
                     encoding_errors=cfg.encoding_errors)
    return shards.Manifest(
        tokenizer_fingerprint=plan.identity["tokenizer_fingerprint"],
        vocab_size=vocab_size,
        max_length=cfg.max_length,
        shards=tuple(packer.done),
        source=plan.source.describe(),
        arguments=arguments,
        stats={"samples": packer.sample, "tokens": packer.pos, "tokens_dropped": dropped},
    )


def prepare_split(plan: _Plan, cfg: PrepareConfig, tok, pad_id: int, vocab_size: int) -> SplitSummary:
    """Prepare (or finish preparing) one split folder and write its manifest last."""
    state = _check_existing(plan)
    if isinstance(state, shards.Manifest):
        log.info("%s is already complete; nothing to do", plan.split_dir)
        return _summary(plan, state, seconds=0.0, added=0, resumed=-1)
    if storage.isdir(plan.split_dir):
        shards.remove_temporaries(plan.split_dir)
        for path in shards.list_shards(plan.split_dir)[state.shards :]:
            storage.remove(path)  # after the resume point: rewritten below, byte for byte
    if state.shards:
        log.info("%s: resuming after %d finished shards", plan.split_dir, state.shards)
    start = time.perf_counter()
    packer, dropped, added = _pack_all(plan, cfg, tok, state, pad_id)
    if packer.pos == 0:
        raise TpulmError(f"no (non-empty) samples in {_where(plan.source)}; check the input")
    if not packer.done:
        raise TpulmError(
            f"{_where(plan.source)} has {packer.pos} tokens, fewer than one block of max_length "
            f"{cfg.max_length}; lower --max-length or pass --pad-remainder"
        )
    manifest = _manifest(plan, cfg, packer, vocab_size, dropped)
    shards.write_manifest(plan.split_dir, manifest)
    progress = storage.join(plan.split_dir, PROGRESS_NAME)
    if storage.exists(progress):
        storage.remove(progress)
    seconds = time.perf_counter() - start
    return _summary(plan, manifest, seconds, added, resumed=state.shards)


def _where(source: corpus.Source) -> str:
    described = source.describe()
    if "files" in described:
        return ", ".join(described["files"])
    return "/".join(str(described[k]) for k in ("dataset", "config", "split") if described[k])


def _summary(plan: _Plan, manifest: shards.Manifest, seconds: float, added: int, resumed: int):
    stats = manifest.stats
    return SplitSummary(
        split=plan.split,
        path=plan.split_dir,
        samples=stats.get("samples", 0),
        tokens=stats.get("tokens", 0),
        blocks=manifest.records,
        shards=len(manifest.shards),
        tokens_dropped=stats.get("tokens_dropped", 0),
        seconds=seconds,
        tokens_per_second=added / seconds if seconds > 0 else 0.0,
        resumed_at_shard=resumed,
    )


def run(cfg: PrepareConfig) -> PrepareResult:
    """Tokenize and pack every split ``cfg`` names into ``cfg.output/<split>/``.

    Args:
        cfg: the resolved settings.

    Returns:
        A :class:`PrepareResult` with one :class:`SplitSummary` per split.
    """
    sources = cfg.sources()
    for source in sources.values():
        if source.files:
            corpus.resolve_files(source.files)  # a missing input fails before anything is written
    folder = tokenizer.open_folder(cfg.tokenizer)
    tok, specials, fp, vocab_size = folder.tokenizer, folder.special, folder.fingerprint, folder.vocab_size
    tok.no_truncation()  # a saved truncation/padding setting would cut or pad samples
    tok.no_padding()
    summaries = {}
    for split, source in sources.items():
        plan = _Plan(split, storage.join(cfg.output, split), source, _identity(cfg, source, fp))
        summaries[split] = prepare_split(plan, cfg, tok, specials.pad_id, vocab_size)
    return PrepareResult(output=cfg.output, splits=summaries)
