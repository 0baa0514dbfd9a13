"""``tpulm tokenizer train``: parse settings and call :func:`tpulm.data.tokenizer.run`."""

from __future__ import annotations

import argparse

from tpulm import config
from tpulm.cli._common import command_group
from tpulm.data.tokenizer import MODELS, TokenizerConfig

ORDER = 10


def register(subparsers: argparse._SubParsersAction) -> None:
    commands = command_group(subparsers, "tokenizer", help="train a tokenizer")
    train = commands.add_parser(
        "train",
        help="train a Unigram (default), byte-level BPE or WordPiece tokenizer",
        description=(
            "Stream a corpus (text files with a sample per line, .jsonl, .parquet, or a 🤗 dataset) "
            "and train a Unigram (the reference recipe), byte-level BPE or WordPiece tokenizer "
            f"(--model {' | '.join(MODELS)}); writes a folder transformers.AutoTokenizer loads. "
            "Settings come from defaults < the [tokenizer] table of --config < flags."
        ),
    )
    train.add_argument("inputs_pos", nargs="*", metavar="INPUT", help="input files or globs")
    train.add_argument("--config", help="TOML file whose [tokenizer] table sets the settings")
    config.add_arguments(train, TokenizerConfig)
    train.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    from tpulm.data import tokenizer

    cfg = config.from_args(TokenizerConfig, args, "tokenizer", inputs=tuple(args.inputs_pos) or None)
    print(tokenizer.run(cfg).describe())
    return 0
