"""``tpulm data prepare`` and ``tpulm data inspect``: parse settings, call the stage modules."""

from __future__ import annotations

import argparse

from tpulm import config
from tpulm.cli._common import command_group
from tpulm.data.inspect import InspectConfig
from tpulm.data.prepare import PrepareConfig

ORDER = 20


def register(subparsers: argparse._SubParsersAction) -> None:
    commands = command_group(subparsers, "data", help="write and check TFRecord shards")
    prepare = commands.add_parser(
        "prepare",
        help="tokenize a corpus and pack it into max_length blocks in TFRecord shards",
        description=(
            "Tokenize every split (train/validation/test files, or a 🤗 dataset) on all cores, "
            "pack samples into max_length blocks and write <output>/<split>/dataset-<i>-<n>"
            ".tfrecord shards plus manifest.json. Rerun after an interruption to finish the job. "
            "Settings: defaults < the [data] table of --config < flags."
        ),
    )
    prepare.add_argument("--config", help="TOML file whose [data] table sets the settings")
    config.add_arguments(prepare, PrepareConfig)
    prepare.add_argument(
        "--beam-option", dest="beam_options", action="append", metavar="KEY=VALUE",
        help="a Beam pipeline option for --runner, e.g. project=my-project (repeatable)",
    )
    prepare.set_defaults(func=_prepare)
    inspect = commands.add_parser(
        "inspect",
        help="validate a shard folder and decode a few blocks",
        description="Check schema, counts, ids and manifest of shard folders; exit 1 on problems.",
    )
    inspect.add_argument("path", metavar="DIR", help="a split folder or a folder of split folders")
    config.add_arguments(inspect, InspectConfig, skip=("path",))
    inspect.set_defaults(func=_inspect)


def _prepare(args: argparse.Namespace) -> int:
    from tpulm.data import prepare

    result = prepare.run(config.from_args(PrepareConfig, args, "data"))
    for s in result.splits.values():
        state = "already complete" if s.resumed_at_shard < 0 else (
            f"resumed at shard {s.resumed_at_shard}" if s.resumed_at_shard else "written")
        # A split already complete did no work now: no time or speed to show for it.
        timing = "" if s.resumed_at_shard < 0 else (
            f"; {s.seconds:.1f} s, {s.tokens_per_second:,.0f} tokens/s")
        print(
            f"{s.split}: {state} -> {s.path}: {s.samples} samples, {s.tokens} tokens, "
            f"{s.blocks} blocks in {s.shards} shards, {s.tokens_dropped} tokens dropped{timing}"
        )
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from tpulm.data import inspect

    report = inspect.run(config.resolve(InspectConfig, args, path=args.path))
    for split in report.splits:
        status = "OK" if not split.problems else f"{len(split.problems)} problem(s)"
        print(f"{split.path}: {status}: {split.shards} shards, {split.records} records, "
              f"{split.tokens} tokens, max_length {split.max_length}")
        for problem in split.problems:
            print(f"  PROBLEM: {problem}")
        for i, text in enumerate(split.decoded):
            print(f"  block {i}: {text}")
    return 0 if report.ok else 1
