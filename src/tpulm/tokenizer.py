"""Train, save and load tokenizers (Hugging Face ``tokenizers``), and fingerprint them."""

from __future__ import annotations

import dataclasses
import hashlib
import json

from tpulm import storage
from tpulm.errors import TpulmError

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
SPECIAL_ROLES = ("cls_token", "sep_token", "unk_token", "pad_token", "mask_token")


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    """Ids of the special tokens a masked language model needs."""

    cls_id: int
    sep_id: int
    unk_id: int
    pad_id: int
    mask_id: int

    @property
    def ids(self) -> tuple[int, ...]:
        return (self.cls_id, self.sep_id, self.unk_id, self.pad_id, self.mask_id)


def load_tokenizer(tokenizer_dir: str):
    """The ``tokenizers.Tokenizer`` saved in ``tokenizer_dir`` (local or remote)."""
    from tokenizers import Tokenizer

    path = storage.join(tokenizer_dir, TOKENIZER_FILE)
    if not storage.exists(path):
        raise TpulmError(
            f"no {TOKENIZER_FILE} in {tokenizer_dir}; train one with `tpulm tokenizer train`"
        )
    return Tokenizer.from_str(storage.read_text(path))


def fingerprint(tokenizer_dir: str) -> str:
    """SHA-256 of ``tokenizer.json``: later stages check that shards and models agree on it."""
    return hashlib.sha256(storage.read_bytes(storage.join(tokenizer_dir, TOKENIZER_FILE))).hexdigest()


def special_tokens(tokenizer_dir: str) -> SpecialTokens:
    """Ids of cls/sep/unk/pad/mask as ``tokenizer_config.json`` names them."""
    config_path = storage.join(tokenizer_dir, TOKENIZER_CONFIG_FILE)
    if not storage.exists(config_path):
        raise TpulmError(f"no {TOKENIZER_CONFIG_FILE} in {tokenizer_dir}; is it a tokenizer folder?")
    config = json.loads(storage.read_text(config_path))
    tokenizer = load_tokenizer(tokenizer_dir)
    ids = {}
    for role in SPECIAL_ROLES:
        token = config.get(role)
        if isinstance(token, dict):  # AddedToken serialisation
            token = token.get("content")
        token_id = tokenizer.token_to_id(token) if token else None
        if token_id is None:
            raise TpulmError(
                f"tokenizer in {tokenizer_dir} lacks a {role} ({token!r}); a masked language model "
                "needs cls, sep, unk, pad and mask tokens: retrain it with `tpulm tokenizer train`"
            )
        ids[role.replace("_token", "_id")] = token_id
    return SpecialTokens(**ids)
