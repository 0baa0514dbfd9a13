"""Shared fixtures: real text kept in tests/data, offline Hugging Face libraries."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TEST_DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def wikitext_dir() -> Path:
    """The WikiText-2 validation and test splits (real English text, one sample per line)."""
    path = TEST_DATA / "wikitext-2"
    if not (path / "valid.txt").exists():
        pytest.fail(f"real test text missing: {path}/valid.txt (part of the repository)")
    return path
