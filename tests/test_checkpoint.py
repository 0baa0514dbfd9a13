"""Resume picks the newest complete checkpoint: incomplete newer ones are named, set aside, never
silently trained over; a run dir of only broken checkpoints stops with an error naming them."""

from __future__ import annotations

import shutil

import pytest
from support.training import small_corpus

from tpulm import rundir
from tpulm.training import checkpoint
from tpulm.errors import TpulmError
from tpulm.model import weights
from tpulm.training import run
from tpulm.training.config import TrainConfig

QUICK = dict(model="tiny", batch_size=8, learning_rate=1e-3, progress=False, peak_tflops=1.0,
             checkpoint_every=2, keep_checkpoints=5, log_every=2, eval_every=100,
             jit_compile="false")  # checkpoint choice, not XLA: half the CPU time


@pytest.fixture(scope="module")
def trained(tmp_path_factory, wikitext_dir):
    """A run dir with checkpoints at steps 2, 4 and 6, and its corpus."""
    base = tmp_path_factory.mktemp("ckpt")
    corpus = small_corpus(base / "data", wikitext_dir)
    run_dir = base / "run"
    run(_config(corpus, run_dir, 6))
    assert [s for s, _ in rundir.list_checkpoints(str(run_dir))] == [2, 4, 6]
    return corpus, run_dir


def _config(corpus, run_dir, steps: int) -> TrainConfig:
    return TrainConfig(train_data=str(corpus["train"]), tokenizer=str(corpus["tokenizer"]),
                       run_dir=str(run_dir), max_steps=steps, **QUICK)


def _copy(trained, tmp_path):
    corpus, run_dir = trained
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    return corpus, copy


def _newest(run_dir, name: str):
    return rundir.checkpoint_dir(str(run_dir), 6) + "/" + name


@pytest.mark.parametrize("damage", ["state_missing", "model_truncated"])
def test_resume_skips_an_incomplete_newest_checkpoint(trained, tmp_path, caplog, damage):
    corpus, run_dir = _copy(trained, tmp_path)
    if damage == "state_missing":
        (tmp_path / _newest(run_dir, rundir.STATE_NAME)).unlink()
        reason = "state.json is missing"
    else:
        path = tmp_path / _newest(run_dir, rundir.MODEL_WEIGHTS)
        path.write_bytes(path.read_bytes()[:1000])
        reason = "model.safetensors is truncated"
    caplog.set_level("INFO")
    result = run(_config(corpus, run_dir, 8))
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert f"skipping incomplete checkpoint {rundir.checkpoint_dir(str(run_dir), 6)} ({reason}" in messages
    assert "steps 4 -> 8" in messages and result.steps_this_session == 4  # not from step 0
    assert [s for s, _ in rundir.list_checkpoints(str(run_dir))] == [2, 4, 6, 8]
    assert (run_dir / "checkpoints" / "ckpt-000000006.incomplete").is_dir()  # kept, not deleted
    assert checkpoint.problem(rundir.checkpoint_dir(str(run_dir), 6), 6) is None  # redone


def test_no_complete_checkpoint_is_an_error_naming_them(trained, tmp_path):
    corpus, run_dir = _copy(trained, tmp_path)
    for step in (2, 4, 6):
        (tmp_path / rundir.checkpoint_dir(str(run_dir), step) / rundir.OPTIMIZER_WEIGHTS).write_bytes(b"")
    with pytest.raises(TpulmError, match=r"has no complete checkpoint: .*ckpt-000000006 "
                                         r"\(optimizer.safetensors is truncated .*ckpt-000000002"):
        run(_config(corpus, run_dir, 8))
    assert [s for s, _ in rundir.list_checkpoints(str(run_dir))] == [2, 4, 6]  # nothing touched


def test_truncated_weights_file_is_an_error_naming_it(trained, tmp_path):
    _, run_dir = _copy(trained, tmp_path)
    path = tmp_path / _newest(run_dir, rundir.MODEL_WEIGHTS)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(TpulmError, match=f"weights file {path} is truncated"):
        weights.read(str(path))
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    assert weights.file_problem(str(path)) == "not a safetensors file (unreadable header)"


def test_last_good_checkpoint_had_a_finite_not_diverging_loss(trained, tmp_path):
    import json

    _, run_dir = _copy(trained, tmp_path)
    metrics = run_dir / rundir.METRICS_NAME
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]

    def set_loss(step: int, loss: float) -> None:
        for line in lines:
            if line["split"] == "train" and line["step"] == step:
                line["loss"] = loss
        metrics.write_text("".join(json.dumps(x) + "\n" for x in lines))

    newest = checkpoint.last_good(str(run_dir), before=7)
    assert newest[0] == rundir.checkpoint_dir(str(run_dir), 6)
    set_loss(6, 4.4e13)  # diverging, though finite
    assert checkpoint.last_good(str(run_dir), before=7)[0] == rundir.checkpoint_dir(str(run_dir), 4)
    set_loss(4, float("nan"))
    assert checkpoint.last_good(str(run_dir), before=7)[0] == rundir.checkpoint_dir(str(run_dir), 2)
    assert checkpoint.last_good(str(run_dir), before=2) is None
