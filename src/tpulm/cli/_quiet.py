"""Keep the native libraries' start-up chatter off a CPU user's screen, for the whole process.

The noise and its pattern are described in :mod:`tpulm.quiet`. The command line puts a pipe on
file descriptor 2 for its whole life (:class:`StderrFilter`) and copies every other line through.
``tpulm --verbose`` shows everything.
"""

from __future__ import annotations

import os
import sys
import threading

from tpulm.quiet import NOISE, copy_filtered  # noqa: F401  (NOISE: read here by tests too)


class StderrFilter:
    """Route file descriptor 2 through a pipe, dropping :data:`tpulm.quiet.NOISE` lines.

    Python's own ``sys.stderr`` (logging, tracebacks, progress bars) keeps writing straight to
    the original stderr, so it stays a terminal where it was one. One filter per process, kept
    until the process ends or re-executes itself (:meth:`stop`).
    """

    active: StderrFilter | None = None

    def __init__(self) -> None:
        self._saved: int | None = None
        self._thread: threading.Thread | None = None
        self._python_stderr = None

    @classmethod
    def install(cls) -> StderrFilter:
        """Start the process's filter (once)."""
        if cls.active is None:
            cls.active = cls()
            cls.active._start()
        return cls.active

    def _start(self) -> None:
        sys.stderr.flush()
        self._saved = os.dup(2)
        self._python_stderr = sys.stderr
        sys.stderr = open(self._saved, "w", buffering=1, encoding="utf-8",  # noqa: SIM115
                          errors="backslashreplace", closefd=False)
        read, write = os.pipe()
        os.dup2(write, 2)
        os.close(write)
        self._thread = threading.Thread(target=self._copy, args=(read,), daemon=True)
        self._thread.start()

    def _copy(self, read: int) -> None:
        copy_filtered(read, self._saved)

    def stop(self) -> None:
        """Give fd 2 back (before an exec) and let the copier drain what is left."""
        if self._saved is None:
            return
        sys.stderr.flush()
        os.dup2(self._saved, 2)  # closes the pipe's last write end: the copier sees EOF
        self._thread.join(timeout=5)
        sys.stderr = self._python_stderr
        self._saved = None
        StderrFilter.active = None
