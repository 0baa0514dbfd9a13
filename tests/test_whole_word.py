"""Whole-word masking: word-start tables of the three tokenizer families, exact behaviour at forced
rates on a hand-made vocabulary, statistics against Transformers' whole-word collator."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from support.words import FAMILIES, demo_lines, train_family

from tpulm.data import tokenizer
from tpulm.errors import TpulmError
from tpulm.training.masking import WholeWordMasker, whole_word_predictions
from tpulm.training.words import word_start_table

SPECIALS = ["[CLS]", "[SEP]", "<unk>", "<pad>", "[MASK]"]
PIECES = ["▁the", "▁cat", "s", "▁sat", "▁on", "▁mat", ".", "▁un", "believ", "able"]
CLS, SEP, PAD, MASK = 0, 1, 3, 4
V = {p: i + 5 for i, p in enumerate(PIECES)}
MAX_LENGTH = 128


def _hand_tokenizer():
    """A Metaspace Unigram tokenizer over ``SPECIALS + PIECES`` (ids in that order)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.Unigram([(t, 0.0) for t in SPECIALS] + [(p, -1.0) for p in PIECES], 2))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIALS])
    return tok


def _masker(table, P, **rates) -> WholeWordMasker:
    return WholeWordMasker(vocab_size=len(table), mask_id=MASK, special_ids=(0, 1, 2, 3, 4),
                           num_predictions=P, word_starts=tuple(table.tolist()), **rates)


def _run(masker, ids, mask, seed=(1, 2)):
    out = masker(tf.constant(ids), tf.constant(mask), tf.constant(seed, tf.int64))
    return {k: v.numpy() for k, v in out.items()}


def _rows():
    """Row 0 starts with [CLS] and holds two documents; row 1 starts mid-word (a cut block)."""
    v = V
    row0 = [CLS, v["▁the"], v["▁cat"], v["s"], v["▁sat"], v["▁on"], v["▁the"], v["▁mat"], v["."],
            SEP, CLS, v["▁un"], v["believ"], v["able"], SEP, PAD]
    row1 = [v["believ"], v["able"], v["▁the"], v["▁cat"], v["s"], SEP, CLS, v["▁un"], v["believ"],
            v["able"], v["."], v["▁sat"], SEP, PAD, PAD, PAD]
    ids = np.array([row0, row1], np.int64)
    return ids, (ids != PAD).astype(np.int64)


def test_word_start_table_of_a_hand_made_metaspace_vocabulary():
    table = word_start_table(_hand_tokenizer())
    expected = [True] * 5 + [p.startswith("▁") for p in PIECES]
    np.testing.assert_array_equal(table, expected)


def test_all_words_selected_and_masked_fills_exactly_p_slots_without_splitting_words():
    ids, mask = _rows()
    table = word_start_table(_hand_tokenizer())
    out = _run(_masker(table, 7, mlm_probability=1.0, mask_token_rate=1.0, random_token_rate=0.0),
               ids, mask)
    # Row 0 words: [1] [2 3] [4] [5] [6] [7 8] | [11 12 13]; 7 slots hold 1-6 (6 pieces): the
    # next word [7 8] would need slots 7 and 8, so it and every later word stay unselected.
    # Row 1: the cut-off tail [0 1] is a word; then [2] [3 4] | [7 8 9 10] would overflow.
    np.testing.assert_array_equal(out["masked_positions"], [[1, 2, 3, 4, 5, 6, 0], [0, 1, 2, 3, 4, 0, 0]])
    np.testing.assert_array_equal(out["masked_weights"], [[1] * 6 + [0], [1] * 5 + [0, 0]])
    np.testing.assert_array_equal(out["masked_ids"][0, :6], ids[0, 1:7])
    np.testing.assert_array_equal(out["masked_ids"][1, :5], ids[1, :5])
    expected = ids.copy()
    expected[0, 1:7] = MASK
    expected[1, 0:5] = MASK
    np.testing.assert_array_equal(out["input_ids"], expected)
    # With room for everything, every non-special real piece is selected.
    full = _run(_masker(table, 16, mlm_probability=1.0), ids, mask)
    maskable = (mask == 1) & (ids > 4)
    assert full["masked_weights"].sum() == maskable.sum()


def test_zero_rate_selects_nothing_and_keep_rate_changes_nothing():
    ids, mask = _rows()
    table = word_start_table(_hand_tokenizer())
    none = _run(_masker(table, 8, mlm_probability=0.0), ids, mask)
    assert none["masked_weights"].sum() == 0
    np.testing.assert_array_equal(none["input_ids"], ids)
    keep = _run(_masker(table, 16, mlm_probability=1.0, mask_token_rate=0.0, random_token_rate=0.0),
                ids, mask)
    np.testing.assert_array_equal(keep["input_ids"], ids)
    assert keep["masked_weights"].sum() == 11 + 10


def test_mask_or_random_is_decided_per_word():
    ids, mask = _rows()
    table = word_start_table(_hand_tokenizer())
    masker = _masker(table, 16, mlm_probability=1.0, mask_token_rate=0.5, random_token_rate=0.5)
    words = [[(0, [1]), (0, [2, 3]), (0, [6]), (0, [7, 8]), (0, [11, 12, 13])],
             [(1, [0, 1]), (1, [3, 4]), (1, [7, 8, 9, 10])]]
    kinds = set()
    for seed in range(30):
        out = _run(masker, ids, mask, (seed, 3))
        for row, positions in (w for ws in words for w in ws):
            masked = out["input_ids"][row, positions] == MASK
            assert masked.all() or not masked.any(), (seed, row, positions)
            kinds.add(bool(masked.all()))
    assert kinds == {True, False}


def test_tokenizer_without_word_markers_is_refused():
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1}, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    with pytest.raises(TpulmError, match="--whole-word-mask"):
        word_start_table(tok)


# -- real tokenizers and text -------------------------------------------------------------------


@pytest.fixture(scope="module")
def lines():
    return demo_lines()


@pytest.fixture(scope="module")
def families(tmp_path_factory, lines):
    out = tmp_path_factory.mktemp("families")
    return {f: train_family(out, lines, f) for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_word_start_table_follows_each_family_marker(families, family):
    tok = tokenizer.load_tokenizer(families[family])
    table = word_start_table(tok)
    assert len(table) == tok.get_vocab_size()
    special = tokenizer.special_tokens(families[family])
    assert table[list(special.ids)].all()
    enc = tok.encode("Return the square-root of x, unconditionally.", add_special_tokens=False)
    for piece, index in zip(enc.tokens, enc.ids):
        marker = {"unigram": piece.startswith("▁"), "bpe": piece.startswith("Ġ"),
                  "wordpiece": not piece.startswith("##")}[family]
        assert table[index] == marker, piece
    assert 0.2 < table.mean() < 0.9  # both kinds are common in a 1k vocabulary


def _rows_with_offsets(hf_tok, lines, count=256):
    """``count`` single-document rows ([CLS] ... [SEP], padded to 128) and their offsets with
    the leading space trimmed (the word boundary Transformers' collator looks for)."""
    ids = np.full((count, MAX_LENGTH), hf_tok.pad_token_id, np.int64)
    offsets = np.zeros((count, MAX_LENGTH, 2), np.int64)
    special = np.ones((count, MAX_LENGTH), np.int64)
    row = 0
    for text in lines:
        enc = hf_tok(text, return_offsets_mapping=True, return_special_tokens_mask=True)
        n = len(enc["input_ids"])
        if not 16 <= n <= MAX_LENGTH:
            continue
        ids[row, :n] = enc["input_ids"]
        special[row, :n] = enc["special_tokens_mask"]
        for i, (s, e) in enumerate(enc["offset_mapping"]):
            offsets[row, i] = (s + (e > s and text[s].isspace()), e)
        row += 1
        if row == count:
            break
    mask = (np.arange(MAX_LENGTH) < (ids != hf_tok.pad_token_id).sum(1)[:, None]).astype(np.int64)
    return ids, mask, offsets, special


def _our_words(table, ids, maskable):
    """(B, S) word index (1-based per row; 0 = not maskable), recomputed in numpy."""
    after_break = np.concatenate([np.ones((len(ids), 1), bool), ~maskable[:, :-1]], 1)
    starts = maskable & (table[ids] | after_break)
    return np.cumsum(starts, 1) * maskable


@pytest.mark.filterwarnings("ignore:Random token replacement is not supported")
@pytest.mark.parametrize("family", FAMILIES)
def test_statistics_match_transformers_whole_word_collator(families, lines, family):
    """Selection shares agree with DataCollatorForLanguageModeling(whole_word_mask=True) on the
    same rows; the per-word [MASK] / random / keep shares are 0.8 / 0.1 / 0.1.

    About 20k maskable pieces per round, 8 rounds: the token selection share has a standard
    error of ~0.0015 (whole words make the count lumpier than single pieces); 0.01 is > 6 of them.
    Per-word shares over ~20k selected words: standard errors <= 0.003; 0.015 is 5 of them.
    """
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tok_dir = families[family]
    hf_tok = transformers.PreTrainedTokenizerFast.from_pretrained(tok_dir)
    special = tokenizer.special_tokens(tok_dir)
    table = word_start_table(tokenizer.load_tokenizer(tok_dir))
    ids, mask, offsets, special_mask = _rows_with_offsets(hf_tok, lines)
    maskable = (mask == 1) & ~np.isin(ids, special.ids)
    words = _our_words(table, ids, maskable)
    masker = WholeWordMasker(
        vocab_size=len(table), mask_id=special.mask_id, special_ids=special.ids,
        num_predictions=whole_word_predictions(MAX_LENGTH, 0.15), word_starts=tuple(table.tolist()))
    collator = transformers.DataCollatorForLanguageModeling(hf_tok, whole_word_mask=True, mlm_probability=0.15)
    ours, theirs, shares = [], [], np.zeros(3)
    for round_ in range(8):
        out = _run(masker, ids, mask, (round_, 0))
        selected = np.zeros_like(maskable)
        rows = np.repeat(np.arange(len(ids))[:, None], masker.num_predictions, 1)
        w = out["masked_weights"] > 0
        selected[rows[w], out["masked_positions"][w]] = True
        assert not (selected & ~maskable).any(), "a special or padding position was selected"
        ours.append(selected.sum() / maskable.sum())
        shares += _per_word_kinds(words, ids, out["input_ids"], selected, special.mask_id)
        torch.manual_seed(round_)
        batch = collator([{"input_ids": i, "attention_mask": m, "offset_mapping": o,
                           "special_tokens_mask": s}
                          for i, m, o, s in zip(ids.tolist(), mask.tolist(), offsets.tolist(),
                                                special_mask.tolist())])
        chosen = batch["labels"].numpy() != -100
        assert not (chosen & ~maskable).any()
        theirs.append(chosen.sum() / maskable.sum())
        # Transformers 5 only masks whole words with [MASK] (it forces mask_replace_prob=1).
        assert (batch["input_ids"].numpy()[chosen] == special.mask_id).all()
    shares /= shares.sum()
    # Word boundaries: ours (markers) against Transformers' (offset gaps), on maskable pieces.
    hf_words, _ = collator._calc_word_ids_and_prob_mask(offsets, special_mask)
    hf_starts = np.diff(hf_words, axis=1, prepend=0) != 0
    ours_starts = np.diff(words, axis=1, prepend=0) != 0
    agree = (hf_starts == ours_starts)[maskable].mean()
    print(f"{family}: selected share ours {np.mean(ours):.4f} transformers {np.mean(theirs):.4f}; "
          f"per word [MASK]/random/keep {shares.round(4).tolist()}; word starts agree {agree:.4f}")
    np.testing.assert_allclose(np.mean(ours), np.mean(theirs), atol=0.01)
    np.testing.assert_allclose(np.mean(ours), 0.15, atol=0.01)
    np.testing.assert_allclose(shares, [0.8, 0.1, 0.1], atol=0.015)


def _per_word_kinds(words, original, masked_input, selected, mask_id) -> np.ndarray:
    """Counts of selected words fully [MASK], replaced (no [MASK], a piece changed), kept."""
    counts = np.zeros(3)
    for r in range(len(words)):
        for w in np.unique(words[r][selected[r]]):
            pieces = words[r] == w
            assert w > 0 and selected[r, pieces].all(), "a word was only partly selected"
            got, was = masked_input[r, pieces], original[r, pieces]
            if (got == mask_id).all():
                counts[0] += 1
            elif (got == was).all():
                counts[2] += 1  # kept (or a random draw equal to every original piece: ~1e-3)
            else:
                assert not (got == mask_id).any(), "a word partly [MASK]"
                counts[1] += 1
    return counts


def test_whole_word_slots_allow_for_multi_piece_words():
    assert whole_word_predictions(128, 0.15) == 68  # 19.2 + 6 * sqrt(4 * 128 * 0.1275)
    assert whole_word_predictions(128, 0.15, pieces_per_word=1.0) == 44  # = max_predictions
    assert whole_word_predictions(8, 1.0) == 8
