"""One fault, injected and judged: the stage's outcome, the files it must keep whole, and the run after.

Every fault is judged by the same invariant:

1. the stage either **succeeded** and its outputs are whole (each loads as its kind, the
   download's bytes are the mirror's), or was **killed** (SIGKILL: nothing to say), or
   **refused**: it stopped with an error for a person, with no Python traceback on stderr,
   one line ``<stage>: <message>`` that names the damaged file (or the full disk); after
   Ctrl-C it may also end by SIGINT, as Unix programs do so that the shell knows;
2. every file that was whole before the fault (before the run, or at the moment of the
   fault) is still whole: the same bytes, or a file that loads (a replaced output), or a
   temporary file gone; only what the stage deletes on purpose may be missing;
3. with the fault removed (the file's bytes put back, the filler deleted), the stage runs
   again and succeeds, its outputs whole, and leaves no temporary or staging file and no
   unfinished (PENDING) MLflow model behind.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from test_faults import checks
from test_faults.damage import damage
from test_faults.inject import FILLER
from test_faults.project import ENDS, READERS, STARTS, TOKENIZED, Pipeline
from test_faults.runner import Run

# What each stage writes (files or folders), compared with the state after a run without a fault.
OUTPUTS = {
    "download": ["data/raw"],
    "tokenize": [TOKENIZED],
    "train": ["checkpoints/transformer/best.ckpt", "runs/transformer.json"],
    "evaluate": ["metrics/transformer.json", "metrics/transformer.hyp.txt"],
    "export": ["models/transformer"],
    "translate": [],
    "translate_attention": [],
}
# What a stage deletes on purpose: a fresh training run starts plots/<model> anew, and a
# finished one deletes last.ckpt.
MAY_REMOVE = {"train": ("plots/transformer/*", "checkpoints/transformer/last.ckpt")}
# The words an error about a full disk uses (ENOSPC, EFBIG, SQLite's "database or disk is full").
DISK_FULL = re.compile(r"No space left|File too large|disk (is )?full|free (disk )?space|Errno 2[78]", re.I)


@dataclass
class Outcome:
    """What one fault did: where it was injected, the stage's result and the broken invariants."""

    case: str
    seed: int
    where: str = ""  # the file operation the fault came at, or the damage
    result: str = ""  # succeeded, refused, killed, not reached
    message: str = ""  # the last line of stderr
    recovery: str = ""  # "ran" or "same state as the census" (nothing to re-run)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # not broken, but worth knowing
    seconds: float = 0.0


# An error's line as attnlab.console.errors ends a stage with it: "<stage>: <message>"
# ("<model>: training stopped …" from training's own handler).
ERROR_LINE = re.compile(r"^[a-z][\w-]*: \S")
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Warning)\b")


def last_line(text: str) -> str:
    """The line that says what went wrong: the last of stderr, or after a traceback the
    exception's own line (Hydra ends with its HYDRA_FULL_ERROR advice)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if "Traceback" in text:
        lines = [line for line in lines if EXCEPTION_LINE.match(line)] or lines
    return lines[-1] if lines else ""


def outputs_whole(pipe: Pipeline, stage: str, run: Run) -> list[str]:
    """The outputs of a successful ``stage`` that are missing or not whole."""
    end, problems = pipe.snapshot(ENDS[stage]), []
    for out in OUTPUTS[stage]:
        expected = (
            [out]
            if (end / out).is_file()
            else [str(p.relative_to(end)) for p in checks.files_under(end, out)]
        )
        for rel in expected:
            p = pipe.project / rel
            if not p.is_file():
                problems.append(f"output {rel} missing")
            elif why := checks.whole(p):
                problems.append(f"output {rel} not whole: {why}")
            elif stage == "download" and checks.digest(p) != checks.digest(end / rel):
                problems.append(f"output {rel} differs from the mirror's")
    if stage == "train" and (pipe.project / "checkpoints/transformer/last.ckpt").exists():
        problems.append("last.ckpt left after a finished run")
    if stage in READERS and len(run.stdout.splitlines()) != 1:
        problems.append(f"not one line out for one sentence in: {run.stdout!r}")
    return problems


def judge(
    pipe: Pipeline, stage: str, run: Run, action: str, names: re.Pattern | None
) -> tuple[str, list[str]]:
    """The result of a run with a fault, and what it broke of invariant 1."""
    if run.returncode == 0:
        return "succeeded", outputs_whole(pipe, stage, run)
    if action == "kill" and run.returncode == -9:
        return "killed", []
    problems = []
    if run.returncode < 0 and not (action == "interrupt" and run.returncode == -2):  # Ctrl-C may end it
        problems.append(f"died of signal {-run.returncode}")
    if "Traceback" in run.stderr:
        problems.append(f"a traceback on stderr, ending {last_line(run.stderr)!r}")
    elif run.returncode > 0 and not ERROR_LINE.match(last_line(run.stderr)):
        problems.append(f"the error is not one line of its stage's: {run.stderr.strip()[-600:]!r}")
    elif names is not None and not names.search(last_line(run.stderr)):
        problems.append(f"the error does not name the fault ({names.pattern}): {last_line(run.stderr)!r}")
    return "refused", problems


def recover(pipe: Pipeline, stage: str, start: str) -> tuple[str, list[str]]:
    """Run ``stage`` again, the fault removed (invariant 3). Where the project is exactly the
    state ``start`` the fault was injected in and the census of ``stage`` started from, that
    run is the census, which succeeded: not re-run."""
    if start == STARTS[stage] and checks.manifest(pipe.project) == checks.manifest(pipe.snapshot(start)):
        return "same state as the census", []
    run = pipe.run(stage)
    if run.returncode != 0:
        return "ran", [f"the run after the fault failed: {run.tail(1500)}"]
    problems = [f"after the next run: {p}" for p in outputs_whole(pipe, stage, run)]
    problems += [f"left after the next run: {s}" for s in checks.strays(pipe.project)]
    problems += [f"after the next run: {m}" for m in checks.pending_models(pipe.project)]
    return "ran", problems


WRITES = re.compile(
    r"^(os\.(rename|replace|mkdir|link|symlink|truncate)|shutil\.(copyfile|move)|tempfile\.|sqlite3\.connect)|\((w|a|x|r\+)"
)


def moments(pipe: Pipeline, stage: str, writes_only: bool) -> list[int]:
    """The 1-based numbers of the census's file operations a fault may come at: all of them,
    or those that write (a full disk before a read is a full disk before the next write)."""
    events = pipe.census[stage]
    return [i + 1 for i, e in enumerate(events) if not writes_only or WRITES.search(e)]


def at_operation(
    pipe: Pipeline, stage: str, action: str, case: str, seed: int, at: int | None = None, **fill
) -> Outcome:
    """``action`` (kill, interrupt, fill) at file operation ``at`` of ``stage``, or at one
    ``seed`` chooses among those of its census (:func:`moments`); judged by the three invariants."""
    rng, started = random.Random(f"{case}:{seed}"), time.monotonic()
    out = Outcome(case, seed)
    before = checks.manifest(pipe.project)
    at = at or rng.choice(moments(pipe, stage, writes_only=action == "fill"))
    if action == "fill" and "free" not in fill:
        fill["free"] = rng.choice((0, 0, 4096, 65536, 262144))
    run = pipe.run(stage, {"action": action, "at": at, **fill})
    if run.record is None:
        out.result, out.where = "not reached", f"operation {at} of {len(pipe.census[stage])}"
    else:
        out.where = f"{run.record['event']} ({at}/{len(pipe.census[stage])})" + (
            f"; {run.record['fill']}" if "fill" in run.record else ""
        )
    result, out.problems = judge(pipe, stage, run, action, DISK_FULL if action == "fill" else None)
    out.result = out.result or result
    out.message = last_line(run.stderr)
    held = {rel: {sha} for rel, sha in before.items()}
    for rel, sha in (run.record or {}).get("manifest", {}).items():
        held.setdefault(rel, set()).add(sha)
    out.problems += checks.kept_whole(held, pipe.project, MAY_REMOVE.get(stage, ()))
    (pipe.project / FILLER).unlink(missing_ok=True)  # the fault removed: space freed
    out.recovery, problems = recover(pipe, stage, STARTS[stage])
    out.problems += problems
    out.seconds = round(time.monotonic() - started, 1)
    return out


def damaged_file(
    pipe: Pipeline, stage: str, rel: str, kind: str, case: str, seed: int, start: str
) -> Outcome:
    """The file ``rel`` of the project in state ``start`` damaged as ``kind``
    (:mod:`test_faults.damage`, where chosen by ``seed``), then ``stage``, which reads it, run;
    judged by the three invariants (the error must name the file)."""
    rng, started = random.Random(f"{case}:{seed}"), time.monotonic()
    out = Outcome(case, seed)
    path = pipe.project / rel
    original = path.read_bytes()
    bad, out.where = damage(original, kind, rng)
    path.write_bytes(bad)
    before = {r: {sha} for r, sha in checks.manifest(pipe.project).items() if r != rel}
    run = pipe.run(stage)
    out.result, out.problems = judge(pipe, stage, run, "damage", re.compile(re.escape(Path(rel).name)))
    out.message = last_line(run.stderr)
    if out.result == "succeeded" and stage in READERS and run.stdout != pipe.stdout[stage]:
        out.notes.append(f"printed {run.stdout.strip()!r}, not {pipe.stdout[stage].strip()!r} (no error)")
    out.problems += checks.kept_whole(before, pipe.project, MAY_REMOVE.get(stage, ()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(original)  # the fault removed: the file's bytes put back
    out.recovery, problems = recover(pipe, stage, start)
    out.problems += problems
    out.seconds = round(time.monotonic() - started, 1)
    return out
