"""Settings and bookkeeping of `tpulm data prepare`, shared by its local path
(:mod:`tpulm.data.prepare`) and its Beam path (:mod:`tpulm.data.beam`): ``PrepareConfig``, and for
each split its plan, the identity a rerun must match, the resume point and progress file, the
padded last block, and the ending both runners share (the errors for a split too short to fill a
block, the manifest written last, the progress file removed) and the summary.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
from typing import Any

import numpy as np

from tpulm import config, storage
from tpulm.data import corpus, shards, tokenizer
from tpulm.errors import TpulmError

log = logging.getLogger(__name__)

PROGRESS_NAME = "prepare-progress.json"
ERROR_KEY = "error"  # in the progress file: why a run wrote no manifest
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
    runner: str | None = config.setting(
        None, "run as an Apache Beam pipeline on this runner (DirectRunner, DataflowRunner, "
        "FlinkRunner, SparkRunner, PortableRunner ...); default: this machine, without Beam"
    )
    beam_options: tuple[str, ...] = config.setting(
        (), "Beam pipeline options as KEY=VALUE (flag --beam-option, repeatable)", cli=False
    )

    def __post_init__(self) -> None:
        low, high = MAX_LENGTH_RANGE
        if not low <= self.max_length <= high:
            raise TpulmError(f"max_length {self.max_length} is out of range [{low}, {high}] (--max-length)")
        config.check_at_least(self, 1, "shard_size", "batch_size")

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
class SplitPlan:
    """Everything fixed for one split: where, what, and the identity a rerun must match."""

    split: str
    split_dir: str
    source: corpus.Source
    identity: dict[str, Any]
    files: tuple[str, ...] = ()  # the source's files, globs resolved (none for a 🤗 dataset)


@dataclasses.dataclass(frozen=True)
class Resume:
    """Where a split continues: after ``shards`` full shards, at sample ``next_sample`` of which
    the first ``skip_tokens`` tokens are already in those shards."""

    shards: int = 0
    next_sample: int = 0
    skip_tokens: int = 0


# ---------------------------------------------------------------------------------------------
# Identity checks and resume


def identity(cfg: PrepareConfig, source: corpus.Source, fp: str) -> dict[str, Any]:
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


def plan_splits(cfg: PrepareConfig, fingerprint: str) -> list[SplitPlan]:
    """The plan of every split ``cfg`` names; a missing input fails here, before anything is
    written.

    Args:
        cfg: the resolved settings.
        fingerprint: the tokenizer's fingerprint, part of every split's identity.
    """
    plans = []
    for split, source in cfg.sources().items():
        files = tuple(corpus.resolve_files(source.files)) if source.files else ()
        plans.append(SplitPlan(split, storage.join(cfg.output, split), source,
                               identity(cfg, source, fingerprint), files))
    return plans


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


def read_json(path: str) -> dict[str, Any]:
    try:
        return json.loads(storage.read_text(path))
    except ValueError as err:
        raise TpulmError(f"{path} is not valid JSON ({err}); delete the folder and rerun") from None


def check_existing(plan: SplitPlan) -> Resume | shards.Manifest:
    """The finished manifest, or where to resume; an error for a folder of other shards."""
    if not storage.isdir(plan.split_dir):
        return Resume()
    manifest = shards.read_manifest(plan.split_dir)
    if manifest is not None:
        found = {**manifest.arguments, "tokenizer_fingerprint": manifest.tokenizer_fingerprint,
                 "max_length": manifest.max_length}
        problem = _mismatch(found, plan.identity, plan.split_dir)
        if problem:
            raise TpulmError(problem)
        return _verified(plan, manifest)
    progress_path = storage.join(plan.split_dir, PROGRESS_NAME)
    existing = shards.list_shards(plan.split_dir)
    if not storage.exists(progress_path):
        if existing:
            raise TpulmError(
                f"{plan.split_dir} holds shards of unknown origin (no manifest.json); "
                "choose another --output or delete that folder"
            )
        return Resume()
    progress = read_json(progress_path)
    problem = _mismatch(progress.get("identity", {}), plan.identity, plan.split_dir)
    if problem:
        raise TpulmError(problem)
    try:
        resume = Resume(**progress["resume"])
    except (KeyError, TypeError):
        raise TpulmError(f"{progress_path} is damaged; delete the folder and rerun") from None
    names = {p.rsplit("/", 1)[-1] for p in existing}
    full = [shards.shard_name(i, plan.identity["shard_size"]) for i in range(resume.shards)]
    if not names.issuperset(full):  # a finished shard was deleted by hand: start over
        log.warning("%s: finished shards are missing; preparing the split again", plan.split_dir)
        return Resume()
    return resume


def _verified(plan: SplitPlan, manifest: shards.Manifest) -> Resume | shards.Manifest:
    """The manifest when every shard it lists is there with its recorded size; else the split
    is prepared again (its manifest removed first, so an interrupted repair resumes as any run)
    rather than called complete over missing or truncated shards."""
    problems = shards.damaged_shards(plan.split_dir, manifest)
    if not problems:
        return manifest
    shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
    log.warning("%s: %s; preparing the split again", plan.split_dir, shown)
    write_progress(plan, Resume())  # the folder stays ours if the repair is interrupted
    storage.remove(storage.join(plan.split_dir, shards.MANIFEST_NAME))
    return Resume()


def write_progress(plan: SplitPlan, resume: Resume, error: str | None = None) -> None:
    """Record the identity and the latest resume point (small: rewritten after every shard), and
    ``error``: why a run wrote no manifest, for a driver that cannot catch it (Beam's)."""
    state = {"identity": plan.identity, "resume": dataclasses.asdict(resume)}
    if error is not None:
        state[ERROR_KEY] = error
    text = json.dumps(state, indent=1, sort_keys=True)
    storage.write_text(storage.join(plan.split_dir, PROGRESS_NAME), text + "\n")


def recorded_error(plan: SplitPlan) -> str | None:
    """The error :func:`write_progress` recorded for the split, if any."""
    path = storage.join(plan.split_dir, PROGRESS_NAME)
    return read_json(path).get(ERROR_KEY) if storage.exists(path) else None


def reopen(plan: SplitPlan, resume: bool) -> Resume | shards.Manifest:
    """The finished manifest, or the split folder made ready for a run: temporaries and the
    shards after the resume point (all shards unless ``resume``) removed, to be rewritten byte
    for byte.

    Raises:
        TpulmError: the folder holds shards of other settings or of unknown origin.
    """
    state = check_existing(plan)
    if isinstance(state, shards.Manifest):
        return state
    if not resume:
        state = Resume()
    if storage.isdir(plan.split_dir):
        shards.remove_temporaries(plan.split_dir)
        for path in shards.list_shards(plan.split_dir)[state.shards :]:
            storage.remove(path)
    return state


def flatten(encodings: list) -> tuple[np.ndarray, np.ndarray]:
    """Ids of a batch as one int64 stream (tokens,) and the per-sample token counts (samples,)."""
    ids = [e.ids for e in encodings]
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), np.int64, int(lengths.sum()))
    return flat, lengths


def pad_block(rest: np.ndarray, max_length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The stream's last tokens (fewer than ``max_length``) as one padded block: ids and an
    ``attention_mask`` that is 0 on the padding, both int64 (1, max_length)."""
    ids = np.full((1, max_length), pad_id, np.int64)
    ids[0, : len(rest)] = rest
    mask = (np.arange(max_length) < len(rest))[None].astype(np.int64)
    return ids, mask


def finish_split(plan: SplitPlan, cfg: PrepareConfig, infos: list, samples: int, tokens: int,
                 vocab_size: int) -> shards.Manifest:
    """End a split whose shards are all written: its manifest last, then no progress file.

    Args:
        plan: the split.
        cfg: the settings it was prepared with.
        infos: the :class:`shards.ShardInfo` of every shard, in any order.
        samples: samples in the split.
        tokens: tokens in the split's stream (its length, remainder included).
        vocab_size: the tokenizer's vocabulary size.

    Raises:
        TpulmError: the split has no tokens, or too few for one block (so no shard).
    """
    if tokens == 0:
        raise TpulmError(f"the corpus is empty: no (non-empty) samples in {where(plan.source)}; "
                         "check the input")
    if not infos:
        raise TpulmError(
            f"{where(plan.source)} has {tokens} tokens, fewer than one block of max_length "
            f"{cfg.max_length}; lower --max-length or pass --pad-remainder"
        )
    dropped = 0 if cfg.pad_remainder else tokens % cfg.max_length
    stats = {"samples": samples, "tokens": tokens, "tokens_dropped": dropped}
    done = sorted(infos, key=lambda info: shards.parse_shard_name(info.file)[0])
    finished = manifest(plan, cfg, done, stats, vocab_size)
    shards.write_manifest(plan.split_dir, finished)
    progress = storage.join(plan.split_dir, PROGRESS_NAME)
    if storage.exists(progress):
        storage.remove(progress)
    return finished


def manifest(plan: SplitPlan, cfg: PrepareConfig, done: list, stats: dict, vocab_size: int):
    """The manifest of a finished split."""
    keys = ("tokenizer_fingerprint", "max_length")
    arguments = {k: v for k, v in plan.identity.items() if k not in keys}
    arguments.update(tokenizer=cfg.tokenizer, batch_size=cfg.batch_size,
                     encoding_errors=cfg.encoding_errors)
    return shards.Manifest(
        tokenizer_fingerprint=plan.identity["tokenizer_fingerprint"],
        vocab_size=vocab_size,
        max_length=cfg.max_length,
        shards=tuple(done),
        source=plan.source.describe(),
        arguments=arguments,
        stats=stats,
    )


def where(source: corpus.Source) -> str:
    described = source.describe()
    if "files" in described:
        return ", ".join(described["files"])
    return "/".join(str(described[k]) for k in ("dataset", "config", "split") if described[k])


def summary(plan: SplitPlan, manifest: shards.Manifest, seconds: float, added: int, resumed: int):
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


def packing_tokenizer(tokenizer_dir: str) -> tokenizer.TokenizerFolder:
    """The tokenizer folder, its tokenizer set to encode whole samples (also for Beam workers)."""
    folder = tokenizer.open_folder(tokenizer_dir)
    folder.tokenizer.no_truncation()  # a saved truncation/padding setting would cut or pad samples
    folder.tokenizer.no_padding()
    return folder
