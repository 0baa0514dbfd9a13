"""Whole-model training steps at growing lengths: ``--attention auto`` vs ``dense``, against
Transformers' PyTorch ``ModernBertForMaskedLM``, and ModernBERT vs RoBERTa at short lengths.

TensorFlow with XLA on CPU, fp32, random token ids (vocab 8192), 30% of the positions predicted
(the LM head on those slots only, as tpulm trains), AdamW; equal tokens per step (``--tokens``).
Each job runs in its own process, so its peak RSS (``ru_maxrss``) is its own; the jobs being
compared run in ``--rounds`` alternating rounds and each figure is the median over rounds.

* ``scaling``: ModernBERT 4 x 256 (4 heads, GeGLU 684, window 128, every 3rd layer global) at
  seq 512 / 1,024 / 2,048 / 4,096, auto vs dense (``--remat``: and auto with ``--remat
  block`` at the longest length): tokens/s and peak RSS; at the longest length also
  ``ModernBertForMaskedLM`` (``attn_implementation="sdpa"``, ``sparse_prediction=True``) on the
  same ids and labels (torch AdamW).
* ``parts``: where the time of a step at ``--parts-seq`` goes: one global and one
  sliding-window attention layer alone (forward + backward; tpulm's auto and dense paths, and
  PyTorch's sdpa with the mask ModernBertForMaskedLM passes), and the whole step of each.
* ``short``: a step of ModernBERT vs RoBERTa of matched parameters (2 x 128: GeGLU 341 vs FFN
  512; 4 x 256: GeGLU 684 vs 1024) at seq 64 and 128, side by side: both in one process, timed
  in alternating rounds of ``--steps`` steps (median ms per step).

    PYTHONPATH=src python benchmarks/long_context_model.py scaling [--seqs 512,1024,2048,4096]
    PYTHONPATH=src python benchmarks/long_context_model.py parts [--parts-seq 4096]
    PYTHONPATH=src python benchmarks/long_context_model.py short

Figures come with the load average: the machine may be shared.
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

VOCAB, PAD, MLM = 8192, 3, 0.3
MODERNBERT = {"architecture": "modernbert", "hidden_size": 256, "num_layers": 4, "num_heads": 4,
              "intermediate_size": 684, "local_attention": 128, "global_attn_every_n_layers": 3,
              "hidden_dropout": 0.0, "attention_dropout": 0.0}
# (ModernBERT, RoBERTa) of matched parameters: GeGLU 3 h i vs FFN 2 h i' in the blocks.
PAIRS = {"2x128": ({**MODERNBERT, "hidden_size": 128, "num_layers": 2, "intermediate_size": 341,
                    "num_heads": 4, "local_attention": 128},
                   {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "intermediate_size": 512,
                    "hidden_dropout": 0.0, "attention_dropout": 0.0}),
         "4x256": (MODERNBERT, {"hidden_size": 256, "num_layers": 4, "num_heads": 4,
                                "intermediate_size": 1024, "hidden_dropout": 0.0,
                                "attention_dropout": 0.0})}


def batch(seq: int, tokens: int, seed: int = 0) -> dict:
    """Random ids and ``round(MLM seq)`` predicted positions a row, with their labels."""
    rng = np.random.default_rng(seed)
    rows, slots = max(1, tokens // seq), max(1, round(MLM * seq))
    ids = rng.integers(PAD + 2, VOCAB, (rows, seq)).astype(np.int32)
    positions = np.sort(np.stack([rng.choice(seq, slots, replace=False) for _ in range(rows)]),
                        axis=1).astype(np.int32)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "masked_positions": positions,
            "labels": np.take_along_axis(ids, positions, axis=1)}


def _model_cfg(table: dict, seq: int):
    from tpulm.model.config import ModelConfig

    positions = seq + PAD + 1 if table.get("architecture") != "modernbert" else seq
    return ModelConfig(**{**table, "vocab_size": VOCAB, "pad_token_id": PAD,
                          "max_position_embeddings": positions})


def tpulm_step(model_table: dict, seq: int, tokens: int, attention: str, remat: str = "none"):
    """A compiled (XLA) tpulm train step for one model, path and length: ``step() -> loss``."""
    import keras
    import tensorflow as tf

    from tpulm.model.networks import build_model

    data = batch(seq, tokens)
    model = build_model(_model_cfg(model_table, seq), attention=attention, remat=remat)
    optimizer = keras.optimizers.AdamW(1e-4)
    optimizer.build(model.trainable_variables)
    inputs = {k: tf.constant(v) for k, v in data.items() if k != "labels"}
    labels = tf.constant(data["labels"])

    @tf.function(jit_compile=True)
    def step():
        with tf.GradientTape() as tape:
            logits = model(inputs, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return lambda: step().numpy()


def tpulm_job(job: dict) -> dict:
    """tokens/s of tpulm train steps for one model, path and length."""
    from tpulm.training import process

    process.configure_cpu_threads()  # as tpulm train does, before TensorFlow starts
    step = tpulm_step(job["model"], job["seq"], job["tokens"], job["attention"],
                      job.get("remat", "none"))
    return _timed(step, job)


def pair_job(job: dict) -> dict:
    """ModernBERT and RoBERTa steps in one process, timed in alternating rounds (the same
    machine state for both): median ms per step of each."""
    from tpulm.training import process

    process.configure_cpu_threads()
    steps = {name: tpulm_step(table, job["seq"], job["tokens"], "auto")
             for name, table in job["models"].items()}
    times = {name: [] for name in steps}
    for name, step in steps.items():
        step()  # compilation
    for _ in range(job["rounds"]):
        for name, step in steps.items():
            t0 = time.perf_counter()
            for _ in range(job["steps"]):
                step()
            times[name].append((time.perf_counter() - t0) / job["steps"])
    return {name: 1000 * float(np.median(t)) for name, t in times.items()}


def torch_job(job: dict) -> dict:
    """tokens/s of ModernBertForMaskedLM (sdpa, sparse_prediction) AdamW steps, same batch."""
    import torch
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    from tpulm.hf import convert

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    data = batch(job["seq"], job["tokens"])
    labels = np.full(data["input_ids"].shape, -100, np.int64)
    np.put_along_axis(labels, data["masked_positions"], data["labels"], axis=1)
    hf_cfg = ModernBertConfig(**convert.hf_model_kwargs(_model_cfg(job["model"], job["seq"])),
                              sparse_prediction=True, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(hf_cfg).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.from_numpy(data["input_ids"].astype(np.int64))
    mask, target = torch.ones_like(ids), torch.from_numpy(labels)

    def step():
        loss = model(input_ids=ids, attention_mask=mask, labels=target).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _timed(step, job)


def _median_ms(fn, repeats: int) -> float:
    fn()  # compilation / warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times))


def _attention_inputs(job: dict) -> list[np.ndarray]:
    """q, k, v and an output weight: one layer's (rows, seq, heads, head_dim), float32."""
    rng = np.random.default_rng(0)
    rows, heads = max(1, job["tokens"] // job["seq"]), MODERNBERT["num_heads"]
    shape = (rows, job["seq"], heads, MODERNBERT["hidden_size"] // heads)
    return [rng.normal(size=shape).astype(np.float32) for _ in range(4)]


def tpulm_parts_job(job: dict) -> dict:
    """ms of one attention layer (forward + backward) per path and of whole steps, TF XLA."""
    import tensorflow as tf

    from tpulm.model import attention
    from tpulm.training import process

    process.configure_cpu_threads()
    q, k, v, weight = (tf.constant(x) for x in _attention_inputs(job))
    mask = np.ones(q.shape[:2], np.int32)
    window = MODERNBERT["local_attention"]

    def layer(mode, window):
        @tf.function(jit_compile=True)
        def step(q, k, v):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                out = attention.attend(q, k, v, attention_mask=mask, window=window, mode=mode)
                loss = tf.reduce_sum(out * weight)
            return tape.gradient(loss, [q, k, v])
        return lambda: [g.numpy() for g in step(q, k, v)]

    out = {f"{mode}_{kind}_layer": _median_ms(layer(mode, w), job["steps"])
           for mode in ("auto", "dense") for kind, w in (("global", None), ("local", window))}
    for mode in ("auto", "dense"):
        out[f"{mode}_step"] = _median_ms(tpulm_step(MODERNBERT, job["seq"], job["tokens"], mode),
                                       job["steps"])
    return out


def torch_parts_job(job: dict) -> dict:
    """ms of one sdpa attention layer (forward + backward), global and with the sliding-window
    mask ModernBertForMaskedLM passes, and of its whole step."""
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    q, k, v, weight = (torch.from_numpy(x).transpose(1, 2).contiguous()
                       for x in _attention_inputs(job))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    index = torch.arange(job["seq"])
    near = (index[:, None] - index[None, :]).abs() <= MODERNBERT["local_attention"] // 2
    window_mask = torch.zeros(near.shape).masked_fill(~near, torch.finfo(torch.float32).min)

    def layer(mask):
        def step():
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            (out * weight).sum().backward()
        return step

    out = {"global_layer": _median_ms(layer(None), job["steps"]),
           "local_layer": _median_ms(layer(window_mask[None, None]), job["steps"])}
    out["step"] = 1000 * job["seq"] * max(1, job["tokens"] // job["seq"]) / torch_job(
        {**job, "model": MODERNBERT})["tokens_per_second"]
    return out


def _timed(step, job: dict) -> dict:
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    step()  # compilation / warm-up
    times = []
    for _ in range(job["steps"]):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    rows = max(1, job["tokens"] // job["seq"])
    return {"tokens_per_second": rows * job["seq"] / float(np.median(times)),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rss_at_start_mib": rss_before / 1024}


def run_job(job: dict) -> dict:
    """One job in a process of its own; its result and the load average after it."""
    proc = subprocess.run([sys.executable, __file__, "job", json.dumps(job)],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1:]}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "load": os.getloadavg()[0]}


def scaling(args) -> None:
    """auto vs dense at each length (and PyTorch at the longest), each job in its own process,
    in ``--rounds`` alternating rounds: the median tokens/s and peak RSS of each, and ratios."""
    seqs = [int(s) for s in args.seqs.split(",")]
    for seq in seqs:
        jobs = {attention: {"kind": "tpulm", "model": MODERNBERT, "seq": seq,
                            "tokens": args.tokens, "steps": args.steps, "attention": attention}
                for attention in ("auto", "dense")}
        if seq == max(seqs) and args.remat:
            jobs["auto+remat"] = {**jobs["auto"], "remat": "block"}
        if seq == max(seqs) and not args.no_torch:
            jobs["torch"] = {"kind": "torch", "model": MODERNBERT, "seq": seq,
                             "tokens": args.tokens, "steps": args.steps}
        rounds = [{name: run_job(job) for name, job in jobs.items()} for _ in range(args.rounds)]
        row = {name: _medians([r[name] for r in rounds]) for name in jobs}
        ratios = {f"auto/{name}": row["auto"]["tokens_per_second"] / row[name]["tokens_per_second"]
                  for name in jobs if name != "auto"}
        print(json.dumps({"seq": seq, **row, "speed_ratios": ratios,
                          "loads": [r[name]["load"] for r in rounds for name in jobs]}),
              flush=True)


def _medians(results: list[dict]) -> dict:
    """Median of each figure over rounds (an error, if any round failed)."""
    failed = [r for r in results if "error" in r]
    if failed:
        return failed[0]
    keys = ("tokens_per_second", "peak_rss_mib", "rss_at_start_mib")
    return {key: float(np.median([r[key] for r in results])) for key in keys}


def parts(args) -> None:
    """Where a step's time goes at one length: each attention layer kind alone (forward +
    backward) and the whole step, tpulm (auto and dense) and PyTorch, alternating rounds."""
    jobs = {"tpulm": {"kind": "tpulm_parts", "seq": args.parts_seq, "tokens": args.tokens,
                      "steps": args.steps},
            "torch": {"kind": "torch_parts", "seq": args.parts_seq, "tokens": args.tokens,
                      "steps": args.steps}}
    rounds = [{name: run_job(job) for name, job in jobs.items()} for _ in range(args.rounds)]
    for name in jobs:
        keys = [k for k in rounds[0][name] if k != "load"]
        ms = {k: float(np.median([r[name][k] for r in rounds])) for k in keys}
        print(json.dumps({"framework": name, "median_ms": ms,
                          "loads": [r[name]["load"] for r in rounds]}), flush=True)


def short(args) -> None:
    for name, (modern, roberta) in PAIRS.items():
        for seq in (64, 128):
            ms = run_job({"kind": "pair", "seq": seq, "tokens": args.tokens, "steps": args.steps,
                          "rounds": args.rounds, "models": {"modernbert": modern,
                                                            "roberta": roberta}})
            ratio = ms["modernbert"] / ms["roberta"] if "error" not in ms else None
            print(json.dumps({"pair": name, "seq": seq, "ms_per_step": ms,
                              "modernbert_over_roberta": ratio}), flush=True)


def main() -> None:
    if sys.argv[1:2] == ["job"]:
        job = json.loads(sys.argv[2])
        kinds = {"torch": torch_job, "tpulm": tpulm_job, "pair": pair_job,
                 "tpulm_parts": tpulm_parts_job, "torch_parts": torch_parts_job}
        print(json.dumps(kinds[job["kind"]](job)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("scaling", "short", "parts"))
    parser.add_argument("--seqs", default="512,1024,2048,4096")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per step")
    parser.add_argument("--steps", type=int, default=3, help="timed steps (median)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (median)")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--remat", action="store_true", help="scaling: also auto + remat block")
    parser.add_argument("--parts-seq", type=int, default=4096, help="parts: the length")
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()}", flush=True)
    {"scaling": scaling, "short": short, "parts": parts}[args.mode](args)
    print(f"load after: {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
