"""Which vocabulary pieces begin a word, from the tokenizer's own markers (no Keras, no TensorFlow).

Whole-word masking (:class:`tpulm.training.masking.WholeWordMasker`) needs to know, for every token id,
whether the piece starts a new word or continues the previous one. The three tokenizer families
tpulm trains mark this in the piece itself:

* Unigram / Metaspace (the reference recipe): a word starts with ``"▁"`` (``"▁the"``); pieces
  without it continue the word (``"▁s" "qua" "re"``), punctuation glued to a word included.
* Byte-level BPE (RoBERTa, GPT-2): a word after a space starts with ``"Ġ"``; pieces without it
  continue the word (``"Ġx" ","``). The first word of a text has no ``"Ġ"`` (no prefix space):
  it still starts a word because it follows ``<s>`` (see below).
* WordPiece (BERT): continuations start with ``"##"``; every other piece, punctuation included,
  starts a word (BERT's own whole-word masking convention).

Special tokens are marked as word starts. The table is per piece, so context is applied in the
graph: a piece right after a special token, after padding, or at the start of a block is always
treated as a word start (a block can begin in the middle of a word cut by the block boundary;
that tail is masked as a word of its own — its head lies in another block and cannot be reached).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np

from tpulm.errors import TpulmError

METASPACE = "▁"
BYTE_LEVEL_SPACE = "Ġ"


def _components(node) -> Iterator[dict]:
    """A pre-tokenizer/normalizer JSON node and, recursively, those of a ``Sequence``."""
    if isinstance(node, dict):
        yield node
        for child in node.get("pretokenizers", []) or []:
            yield from _components(child)


def word_marker(tokenizer) -> tuple[str, str]:
    """``(kind, marker)`` of a ``tokenizers.Tokenizer``: ``("start", "▁")``, ``("start", "Ġ")``
    or ``("continuation", "##")``.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (see :func:`tpulm.data.tokenizer.load_tokenizer`).

    Raises:
        TpulmError: the tokenizer marks word boundaries in none of the known ways.
    """
    spec = json.loads(tokenizer.to_str())
    prefix = (spec.get("model") or {}).get("continuing_subword_prefix")
    if prefix:
        return "continuation", prefix
    for part in _components(spec.get("pre_tokenizer")):
        if part.get("type") == "Metaspace":
            return "start", part.get("replacement") or METASPACE
        if part.get("type") == "ByteLevel":
            return "start", BYTE_LEVEL_SPACE
    raise TpulmError(
        "whole-word masking needs a tokenizer whose pieces mark word boundaries (Metaspace '▁', "
        "byte-level 'Ġ' or WordPiece '##'); this tokenizer has none: turn --whole-word-mask off"
    )


def word_start_table(tokenizer) -> np.ndarray:
    """(vocab_size,) bool: True where the piece with that id begins a word.

    Args:
        tokenizer: a ``tokenizers.Tokenizer``; added and special tokens included (they are
            word starts).

    Returns:
        A numpy bool array indexed by token id, for ``tf.gather`` in the masking graph.
    """
    kind, marker = word_marker(tokenizer)
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    table = np.ones(max(vocab.values()) + 1, dtype=bool)  # ids missing from the vocab: starts
    for piece, index in vocab.items():
        table[index] = piece.startswith(marker) if kind == "start" else not piece.startswith(marker)
    for index in tokenizer.get_added_tokens_decoder():
        table[index] = True  # special and added tokens stand alone
    return table
