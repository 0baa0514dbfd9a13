"""Nothing is overwritten that tpulm did not write: what it writes is recorded (size, hash), and
a stage rerun, `--restart`, `train`, `evaluate --output` replace or remove only files tpulm wrote
and that are unchanged since; anything else stops the command before any work, naming the files
and the flag that allows it. Real files a user wrote, real lock-holding processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tpulm import lock, ownership
from tpulm.cli import main
from tpulm.errors import TpulmError
from tpulm.evaluate import run as evaluate
from tpulm.pipeline import engine


def test_a_file_is_tpulms_while_unchanged_and_only_for_its_writer(tmp_path):
    (tmp_path / "card.md").write_text("# model\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "weights.bin").write_bytes(b"\0" * 100)
    ownership.record(str(tmp_path), ["card.md", "sub/weights.bin"], "export")
    assert ownership.foreign(str(tmp_path)) == []
    assert ownership.foreign(str(tmp_path), {"evaluate"}) == [str(tmp_path / "card.md"),
                                                              str(tmp_path / "sub" / "weights.bin")]
    (tmp_path / "card.md").write_text("# model\nmy notes\n")  # hand-edited: the user's now
    (tmp_path / "notes.txt").write_text("mine")
    assert ownership.foreign(str(tmp_path), {"export"}) == [str(tmp_path / "card.md"),
                                                            str(tmp_path / "notes.txt")]
    (tmp_path / "card.md").write_text("# MODEL\n")  # same size, other bytes: still changed
    assert str(tmp_path / "card.md") in ownership.foreign(str(tmp_path))


def test_an_appended_log_stays_tpulms_while_it_starts_with_what_was_recorded(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1}\n')
    ownership.record(str(tmp_path), ["metrics.jsonl"], "train", append=True)
    with open(log, "a") as f:
        f.write('{"step": 2}\n')  # training appends after recording
    assert ownership.foreign(str(tmp_path)) == []
    log.write_text('{"step": 9}\n{"step": 2}\n')  # its recorded start rewritten by a user
    assert ownership.foreign(str(tmp_path)) == [str(log)]


def stages(tmp_path, calls, value):
    """train -> export (inside train's run dir), each writing files, as tpulm's stages do."""
    run, export = tmp_path / "run", tmp_path / "run" / "export"

    def train():
        calls.append("train")
        run.mkdir(exist_ok=True)
        (run / "config.toml").write_text(f"value = {value}\n")

    def write_export():
        calls.append("export")
        export.mkdir(exist_ok=True)
        (export / "README.md").write_text(f"card of {value}\n")

    return [engine.Stage("train", train, {"value": value}, (str(run),), precious=True,
                         continuable=frozenset({"value"})),
            engine.Stage("export", write_export, {"value": value}, (str(export),), ("train",))]


def test_rerun_and_restart_stop_on_user_files_before_any_stage_runs(tmp_path):
    calls: list[str] = []
    engine.execute(stages(tmp_path, calls, 1), str(tmp_path))
    notes = tmp_path / "run" / "export" / "notes.txt"
    notes.write_text("what I tried")
    evaluated = tmp_path / "run" / "export" / "eval"  # `tpulm evaluate RUN/export` wrote here
    evaluated.mkdir()
    (evaluated / "results.json").write_text("{}\n")
    ownership.record(str(evaluated), ["results.json"], "evaluate")
    calls.clear()
    with pytest.raises(TpulmError, match=r"tpulm run would remove .*eval/results.json, .*notes.txt, "
                                         r"which tpulm did not write.*nothing was changed.*"
                                         r"--overwrite"):
        engine.execute(stages(tmp_path, calls, 1), str(tmp_path), restart=["export"])
    assert calls == [] and notes.read_text() == "what I tried"
    (tmp_path / "run" / "mine.txt").write_text("mine")
    with pytest.raises(TpulmError, match=r"would remove .*mine.txt"):
        engine.execute(stages(tmp_path, calls, 1), str(tmp_path), restart=["train"])
    assert calls == [] and (tmp_path / "run" / "mine.txt").exists()
    engine.execute(stages(tmp_path, calls, 1), str(tmp_path), restart=["train"], overwrite=True)
    assert calls == ["train", "export"] and not (tmp_path / "run" / "mine.txt").exists()


def test_a_stage_that_continues_does_not_claim_the_users_files(tmp_path):
    calls: list[str] = []
    engine.execute(stages(tmp_path, calls, 1), str(tmp_path))
    (tmp_path / "run" / "notes.txt").write_text("mine")  # dropped into a finished run dir
    engine.execute(stages(tmp_path, calls, 2), str(tmp_path))  # train continues, export reruns
    assert calls == ["train", "export", "train", "export"]
    with pytest.raises(TpulmError, match=r"would remove .*run/notes.txt"):
        engine.execute(stages(tmp_path, calls, 2), str(tmp_path), restart=["train"])


def test_an_interrupted_stage_may_remove_what_it_wrote_before_recording(tmp_path):
    out = tmp_path / "out"

    def interrupted():
        out.mkdir()
        (out / "partial").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        engine.execute([engine.Stage("a", interrupted, {"v": 1}, (str(out),))], str(tmp_path))
    done = engine.Stage("a", lambda: out.mkdir(exist_ok=True), {"v": 2}, (str(out),))
    engine.execute([done], str(tmp_path))  # settings changed: its unrecorded partial file goes
    assert not (out / "partial").exists()


HOLD = ("import sys, time; from tpulm import lock; lock.acquire(sys.argv[1], 'trainer'); "
        "print('held', flush=True); time.sleep(120)")


def test_restart_is_refused_while_a_live_process_holds_the_output(tmp_path, caplog):
    calls: list[str] = []
    engine.execute(stages(tmp_path, calls, 1), str(tmp_path))
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "run")],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(TpulmError, match=rf"run is in use by another trainer \(host .*, pid "
                                             rf"{holder.pid}, since"):
            engine.execute(stages(tmp_path, calls, 1), str(tmp_path), restart=["train"])
        assert (tmp_path / "run" / "config.toml").exists() and calls == ["train", "export"]
    finally:
        holder.send_signal(signal.SIGKILL)  # dies holding it: a stale lock
        holder.wait()
    engine.execute(stages(tmp_path, calls, 2), str(tmp_path), restart=["train"])
    assert calls[2:] == ["train", "export"]


def test_evaluate_output_written_by_the_user_is_refused_before_fine_tuning(tmp_path, caplog):
    mine = tmp_path / "scores.json"
    mine.write_text('{"my": "scores"}\n')
    with pytest.raises(TpulmError, match=r"tpulm evaluate would replace .*scores.json, which "
                                         r"tpulm did not write.*--overwrite"):
        evaluate.check_output(str(mine), overwrite=False)
    assert evaluate.check_output(str(mine), overwrite=True) is False  # replaced, not merged
    assert "which tpulm did not write (--overwrite)" in caplog.text
    evaluate._merge_write(str(mine), {"task": {"score": 1.0}}, merge=False)
    assert evaluate.check_output(str(mine), overwrite=False) is True  # tpulm's now: merged
    text = tmp_path / "notes.txt"
    text.write_text("plain text")
    with pytest.raises(TpulmError, match="notes.txt"):
        evaluate.check_output(str(text), overwrite=False)
    assert text.read_text() == "plain text"


def test_train_stops_on_a_config_and_metrics_the_user_had_in_the_run_dir(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.toml").write_text("# my experiment notes\n")
    (run_dir / "metrics.jsonl").write_text('{"split": "train", "step": 1, "mine": true}\n')
    code = main(["train", "--run-dir", str(run_dir), "--train-data", str(tmp_path / "none"),
                 "--tokenizer", str(tmp_path / "none"), "--model", "tiny"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "tpulm train would overwrite" in err[0] and "config.toml" in err[0]
    assert "metrics.jsonl" in err[0] and "--run-dir" in err[0]
    assert (run_dir / "config.toml").read_text() == "# my experiment notes\n"
    assert json.loads((run_dir / "metrics.jsonl").read_text())["mine"] is True
    assert sorted(os.listdir(run_dir)) == ["config.toml", "metrics.jsonl"]


def test_lock_check_free_ignores_its_own_and_dead_holders(tmp_path):
    path = lock.acquire(str(tmp_path), "tpulm run")
    lock.check_free(str(tmp_path))  # this process holds it
    assert json.loads(open(path).read())["holder"] == "tpulm run"
    lock.release(path)
    assert not os.path.exists(path)


def test_tokenizer_overwrite_keeps_a_hand_edited_tokenizer(tmp_path, wikitext_dir):
    from tpulm.data import tokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text((wikitext_dir / "valid.txt").read_text(encoding="utf-8")[:60_000],
                      encoding="utf-8")
    cfg = tokenizer.TokenizerConfig(inputs=(str(corpus),), output=str(tmp_path / "tok"),
                                    vocab_size=300, unk_rate_samples=1, overwrite=True)
    tokenizer.run(cfg)
    tokenizer.run(cfg)  # tpulm's, unchanged: replaced
    edited = tmp_path / "tok" / "tokenizer_config.json"
    edited.write_text(edited.read_text().replace("}", ', "note": "mine"}', 1))
    with pytest.raises(TpulmError, match=r"tokenizer train --overwrite would replace "
                                         r".*tokenizer_config.json, which tpulm did not write"):
        tokenizer.run(cfg)
    assert '"note": "mine"' in edited.read_text()
