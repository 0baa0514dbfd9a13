"""Validate shard folders and show decoded blocks (`tpulm data inspect DIR`).

Checks, per split folder: every record parses as the schema (two int64 features of length
``max_length``; checksums intact), record counts in file names equal records read, shard indices
run 0..n-1, ids are below the vocabulary size and masks are 0/1, no unfinished (temporary or
interrupted) files, and the manifest agrees with the files (names, records, tokens, vocab size,
tokenizer fingerprint). Every problem found is listed; a report with problems means exit code 1.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tpulm import config, storage
from tpulm.data import shards, tokenizer
from tpulm.errors import TpulmError


@dataclasses.dataclass(frozen=True)
class InspectConfig:
    """Settings of ``tpulm data inspect``."""

    path: str = config.setting("", "a split folder, or a folder of split folders")
    tokenizer: str | None = config.setting(
        None, "tokenizer folder (default: the one named in the manifest)"
    )
    decode: int = config.setting(3, "blocks to decode and show per split")

    def __post_init__(self) -> None:
        config.check_at_least(self, 0, "decode")


@dataclasses.dataclass
class SplitReport:
    """What was found in one split folder."""

    path: str
    shards: int = 0
    records: int = 0
    tokens: int = 0
    max_length: int | None = None
    problems: list[str] = dataclasses.field(default_factory=list)
    decoded: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class InspectReport:
    splits: tuple[SplitReport, ...]

    @property
    def ok(self) -> bool:
        return all(not s.problems for s in self.splits)


def _split_dirs(path: str) -> list[str]:
    """``path`` itself when it holds shards or a manifest, else its sub-folders that do."""

    def is_split(folder: str) -> bool:
        names = storage.listdir(folder)
        return shards.MANIFEST_NAME in names or any(shards.parse_shard_name(n) for n in names)

    if not storage.isdir(path):
        raise TpulmError(f"{path} is not a folder; give a shard folder of `tpulm data prepare`")
    if is_split(path):
        return [path]
    found = [storage.join(path, n) for n in storage.listdir(path)]
    found = [f for f in found if storage.isdir(f) and is_split(f)]
    if not found:
        raise TpulmError(f"no shards (dataset-<i>-<n>.tfrecord) or manifest.json in {path}")
    return found


def _check_names(report: SplitReport, files: list[str]) -> None:
    from tpulm.data.preparation import PROGRESS_NAME

    indices = [shards.parse_shard_name(f)[0] for f in files]
    if indices != list(range(len(indices))):
        report.problems.append(f"shard indices are {indices}, expected 0..{len(indices) - 1}")
    names = storage.listdir(report.path)
    leftovers = [n for n in names if storage.is_temporary(n)]
    if leftovers:
        report.problems.append(f"unfinished temporary files {leftovers}: rerun `tpulm data prepare`")
    if PROGRESS_NAME in names and shards.MANIFEST_NAME not in names:
        report.problems.append("`tpulm data prepare` was interrupted here: rerun it to finish")


def _check_shard(report: SplitReport, path: str, max_length: int, vocab_size: int | None) -> int:
    """Read one shard fully; returns its token count (attention_mask ones)."""
    name = path.rsplit("/", 1)[-1]
    schema = shards.first_record_schema(path)  # a clearer message than parse_example's
    if schema and schema != {f: max_length for f in sorted(shards.FEATURES)}:
        report.problems.append(f"{name}: first record has features {schema}, expected "
                               f"input_ids and attention_mask of length {max_length}")
        return 0
    records = tokens = 0
    bad_ids = bad_mask = 0
    for ids, mask in shards.iter_blocks(path, max_length):  # (n, max_length) each
        records += len(ids)
        tokens += int(mask.sum())
        bad_ids += int(((ids < 0) | (ids >= (vocab_size or np.iinfo(np.int64).max))).sum())
        bad_mask += int(((mask != 0) & (mask != 1)).sum())
    expected = shards.parse_shard_name(name)[1]
    if records != expected:
        report.problems.append(f"{name}: name says {expected} records, file holds {records}")
    if bad_ids:
        report.problems.append(f"{name}: {bad_ids} ids outside [0, vocab size {vocab_size})")
    if bad_mask:
        report.problems.append(f"{name}: {bad_mask} attention_mask values other than 0/1")
    report.records += records
    return tokens


def _check_manifest(report: SplitReport, manifest, per_file: dict[str, int | None],
                    tok: tokenizer.TokenizerFolder | None):
    files = {s.file: s for s in manifest.shards}
    if sorted(files) != sorted(per_file):
        report.problems.append(
            f"manifest lists {sorted(files)} but the folder holds {sorted(per_file)}"
        )
    for name, tokens in per_file.items():
        info = files.get(name)
        if info and tokens is not None and (info.records != shards.parse_shard_name(name)[1] or info.tokens != tokens):
            report.problems.append(
                f"{name}: manifest says {info.records} records/{info.tokens} tokens, "
                f"file holds {shards.parse_shard_name(name)[1]}/{tokens}"
            )
    report.problems.extend(p for p in shards.damaged_shards(report.path, manifest)
                           if not p.endswith(" is missing"))  # missing ones are listed above
    if tok is not None:
        if tok.fingerprint != manifest.tokenizer_fingerprint:
            report.problems.append(f"manifest's tokenizer fingerprint differs from {tok.path}")
        vocab = tok.vocab_size
        if vocab != manifest.vocab_size:
            report.problems.append(f"manifest vocab_size {manifest.vocab_size}, tokenizer {vocab}")


def _decode(report: SplitReport, files: list[str], tok: tokenizer.TokenizerFolder | None,
            count: int) -> None:
    if not (tok and count and files and report.max_length):
        return
    for ids, mask in shards.iter_blocks(files[0], report.max_length, batch=count):
        for row, row_mask in zip(ids, mask):
            report.decoded.append(tok.tokenizer.decode(row[row_mask == 1].tolist(), skip_special_tokens=False))
        return


def _guess_max_length(report: SplitReport, files: list[str]) -> int | None:
    """Without a manifest (reference-recipe shards): the length of the first record."""
    try:
        length = shards.first_record_schema(files[0]).get("input_ids") if files else None
    except TpulmError as err:
        report.problems.append(str(err))
        return None
    if files and length is None:
        report.problems.append(f"{files[0]}: cannot tell max_length (no manifest, no input_ids)")
    return length


def _open_tokenizer(report: SplitReport, tok_dir: str | None) -> tokenizer.TokenizerFolder | None:
    if not tok_dir:
        return None
    try:
        return tokenizer.open_folder(tok_dir)
    except TpulmError as err:
        report.problems.append(str(err))
        return None


def inspect_split(split_dir: str, tok_dir: str | None, decode: int) -> SplitReport:
    """Validate one split folder; problems are collected, not raised."""
    report = SplitReport(path=split_dir)
    try:
        manifest = shards.read_manifest(split_dir)
    except TpulmError as err:
        report.problems.append(str(err))
        manifest = None
    files = shards.list_shards(split_dir)
    report.shards = len(files)
    _check_names(report, files)
    if tok_dir is None and manifest is not None:  # the manifest's, when it is still there
        named = manifest.arguments.get("tokenizer")
        tok_dir = named if named and storage.exists(storage.join(named, tokenizer.TOKENIZER_FILE)) else None
    tok = _open_tokenizer(report, tok_dir)
    vocab = manifest.vocab_size if manifest else None
    if vocab is None and tok:
        vocab = tok.vocab_size
    report.max_length = manifest.max_length if manifest else _guess_max_length(report, files)
    if files and report.max_length is None:
        return report
    per_file = {}
    for path in files:
        name = path.rsplit("/", 1)[-1]
        try:
            per_file[name] = _check_shard(report, path, report.max_length, vocab)
        except TpulmError as err:
            report.problems.append(str(err))
            per_file[name] = None  # unreadable, but there: not also "missing from the folder"
    report.tokens = sum(t for t in per_file.values() if t is not None)
    if manifest is not None:
        _check_manifest(report, manifest, per_file, tok)
    if not report.problems:
        _decode(report, files, tok, decode)
    return report


def run(cfg: InspectConfig) -> InspectReport:
    """Validate every split folder under ``cfg.path``.

    Args:
        cfg: the folder, optionally a tokenizer folder, and how many blocks to decode.

    Returns:
        An :class:`InspectReport`; ``report.ok`` is False when anything is wrong.
    """
    return InspectReport(tuple(inspect_split(d, cfg.tokenizer, cfg.decode) for d in _split_dirs(cfg.path)))
