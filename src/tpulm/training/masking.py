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


def max_predictions(seq_len: int, mlm_probability: float, sigmas: float = 6.0,
                    group_rows: int = 1) -> int:
    """Masked slots per sequence: mean + ``sigmas`` std of the selected count, at most seq_len.

    Rows that share their slots (``group_rows``, see :class:`Masker`) need a margin on their
    total, Binomial(group_rows x seq_len, p): per row that is ``sigmas`` std / sqrt(group_rows).
    At seq 128 and 30% masking one row needs 70 slots for 38 selections on average; a group of
    32 rows needs 44 per row.

    Args:
        seq_len: tokens per sequence (an upper bound on the maskable positions).
        mlm_probability: probability that a maskable position is selected.
        sigmas: safety margin in standard deviations of the binomial count.
        group_rows: rows sharing their slots.
    """
    mean = seq_len * mlm_probability
    std = math.sqrt(seq_len * mlm_probability * (1.0 - mlm_probability) / group_rows)
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
        group_rows: consecutive rows (G) that share their G x P slots. A row's own selection
            varies far more than a group's total, so a group needs fewer padded slots per row
            for the same overflow odds, and the LM head runs on fewer of them. The batch must
            be a multiple of G, and data parallelism must split it at group boundaries: the
            trainer uses the per-replica batch.

    A slot holds the position of its token as an offset from the start of the slot's own row
    in the flattened (B x S) batch: ``(r - i) x S + c`` for the token at row r, column c, in
    slot row i. With G = 1 that is the column. Slots fill in row-major order; when the
    selection overflows the slots, the positions after the last slot stay unselected.
    """

    vocab_size: int
    mask_id: int
    special_ids: tuple[int, ...]
    num_predictions: int
    mlm_probability: float = 0.15
    mask_token_rate: float = 0.8
    random_token_rate: float = 0.1
    group_rows: int = 1

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
        if self.group_rows < 1:
            raise TpulmError(f"group_rows must be positive, got {self.group_rows}")

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
            (B, S), ``masked_positions`` (B, P) (offsets, see the class docstring),
            ``masked_ids`` (B, P) and float32 ``masked_weights`` (B, P).
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
        rows = tf.range(shape[0])[:, None] * shape[1]  # each slot row's start, flattened
        return {
            "input_ids": masked_input,
            "attention_mask": attention_mask,
            "masked_positions": positions,
            "masked_ids": tf.gather(tf.reshape(input_ids, [-1]), rows + positions),
            "masked_weights": weights,
        }

    def _by_group(self, x: tf.Tensor) -> tf.Tensor:
        """(B, S) -> (B / G, G x S): each group of rows flattened, in row-major order."""
        return tf.reshape(x, [-1, self.group_rows * tf.shape(x)[-1]])

    def _select(self, input_ids, maskable, select_seed, action_seed):
        """(selected (B, S) bool, action (B, S) uniform draw deciding [MASK] / random / keep)."""
        shape = tf.shape(input_ids)
        selected = tf.logical_and(
            maskable, tf.random.stateless_uniform(shape, select_seed) < self.mlm_probability
        )
        # Keep only the first G x P selected positions of each group of rows: (B, S) bool.
        rank = tf.reshape(tf.cumsum(self._by_group(tf.cast(selected, tf.int32)), axis=-1), shape)
        selected = tf.logical_and(selected, rank <= self.group_rows * self.num_predictions)
        return selected, tf.random.stateless_uniform(shape, action_seed)

    def _slots(self, selected: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """(B, S) bool -> positions (B, P) int32 offsets in ascending order (0 for empty
        slots), and their weights."""
        seq_len, group, slots = tf.shape(selected)[-1], self.group_rows, self.num_predictions
        flat = self._by_group(selected)  # (B / G, G x S)
        size = group * seq_len
        # Score size - index for selected, 0 otherwise: top_k lists selected positions first,
        # in ascending order; slots beyond the selected count get score 0 (weight 0).
        score = tf.where(flat, size - tf.range(size), 0)
        top, index = tf.math.top_k(score, k=group * slots, sorted=True)
        real = top > 0
        slot_row = tf.range(group * slots) // slots  # the group row each slot lies in
        offsets = tf.where(real, index - slot_row * seq_len, 0)
        batch = tf.shape(selected)[0]
        return (tf.reshape(tf.cast(offsets, tf.int32), [batch, slots]),
                tf.reshape(tf.cast(real, tf.float32), [batch, slots]))


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
