"""Corpus streaming: text/JSON Lines/Parquet readers, UTF-8 errors, empty lines, resume offsets."""

from __future__ import annotations

import json

import pytest

from tpulm.data import corpus
from tpulm.data.corpus import Source
from tpulm.errors import TpulmError


def batches(source: Source, size: int = 3, **kwargs) -> list[list[str]]:
    return list(corpus.iter_batches(source, size, **kwargs))


def test_text_lines_across_chunk_boundaries(tmp_path, monkeypatch, wikitext_dir):
    """Tiny read chunks must give exactly str.split('\\n') of the file, CRLF and all."""
    text = (wikitext_dir / "valid.txt").read_bytes()
    raw = text[: text.index(b"\n", 20000) + 1] + b"\xc3\xa9 crlf line\r\nlast"
    path = tmp_path / "a.txt"
    path.write_bytes(raw)
    monkeypatch.setattr(corpus, "CHUNK_BYTES", 7)
    lines = list(corpus.iter_samples(Source(files=(str(path),))))
    expected = [line.removesuffix("\r") for line in raw.decode("utf-8").split("\n")]
    assert lines == expected
    assert lines[-2:] == ["é crlf line", "last"]


def test_empty_lines_skipped_by_default_and_kept_on_request(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("one\n \n\ntwo\n\t\nthree\nfour\n", encoding="utf-8")
    source = Source(files=(str(path),))
    assert batches(source) == [["one", "two", "three"], ["four"]]
    assert batches(source, keep_empty=True) == [["one", " ", ""], ["two", "\t", "three"], ["four"]]
    assert batches(source, start=2) == [["three", "four"]]


def test_globs_sorted_and_files_in_order(tmp_path):
    for name, text in [("b.txt", "b1\nb2\n"), ("a.txt", "a1\n")]:
        (tmp_path / name).write_text(text, encoding="utf-8")
    source = Source(files=(str(tmp_path / "*.txt"),))
    assert list(corpus.iter_samples(source)) == ["a1", "b1", "b2"]


def test_jsonl_text_field(tmp_path):
    path = tmp_path / "a.jsonl"
    rows = [{"content": "first", "id": 1}, {"content": "second\nline", "id": 2}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    source = Source(files=(str(path),), text_field="content")
    assert list(corpus.iter_samples(source)) == ["first", "second\nline"]
    with pytest.raises(TpulmError, match=r"a.jsonl line 1 has no field 'text'.*--text-field"):
        list(corpus.iter_samples(Source(files=(str(path),))))
    path.write_text('{"content": "ok"}\n{broken\n', encoding="utf-8")
    with pytest.raises(TpulmError, match=r"a.jsonl line 2 is not valid JSON"):
        list(corpus.iter_samples(source))


def test_parquet_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [f"sample {i} é" for i in range(20000)]
    pq.write_table(pa.table({"body": texts, "n": list(range(20000))}), tmp_path / "a.parquet")
    source = Source(files=(str(tmp_path / "a.parquet"),), text_field="body")
    assert list(corpus.iter_samples(source)) == texts
    with pytest.raises(TpulmError, match=r"no column 'text' \(columns: body, n\)"):
        list(corpus.iter_samples(Source(files=(str(tmp_path / "a.parquet"),))))


def test_invalid_utf8_names_file_and_byte_offset(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "CHUNK_BYTES", 5)  # the bad byte lies in a later chunk
    path = tmp_path / "bad.txt"
    path.write_bytes(b"good line\nstill good\nbad \xff here\n")
    with pytest.raises(TpulmError, match=r"bad.txt is not valid UTF-8 at byte 25 .*--encoding-errors replace"):
        list(corpus.iter_samples(Source(files=(str(path),))))
    replaced = list(corpus.iter_samples(Source(files=(str(path),), encoding_errors="replace")))
    assert replaced == ["good line", "still good", "bad \ufffd here"]


def test_missing_inputs_and_bad_sources(tmp_path):
    with pytest.raises(TpulmError, match=r"nope.txt matches no file"):
        list(corpus.iter_samples(Source(files=(str(tmp_path / "nope.txt"),))))
    with pytest.raises(TpulmError, match=r"\*.txt matches no file"):
        corpus.resolve_files((str(tmp_path / "*.txt"),))
    with pytest.raises(TpulmError, match="either input files or a 🤗 dataset"):
        Source()
    with pytest.raises(TpulmError, match="encoding_errors must be one of strict, replace"):
        Source(files=("a",), encoding_errors="ignore")


def test_hub_dataset_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = Source(dataset="tpulm-no-such-user/no-such-dataset", split="train")
    with pytest.raises(TpulmError, match=r"cannot stream 🤗 dataset tpulm-no-such-user/no-such-dataset/train: .*input files"):
        list(corpus.iter_samples(source))


def test_very_long_lines_are_cut_into_bounded_samples(tmp_path, wikitext_dir):
    words = (wikitext_dir / "valid.txt").read_text(encoding="utf-8").replace("\n", " ").split()
    long_line = " ".join(words)[: 3 * corpus.MAX_SAMPLE_CHARS + 5]
    (tmp_path / "a.txt").write_text(f"short\n{long_line}\nx{'y' * corpus.MAX_SAMPLE_CHARS}\n",
                                    encoding="utf-8")
    samples = [s for b in corpus.iter_batches(Source(files=(str(tmp_path / "a.txt"),)), 100) for s in b]
    assert samples[0] == "short"
    pieces = samples[1:5]
    assert "".join(pieces) == long_line and len(pieces) == 4
    assert all(len(p) <= corpus.MAX_SAMPLE_CHARS and p.endswith(" ") for p in pieces[:-1])  # whole words
    assert samples[5:] == ["x" + "y" * (corpus.MAX_SAMPLE_CHARS - 1), "y"]  # no space: a hard cut
