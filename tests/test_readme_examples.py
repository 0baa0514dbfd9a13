"""The README's stage-by-stage examples, run as written (with tiny sizes) on real text.

Every ``tpulm`` command of the README's "The stages one by one" part is taken from the README
itself. Those a CPU test box can run are run in order, in one Python process (TensorFlow is
imported once), in a folder holding a small WikiText-2 corpus laid out as the README names it;
flags appended to each command (argparse: the last one wins) shrink the sizes. The others (TPU,
multi-device, Hub upload, accelerator precisions) are checked for consistency: every path they
read is one an earlier example writes. The run's stderr must hold none of the start-up noise
of TensorFlow/JAX on a CPU machine.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
# Appended to each command of the subcommand: tiny sizes, and steps that exist in a tiny run.
TINY = {
    ("tokenizer", "train"): [],  # 32000 asked for: the small corpus supports fewer, and says so
    ("data", "prepare"): ["--max-length", "64", "--shard-size", "100"],
    # (the laptop example's model stays: modernbert-tiny is tiny already)
    ("train",): ["--max-steps", "4", "--batch-size", "8", "--eval-every", "2",
                 "--checkpoint-every", "2", "--log-every", "2", "--shuffle-buffer", "64",
                 "--epochs", "1"],
    ("export",): [],
    ("evaluate",): ["--seeds", "1", "--epochs", "1", "--max-length", "32"],
}
PLACEHOLDERS = {"RUN_DIR": "runs/tiny", "OUT_DIR": "runs/tiny-out"}
# Examples that need what a CPU test box lacks: a TPU, several devices, the Hub, a bf16 unit,
# a Dataflow project, GLUE downloads, the user's own task files.
NOT_HERE = ("--tpu", "--mesh", "--push-to-hub", "mixed_bfloat16", "path/to/", "|", "--runner",
            "glue:", "train.csv")
NOISE = ("E0000", "I0000", "cuInit", "oneDNN custom operations", "oneDNN supports DT_INT64",
         "Unable to initialize backend", "absl::InitializeLog")


def readme_commands() -> list[str]:
    """The ``tpulm`` commands of the README's stage-by-stage part, continuation lines joined."""
    text = README.read_text(encoding="utf-8")
    part = text[text.index("# The stages one by one"): text.index("# Development")]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", part, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith("tpulm ") or "| tpulm " in line:
                commands.append(line)
    return commands


def readme_python(marker: str = "fill-mask") -> str:
    """The README's Python block holding ``marker``."""
    text = README.read_text(encoding="utf-8")
    return next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if marker in b)


def argv_of(command: str) -> list[str]:
    for name, value in PLACEHOLDERS.items():
        command = command.replace(name, value)
    argv = shlex.split(command)[1:]
    for prefix, extra in TINY.items():
        if tuple(argv[: len(prefix)]) == prefix:
            argv += extra
            if prefix == ("export",) and "--step" in argv:
                argv += ["--step", "4"]
    return argv


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_readme_paths_agree_from_one_example_to_the_next():
    written_tokenizers, written_shards = set(), set()
    commands = [argv_of(c) for c in readme_commands()]
    assert len(commands) >= 10
    for argv in commands:
        local = [re.sub(r"^gs://[^/]+/", "", a) for a in argv]  # the TPU example's bucket
        if argv[:2] == ["tokenizer", "train"]:
            written_tokenizers.add(flag(local, "--output"))
        if argv[:2] == ["data", "prepare"]:
            written_shards.add(flag(local, "--output"))
        if argv[0] == "train":  # (the laptop, GPU, TPU and JAX examples)
            assert flag(local, "--tokenizer") in written_tokenizers, argv
            for name in ("--train-data", "--eval-data"):
                if flag(local, name):
                    folder, split = flag(local, name).rsplit("/", 1)
                    assert folder in written_shards and split in ("train", "validation"), argv


DRIVER = """
import json, sys
from tpulm import cli
commands, python = json.loads(sys.stdin.read())
for argv in commands:
    print("=== tpulm", *argv, flush=True)
    print("=== exit", cli.main(argv, filter_native_logs=True), flush=True)
print("=== python", flush=True)
exec(python + "print(json.dumps(fill_mask('Goal of my life is to [MASK].')))\\n")
"""


def test_readme_examples_run_as_written(tmp_path, wikitext_dir):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = [ln for ln in (wikitext_dir / "valid.txt").read_text(encoding="utf-8").splitlines() if ln.strip()]
    (corpus / "train-0.txt").write_text("\n".join(lines[:500]) + "\n", encoding="utf-8")
    (corpus / "train-1.txt").write_text("\n".join(lines[500:900]) + "\n", encoding="utf-8")
    (corpus / "valid.txt").write_text("\n".join(lines[900:1000]) + "\n", encoding="utf-8")
    runnable = [argv_of(c) for c in readme_commands() if not any(x in c for x in NOT_HERE)]
    train = next(a for a in runnable if a[0] == "train")
    runnable.insert(runnable.index(train) + 1, train)  # the README: "rerun the same command"
    prepare = next(a for a in runnable if a[:2] == ["data", "prepare"])
    runnable.insert(runnable.index(prepare) + 1, prepare)  # "Interrupted? Run the same command"
    python = readme_python().replace("RUN_DIR", PLACEHOLDERS["RUN_DIR"])
    done = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps([runnable, python]),
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    exits = re.findall(r"=== exit (\d+)", done.stdout)
    assert exits == ["0"] * len(runnable), out
    assert len(runnable) >= 9  # tokenizer, prepare x2, inspect, train x2, export x2, fill-mask x2
    assert "asked for a vocabulary of 32000, got" in out  # the tiny corpus holds fewer tokens
    assert "runs/tiny is complete at step 4" in out  # the rerun of a finished run
    skipped = [ln for ln in done.stdout.splitlines() if ": already complete -> " in ln]
    assert len(skipped) == 2 and not [ln for ln in skipped if "tokens/s" in ln], skipped
    assert "\n\n\n" not in done.stdout
    assert not [ln for ln in done.stderr.splitlines() if any(n in ln for n in NOISE)], done.stderr
    assert "Epoch " not in out and "step 4/4 (100%)  loss " in out  # one line over the run
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(answers) == 5
    check_modernbert_card(tmp_path / "runs" / "tiny" / "export" / "README.md")
    check_python_on_the_finished_run(tmp_path)
    # After 4 steps the model may still rank the bare space piece among its 5 (it decodes to
    # "", the sequence to "... to ."); every word it answers is followed by the "." directly.
    words = [a for a in answers if a["token_str"].strip()]
    assert len(words) >= 3, answers
    for answer in words:
        assert answer["sequence"].endswith(answer["token_str"].strip() + "."), answer


def check_modernbert_card(card_path: Path) -> None:
    """The laptop example's export (a ModernBERT) has a card that says what it is."""
    card = card_path.read_text(encoding="utf-8")
    for fact in ("A ModernBERT masked language model", "| architecture | `ModernBertForMaskedLM` |",
                 "\n- modernbert\n", "30% of the tokens selected", "peak learning rate: 0.002",
                 "no ModernBERT converter"):
        assert fact in card, fact
    assert "Roberta" not in card and "RoBERTa" not in card


def check_python_on_the_finished_run(work: Path) -> None:
    """The README's training snippet, in a fresh Python, on the run the laptop example finished
    (4 steps here: the snippet's 200 shrunk to 2, still fewer): it says the run is complete,
    returns it as it is, writes nothing, and shows no native start-up line."""
    python = readme_python("from tpulm.training import").replace("max_steps=200", "max_steps=2")
    run_dir = work / "runs" / "tiny"
    files = {p: p.read_bytes() for p in (run_dir / "config.toml", run_dir / "metrics.jsonl")}
    done = subprocess.run([sys.executable, "-c", python], cwd=work, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert done.returncode == 0, done.stderr
    assert "run runs/tiny is complete at step 4 (of 2)" in done.stderr  # through `logging`
    step, evaluation = done.stdout.split(" ", 2)[:2]
    assert step == "4" and evaluation.startswith("{'loss'"), done.stdout
    assert {p: p.read_bytes() for p in files} == files
    assert not [ln for ln in done.stderr.splitlines() if any(n in ln for n in NOISE)], done.stderr


# `tpulm run` at a tiny budget: no downstream stage, no report, no XLA compiles (tested elsewhere).
RUN_TINY = ["--set", "tokenizer.vocab_size=1000", "--set", "data.max_length=64",
            "--set", 'train.jit_compile="false"',
            "--set", "data.shard_size=500", "--set", "train.max_steps=4",
            "--set", "train.batch_size=8", "--set", "train.log_every=2",
            "--set", "train.eval_every=4", "--set", "train.checkpoint_every=4",
            "--set", "train.shuffle_buffer=64", "--set", "evaluate.tasks=[]",
            "--set", "run.report=false"]


def test_run_with_a_bpe_tokenizer_answers_its_prompts_to_the_end(tmp_path, wikitext_dir, capsys):
    """The README offers `--model bpe`: the whole run completes, its prompt (written with
    {mask}, as the built-in corpus' prompts are) answered with BPE's own `<mask>`, and its export
    is the demo's ModernBERT, whose card says so."""
    from tpulm import cli
    from tpulm.data import builtin_corpus

    lines = [ln for ln in (wikitext_dir / "valid.txt").read_text(encoding="utf-8").splitlines()
             if ln.strip()]
    for name, part in (("train.txt", lines[:600]), ("valid.txt", lines[600:700])):
        (tmp_path / name).write_text("\n".join(part) + "\n", encoding="utf-8")
    prompt = "The game was released in {mask} ."
    argv = ["run", "--work-dir", str(tmp_path / "w"), "--set", 'tokenizer.model="bpe"',
            "--set", 'run.corpus="files"', "--set", f'run.train_files=["{tmp_path / "train.txt"}"]',
            "--set", f'run.validation_files=["{tmp_path / "valid.txt"}"]',
            "--set", f'run.fill_mask=["{prompt}"]', *RUN_TINY]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "The game was released in <mask> .\n  0." in out and "[MASK]" not in out
    assert all("{mask}" in p for p, _ in builtin_corpus.FILL_MASK_PROMPTS)
    export = tmp_path / "w" / "run" / "export"
    assert json.loads((export / "config.json").read_text())["architectures"] == [
        "ModernBertForMaskedLM"]
    card = (export / "README.md").read_text()
    for fact in ("A ModernBERT masked language model", "\n- modernbert\n", "`<mask>`",
                 "30% of the tokens selected", "document attention", ": on", "BPE tokenizer",
                 'fill_mask("The capital of France is <mask>.")'):
        assert fact in card, fact
    assert "Roberta" not in card and "RoBERTa" not in card
    assert cli.main(argv) == 0  # the rerun: every stage complete, the prompt answered again
    assert "The game was released in <mask> ." in capsys.readouterr().out


def readme_between(start: str, end: str) -> str:
    text = README.read_text(encoding="utf-8")
    i = text.index(start)
    return text[i: text.index(end, i)]


def help_text(capsys, *argv: str) -> str:
    """What ``tpulm ARGV --help`` prints, on one line (the test sets a wide COLUMNS)."""
    import pytest

    from tpulm import cli

    with pytest.raises(SystemExit):
        cli.main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_each_help_lists_the_readmes_presets_tables_and_choices(capsys, monkeypatch):
    """The README's lists (presets, root-config tables, tokenizer models, export classes) are
    the code's, and each command's --help names them all."""
    from tpulm import config
    from tpulm.data.tokenizer import MODELS
    from tpulm.model.config import PRESETS

    monkeypatch.setenv("COLUMNS", "10000")  # argparse wraps (and splits names at "-") to fit
    presets = re.findall(r"`([\w-]+)`", readme_between("Shipped presets:", "Everything lands"))
    assert presets == ["demo", "reference", *PRESETS]
    listed = readme_between("A root config has the tables", "each table")
    tables = re.findall(r"`\[(\w+)\]`", listed)
    assert tables == list(config.TABLES)
    families = readme_between("1. `tpulm tokenizer train`", "\n")
    assert [m in families.lower() for m in MODELS] == [True] * len(MODELS)
    classes = ("`RobertaForMaskedLM`", "`ModernBertForMaskedLM`")
    assert all(c in readme_between("## 4. Export", "```bash") for c in classes)
    for argv in ([], ["train"], ["run"]):
        shown = help_text(capsys, *argv)
        assert all(p in shown for p in PRESETS), (argv, shown)
    run_help = help_text(capsys, "run")
    staged = [t for t in tables if t != "plan"]  # [plan] is `tpulm plan`'s, not a stage's
    assert all(f"[{t}]" in run_help for t in staged) and "reference" in run_help
    assert "{" + ",".join(MODELS) + "}" in help_text(capsys, "tokenizer", "train")
    for command in (["export"], ["import"], []):
        shown = help_text(capsys, *command)
        assert all(c.strip("`") in shown for c in classes), (command, shown)
