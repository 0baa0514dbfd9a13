"""Data: corpus sources, the built-in corpus, tokenizers, the shard format, prepare and inspect."""
