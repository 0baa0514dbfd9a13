"""Helpers shared by the model, HF-interop and fill-mask tests (no tests in this module).

The tokenizer follows the reference recipe (Unigram, Metaspace, `[CLS] $A [SEP]`, special tokens
`[CLS]`, `[SEP]`, `<unk>`, `<pad>`, `[MASK]` in that id order) and is trained on real WikiText-2
lines in well under a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SPECIALS = ["[CLS]", "[SEP]", "<unk>", "<pad>", "[MASK]"]
PAD_ID = 3


def wikitext_lines(wikitext_dir: Path, count: int = 1500) -> list[str]:
    """The first ``count`` non-empty, non-heading lines of WikiText-2 valid."""
    lines = []
    for line in (wikitext_dir / "valid.txt").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("="):
            lines.append(line)
        if len(lines) == count:
            break
    return lines


def train_reference_tokenizer(lines: list[str], out_dir: Path, vocab_size: int = 600) -> Path:
    """Train the reference-recipe Unigram tokenizer on ``lines`` and save it to ``out_dir``."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence(
        [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, unk_token="<unk>"
    )
    tok.train_from_iterator(lines, trainer)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    roles = dict(zip(["cls_token", "sep_token", "unk_token", "pad_token", "mask_token"], SPECIALS))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 128, **roles}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "special_tokens_map.json").write_text(json.dumps(roles, indent=2))
    return out_dir


def sentences(lines: list[str], count: int) -> list[str]:
    """Single sentences of varied length cut from ``lines`` (padded batches need short rows)."""
    found = []
    for line in lines:
        found.extend(s.strip() + " ." for s in line.split(" . ") if len(s.split()) > 2)
    return found[:count]


def padded_batch(tokenizer, texts: list[str], max_len: int = 64) -> dict[str, np.ndarray]:
    """Each text on its own row ([CLS] ... [SEP]), right-padded with <pad> to the longest row."""
    rows = [tokenizer.encode(t).ids[:max_len] for t in texts]
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), PAD_ID, dtype=np.int32)
    mask = np.zeros((len(rows), width), dtype=np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def packed_batch(tokenizer, texts: list[str], rows: int, length: int) -> dict[str, np.ndarray]:
    """Encodings concatenated and cut into full blocks, as `tpulm data prepare` packs them:
    blocks contain `[SEP] [CLS]` boundaries inside them and no padding."""
    stream = [i for t in texts for i in tokenizer.encode(t).ids]
    if len(stream) < rows * length:
        raise ValueError("not enough text for the packed batch")
    ids = np.asarray(stream[: rows * length], dtype=np.int32).reshape(rows, length)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def randomize_torch_model(model, seed: int = 0) -> None:
    """Give every parameter (LayerNorm gains and biases too) random values, so a swapped or
    untransposed tensor changes the logits."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen) * 0.05
            param.copy_((1.0 if name.endswith("LayerNorm.weight") or
                          name.endswith("layer_norm.weight") else 0.0) + noise)


def hf_model(cfg, seed: int = 0):
    """A randomly initialised Transformers ``RobertaForMaskedLM`` (eager attention) for ``cfg``."""
    import torch
    from transformers import RobertaConfig, RobertaForMaskedLM

    from tpulm.hf import convert

    torch.manual_seed(seed)
    config = RobertaConfig(**convert.hf_model_kwargs(cfg))
    config._attn_implementation = "eager"
    model = RobertaForMaskedLM(config)
    randomize_torch_model(model, seed)
    return model.eval()


def torch_state(model) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def torch_logits(model, batch: dict[str, np.ndarray]) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model(
            input_ids=torch.from_numpy(batch["input_ids"].astype(np.int64)),
            attention_mask=torch.from_numpy(batch["attention_mask"].astype(np.int64)),
        )
    return out.logits.numpy()


def make_run_dir(run_dir: Path, tokenizer_dir: Path, table: dict, steps=(5, 10), seed: int = 0,
                 pad_id: int = PAD_ID):
    """A run dir as `tpulm train` leaves it: config.toml, tokenizer/, checkpoints with random
    (non-trivial: LayerNorms and biases too) weights written by tpulm.model.weights, metrics.jsonl.

    Returns the Keras model holding the weights of the last checkpoint, and its config.
    ``pad_id`` must be the tokenizer's (the reference Unigram's 3 by default).
    """
    import shutil

    from tpulm import config, rundir
    from tpulm.data.tokenizer import load_tokenizer
    from tpulm.model import weights
    from tpulm.model.config import ModelConfig
    from tpulm.model.networks import build_model

    vocab = load_tokenizer(str(tokenizer_dir)).get_vocab_size()
    cfg = ModelConfig(vocab_size=vocab, pad_token_id=pad_id, **table)
    run_dir.mkdir(parents=True)
    tables = {"model": config.as_table(cfg), "train": {"learning_rate": 1e-4, "batch_size": 8}}
    (run_dir / rundir.CONFIG_NAME).write_text(config.to_toml(tables))
    shutil.copytree(tokenizer_dir, run_dir / rundir.TOKENIZER_DIR)
    model = build_model(cfg)
    rng = np.random.default_rng(seed)
    for step in steps:
        for variable in model.weights:
            base = 1.0 if variable.path.endswith("gamma") else 0.0
            variable.assign(base + rng.normal(0, 0.05, variable.shape).astype("float32"))
        ckpt = Path(rundir.checkpoint_dir(str(run_dir), step))
        ckpt.mkdir(parents=True)
        weights.save(model.weights, str(ckpt / rundir.MODEL_WEIGHTS))
    lines = [{"split": "train", "step": s, "time": s * 1.0, "tokens": s * 1024, "loss": 6.0,
              "accuracy": 0.1, "learning_rate": 1e-4, "tokens_per_second": 100.0} for s in steps]
    lines.append({"split": "eval", "step": steps[-1], "time": 99.0, "tokens": steps[-1] * 1024,
                  "loss": 5.4321, "accuracy": 0.1234, "perplexity": 228.7})
    (run_dir / rundir.METRICS_NAME).write_text("".join(json.dumps(x) + "\n" for x in lines))
    return model, cfg
