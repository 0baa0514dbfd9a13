"""The stage engine of `tpulm run`: skip complete stages, resume interrupted ones, and rerun a
stage whose settings changed together with every stage downstream of it (and only those); and
tpulm's stages wired for it."""

from __future__ import annotations

import pytest

from tpulm import config, ownership, pipeline
from tpulm.pipeline import engine
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

        return engine.Stage(name, run, {"value": settings.get(name)}, (str(out),), upstream)

    return [stage("a", ()), stage("b", ("a",)), stage("c", ("b",)), stage("d", ("a",))]


def test_second_run_skips_every_complete_stage(tmp_path):
    calls: list[str] = []
    settings = {"a": 1, "b": 2, "c": 3, "d": 4}
    results = engine.execute(make_stages(tmp_path, settings, calls), str(tmp_path))
    assert calls == ["a", "b", "c", "d"] and results == {n: n for n in "abcd"}
    calls.clear()
    results = engine.execute(make_stages(tmp_path, settings, calls), str(tmp_path))
    assert calls == [] and results == {n: None for n in "abcd"}


def test_interrupted_stage_resumes_without_losing_its_partial_output(tmp_path):
    calls: list[str] = []
    settings = {"a": 1, "b": 2, "c": 3, "d": 4}
    with pytest.raises(Interrupted):
        engine.execute(make_stages(tmp_path, settings, calls, fail_at="b"), str(tmp_path))
    assert calls == ["a", "b"]
    calls.clear()
    engine.execute(make_stages(tmp_path, settings, calls), str(tmp_path))
    assert calls == ["b", "c", "d"]
    # Same settings: the stage resumes over what it had written, nothing is deleted.
    assert (tmp_path / "b" / "partial").read_text() == "half"


def test_changed_setting_reruns_that_stage_and_only_its_downstream(tmp_path):
    calls: list[str] = []
    settings = {"a": 1, "b": 2, "c": 3, "d": 4}
    engine.execute(make_stages(tmp_path, settings, calls), str(tmp_path))
    (tmp_path / "b" / "stale").write_text("old")
    ownership.record(str(tmp_path / "b"), ["stale"], "b")  # as if stage b had written it
    calls.clear()
    settings["b"] = 20
    engine.execute(make_stages(tmp_path, settings, calls), str(tmp_path))
    assert calls == ["b", "c"]  # a and d do not read from b
    assert not (tmp_path / "b" / "stale").exists()  # old outputs removed before the rerun
    assert (tmp_path / "b" / "done").read_text() == "20"
    calls.clear()
    settings["a"] = 10
    engine.execute(make_stages(tmp_path, settings, calls), str(tmp_path))
    assert calls == ["a", "b", "c", "d"]


def test_damaged_stage_record_only_reruns_that_stage(tmp_path):
    calls: list[str] = []
    settings = {"a": 1, "b": 2, "c": 3, "d": 4}
    engine.execute(make_stages(tmp_path, settings, calls), str(tmp_path))
    (tmp_path / engine.STAGES_DIR / "c.json").write_text("{not json")
    calls.clear()
    engine.execute(make_stages(tmp_path, settings, calls), str(tmp_path))
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


def precious_stages(tmp_path, settings: dict, calls: list):
    """a -> t, where t keeps precious outputs (like the train stage) and may continue on "t.steps"."""
    a = make_stages(tmp_path, settings, calls)[0]

    def run():
        calls.append("t")
        (tmp_path / "t").mkdir(exist_ok=True)

    t = engine.Stage("t", run, {"t": {"steps": settings["steps"], "lr": settings["lr"]}},
                       (str(tmp_path / "t"),), ("a",), precious=True,
                       continuable=frozenset({"t.steps"}))
    return [a, t]


def test_precious_stage_continues_on_a_continuable_change_and_keeps_its_outputs(tmp_path, caplog):
    calls: list[str] = []
    settings = {"a": 1, "steps": 10, "lr": 0.1}
    engine.execute(precious_stages(tmp_path, settings, calls), str(tmp_path))
    (tmp_path / "t" / "checkpoint").write_text("step 10")
    ownership.record(str(tmp_path / "t"), ["checkpoint"], "t")  # as if stage t had written it
    settings["steps"] = 20
    caplog.set_level("INFO")
    engine.execute(precious_stages(tmp_path, settings, calls), str(tmp_path))
    assert calls == ["a", "t", "t"]
    assert (tmp_path / "t" / "checkpoint").read_text() == "step 10"  # not removed
    assert "stage t: settings changed (t.steps): continuing" in caplog.text


def test_precious_stage_is_never_removed_without_restart(tmp_path):
    calls: list[str] = []
    settings = {"a": 1, "steps": 10, "lr": 0.1}
    engine.execute(precious_stages(tmp_path, settings, calls), str(tmp_path))
    (tmp_path / "t" / "checkpoint").write_text("step 10")
    ownership.record(str(tmp_path / "t"), ["checkpoint"], "t")  # as if stage t had written it
    for change in ({"lr": 0.2}, {"a": 2}):  # its own setting, or an upstream stage's
        with pytest.raises(TpulmError, match="--restart t"):
            engine.execute(precious_stages(tmp_path, {**settings, **change}, calls), str(tmp_path))
        assert calls == ["a", "t"]  # decided before anything ran: upstream a did not rerun either
        assert (tmp_path / "t" / "checkpoint").exists()
    engine.execute(precious_stages(tmp_path, {**settings, "lr": 0.2}, calls), str(tmp_path),
                     restart=["t"])
    assert calls == ["a", "t", "t"] and not (tmp_path / "t" / "checkpoint").exists()
    with pytest.raises(TpulmError, match="no such stage"):
        engine.execute(precious_stages(tmp_path, settings, calls), str(tmp_path), restart=["x"])


def test_records_hold_settings_and_downstream_says_why_it_reruns(tmp_path, caplog):
    calls: list[str] = []
    settings = {"a": 1, "b": 2, "c": 3, "d": 4}
    engine.execute(make_stages(tmp_path, settings, calls), str(tmp_path))
    assert engine.read_record(str(tmp_path), "b")["settings"] == {"value": 2}
    caplog.set_level("INFO")
    engine.execute(make_stages(tmp_path, {**settings, "b": 5}, calls), str(tmp_path))
    assert "stage b: settings changed (value)" in caplog.text
    assert "stage c: rerun because b changed" in caplog.text
    assert "stage c: settings changed" not in caplog.text


def test_a_typo_in_any_table_stops_before_anything_is_touched(tmp_path):
    kept = tmp_path / "run" / "checkpoints" / "ckpt-000000010"
    kept.mkdir(parents=True)
    engine.write_record(str(tmp_path), "train", "old-key", True)
    for tables, match in (({"model": {"hidden": 3}}, "unknown setting.*hidden"),
                          ({"model": {"num_heads": 5}}, "not divisible"),
                          ({"train": {"max_step": 3}}, "unknown setting.*max_step")):
        with pytest.raises(TpulmError, match=match):
            pipeline.run({"run": {"work_dir": str(tmp_path)}, **tables}, "x.toml")
        assert kept.exists()


def test_a_folder_named_like_a_preset_does_not_hide_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo").mkdir()
    assert config.find_config("demo").endswith("demo.toml")
    (tmp_path / "mine.toml").write_text("[run]\n")
    assert config.find_config("mine.toml") == "mine.toml"


def test_output_folders_holding_user_files_are_refused_before_any_stage_runs(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "mine.txt").write_text("keep")
    calls: list[str] = []
    with pytest.raises(TpulmError, match=r"/b holds files tpulm did not write \(mine.txt\)"):
        engine.execute(make_stages(tmp_path, {"a": 1, "b": 2, "c": 3, "d": 4}, calls), str(tmp_path))
    assert calls == [] and (tmp_path / "b" / "mine.txt").read_text() == "keep"


def test_the_engine_knows_none_of_tpulms_stages():
    """The engine is generic: tpulm's stages are wired in tpulm.pipeline.stages, not in it (it
    uses only files, locks and the record of what tpulm wrote)."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(engine.__file__).read_text(encoding="utf-8"))
    imported = {alias.name if isinstance(node, ast.Import) else f"{node.module}.{alias.name}"
                for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names}
    assert {name for name in imported if name.startswith("tpulm")} == {
        "tpulm.storage", "tpulm.lock", "tpulm.ownership", "tpulm.errors.TpulmError"}
    resolved = pipeline.plan({"run": {"work_dir": "w"}}, "x.toml")
    assert isinstance(resolved, pipeline.RunPlan) and resolved.layout.export == "w/run/export"
    assert all(isinstance(stage, engine.Stage) for stage in resolved.stages)
