"""Dynamic masked-language-model masking with TensorFlow ops, for use inside ``tf.data``.

Every batch is masked afresh from a stateless seed derived from (run seed, epoch, batch index), so
each epoch sees new masks, and a resumed run reproduces the masks of an uninterrupted one exactly.

Of the non-special, non-padding positions, each is selected with probability ``mlm_probability``
(BERT/RoBERTa: 0.15); a selected position becomes ``[MASK]`` with probability ``mask_token_rate``
(0.8), a random non-special token with probability ``random_token_rate`` (0.1), and stays unchanged
otherwise. Its original id is the label.

Static shapes for XLA/TPU: every sequence reports exactly ``P = num_predictions`` masked slots —
``masked_positions`` (B, P), ``masked_ids`` (B, P) and ``masked_weights`` (B, P), 1.0 for a real
slot and 0.0 for padding. ``P`` defaults to ``max_predictions``: the mean plus six standard
deviations of the Binomial(seq_len, p) count, so a sequence selects more than ``P`` positions with
probability ~1e-8 (seq 128, p 0.15: P = 44, P(X > 44) = 1.4e-8; seq 512: P = 126, 4.8e-9). Should
it happen, positions past the first ``P`` selected ones are left unselected (unchanged input, no
label), so inputs and labels always agree.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import tensorflow as tf

from tpulm.errors import TpulmError


def max_predictions(seq_len: int, mlm_probability: float, sigmas: float = 6.0) -> int:
    """Masked slots per sequence: mean + ``sigmas`` std of Binomial(seq_len, p), at most seq_len.

    Args:
        seq_len: tokens per sequence (an upper bound on the maskable positions).
        mlm_probability: probability that a maskable position is selected.
        sigmas: safety margin in standard deviations of the binomial count.
    """
    mean = seq_len * mlm_probability
    std = math.sqrt(seq_len * mlm_probability * (1.0 - mlm_probability))
    return max(1, min(seq_len, math.ceil(mean + sigmas * std)))


@dataclasses.dataclass(frozen=True)
class Masker:
    """MLM masking of batches of token ids; call it inside ``tf.data`` (graph mode).

    Args:
        vocab_size: size of the vocabulary (random replacement tokens are drawn below it).
        mask_id: id of the ``[MASK]`` token.
        special_ids: ids never selected and never drawn as random replacements.
        num_predictions: masked slots per sequence (P); see ``max_predictions``.
        mlm_probability: probability that a maskable position is selected.
        mask_token_rate: share of selected positions replaced by ``[MASK]``.
        random_token_rate: share of selected positions replaced by a random non-special token.
    """

    vocab_size: int
    mask_id: int
    special_ids: tuple[int, ...]
    num_predictions: int
    mlm_probability: float = 0.15
    mask_token_rate: float = 0.8
    random_token_rate: float = 0.1

    def __post_init__(self) -> None:
        for name in ("mlm_probability", "mask_token_rate", "random_token_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise TpulmError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.mask_token_rate + self.random_token_rate > 1.0 + 1e-9:
            raise TpulmError(
                "mask_token_rate + random_token_rate must be at most 1, got "
                f"{self.mask_token_rate} + {self.random_token_rate}"
            )
        if self.num_predictions < 1:
            raise TpulmError(f"num_predictions must be positive, got {self.num_predictions}")

    @property
    def replacement_ids(self) -> np.ndarray:
        """Ids a random replacement may take: the vocabulary minus the special tokens."""
        return np.setdiff1d(np.arange(self.vocab_size), np.asarray(self.special_ids)).astype(np.int32)

    def __call__(self, input_ids: tf.Tensor, attention_mask: tf.Tensor, seed: tf.Tensor) -> dict:
        """Mask a batch.

        Args:
            input_ids: (B, S) int token ids.
            attention_mask: (B, S) int, 1 for real tokens, 0 for padding.
            seed: shape-(2,) int64 stateless seed; the same seed gives the same masks.

        Returns:
            dict of int32 ``input_ids`` (B, S) with replacements applied, ``attention_mask``
            (B, S), ``masked_positions`` (B, P), ``masked_ids`` (B, P) and float32
            ``masked_weights`` (B, P).
        """
        input_ids = tf.cast(input_ids, tf.int32)
        attention_mask = tf.cast(attention_mask, tf.int32)
        shape = tf.shape(input_ids)
        select_seed, action_seed, random_seed = (
            tf.random.experimental.stateless_fold_in(seed, k) for k in range(3)
        )
        maskable = tf.logical_and(
            tf.equal(attention_mask, 1),
            tf.reduce_all(input_ids[..., None] != tf.constant(self.special_ids, tf.int32), -1),
        )
        selected, action = self._select(input_ids, maskable, select_seed, action_seed)
        to_mask = tf.logical_and(selected, action < self.mask_token_rate)
        to_random = tf.logical_and(
            selected,
            tf.logical_and(
                action >= self.mask_token_rate,
                action < self.mask_token_rate + self.random_token_rate,
            ),
        )
        table = tf.constant(self.replacement_ids)
        random_ids = tf.gather(
            table,
            tf.random.stateless_uniform(
                shape, random_seed, minval=0, maxval=table.shape[0], dtype=tf.int32
            ),
        )
        masked_input = tf.where(to_mask, self.mask_id, tf.where(to_random, random_ids, input_ids))
        positions, weights = self._slots(selected)
        return {
            "input_ids": masked_input,
            "attention_mask": attention_mask,
            "masked_positions": positions,
            "masked_ids": tf.gather(input_ids, positions, batch_dims=1),
            "masked_weights": weights,
        }

    def _select(self, input_ids, maskable, select_seed, action_seed):
        """(selected (B, S) bool, action (B, S) uniform draw deciding [MASK] / random / keep)."""
        shape = tf.shape(input_ids)
        selected = tf.logical_and(
            maskable, tf.random.stateless_uniform(shape, select_seed) < self.mlm_probability
        )
        # Keep only the first P selected positions of each row: (B, S) bool.
        rank = tf.cumsum(tf.cast(selected, tf.int32), axis=-1)
        selected = tf.logical_and(selected, rank <= self.num_predictions)
        return selected, tf.random.stateless_uniform(shape, action_seed)

    def _slots(self, selected: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """(B, S) bool -> positions (B, P) int32 in ascending order (0 for empty slots), weights."""
        seq_len = tf.shape(selected)[-1]
        # Score S - position for selected, 0 otherwise: top_k lists selected positions first,
        # in ascending order; slots beyond the selected count get score 0 (weight 0).
        score = tf.where(selected, seq_len - tf.range(seq_len), 0)
        top, positions = tf.math.top_k(score, k=self.num_predictions, sorted=True)
        real = top > 0
        positions = tf.where(real, positions, 0)
        return tf.cast(positions, tf.int32), tf.cast(real, tf.float32)


def whole_word_predictions(seq_len: int, mlm_probability: float, sigmas: float = 6.0,
                           pieces_per_word: float = 4.0) -> int:
    """Masked slots per sequence for whole-word masking.

    The selected-token count is a sum of word lengths L_w each kept with probability p: its mean
    is still ``seq_len * p`` but its variance is ``p (1 - p) sum_w L_w^2``, and ``sum_w L_w^2 =
    m * seq_len`` where m is the average, over the tokens of a row, of the length of the word
    holding the token. Measured on 128-token blocks of the demo corpus, m averages 1.0-1.7 with
    8k-piece vocabularies (99th percentile <= 3.9) and 2.2-3.5 with 1k-piece ones (99th
    percentile 4-8). With the default bound m <= 4 (seq 128, p 0.15: P = 68) one row in ~10,000
    overflowed with the 1k vocabularies, losing 3e-5 to 5e-5 of the selected pieces; none did
    with WordPiece. Raise ``pieces_per_word`` for tiny vocabularies or long-word text.

    Args:
        seq_len: tokens per sequence.
        mlm_probability: probability that a word is selected.
        sigmas: safety margin in standard deviations.
        pieces_per_word: bound on the token-weighted mean word length, in pieces.
    """
    mean = seq_len * mlm_probability
    std = math.sqrt(pieces_per_word * seq_len * mlm_probability * (1.0 - mlm_probability))
    return max(1, min(seq_len, math.ceil(mean + sigmas * std)))


@dataclasses.dataclass(frozen=True)
class WholeWordMasker(Masker):
    """Whole-word MLM masking: all pieces of a word are selected, or none.

    Each word is selected with probability ``mlm_probability``, so the expected share of masked
    *tokens* is still ``mlm_probability`` (as Transformers' ``DataCollatorForLanguageModeling(
    whole_word_mask=True)``). The [MASK] / random / keep choice is drawn once per word (as
    fairseq's ``--mask-whole-words``): a word is masked entirely, replaced entirely (each piece by
    its own random token) or kept entirely. Transformers 5 supports only [MASK] for whole words
    (it forces ``mask_replace_prob=1``); ``mask_token_rate=1, random_token_rate=0`` reproduces it.

    A word starts at a piece whose id is True in ``word_starts`` (see
    :func:`tpulm.training.words.word_start_table`) and at any maskable piece after a special token,
    padding or the block start (the tail of a word cut by the block boundary is a word of its
    own). Static shapes: if the selected words hold more than ``P`` pieces, the word that would
    overflow and all words after it are left unselected (never half a word), so inputs and labels
    agree; see :func:`whole_word_predictions` for how rare that is.

    Args:
        word_starts: (vocab_size,) bools, True where the piece begins a word.
        (the other arguments are those of :class:`Masker`)
    """

    word_starts: tuple[bool, ...] = dataclasses.field(default=(), repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.word_starts) < self.vocab_size:
            raise TpulmError(
                f"word_starts has {len(self.word_starts)} entries for a vocabulary of "
                f"{self.vocab_size}; build it with tpulm.training.words.word_start_table(tokenizer)"
            )

    def _select(self, input_ids, maskable, select_seed, action_seed):
        """Per-word selection and action, spread over the word's pieces: (B, S) each."""
        shape = tf.shape(input_ids)
        batch, seq_len = shape[0], shape[1]
        starts = tf.gather(tf.constant(self.word_starts, tf.bool), input_ids)
        # A piece after a special token, padding or the block start begins a word.
        after_break = tf.pad(tf.logical_not(maskable[:, :-1]), [[0, 0], [1, 0]], constant_values=True)
        starts = tf.logical_and(maskable, tf.logical_or(starts, after_break))
        # (B, S) word index 1..W of each maskable piece, 0 elsewhere.
        word = tf.cumsum(tf.cast(starts, tf.int32), axis=-1) * tf.cast(maskable, tf.int32)
        # One draw per word index 0..S (index 0: non-maskable positions, never selected).
        word_shape = tf.stack([batch, seq_len + 1])
        chosen = tf.random.stateless_uniform(word_shape, select_seed) < self.mlm_probability
        selected = tf.logical_and(maskable, tf.gather(chosen, word, batch_dims=1))
        action = tf.gather(tf.random.stateless_uniform(word_shape, action_seed), word, batch_dims=1)
        # Keep a word only if its last piece is among the first P selected pieces of the row.
        rank = tf.cumsum(tf.cast(selected, tf.int32), axis=-1)
        segment = word + tf.range(batch)[:, None] * (seq_len + 1)  # (B, S) unique per (row, word)
        end_rank = tf.math.unsorted_segment_max(rank, segment, batch * (seq_len + 1))
        fits = tf.gather(end_rank, segment) <= self.num_predictions
        return tf.logical_and(selected, fits), action
