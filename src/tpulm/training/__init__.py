"""Training: settings, the loop, inputs and masking, objective, optimizer, checkpoints, devices.

The entry point is ``run(TrainConfig(...)) -> TrainResult`` (``tpulm train``)::

    from tpulm.training import TrainConfig, run
    result = run(TrainConfig(train_data="shards/train", run_dir="runs/tiny", model="tiny",
                             tokenizer="tokenizer", max_steps=100))

Importing this package imports neither Keras nor TensorFlow: ``run`` selects the Keras backend
first (``TrainConfig.backend``), then builds the graph.
"""

from tpulm.training.config import TrainConfig, TrainResult, table_from_args
from tpulm.training.train import run

__all__ = ["TrainConfig", "TrainResult", "run", "table_from_args"]
