"""``tpulm run``: every stage in order, into one work dir, from one TOML config.

Stages: corpus (the embedded demo corpus, when no files or dataset are named) -> tokenizer ->
data (shards) -> train -> export -> report -> fill-mask. Each stage is also a command of its own;
here they are chained with paths derived from the work dir::

    WORK/corpus/      demo corpus (train/validation/test .txt), only for corpus = "builtin"
    WORK/tokenizer/   tokenizer folder
    WORK/data/        shards, one folder per split
    WORK/run/         run dir: checkpoints, metrics, report.png/html, export/
    WORK/stages/      one record per stage: the key of the settings it ran with, and whether done

A stage's key hashes its own settings and the keys of the stages it reads from. On a rerun a stage
whose record is complete with the same key is skipped; one that was interrupted runs again with
the same key and resumes by itself (shards and checkpoints are resumable); a stage whose key
changed has its outputs removed and runs afresh, and so, through the key chain, does every stage
downstream of it — and only those.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any

from tpulm import config, rundir, storage
from tpulm.errors import TpulmError

log = logging.getLogger(__name__)

CORPUS_CHOICES = ("builtin", "files", "dataset")
STAGES_DIR = "stages"



@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Settings of ``tpulm run`` (TOML table ``[run]``); the stages read their own tables."""

    work_dir: str = config.setting("tpulm-work", "folder for every stage's output (local or gs://)")
    corpus: str = config.setting(
        "builtin",
        "builtin: English prose shipped with Python (offline); files: the *_files settings; "
        "dataset: a 🤗 dataset",
        choices=CORPUS_CHOICES,
    )
    train_files: tuple[str, ...] = config.setting((), "text files/globs of the train split")
    validation_files: tuple[str, ...] = config.setting((), "text files/globs of the validation split")
    test_files: tuple[str, ...] = config.setting((), "text files/globs of the test split")
    dataset: str | None = config.setting(
        None, "🤗 dataset as NAME or NAME:CONFIG, e.g. wikitext:wikitext-103-raw-v1 (needs network)"
    )
    text_field: str = config.setting("text", "field holding the text in .jsonl/.parquet/datasets")
    fill_mask: tuple[str, ...] = config.setting(
        (), "texts with [MASK] to answer at the end (default for the builtin corpus: its prompts)"
    )
    top_k: int = config.setting(5, "fill-mask answers per mask")
    report: bool = config.setting(True, "write report.png and report.html into the run dir")

    def __post_init__(self) -> None:
        if self.dataset and self.corpus != "dataset":
            object.__setattr__(self, "corpus", "dataset")
        if self.corpus == "files" and not self.train_files:
            raise ValueError("corpus = 'files' needs train_files")
        if self.corpus == "dataset" and not self.dataset:
            raise ValueError("corpus = 'dataset' needs dataset = 'NAME' or 'NAME:CONFIG'")


@dataclasses.dataclass(frozen=True)
class Stage:
    """One step of the pipeline: what it runs, the folder it owns, and what it reads from."""

    name: str
    run: Callable[[], Any]
    settings: Mapping[str, Any]  # everything that changes its output
    outputs: tuple[str, ...]  # removed when the settings change
    upstream: tuple[str, ...] = ()


def key_of(settings: Mapping[str, Any], upstream_keys: list[str]) -> str:
    """A stable hash of a stage's settings and the keys of the stages it reads from."""
    text = json.dumps({"settings": settings, "upstream": upstream_keys}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _record_path(work_dir: str, name: str) -> str:
    return storage.join(work_dir, STAGES_DIR, f"{name}.json")


def read_record(work_dir: str, name: str) -> dict[str, Any] | None:
    path = _record_path(work_dir, name)
    if not storage.exists(path):
        return None
    try:
        return json.loads(storage.read_text(path))
    except ValueError:
        return None  # a damaged record only costs a rerun of its stage


def write_record(work_dir: str, name: str, key: str, complete: bool) -> None:
    storage.makedirs(storage.join(work_dir, STAGES_DIR))
    record = {"key": key, "complete": complete}
    storage.write_text(_record_path(work_dir, name), json.dumps(record) + "\n")


def _refuse_foreign_outputs(stages: list[Stage], work_dir: str) -> None:
    """Before anything runs: a stage that never ran in this work dir must find its output folders
    missing or empty; what is there is not tpulm's, and a later change of settings would remove
    it with the stage's outputs."""
    for stage in stages:
        if not storage.exists(_record_path(work_dir, stage.name)):
            for path in stage.outputs:
                storage.check_replaceable(path, overwrite=False, ours=())


def execute(stages: list[Stage], work_dir: str) -> dict[str, Any]:
    """Run ``stages`` in order, skipping complete ones; returns each stage's result (or None)."""
    _refuse_foreign_outputs(stages, work_dir)
    keys: dict[str, str] = {}
    results: dict[str, Any] = {}
    for stage in stages:
        key = key_of(stage.settings, [keys[u] for u in stage.upstream])
        keys[stage.name] = key
        record = read_record(work_dir, stage.name)
        if record and record["key"] == key and record["complete"]:
            log.info("stage %s: complete, skipped", stage.name)
            results[stage.name] = None
            continue
        if record and record["key"] != key:
            log.info("stage %s: settings changed, removing its old outputs", stage.name)
            for path in stage.outputs:
                if storage.exists(path):
                    storage.rmtree(path)
        resuming = record is not None and record["key"] == key
        log.info("stage %s: %s", stage.name, "resuming" if resuming else "running")
        write_record(work_dir, stage.name, key, complete=False)
        results[stage.name] = stage.run()
        write_record(work_dir, stage.name, key, complete=True)
    return results


# ---------------------------------------------------------------------------------------------
# The tpulm stages, wired together.


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each stage writes inside the work dir."""

    work_dir: str

    def path(self, name: str) -> str:
        return storage.join(self.work_dir, name)

    @property
    def corpus(self) -> str:
        return self.path("corpus")

    @property
    def tokenizer(self) -> str:
        return self.path("tokenizer")

    @property
    def data(self) -> str:
        return self.path("data")

    @property
    def run(self) -> str:
        return self.path("run")

    @property
    def export(self) -> str:
        return storage.join(self.run, rundir.EXPORT_DIR)


def split_inputs(run: RunConfig, layout: Layout) -> dict[str, Any]:
    """The corpus settings of the data stage (``PrepareConfig`` fields)."""
    if run.corpus == "builtin":
        return {f"{split}_files": (storage.join(layout.corpus, f"{split}.txt"),)
                for split in ("train", "validation", "test")}
    if run.corpus == "files":
        return {"train_files": run.train_files, "validation_files": run.validation_files,
                "test_files": run.test_files, "text_field": run.text_field}
    name, _, subset = run.dataset.partition(":")
    return {"dataset": name, "dataset_config": subset or None, "text_field": run.text_field}


def tokenizer_inputs(run: RunConfig, layout: Layout) -> dict[str, Any]:
    """The corpus settings of the tokenizer stage (``TokenizerConfig`` fields): the train split."""
    splits = split_inputs(run, layout)
    if "train_files" in splits:
        return {"inputs": splits["train_files"], "text_field": run.text_field}
    return {"dataset": splits["dataset"], "dataset_config": splits["dataset_config"],
            "dataset_split": "train", "text_field": run.text_field}


@dataclasses.dataclass(frozen=True)
class Plan:
    """A resolved root config: the run settings, the stages, and the fill-mask prompts."""

    run: RunConfig
    layout: Layout
    stages: list[Stage]
    prompts: tuple[str, ...]


def plan(tables: Mapping[str, Mapping[str, Any]], where: str) -> Plan:
    """Resolve a root config ``{table: {key: value}}`` (read from ``where``) into stages."""
    unknown = sorted(set(tables) - set(config.TABLES))
    if unknown:
        raise TpulmError(
            f"unknown table(s) {', '.join(unknown)} in {where}; known: {', '.join(config.TABLES)}")
    from tpulm import report, training
    from tpulm.data import builtin_corpus, prepare, tokenizer
    from tpulm.hf import export

    run = config.from_mapping(RunConfig, tables.get("run", {}), f"[run] of {where}")
    layout = Layout(run.work_dir)
    tok_cfg = config.resolve(
        tokenizer.TokenizerConfig, None, tables.get("tokenizer", {}), f"[tokenizer] of {where}",
        output=layout.tokenizer, overwrite=True, **tokenizer_inputs(run, layout))
    data_cfg = config.resolve(
        prepare.PrepareConfig, None, tables.get("data", {}), f"[data] of {where}",
        tokenizer=layout.tokenizer, output=layout.data, **split_inputs(run, layout))
    train_cfg = config.resolve(
        training.TrainConfig, None, tables.get("train", {}), f"[train] of {where}",
        train_data=storage.join(layout.data, "train"),
        eval_data=storage.join(layout.data, "validation"),
        tokenizer=layout.tokenizer, run_dir=layout.run)
    model_table = dict(tables.get("model", {}))
    builtin = run.corpus == "builtin"

    stages = [Stage("corpus", lambda: builtin_corpus.write_demo_corpus(layout.corpus),
                    {"python": sys.version}, (layout.corpus,))] if builtin else []
    stages += [
        Stage("tokenizer", lambda: tokenizer.run(tok_cfg), config.as_table(tok_cfg),
              (layout.tokenizer,), ("corpus",) if builtin else ()),
        Stage("data", lambda: prepare.run(data_cfg), config.as_table(data_cfg), (layout.data,),
              ("tokenizer",)),
        Stage("train", lambda: training.run(train_cfg, model_table),
              {"train": config.as_table(train_cfg), "model": model_table}, (layout.run,),
              ("data",)),
        Stage("export", lambda: export.write_export(layout.run, layout.export, overwrite=True),
              {}, (layout.export,), ("train",)),
    ]
    if run.report:
        stages.append(Stage("report", lambda: report.run(layout.run), {}, (), ("train",)))
    prompts = run.fill_mask or (
        tuple(prompt for prompt, _ in builtin_corpus.FILL_MASK_PROMPTS) if builtin else ())
    return Plan(run, layout, stages, prompts)


def run(tables: Mapping[str, Mapping[str, Any]], where: str) -> dict[str, Any]:
    """Run every stage of a root config, then answer its fill-mask prompts.

    Args:
        tables: the root config, ``{table: {key: value}}`` with tables run, tokenizer, data,
            model and train.
        where: where the tables came from, for error messages.

    Returns:
        Each stage's result (None for skipped stages), and ``fill-mask``: the answers.
    """
    from tpulm import fill_mask

    resolved = plan(tables, where)
    results = execute(resolved.stages, resolved.run.work_dir)
    if resolved.prompts:
        predictor = fill_mask.load_predictor(resolved.layout.export)
        answers = fill_mask.fill_mask(predictor, list(resolved.prompts), resolved.run.top_k)
        for text, answer in zip(resolved.prompts, answers):
            print(fill_mask.format_result(text, answer), flush=True)
        results["fill-mask"] = answers
    return results
