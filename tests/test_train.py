"""Training end to end on real shards: CLI + config file, run dir contract, import, errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from support.training import (
    blocks,
    make_tokenizer,
    small_corpus,
    wikitext_lines,
    write_shards,
)

from tpulm import config, report, rundir
from tpulm.cli import main
from tpulm.data import shards, tokenizer
from tpulm.errors import TpulmError
from tpulm.training import run
from tpulm.training.config import TrainConfig, fit_calls, steps_per_execution

# No XLA in the quick runs: half the CPU time (compilation dominates a few tiny steps). The CLI
# test below and tests/test_resume.py train with XLA.
QUICK = dict(model="tiny", batch_size=8, learning_rate=1e-3, progress=False, peak_tflops=1.0,
             jit_compile="false")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, wikitext_dir):
    return small_corpus(tmp_path_factory.mktemp("corpus"), wikitext_dir)


def _metrics(run_dir) -> list[dict]:
    return [json.loads(x) for x in (run_dir / rundir.METRICS_NAME).read_text().splitlines()]


def test_cli_trains_from_a_config_file_and_writes_the_run_dir(tmp_path, corpus, capsys, caplog):
    from tpulm.model.config import ModelConfig
    from tpulm.model.networks import build_model
    from tpulm.model.weights import load

    caplog.set_level("INFO")
    run_dir = tmp_path / "run"
    cfg_file = tmp_path / "train.toml"
    cfg_file.write_text(
        f'[model]\nhidden_size = 32\n\n[train]\nmodel = "tiny"\ntrain_data = "{corpus["train"]}"\n'
        f'eval_data = "{corpus["valid"]}"\ntokenizer = "{corpus["tokenizer"]}"\nmax_steps = 40\n'
        "batch_size = 4\nlearning_rate = 0.002\ncheckpoint_every = 10\nkeep_checkpoints = 2\n"
        "eval_every = 20\nlog_every = 5\nprogress = false\ngradient_accumulation = 2\n"
    )
    code = main(["train", "--config", str(cfg_file), "--run-dir", str(run_dir), "--batch-size", "8",
                 "--peak-tflops", "1", "--jit-compile", "true"])
    assert code == 0
    out = capsys.readouterr().out
    assert any("XLA on" in r.getMessage() for r in caplog.records)
    assert "steps        40 (40 this run)" in out and "tokens       20,480" in out  # 40 x 2 x 8 x 32
    saved = config.load_toml(str(run_dir / rundir.CONFIG_NAME))
    assert saved["train"]["batch_size"] == 8 and saved["model"]["hidden_size"] == 32
    assert [s for s, _ in rundir.list_checkpoints(str(run_dir))] == [30, 40]
    state = json.loads((run_dir / "checkpoints/ckpt-000000040/state.json").read_text())
    assert state["step"] == 40 and state["data_position"] == 80 and state["tokens"] == 20480
    assert tokenizer.fingerprint(str(run_dir / "tokenizer")) == tokenizer.fingerprint(str(corpus["tokenizer"]))
    model = build_model(config.from_mapping(ModelConfig, saved["model"], "config.toml"))
    load(model.weights, str(run_dir / "checkpoints/ckpt-000000040/model.safetensors"))
    lines = _metrics(run_dir)
    train = [x for x in lines if x["split"] == "train"]
    evals = [x for x in lines if x["split"] == "eval"]
    assert [x["step"] for x in train] == list(range(5, 45, 5))
    assert [x["step"] for x in evals] == [20, 40]
    assert set(train[0]) == {"split", "step", "time", "tokens", "loss", "accuracy", "learning_rate", "tokens_per_second"}
    assert set(evals[0]) == {"split", "step", "time", "tokens", "loss", "accuracy", "perplexity"}
    assert math.isclose(evals[-1]["perplexity"], math.exp(evals[-1]["loss"]), rel_tol=1e-6)
    assert evals[-1]["loss"] < math.log(500) - 0.5  # learnt more than the uniform guess
    assert train[-1]["learning_rate"] == pytest.approx(0.002 / 38)  # last of 40 steps, 2 warmup
    assert {p.name for p in (run_dir / "tensorboard").iterdir()} == {"train", "eval"}


def test_training_starts_from_imported_weights(tmp_path, corpus):
    """A run dir holding only config.toml, tokenizer/ and ckpt-000000000/model.safetensors."""
    common = dict(train_data=str(corpus["train"]), eval_data=str(corpus["valid"]), **QUICK)
    trained = run(TrainConfig(run_dir=str(tmp_path / "a"), tokenizer=str(corpus["tokenizer"]),
                              max_steps=30, log_every=30, **common))
    imported = tmp_path / "imported"
    (imported / "checkpoints/ckpt-000000000").mkdir(parents=True)
    saved = config.load_toml(str(tmp_path / "a" / rundir.CONFIG_NAME))
    (imported / rundir.CONFIG_NAME).write_text(config.to_toml({"model": saved["model"]}))
    (imported / "tokenizer").mkdir()
    for f in (tmp_path / "a/tokenizer").iterdir():
        (imported / "tokenizer" / f.name).write_bytes(f.read_bytes())
    (imported / "checkpoints/ckpt-000000000/model.safetensors").write_bytes(
        (tmp_path / "a/checkpoints/ckpt-000000030/model.safetensors").read_bytes()
    )
    result = run(TrainConfig(run_dir=str(imported), max_steps=2, log_every=1, **common))
    assert result.step == 2 and result.steps_this_session == 2
    first = [x for x in _metrics(imported) if x["split"] == "train"][0]
    assert first["step"] == 1 and first["learning_rate"] == pytest.approx(1e-3)  # fresh schedule
    # The imported weights start where run "a" ended, far below the untrained loss.
    assert first["loss"] < trained.eval["loss"] + 0.3 < math.log(500)


def test_nan_loss_stops_naming_the_step_and_last_checkpoint(tmp_path, corpus):
    from safetensors.numpy import load_file, save_file

    common = dict(train_data=str(corpus["train"]), tokenizer=str(corpus["tokenizer"]), **QUICK)
    run(TrainConfig(run_dir=str(tmp_path / "run"), max_steps=4, checkpoint_every=4, **common))
    ckpt = tmp_path / "run/checkpoints/ckpt-000000004/model.safetensors"
    arrays = load_file(str(ckpt))
    gamma = next(k for k in arrays if k.endswith("layer_norm/gamma"))
    arrays[gamma] = np.full_like(arrays[gamma], np.nan)  # a poisoned weight
    save_file(arrays, str(ckpt))
    with pytest.raises(TpulmError, match=r"NaN/Inf at step 5; last good checkpoint: .*ckpt-000000004"):
        run(TrainConfig(run_dir=str(tmp_path / "run"), max_steps=8, log_every=1, **common))


def test_shards_that_do_not_fit_the_model_or_tokenizer_are_refused(tmp_path, corpus, wikitext_dir):
    lines = wikitext_lines(wikitext_dir, "test", 30)
    long_ids, long_mask = blocks(corpus["tokenizer"], lines, 140)  # tiny takes 128 positions
    write_shards(tmp_path / "long", long_ids, long_mask, 1)
    common = dict(tokenizer=str(corpus["tokenizer"]), max_steps=1, **QUICK)
    with pytest.raises(TpulmError, match="sequences of 140 tokens but the model takes at most 128"):
        run(TrainConfig(run_dir=str(tmp_path / "r1"), train_data=str(tmp_path / "long"), **common))
    small_tok = make_tokenizer(tmp_path / "small_tok", lines * 3, vocab_size=100)
    with pytest.raises(TpulmError, match="holds token id .* but the vocabulary has 100"):
        run(TrainConfig(run_dir=str(tmp_path / "r2"), train_data=str(corpus["train"]),
                        **{**common, "tokenizer": str(small_tok)}))
    manifest = shards.Manifest(tokenizer_fingerprint="0" * 64, vocab_size=500, max_length=32,
                               shards=tuple(shards.ShardInfo(p.name, 1, 1) for p in sorted(corpus["train"].glob("*.tfrecord"))))
    marked = tmp_path / "marked"
    marked.mkdir()
    for p in corpus["train"].glob("*.tfrecord"):
        (marked / p.name).write_bytes(p.read_bytes())
    shards.write_manifest(str(marked), manifest)
    with pytest.raises(TpulmError, match="tokenized with another tokenizer"):
        run(TrainConfig(run_dir=str(tmp_path / "r3"), train_data=str(marked), **common))
    with pytest.raises(TpulmError, match="no tokenizer"):
        run(TrainConfig(run_dir=str(tmp_path / "r4"), train_data=str(corpus["train"]), model="tiny"))


def test_fit_calls_align_segments_on_step_zero():
    assert fit_calls(0, 25, 10) == [(0, 10, 3)]
    assert fit_calls(10, 25, 10) == [(10, 10, 2)]
    assert fit_calls(12, 25, 10) == [(12, 8, 1), (20, 10, 1)]
    assert fit_calls(25, 25, 10) == []
    cfg = TrainConfig()
    assert steps_per_execution(cfg, fit_calls(0, 25, 10), 25, 1) == 5  # divides 10 and 25
    assert steps_per_execution(cfg, fit_calls(0, 3000, 100), 3000, 1) == 25
    with pytest.raises(TpulmError, match="batch_size must be at least 1"):
        TrainConfig(batch_size=0)


def test_trains_on_shards_from_tpulm_prepare(tmp_path, corpus, wikitext_dir):
    """Shards with a manifest (tpulm data prepare): fingerprint checked, counts from the manifest."""
    from tpulm.data import prepare

    text = tmp_path / "train.txt"
    text.write_text("\n".join(wikitext_lines(wikitext_dir, "valid", 150)), encoding="utf-8")
    valid = tmp_path / "valid.txt"
    valid.write_text("\n".join(wikitext_lines(wikitext_dir, "test", 40)), encoding="utf-8")
    prepare.run(prepare.PrepareConfig(
        tokenizer=str(corpus["tokenizer"]), output=str(tmp_path / "data"), train_files=(str(text),),
        validation_files=(str(valid),), max_length=32, shard_size=40, progress=False,
    ))
    manifest = shards.read_manifest(str(tmp_path / "data/train"))
    assert manifest is not None and manifest.max_length == 32
    result = run(TrainConfig(run_dir=str(tmp_path / "run"), train_data=str(tmp_path / "data/train"),
                             eval_data=str(tmp_path / "data/validation"),
                             tokenizer=str(corpus["tokenizer"]), epochs=1, **QUICK))
    assert result.step == manifest.records // 8  # one epoch of full batches
    assert result.eval is not None and math.isfinite(result.eval["loss"])


def test_a_process_that_is_not_the_chief_writes_nothing_shared(tmp_path, corpus):
    import dataclasses

    from tpulm.training import loop, setup

    run_dir = tmp_path / "run"
    cfg = TrainConfig(train_data=str(corpus["train"]), eval_data=str(corpus["valid"]),
                      tokenizer=str(corpus["tokenizer"]), run_dir=str(run_dir), max_steps=4,
                      checkpoint_every=2, eval_every=2, log_every=1, **QUICK)
    prepared = setup.prepare(cfg, {})
    assert prepared.writer  # one process: the chief
    # As process 1 of a multi-host run sees itself: it builds, restores and trains like the chief.
    result = loop.Trainer(dataclasses.replace(prepared, writer=False)).fit()
    assert result.step == 4 and result.eval is not None  # it trained and evaluated
    assert not run_dir.exists() or not any(run_dir.iterdir())  # but wrote nothing shared


def test_a_corrupt_shard_during_training_is_named(tmp_path, corpus):
    import shutil

    train = tmp_path / "train"
    shutil.copytree(corpus["train"], train)
    last = sorted(train.iterdir())[-1]  # preflight reads the first shard; this one only training
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 2])
    with pytest.raises(TpulmError, match=rf"{last} is corrupt or truncated \(.*tpulm data inspect"):
        run(TrainConfig(run_dir=str(tmp_path / "run"), train_data=str(train),
                        tokenizer=str(corpus["tokenizer"]), max_steps=40, **QUICK))


def test_hooks_run_when_due_in_the_order_added_and_all_at_the_last_step():
    from tpulm.training.hooks import Hooks

    ran = []
    hooks = Hooks(last_step=10)
    hooks.add("train line", lambda step, logs: ran.append(("line", step, logs["loss"])), every=2)
    hooks.add("checkpoint", lambda step, logs: ran.append(("save", step)), every=4)
    for step in (2, 3, 4, 6, 8, 10):
        hooks.run(step, {"loss": step / 10})
    assert ran == [("line", 2, 0.2), ("line", 4, 0.4), ("save", 4), ("line", 6, 0.6),
                   ("line", 8, 0.8), ("save", 8), ("line", 10, 1.0), ("save", 10)]


def test_the_training_model_is_built_and_compiled_without_data_or_run_dir(tmp_path, monkeypatch):
    """What `tpulm plan` lowers: the model, optimizer, loss and metrics of `tpulm train`."""
    import keras

    from tpulm.model.config import ModelConfig, load_model_preset
    from tpulm.training import objective, process, setup, strategies

    monkeypatch.chdir(tmp_path)
    model_cfg = config.resolve(ModelConfig, table=load_model_preset("tiny"), vocab_size=64)
    cfg = TrainConfig(model="tiny", precision="mixed_float16", gradient_accumulation=2,
                      jit_compile="false", max_steps=100)
    process.set_precision(cfg.precision)
    try:
        local = strategies.local()
        model, optimizer, lr = setup.build_for_training(cfg, model_cfg, local, total_steps=100)
        assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)  # fp16: loss scaling
        assert optimizer.inner_optimizer.gradient_accumulation_steps == 2
        assert optimizer.built and lr.at(99) < lr.at(4)  # warmup 5 steps, then decay
        assert setup.compile_for_training(model, optimizer, cfg, local, steps_per_execution=4) is False
        assert isinstance(model.loss, objective.MaskedLMLoss) and model.steps_per_execution == 4
    finally:
        process.set_precision("fp32")
    assert not any(tmp_path.iterdir())  # nothing written


def test_rerunning_a_finished_run_appends_no_duplicate_eval_line(tmp_path, corpus):
    common = dict(train_data=str(corpus["train"]), eval_data=str(corpus["valid"]),
                  tokenizer=str(corpus["tokenizer"]), run_dir=str(tmp_path / "run"), max_steps=2,
                  checkpoint_every=2, eval_every=2, **QUICK)
    run(TrainConfig(**common))
    before = (tmp_path / "run" / rundir.METRICS_NAME).read_text()
    assert [x["split"] for x in _metrics(tmp_path / "run")].count("eval") == 1
    again = run(TrainConfig(**common))  # complete: reports its final state, trains nothing
    assert again.eval is not None  # the final evaluation is still reported ...
    assert (tmp_path / "run" / rundir.METRICS_NAME).read_text() == before  # ... not logged twice


def test_an_existing_run_says_complete_or_continues_as_recorded(tmp_path, corpus, caplog):
    """`tpulm.training.run` (which `tpulm train` calls) on a finished run trains nothing,
    writes nothing and reports the run as it is; continuing with another batch size says so
    and counts the tokens each part trained."""
    caplog.set_level("INFO")
    run_dir = tmp_path / "run"
    paths = dict(train_data=str(corpus["train"]), eval_data=str(corpus["valid"]),
                 tokenizer=str(corpus["tokenizer"]), run_dir=str(run_dir), log_every=2,
                 eval_every=4, checkpoint_every=4)
    first = run(TrainConfig(**QUICK, **paths, max_steps=4))
    # The summary's tokens/s is the report's mean, to the bit (one session).
    assert report.summarize(_metrics(run_dir)).tokens_per_second == first.tokens_per_second
    files = {name: (run_dir / name).read_text()
             for name in (rundir.CONFIG_NAME, rundir.METRICS_NAME)}
    shorter = run(TrainConfig(**{**QUICK, "batch_size": 16}, **paths, max_steps=2))
    assert (shorter.step, shorter.steps_this_session, shorter.tokens) == (4, 0, 4 * 8 * 32)
    assert shorter.eval == first.eval  # as recorded: no second evaluation, no line appended
    assert {name: (run_dir / name).read_text() for name in files} == files
    said = [r.getMessage() for r in caplog.records]
    assert any("is complete at step 4 (of 2)" in m for m in said)
    assert not any("resuming" in m for m in said), said  # a finished run resumes nothing
    caplog.clear()
    longer = run(TrainConfig(**{**QUICK, "batch_size": 16}, **paths, max_steps=6))
    assert (longer.step, longer.tokens) == (6, 4 * 8 * 32 + 2 * 16 * 32)
    assert [r["tokens"] for r in _metrics(run_dir) if r["step"] == 6] == [longer.tokens] * 2
    assert any(f"resuming from {run_dir}" in r.getMessage() and "(step 4)" in r.getMessage()
               for r in caplog.records)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("from step 4 with other settings" in m and "batch_size 8 -> 16" in m
               for m in warned), warned
    assert config.load_toml(str(run_dir / rundir.CONFIG_NAME))["train"]["batch_size"] == 16
