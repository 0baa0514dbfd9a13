"""Training throughput of tpulm on Keras' TensorFlow and JAX backends, side by side.

The training benchmark's config (``train_throughput.py``): 4 layers, hidden 256, 4 heads, FFN
1024, vocab 8192 (Unigram tokenizer on WikiText-2), sequences of 128, batch 32, AdamW, 15%
masking, fp32, on this machine's CPU (one device). Both backends train from the same shards through
the same ``tpulm.training.run`` (tf.data input pipeline on both); each runs in a child process of its
own, since Keras fixes its backend at import. Rounds alternate the backends (the machine is
shared and noisy) and the best round of each counts. Prints tokens/s, MFU against the best fp32
(2048, 2048) matmul either framework measured in the same run, and the JAX / TF ratio.

    .venv/bin/python benchmarks/train_backends.py [--steps 20] [--warmup 5] [--rounds 2]
        [--dropout-off]   (both backends without dropout: takes their random generators out)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import train_throughput as bench  # noqa: E402  (prepare(), tpulm_run(), config constants)

BACKENDS = ("tensorflow", "jax")


def child(args) -> None:
    """One backend (``KERAS_BACKEND`` set by the parent): prints a ``RESULT`` JSON line."""
    import keras

    from tpulm.training import flops
    from tpulm.training.masking import max_predictions

    data = {"tokenizer": Path(args.data) / "tokenizer", "train": Path(args.data) / "train"}
    if args.dropout_off:
        bench.MODEL.update(hidden_dropout=0.0, attention_dropout=0.0)
    run = bench.tpulm_run(data, Path(args.run_dir), args.steps, args.warmup)
    per_sequence = flops.train_flops_per_sequence(run["model_cfg"], bench.SEQ, max_predictions(bench.SEQ, 0.15))
    print("RESULT", json.dumps({
        "backend": keras.backend.backend(), "tokens_per_second": run["tokens_per_second"],
        "flops_per_token": per_sequence / bench.SEQ, "peak": _matmul_flops(keras.backend.backend()),
        "first_loss": run["first_loss"], "last_loss": run["last_loss"],
    }))


def _matmul_flops(backend: str) -> float:
    """fp32 (2048, 2048) matmul FLOP/s in this backend's framework, on the default device."""
    if backend == "tensorflow":
        from tpulm.training import flops

        return flops.matmul_flops()
    from tpulm.training.jax_mesh import MeshStrategy

    return MeshStrategy(None, 1, "single").peak_flops(repeats=5)


def run_child(backend: str, data: Path, run_dir: Path, args) -> dict:
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("XLA_FLAGS", None)  # one CPU device, as the TF backend sees it
    proc = subprocess.run(
        [sys.executable, __file__, "--child", "--data", str(data), "--run-dir", str(run_dir),
         "--steps", str(args.steps), "--warmup", str(args.warmup)]
        + (["--dropout-off"] if args.dropout_off else []),
        capture_output=True, text=True, env=env,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"{backend} run failed:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs per backend")
    parser.add_argument("--dropout-off", action="store_true", help="no dropout on either backend")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.child:
        return child(args)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        bench.prepare(root)
        best: dict[str, dict] = {}
        for r in range(args.rounds):
            for backend in BACKENDS:
                result = run_child(backend, root, root / f"{backend}-{r}", args)
                print(f"round {r + 1} {backend:10s} {result['tokens_per_second']:8,.0f} tokens/s", flush=True)
                if backend not in best or result["tokens_per_second"] > best[backend]["tokens_per_second"]:
                    best[backend] = {**result, "peak": max(result["peak"], best.get(backend, result)["peak"])}
    peak = max(r["peak"] for r in best.values())
    print(f"\nCPU threads {len(os.sched_getaffinity(0))}; best fp32 2048^3 matmul: "
          + ", ".join(f"{b} {best[b]['peak'] / 1e9:.1f}" for b in BACKENDS) + " GFLOP/s")
    print(f"config: 4 layers, hidden 256, 4 heads, FFN 1024, vocab {bench.VOCAB}, seq {bench.SEQ}, "
          f"batch {bench.BATCH}, fp32{', no dropout' if args.dropout_off else ''}, best of {args.rounds} round(s) of {args.steps} steps")
    for backend in BACKENDS:
        r = best[backend]
        mfu = r["tokens_per_second"] * r["flops_per_token"] / peak
        print(f"tpulm on {backend:10s} {r['tokens_per_second']:9,.0f} tokens/s   MFU {100 * mfu:5.1f}%   "
              f"loss {r['first_loss']:.3f} -> {r['last_loss']:.3f}")
    ratio = best["jax"]["tokens_per_second"] / best["tensorflow"]["tokens_per_second"]
    print(f"ratio JAX / TensorFlow: {ratio:.2f}x")


if __name__ == "__main__":
    main()
