"""Ctrl-C and SIGTERM before a command's work begins, handled with no import that takes time.

Importing the CLI (torch, transformers, Prefect, MLflow) takes seconds, and a KeyboardInterrupt
raised inside an import can be swallowed by a library's bare ``except``: measured, a Ctrl-C in
that second was lost and the command ran to the end. So until a command has loaded its config
(``flows.commands.base._working``), either signal ends it at once: nothing has started that needs a
clean-up. The ``dapo`` entry point (``flows.entry``) and ``python -m flows.cli`` install this
before their imports.
"""

from __future__ import annotations

import os
import select
import signal
import stat
import sys
from typing import Any

GC_YOUNG = 20_000
"""Allocations between two collections of the collector's youngest generation once a command
works; Python's default is 700 (docs/testing.md has what it saves a cold command)."""


def exit_at_once(signum: int, frame: Any) -> None:
    sys.stderr.write("interrupted before anything had started\n")
    os._exit(128 + signum)  # 130 for Ctrl-C, 143 for SIGTERM: the shell's status for each


def run_to_the_end(app: Any) -> None:
    """Run the CLI ``app`` (which exits with the command's status); a Ctrl-C or SIGTERM that
    arrives once the command is over (while the interpreter shuts down: libraries' exit hooks,
    threads joined) exits at once with that status. It ran the start-up's handler, which
    said "interrupted before anything had started" and exited 130 after a finished command."""
    stdout_was_pipe = _stdout_is_pipe()
    try:
        app()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code == 1 and _reader_went_away(stdout_was_pipe):
            code = e.code = PIPE_CLOSED
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: os._exit(code))
        raise


PIPE_CLOSED = 128 + signal.SIGPIPE
"""The status of a command whose output's reader went away (``dapo variants | head -1``): the
shell's for a program SIGPIPE ended, as ``seq 1000000 | head -1`` gives, not click's 1, a
failure."""


def _stdout_is_pipe() -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(1).st_mode)
    except OSError:
        return False


def _reader_went_away(stdout_was_pipe: bool) -> bool:
    """Whether the command ended because its stdout, a pipe, lost its reader. Click and Rich
    then exit 1: click with file descriptor 1 still the pipe, which ``poll`` then reports in
    error (Linux: a pipe's write end with no reader), Rich after pointing it at the null device."""
    if not stdout_was_pipe:
        return False
    return not _stdout_is_pipe() or _pipe_has_no_reader(1)


def _pipe_has_no_reader(fd: int) -> bool:
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poll.poll(0))


def until_work_begins() -> None:
    """Handle Ctrl-C and SIGTERM with :func:`exit_at_once` (main thread only), and keep the
    garbage collector off: the imports allocate millions of objects, none of them garbage, and
    the collector walked them again and again, a share of every command's import time worth
    saving. ``flows.commands.base._working`` turns it back on when the work begins.

    A process that ``multiprocessing`` spawns (the rollout process) imports its parent's main
    module, which for ``dapo`` calls this too, and never reaches ``_working``: it keeps its
    collector, which it needs for the hours it serves."""
    import gc

    # (the interpreter's own arguments: a spawned child's sys.argv is its parent's by now)
    if "--multiprocessing-fork" not in sys.orig_argv:
        gc.disable()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, exit_at_once)


def collector_for_work() -> None:
    """Turn the collector on for the work, tuned for a process that has imported its libraries:
    what the imports made lives as long as the process, so it is frozen (no full pass walks it
    again), and the youngest generation holds ``GC_YOUNG`` objects, not 700: loading a model
    and starting a run allocate millions of objects, and the default ran a full pass every
    ~70,000 of them. Tuned once, where nothing is frozen yet: later (a second run in the same
    process), what is alive may include garbage that a freeze would keep for good."""
    import gc

    if not gc.get_freeze_count():
        gc.freeze()
        gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])
    gc.enable()
