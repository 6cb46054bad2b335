"""SIGKILL and SIGINT (Ctrl-C) at a random file operation of every stage of the pipeline.

Each case's seeds (:func:`test_faults.params.seeds`) choose the operation among those the
stage made in its census run; the fault is judged by the invariants of :mod:`test_faults.cases`.
The ``…:before-rename`` cases come at one chosen operation: the first rename of a temporary
file into place.
"""

import subprocess
import sys

import pytest

from test_faults.cases import Outcome, at_operation, judge, last_line, recover
from test_faults.checks import is_temporary
from test_faults.params import known, seeds
from test_faults.project import ORDER, STARTS

pytestmark = pytest.mark.e2e

# Cases that fail today, each with what it showed; flip them as the fixes land.
KNOWN: dict[str, str] = {}


def cases():
    for stage in ORDER:
        for action in ("kill", "interrupt"):
            yield pytest.param(stage, action, id=f"{action}@{stage}", marks=known(KNOWN, f"{action}@{stage}"))


@pytest.mark.parametrize(("stage", "action"), list(cases()))
def test_a_signal_at_a_random_moment_keeps_every_file_whole(pipeline, report, stage, action):
    outcomes = []
    for seed in seeds():
        pipeline.restore(STARTS[stage])
        outcomes.append(at_operation(pipeline, stage, action, f"{action}@{stage}", seed))
    report(f"{action}@{stage}", outcomes)


def first_rename_of_a_temporary_file(events: list[str]) -> int:
    """The 1-based number of the first rename of one of the project's own temporary files."""
    for i, e in enumerate(events):
        op, path = e.split(" ", 1)
        if op in ("os.rename", "os.replace") and is_temporary(path) and not path.startswith("mlruns/"):
            return i + 1
    raise AssertionError(f"no temporary file is renamed in {events}")


@pytest.mark.parametrize(
    "stage",
    [
        pytest.param(s, id=f"kill@{s}:before-rename", marks=known(KNOWN, f"kill@{s}:before-rename"))
        for s in ("download", "tokenize", "train", "evaluate")
    ],
)
def test_a_kill_before_a_rename_leaves_no_temporary_file_behind(pipeline, report, stage):
    """SIGKILL at the first rename of a temporary file into place: the file is written whole
    beside its destination, and the run that follows must remove it (or use it)."""
    pipeline.restore(STARTS[stage])
    at = first_rename_of_a_temporary_file(pipeline.census[stage])
    report(
        f"kill@{stage}:before-rename",
        [at_operation(pipeline, stage, "kill", f"kill@{stage}:before-rename", 0, at=at)],
    )


# A writer of the store killed while it commits: what a SIGKILL during MLflow's commit leaves,
# made by the same SQLite (in WAL-less rollback-journal mode, MLflow's default for a file store).
KILLED_COMMIT = """
import os, signal, sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("PRAGMA cache_size=1")  # the cache spills: pages reach the file before the commit
con.execute("BEGIN")
con.execute("UPDATE metrics SET value = value")
con.execute("UPDATE params SET value = value")
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=known(KNOWN, c, moments=False)) for c in ["kill@store-commit"]]
)
def test_a_store_write_killed_as_it_commits_leaves_a_store_the_next_stage_opens(pipeline, report, case):
    """SIGKILL while a write to mlflow.db commits leaves a hot rollback journal beside it
    (mlflow.db-journal). The store is whole: the next connection that may write rolls the journal
    back. So the next stage (evaluate) must run, not call the store damaged."""
    pipeline.restore("trained")
    db = pipeline.project / "mlflow.db"
    subprocess.run([sys.executable, "-c", KILLED_COMMIT, str(db)], check=False)
    journal = db.with_name("mlflow.db-journal")
    assert journal.exists() and journal.stat().st_size > 0, "the killed commit left no journal"
    run = pipeline.run("evaluate")
    out = Outcome(case, 0, where="a hot journal beside mlflow.db")
    out.result, out.problems = judge(pipeline, "evaluate", run, "kill", None)
    out.message = last_line(run.stderr)
    if out.result != "succeeded":
        out.problems.append("the store is whole (its journal rolls back), but evaluate did not run")
    out.recovery, problems = recover(pipeline, "evaluate", "trained")
    out.problems += problems
    report(case, [out])
