"""The served model's environment is complete: its ``requirements.txt`` alone loads and runs it.

:func:`attnlab.serving.requirements.served_requirements` derives the logged model's requirements
from the imports of the served code (``serving.py`` and every attnlab module it
reaches). Checked here:

- the derivation: it follows lazy, relative and package-``__init__`` imports, leaves
  out the standard library and uninstalled optional imports, and names the fix for
  a module it cannot pin — so a new import in the served code is a new requirement;
- the logged model's ``requirements.txt`` is that derivation, exact public pins only;
- end to end, what MLflow's virtualenv env manager and Docker image do: a fresh
  virtualenv (no system site-packages) with only that file installed loads
  ``models:/attnlab-transformer@champion`` and translates exactly like the export's
  :class:`attnlab.serving.translator.Translator` in this venv; attnlab comes from the model's code;
- ``mlflow models generate-dockerfile`` writes a build context that needs nothing
  else from this repository.

The fresh virtualenv takes about a minute to build (pip downloads mlflow and its
dependencies from PyPI; torch comes from the machine's wheel index). It is kept
under ``$ATTNLAB_SERVED_ENV_CACHE`` (default ``~/.cache/attnlab/served-envs``) in a
folder named after the hash of the exact ``requirements.txt`` and this Python, and
reused only when it was built from exactly that file and nothing was installed
into it since, so later runs take seconds and still test those requirements.
"""

import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import mlflow
import pytest
from test_serving import SOURCES, store  # noqa: F401 - the same tiny model, logged twice

from attnlab.serving.registry import CHAMPION
from attnlab.serving.requirements import ServedRequirementsError, served_imports, served_requirements
from attnlab.serving.translator import Translator

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("ATTNLAB_SERVED_ENV_CACHE") or Path.home() / ".cache" / "attnlab" / "served-envs")
CHAMPION_URI = f"models:/attnlab-transformer@{CHAMPION}"
BUILT_FROM = "attnlab-built-from-requirements.txt"  # written last: the env is complete


# --- the derivation, on a small package written for the test -------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    """Write ``files`` ({relative path: source}) as package ``pkg`` under ``tmp_path``."""
    for rel, source in files.items():
        path = tmp_path / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return tmp_path / "pkg"


def test_served_imports_follow_the_package_and_skip_the_standard_library(tmp_path):
    pkg = _package(
        tmp_path,
        {
            "__init__.py": "from pkg.conf import setup\n",
            "conf.py": "import omegaconf\n",
            "serving.py": "import json\nimport mlflow\nfrom . import core\n",
            "core.py": """\
            from __future__ import annotations
            import os.path
            from pkg.sub import helpers
            def lazy():
                import sentencepiece
            try:
                import not_installed_anywhere
            except ImportError:
                pass
            """,
            "sub/__init__.py": "import numpy\n",
            "sub/helpers.py": "import torch.nn\n",
            "unused.py": "import pandas\n",  # in the package, never imported by the served code
        },
    )
    assert served_imports(pkg / "serving.py", pkg) == {
        "mlflow": False,
        "omegaconf": False,
        "sentencepiece": False,
        "numpy": False,
        "torch": False,
        "not_installed_anywhere": True,
    }
    reqs = served_requirements(pkg / "serving.py", pkg)
    assert [r.split("==")[0] for r in reqs] == ["mlflow", "numpy", "omegaconf", "sentencepiece", "torch"]


def test_a_new_import_in_the_served_code_becomes_a_requirement(tmp_path):
    pkg = _package(tmp_path, {"__init__.py": "", "serving.py": "import torch\n"})
    assert [r.split("==")[0] for r in served_requirements(pkg / "serving.py", pkg)] == ["torch"]
    (pkg / "serving.py").write_text("import torch\nimport yaml\n")  # PyYAML provides `yaml`
    assert [r.split("==")[0] for r in served_requirements(pkg / "serving.py", pkg)] == ["pyyaml", "torch"]


def test_an_import_nothing_provides_names_the_module_and_the_fix(tmp_path):
    pkg = _package(tmp_path, {"__init__.py": "", "serving.py": "import surely_not_a_module\n"})
    with pytest.raises(ServedRequirementsError, match="imports `surely_not_a_module`.*Install it"):
        served_requirements(pkg / "serving.py", pkg)


def test_attnlabs_served_code_needs_exactly_these_distributions():
    # A change here is a change of the served environment: review it, then update the list.
    names = [r.split("==")[0] for r in served_requirements()]
    # pandas: the signature's DataFrame (attnlab.serving.signature); MLflow needs it anyway
    assert names == [
        "ctranslate2",
        "mlflow",
        "numpy",
        "omegaconf",
        "pandas",
        "sentencepiece",
        "sentencex",
        "torch",
    ]
    assert all("+" not in r for r in served_requirements())  # no local labels (torch's +cpu)


# --- the logged model ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def logged_requirements(store):  # noqa: F811 - the `store` fixture imported from test_serving
    """The text of the champion's requirements.txt, as MLflow hands it to pip."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", store["uri"])
        return Path(mlflow.pyfunc.get_model_dependencies(CHAMPION_URI)).read_text()


def test_logged_requirements_are_the_derived_exact_pins(logged_requirements):
    lines = [line for line in logged_requirements.splitlines() if line.strip()]
    assert lines == served_requirements()
    assert all(line.count("==") == 1 and "+" not in line for line in lines)


@pytest.fixture(scope="module")
def served_env(logged_requirements) -> tuple[Path, float]:
    """(its python, seconds spent building) of a virtualenv built from exactly
    ``logged_requirements``; 0 s when the cached one was built from that same text."""
    key = hashlib.sha256(
        "\n".join([logged_requirements, sys.version, platform.platform()]).encode()
    ).hexdigest()[:16]
    env = CACHE / key
    python = env / "bin" / "python"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another pytest building the same env: wait for it
        built_from = env / BUILT_FROM
        if python.exists() and built_from.is_file() and built_from.read_text() == logged_requirements:
            return python, 0.0
        shutil.rmtree(env, ignore_errors=True)  # unfinished or foreign: build afresh
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
        req = env / "requirements.txt"
        req.write_text(logged_requirements)
        # This venv's pip installs into the new one (--python): exactly `pip install -r`, but
        # without ensurepip, and without compiling .pyc files up front (halves the time).
        pip = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(python),
                "install",
                "--quiet",
                "--no-compile",
                "--disable-pip-version-check",
                "-r",
                str(req),
            ],
            capture_output=True,
            text=True,
            timeout=1200,
        )
        if pip.returncode:
            pytest.fail(
                f"`pip install -r requirements.txt` of the logged model failed "
                f"(exit {pip.returncode}); a pin that does not install from PyPI? "
                f"It needs PyPI once (then {CACHE} is reused).\n{pip.stderr[-3000:]}"
            )
        # Compile what loading imports, in the env only (the runs below use -B: they must
        # not write __pycache__ into the model's code in the store). Errors show up below.
        subprocess.run(
            [str(python), "-I", "-c", "import mlflow.pyfunc, torch"],
            capture_output=True,
            cwd=env,
            timeout=600,
        )
        built_from.write_text(logged_requirements)
        return python, time.perf_counter() - t0


PREDICT = """
import importlib.util, json, sys
assert importlib.util.find_spec("attnlab") is None, "attnlab is installed in the fresh env"
import mlflow
model = mlflow.pyfunc.load_model(sys.argv[1])
predictions = model.predict(json.loads(sys.argv[2]))
print(json.dumps({"predictions": predictions, "attnlab": sys.modules["attnlab"].__file__,
                  "prefix": sys.prefix}))
"""


def test_fresh_virtualenv_from_requirements_txt_alone_loads_and_translates(store, served_env):  # noqa: F811 - the `store` fixture imported from test_serving
    python, build_s = served_env
    cfg = (python.parent.parent / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in cfg
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "MLFLOW_TRACKING_URI": store["uri"],
    }  # nothing else: no PYTHONPATH, no venv of ours
    t0 = time.perf_counter()
    run = subprocess.run(
        [str(python), "-I", "-B", "-c", PREDICT, CHAMPION_URI, json.dumps(SOURCES + [""])],
        capture_output=True,
        text=True,
        env=env,
        cwd=store["tmp"],
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    assert answer["predictions"] == Translator(store["export_dir"])(SOURCES) + [""]
    assert answer["predictions"][:-1] == store["expected"]
    assert Path(answer["prefix"]) == python.parent.parent
    assert not Path(answer["attnlab"]).is_relative_to(ROOT)  # the model's code, not the repo's
    assert Path(answer["attnlab"]).parent.name == "attnlab"
    print(
        f"fresh env: built in {build_s:.1f} s (0 = cached), load + translate {time.perf_counter() - t0:.1f} s"
    )


# --- Docker --------------------------------------------------------------------------------

# MLmodel fields where MLflow records where the model came from; it never reads them
# back (the code file is loaded by its base name from the model folder, the artifacts
# from their relative `path`), so they may name this repository.
PROVENANCE = ("artifact_path", "model_code_path", "uri")


def _without_provenance(node):
    if isinstance(node, dict):
        return {k: _without_provenance(v) for k, v in node.items() if k not in PROVENANCE}
    return [_without_provenance(v) for v in node] if isinstance(node, list) else node


def test_generate_dockerfile_writes_a_self_contained_build_context(store, served_env, tmp_path):  # noqa: F811 - the `store` fixture imported from test_serving
    import yaml

    out = tmp_path / "context"
    env = {**os.environ, "MLFLOW_TRACKING_URI": store["uri"]}
    run = subprocess.run(
        [sys.executable, "-m", "mlflow", "models", "generate-dockerfile", "-m", CHAMPION_URI, "-d", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    dockerfile = (out / "Dockerfile").read_text()
    model = out / "model_dir"
    # Everything the Dockerfile copies comes from the context: the model folder, whole.
    copies = [
        line.split()[1:-1] for line in dockerfile.splitlines() if line.split()[:1] in (["COPY"], ["ADD"])
    ]
    assert copies == [["model_dir"]]
    assert (model / "requirements.txt").read_text().split() == served_requirements()
    assert (model / "code" / "attnlab" / "inference" / "decoding.py").is_file()
    conf = yaml.safe_load((model / "MLmodel").read_text())["flavors"]["python_function"]
    assert (model / Path(conf["model_code_path"]).name).is_file()  # what MLflow loads
    assert conf["artifacts"]["export"]["path"] == "artifacts/export"
    assert {p.name for p in (model / "artifacts" / "export").iterdir()} >= {
        "init_state.pt2",
        "step.pt2",
        "attention.pt2",
        "spm.model",
        "config.json",
    }
    # No file points back into this repository or the store, records of origin aside:
    # .pt and .pt2 (TorchScript and torch.export keep the traced source files' names as debug
    # info: stack traces in the graph's metadata), __pycache__ (bytecode of a process that
    # imported the code in place in a local store; stale bytecode is regenerated). None of these
    # paths is opened when the model loads. spm.model records no path (train_sentencepiece).
    for path in out.rglob("*"):
        if not path.is_file() or path.suffix in (".pt", ".pt2") or "__pycache__" in path.parts:
            continue
        text = path.read_bytes()
        if path.name == "MLmodel":
            text = yaml.safe_dump(_without_provenance(yaml.safe_load(text))).encode()
        for where in (ROOT, store["tmp"]):
            assert str(where).encode() not in text, f"{path.relative_to(out)} names {where}"
    # What the image does, without Docker: the fresh env (the image's pip install of the
    # same requirements.txt) loads the copied model folder, no tracking store, and translates.
    moved = tmp_path / "opt" / "ml" / "model"
    shutil.copytree(model, moved)
    python, _ = served_env
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    run = subprocess.run(
        [str(python), "-I", "-B", "-c", PREDICT, str(moved), json.dumps(SOURCES)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    assert answer["predictions"] == store["expected"]
    assert Path(answer["attnlab"]).is_relative_to(moved)
