"""The demo corpus: deterministic, sizeable, prose only, disjoint splits, atomic writes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tpulm import storage
from tpulm.data import builtin_corpus
from tpulm.data.tokenizer import MASK_PLACEHOLDER
from tpulm.errors import TpulmError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> builtin_corpus.CorpusInfo:
    """The real demo corpus of this Python, written once for the module."""
    return builtin_corpus.write_demo_corpus(str(tmp_path_factory.mktemp("corpus")))


def _read_lines(path: str) -> list[str]:
    text = Path(path).read_text(encoding="utf-8")
    assert text.endswith("\n")
    return text[:-1].split("\n")


def test_two_runs_are_byte_identical(corpus, tmp_path):
    # The second run happens in a fresh interpreter, so no state is shared between the runs.
    code = (
        "import sys; from tpulm.data import builtin_corpus; "
        "print(builtin_corpus.write_demo_corpus(sys.argv[1]).sha256)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], env=env, check=True,
        capture_output=True, text=True,
    )
    assert out.stdout.strip() == corpus.sha256
    for split in builtin_corpus.SPLITS:
        assert (tmp_path / f"{split}.txt").read_bytes() == Path(corpus.files[split]).read_bytes()


def test_corpus_is_large_enough_to_learn_from(corpus):
    assert sum(corpus.bytes.values()) > 1_200_000
    assert sum(corpus.lines.values()) > 10_000
    assert sum(corpus.words.values()) > 200_000
    assert corpus.lines["validation"] > 300 and corpus.lines["test"] > 300


def test_every_line_is_prose(corpus):
    for split in builtin_corpus.SPLITS:
        for line in _read_lines(corpus.files[split]):
            assert line == line.strip() and "  " not in line, line
            assert ">>>" not in line and "``" not in line and ":func:`" not in line, line
            assert not builtin_corpus.parses_as_python(line), line
            assert builtin_corpus.is_prose(line), line


def test_splits_are_disjoint_cover_all_lines_and_match_the_info(corpus):
    seen: list[str] = []
    for split in builtin_corpus.SPLITS:
        lines = _read_lines(corpus.files[split])
        assert len(lines) == corpus.lines[split]
        assert sum(len(line.split()) for line in lines) == corpus.words[split]
        assert os.path.getsize(corpus.files[split]) == corpus.bytes[split]
        assert all(builtin_corpus.split_of(line) == split for line in lines)
        seen.extend(lines)
    assert len(seen) == len(set(seen))
    assert sorted(seen) == sorted(builtin_corpus.demo_lines())
    # 90 / 5 / 5 by hash, within sampling noise.
    assert 0.87 < corpus.lines["train"] / len(seen) < 0.93


def test_info_is_recorded_and_read_back(corpus):
    assert builtin_corpus.read_corpus_info(corpus.out_dir) == corpus
    record = json.loads(Path(corpus.out_dir, builtin_corpus.INFO_NAME).read_text())
    assert record["format_version"] == builtin_corpus.FORMAT_VERSION
    assert builtin_corpus.read_corpus_info(corpus.out_dir + "-missing") is None


# For each fill-mask prompt of the demo, the phrasing of the corpus that teaches its answer.
EVIDENCE = {
    "True": r"\bReturn (\w+) if\b",
    "number": r"\bthe (\w+) of (?:bytes|items|elements|characters|lines)\b",
    "instance": r"\ban (\w+) of\b",
    "current": r"\bthe (\w+) working directory\b",
    "copy": r"\bshallow (\w+)\b",
}


@pytest.mark.parametrize(("prompt", "answer"), builtin_corpus.FILL_MASK_PROMPTS)
def test_fill_mask_answers_are_what_the_corpus_says(corpus, prompt, answer):
    # In the prompt's context the answer is the most frequent word, and a common one.
    text = " ".join(Path(corpus.files[s]).read_text() for s in builtin_corpus.SPLITS)
    assert re.search(EVIDENCE[answer], prompt.replace(MASK_PLACEHOLDER, answer))
    fillers = Counter(re.findall(EVIDENCE[answer], text))
    assert fillers.most_common(1)[0][0] == answer, fillers.most_common(5)
    assert fillers[answer] >= 5 and fillers[answer] >= 0.3 * sum(fillers.values())


DOCSTRING = '''Frobnicate the widget.

    The widget is frobnicated in place, and the result of the
    :func:`frob` call is returned as a ``bytes`` object; see *Widgets*.

    Example::

        >>> frobnicate(widget)
        b'ok'
        ...

        for part in widget.parts():
            frob(part)

    Arguments
    ---------

    widget
        The widget that is going to be frobnicated by this function.

    - A bullet item that says enough words to be kept in the corpus.
    - short

    +------+-------+
    | a    | table |
    +------+-------+

    .. versionadded:: 3.2
    '''


def test_blocks_and_prose_filter_clean_a_docstring():
    lines = builtin_corpus.prose_lines([DOCSTRING])
    assert lines == [
        "The widget is frobnicated in place, and the result of the frob call is returned as a "
        "bytes object; see Widgets.",
        "The widget that is going to be frobnicated by this function.",
        "A bullet item that says enough words to be kept in the corpus.",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "frobnicate(widget, parts=None, *, strict=False) -> bytes",
        "for part in widget.parts(): frob(part)",
        "x = the_value if is_set else default_value  # the fallback",
        "Too short.",
        "Arguments Parameters Returns Raises Yields Examples",
        ">>> print('this is not prose at all')",
        "d = {'key': value, 'other': [1, 2, 3]}",
    ],
)
def test_is_prose_rejects_code_and_fragments(text):
    assert not builtin_corpus.is_prose(text)


def test_sentences_with_code_split_a_paragraph_into_prose_runs():
    block = (
        "Open the file for reading. The first line is read at once. "
        "Then d = {k: v for k, v in pairs if k[0] == '_'} is built. "
        "Finally the file is closed and the mapping is returned to the caller."
    )
    assert list(builtin_corpus.sentence_groups(block)) == [
        "Open the file for reading. The first line is read at once.",
        "Finally the file is closed and the mapping is returned to the caller.",
    ]


def _fake_stdlib(root: Path) -> None:
    (root / "pkg").mkdir(parents=True)
    (root / "test").mkdir()
    (root / "pydoc_data").mkdir()
    (root / "alpha.py").write_text(
        '"""The alpha module is the first module that is read by the walk."""\n'
        "# This comment explains why the value is computed in this way.\n"
        "def f():\n    '''Return the answer to the question that was asked.'''\n"
    )
    (root / "pkg" / "beta.py").write_text('"""The beta module lives inside of a package."""\n')
    (root / "test" / "test_alpha.py").write_text('"""Test that alpha works as it should."""\n')
    (root / "broken.py").write_text('"""A file that does not parse is skipped as a whole.\n')
    (root / "pydoc_data" / "topics.py").write_text(
        "topics = {'zeta': 'The zeta topic is sorted after the other one.',\n"
        "          'eta': 'The eta topic comes first because of its name.'}\n"
    )


def test_sources_are_read_in_path_order_without_optional_parts(tmp_path):
    _fake_stdlib(tmp_path)
    assert builtin_corpus.demo_lines(str(tmp_path), runtime=False) == [
        "The alpha module is the first module that is read by the walk.",
        "This comment explains why the value is computed in this way.",
        "Return the answer to the question that was asked.",
        "The beta module lives inside of a package.",
        "The eta topic comes first because of its name.",
        "The zeta topic is sorted after the other one.",
    ]


def test_write_is_atomic_and_leaves_no_partial_corpus(tmp_path, monkeypatch):
    _fake_stdlib(tmp_path / "lib")
    out = tmp_path / "out"
    builtin_corpus.write_demo_corpus(str(out), root=str(tmp_path / "lib"), runtime=False)
    real_write = storage.write_bytes

    def failing_write(path: str, data: bytes) -> None:
        if path.endswith("test.txt"):
            with storage.atomic_path(path) as tmp:
                Path(tmp).write_bytes(data[: len(data) // 2])
                raise OSError("disk full")
        real_write(path, data)

    monkeypatch.setattr(storage, "write_bytes", failing_write)
    with pytest.raises(OSError, match="disk full"):
        builtin_corpus.write_demo_corpus(str(out), root=str(tmp_path / "lib"), runtime=False)
    # The old record is gone (the corpus is incomplete), no temporary file is left behind and
    # the final test.txt is still the complete one from the first run.
    assert builtin_corpus.read_corpus_info(str(out)) is None
    assert not [name for name in os.listdir(out) if storage.is_temporary(name)]
    assert sorted(os.listdir(out)) == ["test.txt", "train.txt", "validation.txt"]


def test_writes_to_remote_paths(tmp_path):
    _fake_stdlib(tmp_path)
    info = builtin_corpus.write_demo_corpus("ram://democorpus/out", root=str(tmp_path), runtime=False)
    text = "".join(storage.read_text(info.files[s]) for s in builtin_corpus.SPLITS)
    assert sorted(text.splitlines()) == sorted(builtin_corpus.demo_lines(str(tmp_path), runtime=False))
    assert builtin_corpus.read_corpus_info("ram://democorpus/out") == info


def test_no_prose_is_a_clear_error(tmp_path):
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(TpulmError, match="no English prose found .*" + tmp_path.name):
        builtin_corpus.write_demo_corpus(str(tmp_path / "out"), root=str(tmp_path), runtime=False)
