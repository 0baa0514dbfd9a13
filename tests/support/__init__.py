"""Helpers shared by the tests: real text, tokenizers, shards, tiny models, JAX subprocesses."""
