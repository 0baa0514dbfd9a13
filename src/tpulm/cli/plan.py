"""`tpulm plan`: compile the JAX train step for a Cloud TPU topology; fit, speed and cost."""

from __future__ import annotations

import argparse
import json
import os

from tpulm import config

ORDER = 35
# tpulm train settings that change nothing in the compiled step: no flags for them here (a
# [train] table holding them is still accepted, so one config file serves both commands).
_NOT_IN_STEP = (
    "train_data", "eval_data", "run_dir", "epochs", "max_steps", "shuffle_buffer", "log_every",
    "eval_every", "checkpoint_every", "keep_checkpoints", "backend", "tpu", "tpu_zone",
    "gcp_project", "jit_compile", "steps_per_execution", "deterministic", "peak_tflops",
    "progress", "push_to_hub",
)


def register(subparsers) -> None:
    """Add the plan command."""
    from tpulm.training.config import TrainConfig
    from tpulm.training.plan import PlanConfig

    parser = subparsers.add_parser(
        "plan",
        help="compile the JAX train step for a TPU topology (no TPU needed): fits? speed, cost",
        description=(
            "Compile the step `tpulm train --backend jax` runs for a Cloud TPU slice, on any "
            "machine (needs libtpu: pip install 'tpulm[tpu]'), and report per-chip HBM, FLOPs, "
            "a roofline bound on tokens/s and the cost of a run. Exit 0 if it fits, 1 if not. "
            "Settings as tpulm train: defaults < [train], [model] and [plan] of --config < flags."
        ),
    )
    parser.add_argument("--config", metavar="FILE", help="TOML file with [train], [model], [plan]")
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    config.add_arguments(parser, PlanConfig)
    config.add_arguments(parser, TrainConfig, skip=_NOT_IN_STEP)
    parser.set_defaults(func=_plan)


def _plan(args: argparse.Namespace) -> int:
    from tpulm import training
    from tpulm.training import backends

    # Planning needs no accelerator: CPU only, so a libtpu beside jax does not probe for TPUs.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        backends.activate("jax")
    except backends.BackendMismatch as err:
        backends.reexec(err.wanted)
    from tpulm.training import plan

    cfg, model_table = training.table_from_args(args)
    result = plan.run(config.from_args(plan.PlanConfig, args, "plan"), cfg, model_table)
    print(json.dumps(result.to_dict(), indent=2) if args.json else plan.summary(result))
    return 0 if result.fits else 1
