"""The executed tutorials: docs/tutorials/*.py are jupytext percent-format notebooks that assert
every claim they make; the site runs them at build time (mkdocs-jupyter, mkdocs.yml), and here
each runs as a plain script in fast mode (ATTNLAB_TUTORIAL_FAST=1: fewer samples, the same
assertions), so a claim that stops being true fails.

- Every notebook runs to the end (exit 0) and reports its own running time.
- Every English notebook ``name.py`` has its Chinese counterpart ``name.zh.py`` with the same
  code, cell for cell (only the Markdown cells differ), and both are in the nav and the
  tutorials' index.
- The site links a notebook's Markdown makes (written as URLs relative to the page, since
  mkdocs does not rewrite a notebook's links) point at pages that exist.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "docs" / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("*.py"))
ENGLISH = [p for p in NOTEBOOKS if not p.name.endswith(".zh.py")]


def _id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def cells(path: Path) -> list[tuple[str, str]]:
    """(kind, text) of every cell of a percent-format notebook, kind "code" or "markdown"; the
    jupytext header (before the first ``# %%``) is left out."""
    out: list[tuple[str, list[str]]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# %%"):
            out.append(("markdown" if "[markdown]" in line else "code", []))
        elif out:
            out[-1][1].append(line)
    return [(kind, "\n".join(body).strip()) for kind, body in out]


def test_there_are_notebooks():
    assert _id(TUTORIALS / "scoring.py") in {_id(p) for p in ENGLISH}


def needs_corpus(notebook: Path) -> bool:
    """The page reads a trained translation model (attnlab.analysis.trained): in fast mode it
    trains one with the pipeline, on the real corpus."""
    return "trained_model(" in notebook.read_text(encoding="utf-8")


def test_the_pages_that_read_a_trained_model_are_known():
    assert {p.name for p in ENGLISH if needs_corpus(p)} == {"bahdanau.py", "multi-head.py"}


# The English pages only: a Chinese page's code is the English page's, cell for cell (tested
# below), and the site build (tests/test_docs.py) executes both.
@pytest.mark.parametrize("notebook", ENGLISH, ids=_id)
def test_every_tutorial_runs_in_fast_mode_and_asserts_its_claims(notebook, tmp_path, request):
    env = {**os.environ, "ATTNLAB_TUTORIAL_FAST": "1", "MPLBACKEND": "Agg"}
    if needs_corpus(notebook):  # its short training run downloads from the mirror
        env["ATTNLAB_DATA_MIRROR"] = str(request.getfixturevalue("mirror_dir"))
    out = subprocess.run(
        [sys.executable, str(notebook)],
        cwd=tmp_path,  # a page that wrote a file would write it here
        env=env,
        capture_output=True,
        text=True,
        # a page that trains its model (a minute or three, once: .cache/trained/) may also wait
        # for the site build's run of it (tests/test_docs.py), which holds the same run's lock
        timeout=1200,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    assert re.search(r"this page ran in [\d.]+ s \(fast mode\)", out.stdout), out.stdout[-2000:]


@pytest.mark.parametrize("notebook", ENGLISH, ids=_id)
def test_every_english_tutorial_has_its_chinese_counterpart_with_the_same_code(notebook):
    chinese = notebook.with_name(notebook.stem + ".zh.py")
    assert chinese.is_file(), f"{_id(notebook)} has no Chinese counterpart {_id(chinese)}"
    en, zh = cells(notebook), cells(chinese)
    assert [kind for kind, _ in en] == [kind for kind, _ in zh], "the two pages' cells differ in order"
    for i, ((kind, a), (_, b)) in enumerate(zip(en, zh), 1):
        if kind == "code":
            assert a == b, f"code cell {i} differs between {_id(notebook)} and {_id(chinese)}"
        else:
            assert b and b != a, f"Markdown cell {i} of {_id(chinese)} is empty or untranslated"
    assert re.search(r"\b10\.\d+", zh[0][1]) and re.search(r"\b11\.\d+", zh[0][1]), (
        "the Chinese page cites the Chinese edition's section (10.x) and the English one's (11.x)"
    )


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_id)
def test_every_tutorial_is_in_the_nav_and_the_index(notebook):
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert f"tutorials/{notebook.name}" in nav, f"{_id(notebook)} is not in mkdocs.yml's nav"
    index = (TUTORIALS / "index.md").read_text(encoding="utf-8")
    assert f"({notebook.name})" in index, f"docs/tutorials/index.md does not link {notebook.name}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_id)
def test_a_tutorials_site_links_point_at_pages_that_exist(notebook):
    # the page is served at tutorials/<name>/, so ../../x/y/ is the page docs/x/y.md
    for kind, text in cells(notebook):
        if kind != "markdown":
            continue
        for target in re.findall(r"\]\((\.\./[^)\s]+)\)", text):
            path = target.split("#")[0].removeprefix("../../").rstrip("/")
            assert target.startswith("../../") and any(
                page.is_file()
                for page in (
                    ROOT / "docs" / f"{path}.md",
                    ROOT / "docs" / f"{path}.py",
                    ROOT / "docs" / path / "index.md",
                )
            ), f"{_id(notebook)} links {target}, which is no page of the site"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_id)
def test_every_tutorial_links_its_other_language_in_its_first_cell(notebook):
    first = cells(notebook)[0][1]
    if notebook.name.endswith(".zh.py"):
        other = f"[English](../../tutorials/{notebook.name.removesuffix('.zh.py')}/)"
    else:
        other = f"[中文](../../tutorials/{notebook.stem}.zh/)"
    assert other in first, f"{_id(notebook)}'s first cell has no language switch {other}"
