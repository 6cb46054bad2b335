"""Fixtures of the fault suite: the fork server and the tiny pipeline, built once per test process;
and the summary table of every fault test's counts at the end of the session.

``ATTNLAB_FAULT_ROUNDS=N`` (default 1) injects N faults per case, with the seeds
``ATTNLAB_FAULT_SEED`` (default 0) to N-1 past it (:func:`test_faults.params.seeds`); the
default is CI's fixed list. ``ATTNLAB_FAULT_LOG=<file>`` appends every fault's outcome to that
file (JSON lines). ``ATTNLAB_FAULT_NO_TMPFS=1`` keeps the project off a tmpfs where one could be
mounted (a full disk is then a file size cap: :mod:`test_faults.disk`).
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from test_faults import tally
from test_faults.disk import project_filesystem
from test_faults.project import build, interrupt_training
from test_faults.runner import Zygote


@pytest.fixture(scope="session")
def zygote(tmp_path_factory):
    z = Zygote(tmp_path_factory.mktemp("zygote"))
    yield z
    z.close()


@pytest.fixture(scope="session")
def pipeline(zygote, tmp_path_factory):
    """The tiny project's states, built once without a fault, and each stage's census; the
    project on its own small filesystem (:mod:`test_faults.disk`)."""
    base = tmp_path_factory.mktemp("faults")
    (base / "project").mkdir()
    with project_filesystem(base / "project") as fill_target:
        yield build(base, zygote, fill_target)


@pytest.fixture(scope="session")
def interrupted(pipeline):
    """The state ``interrupted`` (training killed after its first last.ckpt), built once."""
    if not pipeline.snapshot("interrupted").exists():
        interrupt_training(pipeline)


@pytest.fixture
def report(request):
    """``report(case, outcomes)``: record the counts (for the summary table), print the faults,
    and fail naming every broken invariant."""

    def _report(case: str, outcomes):
        counts = tally.record(request.node.user_properties, case, outcomes)
        if os.environ.get("ATTNLAB_FAULT_LOG"):  # every outcome, one JSON object a line
            with open(os.environ["ATTNLAB_FAULT_LOG"], "a") as f:
                f.writelines(json.dumps(dataclasses.asdict(o)) + "\n" for o in outcomes)
        print(tally.describe(outcomes))
        print(counts)
        broken = [o for o in outcomes if o.problems]
        summary = f"{len(broken)} of {len(outcomes)} faults broke an invariant:\n"
        assert not broken, summary + tally.describe(broken)

    return _report


_ROWS: list[dict] = []


def pytest_runtest_logreport(report):
    if report.when == "call":
        _ROWS.extend(json.loads(v) for k, v in report.user_properties if k == tally.KEY)


def pytest_terminal_summary(terminalreporter):
    if _ROWS:
        terminalreporter.section("fault injection")
        terminalreporter.write_line(tally.table(_ROWS))
