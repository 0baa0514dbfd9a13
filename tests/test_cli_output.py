"""What a user sees: no native start-up noise on stderr, one progress line over a run."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tpulm import quiet
from tpulm.cli import _quiet
from tpulm.training.callbacks import progress_line

NATIVE_NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1796017577.553282   29689 port.cc:153] oneDNN custom operations are on.",
    "I0000 00:00:1796017577.557672   29689 cudart_stub.cc:31] Could not find cuda drivers",
    "E0000 00:00:1796017595.370054   29776 cuda_platform.cc:52] failed call to cuInit: INTERNAL",
    "W0000 00:00:1796017595.370054   29776 cpu_utils.cc:1] oneDNN supports DT_INT64 only on AVX-512",
]
KEPT = ["E0000 00:00:1796017595.370054   29776 file_system.cc:9] could not open gs://x/y",
        "tpulm: error: something a user must read"]

CHILD = """
import os, sys
from tpulm import quiet
from tpulm.cli import _quiet
_quiet.StderrFilter.install()
for line in sys.argv[1:]:
    os.write(2, (line + "\\n").encode())  # as native code writes: straight to fd 2
print("python stderr", file=sys.stderr)
_quiet.StderrFilter.active.stop()
"""


def test_native_start_up_noise_is_dropped_and_everything_else_kept():
    done = subprocess.run([sys.executable, "-c", CHILD, *NATIVE_NOISE, *KEPT],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # Python's own stderr bypasses the pipe, so only the set of lines is fixed, not their order.
    assert sorted(done.stderr.splitlines()) == sorted(["python stderr", *KEPT])
    for line in NATIVE_NOISE:
        assert quiet.NOISE.match(line)


SCOPED = """
import os, sys
from tpulm import quiet
with quiet.while_native_start():  # as training.run while TensorFlow starts
    for line in sys.argv[1:]:
        os.write(2, (line + "\\n").encode())
os.write(2, b"after the block: " + sys.argv[1].encode() + b"\\n")
"""


def test_the_python_api_filters_fd_2_only_while_tensorflow_starts():
    done = subprocess.run([sys.executable, "-c", SCOPED, *NATIVE_NOISE, *KEPT],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [*KEPT, f"after the block: {NATIVE_NOISE[0]}"]


def test_the_real_command_line_filters_and_verbose_does_not():
    probe = ("import sys; from tpulm import cli; from tpulm.cli import _quiet; "
             "sys.argv = ['tpulm', *sys.argv[1:]]; cli.main(); "
             "print(_quiet.StderrFilter.active is not None)")
    for flags, active in (([], "True"), (["--verbose"], "False")):
        done = subprocess.run([sys.executable, "-c", probe, *flags], capture_output=True,
                              text=True, timeout=60)
        assert done.stdout.split()[-1] == active, done.stdout + done.stderr


def test_progress_line_shows_one_loss_and_the_eta():
    line = progress_line(120, 2000, {"loss": 6.12345, "token_loss": 6.2, "accuracy": 0.12345},
                         12345.6, 200.0)
    assert line == ("step 120/2000 (6%)  loss 6.1235  masked acc 0.1235  12,346 tokens/s  "
                    "ETA 3m20s")
    assert line.count("loss") == 1


def _help(capsys, *argv: str) -> str:
    from tpulm import cli

    with pytest.raises(SystemExit):
        cli.main([*argv, "--help"])
    return capsys.readouterr().out


def test_help_lists_each_table_and_claims_a_toml_file_only_with_config(capsys):
    assert "also from the --config TOML file" in _help(capsys, "train")
    inspect = _help(capsys, "data", "inspect")
    assert "TOML" not in inspect and "InspectConfig settings" in inspect
    run = _help(capsys, "run")
    for key in ("[run]", "work_dir:", "fill_mask:", "[model]", "hidden_size:", "num_layers:"):
        assert key in run
    assert "--restart STAGE" in run


def _flat(text: str) -> str:
    """Help text with argparse's line wrapping undone (it also breaks lines after hyphens)."""
    return " ".join(re.sub(r"-\n\s*", "-", text).split())


@pytest.mark.parametrize("argv", [[], ["export"], ["import"], ["train"], ["run"]])
def test_help_names_both_architectures_and_all_their_presets(capsys, argv):
    from tpulm.model.config import PRESETS

    text = _flat(_help(capsys, *argv))
    missing = [name for name in PRESETS if not re.search(rf"(?<![\w-]){name}(?![\w-])", text)]
    assert not missing, f"tpulm {' '.join(argv)} --help lacks presets {missing}"
    assert "ModernBERT" in text or "ModernBertForMaskedLM" in text
    if "RobertaForMaskedLM" in text:
        assert "ModernBertForMaskedLM" in text


def test_help_lists_tokenizer_models_and_the_evaluate_table(capsys):
    text = _flat(_help(capsys, "tokenizer", "train"))
    assert "--model {unigram,bpe,wordpiece}" in text
    run = _help(capsys, "run")
    assert "[evaluate]" in run and "\n  tasks: " in run and "\n  seeds: " in run


def test_only_the_cli_prints():
    """Stages report through return values and logging; the command decides what to show."""
    import ast
    from pathlib import Path

    import tpulm

    package = Path(tpulm.__file__).parent
    printing = [f"{path.relative_to(package)}:{node.lineno}"
                for path in package.rglob("*.py") if "cli" not in path.relative_to(package).parts
                for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print"]
    assert not printing, printing


def test_a_set_typo_is_named_as_a_set_and_a_file_typo_as_the_file(tmp_path, capsys):
    from tpulm.cli import main

    work = ["--work-dir", str(tmp_path / "w")]
    assert main(["run", *work, "--set", "train.batch_sizee=3"]) == 2
    err = capsys.readouterr().err
    assert "unknown setting(s) batch_sizee in [train] of --set (over " in err, err
    mine = tmp_path / "mine.toml"
    mine.write_text("[train]\nbatch_sizee = 3\n")
    assert main(["run", "--config", str(mine), *work, "--set", "train.max_steps=5"]) == 2
    assert f"batch_sizee in [train] of {mine};" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()  # refused before any stage ran


HUB_WARNING = """
import logging
from tpulm import cli
cli.quiet_libraries(False)  # as cli.main, before logging.basicConfig
logging.basicConfig(level=logging.INFO)
import huggingface_hub  # its own stderr handler, as the Hub client sets it up
logging.getLogger("huggingface_hub.utils._http").warning("Retrying in 1s [Retry 1/5].")
"""


def test_a_hub_warning_shows_once():
    done = subprocess.run([sys.executable, "-c", HUB_WARNING], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("Retrying in 1s [Retry 1/5].") == 1, done.stderr
