"""The documentation: the site builds without a warning, every Python snippet runs, and every
shell command a how-to guide, a tutorial or the README shows is listed with the test that runs it.

- ``mkdocs build --strict`` (docs/, mkdocs.yml): no broken link or anchor, no page missing from
  the nav, the configuration reference generated from conf/ (docs/gen_ref.py), the API pages
  rendered from the docstrings.
- Every fenced ``python`` block of docs/**/*.md and README.md is executed: the blocks of one
  page in order, in one fresh namespace per page, in a scratch working directory. A snippet
  must be self-contained (no trained model, no network).
- Every command of a ``bash``/``sh``/``console`` block in docs/how-to/, docs/tutorials/ and
  README.md is a row of docs/reference/command-tests.md, whose test column names
  ``tests/<file>.py::<test>`` functions that exist (or says ``not run by a test: <why>``); and
  every row is a command some page shows.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
COMMAND_TABLE = DOCS / "reference" / "command-tests.md"
NOT_RUN = "not run by a test:"
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)[ \t]*(?P<lang>[\w+-]*)[^\n]*$")
SHELL = {"bash", "sh", "shell", "console"}
TEST_REF = re.compile(r"tests/(?P<file>[\w/]+\.py)::(?P<name>\w+)")


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md")) + [README]


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, content) of every fenced code block of a Markdown text, in order; an indented
    fence (inside a list item) loses its indentation."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m["indent"]), m["fence"], m["lang"].lower()
        body, i = [], i + 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        blocks.append((lang, "\n".join(body)))
        i += 1
    return blocks


def strip_comment(line: str) -> str:
    """A shell line without its trailing ``# comment`` (a ``#`` after whitespace, outside
    quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def normalize(command: str) -> str:
    return " ".join(command.split())


def shell_commands(lang: str, body: str) -> list[str]:
    """The commands of one shell block: continued lines (``\\``) joined, comments dropped; in a
    ``console`` block only the lines after a ``$`` prompt (the rest is output)."""
    if lang == "console":
        lines = [line[2:] for line in body.splitlines() if line.startswith("$ ")]
    else:
        lines = body.splitlines()
    commands, current = [], ""
    for line in lines:
        line = strip_comment(line)
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip():
            commands.append(normalize(current))
        current = ""
    if current.strip():
        commands.append(normalize(current))
    return commands


def shown_commands() -> dict[str, list[str]]:
    """Every shell command of the how-to guides, the tutorials and the README → the pages
    that show it."""
    pages = sorted((DOCS / "how-to").glob("*.md")) + sorted((DOCS / "tutorials").rglob("*.md")) + [README]
    shown: dict[str, list[str]] = {}
    for page in pages:
        for lang, body in fenced_blocks(page.read_text(encoding="utf-8")):
            if lang in SHELL:
                for command in shell_commands(lang, body):
                    shown.setdefault(command, []).append(_name(page))
    return shown


def split_row(row: str) -> list[str]:
    """The cells of a Markdown table row: ``|`` separates cells except inside a code span or
    escaped as ``\\|`` outside one."""
    cells, cell, in_code, i = [], "", False, 0
    row = row.strip().removeprefix("|")
    if row.endswith("|") and not row.endswith("\\|"):
        row = row[:-1]
    while i < len(row):
        ch = row[i]
        if ch == "\\" and not in_code and i + 1 < len(row) and row[i + 1] == "|":
            cell += "|"
            i += 2
            continue
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += ch
        i += 1
    cells.append(cell.strip())
    return cells


def command_table() -> dict[str, str]:
    """docs/reference/command-tests.md: command → its test cell."""
    rows = {}
    for line in COMMAND_TABLE.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| `"):
            continue
        cells = split_row(line)
        command = normalize(cells[0].strip("`"))
        assert command not in rows, f"{command!r} is listed twice in {_name(COMMAND_TABLE)}"
        rows[command] = cells[1] if len(cells) > 1 else ""
    return rows


def _test_exists(file: str, name: str) -> bool:
    path = ROOT / "tests" / file
    return (
        path.is_file()
        and re.search(rf"^\s*(async\s+)?def {name}\(", path.read_text(encoding="utf-8"), re.M) is not None
    )


# --- the site -------------------------------------------------------------------------------


def test_the_site_builds_strictly_with_every_page_in_the_nav(tmp_path, mirror_dir):
    # the tutorial notebooks run in fast mode (tests/test_tutorials.py runs them too); the two
    # that read a trained model train it from the corpus mirror (once: attnlab.analysis.trained)
    env = {
        **os.environ,
        "NO_MKDOCS_2_WARNING": "1",
        "DISABLE_MKDOCS_2_WARNING": "true",
        "ATTNLAB_TUTORIAL_FAST": "1",
        "ATTNLAB_DATA_MIRROR": str(mirror_dir),
    }
    site = tmp_path / "site"
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-6000:]
    config = (site / "reference" / "config" / "index.html").read_text(encoding="utf-8")
    for group in ("data", "model", "optimizer", "device", "trainer", "callbacks", "experiment", "profile"):
        for option in (ROOT / "conf" / group).glob("*.yaml"):
            assert f"{group}={option.stem}" in config, f"{group}={option.stem} is not in the config reference"
    api = (site / "reference" / "api" / "models" / "index.html").read_text(encoding="utf-8")
    for name in (
        "masked_softmax",
        "AdditiveAttention",
        "DotProductAttention",
        "MultiHeadAttention",
        "PositionalEncoding",
        "PositionWiseFFN",
        "AddNorm",
        "Transformer",
    ):
        assert name in api, f"{name} is missing from the API reference"
    for page in ("scoring", "scoring.zh", "multi-head", "multi-head.zh"):  # executed: it shows its outputs
        html = (site / "tutorials" / page / "index.html").read_text(encoding="utf-8")
        assert "this page ran in" in html and "data:image/png" in html, f"tutorials/{page} has no outputs"
    for page, lang in (
        ("index.zh", "zh"),
        ("reference/glossary.zh", "zh"),
        ("tutorials/scoring.zh", "zh"),
        ("tutorials/scoring", "en"),
        ("index.html", "en"),
    ):  # docs/lang_hook.py
        path = site / page if page.endswith(".html") else site / page / "index.html"
        assert f'<html lang="{lang}"' in path.read_text(encoding="utf-8"), f"{page} is not marked lang={lang}"
    results = (site / "results" / "index.html").read_text(encoding="utf-8")
    for figure in ("ablation_curves_transformer.png", "ablation_curves_bahdanau.png"):  # docs/gen_results_*
        assert figure in results and (site / "results" / figure).read_bytes().startswith(b"\x89PNG"), figure
    for page in ("multi-head", "multi-head.zh"):  # the attention explorer, embedded with its data
        html = (site / "tutorials" / page / "index.html").read_text(encoding="utf-8")
        assert "<iframe srcdoc=" in html and "attnlab-explorer-data" in html, (
            f"tutorials/{page} has no explorer"
        )


def test_the_config_reference_reads_keys_defaults_and_comments(tmp_path):
    """docs/gen_ref.py's scanner: dotted keys, defaults as written, the comment beside a key or
    the comment lines right above it, a flow mapping over two lines, the defaults list."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_ref", DOCS / "gen_ref.py")
    gen_ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_ref)  # run as a script it only prints; imported it writes nothing
    conf = tmp_path / "x.yaml"
    conf.write_text(
        "# The file's own comment.\n"
        "defaults:\n  - data: multi30k\n  - _self_\n"
        "net:\n  d_model: 256   # width\n  # the number of heads\n  num_heads: 4\n"
        "url: 'http://x#y'  # quoted '#' is text\n"
        "profile: {a: 1,\n          b: [2, 3]}\n"
    )
    header, rows = gen_ref.scan(conf)
    assert header == "The file's own comment."
    assert rows == [
        ("defaults", "[data: multi30k, _self_]", "the defaults list (Hydra)"),
        ("net.d_model", "256", "width"),
        ("net.num_heads", "4", "the number of heads"),
        ("url", "'http://x#y'", "quoted '#' is text"),
        ("profile", "{a: 1, b: [2, 3]}", ""),
    ]


# --- Python snippets ------------------------------------------------------------------------


def _python_pages() -> list[Path]:
    return [
        p
        for p in _pages()
        if any(lang in ("python", "py") for lang, _ in fenced_blocks(p.read_text(encoding="utf-8")))
    ]


@pytest.mark.parametrize("page", _python_pages(), ids=_name)
def test_every_python_snippet_runs(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a snippet that writes a file writes it here
    namespace: dict = {"__name__": "__docs__"}
    blocks = [
        body for lang, body in fenced_blocks(page.read_text(encoding="utf-8")) if lang in ("python", "py")
    ]
    for i, body in enumerate(blocks, 1):
        code = compile(body, f"{_name(page)} (python block {i})", "exec")
        exec(code, namespace)


def test_there_are_python_snippets_to_run():
    assert {_name(p) for p in _python_pages()} >= {"docs/index.md", "docs/reference/api/models.md"}


# --- shell commands and their tests ---------------------------------------------------------


def test_every_shown_command_is_listed_with_its_test():
    shown, table = shown_commands(), command_table()
    missing = {c: pages for c, pages in shown.items() if c not in table}
    assert not missing, (
        f"commands shown in the docs but not listed in {_name(COMMAND_TABLE)} "
        f"(add a row: the command, then the test that runs it): {missing}"
    )
    stale = sorted(set(table) - set(shown))
    assert not stale, f"rows of {_name(COMMAND_TABLE)} that no page shows any more: {stale}"


def test_every_listed_test_exists_or_the_row_says_why_not():
    for command, cell in command_table().items():
        refs = TEST_REF.findall(cell)
        if not refs:
            assert cell.lower().startswith(NOT_RUN), (
                f"{command!r}: name a test (tests/<file>.py::<test>) or say '{NOT_RUN} <why>'"
            )
            assert len(cell) > len(NOT_RUN) + 3, f"{command!r}: say why no test runs it"
            continue
        for file, name in refs:
            assert _test_exists(file, name), f"{command!r}: tests/{file}::{name} does not exist"


def test_tests_named_anywhere_in_the_docs_exist():
    for page in _pages():
        for file, name in TEST_REF.findall(page.read_text(encoding="utf-8")):
            assert _test_exists(file, name), f"{_name(page)} names tests/{file}::{name}, which does not exist"


def test_the_command_extraction_joins_continued_lines_and_drops_comments_and_output():
    body = "dvc exp run -S a=1 \\\n  -S 'b=\"x y\"'   # one experiment\n# a comment\n\nmlflow ui"
    assert shell_commands("bash", body) == ["dvc exp run -S a=1 -S 'b=\"x y\"'", "mlflow ui"]
    assert shell_commands("console", "$ dvc status\nData and pipelines are up to date.") == ["dvc status"]
    assert strip_comment("open 'explorer.html#sentence=1'  # the page") == "open 'explorer.html#sentence=1'"
    assert split_row(r"| `printf 'a\n' | python src/translate.py` | tests/x.py::y | a \| b |") == [
        "`printf 'a\\n' | python src/translate.py`",
        "tests/x.py::y",
        "a | b",
    ]


# --- the README -----------------------------------------------------------------------------

SETUP_AND_RUN = (
    "./scripts/setup.sh && source .venv/bin/activate && ATTNLAB_DATA_MIRROR=../shared/data dvc repro"
)
SETUP_AND_TEST = "./scripts/setup.sh && .venv/bin/python -m pytest"


def test_the_readme_is_a_short_door_with_its_two_commands_first():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    first = next(body for lang, body in fenced_blocks(text) if lang in SHELL)
    assert shell_commands("bash", first) == [SETUP_AND_RUN, SETUP_AND_TEST]
    assert text.count("<!-- results:start -->") == text.count("<!-- results:end -->") == 1
    assert text.index("<!-- results:start -->") < text.index("<!-- results:end -->")


def test_the_readmes_links_and_pictures_exist():
    text = README.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (ROOT / target.split("#")[0]).resolve()
        assert path.exists(), f"README.md links to {target}, which does not exist"


def test_the_cli_reference_names_every_attnlab_command():
    from attnlab.cli import SCRIPTS

    text = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    for name, script in SCRIPTS.items():
        assert f"`attnlab-{name}`" in text and f"`src/{script}`" in text, name


# --- commands no other test runs --------------------------------------------------------------


def test_dvc_metrics_show_prints_the_committed_scores(tmp_path):
    """`dvc metrics show` (docs/tutorials/first-run.md) over the project's dvc.yaml and its
    committed metrics/*.json (in a scratch copy, so neither the checkout's git nor its DVC state
    matters): every metrics file the pipeline declares, with its scores."""
    import json
    import shutil

    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "metrics", tmp_path / "metrics")
    dvc = [sys.executable, "-m", "dvc"]
    subprocess.run([*dvc, "init", "--no-scm", "-q"], cwd=tmp_path, check=True, timeout=300)
    out = subprocess.run(
        [*dvc, "metrics", "show", "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    shown = next(iter(json.loads(out.stdout).values()))["data"]
    for model, key in (("transformer", "bleu"), ("bahdanau", "bleu"), ("nw", "mse")):
        committed = json.loads((ROOT / "metrics" / f"{model}.json").read_text())
        assert shown[f"metrics/{model}.json"]["data"][key] == committed[key]


def test_the_precision_trainer_full_chooses_is_printed():
    """`python src/train.py trainer=full --cfg job --resolve | grep precision`
    (docs/how-to/full-profile.md): the composed config names one precision, trains nothing."""
    out = subprocess.run(
        [sys.executable, "src/train.py", "trainer=full", "--cfg", "job", "--resolve"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line.strip() for line in out.stdout.splitlines() if "precision" in line]
    assert lines in (["precision: bf16-mixed"], ["precision: 32-true"]), lines
