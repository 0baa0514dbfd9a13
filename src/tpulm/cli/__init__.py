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

from tpulm import __version__, quiet
from tpulm.cli import _common, _quiet
from tpulm.errors import Interrupted, TpulmError, describe_os_error
from tpulm.training import backends


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
            "Pretrain a RoBERTa or ModernBERT masked language model from scratch: train a "
            "tokenizer, write TFRecord shards, train on TPU/GPU/CPU, export to Hugging Face "
            f"Transformers. Model presets: {_common.presets_text()}."
        ),
    )
    parser.add_argument("--version", action="version", version=f"tpulm {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show debug logs")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _command_modules():
        module.register(subparsers)
    return parser


def quiet_libraries(verbose: bool) -> None:
    """Keep TensorFlow's, XLA's and JAX's start-up chatter (absl and oneDNN banners, ``E0000 ...
    cuInit`` on machines without a GPU, ``Unable to initialize backend 'tpu'``) off the screen;
    ``--verbose`` shows it. Must run before TensorFlow or JAX is imported."""
    quiet.show_all = verbose  # the scoped filter of the Python API too
    # 🤗 Hub and datasets print through a stderr handler of their own: propagated to the root
    # logger as well, each of their warnings (e.g. a Hub retry) would show twice.
    for name in ("huggingface_hub", "datasets"):
        logging.getLogger(name).propagate = False
    if verbose:
        return
    # 3 also hides C++ ERROR lines: on a CPU machine those are only the probes for absent
    # accelerators; real failures still surface as Python exceptions.
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # even over a 2 set elsewhere: E0000 lines are ERROR
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    os.environ.setdefault("ABSL_MIN_LOG_LEVEL", "3")  # absl's C++ logging (XLA, newer TF)
    for name in ("absl", "jax._src.xla_bridge", "tensorflow"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # 🤗 datasets announces at import, at INFO, which frameworks it found ("TensorFlow version
    # 2.21.0 available."): set before it is imported, its own level setting comes too late.
    logging.getLogger("datasets").setLevel(logging.WARNING)


def main(argv: list[str] | None = None, *, filter_native_logs: bool | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; user errors print one line, exit code 2.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
        filter_native_logs: drop the native libraries' start-up noise from fd 2 (see
            :mod:`tpulm.cli._quiet`); default: only for the real command line (``argv`` None),
            so a caller's (or a test's) own stderr is left alone. ``--verbose`` turns it off.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if (argv is None if filter_native_logs is None else filter_native_logs) and not args.verbose:
        if _quiet.StderrFilter.active is None:
            backends.BEFORE_EXEC.append(_quiet.StderrFilter.install().stop)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    quiet_libraries(args.verbose)
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
