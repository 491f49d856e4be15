"""Stages and flows without a Prefect server (``tasks.orchestration.without_prefect``): the
same retry policy and the same interrupt outcome as under Prefect, and no Prefect call."""

import contextlib
from pathlib import Path

import pytest
from prefect import flow

from dapo_core.config import ConfigError
from dapo_core.errors import TrainingInterrupted
from tasks.orchestration import (
    call_flow,
    cancelled_when_interrupted,
    stage_task,
    without_prefect,
)


def _failing(times: int, error: Exception):
    calls = []

    @stage_task("flaky", retries=2, retry_delay_seconds=0)
    def flaky(x: int) -> int:
        calls.append(x)
        if len(calls) <= times:
            raise error
        return 2 * x

    return flaky, calls


def test_a_stage_is_retried_as_prefect_would_then_gives_up():
    flaky, calls = _failing(2, OSError("disk hiccup"))
    with without_prefect():
        assert flaky(21) == 42
    assert calls == [21, 21, 21]  # two failures, two retries
    flaky, calls = _failing(3, OSError("disk gone"))
    with without_prefect(), pytest.raises(OSError, match="disk gone"):
        flaky(1)
    assert len(calls) == 3  # retries + 1 attempts, then the error


def test_a_users_error_is_not_retried():
    flaky, calls = _failing(1, ConfigError("train.steps must be >= 1"))
    with without_prefect(), pytest.raises(ConfigError):
        flaky(1)
    assert calls == [1]


def test_with_options_keeps_the_stage_callable_without_prefect():
    flaky, calls = _failing(1, OSError("once"))
    with without_prefect():
        assert flaky.with_options(task_run_name="renamed")(3) == 6
    assert calls == [3, 3]


def test_an_interrupted_flow_raises_its_message_without_prefect(monkeypatch):
    @flow(name="interrupted")
    @cancelled_when_interrupted
    def interrupted() -> None:
        raise KeyboardInterrupt

    @flow(name="fine")
    def fine(x: int) -> int:
        return x + 1

    # no Prefect API may be reached: a call to the engine would need a server
    import prefect.flows

    def no_engine(*a, **k):
        raise AssertionError("Prefect's engine was called")

    monkeypatch.setattr(prefect.flows.Flow, "__call__", no_engine)
    with without_prefect():
        assert call_flow(fine, x=1) == 2
        with pytest.raises(TrainingInterrupted, match="stopped by a signal"):
            call_flow(interrupted)


def test_a_wrapped_flow_validates_parameters_annotated_in_its_own_module():
    """Prefect validates a flow's parameters from its signature and resolves string annotations
    (``from __future__ import annotations``) where the function was written: a wrapper's module
    does not define ``Path``, so the wrappers carry the signature evaluated in the flow's."""
    from tasks.orchestration import cancelled_when_interrupted, crashed_when_killed

    namespace: dict = {}
    source = (
        "from __future__ import annotations\n"
        "from pathlib import Path\n"
        "def fn(where: Path, n: int = 1) -> int:\n"
        "    return n\n"
    )
    exec(compile(source, "<flow module>", "exec"), namespace)
    for wrap in (cancelled_when_interrupted, crashed_when_killed):
        checked = flow(name="wrapped")(wrap(namespace["fn"])).validate_parameters(
            {"where": "/tmp", "n": "2"}
        )
        assert checked == {"where": Path("/tmp"), "n": 2}


def test_prefect_logs_a_stop_as_no_error_and_a_users_error_without_its_call_stack():
    """A deployment's flow run (a schedule's, a worker's) that stops returns CANCELLED, and
    Prefect's engine then logged "exited with unexpected exception" with the call stack of
    the TrainingInterrupted its state carries: that record is dropped. A user's error keeps
    its line and loses its call stack; any other error keeps both."""
    import logging
    import sys

    from tasks.orchestration import _NoTracebackForUserErrors

    kept = []
    for exc in (TrainingInterrupted("stopped after step 3"), ConfigError("bad"),
                RuntimeError("bug")):  # fmt: skip
        try:
            raise exc
        except Exception:
            record = logging.LogRecord("prefect.flow_runs", logging.ERROR, "", 0,
                                       "Engine execution exited with unexpected exception",
                                       (), sys.exc_info())  # fmt: skip
        if _NoTracebackForUserErrors().filter(record):
            kept.append((type(exc).__name__, record.exc_info is not None))
    assert kept == [("ConfigError", False), ("RuntimeError", True)]
    # the stopped task's own line, an ERROR with the message the flow's CANCELLED line gives
    stopped = "Finished in state Failed('Task run encountered an exception TrainingInterrupted: x')"
    failed = "Finished in state Failed('Task run encountered an exception ValueError: x')"
    quiet = _NoTracebackForUserErrors()
    # a user's error (ModelNotFound is a FileNotFoundError): the flow's line says it; the
    # task's two lines go
    from tasks.models.loading import ModelNotFound

    name = ModelNotFound.__name__
    user = f"Finished in state Failed('Task run encountered an exception {name}: x')"
    crashed = "Crash detected! Execution was aborted by an interrupt signal."
    for message, shown in ((stopped, False), (failed, True), (user, False), (crashed, False)):
        record = logging.LogRecord("prefect.task_runs", logging.ERROR, "", 0, message, (), None)
        assert quiet.filter(record) is shown
    for logger, shown in (("prefect.task_runs", False), ("prefect.flow_runs", True)):
        try:
            raise ConfigError("bad")
        except ConfigError:
            record = logging.LogRecord(logger, logging.ERROR, "", 0, "failed with exception",
                                       (), sys.exc_info())  # fmt: skip
        assert quiet.filter(record) is shown


COMMAND = """
import os, subprocess, sys, time
env = {**os.environ, "DAPO_RUNS_END_WITH": sys.argv[1] or str(os.getpid())}
run = subprocess.Popen([sys.executable, "-c", '''
import signal, sys, time
from tasks.orchestration import in_a_flow_run_process
def stopped(*_):
    print("stopped", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stopped)
in_a_flow_run_process()
print("ready", flush=True)
time.sleep(60)
'''], env=env, stdout=sys.stdout)
time.sleep(60)
"""


@pytest.mark.parametrize("owner", ["this command", "another process"])
def test_a_flow_run_process_ends_with_the_command_that_started_it_even_killed(owner):
    """`dapo schedule` killed outright (SIGKILL) left its scheduled run training, re-parented to
    init. A flow-run process whose parent set ``RUNS_END_WITH`` to its own pid gets SIGTERM
    when that parent ends; under anyone else's pid nothing is armed."""
    import os
    import signal
    import subprocess
    import sys
    import time

    other = "" if owner == "this command" else "1"
    command = subprocess.Popen([sys.executable, "-c", COMMAND, other], stdout=subprocess.PIPE,
                               text=True, start_new_session=True)  # fmt: skip
    try:
        assert command.stdout.readline() == "ready\n"
        command.kill()
        command.wait()
        if owner == "this command":
            assert command.stdout.readline() == "stopped\n"  # SIGTERM came, it stopped
        else:
            time.sleep(1)
            os.killpg(command.pid, 0)  # the run is still there: nothing armed
    finally:
        with contextlib.suppress(OSError):
            os.killpg(command.pid, signal.SIGKILL)


def test_outside_a_flow_run_what_a_run_logs_is_said_on_stderr(capsys, monkeypatch):
    """Without a Prefect server a command runs its flow as a function, and its run logger was
    a bare logger: its info lines (the preflight's report, where a resumed run continues) were
    dropped and its warnings shown by Python's last-resort handler."""
    import io
    import logging

    from prefect.logging.handlers import PrefectConsoleHandler

    from tasks.orchestration import run_logger, without_prefect

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # as in a command: Prefect's logging not set up
    with without_prefect():
        log = run_logger()
        log.info("train: continuing from step %d", 40)
        log.warning("preflight: %s", "nothing to learn")
        assert run_logger() is log and len(log.handlers) == 1  # one handler, however often
    err = capsys.readouterr().err
    assert err == "train: continuing from step 40\nwarning: preflight: nothing to learn\n"
    # Once Prefect has set up its logging, its console handler on the root logger says the
    # lines: ours stays silent rather than say each twice.
    prefects = io.StringIO()
    monkeypatch.setattr(root, "handlers", [PrefectConsoleHandler(stream=prefects)])
    with without_prefect():
        run_logger().warning("preflight: %s", "nothing to learn")
    assert capsys.readouterr().err == "" and "preflight: nothing to learn" in prefects.getvalue()
