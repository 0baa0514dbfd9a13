"""Models: the Keras-free ``ModelConfig`` and presets (``config``), the networks, weight files."""
