"""Where raw corpus files are opened: local disk, any fsspec store, or ``tf.io.gfile``.

Corpus input (``tpulm data prepare`` and its Beam runner) reads through the four functions here;
shards, checkpoints and run folders keep ``tpulm.storage`` (``tf.io.gfile``). The rule:

* local paths and ``file://`` go to :mod:`tpulm.storage` (the standard library);
* every ``scheme://`` that fsspec knows (``gs://`` via gcsfs, ``s3://`` via s3fs, ``hf://`` via
  huggingface_hub, ``az://``/``abfs://`` via adlfs, ``http(s)://`` ...) goes to fsspec, so one
  reader serves every object store with the same glob and listing behaviour, and Beam workers read
  inputs exactly as the local path does;
* anything else (``ram://``, TensorFlow filesystem plugins) stays with ``tf.io.gfile``.

Credentials come from each store's usual environment (``GOOGLE_APPLICATION_CREDENTIALS`` or the
metadata server, ``AWS_*``, ``HF_TOKEN``, ``AZURE_STORAGE_*``); nothing here reads or prints them.
"""

from __future__ import annotations

from typing import IO, Any

from tpulm import storage
from tpulm.errors import TpulmError

# pip packages of the fsspec implementations tpulm users are likely to need; other schemes are
# named by fsspec's own message.
PIP_PACKAGES = {
    "gs": "gcsfs", "gcs": "gcsfs", "s3": "s3fs", "s3a": "s3fs", "az": "adlfs", "abfs": "adlfs",
    "abfss": "adlfs", "adl": "adlfs", "hf": "huggingface_hub", "http": "aiohttp", "https": "aiohttp",
}


def scheme(path: str) -> str | None:
    """``gs://b/x`` -> ``gs``; None for a local path."""
    return path.split("://", 1)[0].lower() if storage.is_remote(path) else None


def uses_fsspec(path: str) -> bool:
    """True when ``path`` is read through fsspec (a remote scheme that fsspec knows)."""
    name = scheme(path)
    if name is None:
        return False
    from fsspec.registry import known_implementations, registry

    return name in known_implementations or name in registry


def filesystem(path: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``path`` and the path inside it.

    Raises:
        TpulmError: the scheme's fsspec package is not installed (the message names it).
    """
    import fsspec

    try:
        return fsspec.core.url_to_fs(path)
    except ImportError as err:
        name = scheme(path)
        package = PIP_PACKAGES.get(name)
        hint = f"pip install {package}" if package else str(err).splitlines()[0]
        raise TpulmError(f"reading {name}:// paths needs the fsspec package for it: {hint}") from None


def open_file(path: str, mode: str = "rb") -> IO:
    """Open a corpus file for reading."""
    if not uses_fsspec(path):
        return storage.open_file(path, mode)
    fs, inner = filesystem(path)
    try:
        return fs.open(inner, mode)
    except FileNotFoundError:
        raise TpulmError(f"input {path} does not exist; check the path") from None


def exists(path: str) -> bool:
    if not uses_fsspec(path):
        return storage.exists(path)
    fs, inner = filesystem(path)
    return fs.exists(inner)


def isdir(path: str) -> bool:
    if not uses_fsspec(path):
        return storage.isdir(path)
    fs, inner = filesystem(path)
    return fs.isdir(inner)


def glob(pattern: str) -> list[str]:
    """Sorted full paths (with the scheme) of the files matching ``pattern``."""
    if not uses_fsspec(pattern):
        return [m for m in storage.glob(pattern) if not storage.isdir(m)]
    fs, inner = filesystem(pattern)
    found = fs.glob(inner, detail=True)
    return sorted(fs.unstrip_protocol(p) for p, info in found.items() if info.get("type") != "directory")
