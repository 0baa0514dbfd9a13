"""``tpulm run``: the whole pipeline from one config (the offline demo by default)."""

from __future__ import annotations

import argparse
import json
import textwrap

from tpulm.cli._common import activate_backend, presets_text

ORDER = 50


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "run",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_epilog(),
        aliases=["demo"],
        help="run every stage: corpus, tokenizer, shards, training, export, report, fill-mask",
        description=(
            "Run the pipeline of a root config (tables [run], [tokenizer], [data], [model], "
            "[train], [evaluate]) into one work dir. Stages already complete with the same "
            "settings are skipped; an interrupted stage resumes; a changed setting reruns its "
            "stage and those after it. Without --config: the offline demo on English text "
            "shipped with Python."
        ),
    )
    parser.add_argument("--config", default="demo",
                        help="TOML file or shipped preset: demo (default), reference")
    parser.add_argument("--work-dir", help="output folder, overrides [run] work_dir")
    parser.add_argument("--dataset", help="🤗 dataset NAME or NAME:CONFIG (needs network), "
                                          "e.g. wikitext:wikitext-103-raw-v1")
    parser.add_argument("--set", dest="assignments", action="append", default=[],
                        metavar="TABLE.KEY=VALUE", help="override one setting, e.g. train.max_steps=50")
    parser.add_argument(
        "--restart", action="append", default=[], metavar="STAGE",
        help="start STAGE over, removing its outputs (e.g. --restart train: a new training run "
             "in the same work dir; needed when a change cannot continue the old one)")
    parser.add_argument(
        "--overwrite", action="store_true",
        help="let a rerun or --restart remove files in a stage's outputs that tpulm did not "
             "write or that were changed since (without it such a run stops, naming them)")
    parser.set_defaults(func=_run)


def _epilog() -> str:
    """The [run], [model] and [evaluate] settings (the other tables: `tpulm tokenizer train
    --help`, `tpulm data prepare --help`, `tpulm train --help`)."""
    from tpulm import config
    from tpulm.evaluate.run import EvaluateConfig
    from tpulm.model.config import ModelConfig
    from tpulm.pipeline import RunConfig

    return "\n\n".join([
        textwrap.fill(
            "Settings of a root config (also --set TABLE.KEY=VALUE). [tokenizer], [data] and "
            "[train] take the flags of `tpulm tokenizer train`, `tpulm data prepare` and `tpulm "
            "train` (dashes as underscores), listed by their --help.", width=88),
        config.describe_table("run", RunConfig),
        config.describe_table("model", ModelConfig, skip=("pad_token_id",)) + "\n"
        + textwrap.fill(f"(over the preset named by [train] model: {presets_text()})", width=88,
                        initial_indent="  ", subsequent_indent="  "),
        config.describe_table("evaluate", EvaluateConfig, skip=("model",))
        + "\n  (the evaluate stage runs when tasks or train_file are set; its model is the run)",
    ])


def _run(args: argparse.Namespace) -> int:
    from tpulm import config, pipeline

    path = config.find_config(args.config)
    assignments = list(args.assignments)
    if args.work_dir:
        assignments.append(f"run.work_dir={json.dumps(args.work_dir)}")
    if args.dataset:
        assignments.append(f"run.dataset={json.dumps(args.dataset)}")
    written = config.load_toml(path)
    tables = config.apply_overrides(written, assignments)
    where = path
    if args.assignments:  # the file checked alone first: what fails after is a --set's fault
        pipeline.plan(written, path)
        where = f"--set (over {path})"
    activate_backend(tables.get("train", {}).get("backend"))  # before any stage imports Keras
    result = pipeline.run(tables, where, restart=args.restart, overwrite=args.overwrite)
    print(_closing_lines(result), flush=True)
    return 0


def _closing_lines(result) -> str:
    """The evaluation table (when the evaluate stage ran), the fill-mask answers, and where the
    outputs went."""
    from tpulm import fill_mask
    from tpulm.evaluate.run import format_table
    from tpulm.pipeline import stages

    lines = []
    if result.stages.get("evaluate") is not None:
        lines.append(format_table(result.stages["evaluate"].tasks))
    lines += [fill_mask.format_result(text, answer)
              for text, answer in zip(result.prompts, result.answers)]
    return "\n".join([*lines, stages.outputs_summary(result.plan)])
