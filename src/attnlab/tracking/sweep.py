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

import atexit
import fcntl
import logging
import os
import re
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from attnlab.console.errors import JobError
from attnlab.errors import DamagedFileError, UserError
from attnlab.files import write_text_atomic
from attnlab.tracking.store import check_tracking_server

log = logging.getLogger(__name__)

JOB_OUTPUTS = ("checkpoints", "runs", "plots")  # paths.* keys train.py writes to
_MAX_TAG, _MAX_NAME = 5000, 250  # MLflow allows 8000 characters per tag value, 250 per run name


@dataclass(frozen=True)
class SweepJob:
    """What a sweep job adds to its MLflow run: ``tags`` (``mlflow.parentRunId``, ``sweep.*``)
    and ``name_suffix`` (``-job1 model.net.d_model=32``: siblings get different names)."""

    tags: dict[str, str] = field(default_factory=dict)
    name_suffix: str = ""

    def run_name(self, name: str) -> str:
        """``name`` plus this job's suffix, cut to MLflow's 250 characters; a single run's unchanged."""
        return (name + self.name_suffix)[:_MAX_NAME] if self.name_suffix else name


SINGLE_RUN = SweepJob()


class SweepConfigError(UserError, ValueError):
    """A setting that cannot work inside a Hydra multirun."""


def sweep_job(cfg: DictConfig) -> SweepJob:
    """Prepare a multirun job of ``src/train.py``: :func:`redirect_outputs` in ``cfg``, and
    :func:`ensure_parent` (if MLflow fails there, the job runs unnested, with a warning).
    A single run gets :data:`SINGLE_RUN`.

    Raises:
        SweepConfigError: DDP with Lightning's own process launcher (``device=ddp``).
    """
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return SINGLE_RUN
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    hc = HydraConfig.get()
    _refuse_subprocess_ddp(cfg)
    overrides = list(hc.overrides.task)
    moved = redirect_outputs(cfg, Path(hc.runtime.output_dir), overrides)
    sweep_dir = _sweep_dir(hc)
    swept = swept_overrides(overrides, sweep_overrides(sweep_dir))
    tags = {
        "sweep.dir": str(sweep_dir),
        "sweep.job": str(hc.job.num),
        "sweep.overrides": " ".join(overrides if swept is None else swept)[:_MAX_TAG],
    }
    try:
        tags[MLFLOW_PARENT_RUN_ID] = ensure_parent(cfg, sweep_dir)
    except Exception as e:  # noqa: BLE001 - tracking must never stop training
        log.warning("no MLflow parent run for this sweep job (%s: %s)", type(e).__name__, str(e)[:300])
    log.info(
        "sweep job %s: outputs in %s (%s); MLflow parent run %s",
        hc.job.num,
        hc.runtime.output_dir,
        ", ".join(moved) or "none moved",
        tags.get(MLFLOW_PARENT_RUN_ID),
    )
    return SweepJob(tags, f"-job{hc.job.num}" + (f" {' '.join(swept)}" if swept else ""))


def _refuse_subprocess_ddp(cfg: DictConfig) -> None:
    """Lightning's DDP launcher re-runs ``sys.argv`` (``-m`` included) for each extra rank: a
    sweep inside every rank (Lightning-AI/pytorch-lightning#18175). Launchers that start the
    ranks themselves (torchrun, SLURM: ``LOCAL_RANK`` is set) are fine."""
    dev = cfg.get("device") or {}
    strategy = str(dev.get("strategy", ""))
    relaunches = strategy.startswith("ddp") and not any(s in strategy for s in ("spawn", "fork", "notebook"))
    several = (str(dev.get("devices", 1)), str(dev.get("num_nodes", 1))) != ("1", "1")
    if relaunches and several and "LOCAL_RANK" not in os.environ:
        raise SweepConfigError(
            f"device.strategy={strategy} with devices={dev.get('devices')} cannot run in a Hydra multirun: "
            "Lightning starts each extra rank by re-running the command line, -m included, which would "
            "start the whole sweep again in every rank. Run DDP trainings one at a time, without -m"
        )


def redirect_outputs(cfg: DictConfig, job_dir: Path, overrides: list[str]) -> list[str]:
    """Move the :data:`JOB_OUTPUTS` paths from ``paths.root`` to ``job_dir`` (``<root>/checkpoints/x``
    → ``<job_dir>/checkpoints/x``), except those ``overrides`` set or the config lacks; the keys moved."""
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    root = Path(cfg.paths.root)
    moved = []
    for key in JOB_OUTPUTS:
        if key not in cfg.paths or f"paths.{key}" in given:
            continue
        path = Path(cfg.paths[key])
        rel = path.relative_to(root) if path.is_relative_to(root) else Path(key)
        cfg.paths[key] = str(job_dir / rel)
        moved.append(key)
    return moved


def _sweep_dir(hydra: DictConfig) -> Path:
    """``hydra.sweep.dir``, absolute (Hydra's sweeper takes a relative one from ``runtime.cwd``)."""
    return Path(hydra.runtime.cwd, hydra.sweep.dir)


def sweep_overrides(sweep_dir: Path) -> list[str] | None:
    """The sweep's overrides as its sweeper combines them, ``hydra.sweeper.params`` then the
    command line's (``model.net.d_model=16,32``), from ``<sweep dir>/multirun.yaml``; ``None``
    when the sweeper saved none."""
    path = Path(sweep_dir, "multirun.yaml")
    if not path.exists():
        return None
    hydra = OmegaConf.to_container(OmegaConf.load(path).hydra, resolve=False)
    return [f"{k}={v}" for k, v in (hydra["sweeper"].get("params") or {}).items()] + hydra["overrides"][
        "task"
    ]


def swept_overrides(job_overrides: list[str], sweep: list[str] | None) -> list[str] | None:
    """The job's overrides of the keys the ``sweep`` overrides vary (``model.net.d_model=16``
    of ``model.net.d_model=16,32``), in the job's order; ``None`` when ``sweep`` is."""
    if sweep is None:
        return None
    parse = OverridesParser.create().parse_overrides
    keys = {o.get_key_element() for o in parse(sweep) if o.is_sweep_override()}
    return [o.input_line for o in parse(job_overrides) if o.get_key_element() in keys]


def sweep_models(sweep: list[str], model: str) -> str:
    """The parent run's ``model`` tag (every attnlab run has one): the models the ``sweep``
    overrides name, comma-joined (``bahdanau,transformer`` for ``model=bahdanau,transformer``),
    or ``model``, the first job's, when they name none."""
    for o in OverridesParser.create().parse_overrides(sweep):
        if o.get_key_element() == "model":
            model = ",".join(map(str, o.sweep_iterator())) if o.is_sweep_override() else o.value()
    return model


def _parent_name(sweep_dir: Path) -> str:
    """``sweep-2026-11-29_15-04-16`` for Hydra's default ``multirun/<date>/<time>``, else
    ``sweep-<basename>``."""
    name = sweep_dir.name
    if re.fullmatch(r"\d\d-\d\d-\d\d", name):
        name = f"{sweep_dir.parent.name}_{name}"
    return f"sweep-{name}"[:_MAX_NAME]


def _client(cfg: DictConfig):
    """A client of ``mlflow.tracking_uri``; a dead tracking server raises TrackingServerError at once."""
    from mlflow import MlflowClient

    check_tracking_server(cfg.mlflow.tracking_uri)
    return MlflowClient(tracking_uri=cfg.mlflow.tracking_uri)


@contextmanager
def _locked(sweep_dir: Path):
    """The sweep dir's lock (``flock`` on ``.mlflow-parent.lock``), held for the block."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with open(sweep_dir / ".mlflow-parent.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def _sweep_id(sweep_dir: Path) -> str:
    """The sweep's id (32 hex digits) from ``<sweep dir>/.mlflow-sweep-id``, made there by the
    first caller; call it under :func:`_locked` (or use :func:`_locked_sweep_id`)."""
    path = sweep_dir / ".mlflow-sweep-id"
    if not path.exists():
        write_text_atomic(path, uuid.uuid4().hex)  # never read back half-written
    return path.read_text().strip()


def _locked_sweep_id(sweep_dir: Path) -> str:
    """:func:`_sweep_id` under the sweep dir's lock."""
    with _locked(sweep_dir):
        return _sweep_id(sweep_dir)


def find_parents(client, sweep_id: str, experiment_ids: list[str] | None = None, status: str = "") -> list:
    """The parent runs of the sweep ``sweep_id`` in ``experiment_ids`` (default: all), with
    ``status`` if given. The id is hex digits: safe inside the filter string."""
    if not re.fullmatch(r"[0-9a-f]+", sweep_id):
        raise DamagedFileError(f"sweep id {sweep_id!r} is not hex; delete the sweep dir's .mlflow-sweep-id")
    ids = experiment_ids or [e.experiment_id for e in client.search_experiments()]
    query = f"tags.`sweep.parent` = 'true' AND tags.`sweep.id` = '{sweep_id}'"
    return client.search_runs(ids, query + (f" AND attributes.status = '{status}'" if status else ""))


def ensure_parent(cfg: DictConfig, sweep_dir: Path) -> str:
    """The id of the sweep's parent run in ``cfg.mlflow.experiment`` of ``cfg.mlflow.tracking_uri``,
    created (RUNNING, named by :func:`_parent_name`, tagged ``sweep.dir``, ``sweep.overrides``
    and ``model``) if no job did yet."""
    uri, name = cfg.mlflow.tracking_uri, cfg.mlflow.experiment
    client = _client(cfg)
    with _locked(sweep_dir):
        sweep_id = _sweep_id(sweep_dir)
        exp = client.get_experiment_by_name(name)
        exp_id = (
            exp.experiment_id
            if exp
            else client.create_experiment(
                name,
                artifact_location=cfg.mlflow.get("artifact_location") if uri.startswith("sqlite:") else None,
            )
        )
        if found := find_parents(client, sweep_id, [exp_id]):
            return found[0].info.run_id
        sweep = sweep_overrides(sweep_dir) or []
        tags = {
            "sweep.parent": "true",
            "sweep.id": sweep_id,
            "sweep.dir": str(sweep_dir),
            "sweep.overrides": " ".join(sweep)[:_MAX_TAG],
            "model": sweep_models(sweep, OmegaConf.select(cfg, "model.name", default="")),
        }
        run = client.create_run(exp_id, run_name=_parent_name(sweep_dir), tags=tags)
    log.info("sweep: MLflow parent run %s (%s) in %s", run.info.run_id, run.info.run_name, uri)
    return run.info.run_id


class MLflowSweepCallback(Callback):
    """Ends a sweep's MLflow parent runs; Hydra turns an error in a hook into a warning.

    * ``on_multirun_start``: the sweep dir's parents (a sweep run again) go back to RUNNING,
      without their ``sweep.failed.*`` tags.
    * ``on_job_end`` of a failed job: the parents are tagged ``sweep.failed.<job num>`` (the
      job's overrides and error) and end FAILED.
    * ``on_multirun_end`` (Hydra's basic sweeper skips it after a failed job): RUNNING ones end
      FINISHED; at exit of the sweeping process, KILLED.

    The sweeping process looks the parents up in the sweep config's tracking URI; those a swept
    ``paths.root`` puts in other stores end only FAILED, by their own failed jobs.
    """

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        if (
            not HydraConfig.initialized()
        ):  # ${hydra:runtime.cwd} in the tracking URI resolves (as hydra#3439 does)
            HydraConfig.instance().set_config(config)
        self._client, self._id = _client(config), _locked_sweep_id(_sweep_dir(config.hydra))
        for run in find_parents(self._client, self._id):
            for key in [k for k in run.data.tags if k.startswith("sweep.failed.")]:
                self._client.delete_tag(run.info.run_id, key)
            self._client.update_run(run.info.run_id, status="RUNNING")
        atexit.register(self._end, "KILLED")

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs) -> None:
        if config.hydra.mode != RunMode.MULTIRUN or job_return.status != JobStatus.FAILED:
            return
        ensure_parent(config, _sweep_dir(config.hydra))
        err = job_return._return_value  # the exception (the return_value property raises it)
        if isinstance(err, JobError):  # a user's error, as attnlab.console.errors ended the job
            err = err.__cause__ or err
        error = str(err).partition("\n")[0]
        note = f"{' '.join(config.hydra.overrides.task)}: {type(err).__name__}: {error}"
        client = _client(config)
        for run in find_parents(client, _locked_sweep_id(_sweep_dir(config.hydra))):
            client.set_tag(run.info.run_id, f"sweep.failed.{config.hydra.job.num}", note[:_MAX_TAG])
            client.set_terminated(run.info.run_id, "FAILED")

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        self._end("FINISHED")

    def _end(self, status: str) -> None:
        for run in find_parents(self._client, self._id, status="RUNNING"):
            self._client.set_terminated(run.info.run_id, status)
            log.info("sweep: MLflow parent run %s %s", run.info.run_id, status)
