"""Hydra sweeps in MLflow: one parent run per multirun, one child run per job.

    python src/train.py -m model=bahdanau,transformer optimizer.lr=1e-3,3e-4

Each job of ``src/train.py`` calls :func:`sweep_job` first (a single run is left alone): it
moves the job's outputs into its Hydra output dir, ``<sweep dir>/<job num>/``, and returns
the tags of the job's run, ``mlflow.parentRunId`` (MLflow nests runs by it) among them. The
parent, one per sweep and per tracking URI and experiment, is found by its tags
(``sweep.parent``, and ``sweep.id``: the random id the sweep dir keeps in ``.mlflow-sweep-id``,
so a moved project finds its parents, and a new sweep in the folder of a deleted one gets its
own) or created by the first job that finds none, under a lock file in the sweep dir (parallel
launchers, DDP ranks). What the sweep varies is read from the
``multirun.yaml`` Hydra's sweeper saves in the sweep dir.

:class:`MLflowSweepCallback` (``hydra.callbacks`` in ``conf/config.yaml``) ends the parents:
FAILED when a job fails, FINISHED when every job is done, KILLED when the sweeping process
exits before (Ctrl-C; SIGTERM while training, which train.py turns into an exit). The same
command again with ``hydra.sweep.dir=<that sweep dir>`` reopens them, and each job resumes
from its own ``last.ckpt`` in its own MLflow run (attnlab.lit.resume).
"""

from __future__ import annotations
