"""`tpulm evaluate`: metrics against scikit-learn/scipy, task files in four formats, the built-in
task, errors, and fine-tuning a briefly pretrained tiny model vs the same model from scratch on
TensorFlow and JAX.

All text is real prose of the built-in corpus (Python's docstrings); nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tpulm import democorpus
from tpulm.errors import TpulmError
from tpulm.evaluate import finetune, metrics, tasks
from tpulm.evaluate.run import EvaluateConfig, format_table, run

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"

# ---------------------------------------------------------------------------------------------
# Metrics


def _predictions(seed: int, classes: int, n: int = 300):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    noise = rng.integers(0, classes, n)
    return labels, np.where(rng.random(n) < 0.6, labels, noise)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_classification_metrics_match_scikit_learn(seed):
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    for classes in (2, 3):
        labels, predictions = _predictions(seed, classes)
        assert metrics.accuracy(labels, predictions) == pytest.approx(accuracy_score(labels, predictions))
        assert metrics.matthews(labels, predictions) == pytest.approx(
            matthews_corrcoef(labels, predictions), abs=1e-12)
    labels, predictions = _predictions(seed, 2)
    assert metrics.f1(labels, predictions) == pytest.approx(f1_score(labels, predictions))
    # Degenerate cases follow scikit-learn: no positive anywhere, one predicted class.
    zeros = np.zeros(10, int)
    assert metrics.f1(zeros, zeros) == 0.0 == f1_score(zeros, zeros, zero_division=0)
    assert metrics.matthews(labels[:10], zeros) == 0.0 == matthews_corrcoef(labels[:10], zeros)


@pytest.mark.parametrize("seed", [0, 1])
def test_correlations_match_scipy_with_ties(seed):
    from scipy.stats import pearsonr, spearmanr

    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 6, 400).astype(float)  # STS-B-like scores: many ties
    predicted = np.round(gold + rng.normal(0, 1.5, 400), 1)
    assert metrics.pearson(gold, predicted) == pytest.approx(pearsonr(gold, predicted).statistic)
    assert metrics.spearman(gold, predicted) == pytest.approx(spearmanr(gold, predicted).statistic)
    assert np.isnan(metrics.pearson(gold, np.ones_like(gold)))


# ---------------------------------------------------------------------------------------------
# Tasks


@pytest.fixture(scope="module")
def corpus_rows():
    """Rows of real text: a line of the built-in corpus, the next line, and labels of each kind."""
    lines = [line for line in democorpus.demo_lines() if len(line.split()) < 30][:240]
    rows = []
    for i, (first, second) in enumerate(zip(lines[::2], lines[1::2])):
        words = len(first.split())
        rows.append({"sentence": first, "next": second, "size": "long" if words > 12 else "short",
                     "parity": i % 3, "score": words / 10 + 0.05})
    return rows


def _write(rows, path: Path) -> str:
    import pandas as pd

    frame = pd.DataFrame(rows)
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    elif path.suffix == ".tsv":
        frame.to_csv(path, sep="\t", index=False)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        frame.to_parquet(path, index=False)
    return str(path)


def _file_task(rows, folder: Path, ext: str, **fields) -> tasks.Task:
    train = _write(rows[:80], folder / f"train{ext}")
    valid = _write(rows[80:], folder / f"valid{ext}")
    return tasks.load_file_task(tasks.FileTask(train, valid, **fields))


def test_file_formats_give_the_same_task(corpus_rows, tmp_path):
    loaded = {ext: _file_task(corpus_rows, tmp_path, ext, text_field="sentence",
                              text_pair_field="next", label_field="size")
              for ext in (".csv", ".tsv", ".jsonl", ".parquet")}
    first = loaded[".csv"]
    assert first.kind == tasks.CLASSIFICATION and first.label_names == ("long", "short")
    assert first.train.texts == tuple(r["sentence"] for r in corpus_rows[:80])
    assert first.validation.pairs == tuple(r["next"] for r in corpus_rows[80:])
    assert list(first.train.labels) == [int(r["size"] == "short") for r in corpus_rows[:80]]
    assert first.metrics == ("accuracy", "f1")
    for task in loaded.values():
        assert (task.train.texts, task.train.pairs, task.validation.texts) == (
            first.train.texts, first.train.pairs, first.validation.texts)
        np.testing.assert_array_equal(task.validation.labels, first.validation.labels)


def test_int_labels_are_classes_and_float_labels_regression(corpus_rows, tmp_path):
    classes = _file_task(corpus_rows, tmp_path, ".jsonl", text_field="sentence",
                         label_field="parity")
    assert classes.label_names == ("0", "1", "2") and classes.metrics == ("accuracy",)
    assert classes.train.pairs is None and classes.num_outputs == 3
    scores = _file_task(corpus_rows, tmp_path, ".parquet", text_field="sentence",
                        label_field="score")
    assert scores.kind == tasks.REGRESSION and scores.num_outputs == 1
    assert scores.metrics == ("pearson", "spearman")
    np.testing.assert_allclose(scores.train.labels, [r["score"] for r in corpus_rows[:80]], rtol=1e-6)


def test_missing_field_names_the_file_and_its_fields(corpus_rows, tmp_path):
    with pytest.raises(TpulmError, match=r"train\.csv has no field 'label'; its fields: sentence, "
                                         r"next, size, parity, score"):
        _file_task(corpus_rows, tmp_path, ".csv", text_field="sentence")


def test_label_sets_that_differ_name_both_splits(corpus_rows, tmp_path):
    rows = [dict(r, size="tiny") if i == 100 else r for i, r in enumerate(corpus_rows)]
    with pytest.raises(TpulmError, match=r"label sets .*/train\.tsv has \['long', 'short'\], "
                                         r".*valid\.tsv has \['long', 'short', 'tiny'\]"):
        _file_task(rows, tmp_path, ".tsv", text_field="sentence", label_field="size")


def test_unknown_task_and_offline_glue_are_clear_errors():
    with pytest.raises(TpulmError, match=r"unknown task 'glue:foo'; known: glue:sst2, .*"
                                         r"builtin:replaced-words"):
        tasks.load_task("glue:foo")
    assert os.environ["HF_DATASETS_OFFLINE"] == "1"
    with pytest.raises(TpulmError, match=r"glue:rte needs the network .* offline .*--train-file"):
        tasks.load_task("glue:rte")


def test_builtin_task_is_balanced_deterministic_and_corrupts_words():
    task = tasks.load_task("builtin:replaced-words")
    assert (len(task.train), len(task.validation)) == (4000, 1000)
    for split in (task.train, task.validation):
        assert split.labels.mean() == 0.5
    assert not set(task.train.texts) & set(task.validation.texts)
    assert tasks.load_task("builtin:replaced-words").train.texts == task.train.texts
    # A replaced sentence differs from every original of its split in at least 2 words, with the
    # word count unchanged: the label is about which words, not how many.
    originals = {len(t.split()) for t, y in zip(task.train.texts, task.train.labels) if y == 0}
    corrupted = [t.split() for t, y in zip(task.train.texts, task.train.labels) if y == 1]
    assert {len(words) for words in corrupted} <= set(range(6, 17)) and originals <= set(range(6, 17))


# ---------------------------------------------------------------------------------------------
# Fine-tuning a pretrained tiny model


def _pretrain(work: Path) -> Path:
    """A tiny RoBERTa briefly pretrained on the built-in corpus with `tpulm run`: its run dir."""
    overrides = [
        "tokenizer.vocab_size=1000", "model.hidden_size=64", "model.intermediate_size=256",
        "model.num_heads=2", "train.batch_size=32", "train.learning_rate=3e-3",
        f"train.max_steps={PRETRAIN_STEPS}", f"train.eval_every={PRETRAIN_STEPS}",
        f"train.checkpoint_every={PRETRAIN_STEPS}", "train.progress=false", "run.report=false",
    ]
    argv = [sys.executable, "-m", "tpulm", "run", "--work-dir", str(work)]
    for assignment in overrides:
        argv += ["--set", assignment]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(SRC), "RUN_FILL_MASK": "0"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return work / "run"


PRETRAIN_STEPS = 1500
