"""Export to / import from Transformers: logits, tensors, errors, atomicity, Hub upload guard."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import keras  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402
from support.models import (  # noqa: E402
    hf_model,
    make_run_dir,
    packed_batch,
    padded_batch,
    sentences,
    torch_logits,
    train_reference_tokenizer,
    wikitext_lines,
)

from tpulm import rundir  # noqa: E402
from tpulm.cli import main  # noqa: E402
from tpulm.errors import TpulmError  # noqa: E402
from tpulm.hf import export, folder, hub, importer
from tpulm.model import weights  # noqa: E402
from tpulm.model.config import load_model_preset  # noqa: E402
from tpulm.model.networks import build_model  # noqa: E402

TOL = 1e-4


@pytest.fixture(scope="module")
def lines(wikitext_dir):
    return wikitext_lines(wikitext_dir)


@pytest.fixture(scope="module")
def tokenizer_dir(lines, tmp_path_factory):
    return train_reference_tokenizer(lines, tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def run(tokenizer_dir, tmp_path_factory):
    """(run dir, keras model of its latest checkpoint, config)."""
    run_dir = tmp_path_factory.mktemp("runs") / "run"
    model, cfg = make_run_dir(run_dir, tokenizer_dir, load_model_preset("tiny"))
    return run_dir, model, cfg


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("exports") / "model"
    assert main(["export", str(run[0]), str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))


def _torch_from(folder):
    return transformers.AutoModelForMaskedLM.from_pretrained(str(folder)).eval()


def test_export_folder_and_config(exported, run):
    _, _, cfg = run
    assert sorted(os.listdir(exported)) == [  # and the record of what tpulm wrote there
        ".tpulm-written.json", "README.md", "config.json", "model.safetensors",
        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["RobertaForMaskedLM"] and config["model_type"] == "roberta"
    # Token roles from this tokenizer (reference Unigram), not roberta-base's 1/0/2.
    assert (config["pad_token_id"], config["bos_token_id"], config["eos_token_id"]) == (3, 0, 1)
    assert config["vocab_size"] == cfg.vocab_size and config["layer_norm_eps"] == 1e-5
    card = (exported / "README.md").read_text()
    for fact in ("step 10", "10,240", "5.4321", "0.1234", "`[MASK]`", "pipeline_tag: fill-mask",
                 "learning_rate = 0.0001", "A RoBERTa masked language model",
                 "| architecture | `RobertaForMaskedLM` |", "\n- roberta\n",
                 f"| layers | {cfg.num_layers} |", f"| hidden size | {cfg.hidden_size} |",
                 "learned, from row 4 (`pad_token_id` + 1)",
                 f"| longest input (tokens) | {cfg.max_positions} |",
                 "batch size per replica: 8", "peak learning rate: 0.0001",
                 "assumes RoBERTa's pad id 1", "this tokenizer's pad id is 3"):
        assert fact in card, fact
    assert "ModernBERT" not in card and "$" not in card.split("```toml")[0]


def test_exported_model_logits_match_keras(exported, run, tokenizer, lines):
    _, model, _ = run
    torch_model = _torch_from(exported)
    texts = sentences(lines[-30:], 40)
    padded = padded_batch(tokenizer, texts[:8], max_len=128)
    packed = packed_batch(tokenizer, texts, rows=2, length=128)
    assert (padded["attention_mask"] == 0).any()
    assert (packed["input_ids"][:, 1:-1] == tokenizer.token_to_id("[SEP]")).any()
    for batch in (padded, packed):
        real = batch["attention_mask"].astype(bool)
        got = keras.ops.convert_to_numpy(model(batch, training=False))
        np.testing.assert_allclose(got[real], torch_logits(torch_model, batch)[real],
                                   atol=TOL, rtol=0)


def test_pipeline_top5_equals_tpulm_fill_mask(exported, run, capsys):
    texts = ["The game was released in [MASK] .", "He was born in the [MASK] of the city .",
             "The [MASK] of the song was [MASK] ."]
    pipe = transformers.pipeline("fill-mask", model=str(exported), top_k=5)
    expected = [pipe(t) for t in texts]
    for source in (exported, run[0]):  # the export and the run dir answer alike
        assert main(["fill-mask", str(source), "--json", *texts]) == 0
        got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert len(got) == len(texts)
        for want, have in zip(expected, got):
            want_rows = want if isinstance(want[0], list) else [want]
            have_rows = have if isinstance(have[0], list) else [have]
            assert len(want_rows) == len(have_rows)
            for w_row, h_row in zip(want_rows, have_rows):
                assert [h["token"] for h in h_row] == [w["token"] for w in w_row]
                assert [h["token_str"] for h in h_row] == [w["token_str"] for w in w_row]
                assert [h["sequence"] for h in h_row] == [w["sequence"] for w in w_row]
                np.testing.assert_allclose([h["score"] for h in h_row],
                                           [w["score"] for w in w_row], atol=1e-5)


def test_export_of_older_step_and_unknown_step(run, tmp_path):
    run_dir, _, cfg = run
    assert main(["export", str(run_dir), str(tmp_path / "s5"), "--step", "5"]) == 0
    exported = load_file(str(tmp_path / "s5" / "model.safetensors"))
    ckpt = weights.read(str(Path(rundir.checkpoint_dir(str(run_dir), 5)) / "model.safetensors"))
    np.testing.assert_array_equal(
        exported["lm_head.dense.weight"], ckpt["roberta_mlm/lm_head/dense/kernel"].T)
    with pytest.raises(TpulmError, match=r"no checkpoint of step 7.*\[5, 10\]"):
        export.write_export(str(run_dir), str(tmp_path / "s7"), step=7)


def test_failed_export_leaves_no_folder(run, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(folder, "write_tokenizer", broken)
    with pytest.raises(OSError, match="disk full"):
        export.write_export(str(run[0]), str(tmp_path / "out"))
    assert os.listdir(tmp_path) == []


def test_existing_export_needs_overwrite_and_user_files_are_never_replaced(run, tmp_path):
    out = tmp_path / "out"
    export.write_export(str(run[0]), str(out))
    first = (out / "model.safetensors").stat().st_ino
    with pytest.raises(TpulmError, match="--overwrite"):
        export.write_export(str(run[0]), str(out))
    export.write_export(str(run[0]), str(out), overwrite=True)  # tpulm's, unchanged: replaced
    assert (out / "model.safetensors").stat().st_ino != first
    card = out / "README.md"
    card.write_text(card.read_text() + "\nMy notes on this model.\n")  # hand-edited: the user's
    with pytest.raises(TpulmError, match=r"would remove .*README.md, which tpulm did not write "
                                         r"or which changed since; nothing was changed"):
        export.write_export(str(run[0]), str(out), overwrite=True)
    assert card.read_text().endswith("My notes on this model.\n")
    card.unlink()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(TpulmError, match=r"would remove .*notes.txt, which tpulm did not write"):
        export.write_export(str(run[0]), str(out), overwrite=True)
    assert (out / "notes.txt").read_text() == "mine" and (out / "model.safetensors").exists()
    assert os.listdir(tmp_path) == ["out"]


@pytest.fixture(scope="module")
def hf_dir(run, tokenizer_dir, tmp_path_factory):
    """A checkpoint saved by Transformers itself (save_pretrained) with its tokenizer."""
    _, _, cfg = run
    folder = tmp_path_factory.mktemp("hf") / "roberta"
    model = hf_model(cfg, seed=3)
    model.config.architectures = ["RobertaForMaskedLM"]
    model.save_pretrained(str(folder))
    transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(str(folder))
    return folder


def test_import_overwrite_of_a_trained_run_says_it_drops_its_checkpoints(hf_dir, run, tmp_path,
                                                                          caplog, capsys):
    import shutil

    target = tmp_path / "run"
    shutil.copytree(run[0], target)  # checkpoints of steps 5 and 10
    caplog.set_level("WARNING")
    assert main(["import", str(hf_dir), str(target), "--overwrite"]) == 0
    said = caplog.text + capsys.readouterr().err
    assert "holds 2 trained checkpoint(s) (latest step 10)" in said and "dropped" in said
    assert [step for step, _ in rundir.list_checkpoints(str(target))] == [0]


def _exported_form(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``state`` bit for bit but for the export's one rewrite: the token-type row (non-zero
    here, as tpulm trains it) folded into the positions (see tpulm.hf.roberta.canonical_state)."""
    types, positions = (f"roberta.embeddings.{t}_embeddings.weight"
                        for t in ("token_type", "position"))
    assert state[types].any()
    return {**state, types: np.zeros_like(state[types]),
            positions: state[positions] + state[types][0]}


def test_round_trip_hf_tpulm_hf_is_exact(hf_dir, tmp_path, tokenizer, lines):
    run_dir, out = tmp_path / "run", tmp_path / "out"
    assert main(["import", str(hf_dir), str(run_dir)]) == 0
    assert main(["export", str(run_dir), str(out)]) == 0
    original, back = load_file(str(hf_dir / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert sorted(back) == sorted(original)
    for key, value in _exported_form(original).items():
        assert back[key].dtype == value.dtype and np.array_equal(back[key], value), key
    # The imported checkpoint loads with tpulm.model.weights into build_model (training resumes from it).
    from tpulm.model.config import run_model_config
    from tpulm.rundir import run_checkpoint

    cfg = run_model_config(str(run_dir))
    step, path = run_checkpoint(str(run_dir))
    model = build_model(cfg)
    weights.load(model.weights, path)
    batch = padded_batch(tokenizer, sentences(lines[:20], 6), max_len=128)
    real = batch["attention_mask"].astype(bool)
    ref = torch_logits(_torch_from(hf_dir), batch)
    got = keras.ops.convert_to_numpy(model(batch, training=False))
    assert step == 0
    np.testing.assert_allclose(got[real], ref[real], atol=TOL, rtol=0)


def test_import_rejects_other_architectures(hf_dir, tmp_path):
    import shutil

    bert = tmp_path / "bert"
    shutil.copytree(hf_dir, bert)
    config = json.loads((bert / "config.json").read_text())
    config.update(model_type="bert", architectures=["BertForMaskedLM"])
    (bert / "config.json").write_text(json.dumps(config))
    with pytest.raises(TpulmError, match="BertForMaskedLM"):
        importer.import_checkpoint(importer.ImportConfig(hf_dir=str(bert), run_dir=str(tmp_path / "r")))
    assert not (tmp_path / "r").exists()


def test_import_lists_missing_and_unexpected_tensors(hf_dir, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(hf_dir, broken)
    state = load_file(str(broken / "model.safetensors"))
    del state["roberta.encoder.layer.1.output.dense.weight"]
    del state["lm_head.bias"]
    state["roberta.pooler.dense.weight"] = np.zeros((2, 2), np.float32)
    save_file(state, str(broken / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(TpulmError) as err:
        importer.import_checkpoint(importer.ImportConfig(hf_dir=str(broken), run_dir=str(tmp_path / "r")))
    message = str(err.value)
    for name in ("roberta.encoder.layer.1.output.dense.weight", "lm_head.bias",
                 "roberta.pooler.dense.weight"):
        assert name in message
    assert not (tmp_path / "r").exists()


def test_pickle_only_with_allow_pickle(hf_dir, tmp_path, capsys):
    import shutil

    import torch

    pickled = tmp_path / "pickled"
    shutil.copytree(hf_dir, pickled)
    state = load_file(str(pickled / "model.safetensors"))
    (pickled / "model.safetensors").unlink()
    torch.save({k: torch.from_numpy(v) for k, v in state.items()}, pickled / "pytorch_model.bin")
    with pytest.raises(TpulmError, match="--allow-pickle"):
        importer.import_checkpoint(importer.ImportConfig(hf_dir=str(pickled), run_dir=str(tmp_path / "r")))
    capsys.readouterr()
    assert main(["fill-mask", str(pickled), "a <mask>"]) == 2  # a command without the flag
    err = capsys.readouterr().err
    assert "pytorch_model.bin, a pickle" in err and "--allow-pickle" not in err
    assert main(["import", str(pickled), str(tmp_path / "r"), "--allow-pickle"]) == 0
    assert main(["export", str(tmp_path / "r"), str(tmp_path / "out")]) == 0
    back = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert all(np.array_equal(back[k], v) for k, v in _exported_form(state).items())


def test_hub_upload_files_and_offline_error(run, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_not_to_be_written")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "out"
    code = main(["export", str(run[0]), str(out), "--push-to-hub", "someone/tiny-roberta"])
    err = capsys.readouterr().err
    assert code == 2 and "HF_HUB_OFFLINE" in err and f"the export stays in {out}" in err
    assert "hf_secret" not in err
    assert sorted(hub.hub_files(str(out))) == [  # tpulm's record of what it wrote stays home
        "README.md", "config.json", "model.safetensors", "special_tokens_map.json",
        "tokenizer.json", "tokenizer_config.json"]
    assert sorted(os.listdir(out)) == [".tpulm-written.json", *sorted(hub.hub_files(str(out)))]
    for name in os.listdir(out):
        assert b"hf_secret" not in (out / name).read_bytes()
    assert "someone/tiny-roberta" in (out / "README.md").read_text()


def test_hub_error_without_token(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "none"))
    with pytest.raises(TpulmError, match="no Hugging Face token"):
        hub.check_hub_access("someone/tiny-roberta")
    with pytest.raises(TpulmError, match="not a valid Hub repo id"):
        hub.check_hub_access("not a repo id!")


def test_export_from_remote_run_dir(run, tmp_path):
    """Run dirs on any tf.io.gfile scheme (gs:// in production; ram:// here) export alike."""
    tf = pytest.importorskip("tensorflow")
    run_dir = run[0]
    remote = "ram://tpulm-test-run"
    for local in sorted(run_dir.rglob("*")):
        target = f"{remote}/{local.relative_to(run_dir).as_posix()}"
        if local.is_dir():
            tf.io.gfile.makedirs(target)
        else:
            tf.io.gfile.makedirs(target.rsplit("/", 1)[0])
            tf.io.gfile.copy(str(local), target, overwrite=True)
    from_remote, local = tmp_path / "a" / "model", tmp_path / "b" / "model"
    export.write_export(remote, str(from_remote))
    export.write_export(str(run_dir), str(local))
    for name in ("model.safetensors", "config.json", "tokenizer.json", "README.md"):
        assert (from_remote / name).read_bytes() == (local / name).read_bytes(), name


def _hidden_states(folder, batch) -> tuple[np.ndarray, np.ndarray]:
    """Last hidden states of an export read by keras-hub 0.32 and by Transformers."""
    import keras_hub
    import torch

    backbone = keras_hub.models.RobertaBackbone.from_preset(str(folder))
    got = keras.ops.convert_to_numpy(backbone({"token_ids": batch["input_ids"],
                                               "padding_mask": batch["attention_mask"]}))
    with torch.no_grad():
        tensors = {k: torch.from_numpy(v.astype("int64")) for k, v in batch.items()}
        out = _torch_from(folder)(**tensors, output_hidden_states=True)
    return got, out.hidden_states[-1].numpy()


def test_keras_hub_reads_the_export_as_transformers_does_with_pad_id_1(
        exported, tokenizer, lines, tmp_path):
    """keras-hub ignores the token-type table (folded into positions on export) and assumes
    RoBERTa's pad id 1: a byte-level BPE export (pad 1) agrees; the Unigram one (pad 3) does
    not, as its model card and the export's log line say."""
    pytest.importorskip("keras_hub")  # the test extra installs it
    from tpulm.data import tokenizer as tokenizers

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines[:600]) + "\n", encoding="utf-8")
    tok_dir = tmp_path / "bpe"
    tokenizers.run(tokenizers.TokenizerConfig(inputs=(str(corpus),), output=str(tok_dir),
                                              model="bpe", vocab_size=600))
    bpe = tokenizers.open_folder(str(tok_dir))
    assert bpe.special.pad_id == 1
    make_run_dir(tmp_path / "run", tok_dir, load_model_preset("tiny"), steps=(5,), pad_id=1)
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "export")]) == 0
    card = (tmp_path / "export" / "README.md").read_text()
    assert "with the same hidden states as Transformers" in card
    texts = sentences(lines[-30:], 6)
    batch = padded_batch(bpe.tokenizer, texts, max_len=64)
    batch["input_ids"][batch["attention_mask"] == 0] = 1  # padded_batch pads with the Unigram's 3
    real = batch["attention_mask"].astype(bool)
    assert not real.all()
    got, want = _hidden_states(tmp_path / "export", batch)
    np.testing.assert_allclose(got[real], want[real], atol=TOL, rtol=0)
    unigram = padded_batch(tokenizer, texts, max_len=64)
    got, want = _hidden_states(exported, unigram)
    real = unigram["attention_mask"].astype(bool)
    assert np.abs(got[real] - want[real]).max() > 0.1  # the card's warning still holds
