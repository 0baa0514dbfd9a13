"""The README's `tpulm plan` table: the JAX train step compiled for Cloud TPU slices, no TPU needed.

Rows: the reference recipe (roberta-base, seq 128, batch 32 per chip, 15% masking) and
ModernBERT-base / -large at 512 x 16, 1024 x 8 and 8192 x 1 (sequence x batch per chip, 30%
masking, vocabulary 50368), all mixed bfloat16, data parallel over the slice; columns per
topology: fits, HBM needed per chip, compiler TFLOP per chip and step, the roofline bound on
tokens/s and the cost of a billion tokens at the on-demand price and 50% MFU. Each case is one
``python -m tpulm plan --json`` (a compile of minutes on a few CPU cores); a case that does not
fit also compiles batch 1 for its batch estimate.

    PYTHONPATH=src python benchmarks/plan_table.py [--topologies v5litepod-8 v5p-8 v6e-8]
        [--cases roberta-base/128 modernbert-base/512 ...] [--out plan_table.jsonl]

Results are appended to ``--out`` as JSON lines (a rerun skips the cases already there), then
the whole table is printed as Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# name -> (preset, max length, batch per chip, mlm probability)
CASES = {
    "roberta-base/128": ("base", 128, 32, 0.15),
    "modernbert-base/512": ("modernbert-base", 512, 16, 0.3),
    "modernbert-base/1024": ("modernbert-base", 1024, 8, 0.3),
    "modernbert-base/8192": ("modernbert-base", 8192, 1, 0.3),
    "modernbert-large/512": ("modernbert-large", 512, 16, 0.3),
    "modernbert-large/1024": ("modernbert-large", 1024, 8, 0.3),
    "modernbert-large/8192": ("modernbert-large", 8192, 1, 0.3),
}
TOPOLOGIES = ("v5litepod-8", "v5p-8", "v6e-8")
VOCAB = {"base": 50000, "modernbert-base": 50368, "modernbert-large": 50368}


def plan(case: str, topology: str) -> dict:
    """One ``tpulm plan --json`` run; its JSON with the case, exit code and seconds added."""
    preset, length, batch, mlm = CASES[case]
    args = [sys.executable, "-m", "tpulm", "plan", "--topology", topology, "--model", preset,
            "--max-length", str(length), "--batch-size", str(batch), "--mlm-probability",
            str(mlm), "--vocab-size", str(VOCAB[preset]), "--precision", "mixed_bfloat16",
            "--tokens", "1e9", "--json"]
    t0 = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True, env={**os.environ})
    if done.returncode not in (0, 1):
        raise SystemExit(f"{case} on {topology} failed:\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout), "case": case, "exit": done.returncode,
            "seconds": round(time.monotonic() - t0, 1)}


def row(r: dict) -> str:
    """One Markdown row of a plan."""
    fits = "yes" if r["fits"] else "**no**"
    if not r["fits"]:
        return (f"| {r['case']} | {r['topology']} | {fits} | {r['hbm_needed_gib']:.1f} of "
                f"{r['hbm_gib']:g} | – | – | – |")
    per_billion = r["cost_at_mfu"]  # --tokens 1e9
    return (f"| {r['case']} | {r['topology']} | {fits} | {r['hbm_needed_gib']:.1f} of "
            f"{r['hbm_gib']:g} | {r['flops_per_step'] / 1e12:.2f} | "
            f"{r['tokens_per_second_bound']:,.0f} | ${per_billion:,.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topologies", nargs="+", default=list(TOPOLOGIES))
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--out", default="plan_table.jsonl")
    args = parser.parse_args()
    out = Path(args.out)
    done = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    seen = {(r["case"], r["topology"]) for r in done}
    for case in args.cases:
        for topology in args.topologies:
            if (case, topology) in seen:
                continue
            result = plan(case, topology)
            print(f"{case} on {topology}: exit {result['exit']}, {result['seconds']} s", flush=True)
            with out.open("a") as f:
                f.write(json.dumps(result) + "\n")
            done.append(result)
    print("| case (seq x batch per chip) | topology | fits | HBM GiB per chip | TFLOP per chip-step "
          "| tokens/s bound | $ per 1B tokens at 50% MFU |")
    print("|---|---|---|---|---|---|---|")
    for r in done:
        print(row(r))


if __name__ == "__main__":
    main()
