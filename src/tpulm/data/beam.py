"""`tpulm data prepare --runner NAME`: the same stage as an Apache Beam pipeline.

The output is byte for byte what the single-machine path (:mod:`tpulm.data.prepare`) writes: the same
token stream, cut into the same blocks and shards, with the same ``manifest.json``. Each split's
samples form one stream (files in sorted order, lines in file order, empty lines dropped unless
``keep_empty``), so only the split's final remainder (< ``max_length`` tokens) is lost, exactly as
on the local path; the packing unit is the split, not a file or a bundle. Per split:

1. ``Create`` the sorted file list, ``Reshuffle`` it across workers; each worker reads a file and
   tokenizes it in batches (the tokenizer is loaded once per worker, in ``DoFn.setup``), emitting
   ``(file index, (samples, offset of the batch in the file's tokens, ids))``.
2. Token counts summed per file go to one small side input (an entry per file), the layout:
   where each file starts in the split's stream.
3. Each batch is cut at shard boundaries (``shard_size * max_length`` tokens) into pieces keyed by
   shard index; ``GroupByKey`` brings a shard's pieces together, which are put in stream order,
   reshaped into blocks and written by :class:`tpulm.data.shards.ShardWriter` (temporary name, then
   renamed into place, so a retried bundle rewrites the same bytes).
4. The shard infos are gathered and the split is ended as on the local path
   (:func:`tpulm.data.preparation.finish_split`): the manifest is written last.

Keys fix every position, so a rerun writes identical shards on any runner. A run that stops
part way leaves ``prepare-progress.json`` (the settings' identity); a rerun checks it and writes
the split again. Beam, the runner and its options come from ``apache-beam``
(``pip install 'tpulm[beam]'``); workers must have tpulm installed (e.g. ``setup_file`` or
``sdk_container_image`` on Dataflow).
"""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np

from tpulm import storage
from tpulm.data import corpus, preparation, shards
from tpulm.data.preparation import PrepareConfig
from tpulm.errors import TpulmError

try:  # optional: this module is imported only for --runner, and says how to install Beam
    import apache_beam as beam
except ImportError:
    beam = None

_DoFn = beam.DoFn if beam is not None else object


def _import_beam():
    if beam is None:
        raise TpulmError(
            "--runner needs Apache Beam: pip install 'tpulm[beam]' (or apache-beam[gcp])"
        )
    return beam


def pipeline_options(cfg: PrepareConfig):
    """Beam ``PipelineOptions`` from ``beam_options`` (``KEY=VALUE`` or ``KEY`` for a flag)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    flags = []
    for option in cfg.beam_options:
        key = option.split("=", 1)[0].lstrip("-")
        if not key or key == "runner":
            raise TpulmError(
                f"beam option {option!r} must look like KEY=VALUE, e.g. project=my-project "
                "(set the runner with --runner)"
            )
        flags.append("--" + option.lstrip("-"))
    options = PipelineOptions(flags)
    _check_known(options)
    return options


def _check_known(options) -> None:
    """Refuse options no Beam component declares: Beam only logs and drops them, so a typo
    (``direct_num_worker=2``) would silently run with the default."""
    beam_log = logging.getLogger("apache_beam.options.pipeline_options")
    level = beam_log.level
    beam_log.setLevel(logging.ERROR)  # its "Discarding unparseable args" warning: said below
    try:
        unknown = sorted(set(options.get_all_options(retain_unknown_options=True))
                         - set(options.get_all_options()))
    finally:
        beam_log.setLevel(level)
    if unknown:
        raise TpulmError(f"unknown --beam-option {', '.join(unknown)}: no Beam pipeline option has "
                         "that name (Beam's PipelineOptions list them, e.g. direct_num_workers=2, "
                         "project=my-project)")


def create_runner(name: str):
    """The Beam runner called ``name`` (``DirectRunner``, ``DataflowRunner`` ... or a class path).

    ``DirectRunner`` is Beam's in-process Python runner (the FnApiRunner): Beam's own
    DirectRunner first tries Prism, which downloads a binary from GitHub, and falls back to that
    same runner; ask for ``PrismRunner`` by name to use Prism.
    """
    _import_beam()
    from apache_beam.runners.runner import create_runner as beam_create_runner

    if name.lower() in ("direct", "directrunner"):
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        return FnApiRunner()
    try:
        return beam_create_runner(name)
    except ValueError:
        raise TpulmError(
            f"unknown Beam runner {name!r}; use DirectRunner, DataflowRunner, FlinkRunner, "
            "SparkRunner, PortableRunner or a PipelineRunner class path"
        ) from None
    except ImportError as err:
        raise TpulmError(f"Beam runner {name} is not installed: {err}") from None


# ---------------------------------------------------------------------------------------------
# Pipeline steps (module level, so every runner can pickle them). They carry no type
# annotations: Beam reads them as type hints and logs every one it cannot resolve.


class _Tokenize(_DoFn):
    """(file index, path) -> per batch (file index, (samples, offset in the file's tokens,
    ids int32 (tokens,)))."""

    def __init__(self, cfg: PrepareConfig, source: corpus.Source):
        super().__init__()
        self.cfg, self.source = cfg, source
        self.tok = None

    def setup(self) -> None:
        self.tok = preparation.packing_tokenizer(self.cfg.tokenizer).tokenizer  # once per worker

    def process(self, element):
        index, path = element
        one_file = dataclasses.replace(self.source, files=(path,))
        batches = corpus.iter_batches(one_file, self.cfg.batch_size, keep_empty=self.cfg.keep_empty)
        offset = 0
        for batch in batches:
            flat, lengths = preparation.flatten(self.tok.encode_batch_fast(batch))
            yield index, (len(lengths), offset, flat.astype(np.int32))
            offset += len(flat)


def _count(element):
    index, (samples, _, ids) = element
    return index, (samples, len(ids))


def _add_pairs(pairs):
    """Sum of (samples, tokens) pairs (a combiner: also applied to partial sums)."""
    samples, tokens = 0, 0
    for a, b in pairs:
        samples, tokens = samples + a, tokens + b
    return samples, tokens


def _layout(counts):
    """Where each file's tokens start in the split's stream, and the split's totals; one entry
    per file, so the side input stays small."""
    offsets, tokens, samples = {}, 0, 0
    for index, (n_samples, n_tokens) in sorted(counts):
        offsets[index] = tokens
        tokens += n_tokens
        samples += n_samples
    return {"offsets": offsets, "tokens": tokens, "samples": samples}


def _cut(element, layout, shard_tokens):
    """A batch's ids -> (shard index, (stream position, ids)) pieces, cut at shard boundaries."""
    index, (_, within, ids) = element
    start = layout["offsets"][index] + within
    pos = 0
    while pos < len(ids):
        shard = (start + pos) // shard_tokens
        end = min(len(ids), (shard + 1) * shard_tokens - start)
        yield shard, (start + pos, ids[pos:end])
        pos = end


class _WriteShard(_DoFn):
    """(shard index, pieces) -> the ShardInfo of the shard written (none for a bare remainder)."""

    def __init__(self, split_dir: str, cfg: PrepareConfig, pad_id: int):
        super().__init__()
        self.split_dir, self.cfg, self.pad_id = split_dir, cfg, pad_id

    def process(self, element):
        index, pieces = element
        stream = np.concatenate([ids for _, ids in sorted(pieces, key=lambda p: p[0])])
        length = self.cfg.max_length
        n = len(stream) // length
        ids = stream[: n * length].astype(np.int64).reshape(n, length)
        mask = np.ones_like(ids)
        rest = stream[n * length :]  # non-empty only in the split's last shard
        if len(rest) and self.cfg.pad_remainder:
            block, block_mask = preparation.pad_block(rest, length, self.pad_id)
            ids, mask = np.concatenate([ids, block]), np.concatenate([mask, block_mask])
        if not len(ids):
            return
        writer = shards.ShardWriter(self.split_dir, self.cfg.shard_size, first_index=index)
        try:
            infos = writer.add(ids, mask)
            last = writer.close()
        except BaseException:
            writer.abort()
            raise
        yield from infos + ([last] if last else [])


def _finish(infos, layout, plan, cfg, vocab_size):
    """End the split as the local path does, or record why it has no manifest (the driver reads
    it back: an exception here would reach it wrapped in the runner's own types)."""
    try:
        preparation.finish_split(plan, cfg, infos, layout["samples"], layout["tokens"], vocab_size)
    except TpulmError as err:
        storage.makedirs(plan.split_dir)
        preparation.write_progress(plan, preparation.Resume(), error=str(err))


# ---------------------------------------------------------------------------------------------
# Building and running the pipeline


def _add_split(pipeline, plan, cfg: PrepareConfig, pad_id: int, vocab_size: int):
    """The steps of one split, labelled ``<split>/...``."""
    label = plan.split
    shard_tokens = cfg.shard_size * cfg.max_length
    tokenized = (
        pipeline
        | f"{label}/files" >> beam.Create(list(enumerate(plan.files)))
        | f"{label}/spread" >> beam.Reshuffle()
        | f"{label}/tokenize" >> beam.ParDo(_Tokenize(cfg, plan.source))
    )
    layout = beam.pvalue.AsSingleton(
        tokenized
        | f"{label}/count" >> beam.Map(_count)
        | f"{label}/count per file" >> beam.CombinePerKey(_add_pairs)
        | f"{label}/gather counts" >> beam.CombineGlobally(beam.combiners.ToListCombineFn())
        | f"{label}/layout" >> beam.Map(_layout)
    )
    infos = (
        tokenized
        | f"{label}/cut" >> beam.FlatMap(_cut, layout, shard_tokens)
        | f"{label}/group by shard" >> beam.GroupByKey()
        | f"{label}/write" >> beam.ParDo(_WriteShard(plan.split_dir, cfg, pad_id))
    )
    _ = (
        infos
        | f"{label}/gather shards" >> beam.CombineGlobally(beam.combiners.ToListCombineFn())
        | f"{label}/manifest" >> beam.Map(_finish, layout, plan, cfg, vocab_size)
    )


def _plans(cfg: PrepareConfig, fp: str) -> list[preparation.SplitPlan]:
    """The plan of every split, checked before anything is written."""
    plans = preparation.plan_splits(cfg, fp)
    if not all(plan.files for plan in plans):
        raise TpulmError(
            "--runner reads input files; for a 🤗 dataset pass its files instead, e.g. "
            "--train-files 'hf://datasets/<name>/<path>/*.parquet'"
        )
    return plans


def _reset(plan) -> bool:
    """Clear a split folder for a fresh run; False when it already holds this exact result."""
    if isinstance(preparation.reopen(plan, resume=False), shards.Manifest):
        return False
    storage.makedirs(plan.split_dir)
    preparation.write_progress(plan, preparation.Resume())
    return True


def _split_result(plan, seconds: float, resumed: int) -> preparation.SplitSummary:
    manifest = shards.read_manifest(plan.split_dir)
    if manifest is None:
        problem = preparation.recorded_error(plan)
        raise TpulmError(problem or f"the Beam pipeline wrote no manifest in {plan.split_dir}")
    added = manifest.stats.get("tokens", 0) if resumed == 0 else 0
    return preparation.summary(plan, manifest, seconds, added, resumed)


def run(cfg: PrepareConfig) -> preparation.PrepareResult:
    """Prepare every split of ``cfg`` with Beam on ``cfg.runner``; waits for the pipeline.

    Raises:
        TpulmError: Beam or the runner is missing, an input is missing or empty, the output holds
            shards of other settings, or the pipeline failed.
    """
    _import_beam()
    runner = create_runner(cfg.runner)
    options = pipeline_options(cfg)
    folder = preparation.packing_tokenizer(cfg.tokenizer)  # checks it before any worker starts
    pad_id, vocab_size = folder.special.pad_id, folder.vocab_size
    plans = _plans(cfg, folder.fingerprint)
    todo = [plan for plan in plans if _reset(plan)]
    start = time.perf_counter()
    if todo:
        pipeline = beam.Pipeline(runner=runner, options=options)
        for plan in todo:
            _add_split(pipeline, plan, cfg, pad_id, vocab_size)
        try:
            pipeline.run().wait_until_finish()
        except TpulmError:
            raise
        except Exception as err:  # noqa: BLE001 - runners wrap worker errors in their own types
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise TpulmError(f"the Beam pipeline on {cfg.runner} failed: {first}") from None
    seconds = time.perf_counter() - start
    pending = {plan.split for plan in todo}
    summaries = {
        plan.split: _split_result(plan, seconds if plan.split in pending else 0.0,
                                  0 if plan.split in pending else -1)
        for plan in plans
    }
    return preparation.PrepareResult(output=cfg.output, splits=summaries)
