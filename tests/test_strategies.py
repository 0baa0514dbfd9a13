"""Distribution: a real 2-replica MirroredStrategy (2 logical CPUs) matches one replica; the chief
rule; when the train step compiles with XLA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
from support.training import small_corpus

SCRIPT = textwrap.dedent(
    """
    import json, logging, sys
    import tensorflow as tf
    logging.basicConfig(level=logging.INFO)
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from tpulm.training import strategies
    from tpulm.training import run
    from tpulm.training.config import TrainConfig
    data, out = json.loads(sys.argv[1]), sys.argv[2]
    no_dropout = {"hidden_dropout": 0.0, "attention_dropout": 0.0}
    common = dict(train_data=data["train"], tokenizer=data["tokenizer"], model="tiny",
                  max_steps=4, log_every=1, eval_every=100, checkpoint_every=4, learning_rate=1e-3,
                  warmup=0, clip_norm=0.05, progress=False, peak_tflops=1.0)
    # One replica without XLA (as the two-replica run falls back to), for like-for-like numerics.
    one = run(TrainConfig(run_dir=out + "/one", batch_size=8, jit_compile="false", **common), no_dropout)
    strategies.STRATEGIES.insert(0, strategies._Entry(
        "mirrored_cpus", lambda p: True,
        lambda p: strategies.TFStrategy(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]),
                                        "mirrored_cpus")))
    two = run(TrainConfig(run_dir=out + "/two", batch_size=4, **common), no_dropout)
    print("RESULT", json.dumps([one.tokens, two.tokens]))
    """
)


def _losses(run_dir: Path) -> list[float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x["loss"] for x in lines if x["split"] == "train"]


def test_two_replicas_match_one_replica(tmp_path, wikitext_dir):
    """Same global batch (8) on 1 and on 2 replicas: same losses and weights after 4 steps.

    Gradient clipping (0.05) is active, so this also checks that the clipped norm is the global
    one. Only the order of float32 reductions differs between the runs: losses agree to 1e-6
    relative, weights to 1e-6 absolute (measured: 7.5e-9; the 4 Adam updates move each weight
    by up to 4e-3).
    """
    from safetensors.numpy import load_file

    data = small_corpus(tmp_path / "data", wikitext_dir)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps({k: str(v) for k, v in data.items()}), str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "XLA off: MirroredStrategy over CPU devices" in proc.stderr
    assert "strategy mirrored_cpus with 2 replica(s)" in proc.stderr
    assert json.loads(proc.stdout.split("RESULT", 1)[1]) == [4 * 8 * 32] * 2
    one, two = tmp_path / "one", tmp_path / "two"
    np.testing.assert_allclose(_losses(two), _losses(one), rtol=1e-6)
    assert len(_losses(one)) == 4
    w1 = load_file(str(one / "checkpoints/ckpt-000000004/model.safetensors"))
    w2 = load_file(str(two / "checkpoints/ckpt-000000004/model.safetensors"))
    assert w1.keys() == w2.keys()
    for name in w1:
        np.testing.assert_allclose(w2[name], w1[name], rtol=0, atol=1e-6, err_msg=name)


def test_only_the_chief_writes_shared_files():
    import tensorflow as tf

    from tpulm.training import strategies
    from tpulm.training.strategies import is_chief_task

    def chief(task_type, task_id, cluster):  # as a real resolver of that TF_CONFIG reports it
        spec = tf.train.ClusterSpec(cluster) if cluster else tf.train.ClusterSpec({})
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            spec, task_type=task_type, task_id=task_id)
        return is_chief_task(resolver.task_type, resolver.task_id, resolver.cluster_spec().as_dict())

    workers = {"worker": ["h0:1", "h1:1"]}
    assert chief("worker", 0, workers) and not chief("worker", 1, workers)
    with_chief = {"chief": ["c:1"], "worker": ["h0:1"]}
    assert chief("chief", 0, with_chief) and not chief("worker", 0, with_chief)
    assert not chief("evaluator", 0, {**workers, "evaluator": ["e:1"]})
    assert chief(None, None, None)
    assert strategies.local().is_chief()  # one process: it writes


def test_auto_compiles_with_xla_on_cpu_except_in_bfloat16():
    import pytest
    import tensorflow as tf

    from tpulm.errors import TpulmError
    from tpulm.training import distribution, strategies

    if tf.config.list_logical_devices("GPU"):
        pytest.skip("the CPU rule")
    one = strategies.local()
    assert isinstance(one, distribution.Strategy) and one.name == "single_device"
    use_xla = one.use_xla
    assert use_xla("auto", "fp32") and use_xla("auto", "mixed_float16")
    assert not use_xla("auto", "mixed_bfloat16")  # oneDNN's bfloat16 kernels are faster
    assert use_xla("true", "mixed_bfloat16") and not use_xla("false", "fp32")
    with pytest.raises(TpulmError, match="jit_compile must be one of"):
        use_xla("yes")


def test_both_kinds_of_strategy_implement_the_one_interface():
    import pytest

    from tpulm.errors import TpulmError
    from tpulm.training import distribution, jax_mesh, strategies

    mesh = jax_mesh.MeshStrategy(None, 1, "jax_single_device")  # needs no JAX until used
    assert isinstance(mesh, distribution.Strategy)
    assert isinstance(strategies.local(), distribution.Strategy)
    assert mesh.use_xla("auto", "mixed_bfloat16") and not mesh.use_xla("false")  # JAX: always XLA
    with pytest.raises(TpulmError, match="jit_compile must be one of auto, true, false"):
        mesh.use_xla("yes")


def test_an_unreachable_tpu_is_named_in_one_line():
    """TensorFlow's error goes on with the kernel registry; the user's line stops before it."""
    from tpulm.training.strategies import first_line

    raised = ValueError("TPUs not found in the cluster. Failed in initialization: No OpKernel "
                        "was registered to support Op 'ConfigureDistributedTPU'\nRegistered "
                        "devices: [CPU]\nRegistered kernels:\n  <no registered kernels>\n")
    assert first_line(raised) == ("TPUs not found in the cluster. Failed in initialization: No "
                                  "OpKernel was registered to support Op 'ConfigureDistributedTPU'")
