"""The standard downstream scores in numpy: accuracy, F1, Matthews correlation, Pearson, Spearman.

Each function takes the gold labels and the predictions (class ids, or floats for regression)
and returns a Python float. They agree with scikit-learn and scipy (tested), with their
conventions for degenerate input: F1 and Matthews are 0 when undefined; a correlation with a
constant input is NaN.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def accuracy(labels, predictions) -> float:
    """Share of predictions equal to the label."""
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    return float(np.mean(labels == predictions))


def f1(labels, predictions, positive: int = 1) -> float:
    """F1 of the ``positive`` class (GLUE's MRPC and QQP: class 1), 0 when undefined."""
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    true_pos = np.sum((predictions == positive) & (labels == positive))
    denominator = np.sum(predictions == positive) + np.sum(labels == positive)
    return float(2 * true_pos / denominator) if denominator else 0.0


def matthews(labels, predictions) -> float:
    """Matthews correlation (multi-class form, Gorodkin 2004), 0 when undefined (CoLA's metric)."""
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    classes = np.union1d(labels, predictions)
    # confusion[i, j]: examples of true class i predicted as class j.
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)
    np.add.at(confusion, (np.searchsorted(classes, labels), np.searchsorted(classes, predictions)), 1)
    total, correct = confusion.sum(), np.trace(confusion)
    true_counts, pred_counts = confusion.sum(axis=1), confusion.sum(axis=0)
    numerator = correct * total - true_counts @ pred_counts
    denominator = np.sqrt((total**2 - pred_counts @ pred_counts) * (total**2 - true_counts @ true_counts))
    return float(numerator / denominator) if denominator else 0.0


def pearson(labels, predictions) -> float:
    """Pearson correlation; NaN when either side is constant."""
    x = np.asarray(labels, dtype=np.float64)
    y = np.asarray(predictions, dtype=np.float64)
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt((x @ x) * (y @ y))
    return float(x @ y / denominator) if denominator else float("nan")


def _ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given their average rank (as scipy.stats.rankdata)."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(values)]
    average = (starts + ends + 1) / 2.0  # mean of the 1-based ranks starts+1 .. ends
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.repeat(average, ends - starts)
    return ranks


def spearman(labels, predictions) -> float:
    """Spearman rank correlation: Pearson of the (tie-averaged) ranks."""
    return pearson(_ranks(np.asarray(labels, dtype=np.float64)),
                   _ranks(np.asarray(predictions, dtype=np.float64)))


METRICS: dict[str, Callable[..., float]] = {
    "accuracy": accuracy, "f1": f1, "matthews": matthews, "pearson": pearson,
    "spearman": spearman,
}


def compute(names: tuple[str, ...], labels, predictions) -> dict[str, float]:
    """``{name: score}`` for the metrics ``names`` (keys of ``METRICS``)."""
    return {name: METRICS[name](labels, predictions) for name in names}
