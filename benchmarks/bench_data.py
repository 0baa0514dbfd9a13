"""Where the benchmarks' text comes from: they run from a fresh clone with nothing beside it.

WikiText-2's validation and test splits: from ``../shared/data/wikitext-2`` beside the repository
where a machine provides it (larger data may appear there), else the copy kept in the repository
for the tests (``tests/data/wikitext-2``, the same two files, CC BY-SA 3.0). Every benchmark
prints the folder it read.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "wikitext-2"
IN_REPO = REPO / "tests" / "data" / "wikitext-2"


def wikitext_dir() -> Path:
    """The WikiText-2 folder to read (``valid.txt`` and ``test.txt``), announced on stdout."""
    shared = (SHARED / "valid.txt").exists() and (SHARED / "test.txt").exists()
    found = SHARED if shared else IN_REPO
    where = "../shared/data" if found == SHARED else "the repository's test data"
    print(f"corpus: WikiText-2 valid + test from {where} ({found})", flush=True)
    return found
