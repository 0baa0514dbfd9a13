"""``tpulm train --init-from``: a new run starts from trained weights at step 0 with a fresh
optimizer, at a longer sequence length for RoPE models (ModernBERT's context extension); RoBERTa's
learned position table is not extended."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.training import blocks, small_corpus, wikitext_lines, write_shards

from tpulm import rundir
from tpulm.errors import TpulmError
from tpulm.model import weights
from tpulm.training import run
from tpulm.training.config import TrainConfig

QUICK = dict(batch_size=4, learning_rate=1e-3, progress=False, peak_tflops=1.0,
             jit_compile="false", log_every=1, eval_every=100)


@pytest.fixture(scope="module")
def data(tmp_path_factory, wikitext_dir):
    """Shards of 32 tokens (phase 1), and of 64 tokens from the same tokenizer (phase 2)."""
    base = tmp_path_factory.mktemp("init_from")
    corpus = small_corpus(base, wikitext_dir)
    ids, mask = blocks(corpus["tokenizer"], wikitext_lines(wikitext_dir, "valid", 120), 64)
    write_shards(base / "train64", ids, mask, 2)
    return {**corpus, "train64": base / "train64"}


def _latest_weights(run_dir) -> dict[str, np.ndarray]:
    return weights.read(rundir.latest_checkpoint(str(run_dir))[1] + "/" + rundir.MODEL_WEIGHTS)


def test_modernbert_extends_its_context_from_trained_weights(tmp_path, data, caplog):
    caplog.set_level("INFO")
    tok = str(data["tokenizer"])
    first = tmp_path / "phase1"
    run(TrainConfig(model="modernbert-tiny", run_dir=str(first), tokenizer=tok,
                    train_data=str(data["train"]), max_steps=3, **QUICK),
        {"max_position_embeddings": 32})
    trained = _latest_weights(first)
    second = tmp_path / "phase2"
    # zero steps of training would not save; one step with a learning rate of ~0 (warmup) shows
    # the copy: the step-0 weights are the trained ones
    result = run(TrainConfig(run_dir=str(second), tokenizer=tok, train_data=str(data["train64"]),
                             init_from=str(first), max_steps=1, warmup=1, attention="auto",
                             **{**QUICK, "learning_rate": 1e-12}),
                 {"global_rope_theta": 20000.0})
    assert result.steps_this_session == 1 and result.step == 1  # from step 0, not 3
    copied = _latest_weights(second)
    assert copied.keys() == trained.keys()
    name = "modernbert_mlm/layer_1/wqkv/kernel"
    np.testing.assert_allclose(copied[name], trained[name], atol=1e-9, rtol=0)
    optimizer = weights.read(rundir.latest_checkpoint(str(second))[1] + "/"
                             + rundir.OPTIMIZER_WEIGHTS)
    iterations = [v for k, v in optimizer.items() if k.endswith("iteration")]
    assert iterations and all(int(v) == 1 for v in iterations)  # a fresh optimizer: one update
    saved = (second / rundir.CONFIG_NAME).read_text()
    assert "max_position_embeddings = 64" in saved and "global_rope_theta = 20000.0" in saved
    assert "init_from" in saved
    lines = [json.loads(x) for x in (second / rundir.METRICS_NAME).read_text().splitlines()]
    assert [x["step"] for x in lines if x["split"] == "train"] == [1]
    assert any("extending the context" in r.getMessage() for r in caplog.records)


def test_roberta_is_not_extended_past_its_position_table(tmp_path, data):
    first = tmp_path / "roberta"
    common = dict(tokenizer=str(data["tokenizer"]), **QUICK)
    run(TrainConfig(model="tiny", run_dir=str(first), train_data=str(data["train"]), max_steps=1,
                    **common), {"max_position_embeddings": 36})  # 36 - pad (3) - 1 = 32 tokens
    with pytest.raises(TpulmError, match="RoBERTa cannot be extended"):
        run(TrainConfig(run_dir=str(tmp_path / "longer"), train_data=str(data["train64"]),
                        init_from=str(first), max_steps=1, **common))
    with pytest.raises(TpulmError, match="num_layers differs from --init-from"):
        run(TrainConfig(run_dir=str(tmp_path / "wider"), train_data=str(data["train"]),
                        init_from=str(first), max_steps=1, **common), {"num_layers": 3})
