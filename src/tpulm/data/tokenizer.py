"""Train, save and load tokenizers (Hugging Face ``tokenizers``), and fingerprint them.

``run(TokenizerConfig(...))`` streams a corpus (see :mod:`tpulm.data.corpus`), trains one of the
registered models (``MODELS``: the reference Unigram recipe, byte-level BPE, WordPiece) and saves a
folder that ``transformers.AutoTokenizer.from_pretrained`` loads: ``tokenizer.json``,
``tokenizer_config.json`` and ``special_tokens_map.json``. transformers itself is not needed to
write it. Later stages identify a tokenizer by :func:`fingerprint` (SHA-256 of ``tokenizer.json``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from tpulm import config, ownership, storage
from tpulm.data import corpus
from tpulm.errors import TpulmError

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
SPECIAL_ROLES = ("cls_token", "sep_token", "unk_token", "pad_token", "mask_token")
# Written in prompts where the tokenizer's own mask token goes (Unigram and WordPiece: [MASK],
# byte-level BPE: <mask>), so that one prompt answers with every tokenizer family.
MASK_PLACEHOLDER = "{mask}"


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    """Ids of the special tokens a masked language model needs."""

    cls_id: int
    sep_id: int
    unk_id: int
    pad_id: int
    mask_id: int

    @property
    def ids(self) -> tuple[int, ...]:
        return (self.cls_id, self.sep_id, self.unk_id, self.pad_id, self.mask_id)


# ---------------------------------------------------------------------------------------------
# Model recipes (a registry: name -> special tokens in id order + a function building the
# untrained tokenizer and its trainer).


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How to build one kind of tokenizer.

    Args:
        tokens: special tokens, in the id order they get (ids 0..4).
        roles: role (``cls_token`` ...) -> token, for ``tokenizer_config.json``.
        build: ``(vocab_size, tokens, unk) -> (tokenizers.Tokenizer, trainer)``.
        pair_template: the post-processor's template for sentence pairs.
    """

    tokens: tuple[str, ...]
    roles: dict[str, str]
    build: Callable
    pair_template: str
    # The mask token swallows the space before it, as roberta-base's <mask> does: with Metaspace
    # or byte-level pre-tokenizers "an [MASK] of" would otherwise encode as "▁an ▁ [MASK] ▁of",
    # and fill-mask would predict what follows a lone "▁" instead of a word.
    mask_lstrip: bool = False

    def special_tokens(self) -> list:
        """The special tokens for the trainer, the mask token with its ``lstrip`` flag."""
        from tokenizers import AddedToken

        mask = self.roles["mask_token"]
        return [AddedToken(t, lstrip=self.mask_lstrip and t == mask, special=True,
                           normalized=False) for t in self.tokens]


def _build_unigram(vocab_size: int, tokens: list, unk: str):
    """The reference recipe: Unigram, ``` `` ``` and ``''`` -> ``"``, Metaspace."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    )
    # prepend_scheme "first" (as current Transformers tokenizers): "▁" only at the start of the
    # text, not after every special token, so "to [MASK]." encodes the "." as "." and not as a
    # lone "▁" + "." that fill-mask would have to predict around. Older folders keep "always".
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tokenizer.decoder = decoders.Metaspace(prepend_scheme="first")
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=list(tokens), unk_token=unk, show_progress=False
    )
    return tokenizer, trainer


def _build_bpe(vocab_size: int, tokens: list, unk: str):
    """Byte-level BPE as RoBERTa/GPT-2 use it: every byte is in the vocabulary, no ``<unk>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return tokenizer, trainer


def _build_wordpiece(vocab_size: int, tokens: list, unk: str):
    """Cased BERT-style WordPiece."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    tokenizer = Tokenizer(models.WordPiece(unk_token=unk))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=list(tokens), show_progress=False)
    return tokenizer, trainer


def _roles(cls: str, sep: str, unk: str, pad: str, mask: str) -> dict[str, str]:
    return dict(zip(SPECIAL_ROLES, (cls, sep, unk, pad, mask)))


MODELS: dict[str, Recipe] = {
    "unigram": Recipe(
        tokens=("[CLS]", "[SEP]", "<unk>", "<pad>", "[MASK]"),
        roles=_roles("[CLS]", "[SEP]", "<unk>", "<pad>", "[MASK]"),
        build=_build_unigram,
        pair_template="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        mask_lstrip=True,
    ),
    "bpe": Recipe(
        tokens=("<s>", "<pad>", "</s>", "<unk>", "<mask>"),
        roles=_roles("<s>", "</s>", "<unk>", "<pad>", "<mask>"),
        build=_build_bpe,
        pair_template="<s>:0 $A:0 </s>:0 </s>:1 $B:1 </s>:1",
        mask_lstrip=True,
    ),
    "wordpiece": Recipe(
        tokens=("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
        roles=_roles("[CLS]", "[SEP]", "[UNK]", "[PAD]", "[MASK]"),
        build=_build_wordpiece,
        pair_template="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
    ),
}


# ---------------------------------------------------------------------------------------------
# Settings and result


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    """Settings of ``tpulm tokenizer train`` (TOML table ``[tokenizer]``)."""

    inputs: tuple[str, ...] = config.setting(
        (), "text files or globs: .txt (a sample per line), .jsonl, .parquet"
    )
    dataset: str | None = config.setting(None, "🤗 datasets name to stream instead of files")
    dataset_config: str | None = config.setting(None, "🤗 dataset config, e.g. wikitext-2-raw-v1")
    dataset_split: str = config.setting("train", "🤗 dataset split to train on")
    text_field: str = config.setting("text", "field holding the text in .jsonl/.parquet/datasets")
    encoding_errors: str = config.setting(
        "strict", "invalid UTF-8: strict (error) or replace", choices=corpus.ENCODING_ERRORS
    )
    keep_empty: bool = config.setting(False, "train on empty lines too (reference behaviour)")
    output: str = config.setting("tokenizer", "folder to write the tokenizer to (local or gs://)")
    overwrite: bool = config.setting(False, "replace a tokenizer already in the output folder")
    model: str = config.setting("unigram", "tokenizer model", choices=tuple(MODELS))
    vocab_size: int = config.setting(10_000, "target vocabulary size, special tokens included")
    model_max_length: int = config.setting(512, "model_max_length in tokenizer_config.json")
    batch_size: int = config.setting(1000, "samples per batch streamed to the trainer")
    unk_rate_samples: int = config.setting(
        100_000, "samples re-encoded to measure the <unk> rate (0: the whole corpus)"
    )

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise TpulmError(f"unknown tokenizer model {self.model!r}; choose one of {', '.join(MODELS)}")
        if self.vocab_size < len(MODELS[self.model].tokens) + 1:
            raise TpulmError(f"vocab_size (--vocab-size) {self.vocab_size} is too small; use 10000-50000")
        config.check_at_least(self, 1, "batch_size", "model_max_length")
        config.check_at_least(self, 0, "unk_rate_samples")

    def source(self) -> corpus.Source:
        """The corpus this config names."""
        if not self.inputs and not self.dataset:
            raise TpulmError("no corpus given: pass input files (--inputs) or --dataset")
        return corpus.Source(
            files=self.inputs,
            dataset=self.dataset,
            dataset_config=self.dataset_config,
            split=self.dataset_split,
            text_field=self.text_field,
            encoding_errors=self.encoding_errors,
        )


@dataclasses.dataclass(frozen=True)
class TokenizerResult:
    """What ``run`` made: where, how big, how long it took, and the ``<unk>`` rate."""

    path: str
    vocab_size: int  # obtained; smaller than requested when the corpus supports no more
    requested_vocab_size: int
    seconds: float
    unk_rate: float  # share of non-special tokens that are <unk>, over the measured samples
    unk_rate_samples: int  # samples the <unk> rate was measured on
    samples: int  # samples trained on
    fingerprint: str
    unk_literals: int = 0  # times the measured samples contain the unknown token's own text

    @property
    def vocab_shortfall(self) -> str | None:
        """A sentence when the vocabulary came out smaller than asked for, else None."""
        if self.vocab_size >= self.requested_vocab_size:
            return None
        return (f"asked for a vocabulary of {self.requested_vocab_size}, got {self.vocab_size}: "
                f"the corpus supports only {self.vocab_size} tokens")

    def describe(self) -> str:
        """What ``tpulm tokenizer train`` (and ``tpulm run``) say about the new tokenizer."""
        lines = [
            f"tokenizer saved to {self.path}: vocab size {self.vocab_size}, trained on "
            f"{self.samples} samples in {self.seconds:.1f} s, fingerprint {self.fingerprint[:16]}",
            f"<unk> rate {self.unk_rate:.4%} (first {self.unk_rate_samples} samples)",
        ]
        if self.unk_literals:
            lines[-1] += (f"; the corpus itself contains the unknown token's text "
                          f"{self.unk_literals} times (as WikiText's <unk> markers), counted too")
        if self.vocab_shortfall:
            lines.append(f"note: {self.vocab_shortfall}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Training


class _CountingBatches:
    """Wraps a batch iterator: counts samples, and keeps an exception raised while the Rust
    trainer pulls batches, so it is re-raised as itself rather than as a trainer error."""

    def __init__(self, batches: Iterator[list[str]]):
        self.batches = batches
        self.samples = 0
        self.error: BaseException | None = None

    def __iter__(self) -> Iterator[list[str]]:
        try:
            for batch in self.batches:
                self.samples += len(batch)
                yield batch
        except BaseException as err:  # noqa: BLE001 - re-raised by train()
            self.error = err


def _training_error(err: Exception, cfg: TokenizerConfig) -> TpulmError:
    """A tokenizers training failure as one line saying what to change."""
    if "not large enough" in str(err):
        return TpulmError(
            f"--vocab-size {cfg.vocab_size} is smaller than the corpus's alphabet (every distinct "
            "character needs an entry): raise --vocab-size (10000-50000 is usual); if the input "
            "is not text (binary files decoded with --encoding-errors replace bring thousands of "
            "odd characters), check the input files")
    return TpulmError(f"training the tokenizer failed: {err}; check the input files and settings")


def train(cfg: TokenizerConfig):
    """Train the tokenizer ``cfg`` describes; returns (``tokenizers.Tokenizer``, samples seen)."""
    from tokenizers import processors

    recipe = MODELS[cfg.model]
    unk = recipe.roles["unk_token"]
    tokenizer, trainer = recipe.build(cfg.vocab_size, recipe.special_tokens(), unk)
    batches = _CountingBatches(
        corpus.iter_batches(cfg.source(), cfg.batch_size, keep_empty=cfg.keep_empty)
    )
    try:
        tokenizer.train_from_iterator(iter(batches), trainer=trainer)
    except Exception as err:  # the tokenizers library raises plain Exceptions
        if batches.error is not None:
            raise batches.error from None
        raise _training_error(err, cfg) from None
    if batches.error is not None:
        raise batches.error
    if batches.samples == 0:
        where = ", ".join(cfg.inputs) or f"dataset {cfg.dataset}"
        raise TpulmError(f"the corpus is empty: no (non-empty) samples in {where}; check the "
                         "input files")
    if cfg.model == "unigram":
        tokenizer = canonical_unigram(tokenizer, len(recipe.tokens))
    cls, sep = recipe.roles["cls_token"], recipe.roles["sep_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=recipe.pair_template,
        special_tokens=[(cls, tokenizer.token_to_id(cls)), (sep, tokenizer.token_to_id(sep))],
    )
    return tokenizer, batches.samples


SCORE_DECIMALS = 4  # Unigram log-probabilities kept; finer digits are summation-order noise
_CHAR_PENALTY = 1e-4  # the trainer's score step between characters it adds for coverage


def canonical_unigram(tokenizer, specials: int):
    """The trained Unigram model made independent of the trainer's hash-map order.

    The Rust trainer sums its statistics in the iteration order of hash maps that are seeded
    at random per process, so the same corpus gives scores that differ in the last bits, and the
    characters it appends for coverage (scores ``min - k x 1e-4``) in a random order: three runs
    gave three ``tokenizer.json`` files, and so three fingerprints. Here scores are rounded
    (``SCORE_DECIMALS``), pieces after the special tokens sorted by (score descending, piece), and
    the appended characters given their scores in the order of their code points.

    Args:
        tokenizer: a trained ``tokenizers.Tokenizer`` with a Unigram model.
        specials: the special tokens at the start of the vocabulary (kept in place).
    """
    from tokenizers import Tokenizer

    data = json.loads(tokenizer.to_str())
    vocab = data["model"]["vocab"]
    head, rest = vocab[:specials], [[p, round(s, SCORE_DECIMALS)] for p, s in vocab[specials:]]
    rest.sort(key=lambda entry: (-entry[1], entry[0]))
    tail = _appended_characters(rest)
    if tail:
        scores = sorted((s for _, s in rest[-tail:]), reverse=True)
        rest[-tail:] = [[p, s] for p, s in zip(sorted(p for p, _ in rest[-tail:]), scores)]
    rest.sort(key=lambda entry: (-entry[1], entry[0]))
    data["model"]["vocab"] = head + rest
    return Tokenizer.from_str(json.dumps(data, ensure_ascii=False))


def _appended_characters(rest: list) -> int:
    """How many entries at the end of the sorted vocabulary are the trainer's coverage
    characters: single characters whose scores step down by 0 or ``_CHAR_PENALTY``, and the
    character starting that run when its score is within the run's range."""
    count = 0
    for i in range(len(rest) - 1, 0, -1):
        step = round(rest[i - 1][1] - rest[i][1], SCORE_DECIMALS)
        if len(rest[i][0]) != 1 or step not in (0.0, _CHAR_PENALTY):
            break
        count += 1
    if 0 < count < len(rest):
        piece, score = rest[-count - 1]
        if len(piece) == 1 and round(score - rest[-1][1], SCORE_DECIMALS) <= _CHAR_PENALTY * (count + 1):
            count += 1
    return count


def unk_rate(tokenizer, cfg: TokenizerConfig) -> tuple[float, int]:
    """Share of non-special tokens that are ``<unk>`` over the first ``unk_rate_samples`` samples
    (all when 0), and how many samples that was."""
    rate, samples, _ = unk_stats(tokenizer, cfg)
    return rate, samples


def unk_stats(tokenizer, cfg: TokenizerConfig) -> tuple[float, int, int]:
    """:func:`unk_rate`, and how often the samples hold the unknown token's literal text (such
    as WikiText's own ``<unk>`` markers, which encode as the unknown token)."""
    unk = MODELS[cfg.model].roles["unk_token"]
    unk_id = tokenizer.token_to_id(unk)
    limit = cfg.unk_rate_samples or None
    unknown = total = samples = literals = 0
    for batch in corpus.iter_batches(cfg.source(), cfg.batch_size, keep_empty=cfg.keep_empty):
        batch = batch[: limit - samples] if limit else batch
        literals += sum(text.count(unk) for text in batch)
        for encoding in tokenizer.encode_batch_fast(batch, add_special_tokens=False):
            unknown += encoding.ids.count(unk_id)
            total += len(encoding.ids)
        samples += len(batch)
        if limit and samples >= limit:
            break
    return (unknown / total if total else 0.0), samples, literals


# ---------------------------------------------------------------------------------------------
# Saving (a folder transformers loads) and loading


def hf_files(tokenizer, roles: dict[str, str], model_max_length: int) -> dict[str, str]:
    """The three files of a tokenizer folder, as text, keyed by file name."""
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        **roles,
    }
    return {
        TOKENIZER_FILE: tokenizer.to_str(),
        TOKENIZER_CONFIG_FILE: json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n",
        SPECIAL_TOKENS_MAP_FILE: json.dumps(roles, indent=2, sort_keys=True) + "\n",
    }


FOLDER_FILES = (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE)


def save(tokenizer, output: str, roles: dict[str, str], model_max_length: int, overwrite: bool) -> None:
    """Write the tokenizer folder atomically.

    Locally the files go into a temporary folder renamed to ``output`` at the end (an existing
    one is swapped out only once the new one is complete). On object stores, where folders cannot
    be renamed, each file is written atomically and ``tokenizer.json``, the file readers look for,
    comes last.
    """
    files = hf_files(tokenizer, roles, model_max_length)
    output = output.rstrip("/")
    # Only a folder holding nothing but tokenizer files is ever replaced: never the corpus.
    storage.check_replaceable(output, overwrite, files, "a tokenizer")
    if storage.is_remote(output):
        storage.makedirs(output)
        for name in sorted(files, key=lambda n: n == TOKENIZER_FILE):
            storage.write_text(storage.join(output, name), files[name])
        ownership.record(output, files, "tokenizer")
        return
    with storage.atomic_folder(output, overwrite, ours=files) as tmp:  # old one goes at the end
        for name, text in files.items():
            with storage.open_file(storage.join(tmp, name), "w") as f:
                f.write(text)
        ownership.record(tmp, files, "tokenizer")


def run(cfg: TokenizerConfig) -> TokenizerResult:
    """Train a tokenizer on the corpus ``cfg`` names and save it to ``cfg.output``.

    Args:
        cfg: the resolved settings.

    Returns:
        A :class:`TokenizerResult` (path, vocab size, seconds, ``<unk>`` rate, fingerprint).
    """
    source = cfg.source()
    if not source.dataset:
        corpus.resolve_files(source.files)  # a missing input is the first thing to say
    storage.check_reachable(cfg.output, "--output", write=True)
    # Refuse before training, not after: only a folder of tokenizer files may be replaced.
    storage.check_replaceable(cfg.output.rstrip("/"), cfg.overwrite, FOLDER_FILES, "a tokenizer")
    if cfg.overwrite:  # and none of them edited since tpulm wrote them
        ownership.check_folder(cfg.output.rstrip("/"), ("tokenizer",),
                               "tpulm tokenizer train --overwrite would replace",
                               "choose another --output")
    start = time.perf_counter()
    tokenizer, samples = train(cfg)
    seconds = time.perf_counter() - start
    rate, measured, literals = unk_stats(tokenizer, cfg)
    save(tokenizer, cfg.output, MODELS[cfg.model].roles, cfg.model_max_length, cfg.overwrite)
    return TokenizerResult(
        path=cfg.output,
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        requested_vocab_size=cfg.vocab_size,
        unk_literals=literals,
        seconds=seconds,
        unk_rate=rate,
        unk_rate_samples=measured,
        samples=samples,
        fingerprint=fingerprint(cfg.output),
    )


@dataclasses.dataclass(frozen=True)
class TokenizerFolder:
    """A tokenizer folder, read once: the tokenizer, its settings, special-token ids, fingerprint.

    Attributes:
        path: the folder (local or remote).
        tokenizer: the ``tokenizers.Tokenizer``.
        settings: ``tokenizer_config.json`` as a dict.
        special: ids of cls/sep/unk/pad/mask as ``tokenizer_config.json`` names them.
        fingerprint: SHA-256 of ``tokenizer.json``: shards and models are checked against it.
    """

    path: str
    tokenizer: Any
    settings: dict[str, Any]
    special: SpecialTokens
    fingerprint: str

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)


def open_folder(tokenizer_dir: str) -> TokenizerFolder:
    """Read a tokenizer folder (``tokenizer.json`` once: parsed and hashed from the same bytes).

    Raises:
        TpulmError: a file is missing or malformed, or a special token a masked language model
            needs is absent (the message names the folder and what to do).
    """
    raw = _read_tokenizer_json(tokenizer_dir)
    tokenizer = _parse(raw, tokenizer_dir)
    config_path = storage.join(tokenizer_dir, TOKENIZER_CONFIG_FILE)
    settings = storage.read_json(config_path)
    if settings is None:
        raise TpulmError(f"no {TOKENIZER_CONFIG_FILE} in {tokenizer_dir}; is it a tokenizer folder?")
    return TokenizerFolder(
        path=tokenizer_dir, tokenizer=tokenizer, settings=settings,
        special=_special_ids(tokenizer, settings, tokenizer_dir),
        fingerprint=hashlib.sha256(raw).hexdigest())


def _read_tokenizer_json(tokenizer_dir: str) -> bytes:
    path = storage.join(tokenizer_dir, TOKENIZER_FILE)
    if not storage.exists(path):
        raise TpulmError(
            f"no {TOKENIZER_FILE} in {tokenizer_dir}; train one with `tpulm tokenizer train`"
        )
    return storage.read_bytes(path)


def _parse(raw: bytes, tokenizer_dir: str):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as err:  # tokenizers raises a bare Exception for malformed JSON
        path = storage.join(tokenizer_dir, TOKENIZER_FILE)
        raise TpulmError(f"{path} is not a valid tokenizer file: {err}") from None


def _special_ids(tokenizer, settings: dict[str, Any], tokenizer_dir: str) -> SpecialTokens:
    ids = {}
    for role in SPECIAL_ROLES:
        token = settings.get(role)
        if isinstance(token, dict):  # AddedToken serialisation
            token = token.get("content")
        token_id = tokenizer.token_to_id(token) if token else None
        if token_id is None:
            raise TpulmError(
                f"tokenizer in {tokenizer_dir} lacks a {role} ({token!r}); a masked language model "
                "needs cls, sep, unk, pad and mask tokens: retrain it with `tpulm tokenizer train`"
            )
        ids[role.replace("_token", "_id")] = token_id
    return SpecialTokens(**ids)


def load_tokenizer(tokenizer_dir: str):
    """Only the ``tokenizers.Tokenizer`` of a folder (which may lack ``tokenizer_config.json``)."""
    return _parse(_read_tokenizer_json(tokenizer_dir), tokenizer_dir)


def fingerprint(tokenizer_dir: str) -> str:
    """SHA-256 of ``tokenizer.json``: later stages check that shards and models agree on it."""
    return hashlib.sha256(_read_tokenizer_json(tokenizer_dir)).hexdigest()


def special_tokens(tokenizer_dir: str) -> SpecialTokens:
    """Ids of cls/sep/unk/pad/mask as ``tokenizer_config.json`` names them."""
    return open_folder(tokenizer_dir).special
