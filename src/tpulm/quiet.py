"""The native libraries' start-up noise, and keeping it off stderr while TensorFlow starts.

TensorFlow and XLA log through absl before absl is initialised, so ``TF_CPP_MIN_LOG_LEVEL`` does
not reach these lines: "All log messages before absl::InitializeLog() ...", ``I0000 ...
oneDNN custom operations are on``, ``I0000 ... Could not find cuda drivers``, ``E0000 ...
failed call to cuInit`` on machines without a GPU. C++ writes them straight to file descriptor 2.
The command line filters its whole process (:mod:`tpulm.cli._quiet`); the Python API
(``tpulm.training.run``) filters fd 2 only while TensorFlow starts (:func:`while_native_start`),
so a caller's own stderr is theirs again right after. ``TPULM_NATIVE_LOGS=1`` (or ``tpulm
--verbose``) shows everything.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterator

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
SHOW_ENV = "TPULM_NATIVE_LOGS"  # set to 1: no filtering anywhere
show_all = False  # `tpulm --verbose` sets it: no filtering in this process


def copy_filtered(read: int, write: int) -> None:
    """Copy lines from the pipe ``read`` to ``write``, dropping :data:`NOISE`, until EOF."""
    with os.fdopen(read, "rb") as pipe:
        for line in pipe:
            if not NOISE.match(line.decode("utf-8", "replace")):
                os.write(write, line)


@contextlib.contextmanager
def while_native_start() -> Iterator[None]:
    """Drop :data:`NOISE` from fd 2 while the block runs, if TensorFlow has not started yet.

    Only the native writes to fd 2 pass through the filter (Python's ``sys.stderr`` object is
    left as it is); the original fd 2 is back when the block ends, whatever happened in it.
    """
    if "tensorflow" in sys.modules or show_all or os.environ.get(SHOW_ENV) == "1":
        yield
        return
    # Lines after absl starts obey it (the CPU-instructions notice spans two lines); a level the
    # user set is kept.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stderr.flush()
    saved = os.dup(2)
    read, write = os.pipe()
    os.dup2(write, 2)
    os.close(write)
    copier = threading.Thread(target=copy_filtered, args=(read, saved), daemon=True)
    copier.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's last write end: the copier sees EOF
        copier.join(timeout=5)
        os.close(saved)
