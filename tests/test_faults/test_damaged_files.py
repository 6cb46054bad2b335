"""Every file the project reads back, damaged (cut short, 16 bytes inverted, zero-filled), then
read by the stage that reads it.

Judged by the invariants of :mod:`test_faults.cases`: the stage either succeeds with whole
outputs, or stops with an error that names the damaged file, without a traceback; and with the
file's bytes put back it runs again.
"""

import pytest

from test_faults.cases import damaged_file
from test_faults.damage import KINDS
from test_faults.params import known, seeds
from test_faults.project import TOKENIZED

pytestmark = pytest.mark.e2e

# The file, the stage that reads it, and the state the project is in when it does.
FILES = {
    "checkpoints/transformer/best.ckpt": ("evaluate", "trained"),
    "checkpoints/transformer/last.ckpt": ("train", "interrupted"),
    "mlflow.db": ("evaluate", "trained"),
    "runs/transformer.json": ("evaluate", "trained"),
    "models/transformer/step.pt2": ("translate", "exported"),
    "models/transformer/init_state.pt2": ("translate", "exported"),
    "models/transformer/attention.pt2": ("translate_attention", "exported"),
    "models/transformer/config.json": ("translate", "exported"),
    "models/transformer/spm.model": ("translate", "exported"),
    f"{TOKENIZED}/train.src.ids.npy": ("train", "tokenized"),
    f"{TOKENIZED}/train.src.offsets.npy": ("train", "tokenized"),
    f"{TOKENIZED}/spm.model": ("evaluate", "trained"),
    f"{TOKENIZED}/test.src.txt": ("evaluate", "trained"),
    "data/raw/multi30k/train.en.gz": ("tokenize", "downloaded"),
}

# Cases that fail today, each with what it showed (none now); add one when a fault breaks.
KNOWN: dict[str, str] = {}


def cases():
    for rel in FILES:
        for kind in KINDS:
            case = f"{kind}:{rel}"
            yield pytest.param(rel, kind, id=case, marks=known(KNOWN, case, moments=False))


@pytest.mark.parametrize(("rel", "kind"), list(cases()))
def test_a_damaged_file_is_named_or_read_whole(pipeline, interrupted, report, rel, kind):
    stage, state = FILES[rel]
    outcomes = []
    for seed in seeds():
        pipeline.restore(state)
        outcomes.append(damaged_file(pipeline, stage, rel, kind, f"{kind}:{rel}", seed, start=state))
    report(f"{kind}:{rel}", outcomes)
