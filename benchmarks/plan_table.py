"""The README's `tpulm plan` table: the JAX train step compiled for Cloud TPU slices, no TPU needed.

Two grids, all mixed bfloat16, data parallel over the slice:

* ``readme`` (default): the reference recipe (roberta-base, seq 128, batch 32 per chip, 15%
  masking) and ModernBERT-base / -large at 512 x 16, 1024 x 8 and 8192 x 1 (sequence x batch per
  chip, 30% masking, vocabulary 50368), ``--attention auto``, on each of ``--topologies``;
* ``long-context``: modernbert-base at 1,024 / 2,048 / 4,096 / 8,192 x 2 per chip on
  v5litepod-4, ``--attention dense`` and ``auto`` (splash), each with ``--remat none`` and
  ``block``: GiB per chip as the context grows.

Columns: fits, HBM needed per chip, compiler TFLOP per chip and step (splash's FLOPs added by the
plan), the roofline bound on tokens/s and the cost of a billion tokens at the on-demand price and
50% MFU. Each case is one ``python -m tpulm plan --json`` (a compile of one to a few minutes on a
CPU core); a case that does not fit also compiles batch 1 for its batch estimate.

    PYTHONPATH=src python benchmarks/plan_table.py [--topologies v5litepod-8 v5p-8 v6e-8]
        [--cases roberta-base/128 modernbert-base/512 ...] [--out plan_table.jsonl]
    PYTHONPATH=src python benchmarks/plan_table.py --grid long-context --out long_context.jsonl

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

# name -> (preset, max length, batch per chip, mlm probability, attention, remat)
CASES = {
    "roberta-base/128": ("base", 128, 32, 0.15, "auto", "none"),
    "modernbert-base/512": ("modernbert-base", 512, 16, 0.3, "auto", "none"),
    "modernbert-base/1024": ("modernbert-base", 1024, 8, 0.3, "auto", "none"),
    "modernbert-base/8192": ("modernbert-base", 8192, 1, 0.3, "auto", "none"),
    "modernbert-large/512": ("modernbert-large", 512, 16, 0.3, "auto", "none"),
    "modernbert-large/1024": ("modernbert-large", 1024, 8, 0.3, "auto", "none"),
    "modernbert-large/8192": ("modernbert-large", 8192, 1, 0.3, "auto", "none"),
}
TOPOLOGIES = ("v5litepod-8", "v5p-8", "v6e-8")
LONG_CONTEXT = {
    f"modernbert-base/{length}x2/{attention}/remat-{remat}":
        ("modernbert-base", length, 2, 0.3, attention, remat)
    for length in (1024, 2048, 4096, 8192) for attention in ("dense", "auto")
    for remat in ("none", "block")
}
GRIDS = {"readme": (CASES, TOPOLOGIES), "long-context": (LONG_CONTEXT, ("v5litepod-4",))}
VOCAB = {"base": 50000, "modernbert-base": 50368, "modernbert-large": 50368}


def plan(case: str, settings: tuple, topology: str) -> dict:
    """One ``tpulm plan --json`` run; its JSON with the case, exit code and seconds added."""
    preset, length, batch, mlm, attention, remat = settings
    args = [sys.executable, "-m", "tpulm", "plan", "--topology", topology, "--model", preset,
            "--max-length", str(length), "--batch-size", str(batch), "--mlm-probability",
            str(mlm), "--vocab-size", str(VOCAB[preset]), "--precision", "mixed_bfloat16",
            "--attention", attention, "--remat", remat, "--tokens", "1e9", "--json"]
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
    parser.add_argument("--grid", choices=sorted(GRIDS), default="readme")
    parser.add_argument("--topologies", nargs="+", help="default: the grid's")
    parser.add_argument("--cases", nargs="+", help="default: all of the grid's")
    parser.add_argument("--out", default="plan_table.jsonl")
    args = parser.parse_args()
    cases, topologies = GRIDS[args.grid]
    unknown = set(args.cases or ()) - set(cases)
    if unknown:
        parser.error(f"--cases: {sorted(unknown)} are not in the {args.grid} grid: {list(cases)}")
    out = Path(args.out)
    done = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    seen = {(r["case"], r["topology"]) for r in done}
    for case in args.cases or cases:
        for topology in args.topologies or topologies:
            if (case, topology) in seen:
                continue
            result = plan(case, cases[case], topology)
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
