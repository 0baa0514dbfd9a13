"""``tpulm tokenizer train``: parse settings and call :func:`tpulm.data.tokenizer.run`."""

from __future__ import annotations

import argparse

from tpulm import config
from tpulm.data.tokenizer import TokenizerConfig

ORDER = 10


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("tokenizer", help="train a tokenizer")
    commands = parser.add_subparsers(dest="tokenizer_command", metavar="COMMAND")
    train = commands.add_parser(
        "train",
        help="train a Unigram (default), byte-level BPE or WordPiece tokenizer",
        description=(
            "Stream a corpus (text files with a sample per line, .jsonl, .parquet, or a 🤗 dataset) "
            "and train a tokenizer; writes a folder transformers.AutoTokenizer loads. Settings "
            "come from defaults < the [tokenizer] table of --config < flags."
        ),
    )
    train.add_argument("inputs_pos", nargs="*", metavar="INPUT", help="input files or globs")
    train.add_argument("--config", help="TOML file whose [tokenizer] table sets the settings")
    config.add_arguments(train, TokenizerConfig)
    train.set_defaults(func=_train)
    parser.set_defaults(func=lambda args: parser.print_help() or 2)


def _train(args: argparse.Namespace) -> int:
    from tpulm.data import tokenizer

    cfg = config.from_args(TokenizerConfig, args, "tokenizer", inputs=tuple(args.inputs_pos) or None)
    print(tokenizer.run(cfg).describe())
    return 0
