"""The one rule for writing folders: nothing a user owns is deleted or replaced."""

from __future__ import annotations

import pytest

from tpulm import cli, storage
from tpulm.errors import TpulmError


def _snapshot(folder) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def corpus_folder(tmp_path, wikitext_dir):
    folder = tmp_path / "mine"
    folder.mkdir()
    lines = (wikitext_dir / "valid.txt").read_text(encoding="utf-8").splitlines()[:400]
    (folder / "corpus.txt").write_text("\n".join(lines), encoding="utf-8")
    return folder


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_tokenizer_output_holding_user_files_is_refused(corpus_folder, capsys, overwrite):
    before = _snapshot(corpus_folder)
    code = cli.main(["tokenizer", "train", str(corpus_folder / "corpus.txt"), "--vocab-size", "300",
                     "--output", str(corpus_folder), *overwrite])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{corpus_folder} holds files tpulm did not write (corpus.txt)" in err
    assert _snapshot(corpus_folder) == before
    assert sorted(p.name for p in corpus_folder.parent.iterdir()) == ["mine"]  # no temporaries


def test_tokenizer_output_that_is_a_file_is_refused(corpus_folder, capsys):
    target = corpus_folder / "corpus.txt"
    before = target.read_bytes()
    code = cli.main(["tokenizer", "train", str(target), "--vocab-size", "300", "--output",
                     str(target), "--overwrite"])
    assert code == 2
    assert f"{target} is a file, not a folder" in capsys.readouterr().err
    assert target.is_file() and target.read_bytes() == before


def test_overwrite_replaces_only_a_folder_of_our_files(tmp_path):
    ours = tmp_path / "export"
    ours.mkdir()
    (ours / "config.json").write_text("old")
    with storage.atomic_folder(str(ours), overwrite=True) as tmp:
        storage.write_text(storage.join(tmp, "config.json"), "new")
        storage.write_text(storage.join(tmp, "model.safetensors"), "w")
    assert _snapshot(ours) == {"config.json": b"new", "model.safetensors": b"w"}

    (ours / "notes.txt").write_text("keep me")
    with pytest.raises(TpulmError, match=r"export holds files tpulm did not write \(notes.txt\)"):
        with storage.atomic_folder(str(ours), overwrite=True) as tmp:
            storage.write_text(storage.join(tmp, "config.json"), "newer")
            storage.write_text(storage.join(tmp, "model.safetensors"), "w2")
    assert _snapshot(ours)["notes.txt"] == b"keep me" and _snapshot(ours)["config.json"] == b"new"
    with pytest.raises(TpulmError, match=r"already holds files; pass --overwrite"):
        with storage.atomic_folder(str(ours), overwrite=False, ours={"config.json", "model.safetensors", "notes.txt"}):
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # temporaries removed


def test_a_file_in_the_way_is_never_replaced(tmp_path):
    target = tmp_path / "run"
    target.write_text("user data")
    with pytest.raises(TpulmError, match="is a file, not a folder"):
        with storage.atomic_folder(str(target), overwrite=True, ours={"config.toml"}):
            pass
    assert target.read_text() == "user data"


def test_file_size_limit_is_one_line_naming_the_path(corpus_folder, tmp_path):
    import subprocess
    import sys

    code = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096)); from tpulm import cli; "
            "sys.exit(cli.main(sys.argv[1:]))")
    out = tmp_path / "tok"
    done = subprocess.run([sys.executable, "-c", code, "tokenizer", "train",
                           str(corpus_folder / "corpus.txt"), "--vocab-size", "300", "--output",
                           str(out)], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": __import__("os").pathsep.join(sys.path)})
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("tpulm: error: File too large: ") and str(out) in last, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not out.exists()
