"""Keep the native libraries' start-up chatter off a CPU user's screen.

TensorFlow and XLA log through absl before absl is initialised, so ``TF_CPP_MIN_LOG_LEVEL`` does
not reach these lines: "All log messages before absl::InitializeLog() ...", ``I0000 ...
oneDNN custom operations are on``, ``I0000 ... Could not find cuda drivers``, ``E0000 ...
failed call to cuInit`` on machines without a GPU. They are written by C++ straight to file
descriptor 2, so :class:`StderrFilter` puts a pipe there and copies every other line through.
``tpulm --verbose`` shows everything.
"""

from __future__ import annotations

import os
import re
import sys
import threading

# absl's preamble; native INFO/WARNING lines (I0000/W0000 ...); and the ERROR lines that only
# report an absent accelerator (CUDA / TPU probes), never a failure of the run itself.
NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\)"
    r"|[IW]\d{4} [\d:.]+ +\d+ \S+:\d+\]"
    r"|E\d{4} [\d:.]+ +\d+ \S+:\d+\] .*(cuInit|CUDA|cuda|TPU|tpu_)"
    # libtpu (the `tpu` extra, for `tpulm plan`) probing for a TPU at every JAX start elsewhere
    r"|WARNING: Logging before InitGoogle\(\)|Failed to find host bounds for accelerator type"
    r"|WARNING: could not determine TPU|=== Source Location Trace: ===\s*$|learning/\S+\.cc:\d+$)"
)


class StderrFilter:
    """Route file descriptor 2 through a pipe, dropping :data:`NOISE` lines.

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
        with os.fdopen(read, "rb") as pipe:
            for line in pipe:
                if not NOISE.match(line.decode("utf-8", "replace")):
                    os.write(self._saved, line)

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
