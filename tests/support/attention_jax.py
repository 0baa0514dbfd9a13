"""The JAX side of tests/test_attention.py, run in a subprocess (Keras fixes its backend at import).

Usage: ``KERAS_BACKEND=jax XLA_FLAGS=--xla_force_host_platform_device_count=4 python
tests/support/attention_jax.py OUT.json [tpu]``. Writes, for each check, the largest absolute
difference from the dense path over real rows: of the outputs, and of the gradients of a weighted
sum of them with respect to q, k and v (``jax.grad``); with ``tpu``, what compiling splash for a
TPU slice gave instead. Not a test module.
"""

from __future__ import annotations

import json
import sys

import jax
import keras
import numpy as np
from attention_cases import SCALE, case

from tpulm.model import attention

SEQ = 200  # not a multiple of the blocked path's 64 nor of splash's 128


def _max_differences(fn, c: dict, window: int | None) -> dict:
    """Output and gradient differences of ``fn(q, k, v)`` from the dense path on real rows."""
    mask = attention.dense_mask(c["attention_mask"], c["segment_ids"], window)

    def dense(q, k, v):
        return attention.dense_attention(q, k, v, mask, scale=SCALE)

    real = c["attention_mask"].astype(bool)
    out, ref = jax.jit(fn)(c["q"], c["k"], c["v"]), dense(c["q"], c["k"], c["v"])
    grads = [jax.jit(jax.grad(lambda *x, f=f: (f(*x) * c["weight"]).sum(), argnums=(0, 1, 2)))(
        c["q"], c["k"], c["v"]) for f in (fn, dense)]
    return {"output": float(np.abs(np.asarray(out) - np.asarray(ref))[real].max()),
            **{f"grad_{name}": float(np.abs(np.asarray(a) - np.asarray(b)).max())
               for name, a, b in zip("qkv", *grads)}}


def _segments(c: dict):
    return attention.token_segments(c["attention_mask"], c["segment_ids"])


def blocked_local() -> dict:
    c = case(SEQ, padding=True, documents=True)
    return _max_differences(lambda q, k, v: attention.blocked_local_attention(
        q, k, v, _segments(c), window=128, scale=SCALE), c, 128)


def chunked_global(documents: bool) -> dict:
    c = case(SEQ, padding=True, documents=documents)
    return _max_differences(lambda q, k, v: attention.chunked_attention(
        q, k, v, c["attention_mask"], c["segment_ids"], scale=SCALE, block=64), c, None)


def splash(window: int | None, documents: bool) -> dict:
    c = case(SEQ, padding=True, documents=documents)
    return _max_differences(lambda q, k, v: attention.splash_attention(
        q, k, v, _segments(c), window=window, scale=SCALE, interpret=True), c, window)


def splash_sharded() -> dict:
    """Splash as attend() runs it on TPU: under a Keras (data=2, model=2) ModelParallel mesh,
    so inside jax.shard_map, the batch split over ``data`` and the heads over ``model``."""
    devices = keras.distribution.list_devices()
    mesh = keras.distribution.DeviceMesh((2, 2), ["data", "model"], devices)
    layouts = keras.distribution.LayoutMap(mesh)
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="data"))
    c = case(SEQ, padding=True, documents=True)
    fn = attention.AUTO_PATHS[("jax", "tpu")].local
    try:
        mesh, batch_axis, head_axis = attention._keras_mesh()
        return {"mesh": dict(mesh.shape), "batch_axis": batch_axis, "head_axis": head_axis,
                **_max_differences(lambda q, k, v: fn(
                    q, k, v, attention_mask=c["attention_mask"], segment_ids=c["segment_ids"],
                    window=128, scale=SCALE), c, 128)}
    finally:
        keras.distribution.set_distribution(None)


def auto_on_cpu() -> dict:
    """What attend(mode="auto") picks on JAX's CPU platform, and its difference from dense
    (global layers in chunks of 64, so that a length of 200 takes the chunked path)."""
    attention.GLOBAL_BLOCK = 64
    paths = attention.select_paths("auto")
    c = case(SEQ, padding=True, documents=False)
    diffs = {window: _max_differences(lambda q, k, v: attention.attend(
        q, k, v, attention_mask=c["attention_mask"], window=window, scale=SCALE), c, window)
        for window in (None, 128)}
    worst = {name: max(d[name] for d in diffs.values()) for name in diffs[None]}
    return {"platform": jax.devices()[0].platform, "global": paths.global_.__name__,
            "local": paths.local.__name__, **worst}


def tpu_compile() -> dict:
    """Splash compiled by Mosaic for a v5e 2x2 slice ahead of time (libtpu, no TPU): what
    interpret mode cannot check (tile shapes, lowering), forward and backward, sharded."""
    import jax.numpy as jnp
    from jax.experimental import topologies

    devices = topologies.get_topology_desc(
        platform="tpu", topology_name="v5e:2x2", chip_config_name="default",
        chips_per_host_bounds=(2, 2, 1), num_slices=1).devices
    mesh = jax.sharding.Mesh(np.array(devices), ("data",))
    data = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))

    def loss(q, k, v, segments):
        out = attention.splash_attention(q, k, v, segments, window=128, scale=SCALE, mesh=mesh,
                                         batch_axis="data")
        return out.astype(jnp.float32).sum()

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), in_shardings=(data,) * 4,
                   out_shardings=(data,) * 3)
    x = jax.ShapeDtypeStruct((8, 1000, 2, 64), jnp.bfloat16)
    compiled = grad.lower(x, x, x, jax.ShapeDtypeStruct((8, 1000), jnp.int32)).compile()
    return {"platform": devices[0].platform,
            "temp_bytes": compiled.memory_analysis().temp_size_in_bytes}


def main(out_path: str, which: str = "cpu") -> None:
    if which == "tpu":
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump(tpu_compile(), f)
        return
    results = {"blocked_local": blocked_local(), "chunked_global": chunked_global(False),
               "chunked_documents": chunked_global(True), "splash_local": splash(128, documents=True),
               "splash_global": splash(None, documents=False), "splash_sharded": splash_sharded(),
               "auto_on_cpu": auto_on_cpu()}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
