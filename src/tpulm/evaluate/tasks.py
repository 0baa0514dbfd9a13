"""Downstream tasks: a registry of named tasks (GLUE, built-in) and tasks read from local files.

A task is two splits of ``(text, optional text pair, label)`` rows, its kind (classification or
regression) and its metrics (the first is the one a run is judged by). Names:

* ``glue:sst2|mrpc|cola|stsb|qnli|rte|mnli|qqp``: GLUE from the Hugging Face Hub
  (``nyu-mll/glue``), needs the network (or the datasets cache); MNLI is scored on
  ``validation_matched``;
* ``builtin:replaced-words``: offline, made from the built-in corpus (see ``replaced_words``);
* local files (``FileTask``): CSV, TSV, JSONL or Parquet, local or ``gs://``.

Labels: strings or integers are classes (class ids follow the sorted train labels); floats
make a regression task.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import re
from collections.abc import Callable

import numpy as np

from tpulm import storage
from tpulm.errors import TpulmError

CLASSIFICATION, REGRESSION = "classification", "regression"


@dataclasses.dataclass(frozen=True)
class Split:
    """One split of a task: texts, optional second texts, labels (int class ids or floats)."""

    texts: tuple[str, ...]
    pairs: tuple[str, ...] | None
    labels: np.ndarray  # (examples,) int64 class ids or float32 targets

    def __len__(self) -> int:
        return len(self.texts)


@dataclasses.dataclass(frozen=True)
class Task:
    """A downstream task.

    Attributes:
        name: e.g. ``glue:rte``.
        kind: ``classification`` or ``regression``.
        metrics: metric names of ``tpulm.evaluate.metrics``; the first is the main one.
        label_names: class names in class-id order; empty for regression.
        train: the split fine-tuned on.
        validation: the split scored.
    """

    name: str
    kind: str
    metrics: tuple[str, ...]
    label_names: tuple[str, ...]
    train: Split
    validation: Split

    @property
    def num_outputs(self) -> int:
        return len(self.label_names) if self.kind == CLASSIFICATION else 1


# ---------------------------------------------------------------------------------------------
# GLUE


@dataclasses.dataclass(frozen=True)
class GlueSpec:
    text: str
    pair: str | None
    metrics: tuple[str, ...]
    regression: bool = False
    validation: str = "validation"


GLUE = {
    "sst2": GlueSpec("sentence", None, ("accuracy",)),
    "mrpc": GlueSpec("sentence1", "sentence2", ("f1", "accuracy")),
    "cola": GlueSpec("sentence", None, ("matthews",)),
    "stsb": GlueSpec("sentence1", "sentence2", ("pearson", "spearman"), regression=True),
    "qnli": GlueSpec("question", "sentence", ("accuracy",)),
    "rte": GlueSpec("sentence1", "sentence2", ("accuracy",)),
    "mnli": GlueSpec("premise", "hypothesis", ("accuracy",), validation="validation_matched"),
    "qqp": GlueSpec("question1", "question2", ("f1", "accuracy")),
}


def _offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
               for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))


def glue_task(name: str) -> Task:
    """GLUE task ``name`` (e.g. ``rte``) from the Hub, or the datasets cache when offline."""
    spec = GLUE[name]
    try:
        import datasets

        data = datasets.load_dataset("nyu-mll/glue", name)
    except Exception as err:  # offline mode, no network, Hub errors: all end the same way
        why = "this machine is offline (HF_DATASETS_OFFLINE/HF_HUB_OFFLINE)" if _offline() else (
            f"it could not be downloaded ({type(err).__name__}: {str(err)[:200]})")
        raise TpulmError(
            f"task glue:{name} needs the network to download nyu-mll/glue, and {why}; go online, "
            "or pass the data as local files: --train-file, --validation-file, --text-field, "
            "--text-pair-field, --label-field") from None
    names = tuple(data["train"].features["label"].names) if not spec.regression else ()

    def split(rows) -> Split:
        labels = np.asarray(rows["label"], np.float32 if spec.regression else np.int64)
        pairs = tuple(rows[spec.pair]) if spec.pair else None
        return Split(tuple(rows[spec.text]), pairs, labels)

    return Task(f"glue:{name}", REGRESSION if spec.regression else CLASSIFICATION, spec.metrics,
                names, split(data["train"]), split(data[spec.validation]))


# ---------------------------------------------------------------------------------------------
# The built-in task


REPLACED_TRAIN, REPLACED_VALIDATION = 4000, 1000  # examples per split (at most)
REPLACE_SHARE = 0.3  # of a sentence's replaceable words, at least 2
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_PLAIN_WORD = re.compile(r"^[a-z]{2,}$")


@functools.lru_cache(maxsize=1)
def corpus_lines() -> dict[str, tuple[str, ...]]:
    """The built-in corpus' lines by split (extracted once per process)."""
    from tpulm.data import builtin_corpus

    by_split: dict[str, list[str]] = {split: [] for split in builtin_corpus.SPLITS}
    for line in builtin_corpus.demo_lines():
        by_split[builtin_corpus.split_of(line)].append(line)
    return {split: tuple(lines) for split, lines in by_split.items()}


def _sentences(lines: tuple[str, ...], exclude: frozenset[str] = frozenset()) -> list[list[str]]:
    """Sentences of 6-16 words with at least 4 plain lowercase words, as word lists, deduplicated,
    except those in ``exclude``."""
    seen, found = set(exclude), []
    for line in lines:
        for sentence in _SENTENCE_END.split(line):
            words = sentence.split()
            plain = sum(bool(_PLAIN_WORD.match(w)) for w in words)
            if 6 <= len(words) <= 16 and plain >= 4 and sentence not in seen:
                seen.add(sentence)
                found.append(words)
    return found


def _corrupt(words: list[str], pool: list[str], rng: np.random.Generator) -> list[str]:
    """``words`` with a share of the plain words replaced by other words drawn from ``pool``."""
    candidates = [i for i, w in enumerate(words) if _PLAIN_WORD.match(w)]
    count = max(2, int(round(REPLACE_SHARE * len(candidates))))
    out = list(words)
    for i in rng.choice(candidates, size=count, replace=False):
        while (word := pool[rng.integers(len(pool))]) == words[i]:
            pass
        out[i] = word
    return out


def replaced_words_split(lines: tuple[str, ...], size: int, seed: int,
                         exclude: frozenset[str] = frozenset()) -> Split:
    """Balanced examples: label 1 when some words of the sentence were replaced, else 0.

    Replacements are plain lowercase words drawn from the same split's sentences, so they follow
    the corpus' word frequencies: a rare word is no clue, only whether each word fits its
    context is. That is what masked-LM pretraining learns and a few thousand labelled examples
    cannot teach an untrained encoder.
    """
    rng = np.random.default_rng(seed)
    sentences = _sentences(lines, exclude)
    pool = [w for words in sentences for w in words if _PLAIN_WORD.match(w)]
    size = min(size, len(sentences))
    order = rng.permutation(len(sentences))[: size - size % 2]
    texts, labels = [], []
    for rank, index in enumerate(order):
        corrupt = rank % 2  # alternate: exactly balanced
        words = _corrupt(sentences[index], pool, rng) if corrupt else sentences[index]
        texts.append(" ".join(words))
        labels.append(corrupt)
    return Split(tuple(texts), None, np.asarray(labels, np.int64))


def replaced_words() -> Task:
    """``builtin:replaced-words``: was a sentence of the built-in corpus tampered with?

    Sentences of the built-in corpus (Python's docstrings, 6-16 words); in half of them 30% of
    the plain lowercase words (at least 2) are replaced by random words of the corpus. Train
    sentences come from the corpus' train split, validation ones from its validation and test
    splits (which pretraining does not train on); 4000 / 1000 examples, deterministic. Scored by accuracy (chance: 0.5).
    """
    lines = corpus_lines()
    train = replaced_words_split(lines["train"], REPLACED_TRAIN, seed=1)
    # Short stock sentences recur across the corpus' splits: none of train's is validated on.
    seen = frozenset(" ".join(words) for words in _sentences(lines["train"]))
    validation = replaced_words_split(lines["validation"] + lines["test"], REPLACED_VALIDATION,
                                      seed=2, exclude=seen)
    return Task("builtin:replaced-words", CLASSIFICATION, ("accuracy",), ("original", "replaced"),
                train, validation)


REGISTRY: dict[str, Callable[[], Task]] = {
    **{f"glue:{name}": functools.partial(glue_task, name) for name in GLUE},
    "builtin:replaced-words": replaced_words,
}


def load_task(name: str) -> Task:
    """The registered task ``name`` (see ``REGISTRY``)."""
    if name not in REGISTRY:
        raise TpulmError(f"unknown task {name!r}; known: {', '.join(REGISTRY)} (or local files "
                         "with --train-file and --validation-file)")
    return REGISTRY[name]()


# ---------------------------------------------------------------------------------------------
# Local files


@dataclasses.dataclass(frozen=True)
class FileTask:
    """A task read from a train and a validation file (CSV, TSV, JSONL or Parquet)."""

    train_file: str
    validation_file: str
    text_field: str = "text"
    text_pair_field: str | None = None
    label_field: str = "label"

    @property
    def name(self) -> str:
        base = self.train_file.rstrip("/").rsplit("/", 1)[-1]
        return f"file:{base}"


def _read_table(path: str):
    """A pandas DataFrame of ``path`` by its extension."""
    import pandas as pd

    readers = {
        ".csv": lambda f: pd.read_csv(f, keep_default_na=False),
        ".tsv": lambda f: pd.read_csv(f, sep="\t", keep_default_na=False),
        ".jsonl": lambda f: pd.read_json(f, lines=True),
        ".json": lambda f: pd.read_json(f, lines=True),
        ".parquet": pd.read_parquet,
    }
    ext = os.path.splitext(path)[1].lower()
    if ext not in readers:
        raise TpulmError(f"{path}: unknown file type {ext!r}; use {', '.join(readers)}")
    if not storage.exists(path):
        raise TpulmError(f"task file {path} does not exist")
    data = storage.read_bytes(path)
    if not data.strip():
        raise TpulmError(f"task file {path} is empty; give it a header and rows (or JSON lines)")
    try:
        table = readers[ext](io.BytesIO(data))
    except Exception as err:  # pandas/pyarrow parse errors
        raise TpulmError(f"cannot read {path} as {ext[1:]}: {err}") from None
    if len(table) == 0:
        raise TpulmError(f"task file {path} is empty (a header and no rows); add examples")
    return table


def _column(table, name: str, path: str):
    if name not in table.columns:
        raise TpulmError(f"{path} has no field {name!r}; its fields: "
                         f"{', '.join(map(str, table.columns))}")
    return table[name]


def _texts(table, name: str, path: str) -> tuple[str, ...]:
    return tuple("" if v is None else str(v) for v in _column(table, name, path).tolist())


def _row(path: str, index: int) -> str:
    """A row as the user finds it: the line number in text files (CSV/TSV have a header)."""
    ext = os.path.splitext(path)[1].lower()
    line = index + (2 if ext in (".csv", ".tsv") else 1)
    return f"{path} line {line}" if ext != ".parquet" else f"{path} row {index + 1}"


def _check_labels(column, path: str, field: str) -> None:
    """Every row has a label: None, NaN or an empty string would end deep in numpy (``cannot
    convert float NaN to integer``) or train on garbage."""
    for index, value in enumerate(column.tolist()):
        if value is None or (isinstance(value, float) and value != value) or value == "":
            raise TpulmError(f"{_row(path, index)} has no label (field {field!r} is missing, "
                             "empty or NaN); give every row a label")


def _class_value(value, path: str, index: int, field: str):
    """A class label: a string or an integer (1.0 read from JSON is 1; 1.5 is no class)."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and not value.is_integer():
        raise TpulmError(f"{_row(path, index)}: label {value!r} (field {field!r}) is not an "
                         "integer class, while other labels are classes; use integer or string "
                         "labels, or floats in every file for regression")
    if not isinstance(value, (int, float, np.integer, np.floating)):
        raise TpulmError(f"{_row(path, index)}: label {value!r} (field {field!r}) is neither a "
                         "string nor a number")
    return int(value)


def load_file_task(spec: FileTask) -> Task:
    """Read ``spec``'s files; float labels make a regression task, others a classification."""
    tables = {p: _read_table(p) for p in (spec.train_file, spec.validation_file)}
    raw = {p: _column(t, spec.label_field, p) for p, t in tables.items()}
    for path, column in raw.items():
        _check_labels(column, path, spec.label_field)
    regression = all(c.dtype.kind == "f" for c in raw.values())
    if regression:
        labels = {p: c.to_numpy(np.float32) for p, c in raw.items()}
        names: tuple[str, ...] = ()
    else:
        values = {p: [_class_value(v, p, i, spec.label_field) for i, v in enumerate(c.tolist())]
                  for p, c in raw.items()}
        train_set, valid_set = set(values[spec.train_file]), set(values[spec.validation_file])
        if train_set != valid_set:
            raise TpulmError(
                f"the label sets of the splits differ: {spec.train_file} has "
                f"{sorted(train_set, key=str)}, {spec.validation_file} has "
                f"{sorted(valid_set, key=str)} (field {spec.label_field!r})")
        classes = sorted(train_set, key=lambda v: (isinstance(v, str), v))
        index = {v: i for i, v in enumerate(classes)}
        labels = {p: np.asarray([index[v] for v in vs], np.int64) for p, vs in values.items()}
        names = tuple(str(c) for c in classes)

    def split(path: str) -> Split:
        pairs = _texts(tables[path], spec.text_pair_field, path) if spec.text_pair_field else None
        return Split(_texts(tables[path], spec.text_field, path), pairs, labels[path])

    metrics = ("pearson", "spearman") if regression else (
        ("accuracy", "f1") if len(names) == 2 else ("accuracy",))
    return Task(spec.name, REGRESSION if regression else CLASSIFICATION, metrics, names,
                split(spec.train_file), split(spec.validation_file))
