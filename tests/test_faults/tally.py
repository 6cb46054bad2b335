"""The counts of a fault test (faults injected, and outcomes by kind) and the suite's summary table."""

from __future__ import annotations

import json

from test_faults.cases import Outcome

RESULTS = ("succeeded", "refused", "killed", "not reached")
COLUMNS = ("faults", "injected", *RESULTS, "broken")
KEY = "fault_counts"  # the user property a test's counts travel in (pytest-xdist forwards it)


def count(outcomes: list[Outcome]) -> dict[str, int]:
    """``faults`` tried, ``injected`` (reached the stage), one count per result, and ``broken``
    (faults after which an invariant did not hold)."""
    c = {k: 0 for k in COLUMNS}
    for o in outcomes:
        c["faults"] += 1
        c[o.result] += 1
        c["broken"] += bool(o.problems)
    c["injected"] = c["faults"] - c["not reached"]
    assert c["injected"] == c["succeeded"] + c["refused"] + c["killed"], c
    return c


def describe(outcomes: list[Outcome]) -> str:
    """One paragraph per fault: where it came, what the stage did, what broke."""
    parts = []
    for o in outcomes:
        head = f"[{o.case} seed {o.seed}] at {o.where}: {o.result}" + (
            f" — {o.message!r}" if o.message else ""
        )
        parts.append("\n    ".join([head, f"next run: {o.recovery}; {o.seconds} s", *o.problems, *o.notes]))
    return "\n".join(parts)


def record(user_properties: list, case: str, outcomes: list[Outcome]) -> dict[str, int]:
    c = count(outcomes)
    user_properties.append((KEY, json.dumps({"case": case, **c})))
    return c


def table(rows: list[dict]) -> str:
    """The summary: one row per test, then the totals."""
    rows = sorted(rows, key=lambda r: r["case"])
    total = {"case": "total", **{k: sum(r[k] for r in rows) for k in COLUMNS}}
    width = max(len(r["case"]) for r in [*rows, total])
    lines = [f"{'case':<{width}}  " + "  ".join(f"{k:>11}" for k in COLUMNS)]
    for r in [*rows, total]:
        lines.append(f"{r['case']:<{width}}  " + "  ".join(f"{r[k]:>11}" for k in COLUMNS))
    lines.insert(-1, "-" * len(lines[0]))
    return "\n".join(lines)
