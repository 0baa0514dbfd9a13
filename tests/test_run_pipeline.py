"""`tpulm run` end to end in real subprocesses: the demo pipeline with a tiny budget, its outputs
validated with the tools a user has (data inspect, Transformers), reruns that skip or redo only
what changed, and a run killed with SIGKILL mid-training that completes when rerun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from support.runs import tpulm_run_argv

from tpulm import rundir
from tpulm.data import builtin_corpus


def tpulm_run(work_dir: Path, *overrides: str, wait: bool = True, max_steps: int = 12, log=None):
    argv = tpulm_run_argv(work_dir, *overrides, max_steps=max_steps)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "HF_HUB_OFFLINE": "1"}
    if not wait:
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One complete tiny demo run: (work dir, its output)."""
    work = tmp_path_factory.mktemp("demo")
    return work, tpulm_run(work)


def test_demo_outputs_validate(demo):
    work, output = demo
    for prompt, _ in builtin_corpus.FILL_MASK_PROMPTS:  # every prompt answered, with the
        assert prompt.replace("{mask}", "[MASK]") in output  # Unigram tokenizer's mask token
    inspect = subprocess.run([sys.executable, "-m", "tpulm", "data", "inspect", str(work / "data" / "train")],
                             capture_output=True, text=True, timeout=300)
    assert inspect.returncode == 0, inspect.stdout + inspect.stderr
    run_dir = work / "run"
    assert rundir.latest_checkpoint(str(run_dir))[0] == 12
    assert (run_dir / "report.png").stat().st_size > 10_000
    assert "eval" in (run_dir / "report.html").read_text()
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evals if r["split"] == "eval"][-1] == 12


def test_export_answers_like_tpulm_in_transformers(demo):
    transformers = pytest.importorskip("transformers")
    work, _ = demo
    export = work / "run" / "export"
    fill = transformers.pipeline("fill-mask", model=str(export), top_k=5)
    prompt = builtin_corpus.FILL_MASK_PROMPTS[0][0].replace("{mask}", fill.tokenizer.mask_token)
    ours = subprocess.run([sys.executable, "-m", "tpulm", "fill-mask", str(export), prompt, "--json"],
                          capture_output=True, text=True, timeout=300)
    assert ours.returncode == 0, ours.stderr
    answers = json.loads(ours.stdout.splitlines()[-1])  # one JSON line per text
    theirs = fill(prompt)
    assert [a["token"] for a in answers] == [a["token"] for a in theirs]
    np.testing.assert_allclose([a["score"] for a in answers], [a["score"] for a in theirs],
                               atol=1e-4)


def test_rerun_skips_complete_stages_and_redoes_only_downstream_of_a_change(demo):
    work, _ = demo
    output = tpulm_run(work)
    for stage in ("corpus", "tokenizer", "data", "train", "export", "report"):
        assert f"stage {stage}: complete, skipped" in output
    notes = work / "run" / "export" / "notes.txt"  # the user's, in an output a rerun replaces
    notes.write_text("what I tried")
    with pytest.raises(AssertionError, match=r"tpulm run would remove .*export/notes.txt, which "
                                             r"tpulm did not write.*--overwrite"):
        tpulm_run(work, max_steps=16)
    assert notes.read_text() == "what I tried"  # stopped before any work:
    assert rundir.latest_checkpoint(str(work / "run"))[0] == 12  # no step trained
    notes.unlink()
    output = tpulm_run(work, max_steps=16)  # train longer: continues from the checkpoint
    assert "stage train: settings changed (train.max_steps): continuing" in output
    assert "schedule extended from 12 to 16 steps" in output
    assert "stage export: rerun because train changed" in output
    assert f"export     {work / 'run' / 'export'}" in output  # it ends saying where things are
    steps = [json.loads(line)["step"] for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] == 16  # no step trained twice
    with pytest.raises(AssertionError, match="--restart train"):  # cannot continue: nothing touched
        tpulm_run(work, "train.learning_rate=0.0003", max_steps=16)
    assert rundir.latest_checkpoint(str(work / "run"))[0] == 16
    output = tpulm_run(work, "train.learning_rate=0.0003", "--restart=train", max_steps=16)
    for stage in ("corpus", "tokenizer", "data"):
        assert f"stage {stage}: complete, skipped" in output
    assert "stage train: restarted" in output
    for stage in ("export", "report"):
        assert f"stage {stage}: rerun because train" in output


def _wait_for_checkpoint(process: subprocess.Popen, run_dir: Path, log: Path, timeout=400) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = rundir.latest_checkpoint(str(run_dir))
        if found:
            return found[0]
        if process.poll() is not None:
            pytest.fail("the run ended before its first checkpoint: " + log.read_text())
        time.sleep(0.2)
    pytest.fail("no checkpoint appeared")


# Training resumes; the downstream stage and the report have nothing to do with it.
KILLED_RUN = ("train.checkpoint_every=5", "evaluate.tasks=[]", "run.report=false")


def test_run_killed_mid_training_completes_when_rerun(tmp_path):
    log = tmp_path / "killed.log"
    with open(log, "wb") as out:
        process = tpulm_run(tmp_path / "work", *KILLED_RUN, wait=False, max_steps=40, log=out)
        step = _wait_for_checkpoint(process, tmp_path / "work" / "run", log)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert step < 40
    output = tpulm_run(tmp_path / "work", *KILLED_RUN, max_steps=40)
    assert "stage train: resuming" in output
    assert rundir.latest_checkpoint(str(tmp_path / "work" / "run"))[0] == 40
    assert (tmp_path / "work" / "run" / "export" / "model.safetensors").exists()
