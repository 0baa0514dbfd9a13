"""The stage runner of `tpulm run`: skip complete stages, resume interrupted ones, and rerun a
stage whose settings changed together with every stage downstream of it (and only those)."""

from __future__ import annotations

import pytest

from tpulm import config, pipeline
from tpulm.errors import TpulmError


class Interrupted(Exception):
    pass


def make_stages(tmp_path, settings: dict, calls: list, fail_at: str | None = None):
    """Three chained stages a -> b -> c, plus d reading from a only; each writes one file."""

    def stage(name: str, upstream: tuple[str, ...]):
        out = tmp_path / name

        def run():
            calls.append(name)
            if name == fail_at:
                out.mkdir(exist_ok=True)
                (out / "partial").write_text("half")
                raise Interrupted(name)
            out.mkdir(exist_ok=True)
            (out / "done").write_text(str(settings.get(name)))
            return name

        return pipeline.Stage(name, run, {"value": settings.get(name)}, (str(out),), upstream)

    return [stage("a", ()), stage("b", ("a",)), stage("c", ("b",)), stage("d", ("a",))]


def test_second_run_skips_every_complete_stage(tmp_path):
    calls: list[str] = []
    settings = {"a": 1, "b": 2, "c": 3, "d": 4}
    results = pipeline.execute(make_stages(tmp_path, settings, calls), str(tmp_path))
    assert calls == ["a", "b", "c", "d"] and results == {n: n for n in "abcd"}
    calls.clear()
    results = pipeline.execute(make_stages(tmp_path, settings, calls), str(tmp_path))
    assert calls == [] and results == {n: None for n in "abcd"}


def test_interrupted_stage_resumes_without_losing_its_partial_output(tmp_path):
    calls: list[str] = []
    settings = {"a": 1, "b": 2, "c": 3, "d": 4}
    with pytest.raises(Interrupted):
        pipeline.execute(make_stages(tmp_path, settings, calls, fail_at="b"), str(tmp_path))
    assert calls == ["a", "b"]
    calls.clear()
    pipeline.execute(make_stages(tmp_path, settings, calls), str(tmp_path))
    assert calls == ["b", "c", "d"]
    # Same settings: the stage resumes over what it had written, nothing is deleted.
    assert (tmp_path / "b" / "partial").read_text() == "half"


def test_changed_setting_reruns_that_stage_and_only_its_downstream(tmp_path):
    calls: list[str] = []
    settings = {"a": 1, "b": 2, "c": 3, "d": 4}
    pipeline.execute(make_stages(tmp_path, settings, calls), str(tmp_path))
    (tmp_path / "b" / "stale").write_text("old")
    calls.clear()
    settings["b"] = 20
    pipeline.execute(make_stages(tmp_path, settings, calls), str(tmp_path))
    assert calls == ["b", "c"]  # a and d do not read from b
    assert not (tmp_path / "b" / "stale").exists()  # old outputs removed before the rerun
    assert (tmp_path / "b" / "done").read_text() == "20"
    calls.clear()
    settings["a"] = 10
    pipeline.execute(make_stages(tmp_path, settings, calls), str(tmp_path))
    assert calls == ["a", "b", "c", "d"]


def test_damaged_stage_record_only_reruns_that_stage(tmp_path):
    calls: list[str] = []
    settings = {"a": 1, "b": 2, "c": 3, "d": 4}
    pipeline.execute(make_stages(tmp_path, settings, calls), str(tmp_path))
    (tmp_path / pipeline.STAGES_DIR / "c.json").write_text("{not json")
    calls.clear()
    pipeline.execute(make_stages(tmp_path, settings, calls), str(tmp_path))
    assert calls == ["c"]


def test_overrides_are_read_as_toml_values():
    tables = config.apply_overrides(
        {"train": {"max_steps": 10}},
        ["train.max_steps=50", "run.work_dir=out/x", 'run.fill_mask=["a [MASK]."]', "train.x=true"],
    )
    assert tables == {"train": {"max_steps": 50, "x": True},
                      "run": {"work_dir": "out/x", "fill_mask": ["a [MASK]."]}}
    with pytest.raises(TpulmError, match="TABLE.KEY=VALUE"):
        config.apply_overrides({}, ["max_steps=3"])


def test_unknown_table_is_an_error(tmp_path):
    with pytest.raises(TpulmError, match="unknown table.*trian"):
        pipeline.plan({"trian": {}}, "x.toml")


def test_shipped_configs_are_found_by_name():
    assert config.find_config("tiny").endswith("tiny.toml")
    with pytest.raises(TpulmError, match="neither a file nor a preset"):
        config.find_config("no-such-preset")


def test_output_folders_holding_user_files_are_refused_before_any_stage_runs(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "mine.txt").write_text("keep")
    calls: list[str] = []
    with pytest.raises(TpulmError, match=r"/b holds files tpulm did not write \(mine.txt\)"):
        pipeline.execute(make_stages(tmp_path, {"a": 1, "b": 2, "c": 3, "d": 4}, calls), str(tmp_path))
    assert calls == [] and (tmp_path / "b" / "mine.txt").read_text() == "keep"
