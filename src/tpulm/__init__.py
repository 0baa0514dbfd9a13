"""tpulm: pretrain RoBERTa or ModernBERT masked language models, export them to Transformers."""

__version__ = "0.1.0"
