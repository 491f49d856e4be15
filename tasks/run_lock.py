"""One writer per run directory: an advisory lock (``flock``) on ``<run>/.lock``.

A process holds the lock for as long as it writes the directory (:meth:`RunDir.writer`), and a
second one is refused with a message naming the holder (:class:`RunDirBusy`). The kernel drops
the lock when its holder dies, however it dies, so a killed run never blocks its own resume.
The flow, the task and ``run_training`` each take the lock within one process: only the
outermost opens it (a flock is per open file), the inner ones count.

A directory no run wrote to while it was held (the run failed, stopped or was refused before its
first record) loses its lock file when released, and is removed if then empty, with the empty
parents made for it: no lock is left in a folder of someone else's.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dapo_core.errors import PipelineError

LOCK_FILE = ".lock"


class Lockable(Protocol):
    """What the lock needs of ``tasks.rundir.RunDir`` (which imports this module)."""

    path: Path
    lock_file: Path

    def written(self) -> list[int]: ...


class RunDirBusy(PipelineError):
    """Another live process writes this run directory."""


@dataclass
class _Hold:
    fd: int  # the open lock file: the flock lives as long as it stays open
    depth: int  # nested acquires in this process
    rundir: Lockable
    made: list[Path]  # the folders the first acquire created (deepest first)
    before: list[int] | None  # Lockable.written() then (None: a lock file was already there)


_held: dict[str, _Hold] = {}  # by real path
_held_guard = threading.Lock()


def acquire(rd: Lockable) -> str:
    """Hold ``rd``'s lock (re-entrant within this process); the key to :func:`release` it."""
    made = [p for p in (rd.path, *rd.path.parents) if not p.exists()]
    rd.path.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(rd.path)
    with _held_guard:
        if key in _held:
            _held[key].depth += 1
            return key
        before = None if rd.lock_file.exists() else rd.written()
        _held[key] = _Hold(_lock(rd), 1, rd, made, before)
    return key


def release(key: str) -> None:
    with _held_guard:
        hold = _held[key]
        hold.depth -= 1
        if hold.depth == 0:
            del _held[key]
            if not _remove_if_unused(hold):
                os.ftruncate(hold.fd, 0)  # nobody holds it now; the kernel drops the flock on close
            os.close(hold.fd)


def _lock(rd: Lockable) -> int:
    """A file descriptor holding the flock, with this process named in the file."""
    fd = os.open(rd.lock_file, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by exec
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise RunDirBusy(_busy(rd, holder)) from None
    me = {"pid": os.getpid(), "host": socket.gethostname(), "command": _command()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    return fd


def _busy(rd: Lockable, holder: dict[str, Any]) -> str:
    pid = holder.get("pid", "unknown")
    where = "" if holder.get("host") in (None, socket.gethostname()) else f" on {holder['host']}"
    what = f": {holder['command']}" if holder.get("command") else ""
    return (
        f"{rd.path} is being written by another process (pid {pid}{where}{what}); wait "
        f"for it to finish, or stop it (kill {pid}) and continue the run with "
        f"`dapo train --resume {rd.path}`; a new run needs another --run-dir"
    )


def _remove_if_unused(hold: _Hold) -> bool:
    """Remove the lock of a directory no run wrote to (its files as ``before`` the lock was
    made), and the directory if then empty, with the empty parents made for it (``runs/``). The
    lock goes while still held, so no other process takes it meanwhile."""
    rd = hold.rundir
    try:
        if (written := rd.written()) and written != hold.before:
            return False
        rd.lock_file.unlink()
        if not any(rd.path.iterdir()):
            rd.path.rmdir()
            with contextlib.suppress(OSError):  # deepest first; one not empty stops it
                for parent in hold.made[1:]:
                    parent.rmdir()
    except OSError:  # gone, or written to meanwhile: leave what is there
        return False
    return True


def _read_holder(fd: int) -> dict[str, Any]:
    """Who holds the lock, as its holder wrote it (empty while it has not written yet)."""
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        return {}


def _command() -> str:
    """This process's command line, short enough for a one-line message."""
    text = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else ""
    return text if len(text) <= 200 else text[:197] + "..."
