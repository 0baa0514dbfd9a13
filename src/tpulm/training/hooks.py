"""The periodic actions of a training run, each registered once with its period (levanter's hooks).

The loop calls :meth:`Hooks.run` at the end of every segment (Keras epoch); the segment length
divides every period (``config.segment_length``), so no hook is ever late. Every hook also runs
at the last step, whatever its period.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Hook:
    """``fn(step, logs)`` every ``every`` optimizer steps (and at the last one)."""

    name: str
    fn: Callable[[int, dict], None]
    every: int


class Hooks:
    """An ordered table of hooks.

    Args:
        last_step: the step at which every hook runs, due or not.
    """

    def __init__(self, last_step: int):
        self.last_step = last_step
        self.hooks: list[Hook] = []

    def add(self, name: str, fn: Callable[[int, dict], None], every: int) -> None:
        """Register ``fn(step, logs)`` to run every ``every`` steps, after those added before."""
        self.hooks.append(Hook(name, fn, every))

    def due(self, step: int) -> list[Hook]:
        """The hooks to run after ``step``, in the order they were added."""
        last = step >= self.last_step
        return [h for h in self.hooks if last or step % h.every == 0]

    def run(self, step: int, logs: dict) -> None:
        """Run the hooks due after ``step`` with the segment's ``logs``."""
        for hook in self.due(step):
            hook.fn(step, logs)
