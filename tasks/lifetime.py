"""Helpers that end with the command that started them, however the command ends.

A command's helpers (a temporary Prefect server, a sweep's workers and the flow runs they start,
the MLflow UI) run in sessions of their own, so that a Ctrl-C reaches the command alone and the
command stops them in order. That order is the command's clean-up, and a command killed outright
(SIGKILL: the OOM killer, Slurm or Kubernetes after their grace period) runs none: its helpers
lived on, re-parented to init, and a sweep's workers went on starting runs with nobody to
collect them.

So a command that starts a helper first starts a reaper (this file run as a script, standard
library only): a small process in a session of its own that reads a pipe only the command can
write to. The command tells it each helper it starts (``watch``) and each it has stopped
(``unwatch``). When the pipe closes, which the kernel does however the command exits, the reaper
stops what is left: first every process that descends from a helper (a worker's flow runs, which
may sit in sessions of their own), so they can record how they ended while the server still
runs; then the helpers' process groups; SIGTERM first, SIGKILL after a grace period each.

A helper is known by its pid and its start time (``/proc``), so a pid the system has since given
to another process is never signalled. Without ``/proc`` (macOS) the reaper stops the helpers'
groups only.

The command can also leave last words (``last_words``): a command line the reaper runs if the
pipe closes before the command takes them back (``take_back``), while the helpers' descendants
stop and before the helpers do (a server they may need is still up). The tracker leaves one per
MLflow run it holds open, which ends the run KILLED, and a flow run under Prefect one that ends
it CRASHED: a command killed outright leaves no run RUNNING.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1  # prctl(2)
LAST_WORDS_TIMEOUT_S = 60.0
LEAF_GRACE_S = 20.0  # a flow run's clean-up: its MLflow run ended KILLED, its state sent
GROUP_GRACE_S = 10.0  # a server's or worker's own shutdown

_reaper: list[subprocess.Popen] = []
_lock = threading.Lock()


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> bool:
    """In a process forked by ``parent`` (the warm process's children): have the kernel send
    ``sig`` when ``parent`` exits, however it exits (Linux's parent-death signal); sent now if
    it has exited already. False where it cannot be armed (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # it died before the signal was armed
        os.kill(os.getpid(), sig)
    return True


def _stat(pid: int | str) -> list[str] | None:
    """``/proc/PID/stat``'s fields from the third on (state, parent, group, ...), or None if
    the process is gone or there is no ``/proc``. The command name before them may hold
    spaces, hence the split at its closing parenthesis."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22), or None."""
    fields = _stat(pid)
    return fields[19] if fields else None


def start_helper(cmd: list[str], **popen_kwargs) -> subprocess.Popen:
    """Start ``cmd`` in a session of its own (a Ctrl-C in the terminal reaches only the command,
    which then stops it in order with :func:`stop_helper`), watched by the reaper (started
    first, so no helper runs unwatched but for the instant between its start and its record)."""
    with _lock:
        _ensure_reaper()
    proc = subprocess.Popen(cmd, start_new_session=True, **popen_kwargs)
    watch(proc.pid)
    return proc


def stop_helper(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop a helper and every process of its group: SIGTERM, SIGKILL after ``grace_s``. The
    reaper forgets it only once it is gone (not if this is cut short)."""
    _stop_group(proc, grace_s)
    unwatch(proc.pid)


def _stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            # The leader is gone; workers of the group may still be exiting.
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def _ensure_reaper() -> None:
    """Start the reaper (once per process; the caller holds ``_lock``). It runs this file by
    its path in isolated mode (-I): no package of the caller's directory can shadow it, and it
    needs nothing but the standard library. Its output goes nowhere, so it never holds a pipe
    the command's output goes to (``| tee``) open after the command."""
    if _reaper:
        return
    _reaper.append(
        subprocess.Popen(
            [sys.executable, "-I", str(Path(__file__).resolve())],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C for the command is not for it
        )
    )
    atexit.register(_close)


def start_reaper() -> None:
    """Start the reaper now (before a record that needs last words is made: a kill between the
    two would leave it without). No reaper (it could not start) only loses the backstop."""
    with _lock, contextlib.suppress(OSError):
        _ensure_reaper()


def _tell(line: str) -> None:
    with _lock:
        if not _reaper:
            if line.startswith(("-", "~")):  # nothing to take back from a reaper never started
                return
            try:
                _ensure_reaper()
            except OSError:  # no reaper: the command's own clean-up still runs
                return
        try:
            _reaper[0].stdin.write(f"{line}\n".encode())
            _reaper[0].stdin.flush()
        except (OSError, ValueError):  # the reaper is gone, or its pipe closed at exit: the
            pass  # command's own clean-up still runs


def _close() -> None:
    """At a normal exit: close the pipe (the reaper stops whatever the command left) and give
    it a moment, so that it does not outlive a command that left nothing."""
    reaper = _reaper[0]
    try:
        reaper.stdin.close()
        reaper.wait(timeout=1.0)
    except (OSError, subprocess.TimeoutExpired):
        pass


def watch(pid: int) -> None:
    """Have ``pid`` (a helper that leads its own process group) and what descends from it
    stopped if this process ends before :func:`unwatch`."""
    _tell(f"+{pid} {start_time(pid) or '-'}")


def unwatch(pid: int) -> None:
    """``pid`` has been stopped by the command itself."""
    _tell(f"-{pid}")


def last_words(key: str, argv: list[str]) -> None:
    """Have ``argv`` run if this process ends before :func:`take_back` of ``key`` (one line, no
    spaces in ``key``)."""
    _tell(f"@{key} {json.dumps(argv)}")


def take_back(key: str) -> None:
    _tell(f"~{key}")


def _processes() -> list[tuple[int, int, int]]:
    """(pid, parent pid, process group) of every live process, zombies left out, from
    ``/proc`` (empty without it)."""
    out = []
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat(entry.name)
        if fields and fields[0] != "Z":  # Z: exited, its parent has not collected it yet
            out.append((int(entry.name), int(fields[1]), int(fields[2])))
    return out


def descendants(roots: list[int]) -> list[int]:
    """Every process below ``roots`` (not the roots), nearest first."""
    children: dict[int, list[int]] = {}
    for pid, ppid, _ in _processes():
        children.setdefault(ppid, []).append(pid)
    found, frontier = [], list(roots)
    while frontier:
        frontier = [c for pid in frontier for c in children.get(pid, [])]
        found += frontier
    return found


def children(parent: int) -> list[int]:
    """The live processes whose parent is ``parent``."""
    return [pid for pid, ppid, _ in _processes() if ppid == parent]


def _signal(pids: list[int], sig: int, group: bool = False) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):  # gone already
            (os.killpg if group else os.kill)(pid, sig)


def alive(pids: list[int], group: bool = False) -> list[int]:
    """Those of ``pids`` (or of the groups they lead) that still run."""
    if Path("/proc/self/stat").exists():
        running = {pgrp if group else pid for pid, _, pgrp in _processes()}
        return [pid for pid in pids if pid in running]
    out = []
    for pid in pids:
        try:
            (os.killpg if group else os.kill)(pid, 0)
            out.append(pid)
        except PermissionError:
            out.append(pid)
        except OSError:
            pass
    return out


def _stop(pids: list[int], grace_s: float, group: bool = False) -> None:
    """SIGTERM, then SIGKILL for what is still there after ``grace_s``."""
    _signal(pids, signal.SIGTERM, group)
    deadline = time.monotonic() + grace_s
    while alive(pids, group) and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal(alive(pids, group), signal.SIGKILL, group)


def is_reaper(pid: int) -> bool:
    """Whether ``pid`` is a reaper (of a process a helper started: a sweep's flow run)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return str(Path(__file__).resolve()).encode() in args


def reap(helpers: dict[int, str], speaking: list[subprocess.Popen] = ()) -> None:
    """Stop the helpers still running as recorded (pid -> start time) and what descends from
    them: the descendants first, then (once the last words ``speaking`` are said) the helpers'
    groups. A descendant's own reaper is left to end with its command and say its words."""
    running = [pid for pid, start in helpers.items() if start == "-" or start_time(pid) == start]
    if running:
        leaves = [p for p in descendants(running) if p not in running and not is_reaper(p)]
        _stop(leaves, LEAF_GRACE_S)
    deadline = time.monotonic() + LAST_WORDS_TIMEOUT_S  # for all of them together
    for words in speaking:
        try:
            words.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            words.kill()
    if running:
        _stop(running, GROUP_GRACE_S, group=True)


def say(words: dict[str, list[str]]) -> list[subprocess.Popen]:
    """Start the last words left, all at once (:func:`reap` waits for them)."""
    started = []
    for argv in words.values():
        with contextlib.suppress(OSError):
            started.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL))
    return started


def main() -> None:
    """The reaper: follow the command's messages until its pipe closes, then say the last words
    left and reap."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ends when the pipe does, not before
    helpers: dict[int, str] = {}
    words: dict[str, list[str]] = {}
    for raw in sys.stdin.buffer:
        with contextlib.suppress(ValueError):  # a torn line must not cost the helpers' reaping
            _read(raw.decode(errors="replace").strip(), helpers, words)
    reap(helpers, say(words))


def _read(line: str, helpers: dict[int, str], words: dict[str, list[str]]) -> None:
    """One message of the command: +pid start / -pid (a helper), @key argv / ~key (words)."""
    if line.startswith("+"):
        pid, _, start = line[1:].partition(" ")
        helpers[int(pid)] = start
    elif line.startswith("-"):
        helpers.pop(int(line[1:]), None)
    elif line.startswith("@"):
        key, _, argv = line[1:].partition(" ")
        words[key] = json.loads(argv)
    elif line.startswith("~"):
        words.pop(line[1:], None)


if __name__ == "__main__":
    main()
