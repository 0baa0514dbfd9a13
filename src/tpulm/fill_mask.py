"""Fill-mask with the native Keras model (no PyTorch): answers like Transformers' pipeline.

A model is a run dir (latest checkpoint, or ``step``), one checkpoint folder of a run dir, or an
exported Transformers folder. Texts hold the tokenizer's mask token (``[MASK]``, ``<mask>``) or
the placeholder ``{mask}``, which becomes it: prompts written once (the built-in corpus', a run
config's) then answer with every tokenizer family. Results have the pipeline's shape and fields:
for a text with one mask a list of ``{"score", "token", "token_str", "sequence"}``, with several
masks one such list per mask (each filled on its own, the other masks left in ``sequence``, as the
pipeline does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tpulm import config, storage, trained_model
from tpulm.data.tokenizer import MASK_PLACEHOLDER, open_folder
from tpulm.errors import TpulmError

BATCH_SIZE = 32
# Transformers' ``clean_up_tokenization`` (applied when tokenizer_config.json asks for it).
_CLEANUPS = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
             (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


@dataclass(frozen=True)
class FillMaskConfig:
    """Settings of ``tpulm fill-mask``."""

    model: str = config.setting("", "run dir, checkpoint folder or exported Transformers folder")
    texts: tuple[str, ...] = config.setting(
        (), "texts with the mask token or {mask}; none: read stdin")
    top_k: int = config.setting(5, "predictions per mask")
    step: int | None = config.setting(None, "checkpoint step of a run dir (default: latest)")

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise TpulmError(f"top_k must be at least 1, got {self.top_k}")


@dataclass
class Predictor:
    """A loaded model with its tokenizer, ready for :func:`fill_mask`."""

    model: Any  # tpulm.model.masked_lm.MaskedLM, from tpulm.model.networks.build_model
    tokenizer: Any  # tokenizers.Tokenizer
    mask_id: int
    pad_id: int
    max_length: int
    clean_up_spaces: bool

    @property
    def mask_token(self) -> str:
        return self.tokenizer.id_to_token(self.mask_id)

    def prompt(self, text: str) -> str:
        """``text`` with every ``{mask}`` placeholder replaced by this tokenizer's mask token."""
        return text.replace(MASK_PLACEHOLDER, self.mask_token)


def load_predictor(path: str, step: int | None = None) -> Predictor:
    """Load a model for fill-mask from a run dir, a checkpoint folder or an export folder.

    Args:
        path: the folder (local or remote).
        step: checkpoint step when ``path`` is a run dir; None for the latest.
    """
    loaded = trained_model.load(path, step)
    tok = open_folder(loaded.tokenizer_dir)
    return Predictor(model=loaded.model, tokenizer=tok.tokenizer, mask_id=tok.special.mask_id,
                     pad_id=tok.special.pad_id, max_length=loaded.config.max_positions,
                     clean_up_spaces=bool(tok.settings.get("clean_up_tokenization_spaces", False)))


def _encode(predictor: Predictor, text: str) -> list[int]:
    ids = predictor.tokenizer.encode(predictor.prompt(text)).ids
    if predictor.mask_id not in ids:
        raise TpulmError(f"text {text!r} has no mask token: write {predictor.mask_token} (or "
                         f"{MASK_PLACEHOLDER}) where the word to predict goes")
    if len(ids) > predictor.max_length:
        raise TpulmError(f"text {text[:40]!r}... is {len(ids)} tokens long; the model takes at "
                         f"most {predictor.max_length}")
    return ids


def _mask_logits(predictor: Predictor, rows: list[list[int]]) -> list[np.ndarray]:
    """Logits at the mask positions of each row: a list of (masks in row, vocab) arrays."""
    from keras import ops

    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), predictor.pad_id, dtype=np.int32)
    mask = np.zeros_like(ids)
    positions = [[i for i, t in enumerate(r) if t == predictor.mask_id] for r in rows]
    gathered = np.zeros((len(rows), max(len(p) for p in positions)), dtype=np.int32)
    for i, (row, where) in enumerate(zip(rows, positions)):
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
        gathered[i, : len(where)] = where
    # The head runs on the mask positions only: (batch, masks, vocab).
    logits = ops.convert_to_numpy(predictor.model(
        {"input_ids": ids, "attention_mask": mask, "masked_positions": gathered}, training=False))
    return [logits[i, : len(p)] for i, p in enumerate(positions)]


def _decode(predictor: Predictor, ids: list[int], skip_special: bool) -> str:
    text = predictor.tokenizer.decode(ids, skip_special_tokens=skip_special)
    if predictor.clean_up_spaces:
        for old, new in _CLEANUPS:
            text = text.replace(old, new)
    return text


def _predictions(predictor: Predictor, ids: list[int], logits: np.ndarray, top_k: int):
    """The pipeline's answer for one text from its (masks, vocab) logits."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)
    where = [i for i, t in enumerate(ids) if t == predictor.mask_id]
    single = len(where) == 1
    answers = []
    for position, row in zip(where, probs):
        best = np.argsort(-row, kind="stable")[:top_k]
        answer = []
        for token in best.tolist():
            filled = list(ids)
            filled[position] = token
            answer.append({"score": float(row[token]), "token": token,
                           "token_str": _decode(predictor, [token], False),
                           "sequence": _decode(predictor, filled, single)})
        answers.append(answer)
    return answers[0] if single else answers


def fill_mask(predictor: Predictor, texts: list[str], top_k: int = 5) -> list[Any]:
    """Fill the mask token(s) of each text; one pipeline-shaped result per text.

    Args:
        predictor: from :func:`load_predictor`.
        texts: texts containing the mask token (e.g. ``[MASK]``) or ``{mask}``.
        top_k: predictions per mask.
    """
    encoded = [_encode(predictor, text) for text in texts]
    results: list[Any] = []
    for start in range(0, len(encoded), BATCH_SIZE):
        chunk = encoded[start : start + BATCH_SIZE]
        for ids, logits in zip(chunk, _mask_logits(predictor, chunk)):
            results.append(_predictions(predictor, ids, logits, top_k))
    return results


def run(settings: FillMaskConfig) -> list[Any]:
    """Load ``settings.model`` and fill the masks of ``settings.texts``."""
    if not settings.texts:
        raise TpulmError("no text given: pass texts with the mask token, or pipe them to stdin")
    storage.check_reachable(settings.model, "model")  # one line, not a raw TensorFlow error
    predictor = load_predictor(settings.model, settings.step)
    return fill_mask(predictor, list(settings.texts), settings.top_k)


def format_result(text: str, result: list[Any]) -> str:
    """Human-readable lines for one text's result (one block per mask)."""
    per_mask = result if result and isinstance(result[0], list) else [result]
    lines = [text]
    for number, answers in enumerate(per_mask, start=1):
        if len(per_mask) > 1:
            lines.append(f"  mask {number}:")
        lines += [f"  {a['score']:.4f}  {a['token_str']!r:<16} {a['sequence']}" for a in answers]
    return "\n".join(lines)
