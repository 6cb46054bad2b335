"""The disk fills at a random file operation of tokenize, train and export.

The project lives on a small tmpfs (:mod:`test_faults.disk`; where the tests may not mount
one, every file the stage writes is capped instead, RLIMIT_FSIZE); before the chosen write a
filler file takes its free space (all of it, or all but a few pages). Judged by the invariants
of :mod:`test_faults.cases`: the error must say the disk is full, and a re-run with the space
freed must succeed.
"""

import pytest

from test_faults.cases import WRITES, at_operation
from test_faults.params import known, seeds
from test_faults.project import STARTS

pytestmark = pytest.mark.e2e

# Cases that fail today, each with what it showed; flip them as the fixes land.
KNOWN: dict[str, str] = {}


# Without a tmpfs (file sizes capped instead) the random moment of seed 0 differs, and shows:
WITHOUT_TMPFS: dict[str, str] = {}


def fill(pipeline, stage, case, seed, **moment):
    """The disk filled at a write of ``stage`` (``moment``: ``at`` and ``free``, else chosen by ``seed``)."""
    pipeline.restore(STARTS[stage])
    return at_operation(pipeline, stage, "fill", case, seed, fill_target=pipeline.fill_target, **moment)


@pytest.mark.parametrize(
    "stage",
    [
        pytest.param(
            s, id=f"disk-full@{s}", marks=known(KNOWN, f"disk-full@{s}", without_tmpfs=WITHOUT_TMPFS)
        )
        for s in ("tokenize", "train", "export")
    ],
)
def test_a_full_disk_at_a_random_moment_keeps_every_file_whole(pipeline, report, stage):
    report(f"disk-full@{stage}", [fill(pipeline, stage, f"disk-full@{stage}", seed) for seed in seeds()])


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=known(KNOWN, c)) for c in ["disk-full@train:epoch-2-best.ckpt"]]
)
def test_a_full_disk_as_epoch_2_saves_best_ckpt_keeps_epoch_1s(pipeline, report, case):
    """The case of issue 37: the disk fills while the second epoch's best.ckpt is written over
    the first's. Room for 256 KiB of the 650 KiB file: on a tmpfs the old file's own pages,
    freed when it is truncated, would make room for the new one, so the room is a file size
    limit (RLIMIT_FSIZE, set just before that save's first write). The first epoch's file must
    stay whole (written beside it, then renamed), and the error must say the disk is full."""
    events = pipeline.census["train"]
    saves = [i for i, e in enumerate(events) if "best.ckpt" in e and WRITES.search(e)]
    second = next(i for prev, i in zip(saves, saves[1:]) if i != prev + 1)  # the next save's first write
    pipeline.restore("tokenized")
    report(
        case,
        [at_operation(pipeline, "train", "fill", case, 0, at=second + 1, fill_target="rlimit", free=1 << 18)],
    )


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=known(KNOWN, c)) for c in ["disk-full@train:creating-the-store"]]
)
def test_a_full_disk_while_the_store_is_created_leaves_a_store_that_works(pipeline, report, case):
    """The first training run of a project creates its MLflow store (mlflow.db, MLflow's schema
    migrations). The disk fills as it connects to it, 64 KiB left: the run must stop saying so,
    and with the space freed the next run must work."""
    pipeline.restore("tokenized")
    at = 1 + next(i for i, e in enumerate(pipeline.census["train"]) if e == "sqlite3.connect mlflow.db")
    outcome = at_operation(
        pipeline, "train", "fill", case, 0, at=at, fill_target=pipeline.fill_target, free=1 << 16
    )
    report(case, [outcome])
