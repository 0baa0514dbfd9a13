"""`tpulm train`: train (or resume) a masked language model from shards."""

from __future__ import annotations

import argparse

from tpulm import config
from tpulm.cli._common import activate_backend, presets_text

ORDER = 30


def register(subparsers) -> None:
    """Add the train command."""
    from tpulm.training.config import TrainConfig

    parser = subparsers.add_parser(
        "train",
        help="train a RoBERTa or ModernBERT masked language model from shards (rerun to resume)",
        description=(
            "Train from TFRecord shards on TPU, GPU(s) or CPU. Settings: defaults < the [train] "
            "and [model] tables of --config < flags. Rerunning the same command resumes from the "
            f"latest checkpoint of --run-dir. Model presets (--model): {presets_text()}."
        ),
    )
    parser.add_argument("--config", metavar="FILE", help="TOML file with [train] and [model] tables")
    config.add_arguments(parser, TrainConfig)
    parser.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    from tpulm import training

    cfg, model_table = training.table_from_args(args)
    activate_backend(cfg.backend)
    result = training.run(cfg, model_table)
    lines = [
        f"run dir      {result.run_dir}",
        f"steps        {result.step} ({result.steps_this_session} this run)",
        f"tokens       {result.tokens:,}",
        f"wall time    {result.wall_time:.1f} s",
        f"tokens/s     {result.tokens_per_second:,.0f}",
        f"MFU          {100 * result.mfu:.1f}% of {result.peak_flops / 1e9:,.0f} GFLOP/s",
    ]
    if result.eval:
        lines.append(
            "eval         loss {loss:.4f}, accuracy {accuracy:.4f}, perplexity {perplexity:.2f}".format(**result.eval)
        )
    lines.append(f"checkpoint   {result.checkpoint}")
    print("\n".join(lines))
    return 0
