"""The demo corpus: real English prose that ships with CPython, extracted without a download.

Every machine that runs tpulm has the Python standard library's sources, and they hold well
written English: the docstrings and comments of the modules, classes and functions, the language
reference topics that ``pydoc`` shows (``pydoc_data/topics.py``) and the docstrings of the
built-in functions and types. This module turns them into a WikiText-like corpus, one sample (a
paragraph, or a run of sentences of it) per line: about 1.7 MB, 13,000 lines, 270,000 words on
Python 3.11-3.13.

* sources are read in a fixed order (built-in docs, then the ``.py`` files sorted by path), so the
  same Python version gives the same corpus byte for byte on every machine;
* parts that distributions package separately (``test/``, ``idlelib/``, ``tkinter/`` ...) are left
  out, so a slim install and a full one give the same corpus;
* reST markup is reduced to plain text; doctests, code blocks, signatures, tables and short
  fragments are dropped; every kept line must read as English prose (see ``is_prose``);
* lines are deduplicated and assigned to train / validation / test by a hash of their text, so a
  line's split never depends on what else is in the corpus.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib
import inspect
import io
import json
import logging
import os
import re
import sys
import sysconfig
import tokenize
import warnings
from collections.abc import Iterable, Iterator

from tpulm import storage
from tpulm.errors import TpulmError

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")
# Percent of lines per split, by hash bucket: train 90, validation 5, test 5.
SPLIT_PERCENT = {"train": 90, "validation": 5, "test": 5}
INFO_NAME = "corpus.json"
FORMAT_VERSION = 1

# Folders and files that distributions ship in separate packages (Debian: python3-tk, idle,
# python3-distutils, python3-lib2to3, python3-venv, libpython3-testsuite) or that are not stdlib.
# encodings/ is left out too: its docstrings are one generated boilerplate line per codec.
EXCLUDED_DIRS = frozenset({
    "test", "tests", "idlelib", "tkinter", "turtledemo", "lib2to3", "distutils", "ensurepip",
    "site-packages", "dist-packages", "lib-dynload", "__pycache__", "__phello__", "encodings",
})
EXCLUDED_FILES = frozenset({"turtle.py", "this.py", "antigravity.py", "__hello__.py"})
TOPICS_FILE = "pydoc_data/topics.py"
# Modules implemented in C whose docstrings are prose ("Return the square root of x.").
RUNTIME_MODULES = ("builtins", "math", "cmath", "itertools", "array")

# Fill-mask prompts for a model trained on this corpus, with the expected answer: in the corpus,
# the answer is the most frequent word in the prompt's context (137 of 185 "Return _ if" are
# "Return True if" on Python 3.11) and one token of a Unigram tokenizer trained on the corpus.
FILL_MASK_PROMPTS = (
    ("Return {mask} if the object is a class.", "True"),
    ("Return the {mask} of items in the queue.", "number"),
    ("Return an {mask} of the class.", "instance"),
    ("The path is relative to the {mask} working directory of the process.", "current"),
    ("Return a shallow {mask} of the list.", "copy"),
)

MIN_WORDS = 5
MIN_CHARS = 30

# ---------------------------------------------------------------------------------------------
# Sources: docstrings and documentation strings, in a fixed order.


def stdlib_dir() -> str:
    """The folder of the running interpreter's standard library sources."""
    return sysconfig.get_paths()["stdlib"]


def stdlib_files(root: str) -> list[str]:
    """Relative POSIX paths of the ``.py`` files under ``root``, optional parts left out, sorted."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in EXCLUDED_DIRS and not d.startswith("config-")]
        for name in files:
            if name.endswith(".py") and name not in EXCLUDED_FILES:
                found.append(os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/"))
    return sorted(found)


def _docstring(node: ast.AST) -> tuple[int, str] | None:
    body = getattr(node, "body", None)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        value = body[0].value.value
        if isinstance(value, str):
            return body[0].lineno, inspect.cleandoc(value)
    return None


def module_docstrings(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, docstring) of a module and of its classes and functions, in source order."""
    doc = _docstring(tree)
    if doc:
        yield doc
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from module_docstrings(node)  # type: ignore[arg-type]


def comment_blocks(source: bytes) -> Iterator[tuple[int, str]]:
    """(first line, text) of each run of consecutive full-line ``#`` comments, ``#`` removed."""
    run: list[str] = []
    first = last = 0
    try:
        for tok in tokenize.tokenize(io.BytesIO(source).readline):
            if tok.type != tokenize.COMMENT or not tok.line.lstrip().startswith("#"):
                continue
            if run and tok.start[0] != last + 1:
                yield first, inspect.cleandoc("\n".join(run))
                run = []
            if not run:
                first = tok.start[0]
            run.append(tok.string[1:])
            last = tok.start[0]
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError) as err:
        log.debug("comments cut short: %s", err)
    if run:
        yield first, inspect.cleandoc("\n".join(run))


def topic_texts(tree: ast.Module) -> Iterator[str]:
    """The documentation texts of ``pydoc_data/topics.py`` (``topics = {name: text}``), by name."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            pairs = zip(node.value.keys, node.value.values)
            texts = {
                k.value: v.value
                for k, v in pairs
                if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
                and isinstance(v.value, str)
            }
            for name in sorted(texts):
                yield texts[name]


def file_texts(root: str, relpath: str) -> list[str]:
    """Docstrings and comment blocks of one source file, in source order.

    ``pydoc_data/topics.py`` gives its documentation texts instead; files that do not parse
    are skipped (logged).
    """
    path = os.path.join(root, relpath)
    try:
        with open(path, "rb") as f:
            source = f.read()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source, filename=path)
    except (SyntaxError, ValueError, UnicodeDecodeError, OSError) as err:
        log.debug("skipping %s: %s", path, err)
        return []
    if relpath == TOPICS_FILE:
        return list(topic_texts(tree))
    found = [*module_docstrings(tree), *comment_blocks(source)]
    # Sort by line only (stable): no two texts start on the same line.
    return [text for _, text in sorted(found, key=lambda item: item[0])]


def runtime_texts(module_names: Iterable[str] = RUNTIME_MODULES) -> Iterator[str]:
    """Docstrings of C-implemented modules and their functions, types and methods, by name."""
    for module_name in module_names:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        yield from _object_docs(module)
        for _, obj in sorted(vars(module).items()):
            if inspect.isclass(obj) or inspect.isbuiltin(obj):
                if getattr(obj, "__module__", None) == module_name:
                    yield from _object_docs(obj)
                    if inspect.isclass(obj):
                        for _, member in sorted(vars(obj).items()):
                            if inspect.isroutine(member) or inspect.isdatadescriptor(member):
                                yield from _object_docs(member)


def _object_docs(obj: object) -> Iterator[str]:
    # The object's own __doc__ only: inspect.getdoc would repeat inherited docs once per class.
    doc = getattr(obj, "__doc__", None)
    if isinstance(doc, str) and doc.strip():
        yield inspect.cleandoc(doc)


def source_texts(root: str | None = None, runtime: bool = True) -> Iterator[str]:
    """Every documentation string, in corpus order.

    Args:
        root: standard-library folder to read; default: the running interpreter's.
        runtime: also include the docstrings of C-implemented modules (``RUNTIME_MODULES``).
    """
    if runtime:
        yield from runtime_texts()
    root = root or stdlib_dir()
    for relpath in stdlib_files(root):
        yield from file_texts(root, relpath)


# ---------------------------------------------------------------------------------------------
# Cleaning: reST and plain-text docs -> candidate paragraphs -> prose lines.

_UNDERLINE = re.compile(r"^\s*([=\-~*^\"#+`'])\1{2,}\s*$")
_TABLE = re.compile(r"^\s*(\+[-=+]|\|)")
_DIRECTIVE = re.compile(r"^\s*\.\.\s+[\w:-]+::")
_COMMENT = re.compile(r"^\s*\.\.(\s|$)")
_DOCTEST = re.compile(r"^\s*(>>>|\.\.\.)(\s|$)")
_BULLET = re.compile(r"^\s*(?:[-*+\u2022]|\d{1,2}[.)]|\([a-z0-9]\))\s+")
_FIELD = re.compile(r"^\s*:[\w .()-]+:(\s+|$)")
_SIGNATURE = re.compile(r"^\s*[\w.]+\(.*\)\s*(->.*)?$")

_ROLE = re.compile(r":[\w:.-]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")
_LITERAL = re.compile(r"``(.+?)``")
_LINK = re.compile(r"`([^`<]+?)(?:\s*<[^>]*>)?`__?")
_TEX_QUOTE = re.compile(r"`([^`'\s][^`']*)'")  # old-style `quote' in comments
_INTERPRETED = re.compile(r"`([^`]+)`")
_STRONG = re.compile(r"(?<![\w*])\*\*([^\s*][^*]*?)\*\*(?![\w*])")
_EMPHASIS = re.compile(r"(?<![\w*])\*([^\s*][^*]*?)\*(?![\w*])")
_FOOTNOTE = re.compile(r"\s*\[\d+\]_")
_SPACE = re.compile(r"\s+")
# A word hyphenated across a line break ("left-\nhand" in the pydoc topics) is one word.
_HYPHEN_BREAK = re.compile(r"(?<=[a-z])-\n(?=[a-z])")
_NAME = re.compile(r"^\s*[\w.*]+\s*$")


def strip_markup(text: str) -> str:
    """Reduce reST inline markup to its text: roles, literals, links, emphasis, footnotes."""
    text = _ROLE.sub(_role_text, text)
    text = _LITERAL.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = _TEX_QUOTE.sub(r"'\1'", text)
    text = _INTERPRETED.sub(r"\1", text)
    text = _STRONG.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\1", text)
    text = _FOOTNOTE.sub("", text)
    return text.replace("::", ":") if text.rstrip().endswith("::") else text


def _role_text(match: re.Match) -> str:
    # :meth:`~a.b.name` shows as "name"; :func:`name` as "name".
    text = match.group(0)
    target = match.group(1)
    return target.split(".")[-1] if "`~" in text else target


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def blocks(doc: str) -> Iterator[str]:
    """Split a docstring into candidate paragraphs, one string each, whitespace normalised.

    Blank lines, outdents, bullets and field markers start a new block; a heading and its
    underline, tables, directives, comments and doctest examples (with their output) are dropped.
    """
    lines = doc.expandtabs().splitlines()
    current: list[str] = []
    indent = 0
    in_doctest = False
    for i, line in enumerate(lines):
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        blank = not line.strip()
        in_doctest = (in_doctest and not blank) or bool(_DOCTEST.match(line))
        if blank or in_doctest or _UNDERLINE.match(nxt) or _noise(line):
            yield from _flush(current)
            continue
        starts_item = bool(_BULLET.match(line) or _FIELD.match(line) or _SIGNATURE.match(line))
        outdent = _indent(line) < indent
        if current and (starts_item or outdent or _opens_block(current, line, indent)):
            yield from _flush(current)
        if not current:
            indent = _indent(line)
        current.append(line)
    yield from _flush(current)


def _noise(line: str) -> bool:
    return bool(
        _UNDERLINE.match(line) or _TABLE.match(line) or _DIRECTIVE.match(line)
        or _COMMENT.match(line)
    )


def _opens_block(current: list[str], line: str, indent: int) -> bool:
    # A line ending in ':' introduces an indented block (code, a list), and a lone name heads
    # its indented description (Argument Clinic style), as does a signature: that block stands
    # alone.
    if _indent(line) <= indent:
        return False
    if current[-1].rstrip().endswith(":"):
        return True
    return len(current) == 1 and bool(_NAME.match(current[0]) or _SIGNATURE.match(current[0]))


def _flush(current: list[str]) -> Iterator[str]:
    if current:
        text = _HYPHEN_BREAK.sub("-", "\n".join(line.strip() for line in current))
        current.clear()
        text = _BULLET.sub("", text, count=1)
        text = _FIELD.sub("", text, count=1)
        yield _SPACE.sub(" ", strip_markup(text)).strip()


_WORD = re.compile(
    r"^[(\"'\u201c\u2018]*[A-Za-z][a-z]*(?:['\u2019-][A-Za-z]+)*[)\"'\u201d\u2019.,;:!?]*$"
)
_CODE_CHARS = frozenset("=(){}[]<>\\|#@$%^~;")
# A method named in prose ("calls read() first") or a dunder name is not code.
_NAMED_CALL = re.compile(r"\w\(\)|_")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"(])")
STOPWORDS = frozenset(
    "the a an of to in is are be by for if it its as at or and not with this that on from "
    "which was has have will can may when all any no one".split()
)


def parses_as_python(text: str) -> bool:
    """True when ``text`` is valid Python source (so not prose)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning for prose like "a \\d escape"
            ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    return True


def is_wordy(text: str) -> bool:
    """True when ``text`` is made of words, not code: the test every kept sentence passes.

    Almost only ASCII; no ``>>>``; at least 70% of the tokens are plain words; at most 4% code
    characters (brackets, operators; a method named in prose as ``read()`` does not count); and
    not valid Python.
    """
    tokens = text.split()
    if not tokens or sum(not c.isascii() for c in text) > 0.02 * len(text) or ">>>" in text:
        return False
    if sum(bool(_WORD.match(t)) for t in tokens) < 0.7 * len(tokens):
        return False
    if sum(c in _CODE_CHARS for c in _NAMED_CALL.sub("", text)) > 0.04 * len(text):
        return False
    return not parses_as_python(text)


def is_prose(text: str) -> bool:
    """True when ``text`` is a line of English prose: the test every line of the corpus passes.

    It ``is_wordy``, has at least ``MIN_WORDS`` words and ``MIN_CHARS`` characters, starts with a
    letter or a quote, ends like a sentence, and at least 15% of its words are common English
    function words (which lists of names and headings lack).
    """
    tokens = text.split()
    if len(tokens) < MIN_WORDS or len(text) < MIN_CHARS:
        return False
    if not (text[0].isalpha() or text[0] in "\"'(") or text[-1] not in ".!?:)\"'":
        return False
    stops = sum(t.lower().strip("(\"',.;:") in STOPWORDS for t in tokens)
    return stops >= 0.15 * len(tokens) and is_wordy(text)


def sentence_groups(block: str) -> Iterator[str]:
    """The runs of consecutive wordy sentences of a paragraph that make prose lines.

    A sentence with code in it ends a run, so a paragraph that quotes code keeps its prose.
    """
    run: list[str] = []
    for sentence in [*_SENTENCE_END.split(block), ""]:
        if sentence and is_wordy(sentence):
            run.append(sentence)
            continue
        text = " ".join(run)
        run.clear()
        if is_prose(text):
            yield text


def prose_lines(texts: Iterable[str]) -> list[str]:
    """The prose lines of ``texts``, in order, each kept once (first occurrence)."""
    seen: set[str] = set()
    lines = []
    for doc in texts:
        for block in blocks(doc):
            for line in sentence_groups(block):
                if line not in seen:
                    seen.add(line)
                    lines.append(line)
    return lines


# ---------------------------------------------------------------------------------------------
# Splits and writing.


def split_of(line: str) -> str:
    """The split of a line, from a hash of its text: stable whatever else is in the corpus."""
    bucket = int.from_bytes(hashlib.sha256(line.encode("utf-8")).digest()[:8], "big") % 100
    edge = 0
    for split in SPLITS:
        edge += SPLIT_PERCENT[split]
        if bucket < edge:
            return split
    raise AssertionError("SPLIT_PERCENT must add up to 100")


@dataclasses.dataclass(frozen=True)
class CorpusInfo:
    """What ``write_demo_corpus`` wrote.

    Attributes:
        out_dir: the folder holding the split files and ``corpus.json``.
        files: split name -> path of its text file (one sample per line, UTF-8).
        lines: split name -> number of lines.
        words: split name -> number of whitespace-separated words.
        bytes: split name -> file size in bytes.
        python: the version of the Python that extracted the text, e.g. "3.11.7".
        sha256: hash of the split names, sizes and contents (changes iff the text does).
    """

    out_dir: str
    files: dict[str, str]
    lines: dict[str, int]
    words: dict[str, int]
    bytes: dict[str, int]
    python: str
    sha256: str


def demo_lines(root: str | None = None, runtime: bool = True) -> list[str]:
    """The whole demo corpus as a list of lines, in corpus order (see ``source_texts``)."""
    return prose_lines(source_texts(root, runtime))


def write_demo_corpus(out_dir: str, root: str | None = None, runtime: bool = True) -> CorpusInfo:
    """Extract the demo corpus and write ``train.txt``, ``validation.txt``, ``test.txt``.

    Each file is written atomically; ``corpus.json`` (the ``CorpusInfo``) is written last, so its
    presence means the corpus is complete.

    Args:
        out_dir: local folder or any ``tf.io.gfile`` path (``gs://``, ``ram://``).
        root: standard-library folder to read; default: the running interpreter's.
        runtime: also include the docstrings of C-implemented modules.

    Returns:
        The paths and the sizes of what was written.

    Raises:
        TpulmError: when the sources hold no prose (e.g. a wrong ``root``).
    """
    lines = demo_lines(root, runtime)
    if not lines:
        where = root or stdlib_dir()
        raise TpulmError(f"no English prose found in the Python sources under {where}")
    by_split: dict[str, list[str]] = {split: [] for split in SPLITS}
    for line in lines:
        by_split[split_of(line)].append(line)
    storage.makedirs(out_dir)
    info_path = storage.join(out_dir, INFO_NAME)
    if storage.exists(info_path):
        storage.remove(info_path)  # the old record must not vouch for half-rewritten files
    digest = hashlib.sha256()
    files, sizes = {}, {}
    for split in SPLITS:
        data = "".join(line + "\n" for line in by_split[split]).encode("utf-8")
        files[split] = storage.join(out_dir, f"{split}.txt")
        storage.write_bytes(files[split], data)
        digest.update(f"{split} {len(data)}\n".encode() + data)
        sizes[split] = len(data)
    info = CorpusInfo(
        out_dir=out_dir,
        files=files,
        lines={s: len(v) for s, v in by_split.items()},
        words={s: sum(len(line.split()) for line in v) for s, v in by_split.items()},
        bytes=sizes,
        python=".".join(map(str, sys.version_info[:3])),
        sha256=digest.hexdigest(),
    )
    record = {"format_version": FORMAT_VERSION, **dataclasses.asdict(info)}
    storage.write_text(info_path, json.dumps(record, indent=2) + "\n")
    return info


def read_corpus_info(out_dir: str) -> CorpusInfo | None:
    """The ``CorpusInfo`` of a complete corpus in ``out_dir``, or None if there is none."""
    path = storage.join(out_dir, INFO_NAME)
    if not storage.exists(path):
        return None
    record = json.loads(storage.read_text(path))
    if record.pop("format_version", None) != FORMAT_VERSION:
        return None
    return CorpusInfo(**record)
