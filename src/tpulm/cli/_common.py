"""What several command modules share: a command group's parser, the backend switch, the model
presets for ``--help``."""

from __future__ import annotations

import argparse

from tpulm.model.config import PRESETS


def command_group(subparsers: argparse._SubParsersAction, name: str, help: str):
    """A command with subcommands (``tpulm NAME COMMAND``) that prints its help when given none.

    Returns:
        The subparsers to add its commands to.
    """
    parser = subparsers.add_parser(name, help=help)
    commands = parser.add_subparsers(dest=f"{name}_command", metavar="COMMAND")
    parser.set_defaults(func=lambda args: parser.print_help() or 2)
    return commands


def activate_backend(name: str | None) -> None:
    """Make ``name`` the Keras backend before anything imports Keras or TensorFlow; when
    something already did with another backend, start the command afresh with ``name``."""
    from tpulm.training import backends

    try:
        backends.activate(name)
    except backends.BackendMismatch as err:
        backends.reexec(err.wanted)


def presets_text() -> str:
    """The model presets of both architectures, for help texts."""
    roberta = [p for p in PRESETS if not p.startswith("modernbert-")]
    modern = [p for p in PRESETS if p.startswith("modernbert-")]
    return f"{', '.join(roberta)} (RoBERTa); {', '.join(modern)} (ModernBERT)"
