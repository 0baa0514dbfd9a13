"""The ``tpulm`` command: subcommands only parse arguments and call the stage modules.

Each command group lives in a module of this package (found by ``pkgutil``, shown in the order of
its ``ORDER`` constant); the module's ``register(subparsers)`` adds its parsers and sets ``func`` to
a handler taking the parsed arguments and returning an exit code. Adding a command group means
adding one module. Command modules import heavy libraries (TensorFlow) inside their handlers, so
``tpulm --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys

from tpulm import __version__
from tpulm.errors import Interrupted, TpulmError, describe_os_error


def _command_modules() -> list:
    modules = [
        importlib.import_module(f"{__name__}.{info.name}")
        for info in pkgutil.iter_modules(__path__)
        if not info.name.startswith("_")
    ]
    return sorted(modules, key=lambda m: (getattr(m, "ORDER", 100), m.__name__))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tpulm",
        description=(
            "Pretrain a RoBERTa-style masked language model from scratch: train a tokenizer, "
            "write TFRecord shards, train on TPU/GPU/CPU, export to Hugging Face Transformers."
        ),
    )
    parser.add_argument("--version", action="version", version=f"tpulm {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show debug logs")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _command_modules():
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; user errors print one line, exit code 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except TpulmError as err:
        print(f"tpulm: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tpulm: interrupted", file=sys.stderr)
        return 130
    except Interrupted as err:  # SIGTERM / SIGINT during training: checkpoint saved
        print(f"tpulm: {err}", file=sys.stderr)
        return err.exit_code
    except OSError as err:  # disk full, permissions, file-size limit: one line naming the path
        print(f"tpulm: error: {describe_os_error(err)}", file=sys.stderr)
        return 1
