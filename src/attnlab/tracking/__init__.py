"""MLflow bookkeeping: where the store is, what a run records, and Hydra sweeps.

* :mod:`attnlab.tracking.store`: the store's URI (``sqlite:////<project>/mlflow.db`` unless
  ``MLFLOW_TRACKING_URI``), run records (``runs/<model>.json``), parameters.
* :mod:`attnlab.tracking.sweep`: the parent MLflow run of a Hydra multirun.
"""
