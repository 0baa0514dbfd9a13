"""Native fill-mask: model sources, several masks, stdin, errors (no torch needed)."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
from support.models import make_run_dir, train_reference_tokenizer, wikitext_lines

from tpulm import fill_mask, rundir
from tpulm.cli import main
from tpulm.errors import TpulmError
from tpulm.model.config import load_model_preset


@pytest.fixture(scope="module")
def run_dir(wikitext_dir, tmp_path_factory):
    tok = train_reference_tokenizer(wikitext_lines(wikitext_dir), tmp_path_factory.mktemp("tok"))
    folder = tmp_path_factory.mktemp("runs") / "run"
    make_run_dir(folder, tok, load_model_preset("tiny"), steps=(3, 8))
    return folder


@pytest.fixture(scope="module")
def predictor(run_dir):
    return fill_mask.load_predictor(str(run_dir))


def test_one_mask_result_has_pipeline_fields(predictor):
    [result] = fill_mask.fill_mask(predictor, ["The film was released in [MASK] ."], top_k=7)
    assert len(result) == 7
    scores = [r["score"] for r in result]
    assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1
    for r in result:
        assert set(r) == {"score", "token", "token_str", "sequence"}
        assert r["token_str"] == predictor.tokenizer.decode([r["token"]])
        assert "[MASK]" not in r["sequence"] and "[CLS]" not in r["sequence"]


def test_scores_are_the_softmax_of_the_full_logits(predictor):
    text = "The film was released in [MASK] ."
    ids = predictor.tokenizer.encode(text).ids
    batch = {"input_ids": np.array([ids], np.int32), "attention_mask": np.ones((1, len(ids)), np.int32)}
    logits = np.asarray(predictor.model(batch, training=False))[0, ids.index(predictor.mask_id)]
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    [result] = fill_mask.fill_mask(predictor, [text], top_k=3)
    assert [r["token"] for r in result] == list(np.argsort(-probs)[:3])
    np.testing.assert_allclose([r["score"] for r in result], np.sort(probs)[::-1][:3], rtol=1e-5)


def test_several_masks_and_batches_of_different_lengths(predictor):
    texts = ["[MASK] was born in [MASK] .", "A [MASK] .", "It is a long sentence about the "
             "history of the city and its [MASK] in the nineteenth century ."]
    results = fill_mask.fill_mask(predictor, texts, top_k=2)
    assert len(results[0]) == 2 and all(len(row) == 2 for row in results[0])
    # With several masks each is filled on its own; the other stays, special tokens kept.
    assert results[0][0][0]["sequence"].count("[MASK]") == 1
    alone = [fill_mask.fill_mask(predictor, [t], top_k=2)[0] for t in texts]
    flat = [(a, b) for r, s in zip(results, alone)  # padding in a batch changes nothing
            for a, b in zip(*(x if isinstance(x[0], list) else [x] for x in (r, s)))]
    for got, want in flat:
        assert [(g["token"], g["sequence"]) for g in got] == [(w["token"], w["sequence"]) for w in want]
        np.testing.assert_allclose([g["score"] for g in got], [w["score"] for w in want], rtol=1e-5)


def test_no_mask_token_is_a_clear_error(predictor):
    with pytest.raises(TpulmError, match=r"no mask token: write \[MASK\] \(or \{mask\}\)"):
        fill_mask.fill_mask(predictor, ["no mask here <mask>"])


def test_placeholder_becomes_the_tokenizers_mask_token(predictor):
    """Prompts written once with {mask} answer with any tokenizer (here Unigram's [MASK])."""
    written = ["The film was released in {mask} .", "{mask} was born in {mask} ."]
    assert [predictor.prompt(t) for t in written] == [
        "The film was released in [MASK] .", "[MASK] was born in [MASK] ."]
    assert fill_mask.fill_mask(predictor, written, top_k=3) == fill_mask.fill_mask(
        predictor, [predictor.prompt(t) for t in written], top_k=3)


def test_run_dir_step_checkpoint_folder_agree(run_dir, predictor):
    text = ["The [MASK] of the river ."]
    latest = fill_mask.fill_mask(predictor, text)
    ckpt8 = fill_mask.load_predictor(rundir.checkpoint_dir(str(run_dir), 8))
    assert fill_mask.fill_mask(ckpt8, text) == latest
    older = fill_mask.load_predictor(str(run_dir), step=3)
    assert fill_mask.fill_mask(older, text) != latest
    with pytest.raises(TpulmError, match="neither a run dir"):
        fill_mask.load_predictor(str(run_dir / "tokenizer"))


def test_cli_reads_stdin_and_prints(run_dir, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("The [MASK] of the river .\n\nA [MASK] .\n"))
    assert main(["fill-mask", str(run_dir), "--top-k", "3", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [len(json.loads(line)) for line in lines] == [3, 3]
    assert main(["fill-mask", str(run_dir), "A [MASK] .", "--top-k", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "A [MASK] ." and len(out) == 3


def test_cli_error_is_one_line(run_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "tpulm", "fill-mask", str(run_dir), "no mask"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("tpulm: error: text 'no mask' has no")
    assert "Traceback" not in proc.stderr
