"""MLM masking: exact behaviour at extreme rates, statistics against Transformers' collator."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from support.training import blocks, make_tokenizer, wikitext_lines

from tpulm.data.tokenizer import special_tokens
from tpulm.training.masking import Masker, max_predictions

MAX_LENGTH = 128


@pytest.fixture(scope="module")
def data(tmp_path_factory, wikitext_dir):
    """Tokenizer trained on WikiText-2 valid, and 256 real blocks of 128 tokens."""
    lines = wikitext_lines(wikitext_dir, "valid", limit=3000)
    tok_dir = make_tokenizer(tmp_path_factory.mktemp("tok"), lines, vocab_size=1000)
    ids, mask = blocks(tok_dir, wikitext_lines(wikitext_dir, "test", limit=1200), MAX_LENGTH)
    ids, mask = ids[:256], mask[:256]
    mask[-1, 100:] = 0  # a padded row (padding with pad ids)
    ids[-1, 100:] = special_tokens(str(tok_dir)).pad_id
    return tok_dir, ids, mask


def _masker(tok_dir, **rates) -> Masker:
    special = special_tokens(str(tok_dir))
    return Masker(
        vocab_size=1000,
        mask_id=special.mask_id,
        special_ids=special.ids,
        num_predictions=max_predictions(MAX_LENGTH, rates.get("mlm_probability", 0.15)),
        **rates,
    )


def _run(masker, ids, mask, seed=(1, 2)):
    out = masker(tf.constant(ids), tf.constant(mask), tf.constant(seed, tf.int64))
    return {k: v.numpy() for k, v in out.items()}


def test_max_predictions_is_mean_plus_six_sigma():
    assert max_predictions(128, 0.15) == 44  # 19.2 + 6 * 4.04
    assert max_predictions(512, 0.15) == 126
    assert max_predictions(4, 1.0) == 4


def test_all_selected_all_mask_is_exact(data):
    tok_dir, ids, mask = data
    special = special_tokens(str(tok_dir))
    masker = _masker(tok_dir, mlm_probability=1.0, mask_token_rate=1.0, random_token_rate=0.0)
    out = _run(masker, ids, mask)
    P = masker.num_predictions
    for row in range(len(ids)):
        maskable = np.flatnonzero((mask[row] == 1) & ~np.isin(ids[row], special.ids))
        expected = maskable[:P]  # the first P selected positions are kept
        n = len(expected)
        np.testing.assert_array_equal(out["masked_positions"][row, :n], expected)
        np.testing.assert_array_equal(out["masked_positions"][row, n:], 0)
        np.testing.assert_array_equal(out["masked_weights"][row], [1.0] * n + [0.0] * (P - n))
        np.testing.assert_array_equal(out["masked_ids"][row, :n], ids[row, expected])
        changed = np.flatnonzero(out["input_ids"][row] != ids[row])
        np.testing.assert_array_equal(changed, expected[ids[row, expected] != special.mask_id])
        assert (out["input_ids"][row, expected] == special.mask_id).all()
    np.testing.assert_array_equal(out["attention_mask"], mask)


def test_keep_and_random_rates_are_exact(data):
    tok_dir, ids, mask = data
    special = special_tokens(str(tok_dir))
    keep = _run(_masker(tok_dir, mlm_probability=1.0, mask_token_rate=0.0, random_token_rate=0.0), ids, mask)
    np.testing.assert_array_equal(keep["input_ids"], ids)  # selected but unchanged
    assert keep["masked_weights"].sum() > 0
    rand = _run(_masker(tok_dir, mlm_probability=1.0, mask_token_rate=0.0, random_token_rate=1.0), ids, mask)
    pos, w = rand["masked_positions"], rand["masked_weights"] > 0
    drawn = np.take_along_axis(rand["input_ids"], pos, 1)[w]
    assert not np.isin(drawn, special.ids).any()
    assert (drawn < 1000).all() and len(np.unique(drawn)) > 500
    untouched = np.ones_like(ids, bool)
    np.put_along_axis(untouched, pos, ~w, 1)  # only the real slots may change
    rows = np.repeat(np.arange(len(ids))[:, None], pos.shape[1], 1)
    untouched[rows[w], pos[w]] = False
    np.testing.assert_array_equal(rand["input_ids"][untouched], ids[untouched])
    none = _run(_masker(tok_dir, mlm_probability=0.0), ids, mask)
    assert none["masked_weights"].sum() == 0
    np.testing.assert_array_equal(none["input_ids"], ids)


def test_same_seed_same_masks_other_seed_other_masks(data):
    tok_dir, ids, mask = data
    masker = _masker(tok_dir)
    a, b, c = _run(masker, ids, mask, (5, 7)), _run(masker, ids, mask, (5, 7)), _run(masker, ids, mask, (5, 8))
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert (a["masked_positions"] != c["masked_positions"]).any()


def _rates(original, masked_input, selected, specials, mask_id, maskable):
    """Selected share of maskable tokens; [MASK] / random / unchanged shares of selected."""
    sel = selected & maskable
    assert not (selected & ~maskable).any(), "a special or padding position was selected"
    return np.array([
        sel.sum() / maskable.sum(),
        (masked_input[sel] == mask_id).mean(),
        ((masked_input[sel] != mask_id) & (masked_input[sel] != original[sel])).mean(),
        (masked_input[sel] == original[sel]).mean(),
    ])


def test_statistics_match_transformers_collator(data):
    """Rates agree with DataCollatorForLanguageModeling(mlm_probability=0.15) on the same batches.

    About 32k maskable tokens per round, 8 rounds each: standard errors are ~0.0007 for the
    selection rate and ~0.003 for the shares, so 0.006 / 0.015 are > 4 standard errors.
    """
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tok_dir, ids, mask = data
    special = special_tokens(str(tok_dir))
    hf_tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(tok_dir))
    collator = transformers.DataCollatorForLanguageModeling(hf_tok, mlm_probability=0.15)
    maskable = (mask == 1) & ~np.isin(ids, special.ids)
    ours, theirs = [], []
    masker = _masker(tok_dir)
    for round_ in range(8):
        out = _run(masker, ids, mask, (round_, 0))
        selected = np.zeros_like(ids, bool)
        rows = np.repeat(np.arange(len(ids))[:, None], masker.num_predictions, 1)
        w = out["masked_weights"] > 0
        selected[rows[w], out["masked_positions"][w]] = True
        ours.append(_rates(ids, out["input_ids"], selected, special.ids, special.mask_id, maskable))
        torch.manual_seed(round_)
        batch = collator([{"input_ids": r, "attention_mask": m} for r, m in zip(ids.tolist(), mask.tolist())])
        labels = batch["labels"].numpy()
        theirs.append(
            _rates(ids, batch["input_ids"].numpy(), labels != -100, special.ids, special.mask_id, maskable)
        )
    ours, theirs = np.mean(ours, 0), np.mean(theirs, 0)
    np.testing.assert_allclose(ours[0], theirs[0], atol=0.006)
    np.testing.assert_allclose(ours[1:], theirs[1:], atol=0.015)
    np.testing.assert_allclose(ours, [0.15, 0.8, 0.1, 0.1], atol=0.015)
