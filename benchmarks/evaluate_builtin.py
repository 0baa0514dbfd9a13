"""Downstream evaluation benchmark on the built-in task (``builtin:replaced-words``).

1. Quality: a pretrained model vs the same architecture fine-tuned from scratch, mean ± std
   [min, max] of the validation accuracy over seeds (``tpulm evaluate --from-scratch``).
2. Speed: fine-tuning tokens/s (padded positions: batch x width per step) of tpulm's Keras
   classifier and of Transformers' PyTorch ``RobertaForSequenceClassification`` loaded from the
   same export, on the same batches, in alternating rounds; medians, with the machine's load.

Usage (the model: a run dir with an ``export/`` folder, e.g. the demo's ``tpulm-demo/run``)::

    .venv/bin/python benchmarks/evaluate_builtin.py --model tpulm-demo/run [--seeds 3] [--rounds 5]

Needs the ``hf`` extra (torch, transformers) for part 2. Offline: no download.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

TASK = "builtin:replaced-words"


def quality(model: str, seeds: int, epochs: int) -> dict:
    from tpulm.evaluate.run import EvaluateConfig, format_table, run

    out = os.path.join(tempfile.mkdtemp(), "results.json")
    result = run(EvaluateConfig(model=model, tasks=(TASK,), seeds=seeds, epochs=epochs,
                                from_scratch=True, output=out))
    print(format_table(result.tasks), flush=True)
    return result.tasks[TASK]


def batches(export: str, batch_size: int, steps: int):
    """``steps`` batches of the task's train split, encoded by tpulm (the same for both)."""
    import numpy as np

    from tpulm.data import tokenizer
    from tpulm.evaluate import finetune, tasks

    task = tasks.load_task(TASK)
    tok = tokenizer.load_tokenizer(export)
    encoded = finetune.encode(tok, task, 128, tokenizer.special_tokens(export).pad_id)
    rows = np.arange(steps * batch_size) % len(task.train)
    inputs = {k: v[rows] for k, v in encoded.train.items()}
    return task, inputs, task.train.labels[rows], encoded.width


def keras_round(model, inputs, labels, batch_size: int) -> float:
    started = time.perf_counter()
    model.fit(inputs, labels, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
    return time.perf_counter() - started


def keras_classifier(export: str, task, lr: float):
    import keras

    from tpulm import trained_model
    from tpulm.evaluate.heads import SequenceClassifier
    from tpulm.training import schedule

    loaded = trained_model.load(export)
    model = SequenceClassifier(loaded.model, task.num_outputs, 0.1)
    optimizer = schedule.make_optimizer(model, learning_rate=lr, weight_decay=0.1, clip_norm=1.0)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def torch_round(model, optimizer, inputs, labels, batch_size: int) -> float:
    import torch

    ids = torch.as_tensor(inputs["input_ids"], dtype=torch.long)
    mask = torch.as_tensor(inputs["attention_mask"], dtype=torch.long)
    target = torch.as_tensor(labels, dtype=torch.long)
    started = time.perf_counter()
    for start in range(0, len(ids), batch_size):
        part = slice(start, start + batch_size)
        loss = model(input_ids=ids[part], attention_mask=mask[part], labels=target[part]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    return time.perf_counter() - started


def speed(export: str, batch_size: int, steps: int, rounds: int, lr: float) -> dict:
    import torch
    from transformers import RobertaForSequenceClassification

    task, inputs, labels, width = batches(export, batch_size, steps)
    keras_model = keras_classifier(export, task, lr)
    torch_model = RobertaForSequenceClassification.from_pretrained(export, num_labels=2)
    torch_model.train()
    optimizer = torch.optim.AdamW(torch_model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-6,
                                  weight_decay=0.1)
    tokens = steps * batch_size * width
    keras_round(keras_model, inputs, labels, batch_size)  # compile / warm up both
    torch_round(torch_model, optimizer, inputs, labels, batch_size)
    timings: dict[str, list[float]] = {"tpulm_keras": [], "torch": []}
    for number in range(rounds):  # alternate, so load changes hit both alike
        timings["tpulm_keras"].append(tokens / keras_round(keras_model, inputs, labels, batch_size))
        timings["torch"].append(tokens / torch_round(torch_model, optimizer, inputs, labels, batch_size))
        print(f"round {number + 1}: keras {timings['tpulm_keras'][-1]:,.0f} tokens/s, torch "
              f"{timings['torch'][-1]:,.0f} tokens/s, load {os.getloadavg()[0]:.2f}", flush=True)
    return {"width": width, "batch_size": batch_size, "steps_per_round": steps,
            **{f"{k}_tokens_per_second": statistics.median(v) for k, v in timings.items()},
            "rounds": timings}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="run dir with export/ (or an export folder)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="steps per timing round")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--skip-quality", action="store_true")
    args = parser.parse_args()
    export = args.model if os.path.exists(os.path.join(args.model, "config.json")) else (
        os.path.join(args.model, "export"))
    print(f"load average before: {os.getloadavg()}", flush=True)
    report = {"model": args.model, "load_before": os.getloadavg()}
    if not args.skip_quality:
        entry = quality(args.model, args.seeds, args.epochs)
        report["quality"] = {v: entry[v]["summary"] for v in ("pretrained", "from_scratch")}
    report["speed"] = speed(export, args.batch_size, args.steps, args.rounds, 1e-4)
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
