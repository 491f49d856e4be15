"""Writing directories that survive a crash: files and directory entries flushed to the disk,
and a finished directory published in place of an old one by renames, so that a complete one
exists at every moment; files sealed with their size and CRC-32, so that a later reader finds
out whether they are still what was written; JSONL records that a torn last line (a write cut
short by a kill or a full disk) does not spoil. Shared by checkpoints and run records
(``tasks.rundir``) and model builds (``tasks.models.build``)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

_CHUNK = 16 << 20  # bytes read at a time for a file's checksum


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (the names of the files in it) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unwritable(folder: Path) -> str | None:
    """Why ``folder`` cannot be made and written here, or None: a file where it or one of its
    parents must be a folder, or a nearest existing folder this process may not write."""
    for path in (folder, *folder.parents):
        if path.exists():
            if not path.is_dir():
                return f"{path} is a file"
            return _cannot_write_in(path)
    return None


def _cannot_write_in(folder: Path) -> str | None:
    """Why no file can be made in the existing ``folder``, or None. A file is made and removed:
    ``os.access`` answers yes to root everywhere, /proc and read-only mounts included."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder} is not writable"
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-test.", dir=folder)
    except OSError as e:  # /proc answers "no such file" for any new name
        why = "no files can be made in it" if e.errno == errno.ENOENT else (e.strerror or e)
        return f"{folder} is not writable ({why})"
    os.close(fd)
    os.unlink(probe)
    return None


FOLDER_NAME_RULE = (
    "one folder name: no '/', no control characters or surrounding spaces, not starting with "
    "'.' or '-', at most 255 bytes"
)


def is_folder_name(name: str) -> bool:
    """Whether ``name`` names one folder inside another (a run, a model, a shipped checkpoint):
    not empty, no ``/`` or ``\\``, not ``.``-led (``..``, hidden staging folders), nothing a
    shell or a listing trips on (a tab, a name of spaces, a leading ``-`` read as an option),
    and short enough for the file system (a longer one failed with a traceback)."""
    return (
        bool(name)
        and name == name.strip()
        and not name.startswith((".", "-"))
        and Path(name).name == name
        and "\\" not in name
        and all(ch.isprintable() for ch in name)
        and len(name.encode()) <= 255
    )


def replace_atomically(path: Path, write: Callable[[Path], Any]) -> None:
    """``write`` a temporary file beside ``path``, then rename it over ``path``; the temporary
    file (hidden, this process's own) is removed when the write fails or is interrupted (Ctrl-C
    left a stray ``.tmp``)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def parents_made_for(path: Path) -> Iterator[None]:
    """``path``'s missing parent folders made for the block and, after it, those of them still
    empty removed: a build or a fetch that failed or was stopped leaves no empty ``data/models``
    behind."""
    made = [p for p in path.parents if not p.exists()]  # nearest first
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield
    finally:
        for folder in made:
            try:
                folder.rmdir()
            except OSError:  # not empty (what the block made is there), or gone: its parents stay
                break


def write_synced(path: Path, text: str) -> None:
    with path.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def publish_dir(staged: Path, final: Path, retired: Path) -> None:
    """Rename the complete ``staged`` to ``final``. A ``final`` already there is moved to
    ``retired`` first (a directory cannot be renamed over a full one) and removed after."""
    shutil.rmtree(retired, ignore_errors=True)
    if final.exists():
        os.replace(final, retired)
    os.replace(staged, final)
    fsync_dir(final.parent)
    shutil.rmtree(retired, ignore_errors=True)


def seal_files(root: Path, files: Iterable[Path]) -> dict[str, dict[str, int]]:
    """Flush each file to the disk and record it: ``{path relative to root: {size, crc32}}``.
    Each rank seals the files it wrote, while they are still in its page cache."""
    records = {}
    for path in files:
        with path.open("rb") as f:
            crc = _crc32(f)
            os.fsync(f.fileno())
        records[relative(path, root)] = {"size": path.stat().st_size, "crc32": crc}
    return records


def check_sealed(root: Path, records: Mapping[str, Mapping[str, int]]) -> str | None:
    """What is wrong with the files :func:`seal_files` recorded under ``root`` (None: nothing)."""
    for name, want in records.items():
        path = root / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != want["size"]:
            return f"{name} has {size} bytes, {want['size']} were written"
        with path.open("rb") as f:
            if _crc32(f) != want["crc32"]:
                return f"{name} does not match its checksum"
    return None


def relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def _crc32(f) -> int:
    crc = 0
    while chunk := f.read(_CHUNK):
        crc = zlib.crc32(chunk, crc)
    return crc


def append_row(path: Path, row: dict[str, Any]) -> None:
    """Append one JSON line, after cutting off a torn last line (a write cut short by a full
    disk or a kill): appended to, it would fuse with this row into one unreadable line."""
    with path.open("ab") as f:
        end = f.tell()
        if end:
            with path.open("rb") as r:
                r.seek(max(0, end - 65536))
                tail = r.read()
            if not tail.endswith(b"\n"):
                # rows are far shorter than the window: no newline in it means no whole row
                f.truncate(end - len(tail) + tail.rfind(b"\n") + 1)
        f.write((json.dumps(row) + "\n").encode())


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL record, one per step (a later row for a step replaces an earlier one)."""
    if not path.exists():
        return []
    rows = {}
    text = path.read_text()
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):  # torn by a full disk or a kill: never completed
            break
        if line.strip():
            row = json.loads(line)
            rows[row["step"]] = row
    return [rows[s] for s in sorted(rows)]
