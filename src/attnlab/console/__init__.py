"""What the stages print: quiet logs, a line per epoch when no bar is drawn, a summary at the end.

Every Hydra app in ``src/`` calls :func:`attnlab.console.logs.setup` first. Then:

* **Known noise is hidden** (unless ``ATTNLAB_VERBOSE=1``): Lightning's tips, its
  "Experiment ... not found. Creating it." and val_check_interval notices, MLflow's INFO lines
  (database creation, alembic, model signatures; through ``MLFLOW_LOGGING_LEVEL=WARNING``),
  MLflow's artifact download bars, and the warnings listed in
  :data:`attnlab.console.logs.NOISE_WARNINGS`.
* **Under** ``dvc repro`` (DVC sets ``DVC_STAGE`` for every stage command) the run is quiet too:
  Lightning's INFO banners (GPU/TPU available, seed, "fit stopped", restoring checkpoints),
  its model summary table and the per-rank checkpoint log line are hidden (the last stays in
  the Hydra log file). Warnings and errors always show, and so do the INFO lines of attnlab's
  own loggers (``train``'s resume notices, for one).
* **Progress**: on a terminal, Lightning's progress bar, with the step's ``loss`` and the epoch's
  running ``tokens/s`` (``attnlab.lit.translation``). When stdout is not a terminal (a log
  file, CI, ``dvc repro > log``) or the bar is off (``trainer.enable_progress_bar=false``),
  :class:`attnlab.lit.progress.EpochLines` prints one line per epoch instead, no
  carriage-return bar.
* **A summary** ends every stage: ``*_summary`` in :mod:`attnlab.console.summaries`, at most
  about 15 ASCII lines in a ``key : value`` layout.

One job per module; import the one you need (this package re-exports nothing):

* :mod:`attnlab.console.logs`: the log and warning filters, :func:`~attnlab.console.logs.setup`,
  hiding MLflow's registry prints.
* :mod:`attnlab.console.errors`: how an app ends on an error, :func:`~attnlab.console.errors.user_errors`
  (under every ``@hydra.main``): a user's error as its message alone, a bug with its traceback.
* :mod:`attnlab.console.summaries`: the ``key : value`` block and the stage summaries.
* :mod:`attnlab.console.runs`: what the summaries read from MLflow (the kept epoch, links).
* :mod:`attnlab.console.epoch_table`: the numbers of an epoch line, shared with
  :mod:`attnlab.lit.progress`.
* The progress callbacks, and :func:`attnlab.lit.progress.console_callbacks` that picks among
  them, are in :mod:`attnlab.lit.progress`: they subclass Lightning's classes, and importing
  Lightning takes seconds, which the stages that never train (download, tokenize) are spared.
  Nothing here imports Lightning.
"""
