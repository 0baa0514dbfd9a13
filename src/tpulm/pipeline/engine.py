"""A generic stage engine: stages in order into one work dir, skipped, resumed or rerun by key.

It knows nothing of tpulm's stages (:mod:`tpulm.pipeline.stages` wires those). A stage names the
settings that change its output, the folders it owns and the stages it reads from; its key hashes
its settings and the keys of its upstream stages, and ``WORK/stages/NAME.json`` records the key,
the settings and whether the stage finished.

On a rerun a stage whose record is complete with the same key is skipped; one that was interrupted
runs again with the same key and resumes by itself; a stage whose key changed has its outputs
removed and runs afresh, and so, through the key chain, does every stage downstream of it — and
only those. A ``precious`` stage's outputs are never removed unless the user names it in
``restart``; a change of only its ``continuable`` settings continues from them, any other change
stops before anything is touched.

Outputs are removed only when every file in them is tpulm's (:mod:`tpulm.ownership`: written
by a stage whose outputs lie inside them and unchanged since) and no live process holds them
(:mod:`tpulm.lock`); otherwise the run stops before any stage runs, naming the files, unless
``overwrite``. After a stage finishes, its outputs are recorded as its own, less the files that
were not tpulm's before it ran.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from tpulm import lock, ownership, storage
from tpulm.errors import TpulmError

log = logging.getLogger(__name__)

STAGES_DIR = "stages"  # tpulm.rundir.PIPELINE_RECORDS names it too (who made a run dir)


@dataclasses.dataclass(frozen=True)
class Stage:
    """One step of the pipeline: what it runs, the folder it owns, and what it reads from.

    ``precious`` outputs (a run's checkpoints) are never removed unless the user names the stage
    in ``restart``; a change of only ``continuable`` settings keeps them and the stage continues
    from where it stopped (``tpulm train`` resumes its latest checkpoint).
    """

    name: str
    run: Callable[[], Any]
    settings: Mapping[str, Any]  # everything that changes its output
    outputs: tuple[str, ...]  # removed when the settings change
    upstream: tuple[str, ...] = ()
    precious: bool = False
    continuable: frozenset[str] = frozenset()  # "table.key" settings a rerun can continue with
    files: tuple[str, ...] = ()  # files it writes (and records) inside other stages' outputs


def key_of(settings: Mapping[str, Any], upstream_keys: list[str]) -> str:
    """A stable hash of a stage's settings and the keys of the stages it reads from."""
    text = json.dumps({"settings": settings, "upstream": upstream_keys}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _record_path(work_dir: str, name: str) -> str:
    return storage.join(work_dir, STAGES_DIR, f"{name}.json")


def read_record(work_dir: str, name: str) -> dict[str, Any] | None:
    """The record ``WORK/stages/NAME.json`` of a stage, or None (never ran, or damaged)."""
    path = _record_path(work_dir, name)
    if not storage.exists(path):
        return None
    try:
        return json.loads(storage.read_text(path))
    except ValueError:
        return None  # a damaged record only costs a rerun of its stage


def write_record(work_dir: str, name: str, key: str, complete: bool,
                 settings: Mapping[str, Any] | None = None,
                 upstream: Mapping[str, str] | None = None) -> None:
    """Write ``WORK/stages/NAME.json``: the key, whether done, the settings it ran with, and
    when its first unfinished run started (its files are its own though not recorded yet)."""
    storage.makedirs(storage.join(work_dir, STAGES_DIR))
    old = read_record(work_dir, name) or {}
    record = {"key": key, "complete": complete, "settings": dict(settings or {}),
              "upstream": dict(upstream or {})}
    if not complete:  # a resumed run keeps the first start: the files of every attempt count
        resumed = old.get("key") == key and not old.get("complete") and "started" in old
        record["started"] = old["started"] if resumed else time.time()
    text = json.dumps(record, indent=1, sort_keys=True, default=str)
    storage.write_text(_record_path(work_dir, name), text + "\n")


def changed_settings(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted names of the settings that differ between two (nested) settings mappings."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        names = []
        for key in sorted(set(old) | set(new), key=str):
            names += changed_settings(old.get(key), new.get(key), f"{prefix}{key}.")
        return names
    return [] if old == new else [prefix.rstrip(".")]


@dataclasses.dataclass(frozen=True)
class Decision:
    """What ``execute`` does with one stage, and the log line that says why."""

    action: str  # skip | resume | run | continue | rerun
    reason: str


@dataclasses.dataclass(frozen=True)
class Step:
    """A stage with its key, its upstream stages' keys and the decision taken for it."""

    stage: Stage
    key: str
    upstream: dict[str, str]
    decision: Decision


def decide(stage: Stage, key: str, upstream: dict[str, str], record: dict | None,
           restart: Collection[str]) -> Decision:
    """The decision for one stage from its record and the keys of its upstream stages."""
    if stage.name in restart:
        return Decision("rerun", "restarted (--restart), removing its old outputs")
    if record is None:
        return Decision("run", "running")
    if record.get("key") == key:
        return Decision("skip", "complete, skipped") if record.get("complete") else \
            Decision("resume", "resuming")
    changed = changed_settings(record.get("settings"), stage.settings) if "settings" in record \
        else ["unrecorded settings of an older tpulm"]
    moved = [u for u in stage.upstream if record.get("upstream", {}).get(u) != upstream[u]]
    why = (f"settings changed ({', '.join(changed)})" if changed or not moved
           else f"rerun because {', '.join(moved)} changed")
    if not stage.precious:
        return Decision("rerun", f"{why}, removing its old outputs")
    if not moved and changed and set(changed) <= stage.continuable:
        return Decision("continue", f"{why}: continuing from its outputs")
    blocking = [c for c in changed if c not in stage.continuable] + [f"stage {u}" for u in moved]
    raise TpulmError(
        f"stage {stage.name}: {', '.join(blocking)} changed, so its outputs ({', '.join(stage.outputs)}) "
        f"cannot continue; nothing was touched. Pass --restart {stage.name} to remove them and "
        f"start it over, or undo the change, or use another --work-dir")


def decide_all(stages: list[Stage], work_dir: str, restart: Collection[str] = ()) -> list[Step]:
    """Each stage with its key, upstream keys and :class:`Decision`, decided before anything runs.

    Raises:
        TpulmError: a precious stage would lose its outputs without the user asking.
    """
    names = {stage.name for stage in stages}
    unknown = sorted(set(restart) - names)
    if unknown:
        raise TpulmError(f"--restart {', '.join(unknown)}: no such stage; stages: {', '.join(names)}")
    keys: dict[str, str] = {}
    rerun: set[str] = set()
    steps = []
    for stage in stages:
        upstream = {u: keys[u] for u in stage.upstream}
        key = keys[stage.name] = key_of(stage.settings, list(upstream.values()))
        decision = decide(stage, key, upstream, read_record(work_dir, stage.name), restart)
        fresh = sorted(rerun & set(stage.upstream))  # restarted upstream, same key
        if decision.action == "skip" and fresh:
            decision = (Decision("continue", f"{', '.join(fresh)} reran: continuing from its outputs")
                        if stage.precious else
                        Decision("rerun", f"rerun because {', '.join(fresh)} reran"))
        if decision.action == "rerun":
            rerun.add(stage.name)
        steps.append(Step(stage, key, upstream, decision))
    return steps


def _refuse_foreign_outputs(stages: list[Stage], work_dir: str) -> None:
    """Before anything runs: a stage that never ran in this work dir must find its output folders
    missing or empty; what is there is not tpulm's, and a later change of settings would remove
    it with the stage's outputs."""
    for stage in stages:
        if not storage.exists(_record_path(work_dir, stage.name)):
            for path in stage.outputs:
                storage.check_replaceable(path, overwrite=False, ours=())


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _writers(stage: Stage, stages: list[Stage]) -> set[str]:
    """The stages whose files may go with ``stage``'s outputs: those writing inside them."""
    return {other.name for other in stages
            if any(_inside(o, p) for o in (*other.outputs, *other.files) for p in stage.outputs)}


def _check_outputs(steps: list[Step], work_dir: str, overwrite: bool) -> dict[str, list[str]]:
    """Before anything runs: outputs about to be removed hold only tpulm's files and no live
    process; returns, per stage that runs, the files in its outputs that are not tpulm's (kept
    out of its record).

    Raises:
        TpulmError: a live process holds an output to remove, or (without ``overwrite``) one
            holds files tpulm did not write, all named.
    """
    stages = [step.stage for step in steps]
    kept: dict[str, list[str]] = {}
    doomed: list[str] = []
    for step in steps:
        if step.decision.action == "skip":
            continue
        record = read_record(work_dir, step.stage.name) or {}
        since = None if record.get("complete", True) else record.get("started")
        found = [f for path in step.stage.outputs
                 for f in ownership.foreign(path, _writers(step.stage, stages), since)]
        if step.decision.action == "rerun":
            for path in step.stage.outputs:
                lock.check_free(path)
            doomed += [f for f in found if f not in doomed]
        kept[step.stage.name] = found
    if doomed and not overwrite:
        raise ownership.refuse(doomed, "tpulm run would remove", "pass --overwrite to remove "
                               "them with the stage outputs")
    return kept


def _record_outputs(stage: Stage, stages: list[Stage], kept: list[str]) -> None:
    """Record a finished stage's outputs as its own (other stages' nested outputs apart)."""
    for path in stage.outputs:
        nested = [o for other in stages if other is not stage for o in other.outputs
                  if _inside(o, path) and o != path]
        ownership.snapshot(path, stage.name, skip=nested, keep=kept)


def execute(stages: list[Stage], work_dir: str, restart: Collection[str] = (),
            overwrite: bool = False) -> dict[str, Any]:
    """Run ``stages`` in order, skipping complete ones; returns each stage's result (or None).

    Every decision is taken (and every refusal raised) before the first stage runs or any output
    is removed; each is logged (``stage NAME: why``).

    Args:
        stages: the stages, upstream ones first.
        work_dir: the folder holding ``stages/``, the records.
        restart: names of stages to start over, their outputs removed.
        overwrite: remove outputs of a rerun even where they hold files tpulm did not write.
    """
    steps = decide_all(stages, work_dir, restart)
    _refuse_foreign_outputs(stages, work_dir)
    kept = _check_outputs(steps, work_dir, overwrite)
    results: dict[str, Any] = {}
    for step in steps:
        stage = step.stage
        log.info("stage %s: %s", stage.name, step.decision.reason)
        if step.decision.action == "skip":
            results[stage.name] = None
            continue
        if step.decision.action == "rerun":
            for path in stage.outputs:
                if storage.exists(path):
                    storage.rmtree(path)
        write_record(work_dir, stage.name, step.key, False, stage.settings, step.upstream)
        results[stage.name] = stage.run()
        _record_outputs(stage, stages, kept[stage.name])
        write_record(work_dir, stage.name, step.key, True, stage.settings, step.upstream)
    return results
