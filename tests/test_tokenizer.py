"""Tokenizer training: the reference Unigram recipe exactly, AutoTokenizer parity, other models."""

from __future__ import annotations

import hashlib
import json

import pytest

from tpulm import cli, storage
from tpulm.data import tokenizer
from tpulm.data.tokenizer import TokenizerConfig
from tpulm.errors import TpulmError

SPECIALS = ["[CLS]", "[SEP]", "<unk>", "<pad>", "[MASK]"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, wikitext_dir):
    """A Unigram tokenizer trained by tpulm on WikiText-2 valid, and its result."""
    out = str(tmp_path_factory.mktemp("tok") / "unigram")
    cfg = TokenizerConfig(inputs=(str(wikitext_dir / "valid.txt"),), output=out, vocab_size=6000)
    return cfg, tokenizer.run(cfg)


def reference_tokenizer(lines: list[str], vocab_size: int):
    """The reference recipe's train_unigram.py, statement for statement."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.Replace("``", '"'), normalizers.Replace("''", '"')])
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(unk_token="<unk>", special_tokens=SPECIALS, vocab_size=vocab_size)
    tok.train_from_iterator((lines[i : i + 1000] for i in range(0, len(lines), 1000)), trainer=trainer)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    tok.decoder = decoders.Metaspace()
    return tok


def nonempty_lines(path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def test_unigram_is_the_reference_recipe(trained, wikitext_dir):
    cfg, result = trained
    ours = json.loads(storage.read_text(f"{cfg.output}/tokenizer.json"))
    ref = json.loads(reference_tokenizer(nonempty_lines(wikitext_dir / "valid.txt"), 6000).to_str())
    ours_model, ref_model = ours.pop("model"), ref.pop("model")
    # One deliberate difference: [MASK] strips the space before it (lstrip, as roberta-base's
    # <mask>), so "an [MASK] of" does not encode a lone "▁" before the mask.
    ref["added_tokens"][4]["lstrip"] = True
    # And a second: Metaspace prepends "▁" only at the start of the text ("first", as current
    # Transformers tokenizers), not after every special token, so "[MASK]." has no lone "▁".
    ref["pre_tokenizer"]["prepend_scheme"] = ref["decoder"]["prepend_scheme"] = "first"
    assert ours == ref  # normalizer, pre-tokenizer, decoder, post-processor, added tokens
    # The Unigram trainer's parallel EM is not bit-reproducible (the reference's own reruns differ
    # in the last digits of the scores), so pieces must match and scores agree closely.
    assert {k: v for k, v in ours_model.items() if k != "vocab"} == {
        k: v for k, v in ref_model.items() if k != "vocab"
    }
    ours_vocab, ref_vocab = dict(map(tuple, ours_model["vocab"])), dict(map(tuple, ref_model["vocab"]))
    assert ours_vocab.keys() == ref_vocab.keys()
    assert max(abs(ours_vocab[k] - ref_vocab[k]) for k in ref_vocab) < 1e-2
    ours["model"] = ours_model
    assert [t["content"] for t in ours["added_tokens"]] == SPECIALS
    assert [t["id"] for t in ours["added_tokens"]] == [0, 1, 2, 3, 4]
    assert result.vocab_size == len(ours["model"]["vocab"]) > 5000
    assert result.samples == len(nonempty_lines(wikitext_dir / "valid.txt"))
    specials = tokenizer.special_tokens(cfg.output)
    assert specials.ids == (0, 1, 2, 3, 4)


def test_fingerprint_and_unk_rate(trained, wikitext_dir):
    cfg, result = trained
    digest = hashlib.sha256((storage.read_bytes(f"{cfg.output}/tokenizer.json"))).hexdigest()
    assert result.fingerprint == tokenizer.fingerprint(cfg.output) == digest
    tok = tokenizer.load_tokenizer(cfg.output)
    ids = [i for line in nonempty_lines(wikitext_dir / "valid.txt") for i in tok.encode(line, add_special_tokens=False).ids]
    # WikiText writes rare words as the literal "<unk>", which matches the special token.
    assert result.unk_rate == pytest.approx(ids.count(2) / len(ids), abs=0)
    assert 0 < result.unk_rate < 0.1
    literal = sum(line.count("<unk>") for line in nonempty_lines(wikitext_dir / "valid.txt"))
    assert result.unk_literals == literal > 0
    assert "the corpus itself contains the unknown token's text" in result.describe()


def test_a_vocabulary_smaller_than_asked_for_is_reported(tmp_path, wikitext_dir, capsys):
    lines = nonempty_lines(wikitext_dir / "valid.txt")[:40]
    (tmp_path / "small.txt").write_text("\n".join(lines), encoding="utf-8")
    out = str(tmp_path / "tok")
    assert cli.main(["tokenizer", "train", str(tmp_path / "small.txt"), "--vocab-size", "32000",
                     "--output", out]) == 0
    printed = capsys.readouterr().out
    obtained = tokenizer.open_folder(out).vocab_size
    assert obtained < 32000
    assert f"asked for a vocabulary of 32000, got {obtained}: the corpus supports only {obtained}" in printed
    assert "\n\n" not in printed and not printed.startswith("\n")  # no stray empty lines


PUNCTUATED = ["Goal of my life is to [MASK].", "The [MASK], he said [MASK]!", "It was [MASK]?"]


def test_a_mask_before_punctuation_leaves_no_lone_space_piece(trained):
    from transformers import AutoTokenizer

    cfg, _ = trained
    hf = AutoTokenizer.from_pretrained(cfg.output)
    for text in PUNCTUATED:
        pieces = hf.convert_ids_to_tokens(hf(text)["input_ids"])
        after = [pieces[i + 1] for i, p in enumerate(pieces) if p == "[MASK]"]
        assert all(p != "\u2581" and not p.startswith("\u2581") for p in after), pieces
        assert pieces[1].startswith("\u2581")  # the text's first word still gets its "▁"
    for text in ["Goal of my life is to live.", "Hello world. A new line, and more!"]:
        assert hf.decode(hf(text)["input_ids"], skip_special_tokens=True) == text


def test_tokenizers_of_older_versions_keep_their_encoding(tmp_path, trained):
    cfg, _ = trained
    old = json.loads(storage.read_text(f"{cfg.output}/tokenizer.json"))
    old["pre_tokenizer"]["prepend_scheme"] = old["decoder"]["prepend_scheme"] = "always"
    folder = tmp_path / "old"
    folder.mkdir()
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).write_text(storage.read_text(f"{cfg.output}/{name}"))
    (folder / "tokenizer.json").write_text(json.dumps(old))
    loaded = tokenizer.open_folder(str(folder)).tokenizer
    assert loaded.encode("to [MASK].", add_special_tokens=False).tokens[-2:] == ["\u2581", "."]


def test_autotokenizer_loads_and_encodes_identically(trained, wikitext_dir):
    from transformers import AutoTokenizer

    cfg, _ = trained
    hf = AutoTokenizer.from_pretrained(cfg.output)
    tok = tokenizer.load_tokenizer(cfg.output)
    assert (hf.cls_token, hf.sep_token, hf.unk_token, hf.pad_token, hf.mask_token) == tuple(SPECIALS)
    assert (hf.cls_token_id, hf.sep_token_id, hf.unk_token_id, hf.pad_token_id, hf.mask_token_id) == (0, 1, 2, 3, 4)
    assert hf.model_max_length == 512
    lines = nonempty_lines(wikitext_dir / "test.txt")[:300] + ["``Quoted'' text", "Goal of my life is to [MASK]."]
    for line in lines:
        ids = tok.encode(line).ids
        assert hf(line)["input_ids"] == ids
        assert hf.decode(ids) == tok.decode(ids, skip_special_tokens=False)
    pair = hf("first part", "second part")["input_ids"]
    assert pair == tok.encode("first part", "second part").ids
    assert pair[0] == 0 and pair.count(1) == 2


@pytest.mark.parametrize(
    "model, specials",
    [("bpe", ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]), ("wordpiece", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])],
)
def test_other_models_with_matching_special_tokens(tmp_path, wikitext_dir, model, specials):
    from transformers import AutoTokenizer

    out = str(tmp_path / model)
    cfg = TokenizerConfig(inputs=(str(wikitext_dir / "valid.txt"),), output=out, model=model, vocab_size=3000)
    result = tokenizer.run(cfg)
    assert 2000 < result.vocab_size <= 3000
    tok = tokenizer.load_tokenizer(out)
    assert [tok.id_to_token(i) for i in range(5)] == specials
    hf = AutoTokenizer.from_pretrained(out)
    s = tokenizer.special_tokens(out)
    assert (hf.cls_token_id, hf.sep_token_id, hf.unk_token_id, hf.pad_token_id, hf.mask_token_id) == s.ids
    line = nonempty_lines(wikitext_dir / "test.txt")[5]
    ids = tok.encode(line).ids
    assert ids[0] == s.cls_id and ids[-1] == s.sep_id
    assert hf(line)["input_ids"] == ids
    if model == "bpe":  # byte-level: lossless round trip (WikiText's literal "<unk>" included)
        assert tok.decode(ids, skip_special_tokens=False) == f"<s>{line}</s>"


def test_existing_output_refused_then_overwritten(trained, tmp_path, wikitext_dir):
    cfg, _ = trained
    out = str(tmp_path / "tok")
    small = TokenizerConfig(inputs=(str(wikitext_dir / "valid.txt"),), output=out, vocab_size=500, unk_rate_samples=10)
    first = tokenizer.run(small)
    with pytest.raises(TpulmError, match=r"already holds a tokenizer; .*--overwrite"):
        tokenizer.run(small)
    bigger = tokenizer.run(TokenizerConfig(**{**small.__dict__, "vocab_size": 800, "overwrite": True}))
    assert bigger.fingerprint != first.fingerprint and bigger.vocab_size == 800
    assert sorted(storage.listdir(str(tmp_path))) == ["tok"]  # no temporary folder left


def test_ram_output(wikitext_dir):
    out = "ram://tpulm-test-tokenizer/tok"
    cfg = TokenizerConfig(inputs=(str(wikitext_dir / "valid.txt"),), output=out, vocab_size=500, unk_rate_samples=10)
    result = tokenizer.run(cfg)
    assert tokenizer.load_tokenizer(out).get_vocab_size() == result.vocab_size
    assert tokenizer.special_tokens(out).mask_id == 4
    assert sorted(storage.listdir(out)) == [storage.WRITTEN_RECORD, "special_tokens_map.json",
                                            "tokenizer.json", "tokenizer_config.json"]


def test_bad_inputs_write_nothing(tmp_path):
    out = tmp_path / "tok"
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n\n", encoding="utf-8")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n\xe2\x28\xa1 broken\n")
    cases = [
        (str(tmp_path / "missing.txt"), r"missing.txt matches no file"),
        (str(empty), r"the corpus is empty: no \(non-empty\) samples in .*empty.txt"),
        (str(bad), r"bad.txt is not valid UTF-8 at byte 5"),
    ]
    for path, message in cases:
        with pytest.raises(TpulmError, match=message):
            tokenizer.run(TokenizerConfig(inputs=(path,), output=str(out), vocab_size=100))
        assert not out.exists()
    with pytest.raises(TpulmError, match="no corpus given"):
        tokenizer.run(TokenizerConfig(output=str(out)))
    with pytest.raises(TpulmError, match="unknown tokenizer model 'bert'"):
        TokenizerConfig(model="bert")


def test_cli_config_file_and_flags(tmp_path, wikitext_dir, capsys):
    config_file = tmp_path / "c.toml"
    config_file.write_text(
        f'[tokenizer]\ninputs = ["{wikitext_dir / "valid.txt"}"]\nvocab_size = 700\n'
        f'output = "{tmp_path / "from-toml"}"\nunk_rate_samples = 50\n',
        encoding="utf-8",
    )
    out = tmp_path / "from-flag"
    assert cli.main(["tokenizer", "train", "--config", str(config_file), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"tokenizer saved to {out}: vocab size 700" in printed and "<unk> rate" in printed
    assert not (tmp_path / "from-toml").exists()
    assert cli.main(["tokenizer", "train", str(wikitext_dir / "nope.txt"), "--output", str(out)]) == 2
    assert "nope.txt matches no file" in capsys.readouterr().err


def test_mask_token_takes_the_place_of_a_word(trained):
    cfg, _ = trained
    tok = tokenizer.load_tokenizer(cfg.output)
    masked = tok.encode("Return an [MASK] of the class.").tokens
    plain = tok.encode("Return an instance of the class.").tokens
    at = masked.index("[MASK]") if "[MASK]" in masked else masked.index(" [MASK]")
    assert masked[at - 1] == "▁an" and masked[at + 1] == "▁of"  # no lone "▁" before the mask
    assert masked[:at] == plain[:at]  # the words around the mask encode as without it
    assert masked[at + 1 :] == plain[len(plain) - len(masked) + at + 1 :]


def test_vocabulary_smaller_than_the_alphabet_is_explained(tmp_path, wikitext_dir):
    text = tmp_path / "small.txt"
    text.write_text("\n".join(nonempty_lines(wikitext_dir / "valid.txt")[:50]), encoding="utf-8")
    out = tmp_path / "tok"
    with pytest.raises(TpulmError, match=r"--vocab-size 10 is smaller than the corpus's alphabet"):
        tokenizer.run(TokenizerConfig(inputs=(str(text),), output=str(out), vocab_size=10))
    assert not out.exists()


@pytest.mark.parametrize("model", ["bpe", "wordpiece"])
def test_other_models_report_a_vocabulary_shortfall_as_unigram(tmp_path, wikitext_dir, capsys, model):
    lines = nonempty_lines(wikitext_dir / "valid.txt")[:40]
    (tmp_path / "small.txt").write_text("\n".join(lines), encoding="utf-8")
    out = str(tmp_path / "tok")
    assert cli.main(["tokenizer", "train", str(tmp_path / "small.txt"), "--vocab-size", "32000",
                     "--model", model, "--output", out]) == 0
    obtained = tokenizer.open_folder(out).vocab_size
    assert obtained < 32000
    assert (f"note: asked for a vocabulary of 32000, got {obtained}: the corpus supports only "
            f"{obtained} tokens") in capsys.readouterr().out


def test_unigram_training_gives_the_same_file_every_time(tmp_path, wikitext_dir):
    """The Rust trainer's hash-map order used to leak into the scores and the order of the
    coverage characters: three runs, three files, three fingerprints."""
    lines = (wikitext_dir / "valid.txt").read_text(encoding="utf-8").splitlines()[:1200]
    (tmp_path / "corpus.txt").write_text("\n".join(lines), encoding="utf-8")
    cfg = TokenizerConfig(inputs=(str(tmp_path / "corpus.txt"),), vocab_size=500)
    files = [tokenizer.train(cfg)[0].to_str() for _ in range(2)]  # differed 3 times out of 3
    assert files[0] == files[1]
    vocab = json.loads(files[0])["model"]["vocab"]
    scores = [score for _, score in vocab[5:]]
    assert scores == sorted(scores, reverse=True)  # still ordered by score: ids follow frequency
    assert [piece for piece, _ in vocab[:5]] == ["[CLS]", "[SEP]", "<unk>", "<pad>", "[MASK]"]
