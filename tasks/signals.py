"""The interrupt path every command shares: Ctrl-C and SIGTERM handled, held or deferred where
a stop must not cut a write or a clean-up short, delivered again if lost, and a watchdog that
gives the clean-up ``CLEANUP_DEADLINE_S`` before the command kills what it started and exits.

A command a signal stopped exits 128 + the signal's number, the status a shell gives a process
that signal killed: 130 for Ctrl-C (SIGINT), 143 for SIGTERM (:func:`interrupted_status`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CLEANUP_DEADLINE_S = 45.0
"""How long a command may take to clean up after Ctrl-C or SIGTERM before it gives up (measured:
0-2 s for a run, up to ~15 s for a sweep stopping its workers)."""
_stopped_by: list[int] = []  # the first signal that stopped this command
_sessions: set[int] = set()  # process groups this process started and must not leave behind
_watchdog: list[threading.Timer] = []


def own_session(pid: int) -> None:
    """Record a process started in a session of its own (a server, a sweep's worker): if the
    clean-up after an interrupt does not finish, :func:`give_up` kills its group."""
    _sessions.add(pid)


def release_session(pid: int) -> None:
    _sessions.discard(pid)


def give_up() -> None:
    """The clean-up after an interrupt did not finish in time: kill the sessions this process
    started, say so in one line, exit (:func:`interrupted_status`). The run directory needs
    nothing from it (crash consistency: a resume continues from the last checkpoint)."""
    from tasks.lifetime import descendants

    # What the sessions started in sessions of their own (a worker's flow runs) first: once
    # their parents are gone they could no longer be found.
    for pid in descendants(list(_sessions)):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in list(_sessions):
        with contextlib.suppress(OSError):  # gone already
            os.killpg(pid, signal.SIGKILL)
    sys.stderr.write(
        f"interrupted: the clean-up did not finish within {CLEANUP_DEADLINE_S:.0f}s, so the "
        "command stopped without it; its run directory is consistent: --resume continues it\n"
    )
    sys.stderr.flush()
    os._exit(interrupted_status())


def interrupted_status() -> int:
    """The status of a command a signal stopped: 128 + the number of the first signal since
    :func:`forget_interrupts` (130 for Ctrl-C, 143 for SIGTERM), as a shell reports a process
    that signal killed; 130 when no handler saw one (a KeyboardInterrupt raised otherwise)."""
    return 128 + (_stopped_by[0] if _stopped_by else signal.SIGINT)


def note_interrupt(signum: int) -> None:
    """Record ``signum`` as what stopped this command, unless a signal did already (for
    :func:`interrupted_status`)."""
    if not _stopped_by:
        _stopped_by.append(signum)


def forget_interrupts() -> None:
    """A command begins: what stopped an earlier one in this process (a test's) is forgotten."""
    _stopped_by.clear()


def arm_watchdog(deadline_s: float | None = None) -> None:
    """On the first interrupt: give the clean-up ``deadline_s`` (once per process)."""
    if _watchdog:
        return
    timer = threading.Timer(CLEANUP_DEADLINE_S if deadline_s is None else deadline_s, give_up)
    timer.daemon = True
    _watchdog.append(timer)
    timer.start()


_last_interrupt: list[int] = []  # the signal the last watched handler ran for


def redeliver_lost_interrupts(signum: int) -> None:
    """Deliver ``signum`` again, a moment later, if the exception its handler raises is lost.

    Python runs a signal's handler at the next bytecode of the main thread, which may belong to
    a garbage-collection callback or a ``__del__``; what such code raises is not raised but
    reported as "Exception ignored" (``sys.unraisablehook``), and the command would go on as if
    never stopped. A lost interrupt is delivered again, once the callback is over; where the
    clean-up already runs (:func:`deferred_signals`), the repeat is ignored."""
    if not _last_interrupt:
        sys.unraisablehook = functools.partial(_redeliver, sys.unraisablehook)
    _last_interrupt[:] = [signum]


def _redeliver(previous: Any, unraisable: Any) -> None:
    if isinstance(unraisable.exc_value, Exception) or unraisable.exc_value is None:
        previous(unraisable)  # an ordinary error in a callback: reported as usual
        return
    timer = threading.Timer(0.1, os.kill, (os.getpid(), _last_interrupt[0]))
    timer.daemon = True
    timer.start()


def watched(handler: Any) -> Any:
    """``handler`` (a Python signal handler) that first arms the clean-up watchdog, and has an
    interrupt it raises delivered again if the exception is lost (see
    :func:`redeliver_lost_interrupts`)."""
    if getattr(handler, "_arms_watchdog", False) or not callable(handler):
        return handler

    def arming(signum: int, frame: Any) -> Any:
        note_interrupt(signum)
        arm_watchdog()
        redeliver_lost_interrupts(signum)
        return handler(signum, frame)

    arming._arms_watchdog = True  # type: ignore[attr-defined]
    return arming


@contextmanager
def replaced_handlers(replace: Any) -> Iterator[dict[int, Any]]:
    """Ctrl-C's and SIGTERM's handlers replaced by ``replace(previous handler)`` for the body,
    then put back; yields the previous ones. Main thread only, where handlers run: elsewhere
    nothing changes and nothing is yielded."""
    if threading.current_thread() is not threading.main_thread():
        yield {}
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s, handler in previous.items():
        signal.signal(s, replace(handler))
    try:
        yield previous
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextmanager
def watched_signals() -> Iterator[None]:
    """Wrap the installed Ctrl-C and SIGTERM handlers (a flow run's are Prefect's, which raise
    TerminationSignal) with :func:`watched` for the body; main thread only."""
    with replaced_handlers(watched):
        yield


@contextmanager
def deferred_signals() -> Iterator[None]:
    """Ignore Ctrl-C and SIGTERM for the few seconds a stop takes to clean up (a sweep cancelling
    its runs, a run ending its MLflow run KILLED): cut short, it would leave them looking alive.
    A terminal sends Ctrl-C to every process of its group, and a scheduler may repeat SIGTERM."""
    with replaced_handlers(lambda _: signal.SIG_IGN):
        yield


@contextmanager
def held_signals() -> Iterator[None]:
    """Hold the first Ctrl-C or SIGTERM until the body is over, then deliver it to the handler in
    place: for a call that must not be cut in the middle, such as an MLflow store write. An
    interrupt raised inside SQLAlchemy's commit (a BaseException, which its clean-up does not
    catch) left the SQLite store locked by the half-done transaction, so ending the run KILLED
    then waited out the lock and failed: a traceback, and the run left RUNNING. A second signal
    is not held: whoever sends it again means it now. Main thread only, where handlers run."""
    held: list[int] = []
    previous: dict[int, Any] = {}

    def hold(signum: int, frame: Any) -> Any:
        if held:
            handler = previous[signum]
            return handler(signum, frame) if callable(handler) else None
        held.append(signum)
        return None

    try:
        with replaced_handlers(lambda _: hold) as replaced:
            previous.update(replaced)
            yield
    finally:
        if held and callable(previous[held[0]]):
            signal.raise_signal(held[0])  # now, to the handler the body ran under
