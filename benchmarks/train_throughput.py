"""Training throughput: tpulm (Keras 3 + TF) vs Transformers' PyTorch RobertaForMaskedLM.

One run, side by side, on the same machine state: 4 layers, hidden 256, 4 heads, FFN 1024, vocab
8192 (a Unigram tokenizer trained on WikiText-2), sequences of 128, batch 32, AdamW, 15% masking.
PyTorch trains on exactly the batches tpulm's pipeline produces (same masks), with labels on the
masked positions only, as ``DataCollatorForLanguageModeling`` gives them. Prints tokens/s of both,
their ratio, and MFU against a large fp32 matmul measured in the same run (tpulm counts its LM head
on the gathered masked slots, PyTorch on all positions, as each computes it). Then ``base`` for a
few steps: tokens/s and peak memory (in a subprocess of its own). With ``--bf16`` both also run in
bfloat16 (tpulm ``mixed_bfloat16``, PyTorch ``torch.autocast``). tpulm runs with its defaults
(on CPU: XLA in fp32, TensorFlow graph mode with oneDNN in bfloat16, one inter-op thread; see
``Strategy.use_xla`` in ``tpulm.training.distribution``).

    .venv/bin/python benchmarks/train_throughput.py [--steps 20] [--skip-base]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the tests' reference-schema shard writer
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_data  # noqa: E402  (WikiText-2: ../shared/data, else the repository's copy)
MODEL = {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "intermediate_size": 1024,
         "max_position_embeddings": 132}
SEQ, BATCH, VOCAB = 128, 32, 8192


def prepare(root: Path) -> dict[str, Path]:
    """Tokenizer (vocab 8192) on WikiText-2 valid+test, and shards of 128-token blocks."""
    from support.training import blocks, make_tokenizer, wikitext_lines, write_shards

    wikitext = bench_data.wikitext_dir()
    lines = wikitext_lines(wikitext, "valid") + wikitext_lines(wikitext, "test")
    tok = make_tokenizer(root / "tokenizer", lines, vocab_size=VOCAB)
    ids, mask = blocks(tok, lines, SEQ)
    write_shards(root / "train", ids, mask, 4)
    return {"tokenizer": tok, "train": root / "train"}


def tpulm_run(data: dict, run_dir: Path, steps: int, warmup: int, precision: str = "fp32",
              model: str = "tiny", overrides: dict | None = None, batch: int = BATCH,
              mlm_probability: float = 0.15, jit_compile: str = "auto") -> dict:
    """Train ``warmup + steps`` steps; steady tokens/s from the metrics lines after warm-up."""
    from tpulm.model.config import ModelConfig
    from tpulm.training import run
    from tpulm.training.config import TrainConfig

    total = warmup + steps
    result = run(TrainConfig(
        train_data=str(data["train"]), tokenizer=str(data["tokenizer"]), run_dir=str(run_dir),
        model=model, batch_size=batch, max_steps=total, log_every=warmup, eval_every=total,
        checkpoint_every=total, precision=precision, progress=False, peak_tflops=1.0,
        mlm_probability=mlm_probability, jit_compile=jit_compile,
    ), overrides if overrides is not None else MODEL)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in lines if x["split"] == "train"]
    first, last = train[0], train[-1]  # first line = end of warm-up (includes compilation)
    tps = (last["tokens"] - first["tokens"]) / (last["time"] - first["time"])
    from tpulm import config

    cfg = config.from_mapping(ModelConfig, config.load_toml(str(run_dir / "config.toml"))["model"], "run")
    return {"tokens_per_second": tps, "model_cfg": cfg, "first_loss": first["loss"],
            "last_loss": last["loss"], "total_tokens": result.tokens}


def torch_batches(data: dict, n: int) -> list[dict]:
    """The first ``n`` batches of tpulm's pipeline as PyTorch MLM inputs (labels -100 elsewhere)."""
    import numpy as np
    import torch

    from tpulm.data.tokenizer import special_tokens
    from tpulm.training.inputs import open_shards, training_dataset
    from tpulm.training.masking import Masker, max_predictions

    special = special_tokens(str(data["tokenizer"]))
    masker = Masker(VOCAB, special.mask_id, special.ids,  # as the trainer masks (one replica)
                    max_predictions(SEQ, 0.15, group_rows=BATCH), group_rows=BATCH)
    ds = training_dataset(open_shards(str(data["train"])), batch_size=BATCH, masker=masker, seed=0)
    return [{"input_ids": torch.from_numpy(x["input_ids"].numpy().astype(np.int64)),
             "attention_mask": torch.from_numpy(x["attention_mask"].numpy().astype(np.int64)),
             "labels": torch.from_numpy(slot_labels(x, y, w))} for x, y, w in ds.take(n)]


def slot_labels(x, y, w):
    """(B, S) int64 labels of a tpulm batch: the masked ids at their positions, -100 elsewhere.

    Slot positions are offsets into the flattened batch (``tpulm.model.ops.gather_positions``).
    """
    import numpy as np

    batch, seq = x["input_ids"].shape
    pos, real = x["masked_positions"].numpy(), w.numpy() > 0
    flat = np.arange(batch)[:, None] * seq + pos
    labels = np.full(batch * seq, -100, np.int64)
    labels[flat[real]] = y.numpy()[real]
    return labels.reshape(batch, seq)


def torch_run(data: dict, steps: int, warmup: int, pad_id: int, bf16: bool = False) -> dict:
    """Transformers' RobertaForMaskedLM with torch.optim.AdamW on the same batches."""
    import contextlib

    import torch
    from transformers import RobertaConfig, RobertaForMaskedLM

    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=1024, max_position_embeddings=132, type_vocab_size=1,
                        pad_token_id=pad_id, layer_norm_eps=1e-5)
    model = RobertaForMaskedLM(cfg).train()
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.98), eps=1e-6)
    batches = torch_batches(data, warmup + steps)
    losses = []
    for i, batch in enumerate(batches):
        if i == warmup:
            start = time.perf_counter()
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with autocast:
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    seconds = time.perf_counter() - start
    return {"tokens_per_second": steps * BATCH * SEQ / seconds, "first_loss": losses[warmup],
            "last_loss": losses[-1]}


def torch_matmul_flops(n: int = 2048, repeats: int = 5) -> float:
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2.0 * n**3 / best


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def base_only(args) -> None:
    """Child process: ``base`` (vocab 8192) for a few steps; prints a JSON line."""
    data = {"tokenizer": Path(args.data) / "tokenizer", "train": Path(args.data) / "train"}
    with tempfile.TemporaryDirectory() as tmp:
        r = tpulm_run(data, Path(tmp) / "base", args.base_steps, 2, model="base", overrides={},
                      batch=args.base_batch)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("BASE", json.dumps({"tokens_per_second": r["tokens_per_second"], "peak_rss_mb": peak_mb}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per framework")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--bf16", action="store_true", help="also time tpulm with mixed_bfloat16")
    parser.add_argument("--skip-base", action="store_true")
    parser.add_argument("--base-steps", type=int, default=4)
    parser.add_argument("--base-batch", type=int, default=8)
    parser.add_argument("--base-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.basicConfig(level=logging.WARNING)
    from tpulm.training import process

    process.configure_cpu_threads()  # before TensorFlow starts (the data set-up starts it)
    if args.base_only:
        return base_only(args)
    import torch

    from tpulm.data.tokenizer import special_tokens
    from tpulm.training import flops

    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = prepare(root)
        pad_id = special_tokens(str(data["tokenizer"])).pad_id
        tf_peak, torch_peak = flops.matmul_flops(), torch_matmul_flops()
        ours = tpulm_run(data, root / "run", args.steps, args.warmup)
        theirs = torch_run(data, args.steps, args.warmup, pad_id)
        bf16 = tpulm_run(data, root / "bf16", args.steps, args.warmup, "mixed_bfloat16") if args.bf16 else None
        torch_bf16 = torch_run(data, args.steps, args.warmup, pad_id, bf16=True) if args.bf16 else None
        tf_peak = max(tf_peak, flops.matmul_flops())  # the better of before/after the runs
        cfg = ours["model_cfg"]
        from tpulm.training.masking import max_predictions

        ours_flops = flops.train_flops_per_sequence(cfg, SEQ, max_predictions(SEQ, 0.15)) / SEQ
        torch_flops = flops.train_flops_per_sequence(cfg, SEQ, SEQ) / SEQ
        print(f"\nCPU threads {threads}; fp32 2048^3 matmul: TF {tf_peak / 1e9:.1f} GFLOP/s, "
              f"PyTorch {torch_peak / 1e9:.1f} GFLOP/s")
        print(f"config: 4 layers, hidden 256, 4 heads, FFN 1024, vocab {VOCAB}, seq {SEQ}, batch {BATCH}")
        rows = [("tpulm (fp32)", ours, ours_flops), ("PyTorch RobertaForMaskedLM", theirs, torch_flops)]
        if bf16:
            rows += [("tpulm (mixed_bfloat16)", bf16, ours_flops),
                     ("PyTorch (autocast bfloat16)", torch_bf16, torch_flops)]
        peak = max(tf_peak, torch_peak)
        for name, r, per_token in rows:
            print(f"{name:28s} {r['tokens_per_second']:9,.0f} tokens/s   MFU {100 * r['tokens_per_second'] * per_token / peak:5.1f}%"
                  f"   loss {r['first_loss']:.3f} -> {r['last_loss']:.3f}")
        print(f"ratio tpulm / PyTorch (fp32): {ours['tokens_per_second'] / theirs['tokens_per_second']:.2f}x "
              f"(target >= 2x)")
        if bf16:
            print(f"ratio tpulm / PyTorch (bfloat16): "
                  f"{bf16['tokens_per_second'] / torch_bf16['tokens_per_second']:.2f}x")
        if not args.skip_base:
            proc = subprocess.run([sys.executable, __file__, "--base-only", "--data", str(root),
                                   "--base-steps", str(args.base_steps), "--base-batch", str(args.base_batch)],
                                  capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
            if proc.returncode:
                print(proc.stderr[-3000:])
            base = json.loads(proc.stdout.split("BASE", 1)[1])
            print(f"base (12 x 768, vocab {VOCAB}, batch {args.base_batch} x {SEQ}): "
                  f"{base['tokens_per_second']:,.0f} tokens/s, peak RSS {base['peak_rss_mb']:,.0f} MB")


if __name__ == "__main__":
    main()
