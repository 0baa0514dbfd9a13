"""`train.push_to_hub`: offline or without a token, training stops before any work is done."""

from __future__ import annotations

import pytest

from tpulm import training
from tpulm.errors import TpulmError


def test_push_to_hub_offline_fails_before_training(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run_dir = tmp_path / "run"
    cfg = training.TrainConfig(train_data=str(tmp_path / "no-shards"), run_dir=str(run_dir),
                            model="tiny", push_to_hub="someone/my-roberta")
    with pytest.raises(TpulmError, match="cannot push to someone/my-roberta: HF_HUB_OFFLINE"):
        training.run(cfg)
    assert not run_dir.exists()  # nothing started


def test_push_to_hub_rejects_a_malformed_repo_id(tmp_path):
    cfg = training.TrainConfig(train_data=str(tmp_path), run_dir=str(tmp_path / "run"),
                            model="tiny", push_to_hub="not a repo id!")
    with pytest.raises(TpulmError, match="not a valid Hub repo id"):
        training.run(cfg)
