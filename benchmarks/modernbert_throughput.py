"""Training throughput: tpulm's ModernBERT (Keras 3 + TF) vs Transformers' PyTorch ModernBertForMaskedLM.

Same config (4 layers, hidden 256, 4 heads, GeGLU intermediate 684, global attention every 3rd
layer and a 64-token sliding window elsewhere, no dropout, vocab 8192), the same batches (tpulm's
tf.data pipeline, 128-token blocks, batch 32, 30% masking) and AdamW with clipping. Transformers
runs with ``attn_implementation="sdpa"`` (its best CPU path) twice: as ``ModernBertForMaskedLM``
ships (``sparse_prediction=False``, the default and the released checkpoints' setting: the head
runs on every position) and with ``sparse_prediction=True`` (the head on masked tokens only, as
tpulm does). tpulm runs with its defaults (``--jit-compile auto``). The three alternate for
``--rounds`` rounds; each round times ``--steps`` steps after ``--warmup`` untimed ones. Prints
the median tokens/s of each, the ratios of medians (target >= 1.5x) and the load average. With
``--bf16`` all run in bfloat16 (tpulm ``mixed_bfloat16``, PyTorch ``torch.autocast``).

    .venv/bin/python benchmarks/modernbert_throughput.py [--rounds 3] [--steps 20] [--bf16]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import train_throughput as bench  # noqa: E402  (data set-up and the tpulm timing loop)

MODEL = {"architecture": "modernbert", "hidden_size": 256, "num_layers": 4, "num_heads": 4,
         "intermediate_size": 684, "max_position_embeddings": 512, "local_attention": 64,
         "global_attn_every_n_layers": 3, "hidden_dropout": 0.0, "attention_dropout": 0.0}
MLM = 0.3


def torch_batches(data: dict, n: int) -> list[dict]:
    """tpulm's first ``n`` training batches (30% masking) as PyTorch MLM inputs."""
    import numpy as np
    import torch

    from tpulm.data.tokenizer import open_folder
    from tpulm.training.inputs import open_shards, training_dataset
    from tpulm.training.masking import Masker, max_predictions

    tok = open_folder(str(data["tokenizer"]))
    masker = Masker(bench.VOCAB, tok.special.mask_id, tok.special.ids,  # as the trainer masks
                    max_predictions(bench.SEQ, MLM, group_rows=bench.BATCH), mlm_probability=MLM,
                    group_rows=bench.BATCH)
    ds = training_dataset(open_shards(str(data["train"])), batch_size=bench.BATCH, masker=masker, seed=0)
    return [{"input_ids": torch.from_numpy(x["input_ids"].numpy().astype(np.int64)),
             "attention_mask": torch.from_numpy(x["attention_mask"].numpy().astype(np.int64)),
             "labels": torch.from_numpy(bench.slot_labels(x, y, w))} for x, y, w in ds.take(n)]


def torch_model(pad_id: int, sparse_prediction: bool):
    import torch
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    from tpulm import config
    from tpulm.hf import convert
    from tpulm.model.config import ModelConfig

    cfg = config.from_mapping(ModelConfig, {**MODEL, "vocab_size": bench.VOCAB, "pad_token_id": pad_id}, "bench")
    torch.manual_seed(0)
    hf_cfg = ModernBertConfig(**convert.hf_model_kwargs(cfg), sparse_prediction=sparse_prediction,
                              attn_implementation="sdpa")
    return ModernBertForMaskedLM(hf_cfg).train()


def torch_round(model, batches: list[dict], warmup: int, bf16: bool) -> float:
    """tokens/s of AdamW steps on ``batches`` after ``warmup`` untimed ones."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    for i, batch in enumerate(batches):
        if i == warmup:
            start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return (len(batches) - warmup) * bench.BATCH * bench.SEQ / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--jit-compile", default="auto", help="tpulm's --jit-compile")
    parser.add_argument("--bf16", action="store_true", help="both in bfloat16")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.basicConfig(level=logging.WARNING)
    from tpulm.training import process

    process.configure_cpu_threads()  # before TensorFlow starts (the data set-up starts it)
    import torch

    from tpulm.data.tokenizer import open_folder

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    print(f"load before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = bench.prepare(root)
        pad_id = open_folder(str(data["tokenizer"])).special.pad_id
        references = {"sparse": torch_model(pad_id, True), "default": torch_model(pad_id, False)}
        batches = torch_batches(data, args.warmup + args.steps)
        ours, theirs = [], {name: [] for name in references}
        for r in range(args.rounds):
            run = bench.tpulm_run(data, root / f"run{r}", args.steps, args.warmup, overrides=MODEL,
                                  model="tiny", mlm_probability=MLM, jit_compile=args.jit_compile,
                                  precision="mixed_bfloat16" if args.bf16 else "fp32")
            ours.append(run["tokens_per_second"])
            for name, model in references.items():
                theirs[name].append(torch_round(model, batches, args.warmup, args.bf16))
            print(f"round {r}: tpulm {ours[-1]:,.0f} tokens/s, PyTorch sparse_prediction "
                  f"{theirs['sparse'][-1]:,.0f}, default {theirs['default'][-1]:,.0f} "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
    a = statistics.median(ours)
    print(f"config: ModernBERT 4 x 256, 4 heads, GeGLU 684, window 64, vocab {bench.VOCAB}, "
          f"seq {bench.SEQ}, batch {bench.BATCH}, {MLM:.0%} masking, "
          f"{'bfloat16' if args.bf16 else 'fp32'}, tpulm --jit-compile {args.jit_compile}")
    print(f"median tpulm {a:,.0f} tokens/s")
    for name, label in (("default", "ModernBertForMaskedLM as shipped (head on every position)"),
                        ("sparse", "ModernBertForMaskedLM sparse_prediction=True")):
        b = statistics.median(theirs[name])
        print(f"  vs {label}: {b:,.0f} tokens/s, ratio {a / b:.2f}x (target >= 1.5x)")
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
