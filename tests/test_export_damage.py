"""A damaged export file names itself: every file of a real export folder, cut short or with a
flipped byte, is refused by the translator with an error that names it and the command that
exports the model again; a damaged AOTInductor step is passed over for the portable program
beside it, with one warning.

The folder is a real export (:func:`attnlab.export.trace.export_translation`) of the tiny
Transformer of :mod:`helpers.serve_harness`, with its AOTInductor step where this CPU builds one
and a float32 CTranslate2 model. torch's and CTranslate2's readers do not notice a flipped byte
in the weights (they load and translate differently), so the check is the folder's
``SHA256SUMS`` (:mod:`attnlab.export.integrity`).
"""

import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from attnlab.data.tokenizer import train_sentencepiece
from attnlab.export.integrity import CHECKSUMS, DamagedExportError, DamagedExportWarning, sha256
from attnlab.export.program import can_compile
from attnlab.export.trace import export_translation
from attnlab.serving.translator import Translator
from helpers.refusal import refusal
from helpers.serve_harness import PAIRS, learned_transformer
from helpers.tiny_train import ROOT, env

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SOURCES = ["A dog runs.", "Two girls sing."]
FIX = (
    "export the model again with `python src/export.py model=transformer` (or `dvc repro export@transformer`)"
)
CT2 = "ctranslate2/float32"
# Every file the translator reads, and what reads it: the folder's load, alignments, the
# CTranslate2 engine. The step it reads is the AOTInductor build where this CPU runs one.
READ_BY = {
    CHECKSUMS: "load",
    "config.json": "load",
    "init_state.pt2": "load",
    "step.aoti.pt2" if can_compile() else "step.pt2": "load",
    "spm.model": "load",
    "attention.pt2": "align",
    f"{CT2}/{CHECKSUMS}": "ctranslate2",
    f"{CT2}/attnlab.json": "ctranslate2",
    f"{CT2}/config.json": "ctranslate2",
    f"{CT2}/model.bin": "ctranslate2",
    f"{CT2}/shared_vocabulary.json": "ctranslate2",
}


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """A whole export folder, ``…/models/transformer`` (its folder name is the model's)."""
    tmp = tmp_path_factory.mktemp("damage")
    sp = train_sentencepiece([s for pair in PAIRS for s in pair], tmp / "spm", vocab_size=120)
    return export_translation(
        learned_transformer(sp),
        tmp / "spm.model",
        tmp / "models/transformer",
        {"model": "transformer", "decoding": {"beam_size": 2, "alpha": 0.6}},
        80,
        ctranslate2=["float32"],
        compile=can_compile(),
    )


@pytest.fixture(scope="module")
def expected(export) -> list[str]:
    return Translator(export)(SOURCES)


def damage(path: Path, how: str) -> None:
    """Cut the file to half its bytes, or flip every bit of its middle byte."""
    data = bytearray(path.read_bytes())
    if how == "truncate":
        del data[len(data) // 2 :]
    else:
        data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def copy(export: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(export, tmp_path / "models/transformer"))


def use(folder: Path, what: str) -> None:
    """Load the folder and translate as ``what`` (:data:`READ_BY`) needs the file."""
    if what == "load":
        Translator(folder)(SOURCES)
    elif what == "align":
        Translator(folder).align(SOURCES)
    else:
        Translator(folder, engine="ctranslate2")(SOURCES)


def test_the_export_lists_every_file_and_sha256sum_checks_them(export):
    listed = dict(reversed(line.split("  ", 1)) for line in (export / CHECKSUMS).read_text().splitlines())
    files = {p.relative_to(export).as_posix() for p in export.rglob("*") if p.is_file()}
    assert set(listed) == files - {CHECKSUMS}
    assert all(listed[name] == sha256(export / name) for name in listed)
    assert set(READ_BY) <= files
    if shutil.which("sha256sum"):  # the standard tool reads the same file
        out = subprocess.run(["sha256sum", "-c", CHECKSUMS], cwd=export, capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout.count(": OK\n") == len(listed), out.stdout + out.stderr


@pytest.mark.parametrize("how", ["truncate", "flip"])
@pytest.mark.parametrize("name", list(READ_BY))
def test_a_damaged_file_is_refused_with_its_name_and_the_fix(export, tmp_path, name, how):
    folder = copy(export, tmp_path)
    if name == "step.aoti.pt2":  # damaged alone it is passed over (next test): the program too
        damage(folder / "step.pt2", how)
    damage(folder / name, how)
    with pytest.raises(DamagedExportError) as e:
        use(folder, READ_BY[name])
    assert str(e.value).startswith(f"{folder / name} is damaged ("), str(e.value)
    assert str(e.value).endswith(f"): {FIX}"), str(e.value)


@pytest.mark.skipif(not can_compile(), reason="no AOTInductor build on this CPU")
@pytest.mark.parametrize("how", ["truncate", "flip"])
def test_a_damaged_compiled_step_gives_way_to_the_portable_program_with_one_warning(
    export, expected, tmp_path, how
):
    folder = copy(export, tmp_path)
    damage(folder / "step.aoti.pt2", how)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # not Python's once-per-place: the translator's own once
        translator = Translator(folder)
        assert translator(SOURCES) == expected
        assert Translator(folder)(SOURCES) == expected  # loaded again: said once
    [warning] = [w for w in caught if issubclass(w.category, DamagedExportWarning)]
    assert str(warning.message).startswith(f"{folder / 'step.aoti.pt2'} is damaged (")
    assert str(warning.message).endswith(
        f"{FIX}. Translating with the portable program {folder / 'step.pt2'} instead, which gives "
        "the same translations, more slowly"
    )


@pytest.mark.parametrize(
    "name", ["config.json", "spm.model", "init_state.pt2", "step.pt2", "attention.pt2", f"{CT2}/model.bin"]
)
def test_an_export_without_sha256sums_still_names_a_file_it_cannot_read(export, tmp_path, name):
    """A folder exported before SHA256SUMS: a file cut short is named by its reader's error."""
    folder = copy(export, tmp_path)
    for listing in folder.rglob(CHECKSUMS):
        listing.unlink()
    if name == "step.pt2":
        (folder / "step.aoti.pt2").unlink(missing_ok=True)  # the program is the step then
        damage(folder / "step.pt2", "truncate")
    else:
        damage(folder / name, "truncate")
    read_by = {"attention.pt2": "align", f"{CT2}/model.bin": "ctranslate2"}.get(name, "load")
    with pytest.raises(DamagedExportError) as e:
        use(folder, read_by)
    where = folder / CT2 if name.startswith(CT2) else folder / name  # CTranslate2 reads a folder
    assert str(e.value).startswith(f"{where} is damaged ("), str(e.value)
    assert str(e.value).endswith(f"): {FIX}"), str(e.value)


def _translate(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "src/translate.py",
            "model=transformer",
            f"paths.root={root}",
            *map("+text={}".format, SOURCES),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env(),
    )


def test_translate_py_says_which_file_is_damaged_or_passed_over(export, tmp_path):
    whole = _translate(export.parents[1])
    assert whole.returncode == 0 and len(whole.stdout.splitlines()) == len(SOURCES), whole.stderr[-2000:]
    folder = copy(export, tmp_path)
    if can_compile():
        damage(folder / "step.aoti.pt2", "flip")
        passed_over = _translate(tmp_path)
        assert passed_over.returncode == 0, passed_over.stderr[-2000:]
        assert passed_over.stdout == whole.stdout
        assert passed_over.stderr.count("DamagedExportWarning: ") == 1, passed_over.stderr
        assert f"{folder / 'step.aoti.pt2'} is damaged (" in passed_over.stderr
    damage(folder / "spm.model", "truncate")
    line = refusal(_translate(tmp_path))
    assert line.startswith(f"translate: {folder / 'spm.model'} is damaged (") and line.endswith(FIX), line
