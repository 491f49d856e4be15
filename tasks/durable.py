"""Writing directories that survive a crash: files and directory entries flushed to the disk,
and a finished directory published in place of an old one by renames, so that a complete one
exists at every moment. Shared by checkpoints (``tasks.rundir``) and model builds
(``tasks.models.build``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (the names of the files in it) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
