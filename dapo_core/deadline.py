"""A deadline that works in any thread: CPU time of the calling thread, and wall-clock time.

``signal.alarm`` (Math-Verify's own timeout) only works in the main thread and takes over the
process's one alarm; the reward is computed in worker threads too (``dapo_core.equivalence``).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Overtime", "deadline", "thread_cpu_clock"]


class Overtime(BaseException):
    """Raised inside a judgement that ran past its deadline.

    A BaseException, like KeyboardInterrupt: Math-Verify and sympy catch ``Exception`` in their
    loops, and would otherwise swallow it and go on working."""


@contextmanager
def deadline(cpu_seconds: float, wall_seconds: float) -> Iterator[None]:
    """Raise :class:`Overtime` in this thread once the block has used ``cpu_seconds`` of this
    thread's CPU time, or ``wall_seconds`` have passed.

    A timer thread raises it asynchronously in the calling thread (``PyThreadState_SetAsyncExc``),
    which takes effect between two bytecodes, as a signal handler would; unlike
    ``signal.alarm`` (Math-Verify's own timeout) it works off the main thread and leaves the
    process's alarm alone. It fires once: an exception raised inside a garbage-collector callback
    is swallowed there, and the block then runs to its end. A long single C call finishes
    first: the guards keep those out. Without a per-thread CPU clock (outside Linux and the
    BSDs) the budget is wall-clock time.
    """
    thread_id = threading.get_ident()
    cpu_clock = thread_cpu_clock(thread_id)
    cpu_start = time.clock_gettime(cpu_clock) if cpu_clock is not None else 0.0
    wall_end = time.monotonic() + wall_seconds
    lock = threading.Lock()
    state: dict[str, Any] = {"open": True, "fired": False, "timer": None}

    def check() -> None:
        """Fire if the budget is spent; otherwise check again when it could be."""
        with lock:
            if not state["open"]:
                return
            left = wall_end - time.monotonic()
            if cpu_clock is not None:
                try:
                    left = min(left, cpu_seconds - (time.clock_gettime(cpu_clock) - cpu_start))
                except OSError:  # the thread is gone: nothing to interrupt
                    return
            if left > 0:
                arm(left)
                return
            state["fired"] = True
            _raise_in_thread(thread_id, Overtime)

    def arm(delay: float) -> None:
        timer = threading.Timer(delay, check)
        timer.daemon = True
        state["timer"] = timer
        timer.start()

    with lock:
        arm(min(cpu_seconds, wall_seconds))
    try:
        yield
    finally:
        with lock:
            state["open"] = False
            state["timer"].cancel()
            if state["fired"]:
                _raise_in_thread(thread_id, None)  # withdraw it if it has not been raised yet


def thread_cpu_clock(thread_id: int) -> int | None:
    """The CPU-time clock of thread ``thread_id`` (readable from any thread), if there is one."""
    try:
        return time.pthread_getcpuclockid(thread_id)
    except (AttributeError, OSError):
        return None


def _raise_in_thread(thread_id: int, exception: type[BaseException] | None) -> None:
    """Schedule ``exception`` in thread ``thread_id`` (None withdraws a scheduled one)."""
    exc = ctypes.py_object(exception) if exception is not None else None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), exc)
