"""Cron deployments: built without a server, registered against the test harness, never served."""

import logging
import re
from unittest import mock

import pytest
from typer.testing import CliRunner

from dapo_core.ablation import ABLATION_LADDER
from dapo_core.config import ConfigError
from flows.cli import app
from flows.schedule import build_deployments, schedule_specs


def test_default_schedules_nightly_train_and_weekly_ablate():
    specs = schedule_specs(nightly_steps=10, seeds=[0, 1], overrides=["train.lr=1e-3"])
    train, ablate = specs
    assert (train.flow, train.cron, train.timezone) == ("train", "0 2 * * *", "UTC")
    assert train.parameters["run_name"] == "nightly" and train.parameters["max_steps"] == 10
    assert train.parameters["overrides"] == ["train.lr=1e-3"]
    assert (ablate.flow, ablate.cron) == ("ablate", "0 4 * * 0")
    assert ablate.parameters["variants"] == list(ABLATION_LADDER)
    assert ablate.parameters["seeds"] == [0, 1]
    assert [s.name for s in schedule_specs(ablate_cron="")] == ["dapo-nightly-train"]
    assert "promote" not in train.parameters  # off unless asked for
    (promoting,) = schedule_specs(ablate_cron="", promote="dapo-policy")
    assert promoting.parameters["promote"] == "dapo-policy"
    assert "models:/dapo-policy@champion" in promoting.description
    build_deployments([promoting])  # the train flow takes the parameter
    with pytest.raises(ConfigError, match="not a cron expression"):
        schedule_specs(train_cron="every night")
    for never in ("0 2 31 2 *", "0 2 30 2 *"):  # they parse, and no month has the date
        with pytest.raises(ConfigError, match=re.escape(f"--ablate-cron '{never}' never fires")):
            schedule_specs(ablate_cron=never)
    for steps in (0, -5):  # scheduled as "train 0 steps" or "-5 steps" each night
        with pytest.raises(ConfigError, match=f"--nightly-steps must be >= 1, got {steps}"):
            schedule_specs(nightly_steps=steps)
    for zone in ("Mars/Olympus", "../etc/passwd", ""):  # Prefect itself takes any name
        with pytest.raises(ConfigError, match="is not a time zone"):
            schedule_specs(timezone=zone)


def test_deployments_carry_the_cron_and_a_module_entrypoint():
    deployments = build_deployments(
        schedule_specs(train_cron="30 1 * * *", timezone="Europe/Paris")
    )
    by_name = {d.name: d for d in deployments}
    nightly = by_name["dapo-nightly-train"]
    (sched,) = nightly.schedules
    assert sched.schedule.cron == "30 1 * * *" and sched.schedule.timezone == "Europe/Paris"
    assert nightly.entrypoint == "flows.pipeline.train_flow"  # importable from any cwd
    assert by_name["dapo-weekly-ablate"].entrypoint == "flows.ablate.ablate_flow"
    assert nightly.parameters["progress"] is False
    for deployment in deployments:  # a run that fires while the last one works is cancelled
        assert deployment.concurrency_limit == 1
        assert deployment.concurrency_options.collision_strategy.value == "CANCEL_NEW"


@pytest.mark.slow
def test_deployments_register_with_the_prefect_api(prefect_harness):
    """What `dapo schedule` registers, read back from the API (serving would block)."""
    from prefect import get_client

    specs = schedule_specs(train_cron="0 3 * * *", nightly_steps=7)
    ids = [d.apply() for d in build_deployments(specs)]
    assert len(ids) == 2
    with get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name("train/dapo-nightly-train")
        weekly = client.read_deployment_by_name("ablate/dapo-weekly-ablate")
    assert [s.schedule.cron for s in nightly.schedules] == ["0 3 * * *"]
    assert nightly.parameters["max_steps"] == 7 and nightly.parameters["run_name"] == "nightly"
    assert [s.schedule.cron for s in weekly.schedules] == ["0 4 * * 0"]
    for deployment in (nightly, weekly):  # one run at a time, on the server
        assert deployment.global_concurrency_limit.limit == 1
        assert deployment.concurrency_options.collision_strategy.value == "CANCEL_NEW"


def test_cli_schedule_dry_run_prints_the_deployments():
    out = CliRunner().invoke(app, ["schedule", "--dry-run", "--nightly-steps", "5"])
    assert out.exit_code == 0, out.output
    assert "train/dapo-nightly-train  cron '0 2 * * *'" in out.output
    assert "ablate/dapo-weekly-ablate  cron '0 4 * * 0'" in out.output
    assert '"max_steps": 5' in out.output


def test_cli_schedule_needs_a_prefect_server(monkeypatch):
    import flows.serve
    import flows.server

    monkeypatch.setattr(flows.serve, "api_url", lambda: None)
    monkeypatch.setattr(flows.server, "running_server", lambda home: None)
    monkeypatch.setattr(flows.serve, "serve_deployments", lambda d: pytest.fail("served"))
    out = CliRunner().invoke(app, ["schedule"])
    assert out.exit_code == 2
    assert "dapo server start" in out.output and "PREFECT_API_URL" in out.output
    bad = CliRunner().invoke(app, ["schedule", "--train-cron", "nightly"])
    assert bad.exit_code == 2 and "not a cron expression" in bad.output
    # a name the registry refuses would fail every night, after the training
    name = CliRunner().invoke(app, ["schedule", "--dry-run", "--promote", "team/policy"])
    assert name.exit_code == 2 and "--promote 'team/policy'" in name.output
    run = CliRunner().invoke(app, ["schedule", "--dry-run", "--run-name", "../nightly"])
    assert run.exit_code == 2 and "--run-name '../nightly'" in run.output


def test_the_nightly_train_promotes_a_completed_tracked_run_only(monkeypatch, caplog):
    """``stages.train(promote=NAME)`` (what ``dapo schedule --promote`` passes) hands a completed,
    tracked run to the rule (``registry.promote_if_better``, tested in test_registry.py); a run
    not complete yet, or not tracked, is not offered, and the log says why."""
    from flows import stages
    from tasks.tracking import registry
    from tasks.training.task import TrainSummary

    caplog.set_level(logging.INFO, logger="dapo")
    offered = []

    class Kept:
        def describe(self, name, alias):
            return f"kept {name}@{alias}"

    monkeypatch.setattr(registry, "promote_if_better", lambda run, name, uri: offered.append(
        (run, name)) or Kept())  # fmt: skip

    def summary(complete: bool, run_id: str | None) -> TrainSummary:
        return TrainSummary("d", "d/final", 2, complete, 0.0, run_id, {}, 0)

    for outcome in (summary(False, "r1"), summary(True, None), summary(True, "r2")):
        monkeypatch.setattr(stages, "train_config", lambda *a, o=outcome, **k: o)
        stages.train(overrides=["train.steps=2"], run_dir="/tmp/x", promote="nightly-x")
    assert offered == [("r2", "nightly-x")]
    assert "not yet" in caplog.text and "not tracked" in caplog.text
    assert "kept nightly-x@champion" in caplog.text


def test_asyncios_cancelled_callbacks_are_not_logged_as_errors():
    """Stopping the runner on Python 3.11 logged a cancelled connection task as an error with
    two call stacks; a cancelled task is how a stop goes, so that record is dropped alone."""
    import asyncio

    from flows.serve import _DropCancelled

    def record(exc: BaseException) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, "", 0, "Exception in callback", (),
                                 (type(exc), exc, None))  # fmt: skip

    assert not _DropCancelled().filter(record(asyncio.CancelledError()))
    assert _DropCancelled().filter(record(RuntimeError("a real one")))
    plain = logging.LogRecord("asyncio", logging.ERROR, "", 0, "no exception", (), None)
    assert _DropCancelled().filter(plain)


SERVING = """
import signal, subprocess, sys, time
def terminate(*_):  # the command's SIGTERM handler (flows.commands.base._terminate)
    raise KeyboardInterrupt
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job's is ignored
signal.signal(signal.SIGTERM, terminate)
from flows.serve import _runs_first
from tasks.signals import replaced_handlers
# a scheduled flow run: it takes a while to stop cleanly
run = subprocess.Popen([sys.executable, "-c", '''
import signal, sys, time
def stop(signum, frame):
    time.sleep(1.5)  # ends its MLflow run, says where it stopped
    sys.exit(signum)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
print("run ready", flush=True)
time.sleep(60)
'''], stdout=subprocess.PIPE, text=True)
run.stdout.readline()
stopped = []
try:
    with replaced_handlers(lambda previous: _runs_first(previous, stopped)):
        print("serving", flush=True)
        time.sleep(60)
except KeyboardInterrupt:
    print("runner stopped; the run had exited with", run.poll(), "stops", len(stopped))
"""


@pytest.mark.parametrize("how, with_run", [("ctrl-c", True), ("ctrl-c", False), ("sigterm", True)])
def test_a_stop_lets_a_scheduled_run_stop_itself_before_the_runner_stops(how, with_run):
    """Prefect's runner, stopped, SIGKILLs its flow-run processes: a nightly run cut off so
    ended CRASHED "killed outright", without its line on where it stopped. The runner now stops
    only once the run has stopped itself; with no run at work it stops at once. A terminal's
    Ctrl-C reaches the run itself; a SIGTERM to the command alone (``kill PID``) is passed on."""
    import os
    import signal
    import subprocess
    import sys
    import time

    # no run at work: killed and reaped (one killed but still exiting counted as at work)
    no_run = SERVING.replace("run.stdout.readline()", "run.kill(); run.wait()")
    script = SERVING if with_run else no_run
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        assert proc.stdout.readline() == "serving\n"
        sent = time.monotonic()
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal does
        else:
            os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    if not with_run:
        assert "the run had exited with -9 stops 1" in out, out  # no wait for a run
        return
    code = signal.SIGINT if how == "ctrl-c" else signal.SIGTERM
    # the signal again from the waiting thread (2 stops), once the run had stopped itself
    assert f"the run had exited with {int(code)} stops 2" in out, out
    assert took >= 1.5


@pytest.mark.slow
def test_the_runner_takes_our_sigterm_handler_and_says_which_runs_were_cut_off(prefect_harness):
    """``serve_deployments`` gives the runner our SIGTERM handler through ``handle_sigterm``,
    which ``Runner.start`` installs; and after a stop, ``cut_off_runs`` names the runs of the
    deployments that were at work when it came, with the line each ended with."""
    import asyncio
    import datetime
    import signal

    from prefect import get_client
    from prefect.runner import Runner
    from prefect.states import Cancelled, Completed, Running

    from flows.ablate import stopped_message
    from flows.serve import cut_off_runs

    def ours(signum, frame):
        pass

    before = signal.getsignal(signal.SIGTERM)
    runner = Runner(pause_on_shutdown=False)
    runner.handle_sigterm = ours
    try:
        asyncio.run(runner.start(run_once=True, webserver=False))
        assert signal.getsignal(signal.SIGTERM) is ours
    finally:
        signal.signal(signal.SIGTERM, before)

    def now():
        return datetime.datetime.now(datetime.timezone.utc)

    (nightly,) = build_deployments(schedule_specs(ablate_cron=""))
    deployment = nightly.apply()
    began = now()
    with get_client(sync_client=True) as client:

        def run(*states):  # fmt: skip
            flow_run = client.create_flow_run_from_deployment(deployment)
            for state in states:
                client.set_flow_run_state(flow_run.id, state, force=True)
            return flow_run.name

        run(Running(), Cancelled(message="cancelled from the UI, before the stop"))
        stopped = now()
        cut = run(Running(), Cancelled(message="stopped after step 8 of 40; Continue with: x"))
        working = run(Running())
        run(Running(), Completed())
        sweep = run(Running(), Cancelled(message=stopped_message("w1", 1, 2, None, KeyError())))
    lines = cut_off_runs([nightly.name], began, stopped)
    assert sorted(lines) == sorted([
        f"the scheduled run {cut!r} was cut off (cancelled): stopped after step 8 of 40; "
        "Continue with: x",
        f"the scheduled run {working!r} was cut off (running): it left no line on where it stopped",
        # a sweep's "the same command" is not dapo schedule
        f"the scheduled run {sweep!r} was cut off (cancelled): sweep w1 stopped with 1 of 2 runs "
        "finished; to resume, run dapo ablate with the schedule's -c and -S and --run-name w1",
    ])  # fmt: skip
    assert cut_off_runs([nightly.name], began, None) == []  # no stop, nothing cut off


@pytest.mark.slow
def test_a_killed_schedule_leaves_its_deployments_paused(prefect_harness, tmp_path):
    """SIGKILL of `dapo schedule` (the OOM killer) left its deployments unpaused: the server went
    on scheduling runs that nobody served. Its reaper now pauses them, as the runner does when
    it stops."""
    import os
    import subprocess
    import sys
    import time

    from prefect import get_client
    from prefect.settings import PREFECT_API_URL

    (nightly,) = build_deployments(schedule_specs(ablate_cron=""))
    deployment_id = str(nightly.apply())
    with get_client(sync_client=True) as client:
        client.resume_deployment(deployment_id)
        assert not client.read_deployment(deployment_id).paused
    script = (
        "import sys, time\n"
        "from flows.serve import _paused_if_killed\n"
        "with _paused_if_killed() as schedules:\n"
        "    schedules.registered(sys.argv[1])\n"
        "    schedules.served = True\n"
        "    print('serving', flush=True)\n"
        "    time.sleep(600)\n"
    )
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    serving = subprocess.Popen(
        [sys.executable, "-c", script, deployment_id], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert serving.stdout.readline() == "serving\n"
        serving.kill()  # SIGKILL: no handler, no finally
        serving.wait(timeout=30)
        deadline = time.monotonic() + 60
        with get_client(sync_client=True) as client:
            while not client.read_deployment(deployment_id).paused:
                assert time.monotonic() < deadline, "the deployment was left unpaused"
                time.sleep(0.5)
    finally:
        if serving.poll() is None:
            serving.kill()
        with get_client(sync_client=True) as client:  # as the other tests found it
            client.resume_deployment(deployment_id)


@pytest.mark.slow
def test_a_stop_before_the_runner_serves_pauses_what_was_registered(prefect_harness):
    """A Ctrl-C while the deployments were registered ended the block before the runner started,
    so nothing paused them, and the command said the schedules were paused."""
    from prefect import get_client

    import flows.serve
    from flows.serve import _paused_if_killed

    (nightly,) = build_deployments(schedule_specs(ablate_cron=""))
    deployment_id = str(nightly.apply())
    accepted = []
    pause = flows.serve.pause_deployments
    with (
        get_client(sync_client=True) as client,
        mock.patch.object(
            flows.serve, "pause_deployments", lambda *a: accepted.append(pause(*a)) or 1
        ),
    ):
        client.resume_deployment(deployment_id)
        try:
            with _paused_if_killed() as schedules:
                schedules.registered(deployment_id)  # then stopped: the runner never started
            assert accepted == [1], "the server did not accept the pause"
            assert client.read_deployment(deployment_id).paused
        finally:
            client.resume_deployment(deployment_id)  # as the other tests found it


def test_deployments_the_server_would_not_pause_are_named_in_a_warning(monkeypatch, capsys):
    import flows.serve

    monkeypatch.setattr(flows.serve, "pause_deployments", lambda api, *ids: 0)  # server away
    monkeypatch.setattr(flows.serve.lifetime, "last_words", lambda key, argv: None)
    monkeypatch.setattr(flows.serve.lifetime, "take_back", lambda key: None)
    with flows.serve._paused_if_killed() as schedules:
        schedules.registered("d1")
        schedules.registered("d2")
    said = capsys.readouterr().err
    assert said.startswith("warning: 2 of the deployments registered (ids d1, d2) could not")
    assert "prefect deployment schedule pause FLOW/DEPLOYMENT --all" in said
