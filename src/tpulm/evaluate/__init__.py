"""Downstream evaluation: fine-tune the pretrained encoder on classification/regression tasks.

``tasks`` loads a task (GLUE by name, local files, or the built-in offline task), ``heads``
puts a classification or regression head on the encoder, ``finetune`` is the training loop,
``metrics`` the standard scores in numpy, and ``run`` the stage (``tpulm evaluate``).
"""
