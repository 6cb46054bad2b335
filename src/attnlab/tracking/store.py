"""MLflow store resolution and logging helpers.

The store URI comes from the config (``mlflow.tracking_uri`` in
``conf/config.yaml``): ``$MLFLOW_TRACKING_URI`` if set, else the SQLite file
``mlflow.db`` at the project root as an absolute ``sqlite:////…`` URI, so every
stage, Hydra run directory and DDP rank writes to the same store.
The training stage records its run id in ``runs/<model>.json`` so evaluate
and export add to the same run.
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import closing, contextmanager
from pathlib import Path

from attnlab.console.errors import process_rank
from attnlab.errors import DamagedFileError, MissingFileError, UserError, brief
from attnlab.files import rebase, remove_stale_staging, temp_prefix, write_json_atomic

log = logging.getLogger(__name__)


class TrackingServerError(UserError, ConnectionError):
    """The MLflow tracking server named by the tracking URI cannot be reached."""


class TrackingStoreError(UserError, RuntimeError):
    """The local MLflow store file (``mlflow.db``) is not a readable SQLite database."""


_SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite 3 database


def check_store_file(tracking_uri: str) -> None:
    """Refuse a local ``sqlite:////…`` store file that SQLite cannot read: damaged (SQLite's
    ``PRAGMA quick_check`` of every page), truncated or not a database, before MLflow's
    SQLAlchemy error does. A missing or empty file is fine (MLflow creates the store); other
    stores are not checked. The file is opened for writing, so that the journal a writer
    killed mid-commit left (``mlflow.db-journal``) is rolled back, as the next writer would.

    Raises:
        TrackingStoreError: names the file, what is wrong and how to go on.
    """
    import sqlite3

    db = _local_db(tracking_uri)
    if db is None or not db.is_file() or db.stat().st_size == 0:
        return
    with db.open("rb") as f:
        header = f.read(len(_SQLITE_HEADER))
    why = None if header == _SQLITE_HEADER else "its first bytes are not SQLite's header"
    if why is None:
        try:
            # read-write where this user may write (a read-only copy is only read)
            mode = "rw" if os.access(db, os.W_OK) and os.access(db.parent, os.W_OK) else "ro"
            with closing(sqlite3.connect(f"file:{db}?mode={mode}", uri=True, timeout=30)) as con:
                con.execute("PRAGMA schema_version").fetchone()  # rolls back a hot journal
                found = [row[0] for row in con.execute("PRAGMA quick_check(3)")]
            if found != ["ok"]:
                why = "SQLite's quick_check: " + "; ".join(found)
        except sqlite3.OperationalError as e:
            if "locked" in str(e):
                return  # another process writes it for over 30 s: not a damaged file
            why = f"SQLite: {e}"
        except sqlite3.DatabaseError as e:
            why = f"SQLite: {e}"
    if why is not None:
        raise TrackingStoreError(
            f"the MLflow store {db} is damaged or not a database ({why}): restore it from a "
            f"copy, or move it aside (`mv {db} {db}.damaged`) to start an empty store, then "
            "re-run training (`dvc repro -f`): the later stages log to the training run"
        )


@contextmanager
def _env(**values: str):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check_tracking_server(uri: str, timeout_s: int = 10) -> None:
    """Fail fast when ``uri`` is an ``http(s)://`` MLflow server that does not answer.

    One request (``search_experiments``), no retries, ``timeout_s`` seconds. Local
    stores (``sqlite:``, ``file:``, paths) are not checked.

    Raises:
        TrackingServerError: the server is unreachable (names the URI and the fix).
    """
    if not uri.startswith(("http://", "https://")):
        return
    from mlflow.tracking import MlflowClient

    try:
        with _env(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT=str(timeout_s)):
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except Exception as e:  # noqa: BLE001 - connection refused, timeout, HTTP error: all mean "not usable"
        reason = str(e).splitlines()[0][:600]
        raise TrackingServerError(
            f"MLflow tracking server {uri} is unreachable ({type(e).__name__}: {reason}). "
            "Start it (e.g. `mlflow server --host 127.0.0.1 --port 5000`) or unset "
            "MLFLOW_TRACKING_URI to track in the project's mlflow.db"
        ) from None


def prepare_store(tracking_uri: str, artifact_location: str) -> None:
    """What every stage does before it logs: fail fast on a dead server, rebase a moved local store.

    Raises:
        TrackingServerError: see :func:`check_tracking_server`.
        TrackingStoreError: see :func:`check_store_file`.
    """
    check_tracking_server(tracking_uri)
    check_store_file(tracking_uri)
    if process_rank() != 0:  # DDP: rank 0 re-points the store, the others never log artifacts
        return
    for old, new in rebase_moved_store(tracking_uri, artifact_location).items():
        log.warning("the project moved: MLflow artifact locations under %s now point at %s", old, new)


def create_store_file(tracking_uri: str) -> bool:
    """Create a missing (or empty) local ``sqlite:////…`` store whole: MLflow builds its tables
    (a dozen migrations, not one transaction) in a temp file beside it, which is then linked
    into place only if no other process made the store meanwhile. A full disk or a kill on the
    way leaves no half-built ``mlflow.db``; the next call removes a killed call's temp file.

    Returns:
        True if this call created the store (False: it exists, or is not a local file).

    Raises:
        TrackingStoreError: MLflow could not build the store (a full disk: names the file and
            the fix); nothing is left at its path.
    """
    db = _local_db(tracking_uri)
    if db is None or (db.is_file() and db.stat().st_size > 0):
        return False
    from mlflow.tracking import MlflowClient

    db.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(db)
    tmp = db.with_name(f"{temp_prefix(db)}{os.urandom(4).hex()}.tmp")
    try:
        MlflowClient(tracking_uri=f"sqlite:///{tmp}").search_experiments()  # builds every table
        if db.exists() and db.stat().st_size == 0:
            db.unlink()  # an empty file: MLflow would have built the store in it
        os.link(tmp, db)  # never over a store another process made meanwhile
    except FileExistsError:
        return False
    except Exception as e:  # any failure: nothing half-built stays
        raise TrackingStoreError(
            f"could not create the MLflow store {db} ({brief(e)}); "
            f"nothing was left there. If the disk is full, free space on the disk that holds "
            f"{db.parent} (`df -h {db.parent}`); then run the same command"
        ) from e
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + "-journal")):
            leftover.unlink(missing_ok=True)
    return True


def _local_db(uri: str) -> Path | None:
    """The file of a ``sqlite:///<absolute path>`` store URI; None for every other store."""
    if uri.startswith("sqlite:///") and Path(uri[len("sqlite:///") :]).is_absolute():
        return Path(uri[len("sqlite:///") :])
    return None


def read_run_record(path: Path, model: str) -> dict:
    """The ``runs/<model>.json`` record written by training: run id, tracking URI, checkpoint path.

    The checkpoint, and a local SQLite store beside ``runs/``, are stored relative to the
    record's folder (the record travels with the project: ``mv``, ``git clone`` + ``dvc pull``)
    and returned as an absolute path and an absolute ``sqlite:////…`` URI.

    Raises:
        MissingFileError: if ``model`` was not trained yet (names the command to run).
        DamagedFileError: the record is not the JSON object training writes (names the file and
            the command that writes it again).
    """
    path = Path(path)
    train = f"`python src/train.py model={model}` or `dvc repro train@{model}`"
    if not path.exists():
        raise MissingFileError(f"{path} not found: train first with {train}")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        why = None if isinstance(record, dict) and "checkpoint" in record else "it names no checkpoint"
    except ValueError as e:  # not UTF-8, not JSON
        why = f"{type(e).__name__}: {e}"
    if why is not None:
        raise DamagedFileError(
            f"{path} is damaged or not a run record of src/train.py ({why}): restore it from a "
            f"copy, or train again with {train}"
        )
    record["checkpoint"] = str((path.parent / record["checkpoint"]).resolve())
    if "tracking_db" in record:
        record["tracking_uri"] = f"sqlite:///{(path.parent / record.pop('tracking_db')).resolve()}"
    return record


def write_run_record(
    path: Path, run_id: str, tracking_uri: str, experiment: str, checkpoint: Path, root: Path | None = None
) -> Path:
    """Write ``runs/<model>.json`` atomically.

    The checkpoint is stored relative to the record's folder; so is the store when it is the
    project's own SQLite file (``<root>/mlflow.db``, the record under ``root``), under
    ``tracking_db`` instead of ``tracking_uri``. Any other store keeps its URI: a server, a
    file elsewhere, and the main project's store seen from a DVC experiment's temporary copy
    (``root`` there is the copy, which the record leaves).
    """

    path = Path(path).resolve()
    rel = os.path.relpath(Path(checkpoint).resolve(), path.parent)
    db = _local_db(tracking_uri)
    own = (
        db is not None
        and root is not None
        and db.resolve().parent == Path(root).resolve()
        and path.is_relative_to(Path(root).resolve())
    )
    store = (
        {"tracking_db": os.path.relpath(db.resolve(), path.parent)} if own else {"tracking_uri": tracking_uri}
    )
    return write_json_atomic(path, {"run_id": run_id, **store, "experiment": experiment, "checkpoint": rel})


def _rebased(location: str | None, old: str, new: str) -> str | None:
    """``location`` with its prefix ``old`` (a folder, plain or ``file://``) replaced by ``new``."""
    return rebase(location, old, new) or rebase(location, f"file://{old}", f"file://{new}")


def rebase_moved_store(tracking_uri: str, artifact_location: str) -> dict[str, str]:
    """Point a moved project's SQLite store at the artifact folder that moved with it.

    MLflow records absolute artifact locations: each experiment's, each run's
    ``artifact_uri``, each logged model's and each registered model version's source. When
    the project folder is moved or copied (``mv``, ``cp -r``), the store and ``mlruns/`` move
    together but those paths still name the old folder, so a resumed run, evaluate or export
    would write its artifacts there (recreating it), and ``models:/…`` would load from there.
    MLflow has no API to change them (mlflow/mlflow#3144, #2577); this rewrites them in
    MLflow's own tables (its SQLAlchemy models), in one transaction. Only a project's own
    store is touched (the SQLite file beside ``artifact_location``, as attnlab lays them out),
    and in it only experiments at ``<old root>/<name of artifact_location>`` whose old folder is
    gone (``mv``) or belongs to another store file (``cp -r``: the original's). A store shared
    by several projects, an ``artifact_location`` changed on the command line, and an
    experiment whose folder still exists on its own are left alone.

    Args:
        tracking_uri: the store; only the local ``sqlite:////…`` kind is touched.
        artifact_location: the configured artifact folder, ``<root>/mlruns`` (absolute).

    Returns:
        ``{old folder: new folder}`` for each folder rebased (empty: nothing had moved).
    """
    db, new = _local_db(tracking_uri), Path(artifact_location)
    if db is None or not db.exists() or not new.is_absolute() or db.resolve().parent != new.resolve().parent:
        return {}
    from mlflow.store.model_registry.dbmodels.models import SqlModelVersion
    from mlflow.store.tracking.dbmodels.models import SqlExperiment, SqlLoggedModel, SqlRun
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = SqlAlchemyStore(tracking_uri, str(new))
    with store.ManagedSessionMaker(read_only=False) as session:
        moved = {}
        for experiment in session.query(SqlExperiment).all():
            folder = Path((experiment.artifact_location or "").removeprefix("file://"))
            if not folder.is_absolute() or folder.name != new.name or folder == new:
                continue
            its_store = folder.parent / db.name
            if not folder.exists() or (its_store.exists() and not its_store.samefile(db)):
                moved[str(folder)] = str(new)
        for old, replacement in moved.items():
            for table, columns in (
                (SqlExperiment, ("artifact_location",)),
                (SqlRun, ("artifact_uri",)),
                (SqlLoggedModel, ("artifact_location",)),
                (SqlModelVersion, ("source", "storage_location")),
            ):
                for row in session.query(table).all():
                    for column in columns:
                        value = _rebased(getattr(row, column), old, replacement)
                        if value is not None:
                            setattr(row, column, value)
    return moved


def log_to_run(
    run_id: str,
    uri: str,
    metrics: dict | None = None,
    artifacts: list[tuple[Path, str]] | None = None,
    tags: dict | None = None,
) -> None:
    """Add metrics, (file, artifact dir) pairs and tags (str → str) to an existing MLflow run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    for k, v in (tags or {}).items():
        client.set_tag(run_id, k, str(v))
    for k, v in (metrics or {}).items():
        client.log_metric(run_id, k, float(v))
    for path, artifact_dir in artifacts or []:
        client.log_artifact(run_id, str(path), artifact_dir)
