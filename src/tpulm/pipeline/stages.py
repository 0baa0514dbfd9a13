"""``tpulm run``: tpulm's stages wired for the engine (:mod:`tpulm.pipeline.engine`), from one
TOML config, into one work dir.

Stages: corpus (the embedded demo corpus, when no files or dataset are named) -> tokenizer ->
data (shards) -> train -> export -> evaluate (when tasks are named) -> report; then fill-mask.
Each stage is also a command of its own; here they are chained with paths derived from the work
dir::

    WORK/corpus/      demo corpus (train/validation/test .txt), only for corpus = "builtin"
    WORK/tokenizer/   tokenizer folder
    WORK/data/        shards, one folder per split
    WORK/run/         run dir: checkpoints, metrics, report.png/html, export/, eval/
    WORK/stages/      one record per stage: the settings it ran with, their key, whether done

Each stage's settings are its table, resolved; the engine skips, resumes or reruns stages by them.
The train stage is precious: its checkpoints are never removed unless the user asks
(``--restart train``); a change of settings training can continue with
(``tpulm.training.config.CONTINUABLE``: more steps, other logging or placement) continues from
the latest checkpoint, any other change stops before anything is touched. Nothing here prints: :func:`run` returns the results and the CLI shows them.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Collection, Mapping
from typing import Any

from tpulm import config, lock, rundir, storage
from tpulm.errors import TpulmError
from tpulm.pipeline.engine import Stage, execute

log = logging.getLogger(__name__)

CORPUS_CHOICES = ("builtin", "files", "dataset")
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
        (), "texts to answer at the end, {mask} where the tokenizer's mask token goes (default "
        "for the builtin corpus: its prompts)"
    )
    top_k: int = config.setting(5, "fill-mask answers per mask")
    report: bool = config.setting(True, "write report.png and report.html into the run dir")

    def __post_init__(self) -> None:
        if self.dataset and self.corpus != "dataset":
            object.__setattr__(self, "corpus", "dataset")
        if self.corpus == "files" and not self.train_files:
            raise TpulmError("corpus = 'files' needs train_files")
        if self.corpus == "dataset" and not self.dataset:
            raise TpulmError("corpus = 'dataset' needs dataset = 'NAME' or 'NAME:CONFIG'")


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each stage writes inside the work dir (see the module docstring)."""

    work_dir: str
    corpus: str
    tokenizer: str
    data: str
    run: str
    export: str

    @classmethod
    def of(cls, work_dir: str) -> Layout:
        """The layout of ``work_dir``."""
        corpus, tokenizer, data, run = (storage.join(work_dir, name)
                                        for name in ("corpus", "tokenizer", "data", "run"))
        return cls(work_dir, corpus, tokenizer, data, run, storage.join(run, rundir.EXPORT_DIR))


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
class RunPlan:
    """A resolved root config: the run settings, the stages, and the fill-mask prompts."""

    run: RunConfig
    layout: Layout
    stages: list[Stage]
    prompts: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class StageSettings:
    """Each stage's resolved settings: its table over its defaults, paths from the layout."""

    tokenizer: Any  # TokenizerConfig
    data: Any  # PrepareConfig
    train: Any  # TrainConfig
    model: dict[str, Any]  # the [model] table, over the preset [train] model names
    evaluate: Any  # EvaluateConfig


def resolve_tables(tables: Mapping[str, Mapping[str, Any]], where: str, run: RunConfig,
                   layout: Layout) -> StageSettings:
    """Every stage's table resolved and checked (the [model] table too), before any stage runs."""
    from tpulm import training
    from tpulm.data import prepare, tokenizer
    from tpulm.evaluate import run as evaluate

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
    return StageSettings(tok_cfg, data_cfg, train_cfg, model_table, eval_cfg)


def wire(run: RunConfig, layout: Layout, cfg: StageSettings) -> list[Stage]:
    """tpulm's stages in order: what each runs, the settings in its key, its outputs, its
    upstream stages."""
    from tpulm import report, training
    from tpulm.data import builtin_corpus, prepare, tokenizer
    from tpulm.evaluate import run as evaluate
    from tpulm.hf import export
    from tpulm.training.config import CONTINUABLE

    # [train] settings a run can change and continue from its latest checkpoint; any other
    # change to the train stage needs --restart train.
    continuable = frozenset(f"train.{name}" for name in CONTINUABLE)
    builtin = run.corpus == "builtin"
    stages = [Stage("corpus", lambda: builtin_corpus.write_demo_corpus(layout.corpus),
                    {"python": sys.version}, (layout.corpus,))] if builtin else []
    stages += [
        Stage("tokenizer", lambda: _log_result(tokenizer.run(cfg.tokenizer)),
              config.as_table(cfg.tokenizer), (layout.tokenizer,), ("corpus",) if builtin else ()),
        Stage("data", lambda: prepare.run(cfg.data), config.as_table(cfg.data), (layout.data,),
              ("tokenizer",)),
        Stage("train", lambda: training.run(cfg.train, cfg.model),
              {"train": config.as_table(cfg.train), "model": cfg.model}, (layout.run,),
              ("data",), precious=True, continuable=continuable),
        Stage("export", lambda: export.write_export(layout.run, layout.export, overwrite=True),
              {}, (layout.export,), ("train",)),
    ]
    if cfg.evaluate.tasks or cfg.evaluate.train_file:  # downstream scores, shown by the report
        stages.append(Stage("evaluate", lambda: evaluate.run(cfg.evaluate),
                            config.as_table(cfg.evaluate), (storage.join(layout.run, "eval"),),
                            ("export",)))
    if run.report:
        upstream = ("train", "evaluate") if stages[-1].name == "evaluate" else ("train",)
        written = tuple(storage.join(layout.run, name) for name in (report.PNG_NAME, report.HTML_NAME))
        stages.append(Stage("report", lambda: report.run(layout.run), {}, (), upstream,
                            files=written))
    return stages


def plan(tables: Mapping[str, Mapping[str, Any]], where: str) -> RunPlan:
    """Resolve a root config ``{table: {key: value}}`` (read from ``where``) into stages.

    Raises:
        TpulmError: an unknown table, or a bad setting in any table.
    """
    from tpulm.data import builtin_corpus

    unknown = sorted(set(tables) - set(config.TABLES))
    if unknown:
        raise TpulmError(
            f"unknown table(s) {', '.join(unknown)} in {where}; known: {', '.join(config.TABLES)}")
    run = config.from_mapping(RunConfig, tables.get("run", {}), f"[run] of {where}")
    layout = Layout.of(run.work_dir)
    stages = wire(run, layout, resolve_tables(tables, where, run, layout))
    prompts = run.fill_mask or (tuple(prompt for prompt, _ in builtin_corpus.FILL_MASK_PROMPTS)
                                if run.corpus == "builtin" else ())
    return RunPlan(run, layout, stages, prompts)


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What ``tpulm run`` did.

    Attributes:
        plan: the resolved config: settings, layout, stages and prompts.
        stages: each stage's result by name (None for a skipped stage).
        prompts: the prompts of ``plan.prompts`` as answered: ``{mask}`` replaced by the
            tokenizer's own mask token.
        answers: the fill-mask answers, one list per prompt.
    """

    plan: RunPlan
    stages: dict[str, Any]
    prompts: list[str]
    answers: list


def run(tables: Mapping[str, Mapping[str, Any]], where: str,
        restart: Collection[str] = (), overwrite: bool = False) -> RunResult:
    """Run every stage of a root config, then answer its fill-mask prompts.

    Every table is validated, and every stage's decision taken, before any output is touched;
    the work dir is locked for the whole run (one ``tpulm run`` per work dir).

    Args:
        tables: the root config, ``{table: {key: value}}`` with tables run, tokenizer, data,
            model, train and evaluate.
        where: where the tables came from, for error messages.
        restart: stages to start over (their outputs removed), e.g. ``("train",)``.
        overwrite: let a rerun remove files in its outputs that tpulm did not write.

    Returns:
        The stages' results and the fill-mask answers.
    """
    from tpulm import fill_mask

    resolved = plan(tables, where)
    # A gs:// work dir without network or credentials: one line now, not a traceback later.
    storage.check_reachable(resolved.run.work_dir, "[run] work_dir (--work-dir)", write=True)
    with lock.hold(resolved.run.work_dir, "tpulm run"):
        results = execute(resolved.stages, resolved.run.work_dir, restart, overwrite)
        prompts, answers = [], []
        if resolved.prompts:
            predictor = fill_mask.load_predictor(resolved.layout.export)
            prompts = [predictor.prompt(text) for text in resolved.prompts]
            answers = fill_mask.fill_mask(predictor, prompts, resolved.run.top_k)
    return RunResult(resolved, results, prompts, answers)


def outputs_summary(resolved: RunPlan) -> str:
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
