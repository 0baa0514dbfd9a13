"""Sizes of a masked language model (``ModelConfig``), shipped presets and a run dir's model.

Keras-free: reading a config, a preset or a run dir's ``[model]`` table imports no Keras or
TensorFlow; the networks live beside it (:mod:`tpulm.model.networks` builds them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tpulm import config, rundir, storage
from tpulm.data import tokenizer
from tpulm.errors import TpulmError

PRESETS = ("tiny", "small", "base", "large", "modernbert-tiny", "modernbert-small",
           "modernbert-base", "modernbert-large")
ARCHITECTURES = ("roberta", "modernbert")
# First component of every variable path of a model, per architecture (the weight maps rely on it).
MODEL_NAMES = {"roberta": "roberta_mlm", "modernbert": "modernbert_mlm"}
# ModernBERT activations (Transformers' names) -> whether GELU uses the tanh approximation.
# How the networks compute (tpulm.model.networks.build_model), not what: never saved in [model].
ATTENTION_MODES = ("auto", "dense")  # tpulm.model.attention.attend
REMAT_MODES = ("none", "block", "full")  # tpulm.model.masked_lm.remat_call
GELU_APPROXIMATE = {"gelu": False, "gelu_pytorch_tanh": True, "gelu_new": True}


@dataclass(frozen=True)
class ModelConfig:
    """Sizes and architecture of a masked language model, RoBERTa or ModernBERT (the ``[model]``
    table of a config file)."""

    vocab_size: int = dataclasses.field(
        metadata={"help": "vocabulary size; always taken from the tokenizer", "cli": False})
    hidden_size: int = config.setting(768, "width of the hidden states")
    num_layers: int = config.setting(12, "number of transformer blocks")
    num_heads: int = config.setting(12, "attention heads per block")
    intermediate_size: int = config.setting(3072, "width of the feed-forward layer")
    max_position_embeddings: int = config.setting(
        514, "rows of the position table; RoBERTa uses pad_token_id + 1 of them as offset"
    )
    type_vocab_size: int = config.setting(1, "rows of the token-type table (RoBERTa: 1)")
    pad_token_id: int = config.setting(1, "id of the padding token; always taken from the tokenizer")
    layer_norm_eps: float = config.setting(1e-5, "LayerNorm epsilon")
    hidden_dropout: float = config.setting(0.1, "dropout on embeddings and block outputs")
    attention_dropout: float = config.setting(0.1, "dropout on attention probabilities")
    initializer_range: float = config.setting(0.02, "stddev of the truncated-normal initializer")
    architecture: str = config.setting(
        "roberta", "network: roberta, or modernbert (tpulm.model.modernbert)", choices=ARCHITECTURES)
    # ModernBERT only (ignored by RoBERTa); names and defaults as Transformers' ModernBertConfig.
    global_rope_theta: float = config.setting(160000.0, "modernbert: RoPE base of global layers")
    local_rope_theta: float = config.setting(10000.0, "modernbert: RoPE base of local layers")
    local_attention: int = config.setting(
        128, "modernbert: sliding window of local layers (tokens; local_attention // 2 each side)")
    global_attn_every_n_layers: int = config.setting(
        3, "modernbert: layers 0, n, 2n, ... attend globally, the others in the sliding window")
    activation: str = config.setting(
        "gelu", "modernbert: MLP and head activation (gelu = erf, gelu_pytorch_tanh = tanh)")
    norm_bias: bool = config.setting(False, "modernbert: LayerNorms have a bias")
    attention_bias: bool = config.setting(False, "modernbert: Wqkv and Wo have biases")
    mlp_bias: bool = config.setting(False, "modernbert: MLP Wi and Wo have biases")
    classifier_bias: bool = config.setting(False, "modernbert: the LM-head dense has a bias")
    decoder_bias: bool = config.setting(True, "modernbert: the tied decoder has a bias")
    initializer_cutoff_factor: float = config.setting(
        2.0, "modernbert: truncated-normal init cut at +-factor x std")

    def __post_init__(self) -> None:
        positive = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                    "max_position_embeddings", "type_vocab_size")
        for name in positive:
            if getattr(self, name) <= 0:
                raise TpulmError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise TpulmError(
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}"
            )
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise TpulmError(f"pad_token_id {self.pad_token_id} is outside vocab_size {self.vocab_size}")
        if self.max_positions < 1:
            raise TpulmError(
                f"max_position_embeddings {self.max_position_embeddings} leaves no position after "
                f"the offset pad_token_id + 1 = {self.pad_token_id + 1}"
            )
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise TpulmError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.layer_norm_eps <= 0 or self.initializer_range <= 0:
            raise TpulmError("layer_norm_eps and initializer_range must be positive")
        if self.architecture not in ARCHITECTURES:
            raise TpulmError(
                f"architecture must be one of {ARCHITECTURES}, got {self.architecture!r}")
        if self.architecture == "modernbert":
            _check_modernbert(self)

    @property
    def max_positions(self) -> int:
        """Longest sequence the model accepts: RoBERTa's positions start at pad_token_id + 1
        (ModernBERT's rotary positions have no offset)."""
        if self.architecture == "modernbert":
            return self.max_position_embeddings
        return self.max_position_embeddings - self.pad_token_id - 1

    @property
    def model_name(self) -> str:
        """The first component of the network's variable paths."""
        return MODEL_NAMES[self.architecture]


def _check_modernbert(cfg: ModelConfig) -> None:
    """Raise TpulmError for ModernBERT settings the network cannot run."""
    head_dim, rest = divmod(cfg.hidden_size, cfg.num_heads)
    if rest or head_dim % 2:
        raise TpulmError(f"modernbert needs an even head size hidden_size / num_heads for RoPE, "
                         f"got {cfg.hidden_size} / {cfg.num_heads}")
    for name in ("local_attention", "global_attn_every_n_layers", "global_rope_theta",
                 "local_rope_theta", "initializer_cutoff_factor"):
        if getattr(cfg, name) <= 0:
            raise TpulmError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.activation not in GELU_APPROXIMATE:
        raise TpulmError(f"activation must be one of {sorted(GELU_APPROXIMATE)}, "
                         f"got {cfg.activation!r}")



def preset_path(name: str) -> str:
    """Path of the shipped preset ``name`` (one of :data:`PRESETS`)."""
    from importlib import resources

    return str(resources.files("tpulm") / "configs" / f"{name}.toml")


def model_table(path: str) -> dict[str, Any]:
    """The ``[model]`` table of a TOML config file (local or remote); empty if it has none."""
    table = config.load_toml(path).get("model", {})
    if not isinstance(table, dict):
        raise TpulmError(f"[model] in {path} must be a table")
    return dict(table)


def load_model_preset(name_or_path: str) -> dict[str, Any]:
    """The ``[model]`` table of a preset name (one of :data:`PRESETS`) or a TOML file path.

    The table never holds ``vocab_size`` or ``pad_token_id`` for presets: those come from the
    tokenizer; combine with ``config.resolve(ModelConfig, table=..., vocab_size=...)``.

    Args:
        name_or_path: a preset name or the path of a TOML file with a ``[model]`` table.
    """
    if name_or_path in PRESETS:
        return model_table(preset_path(name_or_path))
    if not storage.exists(name_or_path):
        raise TpulmError(
            f"model preset {name_or_path!r} is neither one of {', '.join(PRESETS)} nor a file"
        )
    return model_table(name_or_path)


def run_model_config(run_dir: str) -> ModelConfig:
    """The model config of a run dir: its ``config.toml`` ``[model]`` table, checked against the
    run's tokenizer (``vocab_size`` and ``pad_token_id`` are filled in from it when absent).

    Args:
        run_dir: a run dir (local or remote), see :mod:`tpulm.rundir`.
    """
    path = storage.join(run_dir, rundir.CONFIG_NAME)
    if not storage.exists(path):
        raise TpulmError(f"{run_dir} is not a run dir: it has no {rundir.CONFIG_NAME}")
    table = model_table(path)
    tok_dir = storage.join(run_dir, rundir.TOKENIZER_DIR)
    tok = tokenizer.open_folder(tok_dir)
    special, vocab = tok.special, tok.vocab_size
    table.setdefault("vocab_size", vocab)
    table.setdefault("pad_token_id", special.pad_id)
    cfg = config.from_mapping(ModelConfig, table, f"[model] of {path}")
    if cfg.pad_token_id != special.pad_id or cfg.vocab_size < vocab:
        raise TpulmError(
            f"[model] of {path} (vocab_size {cfg.vocab_size}, pad_token_id {cfg.pad_token_id}) "
            f"does not fit the tokenizer in {tok_dir} (vocab size {vocab}, pad id "
            f"{special.pad_id}); the run dir is inconsistent"
        )
    return cfg
