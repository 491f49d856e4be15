"""What every Prefect task of the pipeline shares: which errors are worth a retry, and a logger.

A Prefect task has a fixed cost of its own (API calls, state changes), so each task is a whole
stage (the DVC data stages, a training run, an evaluation), never a training step. Errors a
retry cannot fix (a bad config, missing data, a run stopped on purpose) are not retried.

Without a Prefect server (none configured, none running: :func:`without_prefect`), a short
command runs its flow's function and its stages' functions directly (:func:`call_flow`,
:class:`StageTask`), with the same retry policy and the same interrupt handling: Prefect would
otherwise start a temporary server for the command, seconds of start-up for a record of flow
runs in a database no UI shows, gone from view once the server stops. This module imports
Prefect only where a task or flow runs under it (importing Prefect takes seconds: a direct
command never pays it).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from dapo_core.config import ConfigError
from dapo_core.errors import PipelineError, TrainingInterrupted
from tasks.signals import watched_signals

USER_ERRORS = (ConfigError, PipelineError, FileNotFoundError, FileExistsError)
F = TypeVar("F")


def interrupts() -> tuple[type[BaseException], ...]:
    """Ctrl-C, and SIGTERM as Prefect raises it inside a flow run (``except interrupts():``).
    Only Prefect raises its TerminationSignal, so where Prefect was never imported there is
    none to catch, and none is imported for it."""
    prefect_exceptions = sys.modules.get("prefect.exceptions")
    if prefect_exceptions is None:
        return (KeyboardInterrupt,)
    return (KeyboardInterrupt, prefect_exceptions.TerminationSignal)


def retry_unless_user_error(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry I/O and crashes, not errors a retry cannot fix."""
    exc = getattr(state, "data", None)
    return not isinstance(exc, USER_ERRORS)


class _NoTracebackForUserErrors(logging.Filter):
    """Prefect logs a failed task or flow with its traceback; for an error the user can act on
    (a bad config, an unwritable directory) the message is the whole story, and the command
    prints it once more as its last line. A stopped run is no error at all: its line is its
    flow run's CANCELLED state, and Prefect's engine, running a deployment's flow run (a
    schedule's, a worker's), would log it again as "exited with unexpected exception" with its
    call stack, and the stopped task as an ERROR: "Finished in state Failed('Task run
    encountered an exception TrainingInterrupted: ...')". A user's error is said once, by the
    flow run ("Encountered exception during execution: ..."): its task's two lines saying the
    same go (a pipeline printed one error four times)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, TrainingInterrupted):
            return False
        if record.name == "prefect.task_runs" and _said_elsewhere(record, exc):
            return False
        if isinstance(exc, USER_ERRORS):
            record.exc_info, record.exc_text = None, None
        return True


INTERRUPTED_TASK = "aborted by an interrupt signal"  # Prefect's words for a task Ctrl-C cut


def _said_elsewhere(record: logging.LogRecord, exc: BaseException | None) -> bool:
    """A task's line that the flow run's line or the command's last line says too: a user's
    error (attached, or named in "Finished in state Failed('Task run encountered an exception
    NAME: ...')"), a stopped run (TrainingInterrupted, named there likewise), or "Crash
    detected! Execution was aborted by an interrupt signal" for a task Ctrl-C cut."""
    if isinstance(exc, USER_ERRORS):
        return True
    message = record.getMessage()
    if INTERRUPTED_TASK in message:
        return True
    return any(f"exception {name}:" in message for name in _quiet_exception_names())


def _quiet_exception_names() -> set[str]:
    """TrainingInterrupted's name and every user error's, subclasses included."""
    names, todo = {TrainingInterrupted.__name__}, list(USER_ERRORS)
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


RUNS_END_WITH = "DAPO_RUNS_END_WITH"
"""Set by a command that runs flow runs in processes of its own (``dapo schedule``), to its pid:
those processes end with it, however it ends (:func:`in_a_flow_run_process`)."""


def in_a_flow_run_process() -> None:
    """What a flow's function sets up first, for when it runs in a process Prefect started for
    it (a schedule's runner, a worker): Prefect's logs of a stop or a user's error without call
    stacks; and, under a command that set ``RUNS_END_WITH`` to its pid, SIGTERM from the kernel
    when that command ends. A command killed outright (SIGKILL) left its scheduled run training,
    re-parented to init; SIGTERM stops it as Ctrl-C would (flow run CANCELLED, MLflow run KILLED).
    A worker's flow runs are stopped by the reaper that watches the worker (``tasks.lifetime``)."""
    quiet_user_error_tracebacks()
    owner = os.environ.get(RUNS_END_WITH, "")
    if owner.isdigit() and int(owner) == os.getppid():
        from tasks.lifetime import die_with_parent

        die_with_parent(int(owner))


def quiet_user_error_tracebacks() -> None:
    """Install the filter on Prefect's run loggers (idempotent)."""
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoTracebackForUserErrors) for f in logger.filters):
            logger.addFilter(_NoTracebackForUserErrors())


def run_logger() -> Any:
    """The Prefect run logger inside a flow or task; outside one, this project's own, which says
    what a run logs (``continuing from step 40``, the preflight's report) on stderr as Prefect's
    would: a command without a Prefect server showed its warnings alone."""
    if _direct.get() or "prefect" not in sys.modules:  # no Prefect run can be active
        return _plain_logger()
    from prefect import get_run_logger

    try:
        return get_run_logger()
    except Exception:  # noqa: BLE001 - no Prefect run context
        return _plain_logger()


class _Stderr(logging.StreamHandler):
    """Lines to whatever ``sys.stderr`` is when they are logged (a test's capture, too), not the
    stream it was when the handler was made; ``warning:`` before a warning, as the CLI's own."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler sets it: sys.stderr is read instead
        pass

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        return f"warning: {line}" if record.levelno >= logging.WARNING else line

    def filter(self, record: logging.LogRecord) -> bool:
        """Not a line Prefect's console handler (on the root logger once Prefect has set up its
        logging; every level by default) prints already: it would come twice."""
        root = logging.getLogger().handlers
        prefects = [h for h in root if type(h).__name__ == "PrefectConsoleHandler"]
        return not any(record.levelno >= h.level for h in prefects) and super().filter(record)


def _plain_logger() -> logging.Logger:
    logger = logging.getLogger("dapo")
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        logger.addHandler(_Stderr())
    if logger.level == logging.NOTSET:  # again after a caller set it back (pytest's caplog)
        logger.setLevel(logging.INFO)
    return logger


def publish_markdown(key: str, markdown: str, description: str) -> str | None:
    """``markdown`` as a Prefect artifact of the flow run we are in (its Artifacts tab, and the
    Artifacts page under ``key``, newest version first); nothing outside a flow run. ``key``:
    lowercase letters, digits and dashes (Prefect's rule), other characters become dashes.
    Returns the artifact's id."""
    if _direct.get() or "prefect" not in sys.modules or not _in_flow_run():
        return None
    from prefect.artifacts import create_markdown_artifact

    key = re.sub(r"[^a-z0-9-]+", "-", key.lower()).strip("-")
    try:
        return str(create_markdown_artifact(markdown, key=key, description=description))
    except Exception as e:  # noqa: BLE001 - a report is not worth failing the flow for
        run_logger().warning("could not publish the Prefect artifact %s: %s", key, e)
        return None


@contextmanager
def concurrency_slot(limit: str | None) -> Iterator[None]:
    """One slot of the Prefect global concurrency limit ``limit`` held while the block runs
    (waiting for one first, with a line saying so); nothing with no limit. Outside a flow run
    on a Prefect server there are no slots to take: it says so once and runs the block."""
    if not limit:
        yield
        return
    log = run_logger()
    if _direct.get() or "prefect" not in sys.modules or not _in_flow_run():
        log.warning(
            "train.concurrency_limit %s: no Prefect server to hold its slots (start one with "
            "`dapo server start`), so this run takes none",
            limit,
        )
        yield
        return
    from prefect.concurrency._asyncio import ConcurrencySlotAcquisitionError
    from prefect.concurrency.sync import concurrency

    log.info("waiting for a slot of the Prefect concurrency limit %s", limit)
    acquired = False
    try:
        with concurrency(limit, occupy=1, strict=True):
            acquired = True
            yield
    except ConcurrencySlotAcquisitionError:
        if acquired:
            raise
        raise PipelineError(
            f"train.concurrency_limit names {limit!r}, which this Prefect server does not have: "
            f"create it (`prefect gcl create {limit} --limit 1`) or set the key to null"
        ) from None


def _in_flow_run() -> bool:
    from prefect.context import FlowRunContext

    return FlowRunContext.get() is not None


def stage_task(name: str, retries: int, retry_delay_seconds: float) -> Any:
    """The Prefect ``task`` decorator as every stage uses it: retried unless the error is the
    user's, never cached (a stage's inputs are files a config names, not its arguments), and
    no result persisted (results are in the run directory and MLflow)."""

    def decorate(fn: Any) -> StageTask:
        options = {"name": name, "retries": retries, "retry_delay_seconds": retry_delay_seconds}
        return StageTask(fn, options)

    return decorate


_direct = contextvars.ContextVar("dapo_without_prefect", default=False)


@contextmanager
def without_prefect() -> Iterator[None]:
    """Run flows (:func:`call_flow`) and stage tasks as plain functions for the body; their run
    logs go to the ``dapo`` logger (:func:`run_logger`), which says them on stderr (or Prefect's
    console handler, once Prefect has set up its logging)."""
    token = _direct.set(True)
    try:
        yield
    finally:
        _direct.reset(token)


class StageTask:
    """A stage's Prefect task. Under :func:`without_prefect` calling it runs its function
    directly, retried as Prefect would (``retries`` times after ``retry_delay_seconds``, unless
    the error is the user's); otherwise Prefect runs it as a task run (the Prefect task is built,
    and Prefect imported, on the first such call)."""

    def __init__(self, fn: Any, options: dict[str, Any]):
        self.fn = fn
        self.name = options["name"]
        self.options = options
        functools.update_wrapper(self, fn)

    @functools.cached_property
    def task(self) -> Any:
        from prefect import task
        from prefect.cache_policies import NO_CACHE

        return task(
            retry_condition_fn=retry_unless_user_error,
            cache_policy=NO_CACHE,
            persist_result=False,
            **self.options,
        )(self.fn)

    def with_options(self, **options: Any) -> StageTask:
        return StageTask(self.fn, {**self.options, **options})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not _direct.get():
            return self.task(*args, **kwargs)
        retries = self.options["retries"]
        for attempt in range(retries + 1):
            try:
                return self.fn(*args, **kwargs)
            except USER_ERRORS:
                raise
            except Exception as e:
                if attempt == retries:
                    raise
                delay = self.options["retry_delay_seconds"] or 0
                run_logger().warning("%s failed (%s); retrying in %s s", self.name, e, delay)
                time.sleep(float(delay[0] if isinstance(delay, list) else delay))
        raise AssertionError("unreachable")  # pragma: no cover


def running_directly() -> bool:
    """Inside :func:`without_prefect`: flows and stages run as plain functions."""
    return _direct.get()


def call_flow(flow: Any, **kwargs: Any) -> Any:
    """Call a Prefect flow: as Prefect runs it, or under :func:`without_prefect` its function
    directly (an interrupted run raises TrainingInterrupted either way)."""
    return flow.fn(**kwargs) if _direct.get() else flow(**kwargs)


CRASH_FLOW_RUN = "import sys; from tasks.orchestration import crash_flow_run as c; c(*sys.argv[1:])"


@contextmanager
def crashed_if_killed() -> Iterator[None]:
    """Under Prefect: should this process be killed outright (SIGKILL, the OOM killer), its
    reaper (``tasks.lifetime``) ends this flow run CRASHED; every other ending the flow run
    records itself. Run directly there is no flow run to end."""
    run_id = api = None
    if not _direct.get():
        from prefect.runtime import flow_run
        from prefect.settings import get_current_settings

        run_id, api = flow_run.id, get_current_settings().api.url
    if not (run_id and api):
        yield
        return
    from tasks import lifetime

    key = f"prefect:{run_id}"
    lifetime.last_words(key, [sys.executable, "-c", CRASH_FLOW_RUN, api, str(run_id)])
    try:
        yield
    finally:
        lifetime.take_back(key)


def crash_flow_run(api: str, run_id: str) -> bool:
    """Set flow run ``run_id`` CRASHED through the Prefect API at ``api`` (a killed command's
    last words, in a process of their own). Prefect's rules refuse it for a run that has ended
    already. True when the server accepted it."""
    state = {
        "type": "CRASHED",
        "name": "Crashed",
        "message": "the command running this flow was killed outright (SIGKILL, out of memory)",
    }
    body = {"state": state, "force": False}
    answer = prefect_api("POST", api, f"flow_runs/{run_id}/set_state", body, 30)
    return answer is not None and answer.get("status") == "ACCEPT"


def prefect_api(method: str, api: str, path: str, body: dict, timeout: float) -> dict | None:
    """``body`` sent to ``api``/``path`` with the credentials Prefect's own client sends, in the
    standard library (a killed command's last words: no Prefect client to import); the answer,
    ``{}`` when it is empty, None when the server cannot be reached or refuses."""
    import json
    import urllib.request

    request = urllib.request.Request(
        f"{api.rstrip('/')}/{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **api_credentials()},
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            text = answer.read()
        return json.loads(text) if text else {}
    except (OSError, ValueError):  # away, refused (HTTPError is an OSError), or no API to ask
        return None


def crashed_when_killed(fn: F) -> F:
    """For a flow's function that handles its interrupts itself (under ``@flow``):
    :func:`crashed_if_killed` around each call."""

    @functools.wraps(fn)  # type: ignore[arg-type]
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        in_a_flow_run_process()
        with crashed_if_killed():
            return fn(*args, **kwargs)  # type: ignore[operator]

    return _with_signature(wrapper, fn)


def _with_signature(wrapper: Any, fn: Any) -> Any:
    """``wrapper`` with ``fn``'s signature, its annotations evaluated where ``fn`` was written:
    Prefect validates a flow's parameters from the signature, and resolves annotations left as
    strings (``from __future__ import annotations``) in the wrapper's module, where ``Path`` or
    a config type is not defined."""
    import inspect

    # a name only a type checker sees leaves the signature as it was
    with contextlib.suppress(NameError, TypeError, SyntaxError):
        wrapper.__signature__ = inspect.signature(fn, eval_str=True)
    return wrapper


def api_credentials() -> dict[str, str]:
    """The Authorization header Prefect's own client sends (an auth string first, else an API
    key; none for a local server), from the settings: never on a command line."""
    import base64

    from prefect.settings import get_current_settings

    api = get_current_settings().api
    if api.auth_string:
        token = base64.b64encode(api.auth_string.get_secret_value().encode()).decode()
        return {"Authorization": f"Basic {token}"}
    if api.key:
        return {"Authorization": f"Bearer {api.key.get_secret_value()}"}
    return {}


def cancelled_when_interrupted(fn: F) -> F:
    """For a flow's function (under ``@flow``): an interrupt, or a task it stopped, ends the flow
    run CANCELLED (not FAILED or CRASHED) with the line that says where the run stopped and how to
    go on; calling the flow raises that as TrainingInterrupted (Prefect raises the data of a
    final state that is an exception), which the command prints as its last line. Run directly
    (:func:`without_prefect`), the function raises that TrainingInterrupted itself."""

    @functools.wraps(fn)  # type: ignore[arg-type]
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        in_a_flow_run_process()
        try:
            # Prefect installed its SIGTERM handler for the flow run
            with watched_signals(), crashed_if_killed():
                return fn(*args, **kwargs)  # type: ignore[operator]
        except (*interrupts(), TrainingInterrupted) as e:
            message = (
                str(e)
                if isinstance(e, TrainingInterrupted)
                else "stopped by a signal; run the same command to start again"
            )
            if _direct.get():
                raise TrainingInterrupted(message) from None
            from prefect.states import Cancelled

            return Cancelled(message=message, data=TrainingInterrupted(message))

    return _with_signature(wrapper, fn)
