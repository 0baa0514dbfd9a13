"""`tpulm evaluate`: fine-tune a pretrained model on downstream tasks and report their scores."""

from __future__ import annotations

import argparse
import json

from tpulm import config
from tpulm.cli._common import activate_backend

ORDER = 45


def register(subparsers) -> None:
    """Add the evaluate command."""
    from tpulm.evaluate.run import EvaluateConfig

    parser = subparsers.add_parser(
        "evaluate",
        help="fine-tune a run dir, checkpoint or export on downstream tasks (GLUE, files, "
             "built-in)",
        description=(
            "Fine-tune a classification/regression head plus the encoder on each task and score "
            "its validation split (best epoch; mean and spread over --seeds). Tasks: "
            "builtin:replaced-words (offline), glue:sst2|mrpc|cola|stsb|qnli|rte|mnli|qqp "
            "(download), or local files (--train-file, --validation-file). --from-scratch adds "
            "the same architecture randomly initialised as a baseline. Results: a table, "
            "--json, and RUN_DIR/eval/results.json (EXPORT_DIR/eval/ for an export folder)."
        ),
    )
    parser.add_argument("model", metavar="MODEL",
                        help="run dir (latest checkpoint), checkpoint folder or exported folder")
    parser.add_argument("--task", dest="tasks", action="append", metavar="TASK",
                        help="a task name; repeat for several")
    parser.add_argument("--config", metavar="FILE", help="TOML file with an [evaluate] table")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    config.add_arguments(parser, EvaluateConfig, skip=("model", "tasks"))
    parser.set_defaults(func=_evaluate)


def _evaluate(args: argparse.Namespace) -> int:
    from tpulm.evaluate import run

    table = config.load_toml(args.config).get("evaluate", {}) if args.config else {}
    cfg = config.resolve(run.EvaluateConfig, args, table,
                         where=f"[evaluate] of {args.config}" if args.config else "the command line")
    activate_backend(cfg.backend)
    result = run.run(cfg)
    if args.json:
        print(json.dumps(result.tasks, indent=2))
    else:
        print(run.format_table(result.tasks))
        print(f"wrote {result.path}")
    return 0
