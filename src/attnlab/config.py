"""OmegaConf resolvers used by conf/*.yaml; registered when :mod:`attnlab` is imported."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from attnlab.errors import ConfigError

DVC_EXP_WORKSPACES = Path(".dvc") / "tmp" / "exps"  # where DVC copies the repo for --queue/--temp


def dvc_project(root: str) -> str:
    """The project a path belongs to, seen through DVC's experiment workspaces.

    ``dvc exp run --queue`` (and ``--temp``) runs the pipeline in a temporary copy of the
    repository, ``<project>/.dvc/tmp/exps/<tmp>/``, deleted afterwards. For such a ``root``
    this returns ``<project>``; any other ``root`` is returned unchanged.

    >>> dvc_project("/home/me/attnlab/.dvc/tmp/exps/tmpab12cd")
    '/home/me/attnlab'
    >>> dvc_project("/home/me/attnlab")
    '/home/me/attnlab'
    """
    path = Path(root)
    parts = path.parts
    marker = DVC_EXP_WORKSPACES.parts
    for i in range(len(parts) - len(marker)):
        if parts[i : i + len(marker)] == marker and len(parts) > i + len(marker):
            return str(Path(*parts[:i]))
    return str(root)


BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of CPU bf16 matrix instructions


def cpu_flags() -> set[str]:
    """The CPU's feature flags (``/proc/cpuinfo``, as ``lscpu`` lists them); empty elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def has_bf16_units(device_type: str = "cpu") -> bool:
    """Whether a device of ``device_type`` ("cpu" or "cuda") here computes bf16 matmuls natively:
    a CUDA GPU with ``torch.cuda.is_bf16_supported()`` (Ampere and newer), a CPU with the flags
    ``avx512_bf16`` or ``amx_bf16``. Without them bf16 matmuls fall back to slow conversions
    (measured on a 2-core EPYC without them: 0.04× of fp32). Any other type: False."""
    if device_type == "cuda":
        import torch  # here only: the CPU answer needs no torch (benchmarks/ asks it without)

        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return device_type == "cpu" and bool(cpu_flags() & set(BF16_CPU_FLAGS))


def bf16_if_supported(accelerator: str = "auto") -> str:
    """Lightning's ``precision`` for this machine: ``"bf16-mixed"`` where the device that
    ``accelerator`` picks has bf16 units (:func:`has_bf16_units`), else ``"32-true"``.

    ``gpu``/``cuda``, or ``auto`` with a CUDA device: the GPU. ``cpu``, or ``auto`` without one:
    the CPU. Anything else (``mps``, ``tpu``): fp32.

    >>> bf16_if_supported("mps")
    '32-true'
    """
    import torch

    accelerator = str(accelerator).lower()
    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
        return "bf16-mixed" if has_bf16_units("cuda") else "32-true"
    if accelerator in ("cpu", "auto"):
        return "bf16-mixed" if has_bf16_units("cpu") else "32-true"
    return "32-true"


def check_precision(precision, accelerator: str = "auto") -> None:
    """Refuse ``trainer.precision=16-true`` (float16 weights and activations) on a CPU, before
    anything is built: a CPU has no float16 training path, and the loss is NaN from the first
    step. (Lightning itself turns ``16-mixed`` on a CPU into ``bf16-mixed``, with a warning.)

    ``accelerator``: ``cpu``, or ``auto`` without a CUDA device, is the CPU.

    Raises:
        ConfigError: float16 on the CPU (names the setting and the precisions to use instead).
    """
    import torch

    accelerator = str(accelerator).lower()
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    if str(precision).lower() == "16-true" and on_cpu:
        units = "has" if has_bf16_units("cpu") else "has no"
        raise ConfigError(
            f"trainer.precision={precision} trains in float16, which a CPU cannot do (the loss is "
            "NaN from the first step, whatever the learning rate): use trainer.precision=32-true, "
            f"or bf16-mixed (this CPU {units} bf16 units; trainer=full chooses for you)"
        )


def register_resolvers() -> None:
    """Register ``${dvc_project:<path>}`` and ``${bf16_if_supported:<accelerator>}`` (idempotent)."""
    if not OmegaConf.has_resolver("dvc_project"):
        OmegaConf.register_new_resolver("dvc_project", dvc_project)
    if not OmegaConf.has_resolver("bf16_if_supported"):
        OmegaConf.register_new_resolver("bf16_if_supported", bf16_if_supported)
