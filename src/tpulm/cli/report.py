"""``tpulm report RUN_DIR``: training curves (PNG) and a self-contained HTML page for a run."""

from __future__ import annotations

import argparse

ORDER = 60


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="plot a run's training and eval curves into RUN_DIR/report.png and report.html",
        description=(
            "Read RUN_DIR/metrics.jsonl and config.toml and write report.png (loss, masked "
            "accuracy, learning rate, tokens/s over steps) and report.html (the picture, the "
            "final figures and the config, in one file) into the run dir. Needs matplotlib "
            "(pip install 'tpulm[report]')."
        ),
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run dir (local, gs://, ...)")
    parser.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    from tpulm import report

    result = report.run(args.run_dir)
    print(report.describe(result.figures))
    if result.evaluation:
        print(f"\ndownstream evaluation (eval/results.json):\n{result.evaluation}\n")
    print(f"wrote {result.png}")
    print(f"wrote {result.html}")
    return 0
