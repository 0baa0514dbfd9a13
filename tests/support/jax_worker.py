"""Runs jobs on Keras' JAX backend in a fresh process (the backend is fixed at import).

Usage: ``KERAS_BACKEND=jax python tests/jax_worker.py JOBS.json RESULTS.json``. Each job is a
dict with ``kind``:

* ``train``: ``loop.Trainer(setup.prepare(TrainConfig(**config), model)).fit()``; the result has the
  TrainResult fields, the strategy name, the per-step train losses from ``metrics.jsonl``, and
  for ``shardings`` the partition spec and local shard shape of each listed variable path.
  With ``logits`` (an ``.npz`` of model inputs) it also writes the trained model's logits.
  With ``simulate_hosts: n`` one process stands in for ``n`` hosts: its global batch is made of
  the ``n`` per-host input pipelines' batches, concatenated (what ``n`` JAX processes assemble).
* ``logits``: build the model of ``model_config``, load ``weights`` (safetensors), write the
  logits for ``inputs`` (``.npz``) to ``out`` (``.npy``).

Not a test module: ``tests/support/jax_runs.py`` starts it.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np


def _losses(run_dir: str) -> dict[int, float]:
    from pathlib import Path

    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():  # a process other than 0 writes no shared files
        return {}
    lines = [json.loads(t) for t in path.read_text().splitlines()]
    return {line["step"]: line["loss"] for line in lines if line["split"] == "train"}


def _logits(model, inputs_path: str, out_path: str) -> None:
    with np.load(inputs_path) as batch:
        inputs = {k: batch[k] for k in batch.files}
    np.save(out_path, np.asarray(model(inputs, training=False)))


def _sharding(variable) -> dict:
    value = variable.value
    return {
        "spec": [None if a is None else str(a) for a in getattr(value.sharding, "spec", ())],
        "shard_shape": list(value.addressable_shards[0].data.shape),
        "devices": len(value.sharding.device_set),
    }


class SimulatedHosts:
    """The strategy of ``hosts`` JAX processes, in one: per-host pipelines, batches concatenated."""

    def __init__(self, strategy, hosts: int):
        self.strategy, self.hosts = strategy, hosts

    def __getattr__(self, name):
        return getattr(self.strategy, name)

    def needs_input_pipelines(self) -> bool:
        return True

    def distribute_datasets_from_function(self, dataset_fn):
        import tensorflow as tf

        parts = [dataset_fn(tf.distribute.InputContext(self.hosts, i, self.hosts))
                 for i in range(self.hosts)]
        return tf.data.Dataset.zip(tuple(parts)).map(
            lambda *batches: tf.nest.map_structure(lambda *t: tf.concat(t, 0), *batches))


def train(job: dict) -> dict:
    import keras

    from tpulm.training import loop, setup
    from tpulm.training.config import TrainConfig

    keras.backend.clear_session()  # fresh layer names: checkpoint paths do not depend on history
    prepared = setup.prepare(TrainConfig(**job["config"]), dict(job.get("model", {})))
    if job.get("simulate_hosts"):
        prepared = dataclasses.replace(
            prepared, strategy=SimulatedHosts(prepared.strategy, job["simulate_hosts"]))
    session = loop.Trainer(prepared)
    result = session.fit()
    by_path = {v.path: v for v in list(session.model.weights) + list(session.optimizer.variables)}
    out = {
        **dataclasses.asdict(result),
        "strategy": prepared.strategy.name,
        "replicas": prepared.strategy.num_replicas_in_sync,
        "losses": _losses(result.run_dir),
        "shardings": {p: _sharding(by_path[p]) for p in job.get("shardings", [])},
    }
    if job.get("logits"):
        _logits(session.model, job["logits"]["inputs"], job["logits"]["out"])
    return out


def logits(job: dict) -> dict:
    from tpulm.model import weights
    from tpulm.model.config import ModelConfig
    from tpulm.model.networks import build_model

    model = build_model(ModelConfig(**job["model_config"]), dtype="float32")
    weights.load(model.weights, job["weights"])
    _logits(model, job["inputs"], job["out"])
    return {"out": job["out"]}


def main(jobs_path: str, results_path: str) -> None:
    import keras

    assert keras.backend.backend() == "jax", keras.backend.backend()
    jobs = json.loads(open(jobs_path).read())
    results = [{"train": train, "logits": logits}[job["kind"]](job) for job in jobs]
    with open(results_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
