"""The one exception type for mistakes a user can make and fix (bad path, bad setting, bad data)."""


class TpulmError(Exception):
    """A user-facing error: the CLI prints its message on one line and exits non-zero.

    The message names the file or setting at fault and says what to do; no traceback is shown.
    """
