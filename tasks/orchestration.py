"""What every Prefect task of the pipeline shares: which errors are worth a retry, and a logger.

A Prefect task has a fixed cost of its own (API calls, state changes), so each task is a whole
stage (the DVC data stages, a training run, an evaluation), never a training step. Errors a
retry cannot fix (a bad config, missing data, a run stopped on purpose) are not retried.
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import TerminationSignal
from prefect.states import Cancelled

from dapo_core.config import ConfigError
from dapo_core.errors import PipelineError, TrainingInterrupted

USER_ERRORS = (ConfigError, PipelineError, FileNotFoundError, FileExistsError)
INTERRUPTS = (KeyboardInterrupt, TerminationSignal)
"""Ctrl-C, and SIGTERM as Prefect raises it inside a flow run."""
F = TypeVar("F")


def retry_unless_user_error(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry I/O and crashes, not errors a retry cannot fix."""
    exc = getattr(state, "data", None)
    return not isinstance(exc, USER_ERRORS)


class _NoTracebackForUserErrors(logging.Filter):
    """Prefect logs a failed task or flow with its traceback; for an error the user can act on
    (a bad config, an unwritable directory) the message is the whole story, and the command
    prints it once more as its last line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], USER_ERRORS):
            record.exc_info, record.exc_text = None, None
        return True


def quiet_user_error_tracebacks() -> None:
    """Install the filter on Prefect's run loggers (idempotent)."""
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoTracebackForUserErrors) for f in logger.filters):
            logger.addFilter(_NoTracebackForUserErrors())


def run_logger() -> Any:
    """The Prefect run logger inside a flow or task; a plain logger when called outside one."""
    try:
        return get_run_logger()
    except Exception:  # noqa: BLE001 - no Prefect run context
        return logging.getLogger("dapo")


def stage_task(name: str, retries: int, retry_delay_seconds: float) -> Any:
    """The Prefect ``task`` decorator as every stage uses it: retried unless the error is the
    user's, never cached (a stage's inputs are files a config names, not its arguments), and
    no result persisted (results are in the run directory and MLflow)."""
    return task(
        name=name,
        retries=retries,
        retry_delay_seconds=retry_delay_seconds,
        retry_condition_fn=retry_unless_user_error,
        cache_policy=NO_CACHE,
        persist_result=False,
    )


@contextmanager
def deferred_signals() -> Iterator[None]:
    """Ignore Ctrl-C and SIGTERM for the few seconds a stop takes to clean up (a sweep cancelling
    its runs, a run ending its MLflow run KILLED): cut short, it would leave them looking alive.
    A terminal sends Ctrl-C to every process of its group, and a scheduler may repeat SIGTERM."""
    if threading.current_thread() is not threading.main_thread():  # only it may set handlers
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def cancelled_when_interrupted(fn: F) -> F:
    """For a flow's function (under ``@flow``): an interrupt, or a task it stopped, ends the flow
    run CANCELLED (not FAILED or CRASHED) with the line that says where the run stopped and how to
    go on; calling the flow raises that as TrainingInterrupted (Prefect raises the data of a
    final state that is an exception), which the command prints as its last line."""

    @functools.wraps(fn)  # type: ignore[arg-type]
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)  # type: ignore[operator]
        except (*INTERRUPTS, TrainingInterrupted) as e:
            message = (
                str(e)
                if isinstance(e, TrainingInterrupted)
                else "stopped by a signal; run the same command to start again"
            )
            return Cancelled(message=message, data=TrainingInterrupted(message))

    return wrapper  # type: ignore[return-value]
