"""Stream raw text samples in batches from local/remote files or a 🤗 datasets split.

A corpus is described by a :class:`Source`: a set of files (globs allowed; plain text with one
sample per line, JSON Lines or Parquet, chosen by extension) or the name, config and split of a
🤗 dataset (streamed, so nothing is downloaded up front). :func:`iter_batches` yields lists of
strings; it holds one read chunk and one batch at a time, so memory does not grow with the corpus.

Readers are registered by file extension in ``READERS``; anything unregistered is read as text.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import Any

from tpulm.data import fsspec_io
from tpulm.errors import TpulmError

CHUNK_BYTES = 4 << 20  # bytes read per call; lines are cut at the last newline of a chunk
ENCODING_ERRORS = ("strict", "replace")


@dataclasses.dataclass(frozen=True)
class Source:
    """Where the samples of one split come from: ``files`` or a 🤗 ``dataset``.

    Args:
        files: paths or glob patterns (local, any fsspec scheme such as ``gs://``, ``s3://``,
            ``hf://``, ``az://``, or ``tf.io.gfile``'s ``ram://``; see ``tpulm.data.fsspec_io``), read
            in sorted order.
        dataset: a 🤗 datasets name, streamed (used when ``files`` is empty).
        dataset_config: the dataset's configuration name, e.g. ``wikitext-2-raw-v1``.
        split: the dataset split, e.g. ``train``.
        text_field: the column holding the text in JSON Lines, Parquet and 🤗 datasets.
        encoding_errors: ``strict`` (invalid UTF-8 is an error naming file and byte offset) or
            ``replace`` (invalid bytes become U+FFFD).
    """

    files: tuple[str, ...] = ()
    dataset: str | None = None
    dataset_config: str | None = None
    split: str = "train"
    text_field: str = "text"
    encoding_errors: str = "strict"

    def __post_init__(self) -> None:
        if bool(self.files) == bool(self.dataset):
            raise TpulmError("give either input files or a 🤗 dataset name as the corpus, not both")
        if self.encoding_errors not in ENCODING_ERRORS:
            raise TpulmError(
                f"encoding_errors must be one of {', '.join(ENCODING_ERRORS)}, "
                f"got {self.encoding_errors!r}"
            )

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description for manifests and logs."""
        if self.files:
            return {"files": list(self.files), "text_field": self.text_field}
        return {
            "dataset": self.dataset,
            "config": self.dataset_config,
            "split": self.split,
            "text_field": self.text_field,
        }


def resolve_files(patterns: tuple[str, ...]) -> list[str]:
    """Expand globs into a sorted, de-duplicated file list; an error names a pattern that matched
    nothing."""
    files: list[str] = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            matches = fsspec_io.glob(pattern)
        else:
            matches = [pattern] if fsspec_io.exists(pattern) and not fsspec_io.isdir(pattern) else []
        if not matches:
            raise TpulmError(f"input {pattern} matches no file; check the path")
        files.extend(m for m in matches if m not in files)
    return files


def _decode(data: bytes, path: str, offset: int, errors: str) -> str:
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as err:
        raise TpulmError(
            f"{path} is not valid UTF-8 at byte {offset + err.start} ({err.reason}); "
            "fix the file or pass --encoding-errors replace"
        ) from None


def _raw_lines(path: str, errors: str) -> Iterator[str]:
    """Lines of a file without their ``\\n`` (and a trailing ``\\r``), read in chunks.

    Chunks are cut after a newline byte, which never occurs inside a UTF-8 sequence, so each
    chunk decodes on its own and an error's byte offset is exact.
    """
    offset = 0  # file offset of ``pending``
    pending = b""
    with fsspec_io.open_file(path, "rb") as f:
        while True:
            chunk = f.read(CHUNK_BYTES)
            data = pending + chunk
            cut = data.rfind(b"\n") + 1 if chunk else len(data)
            if cut:
                text = _decode(data[:cut], path, offset, errors)
                lines = text.split("\n")
                if text.endswith("\n"):
                    lines.pop()
                for line in lines:
                    yield line[:-1] if line.endswith("\r") else line
            offset += cut
            pending = data[cut:]
            if not chunk:
                return


def read_text(path: str, source: Source) -> Iterator[str]:
    """Plain text: one sample per line."""
    return _raw_lines(path, source.encoding_errors)


def read_jsonl(path: str, source: Source) -> Iterator[str]:
    """JSON Lines: the ``text_field`` of each object; blank lines are ignored."""
    for number, line in enumerate(_raw_lines(path, source.encoding_errors), start=1):
        if not line.strip():
            continue
        try:
            text = json.loads(line)[source.text_field]
        except json.JSONDecodeError as err:
            raise TpulmError(f"{path} line {number} is not valid JSON: {err.msg}") from None
        except (KeyError, TypeError):
            raise TpulmError(
                f"{path} line {number} has no field {source.text_field!r}; set --text-field"
            ) from None
        if not isinstance(text, str):
            raise TpulmError(f"{path} line {number}: field {source.text_field!r} is not a string")
        yield text


def read_parquet(path: str, source: Source) -> Iterator[str]:
    """Parquet: the ``text_field`` column, read one record batch at a time."""
    import pyarrow.parquet as pq

    with fsspec_io.open_file(path, "rb") as f:
        try:
            parquet = pq.ParquetFile(f)
        except Exception as err:  # pyarrow raises several types for non-Parquet input
            raise TpulmError(f"{path} is not a readable Parquet file: {err}") from None
        if source.text_field not in parquet.schema_arrow.names:
            raise TpulmError(
                f"{path} has no column {source.text_field!r} (columns: "
                f"{', '.join(parquet.schema_arrow.names)}); set --text-field"
            )
        for batch in parquet.iter_batches(batch_size=8192, columns=[source.text_field]):
            yield from (text or "" for text in batch.column(0).to_pylist())


READERS: dict[str, Callable[[str, Source], Iterator[str]]] = {
    ".jsonl": read_jsonl,
    ".json": read_jsonl,
    ".parquet": read_parquet,
}


def _reader_for(path: str) -> Callable[[str, Source], Iterator[str]]:
    name = path.rsplit("/", 1)[-1].lower()
    for suffix, reader in READERS.items():
        if name.endswith(suffix):
            return reader
    return read_text


def _dataset_samples(source: Source) -> Iterator[str]:
    """Stream a 🤗 dataset split; a failure to load (e.g. offline) is a one-line error."""
    import datasets

    try:
        dataset = datasets.load_dataset(
            source.dataset, source.dataset_config, split=source.split, streaming=True
        )
        rows = iter(dataset)
        first = next(rows, None)
    except Exception as err:  # hub, network and builder errors have many types
        where = "/".join(p for p in (source.dataset, source.dataset_config, source.split) if p)
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise TpulmError(
            f"cannot stream 🤗 dataset {where}: {reason}. Offline? Download the text and pass "
            "it as input files instead"
        ) from None
    if first is None:
        return
    if source.text_field not in first:
        raise TpulmError(
            f"🤗 dataset {source.dataset} has no field {source.text_field!r}; set --text-field"
        )
    yield first[source.text_field]
    for row in rows:
        yield row[source.text_field]


def iter_samples(source: Source) -> Iterator[str]:
    """Every sample of ``source`` in order (files in sorted order, lines in file order)."""
    if source.dataset:
        yield from _dataset_samples(source)
        return
    for path in resolve_files(source.files):
        yield from _reader_for(path)(path, source)


# Longest sample handed to a tokenizer, in characters. The tokenizers library needs roughly 100
# bytes of memory per character of one sample (a single 50 MB line peaked at 5.9 GB), so longer
# samples are cut into pieces of at most this size, each a sample of its own.
MAX_SAMPLE_CHARS = 100_000


def bounded(samples: Iterator[str], limit: int = MAX_SAMPLE_CHARS) -> Iterator[str]:
    """``samples`` with every one longer than ``limit`` characters cut into consecutive pieces.

    Each cut falls after the last whitespace of the piece when there is one (so words stay
    whole), else at ``limit``; the pieces concatenate to the original sample. With
    ``tpulm data prepare`` each piece gets its own ``[CLS] ... [SEP]``.
    """
    for text in samples:
        while len(text) > limit:
            cut = max(text.rfind(" ", 0, limit), text.rfind("\n", 0, limit)) + 1 or limit
            yield text[:cut]
            text = text[cut:]
        yield text


def iter_batches(
    source: Source, batch_size: int, *, keep_empty: bool = False, start: int = 0
) -> Iterator[list[str]]:
    """Batches of up to ``batch_size`` samples.

    Args:
        source: where the samples come from.
        batch_size: samples per batch.
        keep_empty: keep empty and whitespace-only samples (the reference recipe does; each then
            becomes a ``[CLS][SEP]`` pair of noise tokens).
        start: number of (kept) samples to skip first, to resume an interrupted run.
    """
    batch: list[str] = []
    index = 0
    for text in bounded(iter_samples(source)):
        if not keep_empty and not text.strip():
            continue
        index += 1
        if index <= start:
            continue
        batch.append(text)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch
