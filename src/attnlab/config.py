"""OmegaConf resolvers used by conf/*.yaml; registered when :mod:`attnlab` is imported."""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

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
        if parts[i:i + len(marker)] == marker and len(parts) > i + len(marker):
            return str(Path(*parts[:i]))
    return str(root)


def register_resolvers() -> None:
    """Register ``${dvc_project:<path>}`` (idempotent)."""
    if not OmegaConf.has_resolver("dvc_project"):
        OmegaConf.register_new_resolver("dvc_project", dvc_project)
