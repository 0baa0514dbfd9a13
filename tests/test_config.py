"""The layered settings machinery: defaults < TOML < flags, strict keys and types."""

from __future__ import annotations

import argparse
import dataclasses
import tomllib

import pytest

from tpulm import config
from tpulm.errors import TpulmError


@dataclasses.dataclass(frozen=True)
class Example:
    vocab_size: int = config.setting(8000, "vocabulary size")
    rate: float = config.setting(0.15, "a rate")
    name: str = config.setting("unigram", "model", choices=("unigram", "bpe"))
    files: tuple[str, ...] = config.setting((), "inputs")
    fast: bool = config.setting(False, "go fast")
    seed: int | None = config.setting(None, "seed")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, Example)
    return parser.parse_args(argv)


def test_layers_defaults_then_table_then_flags():
    table = {"vocab_size": 1000, "rate": 1, "files": ["a.txt"]}
    resolved = config.resolve(Example, parse(["--vocab-size", "50", "--fast"]), table, "x.toml")
    assert resolved == Example(vocab_size=50, rate=1.0, files=("a.txt",), fast=True)
    assert isinstance(resolved.rate, float)


def test_flags_parse_lists_bools_and_choices():
    args = parse(["--files", "a", "b", "--fast", "false", "--name", "bpe", "--seed", "3"])
    assert config.resolve(Example, args) == Example(files=("a", "b"), name="bpe", seed=3)
    with pytest.raises(SystemExit):
        parse(["--name", "wordpiece"])


def test_unknown_key_names_the_key_and_file():
    with pytest.raises(TpulmError, match=r"vocab_sise.*run\.toml"):
        config.from_mapping(Example, {"vocab_sise": 3}, "[tokenizer] of run.toml")


@pytest.mark.parametrize("key,value", [("vocab_size", "big"), ("vocab_size", 1.5), ("fast", 1),
                                       ("files", 3), ("rate", float("nan"))])
def test_wrong_type_is_an_error(key, value):
    with pytest.raises(TpulmError, match=key):
        config.from_mapping(Example, {key: value}, "t.toml")


def test_toml_round_trip(tmp_path):
    original = Example(vocab_size=7, rate=0.5, name="bpe", files=("x \"q\"", "y\\z"), fast=True)
    text = config.to_toml({"example": config.as_table(original)})
    path = tmp_path / "c.toml"
    path.write_text(text)
    loaded = config.load_toml(str(path))
    assert config.from_mapping(Example, loaded["example"], str(path)) == original
    assert tomllib.loads(text) == loaded


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(TpulmError, match="does not exist"):
        config.load_toml(str(tmp_path / "nope.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("[a\n")
    with pytest.raises(TpulmError, match="not valid TOML"):
        config.load_toml(str(bad))


def _stage_configs():
    """(config class, settings one of its checks refuses) for every stage's settings."""
    from tpulm.data.preparation import PrepareConfig
    from tpulm.data.tokenizer import TokenizerConfig
    from tpulm.evaluate.run import EvaluateConfig
    from tpulm.fill_mask import FillMaskConfig
    from tpulm.model.config import ModelConfig
    from tpulm.pipeline import RunConfig
    from tpulm.training.config import TrainConfig

    return [(RunConfig, {"corpus": "files"}), (TokenizerConfig, {"vocab_size": 3}),
            (PrepareConfig, {"max_length": 1}), (ModelConfig, {"vocab_size": 4, "pad_token_id": 7}),
            (ModelConfig, {"vocab_size": 8, "architecture": "modernbert", "activation": "relu"}),
            (TrainConfig, {"batch_size": 0}), (EvaluateConfig, {"seeds": 0}),
            (FillMaskConfig, {"top_k": 0})]


@pytest.mark.parametrize("cls,bad", _stage_configs(), ids=lambda x: getattr(x, "__name__", ""))
def test_every_stage_config_refuses_bad_settings_with_a_tpulm_error(cls, bad):
    with pytest.raises(TpulmError) as built:  # also when built directly, not from a table
        cls(**bad)
    assert not isinstance(built.value, ValueError)
    with pytest.raises(TpulmError, match=r"^invalid settings in \[x\] of run\.toml: ") as loaded:
        config.from_mapping(cls, bad, "[x] of run.toml")
    assert str(built.value) in str(loaded.value) and "\n" not in str(loaded.value)


def test_choices_are_listed_in_the_flags_help():
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, Example)
    assert "--name {unigram,bpe}" in parser.format_help()
