"""Hugging Face Transformers interop: the conversion map, folders, export, import and the Hub."""
