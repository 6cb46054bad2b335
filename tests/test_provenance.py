"""attnlab.analysis.provenance.git_commit: the commit a tutorial's outputs come from."""

from __future__ import annotations

import subprocess

from attnlab.analysis.provenance import git_commit


def _git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_the_commit_its_local_changes_and_no_checkout(tmp_path):
    assert git_commit(tmp_path) == "unknown (not a git checkout)"
    _git("init", "-q", cwd=tmp_path)
    (tmp_path / "a.txt").write_text("1\n")
    _git("add", "a.txt", cwd=tmp_path)
    _git("-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", "one", cwd=tmp_path)
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert git_commit(tmp_path) == sha
    (tmp_path / "untracked.txt").write_text("x\n")  # untracked files are not the code's
    assert git_commit(tmp_path) == sha
    (tmp_path / "a.txt").write_text("2\n")
    assert git_commit(tmp_path) == f"{sha} with local changes"
