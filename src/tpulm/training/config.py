"""Settings and results of ``tpulm train``, and the arithmetic of its segments.

The loop is Keras ``model.fit`` with a custom loss and metrics (``keras.ops`` only), so the JAX
backend reuses it. Keras "epochs" are *segments* of ``gcd(log_every, eval_every,
checkpoint_every)`` update steps aligned on step 0: at the end of a segment the loop's hooks
(``tpulm.training.hooks``) log train metrics, evaluate and checkpoint when due, so a run resumed from any checkpoint lands on
the same segment boundaries as an uninterrupted one. Data epochs are handled by ``tpulm.training.inputs``
(an endless, deterministic stream resumable at any batch).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from typing import Any

from tpulm import config
from tpulm.errors import TpulmError
from tpulm.model.config import ATTENTION_MODES, REMAT_MODES
from tpulm.training import backends
from tpulm.training.distribution import JIT_MODES
from tpulm.training.process import PRECISIONS

log = logging.getLogger(__name__)
setting = config.setting


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Settings of ``tpulm train`` (the ``[train]`` table of a config file)."""

    train_data: str = setting("", "training shards: a split folder or a glob (local or gs://)")
    eval_data: str | None = setting(None, "validation shards: a split folder or a glob")
    tokenizer: str | None = setting(None, "tokenizer folder (default: the run dir's copy)")
    run_dir: str = setting("runs/latest", "run dir (local or gs://); rerunning resumes it")
    model: str = setting("base", "model preset (tiny, small, base, large: RoBERTa; modernbert-tiny, "
                                 "modernbert-small, modernbert-base, modernbert-large) or a TOML file")
    batch_size: int = setting(32, "batch size per replica (global = per replica x replicas)")
    epochs: int | None = setting(None, "passes over the training data (default 1)")
    max_steps: int | None = setting(None, "optimizer steps (overrides --epochs)")
    learning_rate: float = setting(1e-4, "peak learning rate")
    warmup: float = setting(0.05, "warmup: a fraction of the steps if < 1, else a step count")
    weight_decay: float = setting(0.01, "AdamW weight decay (not on LayerNorm and biases)")
    clip_norm: float = setting(1.0, "global gradient-norm clipping (0: off)")
    gradient_accumulation: int = setting(1, "micro-batches per optimizer step")
    mlm_probability: float = setting(0.15, "share of maskable tokens selected for prediction")
    mask_token_rate: float = setting(0.8, "share of selected tokens replaced by [MASK]")
    random_token_rate: float = setting(0.1, "share of selected tokens replaced by a random token")
    whole_word_mask: bool = setting(
        False, "select whole words (all their pieces) for prediction, not single pieces")
    document_attention: bool = setting(
        False, "packed documents attend only within themselves, positions restart per document")
    attention: str = setting(
        "auto", "attention path: auto (sliding windows in blocks, splash on TPU, cuDNN on GPU) or "
                "dense (the masked reference); the same function", choices=ATTENTION_MODES)
    remat: str = setting(
        "none", "recompute in the backward pass instead of keeping activations: none, block (each "
                "transformer block), full (blocks and the LM head)", choices=REMAT_MODES)
    init_from: str | None = setting(
        None, "start from the weights of a run dir, checkpoint or export folder (fresh optimizer "
              "and schedule): ModernBERT's context extension at a new --max-length")
    seed: int = setting(0, "seed of initialisation, data order, masks and dropout")
    shuffle_buffer: int = setting(10_000, "records per window of the sample shuffle")
    log_every: int = setting(100, "steps between train lines in metrics.jsonl")
    eval_every: int = setting(1000, "steps between evaluations (and one at the end)")
    checkpoint_every: int = setting(1000, "steps between checkpoints (and one at the end)")
    keep_checkpoints: int = setting(3, "checkpoints kept (older ones are deleted)")
    precision: str = setting("fp32", "fp32, mixed_bfloat16 or mixed_float16", choices=PRECISIONS)
    backend: str | None = setting(
        None, "Keras backend, tensorflow or jax (default: KERAS_BACKEND, else tensorflow)",
        choices=backends.BACKENDS)
    mesh: str | None = setting(
        None, "JAX device mesh data=D,model=M: weights sharded over model (default: data parallel)")
    tpu: str | None = setting(None, "TPU: 'local' on a TPU VM, or the TPU's name")
    tpu_zone: str | None = setting(None, "GCP zone of the TPU")
    gcp_project: str | None = setting(None, "GCP project of the TPU")
    jit_compile: str = setting(
        "auto", "XLA: auto (on, but off for mixed_bfloat16 on CPU where oneDNN is faster), true, false",
        choices=JIT_MODES,
    )
    steps_per_execution: int = setting(0, "steps per compiled call (0: automatic)")
    deterministic: bool = setting(False, "enable TensorFlow op determinism (slower)")
    peak_tflops: float | None = setting(None, "peak TFLOP/s for the MFU estimate (default: measured matmul)")
    progress: bool = setting(
        True, "show a progress line (step, loss, masked accuracy, tokens/s, ETA)")
    push_to_hub: str | None = setting(
        None, "at the end, export to RUN_DIR/export and upload it to this Hub repo id (private)")

    def __post_init__(self) -> None:
        positive = ("batch_size", "gradient_accumulation", "log_every", "eval_every",
                    "checkpoint_every", "keep_checkpoints", "shuffle_buffer")
        for name in positive:
            if getattr(self, name) < 1:
                raise TpulmError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("epochs", "max_steps"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise TpulmError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.learning_rate <= 0 or self.warmup < 0 or self.clip_norm < 0 or self.weight_decay < 0:
            raise TpulmError("learning_rate must be positive; warmup, clip_norm, weight_decay >= 0")
        if self.steps_per_execution < 0:
            raise TpulmError("steps_per_execution must be >= 0 (0: automatic)")
        config.check_choices(self)
        self._check_masking()

    def _check_masking(self) -> None:
        """Rates are fractions (15 for 15% would fail deep in the masking), the seed >= 0."""
        config.check_fraction(self, "mlm_probability", zero=False)
        config.check_fraction(self, "mask_token_rate", "random_token_rate")
        if self.mask_token_rate + self.random_token_rate > 1.0 + 1e-9:
            raise TpulmError(
                f"mask_token_rate + random_token_rate (--mask-token-rate, --random-token-rate) "
                f"must be at most 1, got {self.mask_token_rate} + {self.random_token_rate}")
        config.check_at_least(self, 0, "seed")


# Settings a run continues with when they change: its length, logging, placement. Its steps so
# far stay valid, so `tpulm train` says nothing and `tpulm run` continues without --restart train.
CONTINUABLE = frozenset({
    "epochs", "max_steps", "log_every", "eval_every", "checkpoint_every", "keep_checkpoints",
    "progress", "jit_compile", "steps_per_execution", "peak_tflops", "push_to_hub", "backend",
    "mesh", "tpu", "tpu_zone", "gcp_project", "deterministic"})
# ... and where things are (a different --model is refused on its own). A change of any other
# setting is named when a run continues: its steps so far were trained with the recorded value.
BOOKKEEPING = CONTINUABLE | {"train_data", "eval_data", "tokenizer", "run_dir", "model"}


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What a training run did.

    Attributes:
        run_dir: the run dir.
        step: optimizer steps done in total (including earlier sessions).
        steps_this_session: steps done by this call.
        tokens: token positions trained on in total (batch x sequence length x steps).
        wall_time: seconds this call took.
        tokens_per_second: training throughput of this call, evaluation and saving excluded:
            the mean of its train lines' tokens/s after the first (which includes the
            compilation), the figure ``tpulm report`` shows for a run of one call.
        mfu: model FLOPs utilisation estimate, against ``peak_flops``.
        peak_flops: the peak used for ``mfu`` (FLOP/s, all replicas).
        eval: last evaluation (``loss``, ``accuracy``, ``perplexity``), or None.
        checkpoint: folder of the last checkpoint.
    """

    run_dir: str
    step: int
    steps_this_session: int
    tokens: int
    wall_time: float
    tokens_per_second: float
    mfu: float
    peak_flops: float
    eval: dict[str, float] | None
    checkpoint: str | None


def table_from_args(args) -> tuple[TrainConfig, dict[str, Any]]:
    """``TrainConfig`` and ``[model]`` table from CLI args: defaults < ``--config`` file < flags."""
    train_cfg = config.from_args(TrainConfig, args, "train")
    tables = config.load_tables(args.config) if getattr(args, "config", None) else {}
    return train_cfg, dict(tables.get("model", {}))


def progress_verbosity(enabled: bool) -> int:
    """Progress display: 1 a line redrawn in place on a terminal, 2 plain lines otherwise, 0 off."""
    if not enabled:
        return 0
    return 1 if sys.stdout.isatty() else 2


def segment_length(cfg: TrainConfig) -> int:
    """Update steps per Keras epoch: every log, eval and checkpoint step is a boundary."""
    return math.gcd(cfg.log_every, math.gcd(cfg.eval_every, cfg.checkpoint_every))


def fit_calls(start: int, total: int, segment: int) -> list[tuple[int, int, int]]:
    """``model.fit`` calls from step ``start`` to ``total``: (first step, steps per epoch, epochs).

    Segments are aligned on multiples of ``segment``; a start inside a segment gets a short first
    call, and the last segment may be cut short (the callbacks stop training at ``total``).
    """
    calls = []
    if start % segment and start < total:
        first = min(segment - start % segment, total - start)
        calls.append((start, first, 1))
        start += first
    if start < total:
        calls.append((start, segment, math.ceil((total - start) / segment)))
    return calls


def steps_per_execution(cfg: TrainConfig, calls, total: int, accumulation: int) -> int:
    """Micro-steps per compiled call: divides every segment and the end, at most 32."""
    lengths = [steps for _, steps, _ in calls] + [total - s for s, _, _ in calls]
    g = 0
    for n in lengths:
        g = math.gcd(g, n * accumulation)
    if cfg.steps_per_execution:
        if g % cfg.steps_per_execution:
            raise TpulmError(
                f"steps_per_execution {cfg.steps_per_execution} must divide {g} (segment length "
                "gcd(log_every, eval_every, checkpoint_every) x gradient_accumulation, and the rest)"
            )
        return cfg.steps_per_execution
    return max(d for d in range(1, min(g, 32) + 1) if g % d == 0) if g else 1
