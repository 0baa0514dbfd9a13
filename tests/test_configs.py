"""Every config file tpulm ships loads and resolves: the model presets build a model config, the
pipeline configs resolve into their stages with every table's settings accepted."""

from __future__ import annotations

from importlib import resources

import pytest

from tpulm import config, pipeline
from tpulm.model import config as model

SHIPPED = sorted(p.name for p in (resources.files("tpulm") / "configs").iterdir()
                 if p.name.endswith(".toml"))


def test_the_expected_presets_ship():
    assert set(SHIPPED) >= {"tiny.toml", "small.toml", "base.toml", "large.toml", "demo.toml",
                            "reference.toml"}


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_config_loads(name):
    path = config.find_config(name.removesuffix(".toml"))
    tables = config.load_toml(path)
    if set(tables) == {"model"}:  # a model size preset
        cfg = config.resolve(model.ModelConfig, None, model.load_model_preset(path), path,
                             vocab_size=8000, pad_token_id=3)
        assert cfg.hidden_size % cfg.num_heads == 0
        return
    plan = pipeline.plan(tables, path)
    names = [stage.name for stage in plan.stages]
    core = [n for n in names if n in ("tokenizer", "data", "train", "export")]
    assert core == ["tokenizer", "data", "train", "export"]
    assert plan.prompts, f"{name} asks no fill-mask question"


def test_base_preset_is_roberta_base():
    cfg = config.resolve(model.ModelConfig, None, model.load_model_preset("base"), "base",
                         vocab_size=50265, pad_token_id=1)
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.intermediate_size,
            cfg.max_position_embeddings) == (12, 768, 12, 3072, 514)
