"""Training quality: tpulm ``tiny`` vs Transformers' PyTorch RobertaForMaskedLM, same budget.

Same config (the ``tiny`` preset), same data (WikiText-2 valid as training text, test as
evaluation text, a Unigram tokenizer trained on both), same batches and masks (PyTorch trains on
the batches tpulm's pipeline produces), same optimizer settings (AdamW β 0.9/0.98, ε 1e-6, weight
decay 0.01 off LayerNorm/biases, clipping 1.0) and the same warmup/linear-decay schedule, same
number of tokens. Both are evaluated on the same masked evaluation batches; prints the final
masked-token eval loss of both and the difference (target: tpulm <= reference + 0.05).

    .venv/bin/python benchmarks/train_quality.py [--steps 600] [--seeds 0 1]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the tests' reference-schema shard writer
sys.path.insert(0, str(REPO / "benchmarks"))  # train_throughput's slot_labels
sys.path.insert(0, str(REPO / "src"))
import bench_data  # noqa: E402  (WikiText-2: ../shared/data, else the repository's copy)
SEQ, BATCH, VOCAB, LR = 128, 32, 4096, 1e-3


def prepare(root: Path) -> dict[str, Path]:
    from support.training import blocks, make_tokenizer, wikitext_lines, write_shards

    wikitext = bench_data.wikitext_dir()
    train_lines, eval_lines = wikitext_lines(wikitext, "valid"), wikitext_lines(wikitext, "test")
    tok = make_tokenizer(root / "tokenizer", train_lines + eval_lines, vocab_size=VOCAB)
    for split, lines in (("train", train_lines), ("valid", eval_lines)):
        ids, mask = blocks(tok, lines, SEQ)
        write_shards(root / split, ids, mask, 4)
    return {"tokenizer": tok, "train": root / "train", "valid": root / "valid"}


def tpulm_run(data: dict, run_dir: Path, steps: int, seed: int):
    from tpulm.training import run
    from tpulm.training.config import TrainConfig

    return run(TrainConfig(
        train_data=str(data["train"]), eval_data=str(data["valid"]), tokenizer=str(data["tokenizer"]),
        run_dir=str(run_dir), model="tiny", batch_size=BATCH, max_steps=steps, learning_rate=LR,
        log_every=steps, eval_every=steps, checkpoint_every=steps, seed=seed, progress=False,
        peak_tflops=1.0,
    ))


def pipelines(data: dict, seed: int):
    """tpulm's training and evaluation datasets (the masks both frameworks see)."""
    from tpulm.data.tokenizer import load_tokenizer, special_tokens
    from tpulm.training.inputs import eval_dataset, open_shards, training_dataset
    from tpulm.training.masking import Masker, max_predictions

    special = special_tokens(str(data["tokenizer"]))
    vocab = load_tokenizer(str(data["tokenizer"])).get_vocab_size()
    masker = Masker(vocab, special.mask_id, special.ids, max_predictions(SEQ, 0.15))
    train = training_dataset(open_shards(str(data["train"])), batch_size=BATCH, masker=masker, seed=seed)
    evaluate = eval_dataset(open_shards(str(data["valid"])), batch_size=BATCH, masker=masker, seed=seed,
                            filler_ids=(special.cls_id, special.pad_id))
    return train, evaluate, special, vocab


def to_torch(x, y, w):
    """A tpulm batch as RobertaForMaskedLM inputs; labels -100 off the masked positions."""
    import numpy as np
    import torch
    from train_throughput import slot_labels

    return {"input_ids": torch.from_numpy(x["input_ids"].numpy().astype(np.int64)),
            "attention_mask": torch.from_numpy(x["attention_mask"].numpy().astype(np.int64)),
            "labels": torch.from_numpy(slot_labels(x, y, w))}


def torch_run(data: dict, steps: int, seed: int) -> float:
    """Train RobertaForMaskedLM on the same batches; masked-token eval loss on the same batches."""
    import torch
    from transformers import RobertaConfig, RobertaForMaskedLM

    from tpulm.model.config import load_model_preset
    from tpulm.training.schedule import LinearWarmupDecay, warmup_steps

    train, evaluate, special, vocab = pipelines(data, seed)
    tiny = load_model_preset("tiny")
    torch.manual_seed(seed)
    model = RobertaForMaskedLM(RobertaConfig(
        vocab_size=vocab, hidden_size=tiny["hidden_size"], num_hidden_layers=tiny["num_layers"],
        num_attention_heads=tiny["num_heads"], intermediate_size=tiny["intermediate_size"],
        max_position_embeddings=tiny["max_position_embeddings"], type_vocab_size=1,
        pad_token_id=special.pad_id, layer_norm_eps=1e-5)).train()
    params = list(model.named_parameters())
    opt = torch.optim.AdamW(
        [{"params": [p for _, p in params if p.ndim > 1], "weight_decay": 0.01},
         {"params": [p for _, p in params if p.ndim <= 1], "weight_decay": 0.0}],
        lr=LR, betas=(0.9, 0.98), eps=1e-6)
    schedule = LinearWarmupDecay(1.0, warmup_steps(0.05, steps), steps)
    lr = torch.optim.lr_scheduler.LambdaLR(opt, schedule.at)  # the same schedule as tpulm
    for batch in train.take(steps):
        model(**to_torch(*batch)).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lr.step()
        opt.zero_grad(set_to_none=True)
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in evaluate:
            inputs = to_torch(*batch)
            logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
            losses = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), inputs["labels"].flatten(), ignore_index=-100, reduction="sum")
            total += losses.item()
            count += int((inputs["labels"] != -100).sum())
    return total / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600, help="optimizer steps of batch 32 x 128")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.basicConfig(level=logging.WARNING)
    from tpulm.training import process

    process.configure_cpu_threads()  # before TensorFlow starts (the data set-up starts it)
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    with tempfile.TemporaryDirectory() as tmp:
        data = prepare(Path(tmp))
        rows = []
        for seed in args.seeds:
            ours = tpulm_run(data, Path(tmp) / f"run-{seed}", args.steps, seed).eval["loss"]
            theirs = torch_run(data, args.steps, seed)
            rows.append((seed, ours, theirs))
            print(f"seed {seed}: tpulm eval loss {ours:.4f}, PyTorch reference {theirs:.4f}, "
                  f"difference {ours - theirs:+.4f}", flush=True)
        tokens = args.steps * BATCH * SEQ
        mean = sum(o - t for _, o, t in rows) / len(rows)
        print(f"\ntiny, {args.steps} steps x {BATCH} x {SEQ} = {tokens:,} tokens per run; "
              f"mean difference tpulm - reference {mean:+.4f} (target <= +0.05): "
              f"{'PASS' if mean <= 0.05 else 'FAIL'}")


if __name__ == "__main__":
    main()
