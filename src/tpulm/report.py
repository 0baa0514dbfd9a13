"""Training reports: curves as a PNG and a self-contained HTML page, from a run dir's metrics.

``run(run_dir)`` reads ``metrics.jsonl`` (format and reader in ``tpulm.metrics_log``) and ``config.toml``, and
writes two files into the run dir, each atomically:

* ``report.png``: four panels over optimizer steps: loss (train and eval), masked-token accuracy
  (train and eval), learning rate, and training throughput in tokens per second;
* ``report.html``: the same picture embedded as base64 (the page needs no other file), a table of
  the final figures, and the run's config.

A run that was resumed from a checkpoint logs the steps after that checkpoint twice; the later
records replace the earlier ones, so curves show the history the final model actually has.
matplotlib (the ``report`` extra) is imported only when a picture is drawn.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from tpulm import ownership, rundir, storage
from tpulm.errors import TpulmError
from tpulm.metrics_log import read_metrics

log = logging.getLogger(__name__)

PNG_NAME = "report.png"
HTML_NAME = "report.html"
WRITERS = ("report",)  # whose report files a new report may replace (tpulm.ownership)
# 1200 x 800 pixels: readable on a laptop screen and in a README.
FIGSIZE = (12.0, 8.0)
DPI = 100


def history(records: Sequence[Mapping[str, Any]], split: str) -> list[Mapping[str, Any]]:
    """The records of one split as the final model lived them, in step order.

    A record whose step is not past the previous one starts a resumed run: it replaces the
    records from that step on.
    """
    kept: list[Mapping[str, Any]] = []
    for record in records:
        if record["split"] != split:
            continue
        while kept and kept[-1]["step"] >= record["step"]:
            kept.pop()
        kept.append(record)
    return kept


# ---------------------------------------------------------------------------------------------
# Final figures


@dataclasses.dataclass(frozen=True)
class Figures:
    """The final figures of a run.

    Attributes:
        steps: the last optimizer step logged.
        tokens: tokens seen by then (padding included, as the trainer counts them).
        wall_time: seconds since the run started, at the last record.
        train_loss: masked-LM loss of the last train record (None without train records).
        train_accuracy: masked-token accuracy of the last train record.
        eval_step: step of the last evaluation (None without eval records).
        eval_loss: loss of the last evaluation.
        eval_accuracy: masked-token accuracy of the last evaluation.
        eval_perplexity: perplexity of the last evaluation.
        tokens_per_second: mean of the train records' throughput, the first left out when there
            are more (it includes the XLA compilation).
    """

    steps: int
    tokens: int
    wall_time: float
    train_loss: float | None
    train_accuracy: float | None
    eval_step: int | None
    eval_loss: float | None
    eval_accuracy: float | None
    eval_perplexity: float | None
    tokens_per_second: float | None


def summarize(records: Sequence[Mapping[str, Any]]) -> Figures:
    """The final figures of a run from its records (see ``read_metrics``)."""
    train, evals = history(records, "train"), history(records, "eval")
    if not train and not evals:
        raise TpulmError("metrics hold no train or eval record yet: nothing to report")
    last = max([*train, *evals], key=lambda r: (r["step"], r["time"]))
    speeds = [r["tokens_per_second"] for r in train[1:] or train]
    final_train = train[-1] if train else {}
    final_eval = evals[-1] if evals else {}
    return Figures(
        steps=last["step"],
        tokens=int(last["tokens"]),
        wall_time=float(last["time"]),
        train_loss=final_train.get("loss"),
        train_accuracy=final_train.get("accuracy"),
        eval_step=final_eval.get("step"),
        eval_loss=final_eval.get("loss"),
        eval_accuracy=final_eval.get("accuracy"),
        eval_perplexity=final_eval.get("perplexity"),
        tokens_per_second=sum(speeds) / len(speeds) if speeds else None,
    )


def format_duration(seconds: float) -> str:
    """``3725.4`` -> ``"1:02:05"``."""
    whole = int(round(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def figure_rows(figures: Figures) -> list[tuple[str, str, str, Any]]:
    """(key, label, shown text, exact value) for each final figure, in table order."""
    def num(value: float | None, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    f = figures
    return [
        ("steps", "Steps", f"{f.steps:,}", f.steps),
        ("tokens", "Tokens seen", f"{f.tokens:,}", f.tokens),
        ("wall_time", "Wall time", format_duration(f.wall_time), f.wall_time),
        ("train_loss", "Final train loss", num(f.train_loss, ".4f"), f.train_loss),
        ("train_accuracy", "Final train accuracy", num(f.train_accuracy, ".2%"), f.train_accuracy),
        ("eval_step", "Last eval at step", "n/a" if f.eval_step is None else f"{f.eval_step:,}",
         f.eval_step),
        ("eval_loss", "Final eval loss", num(f.eval_loss, ".4f"), f.eval_loss),
        ("eval_accuracy", "Final eval accuracy", num(f.eval_accuracy, ".2%"), f.eval_accuracy),
        ("eval_perplexity", "Final eval perplexity", num(f.eval_perplexity, ".2f"),
         f.eval_perplexity),
        ("tokens_per_second", "Mean tokens/s", num(f.tokens_per_second, ",.0f"),
         f.tokens_per_second),
    ]


# ---------------------------------------------------------------------------------------------
# The picture


def _figure_class():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise TpulmError(
            "tpulm report needs matplotlib: pip install 'tpulm[report]' (or pip install matplotlib)"
        ) from None
    return Figure


def _panel(ax, title: str, ylabel: str, bottom: bool) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_title(title, fontsize=12, loc="left", fontweight="bold")
    if bottom:  # the panels share the step axis: label it once per column
        ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, color="#dddddd", linewidth=0.8)
    ax.spines[["top", "right"]].set_visible(False)
    ax.ticklabel_format(axis="x", style="plain", useOffset=False)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))


TRAIN_STYLE = {"color": "#1f77b4", "linewidth": 1.6, "label": "train"}
EVAL_STYLE = {"color": "#d62728", "linewidth": 1.6, "marker": "o", "markersize": 4,
              "label": "eval"}


def _curve(ax, records: Sequence[Mapping[str, Any]], key: str, style: dict, scale: float = 1.0):
    if records:
        if len(records) == 1:  # a lone point has no line to show: mark it
            style = {"marker": "o", **style}
        ax.plot([r["step"] for r in records], [r[key] * scale for r in records], **style)


def _power_of_ten(values: Sequence[float]) -> int:
    """The exponent that brings the largest value into [1, 10), so ticks read 0.2 ... 1.0."""
    largest = max((abs(v) for v in values if v == v), default=0.0)  # v == v drops NaN
    return math.floor(math.log10(largest)) if largest > 0 and math.isfinite(largest) else 0


def render_png(records: Sequence[Mapping[str, Any]], title: str, subtitle: str = "") -> bytes:
    """The four-panel picture of a run as PNG bytes (``FIGSIZE`` at ``DPI``)."""
    from matplotlib.ticker import EngFormatter, PercentFormatter

    train, evals = history(records, "train"), history(records, "eval")
    fig = _figure_class()(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    (loss, acc), (lr, speed) = fig.subplots(2, 2, sharex=True)
    _panel(loss, "Loss (masked tokens)", "cross-entropy", bottom=False)
    _curve(loss, train, "loss", TRAIN_STYLE)
    _curve(loss, evals, "loss", EVAL_STYLE)
    _panel(acc, "Masked-token accuracy", "accuracy", bottom=False)
    _curve(acc, train, "accuracy", TRAIN_STYLE, scale=100.0)
    _curve(acc, evals, "accuracy", EVAL_STYLE, scale=100.0)
    acc.yaxis.set_major_formatter(PercentFormatter(decimals=None))
    acc.set_ylim(bottom=0)
    # The scale goes into the label: matplotlib's "1e-3" offset text collides with the title.
    power = _power_of_ten([r["learning_rate"] for r in train])
    _panel(lr, "Learning rate", f"learning rate (\u00d71e{power})" if power else "learning rate",
           bottom=True)
    _curve(lr, train, "learning_rate", {**TRAIN_STYLE, "color": "#2ca02c"}, scale=10.0**-power)
    _panel(speed, "Throughput", "tokens / second", bottom=True)
    _curve(speed, train, "tokens_per_second", {**TRAIN_STYLE, "color": "#9467bd"})
    speed.yaxis.set_major_formatter(EngFormatter(sep=""))
    speed.set_ylim(bottom=0)
    for ax in (loss, acc):
        if ax.lines:
            ax.legend(frameon=False)
    loss.set_xlim(left=0)  # shared by all panels; steps count from 0
    fig.suptitle(f"{title}\n{subtitle}" if subtitle else title, fontsize=13)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, facecolor="white")
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------
# The page

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 1240px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.5em; }
img { max-width: 100%; border: 1px solid #ddd; }
table { border-collapse: collapse; } td, th { padding: 0.3em 1em; border-bottom: 1px solid #eee; }
td.value { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; }
"""


def render_html(title: str, png: bytes, figures: Figures, config_text: str | None,
                evaluation: str | None = None) -> str:
    """A page that needs no other file: the picture inline, the final figures, the config, and
    the downstream evaluation table when there is one."""
    rows = "\n".join(
        f'<tr><th scope="row">{html.escape(label)}</th><td class="value" data-key="{key}" '
        f'data-value="{html.escape(json.dumps(value))}">{html.escape(shown)}</td></tr>'
        for key, label, shown, value in figure_rows(figures)
    )
    config = (
        f"<pre>{html.escape(config_text)}</pre>"
        if config_text is not None
        else f"<p>No {rundir.CONFIG_NAME} in the run dir.</p>"
    )
    image = base64.b64encode(png).decode("ascii")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{html.escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<h1>{html.escape(title)}</h1>\n"
        f'<img alt="training curves" src="data:image/png;base64,{image}">\n'
        f"<h2>Final figures</h2>\n<table>\n{rows}\n</table>\n"
        + (f"<h2>Downstream evaluation</h2>\n<pre>{html.escape(evaluation)}</pre>\n"
           if evaluation else "") +
        "<p>Losses and accuracies are over masked tokens only. Mean tokens/s leaves out the "
        "first train log, whose interval includes compilation.</p>\n"
        f"<h2>Config ({rundir.CONFIG_NAME})</h2>\n{config}\n</body>\n</html>\n"
    )


# ---------------------------------------------------------------------------------------------
# The stage


@dataclasses.dataclass(frozen=True)
class Report:
    """What ``run`` wrote: the two files and the figures shown in the page."""

    png: str
    html: str
    figures: Figures
    evaluation: str | None = None  # the table of RUN_DIR/eval/results.json, if there is one


def run(run_dir: str) -> Report:
    """Write ``report.png`` and ``report.html`` into a run dir, from its metrics and config.

    Args:
        run_dir: a run dir (local, ``gs://``, ``ram://`` ...) with a ``metrics.jsonl``.

    Returns:
        The paths written and the final figures.

    Raises:
        TpulmError: no run dir, no or bad metrics, or matplotlib missing.
    """
    if not storage.isdir(run_dir):
        raise TpulmError(f"run dir {run_dir} does not exist")
    ownership.check_files(run_dir, (PNG_NAME, HTML_NAME), WRITERS, "tpulm report would replace",
                          "choose another run dir")
    records = read_metrics(storage.join(run_dir, rundir.METRICS_NAME))
    figures = summarize(records)
    config_path = storage.join(run_dir, rundir.CONFIG_NAME)
    config_text = storage.read_text(config_path) if storage.exists(config_path) else None
    title = rundir.made_by(run_dir)
    png = render_png(records, title, headline(figures))
    report = Report(
        png=storage.join(run_dir, PNG_NAME), html=storage.join(run_dir, HTML_NAME), figures=figures,
        evaluation=evaluation_table(run_dir),
    )
    storage.write_bytes(report.png, png)
    storage.write_text(report.html, render_html(title, png, figures, config_text, report.evaluation))
    ownership.record(run_dir, (PNG_NAME, HTML_NAME), "report")
    return report


def evaluation_table(run_dir: str) -> str | None:
    """The table of ``tpulm evaluate``'s ``RUN_DIR/eval/results.json``, or None without one."""
    from tpulm.evaluate import run as evaluate

    path = storage.join(run_dir, evaluate.EVAL_DIR, evaluate.RESULTS_NAME)
    if not storage.exists(path):
        return None
    try:
        return evaluate.format_table(json.loads(storage.read_text(path))["tasks"])
    except (ValueError, KeyError, TypeError) as err:
        raise TpulmError(f"{path} is not a results file of `tpulm evaluate`: {err}") from None


def headline(figures: Figures) -> str:
    """One line with the figures that matter most, for the picture's title."""
    rows = {key: shown for key, _, shown, _ in figure_rows(figures)}
    parts = [f"{rows['steps']} steps", f"{rows['tokens']} tokens", f"wall time {rows['wall_time']}"]
    if figures.eval_loss is not None:
        parts.append(
            f"eval loss {rows['eval_loss']}, accuracy {rows['eval_accuracy']}, "
            f"perplexity {rows['eval_perplexity']}"
        )
    elif figures.train_loss is not None:
        parts.append(f"train loss {rows['train_loss']}, accuracy {rows['train_accuracy']}")
    return "  \u00b7  ".join(parts)


def describe(figures: Figures) -> str:
    """The final figures as aligned text lines, for a terminal."""
    rows = figure_rows(figures)
    width = max(len(label) for _, label, _, _ in rows)
    return "\n".join(f"{label:<{width}}  {shown}" for _, label, shown, _ in rows)
