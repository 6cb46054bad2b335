"""The checkpoints ``train.py`` writes, and ``Trainer.fit`` with what to do after a stop.

``checkpoints/<model>/`` holds the kept checkpoint (``checkpoint.filename``: the best by
``checkpoint.monitor``, the mean of the last ``checkpoint.average_last`` epochs' weights, or
the final weights) and, while training, ``last.ckpt`` (every epoch and every
``checkpoint.every_n_train_steps`` steps) that a killed run resumes from
(:mod:`attnlab.lit.resume`). The settings are ``conf/config.yaml``'s ``checkpoint`` block.
Every checkpoint is written whole or not at all (:class:`AtomicCheckpointIO`).
"""

from __future__ import annotations
