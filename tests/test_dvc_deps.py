"""DVC re-runs a stage exactly when something it uses changed (dvc.yaml's code deps).

Each stage's ``src/`` deps must cover every attnlab module its script imports (read with
``ast``, lazy imports too: :mod:`import_graph`) or loads by the name its models' configs give
(``task.module``/``task.evaluate``/``task.export`` of ``conf/model/<model>.yaml``, ``tokenize`` of
``conf/data/*.yaml``), and nothing
else, except the modules in :data:`NEUTRAL`, which cannot change what a stage writes and are
therefore never deps: so editing a console summary re-runs no training (checked with a real ``dvc status``).
"""

import json
import re
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from helpers.import_graph import SRC, module_files, runs, runs_module

ROOT = SRC.parent
DVC = [sys.executable, "-m", "dvc"]
# module or package → why it cannot change a stage's outputs (it writes to the terminal or to
# MLflow only)
NEUTRAL = {
    "attnlab.console": "log filters, the stage summaries and the MLflow queries they make: stdout/stderr",
    "attnlab.lit.progress": "the progress bar's choice and one line per epoch on stdout",
    "attnlab.lit.logger": "the MLflow logger: writes to the MLflow store (runs/<model>.json gets "
    "the run id MLflow chose, not anything of its code)",
    "attnlab.tracking.sweep": "Hydra multirun parents: `dvc repro` runs no multirun",
}
# stage → deps under src/ that are read as files, not imported (the modules they import count too)
NOT_IMPORTED = {"export": {"attnlab/serving/model.py"}, "export_nw": {"attnlab/serving/model.py"}}


# stage (its template for a `foreach`) → the keys of conf/model/<model>.yaml's `task` it loads
# (`load`, where a model gives it, rebuilds the net from its checkpoint: the image models')
TASK_KEY = {"train": ("module",), "evaluate": ("evaluate", "load", "summary"), "export": ("export", "load")}


VISION = "attnlab.vision."


def _model_configs() -> dict[str, dict]:
    """conf/model/<model>.yaml by model name."""
    return {f.stem: yaml.safe_load(f.read_text()) for f in sorted((ROOT / "conf" / "model").glob("*.yaml"))}


def _named_by_config(name: str) -> set[str]:
    """The attnlab modules the stage's configs name for it: for ``tokenize`` the ``tokenize`` of
    every conf/data/*.yaml (``params.yaml``'s ``data`` may choose any), else ``task.<key>`` of each
    model the stage runs (params.yaml's ``models`` for a translation ``foreach`` stage, ``nw`` for
    ``*_nw``, every image model (:data:`VISION`) for ``*_image``)."""
    if name == "tokenize":
        named = [
            yaml.safe_load(f.read_text()).get("tokenize") for f in (ROOT / "conf" / "data").glob("*.yaml")
        ]
        return {target.rsplit(".", 1)[0] for target in named if target}
    kind = name.removesuffix("_nw").removesuffix("_image")
    if kind not in TASK_KEY:
        return set()
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    if name.endswith("_nw"):
        models = ["nw"]
    elif name.endswith("_image"):  # params.yaml's `images` is empty: every model an experiment can add
        models = [m for m in _model_configs() if _model_configs()[m]["task"]["module"].startswith(VISION)]
    else:
        models = list(params["models"])
    named = set()
    for model in models:
        task = _model_configs()[model]["task"]
        for key in TASK_KEY[kind]:
            if key in task:
                named.add(task[key].rsplit(".", 1)[0])  # the module of the class or function
    return named


def _stages() -> dict[str, dict]:
    """dvc.yaml's stages, a ``foreach`` stage by its template (``do``)."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    return {name: stage.get("do", stage) for name, stage in stages.items()}


def _covered(deps: list[str]) -> set[Path]:
    """The .py files under src/ that the deps name (a folder names every file in it)."""
    out = set()
    for dep in deps:
        path = ROOT / dep
        if dep.startswith("src/"):
            assert path.exists(), f"dvc.yaml names {dep}, which does not exist"
            out |= set(path.rglob("*.py")) if path.is_dir() else {path}
    return out


@pytest.mark.parametrize("name", list(_stages()))
def test_code_deps_are_the_modules_the_stage_imports(name):
    stage = _stages()[name]
    script = re.match(r"python (src/\S+\.py)", stage["cmd"]).group(1)
    stop = {m for m in module_files() if any(m == n or m.startswith(n + ".") for n in NEUTRAL)}
    neutral = {module_files()[m] for m in stop}
    read = {SRC / m for m in NOT_IMPORTED.get(name, ())}  # run by the stage, not imported
    needed = set().union(
        *(runs(f, stop=stop) | {f} for f in {ROOT / script} | read),
        *(runs_module(m, stop=stop) for m in _named_by_config(name)),
    )
    covered = _covered(stage["deps"])
    rel = lambda files: sorted(str(f.relative_to(SRC)) for f in files)
    missing, neutral_deps = rel(needed - covered), rel(covered & neutral)
    unused = rel(covered - needed)
    assert not missing, f"{name}: imports modules that are not deps: {missing}"
    assert not neutral_deps, f"{name}: depends on {neutral_deps}, which cannot change its outputs"
    assert not unused, f"{name}: depends on modules it never imports: {unused}"


def _changed_deps(project: Path) -> dict[str, set[str]]:
    """``dvc status``: stage → the deps it reports changed (modified, deleted, new)."""
    out = subprocess.run([*DVC, "status", "--json"], cwd=project, check=True, capture_output=True, text=True)
    changed = {}
    for stage, entries in json.loads(out.stdout).items():
        for entry in entries:
            if isinstance(entry, dict) and "changed deps" in entry:
                changed[stage] = set(entry["changed deps"])
    return changed


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A copy of the pipeline's definition and code as a DVC project whose lock matches this
    code: every output is an empty stand-in, recorded with ``dvc commit``, so ``dvc status``
    starts clean and reports exactly what an edit changes."""
    from dvc.repo import Repo

    project = tmp_path_factory.mktemp("deps") / "attnlab"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for folder in ("src", "conf"):
        shutil.copytree(ROOT / folder, project / folder, ignore=ignore)
    for file in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / file, project / file)
    subprocess.run([*DVC, "init", "--no-scm", "-q"], cwd=project, check=True)
    with Repo(str(project)) as repo:
        outs = [Path(out.fs_path) for stage in repo.index.stages for out in stage.outs]
    for out in outs:
        if out.suffix:  # runs/<model>.json, metrics/<model>.json, metrics/<model>.hyp.txt
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text("{}")
        else:
            out.mkdir(parents=True, exist_ok=True)
            (out / "stand-in").write_text("")
    subprocess.run([*DVC, "commit", "--force", "-q"], cwd=project, check=True)
    assert _changed_deps(project) == {}, "a fresh lock should leave nothing changed"
    return project


@contextmanager
def _edited(path: Path, old: str, new: str):
    """``path`` with its first ``old`` replaced by ``new`` for the block, then restored."""
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))
    try:
        yield
    finally:
        path.write_text(text)


# the foreach stages of the translation models (dvc.yaml's `models`)
TRANSLATION_STAGES = [
    f"{stage}@{model}" for stage in ("train", "evaluate", "export") for model in ("bahdanau", "transformer")
]


def test_editing_a_console_summary_retrains_nothing(project):
    with _edited(
        project / "src/attnlab/console/summaries.py",
        "def train_summary(",
        "def train_summary(  # reworded\n    ",
    ):
        assert _changed_deps(project) == {}

    # The control: the attention library changes what every model writes, and nothing else.
    with _edited(
        project / "src/attnlab/models/attention.py",
        "def masked_softmax(",
        "def masked_softmax(  # edited\n    ",
    ):
        after = _changed_deps(project)
    stages = [*TRANSLATION_STAGES, "train_nw", "evaluate_nw", "export_nw", "head_importance"]
    assert after == {stage: {"src/attnlab/models"} for stage in stages}  # the book's folder, a dep


def test_editing_the_full_profile_reruns_the_stages_that_can_compose_it(project):
    """conf/experiment/ is read when a model's `overrides` (params.yaml) name `+experiment=…`,
    as the README's full-profile experiment does: each stage that passes those overrides to
    Hydra lists the folder, and the NW stages (whose own overrides never compose a translation
    experiment) do not; conf/trainer/full.yaml, which the profile extends, re-runs training."""
    with _edited(project / "conf/experiment/full.yaml", "dropout: 0.2", "dropout: 0.3"):
        after = _changed_deps(project)
    assert after == {stage: {"conf/experiment"} for stage in [*TRANSLATION_STAGES, "head_importance"]}
    with _edited(project / "conf/trainer/full.yaml", "max_epochs: 40", "max_epochs: 41"):
        assert _changed_deps(project) == {
            f"train@{m}": {"conf/trainer/full.yaml"} for m in ("bahdanau", "transformer")
        }
