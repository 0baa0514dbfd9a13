"""Choose the Keras backend (TensorFlow or JAX) before Keras is first imported.

Keras fixes its backend when it is first imported (``KERAS_BACKEND``), and importing TensorFlow
imports Keras too. So the backend a run asks for (``--backend``, the ``[train] backend`` setting,
else ``KERAS_BACKEND``, else TensorFlow) must be set before either is imported:
:func:`activate` does that, and says clearly when it is too late. The CLI then re-executes itself
with the right environment (:func:`reexec`); library callers get a :class:`BackendMismatch`.
"""

from __future__ import annotations

import os
import sys

from tpulm.errors import TpulmError

BACKENDS = ("tensorflow", "jax")
DEFAULT = "tensorflow"
_REEXEC_MARK = "TPULM_BACKEND_REEXEC"  # set in a re-executed CLI, so it never loops
BEFORE_EXEC: list = []  # callables run before re-executing (the CLI's stderr filter gives fd 2 back)


class BackendMismatch(TpulmError):
    """Keras is already imported with another backend than the one asked for."""

    def __init__(self, wanted: str, current: str):
        super().__init__(
            f"the run asks for the {wanted} backend but Keras was already imported with "
            f"{current}; set KERAS_BACKEND={wanted} before importing keras or tensorflow "
            "(e.g. start python with it in the environment)"
        )
        self.wanted, self.current = wanted, current


def resolve(name: str | None) -> str:
    """The backend to use: ``name`` if given, else ``KERAS_BACKEND``, else TensorFlow.

    Args:
        name: ``tensorflow``, ``jax`` or None.
    """
    chosen = name or os.environ.get("KERAS_BACKEND") or DEFAULT
    if chosen not in BACKENDS:
        where = "--backend" if name else "KERAS_BACKEND"
        raise TpulmError(f"{where} must be one of {', '.join(BACKENDS)}, got {chosen!r}")
    return chosen


def current() -> str | None:
    """The backend of the already imported Keras, or None when Keras is not imported yet."""
    keras = sys.modules.get("keras")
    if keras is None:
        return None
    return keras.backend.backend()


def activate(name: str | None) -> str:
    """Make ``name`` (resolved as in :func:`resolve`) the Keras backend of this process.

    Args:
        name: ``tensorflow``, ``jax`` or None (an already imported Keras keeps its backend).

    Returns:
        The backend now in use.

    Raises:
        BackendMismatch: Keras was imported earlier with another backend.
    """
    loaded = current()
    if name is None and loaded is not None:
        return loaded  # nothing asked for: keep what the caller imported
    wanted = resolve(name)
    if loaded is not None and loaded != wanted:
        raise BackendMismatch(wanted, loaded)
    os.environ["KERAS_BACKEND"] = wanted
    return wanted


def reexec(wanted: str) -> None:
    """Replace this process by ``python -m tpulm <same arguments>`` with ``KERAS_BACKEND=wanted``.

    Used by the CLI when something imported Keras before the backend was known. Never returns;
    raises :class:`BackendMismatch` instead if this process already is such a re-execution, or is
    not the ``tpulm`` command (then ``sys.argv`` is not its command line).
    """
    parts = os.path.normpath(sys.argv[0]).split(os.sep)
    is_cli = parts[-1] == "tpulm" or parts[-2:] == ["tpulm", "__main__.py"]
    if os.environ.get(_REEXEC_MARK) or not is_cli:
        raise BackendMismatch(wanted, current() or "another backend")
    env = {**os.environ, "KERAS_BACKEND": wanted, _REEXEC_MARK: "1"}
    sys.stdout.flush()
    sys.stderr.flush()
    for hook in list(BEFORE_EXEC):
        hook()
    os.execve(sys.executable, [sys.executable, "-m", "tpulm", *sys.argv[1:]], env)
