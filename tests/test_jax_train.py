"""Training on Keras' JAX backend, in subprocesses with 4 virtual CPU devices (see support/jax_runs.py).

* 1 device, 4-way DataParallel and a 2x2 (data, model) mesh give the same losses and weights.
* The same weights give the same logits on TensorFlow and JAX.
* Checkpoints cross backends: TF -> JAX and JAX -> TF resumes end where uninterrupted runs do,
  and a JAX-trained run exports a Transformers checkpoint with the JAX model's logits.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
from support.jax_runs import (
    DEVICES,
    SRC,
    corpus,
    finish_jax,
    free_port,
    run_jax,
    start_jax,
    train_config,
)

from tpulm import rundir
from tpulm.model import weights
from tpulm.model.config import ModelConfig

# fp32 on CPU: other device counts and process counts change only the order of reductions.
from tpulm.model.networks import build_model

# fp32 on CPU: other device counts and process counts change only the order of reductions.
# After 4 AdamW steps (lr 1e-3) the weights differ by at most 3.5e-7 (measured over several runs,
# usually ~1e-7); bounds leave >5x.
MESH_LOSS_RTOL = 2e-6
MESH_WEIGHT_ATOL = 2e-6
# Across backends the kernels differ (oneDNN/Eigen vs XLA CPU): a run resumed on the other
# backend ends within ~1.3e-7 of the uninterrupted one (measured, weights and AdamW moments).
RESUME_LOSS_RTOL = 1e-6
RESUME_WEIGHT_ATOL = 1e-6
LOGITS_ATOL = 1e-5
EXPORT_ATOL = 1e-4  # PyTorch vs JAX kernels, as tests/test_hf.py
ONE_LAYER = {"num_layers": 1}  # the tiny preset with one block: compilation dominates these runs
NO_DROPOUT = {**ONE_LAYER, "hidden_dropout": 0.0, "attention_dropout": 0.0}  # backends' RNGs differ


@pytest.fixture(scope="module")
def data(tmp_path_factory, wikitext_dir):
    return corpus(tmp_path_factory.mktemp("jax_corpus"), wikitext_dir)


def _batch(path, vocab: int, pad: int, with_positions: bool):
    """3 sequences of 24 tokens, the last two padded; masked positions (3, 4) if asked."""
    rng = np.random.default_rng(7)
    ids = rng.integers(5, vocab, size=(3, 24)).astype(np.int32)
    mask = np.ones_like(ids)
    for row, length in ((1, 17), (2, 9)):
        ids[row, length:], mask[row, length:] = pad, 0
    batch = {"input_ids": ids, "attention_mask": mask}
    if with_positions:
        batch["masked_positions"] = np.array([[1, 5, 9, 23], [0, 2, 16, 3], [8, 1, 4, 7]], np.int32)
    np.savez(path, **batch)
    return batch


def _checkpoint(run_dir, step: int) -> dict[str, dict[str, np.ndarray]]:
    folder = rundir.checkpoint_dir(str(run_dir), step)
    return {name: weights.read(os.path.join(folder, name))
            for name in (rundir.MODEL_WEIGHTS, rundir.OPTIMIZER_WEIGHTS)}


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64))))
               for k in a if a[k].dtype.kind == "f")


def _assert_same_checkpoint(got: dict, want: dict, atol: float) -> None:
    for name in want:
        print(f"max |difference| {name}: {_max_diff(got[name], want[name]):.2e}")
        assert _max_diff(got[name], want[name]) <= atol, name
        for key in want[name]:
            if want[name][key].dtype.kind != "f":  # step counter: exact
                np.testing.assert_array_equal(got[name][key], want[name][key], err_msg=key)


def _train_tf(cfg: dict, model_table: dict) -> None:
    from tpulm import training

    keras.backend.clear_session()
    training.run(training.TrainConfig(**cfg), model_table)


def _losses(run_dir) -> dict[int, float]:
    import json

    lines = [json.loads(t) for t in (run_dir / rundir.METRICS_NAME).read_text().splitlines()]
    return {x["step"]: x["loss"] for x in lines if x["split"] == "train"}


QUERY, WORD = "roberta_mlm/layer_0/query/kernel", "roberta_mlm/embeddings/word_embeddings/embeddings"
WATCHED = [QUERY, WORD, "roberta_mlm/layer_0/output/kernel", "roberta_mlm/layer_0/intermediate/kernel",
           "roberta_mlm/embeddings/layer_norm/gamma"]
LAYOUTS = {"one": ("data=1,model=1", 8), "dp": (None, 2), "mesh": ("data=2,model=2", 4)}


@pytest.fixture(scope="module")
def distributed(tmp_path_factory, data):
    """4-step runs, global batch 8, dropout on: 1 device, 4-way DataParallel, a 2x2 mesh and one
    process simulating 2 hosts (one 4-device worker), next to 2 real JAX processes x 2 devices
    (jax.distributed, gloo collectives on CPU) on a 2x2 mesh (a model replica per host), all
    started at once."""
    root = tmp_path_factory.mktemp("distributed")
    quick = dict(max_steps=4, checkpoint_every=4)
    cluster = {"JAX_COORDINATOR_ADDRESS": f"localhost:{free_port()}", "JAX_NUM_PROCESSES": "2"}
    hosts = [
        start_jax([{"kind": "train", "shardings": [QUERY], "model": ONE_LAYER,
                    "config": train_config(data, root / f"host{i}", mesh="data=2,model=2", batch_size=4,
                                           **quick)}],
                  root / f"work{i}", devices=2, env={**cluster, "JAX_PROCESS_ID": str(i)})
        for i in range(2)
    ]
    jobs = [{"kind": "train", "shardings": WATCHED, "model": ONE_LAYER,
             "config": train_config(data, root / name, mesh=mesh, batch_size=batch, **quick)}
            for name, (mesh, batch) in LAYOUTS.items()]
    jobs.append({"kind": "train", "simulate_hosts": 2, "model": ONE_LAYER,
                 "config": train_config(data, root / "two_hosts", batch_size=2, **quick)})
    one, dp, mesh, two_hosts = run_jax(jobs, root / "work")
    host0, host1 = (finish_jax(h)[0] for h in hosts)
    return {"root": root, "one": one, "dp": dp, "mesh": mesh, "two_hosts": two_hosts,
            "host0": host0, "host1": host1}


def test_one_device_data_parallel_and_mesh_train_alike(distributed):
    """Same global batch: losses and final weights agree; the mesh shards the large weights."""
    one, dp, mesh, root = distributed["one"], distributed["dp"], distributed["mesh"], distributed["root"]
    assert [r["replicas"] for r in (one, dp, mesh)] == [1, DEVICES, 2]
    assert [r["strategy"] for r in (one, dp, mesh)] == [
        "jax_single_device", "jax_data_parallel", "jax_model_parallel"]
    assert sorted(one["losses"]) == [1, 2, 3, 4]
    for name in ("dp", "mesh"):
        np.testing.assert_allclose([distributed[name]["losses"][s] for s in range(1, 5)],
                                   [one["losses"][s] for s in range(1, 5)], rtol=MESH_LOSS_RTOL, atol=0)
        _assert_same_checkpoint(_checkpoint(root / name, 4), _checkpoint(root / "one", 4), MESH_WEIGHT_ATOL)
    assert one["losses"][4] < one["losses"][1]  # it learns
    shards = mesh["shardings"]
    assert shards[QUERY] == {"spec": [None, "model"], "shard_shape": [64, 32], "devices": 4}
    assert shards[WORD] == {"spec": ["model", None], "shard_shape": [250, 64], "devices": 4}
    assert shards["roberta_mlm/layer_0/output/kernel"]["shard_shape"] == [64, 64]  # (128, 64) by row
    assert shards["roberta_mlm/layer_0/intermediate/kernel"]["shard_shape"] == [64, 64]  # by column
    assert shards["roberta_mlm/embeddings/layer_norm/gamma"]["shard_shape"] == [64]  # replicated
    assert dp["shardings"][QUERY]["shard_shape"] == [64, 64]  # data parallel: replicas


def test_two_processes_each_read_their_own_files(distributed):
    """Each host reads its shard files (3 shards: host 0 files 0 and 2, host 1 file 1) and half of
    the global batch; the run (2x2 mesh, weights split over each host's 2 devices) matches one
    process whose batches are the two hosts' pipelines concatenated (and differs from reading all
    files in one pipeline)."""
    host0, host1, want = distributed["host0"], distributed["host1"], distributed["two_hosts"]
    assert host0["replicas"] == host1["replicas"] == 2 and want["replicas"] == DEVICES
    assert host0["shardings"][QUERY] == {"spec": [None, "model"], "shard_shape": [64, 32], "devices": 4}
    assert sorted(host0["losses"]) == [1, 2, 3, 4]
    assert host1["losses"] == {} and host1["step"] == 4  # process 1 trained but wrote nothing:
    assert not (distributed["root"] / "host1").exists()  # only process 0 writes the run dir
    np.testing.assert_allclose([host0["losses"][s] for s in range(1, 5)], [want["losses"][s] for s in range(1, 5)],
                               rtol=MESH_LOSS_RTOL, atol=0)
    assert abs(host0["losses"][1] - distributed["dp"]["losses"][1]) > 1e-4  # other batches
    root = distributed["root"]
    _assert_same_checkpoint(_checkpoint(root / "host0", 4), _checkpoint(root / "two_hosts", 4), MESH_WEIGHT_ATOL)


def test_same_weights_give_the_same_logits_on_both_backends(tmp_path):
    cfg = ModelConfig(vocab_size=500, hidden_size=64, num_layers=2, num_heads=2,
                      intermediate_size=128, max_position_embeddings=40, pad_token_id=3)
    model = build_model(cfg, dtype="float32")
    rng = np.random.default_rng(3)
    for v in model.weights:  # non-trivial LayerNorms and biases too
        v.assign(rng.normal(0.0, 0.1, size=v.shape).astype(np.float32) + (1.0 if "gamma" in v.path else 0.0))
    weights.save(model.weights, str(tmp_path / "w.safetensors"))
    jobs, want = [], []
    for with_positions in (False, True):
        inputs = tmp_path / f"inputs_{with_positions}.npz"
        batch = _batch(inputs, cfg.vocab_size, cfg.pad_token_id, with_positions)
        want.append(np.asarray(model(batch, training=False)))
        jobs.append({"kind": "logits", "model_config": dict(vars(cfg)), "weights": str(tmp_path / "w.safetensors"),
                     "inputs": str(inputs), "out": str(tmp_path / f"jax_{with_positions}.npy")})
    run_jax(jobs, tmp_path / "work")
    for job, expected in zip(jobs, want):
        got = np.load(job["out"])
        assert got.shape == expected.shape and np.abs(expected).max() > 1.0
        np.testing.assert_allclose(got, expected, atol=LOGITS_ATOL, rtol=0)


def _start_cli_jax(cfg: dict, work) -> subprocess.Popen:
    """Start ``python -m tpulm train --config F ...`` (F: ``[train] backend = "jax"``), no KERAS_BACKEND."""
    flags = []
    for key, value in cfg.items():
        flags += [f"--{key.replace('_', '-')}", str(value).lower() if isinstance(value, bool) else str(value)]
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES}",
               PYTHONPATH=os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]))
    config_file = work / "train.toml"  # the backend from the [train] table, not from a flag
    config_file.write_text('[train]\nbackend = "jax"\n\n[model]\n'
                           + "".join(f"{k} = {v}\n" for k, v in NO_DROPOUT.items()))
    return subprocess.Popen([sys.executable, "-m", "tpulm", "train", "--config", str(config_file), *flags],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_checkpoints_resume_across_backends_and_export(tmp_path, data):
    """TF 6 steps vs TF 3 + JAX 3; JAX (CLI, 2x2 mesh) 6 steps vs JAX 3 + TF 3; export of JAX."""
    import torch
    import transformers

    from tpulm import config
    from tpulm.hf import export

    tf_run, jax_run = tmp_path / "tf_first", tmp_path / "jax_first"
    cli = _start_cli_jax(train_config(data, jax_run, mesh="data=2,model=2",
                                      batch_size=4, eval_data=data["eval_data"]), tmp_path)
    tf_cfg = train_config(data, tf_run)
    _train_tf(tf_cfg, NO_DROPOUT)  # meanwhile
    tf_reference, tf_losses = _checkpoint(tf_run, 6), _losses(tf_run)
    shutil.rmtree(rundir.checkpoint_dir(str(tf_run), 6))  # as if killed after step 3's checkpoint

    out, err = cli.communicate(timeout=300)
    assert cli.returncode == 0, err[-6000:]
    assert "steps        6 (6 this run)" in out and "eval         loss" in out
    assert config.load_toml(str(jax_run / rundir.CONFIG_NAME))["train"]["backend"] == "jax"
    jax_reference, jax_losses = _checkpoint(jax_run, 6), _losses(jax_run)
    shutil.rmtree(rundir.checkpoint_dir(str(jax_run), 6))

    batch = _batch(tmp_path / "inputs.npz", 500, 3, with_positions=False)
    worker = start_jax([{"kind": "train", "config": {**tf_cfg, "batch_size": 2}, "model": NO_DROPOUT,
                         "logits": {"inputs": str(tmp_path / "inputs.npz"), "out": str(tmp_path / "jax.npy")}}],
                       tmp_path / "work")
    _train_tf(train_config(data, jax_run, batch_size=8), NO_DROPOUT)  # meanwhile
    _assert_same_checkpoint(_checkpoint(jax_run, 6), jax_reference, RESUME_WEIGHT_ATOL)
    np.testing.assert_allclose([_losses(jax_run)[s] for s in (4, 5, 6)], [jax_losses[s] for s in (4, 5, 6)],
                               rtol=RESUME_LOSS_RTOL, atol=0)

    [resumed] = finish_jax(worker)
    assert resumed["steps_this_session"] == 3 and resumed["step"] == 6
    _assert_same_checkpoint(_checkpoint(tf_run, 6), tf_reference, RESUME_WEIGHT_ATOL)
    np.testing.assert_allclose([_losses(tf_run)[s] for s in (4, 5, 6)], [tf_losses[s] for s in (4, 5, 6)],
                               rtol=RESUME_LOSS_RTOL, atol=0)

    export.write_export(str(tf_run), str(tmp_path / "export"))  # the run that ended on JAX
    torch_model = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "export")).eval()
    with torch.no_grad():
        ref = torch_model(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                          attention_mask=torch.tensor(batch["attention_mask"])).logits.numpy()
    real = batch["attention_mask"].astype(bool)
    np.testing.assert_allclose(np.load(tmp_path / "jax.npy")[real], ref[real], atol=EXPORT_ATOL, rtol=0)
