"""One sliding-window attention layer, forward + backward, blocked vs dense, at growing lengths.

TensorFlow with XLA on CPU, equal tokens per step (batch x seq constant), window 128 (ModernBERT's
local layers), 4 heads of 64 (ModernBERT 4 x 256). Each (length, path) runs in its own process so
that its peak memory is its own:

* ``ms``: best of ``--repeats`` steps after a warm-up (compilation) step;
* ``peak MiB``: the process' peak RSS minus its RSS once the inputs exist (XLA's compilation and
  the step's buffers together);
* ``temp MiB``: with ``--jax-memory``, XLA's own count of the step's temporary buffers
  (``compiled.memory_analysis()`` of the same functions under JAX on CPU; compile only).

With ``--tpu v5e:2x2`` (needs ``libtpu`` beside jax; no TPU: compiled ahead of time) it also
compiles the step for that TPU topology, dense vs splash, at ModernBERT-base's 12 heads of 64 in
bfloat16, ``--tpu-batch`` sequences per chip, and prints XLA's temporary GiB per chip.

    PYTHONPATH=src python benchmarks/long_context.py [--seqs 512,1024,2048,4096 --tokens 4096]
    PYTHONPATH=src python benchmarks/long_context.py --seqs 1024,8192 --tpu v5e:2x2 --no-cpu

The machine is shared: the figures come with the load average (``os.getloadavg``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402


def _inputs(seq: int, args) -> dict:
    rng = np.random.default_rng(0)
    shape = (max(1, args.tokens // seq), seq, args.heads, args.head_dim)
    q, k, v, weight = (rng.normal(size=shape).astype(np.float32) for _ in range(4))
    mask = np.ones(shape[:2], np.int32)
    return {"q": q, "k": k, "v": v, "weight": weight, "attention_mask": mask}


def _attention(path: str, args, x: dict):
    """``fn(q, k, v) -> context`` of one path, its masks built from ``x``."""
    from tpulm.model import attention

    scale = args.head_dim**-0.5
    if path == "dense":
        mask = attention.dense_mask(x["attention_mask"], None, args.window)
        return lambda q, k, v: attention.dense_attention(q, k, v, mask, scale=scale)
    block = int(path.removeprefix("blocked"))
    segments = attention.token_segments(x["attention_mask"])
    return lambda q, k, v: attention.blocked_local_attention(
        q, k, v, segments, window=args.window, scale=scale, block=block)


def _kib_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def one_tf(seq: int, path: str, args) -> dict:
    """Time and peak memory of one forward + backward step under TensorFlow XLA."""
    import tensorflow as tf

    x = _inputs(seq, args)
    fn = _attention(path, args, x)
    q, k, v = (tf.constant(x[name]) for name in "qkv")

    @tf.function(jit_compile=True)
    def step(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            loss = tf.reduce_sum(fn(q, k, v) * x["weight"])
        return tape.gradient(loss, [q, k, v])

    base = _kib_rss()
    start = time.perf_counter()
    [g.numpy() for g in step(q, k, v)]
    compile_s = time.perf_counter() - start
    best = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        [g.numpy() for g in step(q, k, v)]
        best = min(best, time.perf_counter() - start)
    return {"seq": seq, "batch": x["q"].shape[0], "path": path, "ms": best * 1e3,
            "compile_s": compile_s, "peak_mib": (_kib_rss() - base) / 1024}


def one_jax(seq: int, path: str, args) -> dict:
    """XLA's temporary bytes of the same step under JAX on CPU (compiled, not run)."""
    import jax

    x = _inputs(seq, args)
    fn = _attention(path, args, x)

    def loss(q, k, v):
        return (fn(q, k, v) * x["weight"]).sum()

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    compiled = grad.lower(x["q"], x["k"], x["v"]).compile()
    return {"seq": seq, "path": path,
            "temp_mib": compiled.memory_analysis().temp_size_in_bytes / 2**20}


# topology name -> get_topology_desc arguments (the ahead-of-time TPU compiler's view of a slice)
TOPOLOGIES = {
    "v5e:2x2": dict(chip_config_name="default", chips_per_host_bounds=(2, 2, 1)),
    "v4:2x2x1": dict(chip_config_name="megacore", chips_per_host_bounds=(2, 2, 1)),
}


def one_tpu(seq: int, path: str, args) -> dict:
    """Temporary GiB per chip of one layer's forward + backward, compiled for ``args.tpu``."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import topologies

    from tpulm.model import attention

    devices = topologies.get_topology_desc(platform="tpu", topology_name=args.tpu, num_slices=1,
                                           **TOPOLOGIES[args.tpu]).devices
    mesh = jax.sharding.Mesh(np.array(devices), ("data",))
    heads, dim, scale = 12, 64, 64**-0.5

    def fn(q, k, v, segments):
        if path == "splash":
            return attention.splash_attention(q, k, v, segments, window=args.window, scale=scale,
                                              mesh=mesh, batch_axis="data")
        mask = attention.dense_mask(segments, segments, args.window)
        return attention.dense_attention(q, k, v, mask, scale=scale)

    def loss(q, k, v, segments):
        return fn(q, k, v, segments).astype(jnp.float32).sum()

    data = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), in_shardings=(data,) * 4,
                   out_shardings=(data,) * 3)
    x = jax.ShapeDtypeStruct((args.tpu_batch * len(devices), seq, heads, dim), jnp.bfloat16)
    segments = jax.ShapeDtypeStruct(x.shape[:2], jnp.int32)
    try:
        temp = grad.lower(x, x, x, segments).compile().memory_analysis().temp_size_in_bytes
    except Exception as error:  # the compiler refuses what does not fit in HBM
        return {"seq": seq, "path": path, "temp_gib": float("nan"), "error": str(error)[:200]}
    return {"seq": seq, "path": path, "temp_gib": temp / 2**30}


def _child(backend: str, seq: int, path: str, argv: list[str]) -> dict:
    # libtpu guards itself with a lock file; another process compiling for TPU must not block us
    env = {**os.environ, "KERAS_BACKEND": backend.removesuffix("-tpu"), "JAX_PLATFORMS": "cpu",
           "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    cmd = [sys.executable, __file__, *argv, "--one", f"{backend}:{seq}:{path}"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{backend} seq {seq} {path} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _table(rows: list[dict], jax_rows: dict) -> None:
    print(f"{'seq':>5} {'batch':>5} {'path':>10} {'ms':>8} {'x dense':>8} {'peak MiB':>9} "
          f"{'temp MiB':>9} {'compile s':>9}")
    dense = {r["seq"]: r for r in rows if r["path"] == "dense"}
    for r in rows:
        speed = dense[r["seq"]]["ms"] / r["ms"] if r["seq"] in dense else float("nan")
        temp = jax_rows.get((r["seq"], r["path"]), float("nan"))
        print(f"{r['seq']:>5} {r['batch']:>5} {r['path']:>10} {r['ms']:>8.1f} {speed:>8.2f} "
              f"{r['peak_mib']:>9.0f} {temp:>9.0f} {r['compile_s']:>9.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", default="512,1024,2048,4096")
    parser.add_argument("--tokens", type=int, default=4096, help="batch x seq of every step")
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--blocks", default="64", help="block sizes of the blocked path")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jax-memory", action="store_true")
    parser.add_argument("--no-cpu", action="store_true", help="skip the TensorFlow CPU runs")
    parser.add_argument("--tpu", choices=sorted(TOPOLOGIES), help="also compile for this TPU")
    parser.add_argument("--tpu-batch", type=int, default=2, help="sequences per TPU chip")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # backend:seq:path, in a child process
    args = parser.parse_args()
    if args.one:
        backend, seq, path = args.one.split(":")
        run = {"jax": one_jax, "jax-tpu": one_tpu, "tensorflow": one_tf}[backend]
        print(json.dumps(run(int(seq), path, args)))
        return
    argv = [a for a in sys.argv[1:]]
    paths = ["dense"] + [f"blocked{b}" for b in args.blocks.split(",")]
    seqs = [int(s) for s in args.seqs.split(",")]
    print(f"load average before: {os.getloadavg()}")
    if args.tpu:
        for seq in seqs:
            for path in ("dense", "splash"):
                r = _child("jax-tpu", seq, path, argv)
                print(f"{args.tpu} seq {seq:>5} {path:>6}: {r['temp_gib']:.2f} GiB temporaries "
                      f"per chip {r.get('error', '')}")
    if args.no_cpu:
        return
    rows = [_child("tensorflow", seq, path, argv) for seq in seqs for path in paths]
    jax_rows = {}
    if args.jax_memory:
        for seq in seqs:
            for path in paths:
                r = _child("jax", seq, path, argv)
                jax_rows[seq, path] = r["temp_mib"]
    print(f"load average after: {os.getloadavg()}; {os.cpu_count()} CPUs; tokens/step "
          f"{args.tokens}, window {args.window}, {args.heads} heads x {args.head_dim}, fp32")
    _table(rows, jax_rows)


if __name__ == "__main__":
    main()
