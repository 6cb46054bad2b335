"""attnlab.files: atomic writes and staged folders."""

import errno
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab import files
from attnlab.files import staged_dir, write_json_atomic


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- write_json_atomic ---------------------------------------------------------


def test_write_json_atomic_replaces_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "sub" / "r.json"
    write_json_atomic(path, {"b": 1, "a": [1, 2]})
    write_json_atomic(path, {"run_id": "x"})
    assert path.read_text() == '{\n  "run_id": "x"\n}\n'  # indented, key-sorted, one newline
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]


# --- staged_dir -----------------------------------------------------------------


def _tree(root) -> dict[str, bytes | None]:
    """Every path under ``root`` (relative) -> its bytes, ``None`` for a folder."""
    return {
        str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def old_out(tmp_path):
    out = tmp_path / "tokenized" / "multi30k-en-fr"
    (out / "sub").mkdir(parents=True)
    (out / "spm.model").write_bytes(b"\x00old model")
    (out / "sub" / "stats.json").write_text('{"old": true}\n')
    return out


def test_staged_dir_replaces_the_old_folder_on_success(old_out):
    with staged_dir(old_out) as tmp:
        assert tmp.parent == old_out.parent and tmp != old_out and list(tmp.iterdir()) == []
        assert _mode(tmp) == 0o755
        assert (old_out / "spm.model").exists()  # the old folder stays until the new one is done
        (tmp / "spm.model").write_bytes(b"new model")
    assert _tree(old_out) == {"spm.model": b"new model"}
    assert _mode(old_out) == 0o755
    assert [p.name for p in old_out.parent.iterdir()] == [old_out.name]  # no temp or .old folder


def test_staged_dir_creates_a_missing_folder_and_its_parents(tmp_path):
    out = tmp_path / "a" / "b"
    with staged_dir(out) as tmp:
        (tmp / "x.txt").write_text("x")
    assert _tree(out) == {"x.txt": b"x"}
    assert [p.name for p in out.parent.iterdir()] == ["b"]


def test_staged_dir_error_leaves_the_old_folder_byte_identical(old_out):
    before = _tree(old_out)
    with pytest.raises(SystemExit, match="tokenize failed"), staged_dir(old_out) as tmp:
        (tmp / "spm.model").write_bytes(b"half")
        raise SystemExit("tokenize failed: ...")
    assert _tree(old_out) == before
    assert [p.name for p in old_out.parent.iterdir()] == [old_out.name]  # no temp folder behind


def test_staged_dir_puts_the_old_folder_back_if_the_new_cannot_take_its_place(old_out, monkeypatch):
    before = _tree(old_out)
    real_rename, calls = os.rename, []

    def rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # 1: old aside, 2: new into place
            raise OSError(errno.EIO, "Input/output error")
        real_rename(src, dst)

    monkeypatch.setattr(files.os, "rename", rename)
    with pytest.raises(OSError, match="Input/output"), staged_dir(old_out) as tmp:
        (tmp / "spm.model").write_bytes(b"new model")
    assert len(calls) == 3  # the third put the old folder back
    assert _tree(old_out) == before
    assert [p.name for p in old_out.parent.iterdir()] == [old_out.name]


def test_staged_dir_replaces_a_link_not_what_it_points_to(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("keep")
    out = tmp_path / "models" / "transformer"
    out.parent.mkdir()
    out.symlink_to(target, target_is_directory=True)
    with staged_dir(out) as tmp:
        (tmp / "config.json").write_text("{}")
    assert not out.is_symlink() and _tree(out) == {"config.json": b"{}"}
    assert _tree(target) == {"keep.txt": b"keep"}


# --- a killed run's staging folders ------------------------------------------------

_KILLED_INSIDE = """
import sys, time
from pathlib import Path
from attnlab.files import staged_dir
with staged_dir(Path(sys.argv[1])) as tmp:
    (tmp / "half.bin").write_bytes(b"x" * 100_000)
    print(tmp, flush=True)
    time.sleep(120)
"""


def _killed_inside_staged_dir(out) -> tuple[Path, int]:
    """(the staging folder, the pid) of a process SIGKILLed inside ``staged_dir(out)``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_INSIDE, str(out)], stdout=subprocess.PIPE, text=True
    )
    staging = Path(proc.stdout.readline().strip())
    proc.kill()
    proc.wait(timeout=30)
    proc.stdout.close()
    return staging, proc.pid


def test_the_next_run_removes_a_killed_runs_staging_folder_and_nothing_else(old_out, caplog):
    before = _tree(old_out)
    staging, pid = _killed_inside_staged_dir(old_out)
    assert staging.parent == old_out.parent and (staging / "half.bin").stat().st_size == 100_000
    assert _tree(old_out) == before  # the kill left the previous output whole
    host, name = socket.gethostname(), old_out.name
    kept = [
        old_out.parent / f".{name}.another-tool.tmp",  # not attnlab's
        old_out.parent / f".{name}.attnlab-{os.getpid()}@{host}.abcd1234.tmp",  # a live run's
        old_out.parent / f".{name}.attnlab-{pid}@another-host.abcd1234.tmp",  # can't tell from here
        old_out.parent / f".other-out.attnlab-{pid}@{host}.abcd1234.tmp",  # another output's
    ]
    for path in kept:
        path.mkdir()
    with caplog.at_level("WARNING", logger="attnlab.files"), staged_dir(old_out) as tmp:
        (tmp / "new.txt").write_text("new")
    assert not staging.exists()
    assert f"removed {staging}, left by a killed run (pid {pid})" in caplog.text
    assert sorted(p.name for p in old_out.parent.iterdir()) == sorted([name, *(p.name for p in kept)])
    assert _tree(old_out) == {"new.txt": b"new"}


def test_a_previous_output_moved_aside_by_a_killed_run_is_put_back(old_out):
    """Killed between staged_dir's two renames: no output, the previous one as ….tmp.old."""
    before = _tree(old_out)
    staging, pid = _killed_inside_staged_dir(old_out.parent / "other")
    aside = old_out.parent / f".{old_out.name}.attnlab-{pid}@{socket.gethostname()}.abcd1234.tmp.old"
    os.rename(old_out, aside)
    new = old_out.parent / f".{old_out.name}.attnlab-{pid}@{socket.gethostname()}.abcd1234.tmp"
    new.mkdir()  # the complete new folder, not yet renamed into place
    assert files.remove_stale_staging(old_out) == [new, aside]
    assert _tree(old_out) == before and not aside.exists() and not new.exists()
    # with the output in place, a leftover ….tmp.old is only removed
    aside.mkdir()
    assert files.remove_stale_staging(old_out) == [aside] and _tree(old_out) == before
