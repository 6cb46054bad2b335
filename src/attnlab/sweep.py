"""Hydra sweeps in MLflow: one parent run per multirun, one child run per job.

    python src/train.py -m model=bahdanau,transformer optimizer.lr=1e-3,3e-4

A single run (no ``-m``) is untouched: :func:`sweep_job` returns :data:`SINGLE_RUN`.
In a multirun each job of ``src/train.py`` calls :func:`sweep_job` first, which

* moves the job's outputs (``paths.checkpoints``, ``paths.runs``, ``paths.plots``) into
  the job's own Hydra output dir, ``<sweep dir>/<job num>/`` (e.g.
  ``multirun/2026-11-29/15-04-16/1/checkpoints/transformer/best.ckpt``), so jobs never
  share a ``last.ckpt`` and never touch the DVC pipeline's ``checkpoints/`` and ``runs/``;
* creates the sweep's MLflow parent run if no job did yet, and returns the tags
  (``mlflow.parentRunId``, the tag MLflow nests runs by) and run-name suffix of the
  job's own (child) run.

Why the first job creates the parent, not ``on_multirun_start``: there the config's
``${hydra:runtime.cwd}`` (``paths.root``, hence ``mlflow.tracking_uri``) does not
resolve yet ("HydraConfig was not set", Hydra issues #1786, #2247), and a swept
``mlflow.experiment`` or ``paths.root`` has no single value. The parent's id is
recorded in ``<sweep dir>/mlflow-parent-<key>.json`` (one per tracking URI and
experiment), created atomically and only once, so jobs a launcher runs in other
processes or on other machines sharing the sweep dir join the same parent.

:class:`MLflowSweepCallback` (``hydra.callbacks`` in ``conf/config.yaml``) writes
``<sweep dir>/sweep.json`` (the sweep's overrides, read by the jobs) and closes the
parent: FAILED as soon as a job fails, FINISHED when the sweep ends with every job
done, KILLED when the sweeping process exits before that (Ctrl-C, or SIGTERM during
training, which train.py turns into an exit; SIGKILL leaves it RUNNING). Running the
same command again with ``hydra.sweep.dir=<that sweep dir>`` reopens the parent, and
each job resumes from its own ``last.ckpt`` in its own MLflow run (attnlab.lit.resume).
"""
from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from attnlab.files import write_json_atomic, write_json_exclusive

log = logging.getLogger(__name__)

PARENT_TAG = "mlflow.parentRunId"  # MLflow shows a run nested under the run whose id this tag holds
SWEEP_FILE = "sweep.json"  # the sweep's command-line overrides, written by on_multirun_start
PARENT_FILES = "mlflow-parent-*.json"
JOB_OUTPUTS = ("checkpoints", "runs", "plots")  # paths.* keys train.py writes to
_MAX_TAG = 5000  # MLflow allows 8000 characters per tag value
_MAX_NAME = 250  # and 250 per run name


@dataclass(frozen=True)
class SweepJob:
    """What a sweep job adds to its MLflow run: ``tags`` (``mlflow.parentRunId``, ``sweep.*``)
    and ``name_suffix`` (``-job1 model.net.d_model=32``: siblings get different names)."""
    tags: dict[str, str] = field(default_factory=dict)
    name_suffix: str = ""

    def run_name(self, name: str) -> str:
        """``name`` plus this job's suffix, cut to 250 characters (MLflow's limit); a single
        run's ``name`` unchanged."""
        return (name + self.name_suffix)[:_MAX_NAME] if self.name_suffix else name


SINGLE_RUN = SweepJob()


def sweep_job(cfg: DictConfig) -> SweepJob:
    """Prepare a multirun job of ``src/train.py``; a single run gets :data:`SINGLE_RUN`, unchanged.

    In a multirun, changes ``cfg`` in place: ``paths.checkpoints``, ``paths.runs`` and
    ``paths.plots`` move from under ``paths.root`` to the same place under the job's
    output dir (``HydraConfig.get().runtime.output_dir``), unless the command line sets
    them. Then creates the sweep's MLflow parent run if this is the first job (see the
    module docstring); if MLflow fails, a warning is logged and the job runs without parent.

    Raises:
        SweepConfigError: DDP with Lightning's own process launcher (``device=ddp``):
            it would start the whole sweep again in every rank.
        attnlab.tracking.TrackingServerError: ``mlflow.tracking_uri`` is a server that
            does not answer.
    """
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return SINGLE_RUN
    hc = HydraConfig.get()
    _refuse_subprocess_ddp(cfg)
    job_dir, overrides = Path(hc.runtime.output_dir), list(hc.overrides.task)
    moved = redirect_outputs(cfg, job_dir, overrides)
    sweep_dir = sweep_dir_of(hc.runtime.cwd, hc.sweep.dir)
    swept = swept_overrides(overrides, read_sweep_info(sweep_dir))
    tags = {"sweep.dir": str(sweep_dir), "sweep.job": str(hc.job.num),
            "sweep.overrides": " ".join(overrides if swept is None else swept)[:_MAX_TAG]}
    from pytorch_lightning.utilities import rank_zero_only  # heavy import: only train.py needs it

    parent = ensure_parent(cfg, sweep_dir) if rank_zero_only.rank == 0 else None
    if parent:
        tags[PARENT_TAG] = parent
    log.info("sweep job %s: outputs in %s (%s); MLflow parent run %s", hc.job.num, job_dir,
             ", ".join(moved) or "none moved", parent)
    return SweepJob(tags, f"-job{hc.job.num}" + (f" {' '.join(swept)}" if swept else ""))


class SweepConfigError(ValueError):
    """A setting that cannot work inside a Hydra multirun."""


def _refuse_subprocess_ddp(cfg: DictConfig) -> None:
    """Lightning's DDP launcher re-runs ``sys.argv`` (``-m`` included) for each extra rank: a
    sweep inside every rank (Lightning-AI/pytorch-lightning#18175). Launchers that start the
    ranks themselves (torchrun, SLURM: ``LOCAL_RANK`` is set) are fine."""
    dev = cfg.get("device") or {}
    strategy = str(dev.get("strategy", ""))
    if (not strategy.startswith("ddp") or any(s in strategy for s in ("spawn", "fork", "notebook"))
            or "LOCAL_RANK" in os.environ):
        return
    if str(dev.get("devices", 1)) == "1" and str(dev.get("num_nodes", 1)) == "1":
        return
    raise SweepConfigError(
        f"device.strategy={strategy} with devices={dev.get('devices')} cannot run in a Hydra multirun: "
        "Lightning starts each extra rank by re-running the command line, -m included, which would "
        "start the whole sweep again in every rank. Run DDP trainings one at a time, without -m")


def redirect_outputs(cfg: DictConfig, job_dir: Path, overrides: list[str]) -> list[str]:
    """Move the output paths in :data:`JOB_OUTPUTS` under ``job_dir``, keeping their layout
    below ``paths.root`` (``<root>/checkpoints/transformer`` → ``<job_dir>/checkpoints/transformer``).

    Keys set on the command line (``paths.checkpoints=…`` in ``overrides``) and keys the
    config lacks stay as they are. Returns the keys moved.
    """
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


def sweep_dir_of(cwd: str, sweep_dir: str) -> Path:
    """``hydra.sweep.dir`` as an absolute path (a relative one is relative to Hydra's ``runtime.cwd``)."""
    return Path(cwd, sweep_dir).absolute()


def write_sweep_info(sweep_dir: Path, config: DictConfig) -> Path:
    """Write ``<sweep dir>/sweep.json`` from the sweep's (not a job's) ``config``: its
    command-line overrides (``hydra.overrides.task``, e.g. ``model.net.d_model=16,32``),
    ``hydra.sweeper.params`` as ``key=values`` strings, and the keys they sweep."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = list(config.hydra.overrides.task)
    params = config.hydra.sweeper.get("params")  # None, or {key: values} (basic sweeper)
    params = OmegaConf.to_container(params, resolve=False) if isinstance(params, DictConfig) else {}
    swept = [o.get_key_element() for o in OverridesParser.create().parse_overrides(overrides)
             if o.is_sweep_override()]
    return write_json_atomic(Path(sweep_dir) / SWEEP_FILE, {
        "overrides": overrides, "params": [f"{k}={v}" for k, v in params.items()],
        "swept": swept + [k for k in params if k not in swept]})


def read_sweep_info(sweep_dir: Path) -> dict | None:
    """``<sweep dir>/sweep.json`` (see :func:`write_sweep_info`), or ``None`` when the
    callback did not write it (``hydra.callbacks`` changed)."""
    path = Path(sweep_dir) / SWEEP_FILE
    return json.loads(path.read_text()) if path.exists() else None


def swept_overrides(job_overrides: list[str], info: dict | None) -> list[str] | None:
    """The job's overrides of the keys the sweep varies (``model.net.d_model=16`` of
    ``model.net.d_model=16,32``), in command-line order; ``None`` when ``info`` is."""
    if info is None:
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser

    keys = set(info.get("swept", []))
    return [o.input_line for o in OverridesParser.create().parse_overrides(job_overrides)
            if o.get_key_element() in keys]


def sweep_models(info: dict, model: str) -> str:
    """The parent run's ``model`` tag (every attnlab run has one): the swept models, comma-joined
    in command-line order (``bahdanau,transformer`` for ``model=bahdanau,transformer``), or
    ``model``, the first job's, when the sweep does not vary it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for o in OverridesParser.create().parse_overrides(list(info.get("overrides", []))):
        if o.get_key_element() == "model":
            return ",".join(str(v) for v in o.sweep_iterator()) if o.is_sweep_override() else o.value()
    return model


def _parent_name(sweep_dir: Path) -> str:
    """``sweep-2026-11-29_15-04-16`` for Hydra's default ``multirun/<date>/<time>``, else
    ``sweep-<basename>``."""
    name = sweep_dir.name
    if re.fullmatch(r"\d\d-\d\d-\d\d", name):
        name = f"{sweep_dir.parent.name}_{name}"
    return f"sweep-{name}"[:_MAX_NAME]


def _record_path(sweep_dir: Path, uri: str, experiment: str) -> Path:
    key = hashlib.sha256(f"{uri}\n{experiment}".encode()).hexdigest()[:12]
    return Path(sweep_dir) / PARENT_FILES.replace("*", key)


def read_parents(sweep_dir: Path) -> list[dict]:
    """The parent runs recorded in ``sweep_dir``: ``{"run_id", "tracking_uri", "experiment"}`` each."""
    return [json.loads(p.read_text()) for p in sorted(Path(sweep_dir).glob(PARENT_FILES))]


def _create_once(path: Path, record: dict) -> dict:
    """Write ``record`` as JSON to ``path`` unless it exists; return what ``path`` holds.

    Safe for concurrent jobs: exactly one creates the file, the others read it
    (:func:`attnlab.files.write_json_exclusive`).
    """
    if write_json_exclusive(path, record):
        return record
    for _ in range(50):  # without hard links the creator may still be writing it (files._create_from)
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            time.sleep(0.1)
    return json.loads(path.read_text())


def _experiment_id(client, name: str, artifact_location: str | None) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location)
        except Exception:  # noqa: BLE001 - another job created it in between
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
    return exp.experiment_id


def ensure_parent(cfg: DictConfig, sweep_dir: Path) -> str | None:
    """The id of the sweep's MLflow parent run in ``cfg.mlflow.experiment`` of
    ``cfg.mlflow.tracking_uri``, created (status RUNNING) if no job did yet.

    The parent is named by :func:`_parent_name` and tagged ``sweep.dir``,
    ``sweep.overrides`` (the sweep's command line) and ``sweep.params``
    (``hydra.sweeper.params``). Its id goes to ``<sweep dir>/mlflow-parent-<key>.json``;
    a job that loses the race to create it deletes its own parent run and uses the winner's.

    Returns ``None`` (and logs a warning) when MLflow fails: the job then runs unnested.

    Raises:
        attnlab.tracking.TrackingServerError: an ``http(s)://`` tracking URI does not answer.
    """
    from attnlab.tracking import check_tracking_server

    uri, experiment = cfg.mlflow.tracking_uri, cfg.mlflow.experiment
    path = _record_path(sweep_dir, uri, experiment)
    if path.exists():
        return json.loads(path.read_text())["run_id"]
    check_tracking_server(uri)
    info = read_sweep_info(sweep_dir) or {}
    tags = {"sweep.dir": str(sweep_dir), "sweep.overrides": " ".join(info.get("overrides", []))[:_MAX_TAG],
            "sweep.params": " ".join(info.get("params", []))[:_MAX_TAG],
            "model": sweep_models(info, OmegaConf.select(cfg, "model.name", default=""))}
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        artifacts = cfg.mlflow.get("artifact_location") if uri.startswith("sqlite:") else None
        run = client.create_run(_experiment_id(client, experiment, artifacts),
                                run_name=_parent_name(Path(sweep_dir)), tags=tags)
        record = _create_once(path, {"run_id": run.info.run_id, "tracking_uri": uri,
                                     "experiment": experiment})
        if record["run_id"] != run.info.run_id:
            client.delete_run(run.info.run_id)
    except Exception as e:  # noqa: BLE001 - tracking must never stop training
        log.warning("could not create the sweep's MLflow parent run in %s (%s: %s); "
                    "this job's run is not nested", uri, type(e).__name__, str(e).splitlines()[0][:300])
        return None
    log.info("sweep: MLflow parent run %s (%s) in %s", record["run_id"], _parent_name(Path(sweep_dir)), uri)
    return record["run_id"]


def _client(record: dict):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=record["tracking_uri"])


class MLflowSweepCallback(Callback):
    """Hydra callback that opens and closes a sweep's MLflow parent runs (see the module docstring).

    * ``on_multirun_start`` (the sweeping process, before any job): writes
      ``<sweep dir>/sweep.json`` (the command-line overrides and ``hydra.sweeper.params``),
      and sets parent runs already recorded there (a sweep run again into the same
      ``hydra.sweep.dir``, e.g. to resume it) back to RUNNING.
    * ``on_job_end`` (the job's process): a failed job sets every parent run of the sweep
      to FAILED (creating it first if the job failed before it could) and tags it
      ``sweep.failed.<job num>`` with the job's overrides and error.
    * ``on_multirun_end``: parents still RUNNING end FINISHED. Hydra's basic sweeper skips
      this hook when a job failed; the parent is FAILED already.
    * at exit of the sweeping process, if ``on_multirun_end`` did not run: parents still
      RUNNING end KILLED.

    Single runs are not touched. MLflow errors are logged as warnings, never raised.
    """

    def __init__(self) -> None:
        self._sweep_dir: Path | None = None
        self._ended = False

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self._sweep_dir = self._guard("find the sweep dir", lambda: sweep_dir_of(
            config.hydra.runtime.cwd, config.hydra.sweep.dir))  # None if it uses ${hydra:...}
        if self._sweep_dir is None:
            return
        atexit.register(self._at_exit)
        self._guard("write sweep.json", write_sweep_info, self._sweep_dir, config)
        for record in read_parents(self._sweep_dir):
            self._guard("reopen the parent run", self._reopen, record)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs) -> None:
        if config.hydra.mode != RunMode.MULTIRUN or job_return.status != JobStatus.FAILED:
            return
        hc = config.hydra
        sweep_dir = sweep_dir_of(hc.runtime.cwd, hc.sweep.dir)
        self._guard("create the parent run", ensure_parent, config, sweep_dir)
        err = job_return._return_value  # the exception (the return_value property raises it)
        first_line = str(err).splitlines()[0] if str(err) else ""
        note = f"{' '.join(hc.overrides.task)}: {type(err).__name__}: {first_line}"
        tags = {f"sweep.failed.{hc.job.num}": note[:_MAX_TAG]}
        for record in read_parents(sweep_dir):
            self._guard("end the parent run", self._terminate, record, "FAILED", tags)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        self._ended = True
        sweep_dir = self._sweep_dir or self._guard("find the sweep dir", lambda: sweep_dir_of(
            config.hydra.runtime.cwd, config.hydra.sweep.dir))
        if sweep_dir is not None:
            for record in read_parents(sweep_dir):
                self._guard("end the parent run", self._terminate, record, "FINISHED", only_running=True)

    def _at_exit(self) -> None:
        if not self._ended and self._sweep_dir is not None:
            for record in read_parents(self._sweep_dir):
                self._guard("end the parent run", self._terminate, record, "KILLED", only_running=True)

    @staticmethod
    def _reopen(record: dict) -> None:
        client = _client(record)
        run = client.get_run(record["run_id"])
        for key in [k for k in run.data.tags if k.startswith("sweep.failed.")]:
            client.delete_tag(record["run_id"], key)
        if run.info.status != "RUNNING":
            client.update_run(record["run_id"], status="RUNNING")

    @staticmethod
    def _terminate(record: dict, status: str, tags: dict | None = None, only_running: bool = False) -> None:
        client = _client(record)
        if only_running and client.get_run(record["run_id"]).info.status != "RUNNING":
            return
        for k, v in (tags or {}).items():
            client.set_tag(record["run_id"], k, v)
        client.set_terminated(record["run_id"], status)
        log.info("sweep: MLflow parent run %s %s", record["run_id"], status)

    @staticmethod
    def _guard(what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - closing the parent must not fail the sweep
            log.warning("sweep: could not %s (%s: %s)", what, type(e).__name__,
                        str(e).splitlines()[0][:300] if str(e) else "")
            return None
