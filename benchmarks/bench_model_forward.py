"""Forward-pass throughput of the Keras model vs Transformers' PyTorch RobertaForMaskedLM.

Same config, same weights, same batches, measured side by side in one run (the machine is noisy):
the Keras model XLA-compiled on TensorFlow, once with the LM head on every position and once on
15% gathered positions (what training does), and PyTorch eager (full head).

    .venv/bin/python benchmarks/bench_model_forward.py [--layers 4 --hidden 256 ...]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402


def _timed(fns: dict, repeats: int) -> dict[str, float]:
    """Seconds per call of each function: best of ``repeats`` rounds, the functions interleaved
    within a round so that load from other processes hits them alike; one warm-up call each."""
    for fn in fns.values():
        fn()
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import tensorflow as tf
    import torch
    from transformers import RobertaConfig, RobertaForMaskedLM

    from tpulm.hf import convert
    from tpulm.model.config import ModelConfig
    from tpulm.model.networks import build_model

    cfg = ModelConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers,
                      num_heads=args.heads, intermediate_size=args.ffn, pad_token_id=3)
    torch_model = RobertaForMaskedLM(RobertaConfig(**convert.hf_model_kwargs(cfg))).eval()
    model = build_model(cfg, dtype="float32")
    convert.from_hf_state_dict(model, cfg, {k: v.numpy() for k, v in torch_model.state_dict().items()})

    rng = np.random.default_rng(0)
    ids = rng.integers(5, args.vocab, (args.batch, args.seq)).astype(np.int32)
    mask = np.ones_like(ids)
    n_masked = max(1, round(0.15 * args.seq))
    positions = np.sort(rng.permuted(np.tile(np.arange(args.seq), (args.batch, 1)), axis=1)
                        [:, :n_masked], axis=1).astype(np.int32)
    full = tf.function(lambda b: model(b, training=False), jit_compile=True)
    batch = {"input_ids": tf.constant(ids), "attention_mask": tf.constant(mask)}
    gathered_batch = {**batch, "masked_positions": tf.constant(positions)}
    torch_ids, torch_mask = torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(mask.astype(np.int64))

    def run_torch():
        with torch.no_grad():
            torch_model(input_ids=torch_ids, attention_mask=torch_mask)

    tokens = args.batch * args.seq
    results = _timed({
        "torch eager (full head)": run_torch,
        "keras tf xla (full head)": lambda: full(batch).numpy(),
        "keras tf xla (15% gathered head)": lambda: full(gathered_batch).numpy(),
    }, args.repeats)
    base = results["torch eager (full head)"]
    print(f"config: {args.layers} layers, hidden {args.hidden}, {args.heads} heads, FFN {args.ffn}, "
          f"vocab {args.vocab}, batch {args.batch} x seq {args.seq}; torch threads "
          f"{torch.get_num_threads()}")
    for name, seconds in results.items():
        print(f"{name:34s} {tokens / seconds:10,.0f} tokens/s   x{base / seconds:.2f} vs torch")


if __name__ == "__main__":
    main()
