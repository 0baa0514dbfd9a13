"""Bad input is one line: every bad setting names itself and its range (Python API and CLI alike,
exit code 2), task files with missing or odd labels name the file and line, paths that cannot be
reached or written fail in seconds before any work, and an output symlink is followed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpulm import config, storage
from tpulm.data import inspect, tokenizer
from tpulm.data.preparation import PrepareConfig
from tpulm.errors import TpulmError
from tpulm.evaluate import tasks
from tpulm.evaluate.run import EvaluateConfig
from tpulm.training import preflight
from tpulm.training.config import TrainConfig

REPO = Path(__file__).resolve().parents[1]
UNREACHABLE = "gs://tpulm-no-such-bucket-for-tests/out"


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m tpulm ARGS`` in a real process, importing this tree."""
    environ = {**os.environ, "PYTHONPATH": str(REPO / "src"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "tpulm", *args], capture_output=True, text=True,
                          env=environ, timeout=120)


def assert_one_line_error(done: subprocess.CompletedProcess, *fragments: str) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("tpulm: error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


# ---------------------------------------------------------------------------------------------
# Settings


@pytest.mark.parametrize("value", [15, 1.5, 0.0, -0.1, float("nan")])
def test_mlm_probability_must_be_a_fraction(value):
    with pytest.raises(TpulmError, match=r"mlm_probability \(--mlm-probability\) must be in \(0, 1\]"):
        TrainConfig(train_data="x", mlm_probability=value)


def test_masking_rates_and_seed_are_checked_where_defined():
    with pytest.raises(TpulmError, match=r"mask_token_rate \(--mask-token-rate\) must be in \[0, 1\], got 80"):
        TrainConfig(mask_token_rate=80)
    with pytest.raises(TpulmError, match="must be at most 1, got 0.9 \\+ 0.2"):
        TrainConfig(mask_token_rate=0.9, random_token_rate=0.2)
    with pytest.raises(TpulmError, match=r"seed \(--seed\) must be at least 0, got -1"):
        TrainConfig(seed=-1)
    TrainConfig(mlm_probability=1.0, mask_token_rate=1.0, random_token_rate=0.0)  # the ends are valid


def test_counts_are_at_least_one_in_every_stage():
    with pytest.raises(TpulmError, match=r"shard_size \(--shard-size\) must be at least 1, got 0"):
        PrepareConfig(shard_size=0)
    with pytest.raises(TpulmError, match=r"batch_size \(--batch-size\) must be at least 1, got -3"):
        PrepareConfig(batch_size=-3)
    with pytest.raises(TpulmError, match=r"model_max_length \(--model-max-length\) must be at least 1"):
        tokenizer.TokenizerConfig(model_max_length=0)
    with pytest.raises(TpulmError, match=r"vocab_size \(--vocab-size\) 3 is too small"):
        tokenizer.TokenizerConfig(vocab_size=3)
    with pytest.raises(TpulmError, match=r"seeds \(--seeds\) must be at least 1, got 0"):
        EvaluateConfig(model="m", seeds=0)
    with pytest.raises(TpulmError, match=r"step \(--step\) must be at least 0, got -2"):
        EvaluateConfig(model="m", step=-2)
    with pytest.raises(TpulmError, match=r"decode \(--decode\) must be at least 0, got -1"):
        inspect.InspectConfig(path="d", decode=-1)


def test_check_helpers_reject_nan_and_skip_unset():
    class Settings:
        rate, count, unset = float("nan"), float("nan"), None

    with pytest.raises(TpulmError, match="must be in"):
        config.check_fraction(Settings(), "rate")
    with pytest.raises(TpulmError, match="must be at least 1, got nan"):
        config.check_at_least(Settings(), 1, "count")
    config.check_at_least(Settings(), 1, "unset")


@pytest.mark.parametrize("args, fragments", [
    (("train", "--mlm-probability", "15"), ("mlm_probability (--mlm-probability) must be in (0, 1]", "got 15")),
    (("train", "--mlm-probability", "1.5"), ("got 1.5",)),
    (("data", "inspect", ".", "--decode", "-1"), ("decode (--decode) must be at least 0, got -1",)),
])
def test_cli_bad_value_is_one_line_and_exit_2(args, fragments):
    assert_one_line_error(run_cli(*args), *fragments)


# ---------------------------------------------------------------------------------------------
# Task files


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def test_task_row_without_label_names_file_and_line(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [{"text": "a", "label": 0}, {"text": "b", "label": 1},
                                                   {"text": "c"}])
    valid = write_jsonl(tmp_path / "valid.jsonl", [{"text": "d", "label": 0}, {"text": "e", "label": 1}])
    with pytest.raises(TpulmError, match=rf"^{train} line 3 has no label \(field 'label'"):
        tasks.load_file_task(tasks.FileTask(train, valid))


def test_task_label_nan_in_csv_and_non_integer_class(tmp_path):
    train = tmp_path / "train.csv"
    train.write_text("text,label\na,1\nb,\n", encoding="utf-8")  # an empty cell: no label
    valid = write_jsonl(tmp_path / "valid.jsonl", [{"text": "d", "label": 0}, {"text": "e", "label": 1}])
    with pytest.raises(TpulmError, match=rf"^{train} line 3 has no label"):
        tasks.load_file_task(tasks.FileTask(str(train), valid))
    train_int = write_jsonl(tmp_path / "train.jsonl", [{"text": "a", "label": 0}, {"text": "b", "label": 1}])
    odd = write_jsonl(tmp_path / "odd.jsonl", [{"text": "d", "label": 0.0}, {"text": "e", "label": 1.5}])
    with pytest.raises(TpulmError, match=rf"^{odd} line 2: label 1.5 \(field 'label'\) is not an integer class"):
        tasks.load_file_task(tasks.FileTask(train_int, odd))
    whole = write_jsonl(tmp_path / "whole.jsonl", [{"text": "d", "label": 1.0}, {"text": "e", "label": 0.0}])
    task = tasks.load_file_task(tasks.FileTask(train_int, whole))  # 1.0 read from JSON is class 1
    assert task.kind == tasks.CLASSIFICATION and task.validation.labels.tolist() == [1, 0]


def test_empty_and_header_only_task_files_say_empty(tmp_path):
    valid = write_jsonl(tmp_path / "valid.jsonl", [{"text": "d", "label": 0}])
    empty = tmp_path / "empty.csv"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(TpulmError, match=rf"^task file {empty} is empty;"):
        tasks.load_file_task(tasks.FileTask(str(empty), valid))
    header = tmp_path / "header.tsv"
    header.write_text("text\tlabel\n", encoding="utf-8")
    with pytest.raises(TpulmError, match=rf"^task file {header} is empty \(a header and no rows\)"):
        tasks.load_file_task(tasks.FileTask(str(header), valid))


def test_cli_evaluate_row_without_label_is_one_line(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [{"text": "a", "label": 0}, {"text": "b"}])
    valid = write_jsonl(tmp_path / "valid.jsonl", [{"text": "d", "label": 0}])
    model = tmp_path / "model"
    model.mkdir()
    done = run_cli("evaluate", str(model), "--train-file", train, "--validation-file", valid)
    assert_one_line_error(done, f"{train} line 2 has no label")


# ---------------------------------------------------------------------------------------------
# Beam options


def test_unknown_beam_option_is_refused():
    pytest.importorskip("apache_beam")
    from tpulm.data import beam

    cfg = PrepareConfig(runner="DirectRunner", beam_options=("direct_num_worker=2",))
    with pytest.raises(TpulmError, match="^unknown --beam-option direct_num_worker"):
        beam.pipeline_options(cfg)
    known = PrepareConfig(runner="DirectRunner", beam_options=("direct_num_workers=2",))
    assert beam.pipeline_options(known).get_all_options()["direct_num_workers"] == 2


# ---------------------------------------------------------------------------------------------
# Paths: unreachable stores, read-only places, symlinks


def test_unreachable_bucket_fails_in_seconds_with_the_store_reason():
    start = time.monotonic()
    with pytest.raises(TpulmError) as caught:
        storage.check_reachable(UNREACHABLE, "--output", write=True)
    message = str(caught.value)
    assert message.startswith(f"--output {UNREACHABLE}") and "\n" not in message
    assert "cannot be reached:" in message or "does not exist" in message
    assert time.monotonic() - start < 30


def test_cli_prepare_to_unreachable_bucket_fails_before_tokenizing(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one line of text\n" * 50, encoding="utf-8")
    tok = tmp_path / "tok"
    tokenizer.run(tokenizer.TokenizerConfig(inputs=(str(corpus),), output=str(tok), vocab_size=40,
                                            unk_rate_samples=1))
    start = time.monotonic()
    done = run_cli("data", "prepare", "--tokenizer", str(tok), "--output", UNREACHABLE,
                   "--train-files", str(corpus), "--progress", "false",
                   env={"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "no-credentials.json")})
    assert time.monotonic() - start < 60
    assert_one_line_error(done, f"--output {UNREACHABLE}")


def test_cli_run_in_an_unreachable_work_dir_is_one_line_before_any_stage(tmp_path):
    start = time.monotonic()
    done = run_cli("run", "--work-dir", UNREACHABLE,
                   env={"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "no-credentials.json")})
    assert time.monotonic() - start < 60
    assert_one_line_error(done, f"--work-dir) {UNREACHABLE}")


def test_read_only_output_says_read_only(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes to read-only folders")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(TpulmError, match=r"--output .*/locked/tok is read-only"):
            storage.check_reachable(str(locked / "tok"), "--output", write=True)
    finally:
        locked.chmod(0o755)


def test_output_below_a_file_and_dangling_link_are_named(tmp_path):
    afile = tmp_path / "a-file"
    afile.write_text("x", encoding="utf-8")
    with pytest.raises(TpulmError, match="is a file, not a folder"):
        storage.check_reachable(str(afile / "out"), "--output", write=True)
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(TpulmError, match="is a symbolic link to .*nowhere, which does not exist"):
        storage.check_reachable(str(link), "--output", write=True)


def test_output_symlink_is_followed_and_stays_a_link(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a few words of text\nand some more words\n" * 20, encoding="utf-8")
    target = tmp_path / "real-tokenizer"
    target.mkdir()
    link = tmp_path / "tok"
    link.symlink_to(target, target_is_directory=True)
    cfg = tokenizer.TokenizerConfig(inputs=(str(corpus),), output=str(link), vocab_size=40,
                                    unk_rate_samples=1)
    tokenizer.run(cfg)
    assert link.is_symlink() and os.readlink(link) == str(target)
    # the tokenizer's files, and the record of what tpulm wrote (tpulm.ownership)
    assert sorted(p.name for p in target.iterdir()) == sorted([*tokenizer.FOLDER_FILES, storage.WRITTEN_RECORD])
    tokenizer.run(dataclass_replace(cfg, overwrite=True))  # replacing it keeps the link too
    assert link.is_symlink() and (target / tokenizer.TOKENIZER_FILE).exists()
    assert [p.name for p in tmp_path.iterdir() if storage.is_temporary(p.name)] == []


def dataclass_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)


# ---------------------------------------------------------------------------------------------
# A run dir of another model


def test_train_on_run_dir_of_another_model_names_the_difference(tmp_path):
    from tpulm.model.config import ModelConfig, load_model_preset

    tiny = config.from_mapping(ModelConfig, {**load_model_preset("tiny"), "vocab_size": 500,
                                             "pad_token_id": 3}, "tiny")
    (tmp_path / "config.toml").write_text(config.to_toml({"model": config.as_table(tiny)}),
                                          encoding="utf-8")
    with pytest.raises(TpulmError, match=rf"^{tmp_path} holds another model than --model small: "
                                         r"hidden_size \d+ \(--model small: \d+\)"):
        preflight.resolve_model(str(tmp_path), "small", {}, 500, 3)
    assert preflight.resolve_model(str(tmp_path), "tiny", {}, 500, 3) == tiny
    # The default preset stands for "not given": rerunning `tpulm train --run-dir` resumes.
    assert preflight.resolve_model(str(tmp_path), TrainConfig.model, {}, 500, 3) == tiny
