"""The one exception type for mistakes a user can make and fix (bad path, bad setting, bad data)."""


class TpulmError(Exception):
    """A user-facing error: the CLI prints its message on one line and exits non-zero.

    The message names the file or setting at fault and says what to do; no traceback is shown.
    """


class Interrupted(Exception):
    """Training stopped on SIGTERM or SIGINT after saving a checkpoint (not a mistake).

    The CLI prints the message and exits with ``exit_code``: 128 + the signal number, the shell's
    convention (143 for SIGTERM, 130 for SIGINT), so schedulers see the run did not finish.

    Args:
        signal_name: "SIGTERM" or "SIGINT".
        exit_code: 128 + the signal number.
        step: the step the checkpoint holds.
        checkpoint: the checkpoint folder.
    """

    def __init__(self, signal_name: str, exit_code: int, step: int, checkpoint: str | None):
        saved = f"checkpoint {checkpoint}" if checkpoint else "no checkpoint (this process writes none)"
        super().__init__(
            f"stopped by {signal_name} after step {step}; saved {saved}; rerun the same command "
            "to resume from it")
        self.exit_code, self.step, self.checkpoint = exit_code, step, checkpoint


def describe_os_error(err: OSError) -> str:
    """One line for an operating-system error (disk full, no permission, file too large): what
    failed, on which path, what to do, and that rerunning the command resumes once it is fixed."""
    import errno

    where = " -> ".join(str(p) for p in (err.filename, err.filename2) if p) or "a file"
    reason = err.strerror or str(err) or type(err).__name__
    advice = {errno.ENOSPC: "free some space", errno.EDQUOT: "free some space",
              errno.EACCES: "check its permissions", errno.EPERM: "check its permissions",
              errno.EROFS: "choose a writable place",
              errno.EFBIG: "raise the file-size limit (ulimit -f)"}.get(err.errno, "fix that")
    return f"{reason}: {where}; {advice} and rerun the command (finished work is kept)"
