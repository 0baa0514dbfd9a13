"""The cost to reach a given quality: three pretraining recipes, same corpus, tokenizer and wall time.

Arms (all 4 layers, hidden 256, 4 heads, FFN sizes matched in parameters, seq 128, batch 32, one
shared Unigram tokenizer and the same packed blocks):

* ``roberta-reference`` — RoBERTa with its defaults (initializer 0.02, dropout 0.1), 15% masking,
  learning rate 1e-3, warmup 5% then linear decay (the reference recipe, scaled down);
* ``roberta-best`` — the best RoBERTa configuration tpulm shipped so far (the demo's: initializer
  0.1, no dropout, 30% masking, learning rate 2e-3, warmup 10%);
* ``modernbert`` — ModernBERT (pre-norm, GeGLU, RoPE, global + sliding-window attention, no
  biases) with the same 30% masking and optimizer as ``roberta-best``; ``--extra-arms`` adds
  ModernBERT with document attention and with whole-word masking (the options the modern recipe
  can take), so the choice is measured, not guessed.

Each arm trains in its own ``tpulm train`` process for the same wall-clock budget: a short probe
measures its step time, then ``max_steps`` is set so the learning-rate schedule ends when the
budget does. Checkpoints are taken along the way; afterwards every checkpoint is evaluated at
**15% masking on the same held-out blocks with the same masks** (whatever the arm trained with),
so the curves are comparable. The table gives eval loss over time and the time each arm needed
to reach the ``roberta-best`` arm's final loss (target: modern recipe <= 0.5x). With
``--evaluate-seeds N`` each arm's final checkpoint is also fine-tuned on the built-in downstream
task (``tpulm evaluate --task builtin:replaced-words``), mean over N seeds.

The machine's load average is printed before and after each arm: figures taken while the machine
is busy with other work are not comparable.

    .venv/bin/python benchmarks/recipe_quality.py [--budget 240] [--corpus builtin|wikitext] [--extra-arms]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_data  # noqa: E402  (WikiText-2: ../shared/data, else the repository's copy)
SEQ, BATCH, VOCAB, EVAL_SEED = 128, 32, 8192, 1234
BUILTIN_TASK = "builtin:replaced-words"
SIZES = {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "max_position_embeddings": 512}
ROBERTA_FFN = 1024
MODERNBERT_FFN = 684  # GeGLU: 3 x H x I matmul weights = RoBERTa's 2 x H x 1024 (I ~ 683)
BEST = {"initializer_range": 0.1, "hidden_dropout": 0.0, "attention_dropout": 0.0}
BEST_TRAIN = {"mlm_probability": 0.3, "learning_rate": 2e-3, "warmup": 0.1}


def arms(extra: bool) -> dict[str, dict]:
    """name -> {"model": [model] table, "train": [train] overrides}."""
    roberta = {**SIZES, "intermediate_size": ROBERTA_FFN, "max_position_embeddings": SEQ + 4}
    modern = {**SIZES, "architecture": "modernbert", "intermediate_size": MODERNBERT_FFN,
              "local_attention": 64, "global_attn_every_n_layers": 3,
              "hidden_dropout": 0.0, "attention_dropout": 0.0}
    found = {
        "roberta-reference": {"model": roberta, "train": {
            "mlm_probability": 0.15, "learning_rate": 1e-3, "warmup": 0.05}},
        "roberta-best": {"model": {**roberta, **BEST}, "train": dict(BEST_TRAIN)},
        "modernbert": {"model": modern, "train": dict(BEST_TRAIN)},
    }
    if extra:
        found["modernbert+documents"] = {"model": modern,
                                         "train": {**BEST_TRAIN, "document_attention": True}}
        found["modernbert+whole-words"] = {"model": modern,
                                           "train": {**BEST_TRAIN, "whole_word_mask": True}}
    return found


def load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def prepare_data(root: Path, corpus: str) -> dict[str, str]:
    """Tokenizer and shards (train, validation) once for every arm."""
    from tpulm.data import builtin_corpus, prepare, tokenizer

    if corpus == "wikitext":
        wikitext = bench_data.wikitext_dir()
        train, valid = str(wikitext / "valid.txt"), str(wikitext / "test.txt")
    else:
        info = builtin_corpus.write_demo_corpus(str(root / "corpus"))
        train, valid = info.files["train"], info.files["validation"]
    tok = str(root / "tokenizer")
    tokenizer.run(tokenizer.TokenizerConfig(inputs=(train,), output=tok, vocab_size=VOCAB))
    prepare.run(prepare.PrepareConfig(tokenizer=tok, output=str(root / "data"), train_files=(train,),
                                      validation_files=(valid,), max_length=SEQ, progress=False))
    return {"tokenizer": tok, "train": str(root / "data" / "train"),
            "validation": str(root / "data" / "validation")}


def train_arm(name: str, arm: dict, data: dict, root: Path, steps: int, checkpoints: int) -> Path:
    """One ``tpulm train`` process; returns the run dir."""
    from tpulm import config

    run_dir = root / "runs" / name
    every = max(1, steps // checkpoints)
    table = {"model": arm["model"], "train": {
        **arm["train"], "train_data": data["train"], "tokenizer": data["tokenizer"],
        "run_dir": str(run_dir), "batch_size": BATCH, "max_steps": steps,
        "log_every": every, "eval_every": steps, "checkpoint_every": every,
        "keep_checkpoints": checkpoints + 2, "seed": 0, "progress": False, "peak_tflops": 1.0}}
    path = root / f"{name}-{steps}.toml"
    path.write_text(config.to_toml(table))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "TF_CPP_MIN_LOG_LEVEL": "2"}
    subprocess.run([sys.executable, "-m", "tpulm", "train", "--config", str(path)], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    return run_dir


def steps_for_budget(name: str, arm: dict, data: dict, root: Path, budget: float) -> tuple[int, float]:
    """Steps that fit the budget, from a probe run's steady step time (after compilation)."""
    from tpulm.metrics_log import read_metrics

    probe_steps = 60
    run_dir = train_arm(f"probe-{name}", arm, data, root, probe_steps, checkpoints=3)
    records = [r for r in read_metrics(str(run_dir / "metrics.jsonl")) if r["split"] == "train"]
    (t0, s0), (t1, s1) = (records[0]["time"], records[0]["step"]), (records[-1]["time"], records[-1]["step"])
    seconds_per_step = (t1 - t0) / (s1 - s0)
    overhead = t0 - s0 * seconds_per_step  # start-up and compilation, counted in the budget
    return max(1, int((budget - overhead) / seconds_per_step)), seconds_per_step


def eval_loss_at_15(run_dir: Path, data: dict, document_attention: bool) -> list[tuple[float, int, float]]:
    """(training seconds, step, masked-token loss at 15% masking) of every checkpoint."""
    import tensorflow as tf

    from tpulm import rundir
    from tpulm.data.tokenizer import open_folder
    from tpulm.model import weights
    from tpulm.model.config import run_model_config
    from tpulm.model.networks import build_model
    from tpulm.training.inputs import eval_dataset, open_shards
    from tpulm.training.masking import Masker, max_predictions

    tok = open_folder(data["tokenizer"])
    masker = Masker(tok.vocab_size, tok.special.mask_id, tok.special.ids, max_predictions(SEQ, 0.15),
                    mlm_probability=0.15)
    ds = eval_dataset(open_shards(data["validation"]), batch_size=64, masker=masker, seed=EVAL_SEED,
                      filler_ids=(tok.special.cls_id, tok.special.pad_id),
                      document_cls_id=tok.special.cls_id if document_attention else None)
    model = build_model(run_model_config(str(run_dir)), dtype="float32")
    predict = tf.function(lambda x: model(x, training=False))
    curve = []
    for step, folder in rundir.list_checkpoints(str(run_dir)):
        weights.load(model.weights, str(Path(folder) / rundir.MODEL_WEIGHTS))
        total = count = 0.0
        for x, labels, w in ds:
            logits = predict(x)
            losses = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            total += float(tf.reduce_sum(losses * w))
            count += float(tf.reduce_sum(w))
        state = json.loads((Path(folder) / rundir.STATE_NAME).read_text())
        curve.append((float(state["time"]), step, total / max(count, 1.0)))
    return curve


def time_to_reach(curve: list[tuple[float, int, float]], target: float) -> float | None:
    """First training time at which the curve is at or below ``target`` (linear between points)."""
    previous = None
    for t, _, loss in curve:
        if loss <= target:
            if previous is None or previous[1] == loss:
                return t
            (t0, l0) = previous
            return t0 + (t - t0) * (l0 - target) / (l0 - loss)
        previous = (t, loss)
    return None


def downstream(run_dir: Path, seeds: int) -> str:
    """``tpulm evaluate`` on the built-in task (``--evaluate-seeds``): mean ± std over seeds."""
    from tpulm.evaluate.run import EvaluateConfig, run

    result = run(EvaluateConfig(model=str(run_dir), tasks=(BUILTIN_TASK,), seeds=seeds))
    entry = result.tasks[BUILTIN_TASK]
    summary = entry["pretrained"]["summary"]
    return f"{entry['main_metric']} {summary['mean']:.4f} ± {summary['std']:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--budget", type=float, default=240.0, help="seconds of training per arm")
    parser.add_argument("--corpus", choices=("builtin", "wikitext"), default="builtin")
    parser.add_argument("--extra-arms", action="store_true", help="ModernBERT option variants too")
    parser.add_argument("--checkpoints", type=int, default=8, help="points on each curve")
    parser.add_argument("--evaluate-seeds", type=int, default=0, help="downstream seeds (0: skip)")
    parser.add_argument("--work", help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    root = Path(args.work or tempfile.mkdtemp(prefix="tpulm-recipes-"))
    print(f"work dir {root}; corpus {args.corpus}; budget {args.budget:.0f} s per arm; {load()}")
    data = prepare_data(root, args.corpus)
    results = {}
    for name, arm in arms(args.extra_arms).items():
        before = load()
        steps, spp = steps_for_budget(name, arm, data, root, args.budget)
        started = time.monotonic()
        run_dir = train_arm(name, arm, data, root, steps, args.checkpoints)
        wall = time.monotonic() - started
        curve = eval_loss_at_15(run_dir, data, arm["train"].get("document_attention", False))
        results[name] = {"run_dir": run_dir, "curve": curve, "steps": steps}
        print(f"{name}: {steps} steps ({spp * 1000:.0f} ms/step), {wall:.0f} s wall; "
              f"{before} -> {load()}", flush=True)
        for t, step, loss in curve:
            print(f"    {t:7.1f} s  step {step:6d}  eval loss@15% {loss:.4f}")
    target = results["roberta-best"]["curve"][-1][2]
    best_time = results["roberta-best"]["curve"][-1][0]
    print(f"\ntarget: roberta-best's final eval loss@15% {target:.4f} at {best_time:.0f} s")
    print(f"{'arm':24s} {'final loss@15%':>15s} {'time to target':>15s} {'x roberta-best':>15s}"
          + ("  downstream (built-in task)" if args.evaluate_seeds else ""))
    for name, r in results.items():
        reach = time_to_reach(r["curve"], target)
        ratio = f"{reach / best_time:.2f}x" if reach is not None else "not reached"
        extra = f"  {downstream(r['run_dir'], args.evaluate_seeds)}" if args.evaluate_seeds else ""
        reach_text = f"{reach:.0f} s" if reach is not None else "-"
        print(f"{name:24s} {r['curve'][-1][2]:15.4f} {reach_text:>15s} {ratio:>15s}{extra}")
    print(load())


if __name__ == "__main__":
    main()
