"""``torch.export`` programs of a model's decoding functions: dynamic shapes, an AOTInductor
build of the step, and loading them back.

:func:`export_program` exports a module with every batch, source, target and cache size
dynamic and saves it as a ``.pt2`` file (``torch.export.save``); :func:`load_program` loads it
with torch alone (``torch.export.load(...).module()``). Which dimension of which tensor follows
which size is read off two example calls (:data:`EXAMPLE_SIZES`), so the same code serves any
state layout a model's ``init_state``/``step`` define (:mod:`attnlab.inference.decoding`).

:func:`compile_program` builds an exported program with AOTInductor
(``torch._inductor.aoti_compile_and_package``, PyTorch's ahead-of-time compiler for
``torch.export`` programs: the graph becomes C++ with its kernels, no Python per operator)
into a second ``.pt2`` package; :func:`load_compiled` loads it where this CPU can run it. The
package is built for AVX2 (``torch._inductor.config.cpp.simdlen = 256``), which every x86-64
machine of this project has, not for the widest vectors of the machine that exported it
(AVX-512 code would stop another machine with an illegal instruction).

Sources: PyTorch documentation, "torch.export" (dynamic shapes, ``Dim``) and "AOTInductor:
Ahead-Of-Time Compilation for Torch.Export-ed Models".
"""

from __future__ import annotations

import logging
import platform
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from attnlab.config import cpu_flags
from attnlab.export.integrity import damaged, reason

# The sizes of the two example calls a program is exported from; a dimension whose size is
# the first number in one call and the second in the other follows that size. Four distinct
# pairs, so no dimension can be mistaken for another.
EXAMPLE_SIZES = {"batch": (3, 5), "source": (13, 11), "target": (8, 7), "cache": (7, 6)}
# A source is a token and </s> at least (translate skips a source of </s> alone); a target
# <bos> at least; a cache is empty before the first step.
MIN_SIZES = {"batch": 1, "source": 2, "target": 1, "cache": 0}
MAX_SIZE = 4096  # the most of any size; lengths also at most the model's position table
COMPILED_ISA = "avx2"  # what compile_program builds for (x86-64 only)


class ExportShapeError(ValueError):
    """A dimension of an example that follows none of :data:`EXAMPLE_SIZES`."""


def _dims(a: torch.Tensor, b: torch.Tensor, where: str, dims: dict, max_len: int) -> dict:
    """{dim index: torch.export.Dim} of one input from its sizes in the two examples."""
    out = {}
    for i, (na, nb) in enumerate(zip(a.shape, b.shape)):
        if na == nb:
            continue  # static: a model size (heads, d_model, layers)
        name = next((k for k, pair in EXAMPLE_SIZES.items() if pair == (na, nb)), None)
        if name is None:
            raise ExportShapeError(
                f"dimension {i} of {where} is {na} in one example and {nb} in the other, which "
                f"follows none of {EXAMPLE_SIZES}: build the examples with these sizes"
            )
        top = MAX_SIZE if name == "batch" else min(MAX_SIZE, max_len)
        out[i] = dims.setdefault(name, torch.export.Dim(name, min=MIN_SIZES[name], max=top))
    return out


def dynamic_shapes(example_a: Sequence, example_b: Sequence, max_len: int = MAX_SIZE) -> tuple:
    """``dynamic_shapes`` for ``torch.export.export`` from two example argument tuples of the
    same structure (tensors, or tuples of tensors for a ``*state`` argument); source, target
    and cache lengths at most ``max_len`` (the model's position table).

    Raises:
        ExportShapeError: a dimension that differs between the examples but follows none of
            :data:`EXAMPLE_SIZES`.
    """
    dims: dict = {}
    spec = []
    for j, (a, b) in enumerate(zip(example_a, example_b)):
        if isinstance(a, (tuple, list)):
            spec.append(
                tuple(_dims(x, y, f"argument {j}[{k}]", dims, max_len) for k, (x, y) in enumerate(zip(a, b)))
            )
        else:
            spec.append(_dims(a, b, f"argument {j}", dims, max_len))
    return tuple(spec)


def call_args(example: Sequence) -> tuple:
    """An example's arguments as the module is called with them: a tuple inside the example
    is a ``*state`` argument, passed unpacked."""
    return tuple(x for item in example for x in (item if isinstance(item, (tuple, list)) else (item,)))


def export_program(
    module: nn.Module, example_a: Sequence, example_b: Sequence, path: Path, max_len: int = MAX_SIZE
) -> torch.export.ExportedProgram:
    """Export ``module`` called on ``example_a`` (:func:`call_args`) with the dynamic
    dimensions that :func:`dynamic_shapes` reads off the two examples, save it to ``path``
    (``.pt2``) and return it.

    Raises:
        ExportShapeError: as :func:`dynamic_shapes`.
        torch._dynamo.exc.UserError: the module's code fixes a dimension marked dynamic (e.g.
            an RNN, whose time loop is unrolled to the example's length).
    """
    with torch.no_grad(), warnings.catch_warnings():
        # attnlab's attention layers keep their last weights as a plain attribute (for heatmaps);
        # torch.export says so once per layer, and the programs never read them back.
        warnings.filterwarnings(
            "ignore", message=r"The tensor attributes .* were assigned during export", category=UserWarning
        )
        program = torch.export.export(
            module, call_args(example_a), dynamic_shapes=dynamic_shapes(example_a, example_b, max_len)
        )
    torch.export.save(program, str(path))
    return program


class _DropRecord(logging.Filter):
    """Drops the records whose message template starts with ``prefix``."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


# torch.export.load logs a file it cannot read with its traceback, then raises; the error raised
# here names the file and the fix instead.
_UNREADABLE = ("torch.export", "Ran into the following error when deserializing")


def load_program(path: Path, model: str | None = None) -> Callable:
    """A saved program as a callable module (torch alone).

    Raises:
        DamagedExportError: torch cannot read the file (cut short, overwritten, not a program):
            names it and the command that exports ``model`` again.
    """
    logger, quiet = logging.getLogger(_UNREADABLE[0]), _DropRecord(_UNREADABLE[1])
    logger.addFilter(quiet)
    try:
        return torch.export.load(str(path)).module()
    except Exception as e:  # whatever torch's reader raises, the file is unusable
        raise damaged(Path(path), f"torch cannot read it: {reason(e)}", model) from e
    finally:
        logger.removeFilter(quiet)


def can_compile() -> bool:
    """Whether :func:`compile_program` runs here: an x86-64 CPU with AVX2."""
    return platform.machine() in ("x86_64", "AMD64") and "avx2" in cpu_flags()


def compile_program(program: torch.export.ExportedProgram, path: Path) -> Path:
    """Build ``program`` with AOTInductor for AVX2 into the package ``path`` (``.pt2``).

    Takes about a minute on 2 cores (a C++ compile). Needs a C++ compiler and the Python
    headers, as ``torch.compile`` does.

    Raises:
        RuntimeError: not an x86-64 CPU with AVX2 (:func:`can_compile`); the compiler's own
            errors.
    """
    if not can_compile():
        raise RuntimeError(
            f"AOTInductor builds here target AVX2 on x86-64; this machine is {platform.machine()} without it"
        )
    import torch._inductor

    with torch._inductor.config.patch({"cpp.simdlen": 256}):  # AVX2, not this CPU's widest
        return Path(torch._inductor.aoti_compile_and_package(program, package_path=str(path)))


class ExpectedIsaMismatch(logging.Filter):
    """Drops torch's "Device information mismatch for AOTI_CPU_ISA: <this CPU's> vs AVX2"
    warning, which every load on a CPU wider than AVX2 printed: the package is built for
    :data:`COMPILED_ISA` on purpose, and :func:`can_compile` has checked that this CPU runs it.
    Any other mismatch torch reports still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        expected = (
            str(record.msg).startswith("Device information mismatch")
            and len(args) == 3
            and args[0] == "AOTI_CPU_ISA"
            and str(args[2]).lower() == COMPILED_ISA
        )
        return not expected


AOTI_LOGGER = "torch.export.pt2_archive._package"  # where torch logs the mismatch


def load_compiled(path: Path, model: str | None = None) -> Callable | None:
    """The AOTInductor package at ``path`` as a callable, or None where this CPU cannot run
    it (not x86-64 with AVX2); the caller then uses the portable program. torch's warning
    that this CPU's ISA is wider than the package's is expected and not shown
    (:class:`ExpectedIsaMismatch`).

    Raises:
        DamagedExportError: torch cannot load the package (cut short, overwritten): names it
            and the command that exports ``model`` again.
    """
    if not can_compile():
        return None
    import torch._inductor

    logger, quiet = logging.getLogger(AOTI_LOGGER), ExpectedIsaMismatch()
    logger.addFilter(quiet)
    try:
        return torch._inductor.aoti_load_package(str(path))
    except Exception as e:  # whatever the loader raises, the package is unusable
        raise damaged(Path(path), f"torch cannot load it: {reason(e)}", model) from e
    finally:
        logger.removeFilter(quiet)
