"""``tpulm plan``: the JAX train step compiled by libtpu for TPU topologies on this CPU machine.

The test process imports Keras on TensorFlow, so the compiles run in subprocesses on the JAX
backend: one runs the library's ``plan.run`` for a few tiny configurations (module fixture), the
others the real command line. A TPU compile of a one-block model takes 10-60 s on 2 CPU cores
(more when other jobs share them).
libtpu comes with the ``tpu`` extra that ``make test`` installs: without it these tests fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpulm.errors import TpulmError
from tpulm.training import tpu_chips
from tpulm.training.plan import _refusal

SRC = Path(__file__).resolve().parents[1] / "src"
ENV = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
       "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
# ModernBERT-tiny made 2x wider: at width 64 non-matmul work (norms, softmax, AdamW) is ~15% of
# the compiler's FLOPs; at 128 the matmuls flops.py counts dominate, as in real models (8.6%
# more than flops.py counts). One block: it compiles in 2/3 of the time of three.
WIDE = {"hidden_size": 128, "intermediate_size": 256, "num_layers": 1}
LOCAL = {**WIDE, "num_layers": 2, "local_attention": 64}
BASE = {"topology": "v5litepod-4", "max_length": 128, "vocab_size": 1000}
TRAIN = {"model": "modernbert-tiny", "batch_size": 16, "precision": "mixed_bfloat16"}
CASES = {
    "v5e": (BASE, TRAIN, WIDE),
    "v5e_batch_256": (BASE, {**TRAIN, "batch_size": 256}, WIDE),
    "v5e_model_axis": (BASE, {**TRAIN, "mesh": "data=2,model=2"}, WIDE),
    "v4": ({**BASE, "topology": "v4-8"}, {"model": "tiny", "batch_size": 16}, {"num_layers": 1}),
    # a global and a 64-token sliding-window layer at 512 tokens: splash on TPU, and the reference
    "v5e_splash": ({**BASE, "max_length": 512}, {**TRAIN, "batch_size": 4}, LOCAL),
    "v5e_dense": ({**BASE, "max_length": 512}, {**TRAIN, "batch_size": 4, "attention": "dense"},
                  LOCAL),
}
PLAN_CASES = """
import json, sys
from tpulm.training import plan
from tpulm.training.config import TrainConfig
out = {}
for name, (p, t, m) in json.loads(sys.argv[1]).items():
    out[name] = plan.run(plan.PlanConfig(**p), TrainConfig(**t), m).to_dict()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def plans() -> dict:
    done = subprocess.run([sys.executable, "-c", PLAN_CASES, json.dumps(CASES)], env=ENV,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cli(*args: str, env: dict | None = None, prefix: str = "") -> subprocess.CompletedProcess:
    code = f"{prefix}import sys; from tpulm.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "plan", *args], env=env or ENV,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("name, chips, jax_topology, config", [
    ("v4-8", 4, "v4:2x2x1", "megacore"),
    ("v4-32", 16, "v4:2x2x4", "megacore"),
    ("v4-128", 64, "v4:4x4x4", "megacore"),
    ("v5p-8", 4, "v5p:2x2x1", "megacore"),
    ("v5litepod-1", 1, "v5e:1x1", "default"),
    ("v5litepod-8", 8, "v5e:2x4", "default"),
    ("v5litepod-256", 256, "v5e:16x16", "default"),
    ("v6e-16", 16, "v6e:4x4", "default"),
    ("2xv5p-8", 8, "v5p:2x2x1", "megacore"),
])
def test_topology_names_map_to_jax_topologies(name, chips, jax_topology, config):
    topology = tpu_chips.parse_topology(name)
    got = (topology.chips, topology.jax_topology, topology.chip_config)
    assert got == (chips, jax_topology, config)


@pytest.mark.parametrize("name", ["v5litepod-3", "v4-6", "v4-7", "h100-8", "v5p"])
def test_unknown_topologies_name_the_flag(name):
    with pytest.raises(TpulmError, match="--topology"):
        tpu_chips.parse_topology(name)


def test_the_compilers_refusal_is_read_in_gib():
    message = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
               "temporaries (70.38G) exceeds available HBM (15.75G).")
    assert _refusal(message) == (70.38 * 2**30, 15.75 * 2**30)
    assert _refusal("INTERNAL: something else") is None


def test_compiles_for_v5e_and_v4(plans):
    for name, chip, chips in (("v5e", "v5e", 4), ("v4", "v4", 4)):
        plan = plans[name]
        assert (plan["chip"], plan["chips"], plan["fits"]) == (chip, chips, True)
        assert plan["mesh"] == {"data": 4, "model": 1} and plan["global_batch"] == 64
        assert 0 < plan["hbm_needed_gib"] < plan["hbm_gib"]
        assert plan["flops_per_step"] > 0 and plan["bytes_per_step"] > 0
        assert plan["tokens_per_second_bound"] == pytest.approx(
            64 * 128 / plan["step_seconds_bound"])
        assert 0 < plan["mfu_at_bound"] <= 1


def test_compiler_flops_agree_with_flops_py(plans):
    plan = plans["v5e"]
    assert plan["flops_per_step"] == pytest.approx(plan["model_flops_per_step"], rel=0.15)


def test_splash_attention_is_compiled_and_its_flops_are_counted(plans):
    from tpulm import config
    from tpulm.model.config import ModelConfig, load_model_preset
    from tpulm.training import flops

    auto, dense = plans["v5e_splash"], plans["v5e_dense"]
    model_cfg = config.resolve(ModelConfig, table={**load_model_preset("modernbert-tiny"), **LOCAL},
                               vocab_size=1000)
    rows = 4  # per chip: 4-way data parallel, 4 rows each
    skipped = (flops.attention_flops(model_cfg, 512, rows, sparse=False)
               - flops.attention_flops(model_cfg, 512, rows, sparse=True, block=128))
    assert skipped > 0
    # The compiler counts 0 FLOPs inside the Mosaic kernel; the plan adds the tiles it computes,
    # so the splash step costs the dense one less exactly the tiles the window skips.
    assert auto["flops_per_step"] == pytest.approx(dense["flops_per_step"] - skipped, rel=0.05)
    assert auto["fits"] and dense["fits"]


def test_temporaries_grow_with_the_per_chip_batch(plans):
    small, large = plans["v5e"], plans["v5e_batch_256"]
    # (the compiler may keep a small step's temporaries out of HBM altogether: 0 bytes)
    assert 0 <= small["temporaries_gib"] < large["temporaries_gib"]
    assert small["hbm_needed_gib"] < large["hbm_needed_gib"]
    assert large["flops_per_step"] > 12 * small["flops_per_step"]  # 16x the rows
    assert large["parameters_gib"] == small["parameters_gib"]


def test_a_model_axis_of_2_halves_parameter_and_optimizer_bytes(plans):
    whole, split = plans["v5e"], plans["v5e_model_axis"]
    assert split["mesh"] == {"data": 2, "model": 2} and split["fits"]
    for key in ("parameters_gib", "optimizer_gib"):
        # Norms, biases and the LM-head dense stay replicated: a little over half.
        assert 0.5 * whole[key] <= split[key] <= 0.56 * whole[key], key


def test_the_same_plan_twice_gives_the_same_numbers(plans, tmp_path):
    args = ["--topology", "v5litepod-4", "--max-length", "128", "--vocab-size", "1000",
            "--model", "modernbert-tiny", "--batch-size", "16", "--precision", "mixed_bfloat16",
            "--json"]
    config = tmp_path / "wide.toml"  # the CLI takes the [model] table of --config, as train
    config.write_text("[model]\n" + "".join(f"{k} = {v}\n" for k, v in WIDE.items()),
                      encoding="utf-8")
    done = _cli(*args, "--config", str(config))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == plans["v5e"]


def test_a_step_that_does_not_fit_exits_1_with_the_numbers():
    done = _cli("--topology", "v5litepod-4", "--max-length", "512", "--vocab-size", "1000",
                "--model", "modernbert-tiny", "--batch-size", "4096", "--precision",
                "mixed_bfloat16")
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    hbm = next(line for line in lines if line.startswith("HBM"))
    assert "does NOT fit" in hbm and "15.75 GiB usable" in hbm and "has 16 GiB" in hbm
    need = float(hbm.split("needs ")[1].split(" GiB")[0])
    assert need > 16
    tries = [line for line in lines if line.startswith("try")]
    batch = next(line for line in tries if "--batch-size" in line)
    assert 1 <= int(batch.split("--batch-size ")[1].split()[0]) < 4096
    assert any("--mesh data=2,model=2" in line for line in tries)
    assert "Traceback" not in done.stderr and "TPU_WORKER_HOSTNAMES" not in done.stderr


def test_without_libtpu_one_line_says_how_to_install_it():
    # sys.modules[name] = None is Python's "not installed": find_spec and import both fail.
    done = _cli("--topology", "v5litepod-4", "--vocab-size", "1000", "--model", "tiny",
                prefix="import sys; sys.modules['libtpu'] = None; ")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "tpulm: error: tpulm plan compiles with the TPU compiler, libtpu, which is not installed: "
        "pip install 'tpulm[tpu]' (or pip install 'libtpu==0.0.42.1')"
    ]


def test_libtpus_probe_for_a_tpu_is_kept_off_the_screen():
    """With the tpu extra installed every JAX start on a CPU machine prints these (measured)."""
    from tpulm.quiet import NOISE

    probe = [
        "Failed to find host bounds for accelerator type: WARNING: could not determine TPU "
        "accelerator type, please set env var `TPU_ACCELERATOR_TYPE` manually",
        "WARNING: Logging before InitGoogle() is written to STDERR",
        "E0000 00:00:1796045239.902723    6620 common_lib.cc:554] INVALID_ARGUMENT: Error: "
        "unexpected worker hostname 'WARNING: could not determine TPU worker hostnames'",
        "=== Source Location Trace: === ",
        "learning/45eac/tfrc/runtime/libtpu_init_utils.cc:327",
    ]
    assert all(NOISE.match(line + "\n") for line in probe)
    assert not NOISE.match("Traceback (most recent call last):\n")
    assert not NOISE.match("tpulm: error: --topology 'v5litepod-3': ...\n")
