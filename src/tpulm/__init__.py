"""tpulm: pretrain RoBERTa-style masked language models from scratch, export to Transformers."""

__version__ = "0.1.0"
