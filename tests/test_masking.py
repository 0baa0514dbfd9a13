"""MLM masking: exact behaviour at extreme rates, statistics against Transformers' collator."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from support.training import blocks, make_tokenizer, wikitext_lines

from tpulm.data.tokenizer import special_tokens
from tpulm.errors import TpulmError
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
    assert max_predictions(128, 0.3) == 70  # 38.4 + 6 * 5.18
    assert max_predictions(128, 0.3, group_rows=32) == 44  # 38.4 + 6 * 5.18 / sqrt(32)


def _targets(out) -> list[tuple[int, int, int]]:
    """(row, column, original id) of every real slot, decoding offsets into the flat batch."""
    pos, real, seq = out["masked_positions"], out["masked_weights"] > 0, out["input_ids"].shape[1]
    flat = (np.arange(len(pos))[:, None] * seq + pos)[real]
    return sorted(zip((flat // seq).tolist(), (flat % seq).tolist(), out["masked_ids"][real].tolist()))


def test_rows_sharing_slots_mask_the_same_tokens_in_fewer_slots(data):
    tok_dir, ids, mask = data
    special = special_tokens(str(tok_dir))
    common = dict(vocab_size=1000, mask_id=special.mask_id, special_ids=special.ids,
                  mlm_probability=0.3)
    alone = _run(Masker(num_predictions=max_predictions(MAX_LENGTH, 0.3), **common), ids, mask)
    shared = _run(Masker(num_predictions=max_predictions(MAX_LENGTH, 0.3, group_rows=32),
                         group_rows=32, **common), ids, mask)
    assert shared["masked_positions"].shape == (256, 44) and alone["masked_positions"].shape == (256, 70)
    np.testing.assert_array_equal(shared["input_ids"], alone["input_ids"])  # the same draw
    assert _targets(shared) == _targets(alone)
    assert all(ids[r, c] == i for r, c, i in _targets(shared))
    # A group's slots hold only its own rows' tokens, in row-major order.
    pos = shared["masked_positions"]
    flat = np.arange(256)[:, None] * MAX_LENGTH + pos
    real = shared["masked_weights"] > 0
    for g in range(8):
        rows = (flat[g * 32:(g + 1) * 32][real[g * 32:(g + 1) * 32]]) // MAX_LENGTH
        assert rows.min() >= g * 32 and rows.max() < (g + 1) * 32 and (np.diff(rows) >= 0).all()


def test_a_group_that_overflows_keeps_its_first_slots_and_unmasks_the_rest(data):
    tok_dir, ids, mask = data
    special = special_tokens(str(tok_dir))
    masker = Masker(1000, special.mask_id, special.ids, num_predictions=5, mlm_probability=1.0,
                    mask_token_rate=1.0, random_token_rate=0.0, group_rows=4)
    out = _run(masker, ids[:8], mask[:8])
    maskable = (mask[:8] == 1) & ~np.isin(ids[:8], special.ids)
    for g in range(2):
        rows, cols = np.nonzero(maskable[g * 4:(g + 1) * 4])  # row-major order
        kept = [(g * 4 + r, c, ids[g * 4 + r, c]) for r, c in zip(rows[:20], cols[:20])]
        assert [t for t in _targets(out) if g * 4 <= t[0] < (g + 1) * 4] == kept
    changed = sorted(zip(*np.nonzero(out["input_ids"] != ids[:8])))
    assert changed == [(r, c) for r, c, _ in _targets(out) if ids[r, c] != special.mask_id]
    with pytest.raises(TpulmError, match="group_rows must be positive"):
        Masker(1000, special.mask_id, special.ids, num_predictions=5, group_rows=0)


def test_shared_slots_give_the_same_loss(data):
    """The model and the loss see the same (token, logit) pairs whichever rows share slots."""
    import keras

    from tpulm.model.config import ModelConfig
    from tpulm.model.networks import build_model
    from tpulm.training.objective import MaskedLMLoss

    tok_dir, ids, mask = data
    special = special_tokens(str(tok_dir))
    keras.utils.set_random_seed(0)
    model = build_model(ModelConfig(vocab_size=1000, hidden_size=32, num_layers=1, num_heads=2,
                                    intermediate_size=64, max_position_embeddings=512,
                                    pad_token_id=special.pad_id))
    common = dict(vocab_size=1000, mask_id=special.mask_id, special_ids=special.ids)
    losses = []
    for rows in (1, 8):
        out = _run(Masker(num_predictions=max_predictions(MAX_LENGTH, 0.15, group_rows=rows),
                          group_rows=rows, **common), ids[:16], mask[:16])
        x = {k: out[k] for k in ("input_ids", "attention_mask", "masked_positions")}
        losses.append(float(MaskedLMLoss()(out["masked_ids"], model(x), out["masked_weights"])))
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-6)


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
