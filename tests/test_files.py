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


def test_a_write_removes_the_temp_files_of_killed_writers_of_that_file_only(tmp_path, caplog):
    """SIGKILL between a temp file's write and its rename leaves the temp file; the next write
    of the same file removes it, and keeps those of live writers, other hosts and other files."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    host, target = socket.gethostname(), tmp_path / "history.csv"
    stale = tmp_path / f".history.csv.attnlab-{dead.pid}@{host}.k1ll3d.tmp"
    kept = [
        tmp_path / f".history.csv.attnlab-{os.getpid()}@{host}.l1ve.tmp",  # a live writer's
        tmp_path / f".history.csv.attnlab-{dead.pid}@another-host.abcd.tmp",  # can't tell from here
        tmp_path / f".metrics.json.attnlab-{dead.pid}@{host}.abcd.tmp",  # another file's
        tmp_path / ".history.csv.abcd.tmp",  # not attnlab's
    ]
    for path in [stale, *kept]:
        path.write_text("half")
    with caplog.at_level("WARNING", logger="attnlab.files"):
        files.write_text_atomic(target, "epoch\n")
    assert target.read_text() == "epoch\n"
    assert f"removed {stale}, left by a killed run (pid {dead.pid})" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["history.csv", *(p.name for p in kept)])


# --- a full disk: every writer leaves the old file whole and names the new one --------------

NO_SPACE = "No space left on device: the disk is full"


def _no_room(path: Path, before: str) -> str:
    """The exact FileWriteError text for ``path`` on a full disk."""
    return (
        f"could not write {path} ({NO_SPACE}); {before}. To go on, free space on the disk that holds "
        f"{path.parent} (`df -h {path.parent}`)"
    )


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs (skipped where mounting is not permitted) holding ``old.bin`` (200 kB),
    filled to leave 100 kB free."""
    from helpers.small_disk import fill, tmpfs

    with tmpfs(tmp_path / "disk", "1m") as disk:
        (disk / "old.bin").write_bytes(b"o" * 200_000)
        fill(disk, 100_000)
        yield disk


def test_a_full_disk_leaves_the_old_file_and_names_the_new_one(full_disk):
    path = full_disk / "old.bin"
    with pytest.raises(files.FileWriteError) as e:
        files.write_bytes_atomic(path, b"n" * 200_000)  # fits only where the old one is
    assert str(e.value) == _no_room(path, "it is as it was")
    assert (e.value.errno, e.value.filename) == (errno.ENOSPC, str(path))
    assert path.read_bytes() == b"o" * 200_000
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler", "old.bin"]  # no temp file
    # a file that did not exist is not created half
    with pytest.raises(files.FileWriteError, match="no file was left there"):
        write_json_atomic(full_disk / "new.json", {"x": "y" * 200_000})
    assert not (full_disk / "new.json").exists()
    files.write_bytes_atomic(full_disk / "small.bin", b"fits")  # room for what fits
    assert (full_disk / "small.bin").read_bytes() == b"fits"


def test_a_full_disk_in_a_staged_folder_names_the_output_and_keeps_the_old_one(full_disk):
    out = full_disk / "tokenized"
    out.mkdir()
    (out / "spm.model").write_bytes(b"old model")
    with pytest.raises(files.FileWriteError) as e, staged_dir(out) as tmp:
        (tmp / "train.src.ids.npy").write_bytes(b"\0" * 300_000)  # an array of the tokenize stage
    assert str(e.value) == _no_room(out, "it is as it was")
    assert _tree(out) == {"spm.model": b"old model"}
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler", "old.bin", "tokenized"]


_FILE_SIZE_LIMIT = """
import resource, signal, sys
from pathlib import Path
from attnlab.files import FileWriteError, write_bytes_atomic
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))
try:
    write_bytes_atomic(Path(sys.argv[1]), b"n" * 100_000)
except FileWriteError as e:
    print(e)
"""


def test_a_file_size_limit_is_a_write_error_too(tmp_path):
    """RLIMIT_FSIZE (no root needed): the write fails with EFBIG past 50 kB."""
    path = tmp_path / "best.ckpt"
    path.write_bytes(b"o" * 1000)
    out = subprocess.run([sys.executable, "-c", _FILE_SIZE_LIMIT, str(path)], capture_output=True, text=True)
    assert out.stdout == (
        f"could not write {path} (File too large: the file would be larger than the system allows "
        f"this process); it is as it was. To go on, free space on the disk that holds {tmp_path} "
        f"(`df -h {tmp_path}`)\n"
    ), out.stderr
    assert path.read_bytes() == b"o" * 1000 and [p.name for p in tmp_path.iterdir()] == ["best.ckpt"]


def test_appended_rows_keep_the_header_and_a_full_disk_keeps_the_file(full_disk):
    from attnlab.analysis.provenance import append_rows

    path = full_disk / "results.csv"
    append_rows(path, ["a", "b"], [{"a": 1, "b": "x"}])
    append_rows(path, ["a", "b"], [{"a": 2, "b": "y,z"}])
    assert path.read_text() == 'a,b\n1,x\n2,"y,z"\n'
    with pytest.raises(ValueError, match=r"columns \['a', 'b'\], expected \['a', 'c'\]"):
        append_rows(path, ["a", "c"], [])
    with pytest.raises(files.FileWriteError, match="could not write .*results.csv"):
        append_rows(path, ["a", "b"], [{"a": 3, "b": "w" * 200_000}])
    assert path.read_text() == 'a,b\n1,x\n2,"y,z"\n'
