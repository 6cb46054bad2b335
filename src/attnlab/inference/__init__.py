"""Inference without a trainer: decoding (greedy, beam) and the evaluate stage.

* :mod:`attnlab.inference.decoding`: greedy and beam search over a model's
  ``init_state``/``step`` interface, batched, with the text in and out.
* :mod:`attnlab.inference.evaluation`: the ``evaluate`` stage's work (decode the test
  splits, score them with :mod:`attnlab.metrics`, write ``metrics/<model>.json``).

Nothing here imports Lightning: the device is resolved by :mod:`attnlab.device`.
"""
