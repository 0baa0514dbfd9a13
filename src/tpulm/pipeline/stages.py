"""``tpulm run``: every stage in order, into one work dir, from one TOML config.

Stages: corpus (the embedded demo corpus, when no files or dataset are named) -> tokenizer ->
data (shards) -> train -> export -> report -> fill-mask. Each stage is also a command of its own;
here they are chained with paths derived from the work dir::

    WORK/corpus/      demo corpus (train/validation/test .txt), only for corpus = "builtin"
    WORK/tokenizer/   tokenizer folder
    WORK/data/        shards, one folder per split
    WORK/run/         run dir: checkpoints, metrics, report.png/html, export/
    WORK/stages/      one record per stage: the settings it ran with, their key, whether done

A stage's key hashes its own settings and the keys of the stages it reads from. On a rerun a stage
whose record is complete with the same key is skipped; one that was interrupted runs again with
the same key and resumes by itself (shards and checkpoints are resumable); a stage whose key
changed has its outputs removed and runs afresh, and so, through the key chain, does every stage
downstream of it — and only those. The train stage is the exception: its checkpoints are never
removed unless the user asks (``--restart train``); a change of settings training can continue
with (``CONTINUABLE_TRAIN``: more steps, other logging) continues from the latest checkpoint,
any other change stops before anything is touched.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import sys
from collections.abc import Callable, Collection, Mapping
from typing import Any

from tpulm import config, rundir, storage
from tpulm.errors import TpulmError

log = logging.getLogger(__name__)

CORPUS_CHOICES = ("builtin", "files", "dataset")
STAGES_DIR = "stages"
# [train] settings a run can change and continue from its latest checkpoint (more steps, other
# logging or placement); any other change to the train stage needs --restart train.
CONTINUABLE_TRAIN = frozenset(f"train.{name}" for name in (
    "max_steps", "epochs", "log_every", "eval_every", "checkpoint_every", "keep_checkpoints",
    "progress", "jit_compile", "steps_per_execution", "peak_tflops", "push_to_hub", "backend",
    "deterministic"))



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
    """One step of the pipeline: what it runs, the folder it owns, and what it reads from.

    ``precious`` outputs (a run's checkpoints) are never removed unless the user names the stage
    in ``restart``; a change of only ``continuable`` settings keeps them and the stage continues
    from where it stopped (``tpulm train`` resumes its latest checkpoint).
    """

    name: str
    run: Callable[[], Any]
    settings: Mapping[str, Any]  # everything that changes its output
    outputs: tuple[str, ...]  # removed when the settings change
    upstream: tuple[str, ...] = ()
    precious: bool = False
    continuable: frozenset[str] = frozenset()  # "table.key" settings a rerun can continue with


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


def write_record(work_dir: str, name: str, key: str, complete: bool,
                 settings: Mapping[str, Any] | None = None,
                 upstream: Mapping[str, str] | None = None) -> None:
    """Write ``WORK/stages/NAME.json``: the key, whether done, and the settings it ran with."""
    storage.makedirs(storage.join(work_dir, STAGES_DIR))
    record = {"key": key, "complete": complete, "settings": dict(settings or {}),
              "upstream": dict(upstream or {})}
    text = json.dumps(record, indent=1, sort_keys=True, default=str)
    storage.write_text(_record_path(work_dir, name), text + "\n")


def changed_settings(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted names of the settings that differ between two (nested) settings mappings."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        names = []
        for key in sorted(set(old) | set(new), key=str):
            names += changed_settings(old.get(key), new.get(key), f"{prefix}{key}.")
        return names
    return [] if old == new else [prefix.rstrip(".")]


@dataclasses.dataclass(frozen=True)
class Decision:
    """What ``execute`` does with one stage, and the log line that says why."""

    action: str  # skip | resume | run | continue | rerun
    reason: str


def decide(stage: Stage, key: str, upstream: dict[str, str], record: dict | None,
           restart: Collection[str]) -> Decision:
    """The decision for one stage from its record and the keys of its upstream stages."""
    if stage.name in restart:
        return Decision("rerun", "restarted (--restart), removing its old outputs")
    if record is None:
        return Decision("run", "running")
    if record.get("key") == key:
        return Decision("skip", "complete, skipped") if record.get("complete") else \
            Decision("resume", "resuming")
    changed = changed_settings(record.get("settings"), stage.settings) if "settings" in record \
        else ["unrecorded settings of an older tpulm"]
    moved = [u for u in stage.upstream if record.get("upstream", {}).get(u) != upstream[u]]
    why = (f"settings changed ({', '.join(changed)})" if changed or not moved
           else f"rerun because {', '.join(moved)} changed")
    if not stage.precious:
        return Decision("rerun", f"{why}, removing its old outputs")
    if not moved and changed and set(changed) <= stage.continuable:
        return Decision("continue", f"{why}: continuing from its outputs")
    blocking = [c for c in changed if c not in stage.continuable] + [f"stage {u}" for u in moved]
    raise TpulmError(
        f"stage {stage.name}: {', '.join(blocking)} changed, so its outputs ({', '.join(stage.outputs)}) "
        f"cannot continue; nothing was touched. Pass --restart {stage.name} to remove them and "
        f"start it over, or undo the change, or use another --work-dir")


def plan_actions(stages: list[Stage], work_dir: str, restart: Collection[str] = ()):
    """Each stage with its key, upstream keys and :class:`Decision`, decided before anything runs.

    Raises:
        TpulmError: a precious stage would lose its outputs without the user asking.
    """
    names = {stage.name for stage in stages}
    unknown = sorted(set(restart) - names)
    if unknown:
        raise TpulmError(f"--restart {', '.join(unknown)}: no such stage; stages: {', '.join(names)}")
    keys: dict[str, str] = {}
    rerun: set[str] = set()
    actions = []
    for stage in stages:
        upstream = {u: keys[u] for u in stage.upstream}
        key = keys[stage.name] = key_of(stage.settings, list(upstream.values()))
        decision = decide(stage, key, upstream, read_record(work_dir, stage.name), restart)
        fresh = sorted(rerun & set(stage.upstream))  # restarted upstream, same key
        if decision.action == "skip" and fresh:
            decision = (Decision("continue", f"{', '.join(fresh)} reran: continuing from its outputs")
                        if stage.precious else
                        Decision("rerun", f"rerun because {', '.join(fresh)} reran"))
        if decision.action == "rerun":
            rerun.add(stage.name)
        actions.append((stage, key, upstream, decision))
    return actions


def _refuse_foreign_outputs(stages: list[Stage], work_dir: str) -> None:
    """Before anything runs: a stage that never ran in this work dir must find its output folders
    missing or empty; what is there is not tpulm's, and a later change of settings would remove
    it with the stage's outputs."""
    for stage in stages:
        if not storage.exists(_record_path(work_dir, stage.name)):
            for path in stage.outputs:
                storage.check_replaceable(path, overwrite=False, ours=())


def execute(stages: list[Stage], work_dir: str, restart: Collection[str] = ()) -> dict[str, Any]:
    """Run ``stages`` in order, skipping complete ones; returns each stage's result (or None).

    Every decision is taken (and every refusal raised) before the first stage runs or any output
    is removed.
    """
    actions = plan_actions(stages, work_dir, restart)
    _refuse_foreign_outputs(stages, work_dir)
    results: dict[str, Any] = {}
    for stage, key, upstream, decision in actions:
        log.info("stage %s: %s", stage.name, decision.reason)
        if decision.action == "skip":
            results[stage.name] = None
            continue
        if decision.action == "rerun":
            for path in stage.outputs:
                if storage.exists(path):
                    storage.rmtree(path)
        write_record(work_dir, stage.name, key, False, stage.settings, upstream)
        results[stage.name] = stage.run()
        write_record(work_dir, stage.name, key, True, stage.settings, upstream)
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


def _log_result(result):
    log.info("%s", result.describe())
    return result


def _log_evaluation(result):
    from tpulm.evaluate.run import format_table

    print(format_table(result.tasks), flush=True)
    return result


def check_model(preset: str, model_table: Mapping[str, Any], tok_cfg, where: str) -> None:
    """Validate the ``[model]`` table now (unknown keys, types, sizes), before any stage runs;
    vocab size and pad id, which come from the trained tokenizer, are stood in for."""
    from tpulm.data.tokenizer import MODELS
    from tpulm.model.config import ModelConfig, load_model_preset

    recipe = MODELS[tok_cfg.model]
    stand_in = {"vocab_size": tok_cfg.vocab_size,
                "pad_token_id": recipe.tokens.index(recipe.roles["pad_token"])}
    config.from_mapping(ModelConfig, {**load_model_preset(preset), **model_table, **stand_in},
                        f"[model] of {where} (over model preset {preset!r})")


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
    from tpulm.evaluate import run as evaluate
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
    eval_cfg = config.resolve(
        evaluate.EvaluateConfig, None, tables.get("evaluate", {}), f"[evaluate] of {where}",
        model=layout.run, backend=train_cfg.backend)
    model_table = dict(tables.get("model", {}))
    check_model(train_cfg.model, model_table, tok_cfg, where)
    builtin = run.corpus == "builtin"

    stages = [Stage("corpus", lambda: builtin_corpus.write_demo_corpus(layout.corpus),
                    {"python": sys.version}, (layout.corpus,))] if builtin else []
    stages += [
        Stage("tokenizer", lambda: _log_result(tokenizer.run(tok_cfg)), config.as_table(tok_cfg),
              (layout.tokenizer,), ("corpus",) if builtin else ()),
        Stage("data", lambda: prepare.run(data_cfg), config.as_table(data_cfg), (layout.data,),
              ("tokenizer",)),
        Stage("train", lambda: training.run(train_cfg, model_table),
              {"train": config.as_table(train_cfg), "model": model_table}, (layout.run,),
              ("data",), precious=True, continuable=CONTINUABLE_TRAIN),
        Stage("export", lambda: export.write_export(layout.run, layout.export, overwrite=True),
              {}, (layout.export,), ("train",)),
    ]
    if eval_cfg.tasks or eval_cfg.train_file:  # downstream scores, shown by the report
        stages.append(Stage("evaluate", lambda: _log_evaluation(evaluate.run(eval_cfg)),
                            config.as_table(eval_cfg), (storage.join(layout.run, "eval"),),
                            ("export",)))
    if run.report:
        upstream = ("train", "evaluate") if stages[-1].name == "evaluate" else ("train",)
        stages.append(Stage("report", lambda: report.run(layout.run), {}, (), upstream))
    prompts = run.fill_mask or (
        tuple(prompt for prompt, _ in builtin_corpus.FILL_MASK_PROMPTS) if builtin else ())
    return Plan(run, layout, stages, prompts)


def run(tables: Mapping[str, Mapping[str, Any]], where: str,
        restart: Collection[str] = ()) -> dict[str, Any]:
    """Run every stage of a root config, then answer its fill-mask prompts.

    Every table is validated, and every stage's decision taken, before any output is touched.

    Args:
        tables: the root config, ``{table: {key: value}}`` with tables run, tokenizer, data,
            model and train.
        where: where the tables came from, for error messages.
        restart: stages to start over (their outputs removed), e.g. ``("train",)``.

    Returns:
        Each stage's result (None for skipped stages), and ``fill-mask``: the answers.
    """
    from tpulm import fill_mask

    resolved = plan(tables, where)
    results = execute(resolved.stages, resolved.run.work_dir, restart)
    if resolved.prompts:
        predictor = fill_mask.load_predictor(resolved.layout.export)
        answers = fill_mask.fill_mask(predictor, list(resolved.prompts), resolved.run.top_k)
        for text, answer in zip(resolved.prompts, answers):
            print(fill_mask.format_result(text, answer), flush=True)
        results["fill-mask"] = answers
    print(outputs_summary(resolved), flush=True)
    return results


def outputs_summary(resolved: Plan) -> str:
    """The closing lines of ``tpulm run``: where its outputs went."""
    layout = resolved.layout
    lines = [f"outputs in {layout.work_dir}:",
             f"  tokenizer  {layout.tokenizer}",
             f"  shards     {layout.data}",
             f"  run dir    {layout.run}",
             f"  export     {layout.export}"]
    if resolved.run.report:
        lines.append(f"  report     {storage.join(layout.run, 'report.html')} (and report.png)")
    return "\n".join(lines)
