"""The tiny project the faults are injected into: its stages' command lines, and the pipeline
run once, census by census, into one snapshot per state.

Every stage runs in the same folder (``Pipeline.project``: MLflow and the run record keep
absolute paths), restored from the snapshot of the state the stage starts from. The stages are
the DVC pipeline's on the tiny corpus of :mod:`helpers.corpus_fixture` (40 training pairs):
download (from a mirror folder of that corpus), tokenize (150 pieces), train (a Transformer of
d_model 32, 2 epochs of 8 steps, last.ckpt every 4 steps, no heatmaps), evaluate, export (torch.export
programs; no AOTInductor build, no CTranslate2 models: a minute and more of compiling that
faults do not need), and translate (reads the export back).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from attnlab.cli import SCRIPTS as CLI_SCRIPTS
from helpers.corpus_fixture import write_mirror
from helpers.tiny_train import TINY
from test_faults import checks
from test_faults.runner import ROOT, Run, Zygote

NET = [a for a in TINY if a.split("=")[0] in ("model", "device", "model.net.d_model", "model.net.ffn_hidden")]
TOKENIZED = "data/tokenized/multi30k-en-fr"
# What each stage is run with (after its script); then the states each starts from and leads to.
ARGS = {
    "download": [],
    "tokenize": ["data.vocab_size=150"],
    # no attention heatmaps: matplotlib's 6 PNGs would take 3 of the 5 CPU seconds of a run
    "train": [
        *(a for a in TINY if not a.startswith("heatmaps.sentences=")),
        "heatmaps.sentences=[]",
        "trainer.max_epochs=2",
        "checkpoint.every_n_train_steps=4",
    ],
    "evaluate": [*NET, "data.vocab_size=150"],
    "export": [*NET, "data.vocab_size=150", "export.compile=false", "export.ctranslate2=[]"],
    "translate": [*NET, "+text=A dog sees a ball."],
    "translate_attention": [*NET, "+text=A dog sees a ball.", "+show_attention=true"],
}
ORDER = ["download", "tokenize", "train", "evaluate", "export"]  # the DVC pipeline; translate reads export's
READERS = ["translate", "translate_attention"]  # read the export back, write nothing in the project
# each stage's script, as the attnlab-* commands run them
SCRIPTS = {stage: CLI_SCRIPTS[stage.removesuffix("_attention")] for stage in [*ORDER, *READERS]}
STARTS = {"download": "empty", "tokenize": "downloaded", "train": "tokenized", "evaluate": "trained",
          "export": "evaluated", "translate": "exported", "translate_attention": "exported"}  # fmt: skip
ENDS = {"download": "downloaded", "tokenize": "tokenized", "train": "trained", "evaluate": "evaluated",
        "export": "exported", "translate": "exported", "translate_attention": "exported"}  # fmt: skip


@dataclass
class Pipeline:
    """The project folder, the snapshots of its states, and each stage's census (the project
    file operations of a run without a fault, in order)."""

    base: Path
    zygote: Zygote
    fill_target: str  # what test_faults.inject.fill fills: the project's tmpfs, or "rlimit"
    census: dict[str, list[str]] = field(default_factory=dict)
    stdout: dict[str, str] = field(default_factory=dict)  # each census run's

    @property
    def project(self) -> Path:
        return self.base / "project"

    @property
    def mirror(self) -> Path:
        return self.base / "mirror"

    def snapshot(self, state: str) -> Path:
        return self.base / "states" / state

    def command(self, stage: str) -> tuple[list, dict]:
        """``[script, *args]`` and extra environment of ``stage``, run in :attr:`project`."""
        argv = [ROOT / "src" / SCRIPTS[stage], *ARGS[stage], f"hydra.run.dir={self.base}/hydra/{stage}"]
        if stage == "download":  # the tiny mirror's digests instead of the real corpus's
            argv[1:1] = ["--config-path", str(self.base / "conf"), "--config-name", "download"]
            return argv, {"ATTNLAB_DATA_MIRROR": str(self.mirror)}
        return argv, {}

    def run(self, stage: str, fault: dict | None = None) -> Run:
        argv, env = self.command(stage)
        return self.zygote.run(
            argv, self.project, fault={"root": str(self.project), **fault} if fault else None, **env
        )

    def restore(self, state: str) -> None:
        """Make :attr:`project` a copy of the snapshot ``state`` (its contents: it may be a mount point)."""
        self.project.mkdir(parents=True, exist_ok=True)
        for p in self.project.iterdir():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        shutil.copytree(self.snapshot(state), self.project, symlinks=True, dirs_exist_ok=True)

    def save(self, state: str) -> None:
        shutil.copytree(self.project, self.snapshot(state), symlinks=True)


def build(base: Path, zygote: Zygote, fill_target: str) -> Pipeline:
    """Run every stage once, without a fault, from an empty project (``base/project``, which
    exists): the census of each stage and the snapshot of each state. Raises AssertionError
    with the stage's output if one fails."""
    pipe = Pipeline(Path(base), zygote, fill_target)
    digests = write_mirror(pipe.mirror)
    conf = OmegaConf.load(ROOT / "conf/download.yaml")
    conf.sources = {rel: {"sha256": [d]} for rel, d in digests.items()}
    (base / "conf").mkdir(parents=True)
    OmegaConf.save(conf, base / "conf/download.yaml")
    pipe.save("empty")
    for stage in [*ORDER, *READERS]:
        run = pipe.run(stage, {"action": "census"})
        assert run.returncode == 0, f"{stage} failed without a fault:\n{run.tail()}"
        left = checks.strays(pipe.project) + checks.pending_models(pipe.project)
        assert not left, f"{stage} left {left} without a fault"
        pipe.census[stage], pipe.stdout[stage] = run.record["events"], run.stdout
        if stage in ORDER:
            pipe.save(ENDS[stage])
    return pipe


def interrupt_training(pipe: Pipeline) -> None:
    """The state ``interrupted``: training killed (SIGKILL) at the first file operation after it
    first wrote last.ckpt (the run of operations on last.ckpt that its census starts with)."""
    events = pipe.census["train"]
    i = next(i for i, e in enumerate(events) if "last.ckpt" in e)
    while "last.ckpt" in events[i]:
        i += 1
    pipe.restore("tokenized")
    run = pipe.run("train", {"action": "kill", "at": i + 1})  # 1-based
    assert run.returncode == -9 and (pipe.project / "checkpoints/transformer/last.ckpt").is_file(), run.tail()
    pipe.save("interrupted")
