"""The code style and type checks CI enforces (the same as .pre-commit-config.yaml): ruff's lint
rules and formatter on every Python file, and mypy on the modules pyproject.toml names
(``attnlab.models``, ``attnlab.inference``, ``attnlab.metrics``)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / cmd[0]), *cmd[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_finds_nothing():
    out = _run("ruff", "check", "--output-format", "concise", ".")
    assert out.returncode == 0, (
        f"ruff check (fix with `ruff check --fix`, or by hand):\n{out.stdout}{out.stderr}"
    )


def test_the_code_is_formatted():
    out = _run("ruff", "format", "--check", ".")
    assert out.returncode == 0, f"run `ruff format` on:\n{out.stdout}{out.stderr}"


def test_mypy_finds_no_type_error():
    out = _run("mypy")
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"Success: no issues found in \d+ source files", out.stdout), out.stdout


def test_every_noqa_says_why():
    """A noqa comment names the rule and, after " - ", the reason it does not apply there."""
    bare = []
    for path in sorted(ROOT.glob("**/*.py")):
        if any(part in {".venv", "site", "node_modules"} or part.startswith(".") for part in path.parts):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            m = re.search(r"#\s*noqa\b(.*)$", line)
            if m and not re.match(r":\s*[A-Z]+\d+(,\s*[A-Z]+\d+)*\s+-\s+\S", m.group(1)):
                bare.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bare, "noqa without a rule and a reason:\n" + "\n".join(bare)
