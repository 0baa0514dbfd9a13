"""Uploads to the Hugging Face Hub: an early access check, and pushing an export folder."""

from __future__ import annotations

import os

from tpulm import storage
from tpulm.errors import TpulmError


def hub_files(folder: str) -> list[str]:
    """The files an upload of ``folder`` sends: exactly the export's files, nothing else."""
    return [name for name in storage.listdir(folder) if not storage.isdir(storage.join(folder, name))
            and name != storage.WRITTEN_RECORD]


def check_hub_access(repo_id: str) -> None:
    """Fail early, with a clear message, when an upload to ``repo_id`` cannot work.

    Call it before long work (training) whose result is to be pushed. The token is looked up
    where Hugging Face tools keep it (``HF_TOKEN``, ``hf auth login``) and never shown.

    Args:
        repo_id: the Hub repository id (``user/name``).
    """
    import huggingface_hub
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise TpulmError(f"--push-to-hub {repo_id!r} is not a valid Hub repo id: {err}") from None
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    if offline or huggingface_hub.constants.HF_HUB_OFFLINE:
        raise TpulmError(
            f"cannot push to {repo_id}: HF_HUB_OFFLINE is set; unset it on a machine with network "
            "access")
    if not huggingface_hub.get_token():
        raise TpulmError(
            f"cannot push to {repo_id}: no Hugging Face token found; run `hf auth login` or set "
            "HF_TOKEN")


def push_folder(folder: str, repo_id: str, private: bool = True) -> str:
    """Upload exactly the files of ``folder`` to the Hub model repo ``repo_id``; returns its URL.

    Args:
        folder: a local export folder.
        repo_id: the Hub repository id; created (private by default) when missing.
        private: create the repository as private.
    """
    from huggingface_hub import HfApi

    keep = f"the export stays in {folder}; upload it later with `hf upload {repo_id} {folder}`"
    try:
        check_hub_access(repo_id)
    except TpulmError as err:
        raise TpulmError(f"{err}; {keep}") from None
    if storage.is_remote(folder):
        raise TpulmError(f"uploading needs a local folder, not {folder}; {keep}")
    api = HfApi()
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(folder_path=folder, repo_id=repo_id, repo_type="model",
                          allow_patterns=hub_files(folder),
                          commit_message="Upload model exported by tpulm")
    except Exception as err:  # network, auth and HTTP errors of huggingface_hub
        first_line = str(err).splitlines()[0] if str(err) else ""
        raise TpulmError(f"upload to {repo_id} failed ({type(err).__name__}: {first_line}); "
                         f"{keep}") from None
    return str(url)
