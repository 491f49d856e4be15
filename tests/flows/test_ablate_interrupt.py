"""``dapo ablate --workers N`` as real processes, real signals, the tiny model: two local workers
share a sweep and a child killed mid-run is resubmitted; a stopped sweep's flow runs are cancelled
while its server is up, nothing it started is left running, and the next sweep on the same Prefect
home runs only its own runs (issue 30, item 3)."""

import contextlib
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.interrupts import processes_of
from dapo_core.config_loader import resolve
from tasks.tracking import store


def _cli_env(tmp_path, uri):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), HF_HUB_OFFLINE="1")
    env["MLFLOW_TRACKING_URI"] = uri
    return env


def _sweep(tmp_path, params, run_name, variants, seeds, uri, log):
    """``dapo ablate --workers 2`` in its own session (as a shell runs a foreground job)."""
    cmd = [
        *(sys.executable, "-m", "flows.cli", "ablate", "--params", str(params)),
        *("--variants", variants, "--seeds", seeds, "--workers", "2"),
        *("--run-name", run_name, "--no-curate"),
    ]
    with log.open("w") as out:
        return subprocess.Popen(
            cmd,
            env=_cli_env(tmp_path, uri),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_for(what, predicate, proc, log, timeout_s):
    deadline = time.monotonic() + timeout_s
    while not (found := predicate()):
        assert proc.poll() is None, (
            f"sweep exited ({proc.returncode}) before {what}:\n" + (log.read_text()[-3000:])
        )
        assert time.monotonic() < deadline, f"no {what} in {timeout_s}s:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
    return found


def _flow_runs(home: Path) -> list[dict]:
    """Every deployment flow run in the Prefect database (the server is stopped by then), with
    whether it ever ran (a RUNNING state in its history)."""
    with sqlite3.connect(f"file:{home / 'prefect.db'}?mode=ro", uri=True) as db:
        rows = db.execute(
            "select id, name, state_type, parameters, tags, exists(select 1 from flow_run_state "
            "where flow_run_id = flow_run.id and type = 'RUNNING') "
            "from flow_run where deployment_id is not null"
        ).fetchall()
    keys = ("id", "name", "state", "parameters", "tags", "ran")
    runs = [dict(zip(keys, r, strict=True)) for r in rows]
    for r in runs:
        r["parameters"], r["tags"] = json.loads(r["parameters"]), json.loads(r["tags"])
    return runs


@pytest.fixture
def leave_nothing_running(tmp_path):
    """Whatever the test asserts, end every process a sweep of this test left behind."""
    yield
    for pid in processes_of(tmp_path / "prefect"):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _submit_foreign_run(url: str, like: dict, run_dir: str) -> str:
    """A run of the ``ablate-run`` deployment on the pool's default queue, as an older sweep
    (or one whose clean-up never ran) would have left: no sweep of ours may execute it."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: url}), get_client(sync_client=True) as c:
        deployment = c.read_deployment_by_name("ablate-run/ablate-run")
        run = c.create_flow_run_from_deployment(
            deployment.id,
            parameters={**like, "run_dir": run_dir, "parent_run_id": None},
            name="leftover seed0",
            tags=["leftover"],
        )
    return str(run.id)


@pytest.mark.slow
def test_an_interrupted_sweep_cancels_its_runs_and_the_next_runs_only_its_own(
    flow_cfg, mlflow_uri, tmp_path, prefect_home, leave_nothing_running
):
    """Ctrl-C once a child trains: every run of the sweep ends CANCELLED, nothing it started is
    left, one line says so; the next sweep on the same Prefect home runs its own runs only, not
    even a run queued on the pool by someone else."""
    home, runs = tmp_path / "prefect", tmp_path / "runs"
    uri = mlflow_uri  # the session's store: a new one takes seconds to create
    # Long enough that no child finishes before the signal; one seed, so no run builds a model.
    long = [
        *("train.steps=2000", "train.max_stalled_steps=0", "eval.every_n_steps=0"),
        f"train.out_dir={runs}",
    ]
    cfg = resolve(flow_cfg.to_dict(), overrides=long)
    params = tmp_path / "params.json"
    params.write_text(json.dumps(cfg.to_dict()))
    four = "grpo,+overlong_filtering,+clip_higher,+overlong_shaping"  # 2 run, 2 wait

    log1 = tmp_path / "sweep1.log"
    first = _sweep(tmp_path, params, "sweep-one", four, "0", uri, log1)
    url = _wait_for("server URL", lambda: _url(log1), first, log1, 150)
    # both running children have logged a training step (so their MLflow runs exist, and both
    # ran: a child a worker has picked up but not started counts as running in the sweep's line)
    steps = _wait_for(
        "two children training",
        lambda: (lambda found: found if len(found) == 2 else [])(
            list(runs.glob("sweep-one/*/seed0/metrics.jsonl"))
        ),
        first,
        log1,
        150,
    )
    (child,) = [r for r in _live_runs(url) if r.parameters["run_dir"] == str(steps[0].parent)]
    foreign = _submit_foreign_run(url, child.parameters, str(tmp_path / "leftover"))
    os.killpg(first.pid, signal.SIGINT)  # Ctrl-C in the sweep's terminal
    cleanup_s, exit_s = _stop_times(first, home)
    out = log1.read_text()
    print(f"sweep one: SIGINT to all else gone {cleanup_s:.1f}s, to exit {exit_s:.1f}s")
    assert first.returncode == 130, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    (line,) = [ln for ln in out.splitlines() if ln.startswith("interrupted")]
    assert "sweep sweep-one stopped" in line and "queued and 2 running" in line, line
    assert "--run-name sweep-one" in line
    # The sweep's server, workers and children's processes are gone, before its exit (within
    # _stop_times' minute: how fast is a figure of `python -m bench.interrupts`).
    assert not processes_of(home), out[-3000:]

    ours = [r for r in _flow_runs(home) if "sweep-one" in r["parameters"]["run_dir"]]
    assert sorted(r["name"] for r in ours) == sorted(f"{v} seed0" for v in four.split(","))
    assert all("sweep:sweep-one" in r["tags"] for r in ours)
    assert {r["state"] for r in ours} == {"CANCELLED"}, [(r["name"], r["state"]) for r in ours]
    assert sum(r["ran"] for r in ours) == 2  # stopped while running; the others never ran
    assert _parent_flow_run_states(home) == ["CANCELLED"]
    parent = [r for r in store.search_runs(cfg, "ablate", uri=uri) if r["name"] == "sweep-one"]
    assert [p["status"] for p in parent] == ["KILLED"]
    children = store.search_runs(
        cfg, "ablate", f"tags.mlflow.parentRunId = '{parent[0]['run_id']}'", uri=uri
    )
    assert children and all(c["status"] == "KILLED" for c in children)

    # The next sweep on the same Prefect home, with the leftover still on the pool's default queue
    params.write_text(json.dumps(resolve(cfg.to_dict(), overrides=["train.steps=1"]).to_dict()))
    log2 = tmp_path / "sweep2.log"
    second = _sweep(tmp_path, params, "sweep-two", "grpo,+overlong_filtering", "0", uri, log2)
    assert second.wait(timeout=300) == 0, log2.read_text()[-3000:]
    assert not processes_of(home)
    after = {r["id"]: r for r in _flow_runs(home)}
    ran = [r for r in after.values() if r["ran"] and r["id"] not in {o["id"] for o in ours}]
    assert sorted(r["name"] for r in ran) == ["+overlong_filtering seed0", "grpo seed0"]
    for r in ran:
        assert r["state"] == "COMPLETED" and "sweep:sweep-two" in r["tags"]
        assert Path(r["parameters"]["run_dir"]).parent.parent.name == "sweep-two"
    assert after[foreign]["state"] == "SCHEDULED" and not after[foreign]["ran"]
    assert not (tmp_path / "leftover").exists()
    assert all(after[r["id"]]["state"] == r["state"] for r in ours)  # sweep one's runs untouched


def _url(log: Path) -> str | None:
    """The API of the sweep's local server, once the command has said where it is."""
    found = re.search(r"flow runs at (http://\S+)", log.read_text())
    return found and f"{found[1]}/api"


def _stop_times(proc: subprocess.Popen, home: Path) -> tuple[float, float]:
    """Seconds from now until every other process of the sweep is gone, and until it exits."""
    t0 = time.monotonic()
    cleanup_s = None
    while proc.poll() is None and time.monotonic() - t0 < 60:
        if cleanup_s is None and set(processes_of(home)) <= {proc.pid}:
            cleanup_s = time.monotonic() - t0
        time.sleep(0.1)
    exit_s = time.monotonic() - t0
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    return (exit_s if cleanup_s is None else cleanup_s), exit_s


def _parent_flow_run_states(home: Path) -> list[str]:
    with sqlite3.connect(f"file:{home / 'prefect.db'}?mode=ro", uri=True) as db:
        rows = db.execute(
            "select flow_run.state_type from flow_run join flow on flow.id = flow_run.flow_id "
            "where flow.name = 'ablate'"
        ).fetchall()
    return [r[0] for r in rows]


def _live_runs(url: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: url}), get_client(sync_client=True) as c:
        return [r for r in c.read_flow_runs() if r.deployment_id]


class _Run:
    def __init__(self, i, state):
        from prefect.states import Cancelled, Cancelling, Running, Scheduled

        self.id = f"run-{i}"
        self.state = {"Scheduled": Scheduled, "Running": Running}[state]()
        self.transitions = {"Scheduled": Cancelled, "Running": Cancelling}[state]


@pytest.mark.parametrize("stopped", ["Cancelled", "Crashed"])
def test_cancel_sweep_ends_queued_runs_and_asks_running_ones_to_stop(monkeypatch, stopped):
    """The server ends a queued run at once (CANCELLED) and a running one through its worker
    (CANCELLING, then CANCELLED): the counts say which, and the wait ends when none is left. A
    running one whose engine took the stop for a crash (CRASHED) is marked CANCELLED."""
    import prefect.client.orchestration
    import prefect.states

    from flows import sweep_pool

    ended = getattr(prefect.states, stopped)

    runs = {r.id: r for r in (_Run(0, "Scheduled"), _Run(1, "Scheduled"), _Run(2, "Running"))}
    proposed, filters = [], []

    class Client:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read_flow_runs(self, **kw):
            filters.append(kw)
            found = [r for r in runs.values() if not r.state.is_final()]
            for r in found:  # the worker has stopped a CANCELLING run by the next look
                if r.state.is_cancelling():
                    r.state = ended()
            return found

        def read_flow_run(self, run_id):
            return runs[run_id]

        def set_flow_run_state(self, run_id, state, force=False):
            proposed.append((run_id, state.type.value, force))
            if force:
                runs[run_id].state = state
            else:
                runs[run_id].state = runs[run_id].transitions()  # the worker stops it

    monkeypatch.setattr(prefect.client.orchestration, "get_client", lambda **kw: Client())
    assert sweep_pool.cancel_sweep("sw", wait_s=30) == (2, 1, 0)  # queued, running, not ended
    asked = [(r, "CANCELLING", False) for r in runs]  # not forced
    settled = [("run-2", "CANCELLED", True)] if stopped == "Crashed" else []
    assert sorted(proposed) == sorted(asked + settled)
    assert all(r.state.is_cancelled() for r in runs.values())
    assert filters[0]["flow_run_filter"].tags.all_ == ["sweep:sw"]  # this sweep's runs only
    assert filters[0]["deployment_filter"].name.any_ == ["ablate-run"]
    assert len(filters) == 3  # one look to find them, then until the running one has ended


@pytest.mark.slow
def test_two_local_workers_share_a_sweep_and_a_child_killed_mid_run_resumes(
    flow_cfg, tmp_path, prefect_home, fresh_mlflow_uri, leave_nothing_running
):
    """`dapo ablate --workers 2`: a local server and two workers; each (variant, seed) is a flow
    run one of them picks up; the parent gathers both from MLflow; nothing is left running.

    In the same sweep (one sweep's start-up, not two), issue 23 item 4: SIGKILL the process
    running one child once it has a checkpoint (a flow run dies as an OOM kill or a node's
    would): its worker reports it crashed, the sweep submits it again, and it resumes from its
    checkpoint; every row ends ok, the child's metrics once per step, its MLflow run FINISHED."""
    runs, uri, steps = tmp_path / "runs", fresh_mlflow_uri, 16
    settings = [f"train.steps={steps}", "train.checkpoint_every=2", "train.max_stalled_steps=0"]
    cfg = resolve(
        flow_cfg.to_dict(), overrides=[*settings, "eval.every_n_steps=0", f"train.out_dir={runs}"]
    )
    params = tmp_path / "params.json"
    params.write_text(json.dumps(cfg.to_dict()))
    log = tmp_path / "sweep.log"
    sweep = _sweep(tmp_path, params, "ablate-pool", "grpo,+overlong_filtering", "0", uri, log)
    checkpoints = _wait_for(
        "a checkpoint",
        lambda: list(runs.glob("ablate-pool/*/seed0/checkpoints/step_*")),
        sweep,
        log,
        240,
    )
    run_dir = checkpoints[0].parent.parent
    writer = json.loads((run_dir / ".lock").read_text())["pid"]  # the process writing the run
    os.kill(writer, signal.SIGKILL)
    assert sweep.wait(timeout=400) == 0, log.read_text()[-3000:]
    out = log.read_text()
    assert "2 runs on 2 local workers" in out
    # its logs reached the server before it stopped: none retried against the stopped one
    assert "Error logging to API" not in out
    # Both workers may race for one run (the server aborts the loser's submission), so count the
    # runs each one actually started: one each, and the killed one once more.
    logs = prefect_home / "logs"
    ran = [(logs / f"worker-{w}.log").read_text().count("Beginning subflow run") for w in (0, 1)]
    assert min(ran) >= 1 and sum(ran) == 3, ran
    # the server and both workers are gone with the command, nor is any flow run's process left
    port = re.search(r"flow runs at http://127\.0\.0\.1:(\d+)", out)[1]
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", int(port)), timeout=2):
        pass
    assert not processes_of(prefect_home)

    import pandas as pd

    assert pd.read_csv(runs / "ablate-pool" / "ablation.csv")["status"].tolist() == ["ok", "ok"]
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))  # each step once
    named = [r for r in _flow_runs(prefect_home) if r["parameters"]["run_dir"] == str(run_dir)]
    assert sorted(r["state"] for r in named) == ["COMPLETED", "CRASHED"]  # killed, then again
    (parent,) = [r for r in store.search_runs(cfg, "ablate", uri=uri) if r["name"] == "ablate-pool"]
    assert parent["status"] == "FINISHED"
    children = store.search_runs(
        cfg, "ablate", f"tags.mlflow.parentRunId = '{parent['run_id']}'", uri=uri
    )
    assert sorted(c["name"] for c in children) == ["+overlong_filtering seed0", "grpo seed0"]
    # one MLflow run each, the resumed one included
    assert all(c["status"] == "FINISHED" and "eval/avg_at_k" in c["metrics"] for c in children)
    arts = set(store.list_artifacts(parent["run_id"], uri=uri))
    assert {"ablation/table.csv", "ablation/mechanisms.csv", "ablation/table.png"} <= arts


class _Server:
    """The Prefect API as ``close_queue`` sees it, and a flow run's process: SIGTERM without its
    worker's cancel intent makes Prefect's engine force the run CRASHED, as it does."""

    def __init__(self, engine_on_sigterm):
        from prefect.states import Running

        self.run = type("FlowRun", (), {"id": "run-0", "parameters": {}, "state": Running()})()
        self.engine_on_sigterm, self.alive, self.history = engine_on_sigterm, True, []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def set_flow_run_state(self, run_id, state, force=False):
        if self.run.state.is_final() and not force:
            return  # the server refuses to leave a final state unforced
        self.run.state = state
        self.history.append(state.type.value)

    def read_flow_run(self, run_id):
        return self.run

    def unfinished(self, *args):
        return [] if self.run.state.is_final() else [self.run]

    def signal(self, run, sig):
        if self.alive and sig == signal.SIGTERM:
            self.alive = False  # it ends its MLflow run and exits, its engine reporting first
            self.set_flow_run_state(run.id, self.engine_on_sigterm(), force=True)
        self.alive = False

    def read_work_queue_by_name(self, *args, **kw):
        from prefect.exceptions import ObjectNotFound

        raise ObjectNotFound(None)


@pytest.mark.parametrize("engine", ["crash", "cancel"])
def test_a_run_the_sweep_stopped_ends_cancelled_even_when_its_engine_reports_a_crash(
    monkeypatch, engine
):
    """The sweep's clean-up SIGTERMs a running child itself; Prefect's engine then forces the
    run CRASHED (no worker announced a cancellation). It ends CANCELLED all the same, and a
    run its engine ended CANCELLED stays so."""
    import prefect.client.orchestration
    from prefect.states import Cancelled, Crashed

    from flows import cluster

    server = _Server({"crash": Crashed, "cancel": Cancelled}[engine])
    monkeypatch.setattr(prefect.client.orchestration, "get_client", lambda **kw: server)
    monkeypatch.setattr(cluster, "unfinished_runs", server.unfinished)
    monkeypatch.setattr(cluster, "_signal_run", server.signal)
    monkeypatch.setattr(cluster, "flow_run_pid", lambda run: 1 if server.alive else None)
    monkeypatch.setattr(cluster, "end_abandoned_run", lambda *a: None)
    cluster.close_queue("pool", "queue")
    reported = {"crash": ["CRASHED", "CANCELLED"], "cancel": ["CANCELLED"]}[engine]
    assert server.history == ["CANCELLING", *reported]
