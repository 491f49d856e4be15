"""Writing directories that survive a crash: files and directory entries flushed to the disk,
and a finished directory published in place of an old one by renames, so that a complete one
exists at every moment; files sealed with their size and CRC-32, so that a later reader finds
out whether they are still what was written. Shared by checkpoints (``tasks.rundir``) and model
builds (``tasks.models.build``)."""

from __future__ import annotations

import os
import shutil
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path

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
            return None if os.access(path, os.W_OK | os.X_OK) else f"{path} is not writable"
    return None


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
