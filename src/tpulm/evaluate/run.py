"""The ``tpulm evaluate`` stage: fine-tune a pretrained model on tasks, write ``results.json``.

MODEL is a run dir (latest checkpoint, or ``step``), a checkpoint folder of one, or an exported
Transformers folder (read as ``tpulm fill-mask`` reads them). Every task is fine-tuned ``seeds``
times from the pretrained weights and, with ``from_scratch``, as many times from a random
initialisation of the same architecture with the same hyper-parameters: the baseline that shows
what pretraining bought.

Results go to ``RUN_DIR/eval/results.json`` for a run dir or checkpoint, to
``EXPORT_DIR/eval/results.json`` for an export folder, or to ``output``. Tasks already in that
file from earlier runs are kept (a task evaluated again is replaced). Layout::

    {"format_version": 1, "tasks": {NAME: {
        "model": MODEL, "model_kind": "run" | "checkpoint" | "export", "kind": ..., "metrics":
        [...], "main_metric": ..., "train_examples": n, "validation_examples": n, "width": tokens,
        "settings": {hyper-parameters}, "backend": ...,
        "pretrained": {"summary": {"mean", "std", "min", "max", "median", "n"}, "runs": [...]},
        "from_scratch": {...same, only with from_scratch}}}}

Each run is ``{"seed", "epochs": [{metric: score, "train_loss", "seconds"}], "best_epoch"
(1-based), "best": {metric: score}, "tokens_per_second", "learning_rate"}``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import numpy as np

from tpulm import config, ownership, storage, trained_model
from tpulm.data import tokenizer
from tpulm.errors import TpulmError
from tpulm.evaluate import finetune, tasks
from tpulm.evaluate.finetune import FinetuneConfig
from tpulm.training import backends

log = logging.getLogger(__name__)

EVAL_DIR = "eval"
RESULTS_NAME = "results.json"
FORMAT_VERSION = 1
VARIANTS = ("pretrained", "from_scratch")


@dataclasses.dataclass(frozen=True)
class EvaluateConfig(FinetuneConfig):
    """Settings of ``tpulm evaluate`` (the ``[evaluate]`` table of a config file)."""

    model: str = config.setting("", "run dir, checkpoint folder or exported Transformers folder")
    step: int | None = config.setting(None, "checkpoint step of a run dir (default: latest)")
    tasks: tuple[str, ...] = config.setting((), "task names (glue:rte, builtin:replaced-words ...)")
    train_file: str | None = config.setting(None, "a local-file task: train split (CSV, TSV, "
                                                  "JSONL, Parquet; local or gs://)")
    validation_file: str | None = config.setting(None, "a local-file task: validation split")
    text_field: str = config.setting("text", "field of the text in --train-file/--validation-file")
    text_pair_field: str | None = config.setting(None, "field of the second text of a pair")
    label_field: str = config.setting("label", "field of the label (str/int: classes; float: "
                                               "regression)")
    seeds: int = config.setting(1, "fine-tuning runs per task (seeds seed, seed+1, ...)")
    seed: int = config.setting(0, "first seed")
    from_scratch: bool = config.setting(
        False, "also fine-tune the same architecture from a random initialisation (baseline)")
    output: str | None = config.setting(None, "results file (default: RUN_DIR/eval/results.json "
                                              "or EXPORT_DIR/eval/results.json)")
    overwrite: bool = config.setting(
        False, "replace the results file even if tpulm did not write it or it changed since")
    backend: str | None = config.setting(
        None, "Keras backend, tensorflow or jax (default: KERAS_BACKEND, else tensorflow)",
        choices=backends.BACKENDS)

    def __post_init__(self) -> None:
        super().__post_init__()
        config.check_at_least(self, 1, "seeds")
        config.check_at_least(self, 0, "seed", "step")
        if (self.train_file is None) != (self.validation_file is None):
            raise TpulmError("a local-file task needs both --train-file and --validation-file")

    def finetune_settings(self) -> dict[str, Any]:
        """The hyper-parameters, as recorded in the results."""
        names = {f.name for f in dataclasses.fields(FinetuneConfig)}
        return {k: v for k, v in config.as_table(self).items() if k in names}


@dataclasses.dataclass(frozen=True)
class EvaluateResult:
    """What ``run`` did: the results file and the tasks evaluated now (its ``tasks`` entries)."""

    path: str
    tasks: dict[str, Any]


def load_tasks(cfg: EvaluateConfig) -> list:
    """All tasks of ``cfg``, loaded before any training so that a bad task fails fast."""
    loaded = [tasks.load_task(name) for name in cfg.tasks]
    if cfg.train_file:
        loaded.append(tasks.load_file_task(tasks.FileTask(
            cfg.train_file, cfg.validation_file, cfg.text_field, cfg.text_pair_field,
            cfg.label_field)))
    if not loaded:
        raise TpulmError("no task given: pass --task NAME (e.g. builtin:replaced-words) or "
                         "--train-file and --validation-file")
    return loaded


def summarize(scores: list[float]) -> dict[str, float]:
    """Mean, std (population), min, max, median and count of one metric over seeds."""
    values = np.asarray(scores, np.float64)
    return {"mean": float(values.mean()), "std": float(values.std()), "min": float(values.min()),
            "max": float(values.max()), "median": float(np.median(values)), "n": len(values)}


def results_path(cfg: EvaluateConfig, loaded) -> str:
    """Where the results go: ``output``, else ``eval/results.json`` in the run or export dir."""
    if cfg.output:
        return cfg.output
    return storage.join(loaded.run_dir or cfg.model, EVAL_DIR, RESULTS_NAME)


def _builders(loaded):
    """``{variant: build_network}``: the pretrained weights, or a fresh initialisation."""
    from keras import ops

    from tpulm.model.networks import build_model

    arrays = [ops.convert_to_numpy(v) for v in loaded.model.weights]

    def pretrained():
        network = build_model(loaded.config, dtype="float32")
        for variable, value in zip(network.weights, arrays):  # same build, same order
            variable.assign(value)
        return network

    return {"pretrained": pretrained,
            "from_scratch": lambda: build_model(loaded.config, dtype="float32")}


def evaluate_task(task, loaded, tokenizer, pad_id: int, cfg: EvaluateConfig) -> dict[str, Any]:
    """Fine-tune ``task`` ``cfg.seeds`` times per variant; its entry of ``results.json``."""
    import keras

    max_length = min(cfg.max_length, loaded.config.max_positions)
    encoded = finetune.encode(tokenizer, task, max_length, pad_id)
    entry: dict[str, Any] = {
        "model": cfg.model, "model_kind": loaded.kind, "kind": task.kind,
        "metrics": list(task.metrics), "main_metric": task.metrics[0],
        "train_examples": len(task.train), "validation_examples": len(task.validation),
        "width": encoded.width, "settings": cfg.finetune_settings(),
        "backend": keras.backend.backend()}
    variants = VARIANTS if cfg.from_scratch else VARIANTS[:1]
    builders = _builders(loaded)
    for variant in variants:
        runs = [finetune.finetune(builders[variant], task, encoded, cfg, cfg.seed + i)
                for i in range(cfg.seeds)]
        entry[variant] = {"summary": summarize([r.best[task.metrics[0]] for r in runs]),
                          "runs": [dataclasses.asdict(r) for r in runs]}
        log.info("%s %s: %s %.4f", task.name, variant, task.metrics[0],
                 entry[variant]["summary"]["mean"])
    return entry


def _split(path: str) -> tuple[str, str]:
    """(folder, name) of a results file; the folder is '.' for a bare name."""
    parent, _, name = path.rstrip("/").rpartition("/")
    return parent or ".", name


def check_output(path: str, overwrite: bool) -> bool:
    """Whether the results file ``path`` is tpulm's (its tasks are kept); refuses, before any
    fine-tuning, to replace a file tpulm did not write (or that changed since) unless
    ``overwrite``."""
    if not storage.exists(path):
        return False
    folder, name = _split(path)
    try:
        ownership.check_files(folder, (name,), ("evaluate",), "tpulm evaluate would replace",
                              "pass --overwrite to replace it, or another --output")
    except TpulmError:
        if not overwrite:
            raise
        log.warning("replacing %s, which tpulm did not write (--overwrite)", path)
        return False
    return True


def _merge_write(path: str, entries: dict[str, Any], merge: bool) -> None:
    """Write ``entries`` into the results file, keeping other tasks already there when
    ``merge`` (the file is tpulm's), and record it as tpulm's."""
    old: dict[str, Any] = {}
    if merge:
        try:
            old = json.loads(storage.read_text(path)).get("tasks", {})
        except ValueError:
            log.warning("%s is not valid JSON; it is replaced", path)
    record = {"format_version": FORMAT_VERSION, "tasks": {**old, **entries}}
    folder, name = _split(path)
    storage.makedirs(folder)
    storage.write_text(path, json.dumps(record, indent=2, allow_nan=True) + "\n")
    ownership.record(folder, (name,), "evaluate")


def run(cfg: EvaluateConfig) -> EvaluateResult:
    """Fine-tune and score ``cfg.model`` on every task; write and return the results."""
    backends.activate(cfg.backend)  # before anything imports Keras
    if not cfg.model:
        raise TpulmError("no model given: pass a run dir, checkpoint folder or export folder")
    storage.check_reachable(cfg.model, "model")  # in seconds, not after fine-tuning
    storage.check_reachable(cfg.output, "--output", write=True)
    tasks = load_tasks(cfg)
    # The results file is checked before the fine-tuning (and a given one before the model loads).
    merge = check_output(cfg.output, cfg.overwrite) if cfg.output else None
    loaded = trained_model.load(cfg.model, cfg.step)
    tok = tokenizer.open_folder(loaded.tokenizer_dir)
    path = results_path(cfg, loaded)
    if merge is None:
        merge = check_output(path, cfg.overwrite)
    entries = {task.name: evaluate_task(task, loaded, tok.tokenizer, tok.special.pad_id, cfg)
               for task in tasks}
    _merge_write(path, entries, merge)
    return EvaluateResult(path, entries)


def _score(summary: dict[str, float]) -> str:
    if summary["n"] == 1:
        return f"{summary['mean']:.4f}"
    return (f"{summary['mean']:.4f} ±{summary['std']:.4f} "
            f"[{summary['min']:.4f}, {summary['max']:.4f}]")


def format_table(entries: dict[str, Any]) -> str:
    """Task results as aligned text: main metric, mean ± std [min, max] over seeds, gain."""
    header = ("task", "metric", "seeds", "pretrained", "from scratch", "gain")
    rows = [header]
    for name, entry in entries.items():
        pre, scratch = entry["pretrained"]["summary"], entry.get("from_scratch", {}).get("summary")
        gain = f"{pre['mean'] - scratch['mean']:+.4f}" if scratch else "-"
        rows.append((name, entry["main_metric"], str(pre["n"]), _score(pre),
                     _score(scratch) if scratch else "-", gain))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                     for row in rows)
