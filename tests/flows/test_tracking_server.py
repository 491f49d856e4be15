"""Runs read back through a real MLflow server's REST API, `dapo ui`, and `dapo reproduce`."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from typer.testing import CliRunner

from flows.cli import app
from tasks.data import version
from tasks.tracking import provenance, registry, store

SERVER_START_TIMEOUT_S = 90


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(base: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(
        base + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


@pytest.fixture
def mlflow_server(flows_env, pipeline_run, tmp_path):
    """`mlflow server` on the session's store, on a free port; killed at the end."""
    port = _free_port()
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", flows_env]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    t0 = time.monotonic()
    log = (tmp_path / "mlflow-server.log").open("w")  # a file: a full pipe would block it
    proc = subprocess.Popen(
        cmd,
        env=store.mlflow_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the workers go down with it
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                text = (tmp_path / "mlflow-server.log").read_text()[-2000:]
                pytest.fail(f"mlflow server exited: {text}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not answer within {SERVER_START_TIMEOUT_S}s")
            time.sleep(0.5)
        print(f"mlflow server answered after {time.monotonic() - t0:.1f}s")
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.mark.slow
def test_runs_read_back_through_the_rest_api(mlflow_server, pipeline_run, flow_cfg):
    exps = _post(mlflow_server, "/api/2.0/mlflow/experiments/search", {"max_results": 100})
    by_name = {e["name"]: e for e in exps["experiments"]}
    exp = by_name["dapo-pipeline"]
    assert exp["artifact_location"].endswith("/artifacts/dapo-pipeline")  # beside the db
    found = _post(
        mlflow_server,
        "/api/2.0/mlflow/runs/search",
        {
            "experiment_ids": [exp["experiment_id"]],
            "filter": f"tags.`prefect.flow_run_id` = '{pipeline_run['flow_run_id']}'",
        },
    )
    (run,) = found["runs"]
    assert run["info"]["run_id"] == pipeline_run["train"].mlflow_run_id
    assert run["info"]["status"] == "FINISHED"
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params["algo.loss.eps_low"] == "0.2" and params["rollout.group_size"] == "4"
    assert params["train.steps"] == str(flow_cfg.train.steps)
    metrics = {m["key"]: m for m in run["data"]["metrics"]}
    assert metrics["eval/avg_at_k"]["step"] == flow_cfg.train.steps
    assert metrics["train/acc_mean"]["step"] == flow_cfg.train.steps  # the latest value
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert tags["data.version"].startswith("generated:synthetic:arith@")
    assert tags["dapo.flow"] == "pipeline"
    assert {"git.commit", "variant", "seed", "prefect.flow_run_id"} <= set(tags)
    query = urllib.parse.urlencode({"run_id": run["info"]["run_id"], "metric_key": "train/loss"})
    url = f"{mlflow_server}/api/2.0/mlflow/metrics/get-history?{query}"
    with urllib.request.urlopen(url, timeout=30) as r:
        history = json.loads(r.read())["metrics"]
    assert sorted(m["step"] for m in history) == list(range(1, flow_cfg.train.steps + 1))


@pytest.mark.slow
def test_the_ui_reads_datasets_source_models_and_the_registry(
    mlflow_server, pipeline_run, flows_env
):
    """What the MLflow UI's pages fetch (its ``ajax-api`` calls, no browser here): the runs
    table's Dataset, Source and Model columns, the Models page, and the registry's page."""
    with urllib.request.urlopen(mlflow_server + "/", timeout=30) as r:
        assert r.status == 200 and b"<html" in r.read(2000).lower()  # the UI itself is served
    exps = _post(mlflow_server, "/ajax-api/2.0/mlflow/experiments/search", {"max_results": 100})
    exp_id = {e["name"]: e for e in exps["experiments"]}["dapo-pipeline"]["experiment_id"]
    found = _post(
        mlflow_server,
        "/ajax-api/2.0/mlflow/runs/search",
        {
            "experiment_ids": [exp_id],
            "filter": f"tags.`prefect.flow_run_id` = '{pipeline_run['flow_run_id']}'",
        },
    )
    (run,) = found["runs"]
    contexts = {
        tag["value"]
        for d in run["inputs"]["dataset_inputs"]
        for tag in d["tags"]
        if tag["key"] == "mlflow.data.context"
    }
    assert {"training", "validation", "evaluation"} <= contexts  # the Dataset column
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert tags["mlflow.source.name"] and tags["mlflow.source.type"]  # the Source column
    (output,) = run["outputs"]["model_outputs"]  # the Model column
    models = _post(
        mlflow_server, "/ajax-api/2.0/mlflow/logged-models/search", {"experiment_ids": [exp_id]}
    )
    assert output["model_id"] in {m["info"]["model_id"] for m in models["models"]}  # Models page
    registered = registry.register(run["info"]["run_id"], "ui-check", uri=flows_env)
    url = f"{mlflow_server}/ajax-api/2.0/mlflow/registered-models/search?max_results=100"
    with urllib.request.urlopen(url, timeout=30) as r:
        listed = json.loads(r.read())
    (entry,) = [m for m in listed["registered_models"] if m["name"] == "ui-check"]
    assert {a["alias"]: a["version"] for a in entry["aliases"]} == {"champion": registered.version}


def test_cli_ui_prints_the_url_and_the_store(flows_env):
    out = CliRunner().invoke(app, ["ui", "--print-only", "--port", "5123"])
    assert out.exit_code == 0, out.output
    assert "http://127.0.0.1:5123" in out.output
    assert f"--backend-store-uri {flows_env}" in out.output and "mlflow ui" in out.output


def test_cli_ui_refuses_a_host_or_port_it_cannot_listen_on_before_printing_a_url(flows_env):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for host, p in (("bogus.invalid", 5123), ("8.8.8.8", 5123), ("127.0.0.1", port)):
            out = CliRunner().invoke(app, ["ui", "--host", host, "--port", str(p)])
            assert out.exit_code == 2 and f"cannot serve the UI on {host}:{p}" in out.output
            assert "http://" not in out.output  # no address printed as if it were served


@pytest.mark.slow
def test_reproduce_check_warns_on_data_version_mismatch(pipeline_run, monkeypatch):
    run_id = pipeline_run["train"].mlflow_run_id
    original = store.read_run(run_id)
    monkeypatch.setattr(provenance, "git_commit", lambda root=None: original["tags"]["git.commit"])
    same = CliRunner().invoke(app, ["reproduce", run_id, "--check-only"])
    assert same.exit_code == 0, same.output
    assert "match" in same.output
    # A generated task read no DVC output: another lock is no difference for it ...
    monkeypatch.setattr(version, "data_version", lambda lock=None: "f" * 32)
    other_lock = CliRunner().invoke(app, ["reproduce", run_id, "--check-only"])
    assert other_lock.exit_code == 0 and "data version differs" not in other_lock.output
    # ... but for a run on DVC's curated data it is (and --strict refuses to re-run it).
    curated = {**original, "tags": {**original["tags"], "data.version": "a" * 32}}
    monkeypatch.setattr(store, "read_run", lambda run_id, uri=None: curated)
    changed = CliRunner().invoke(app, ["reproduce", run_id, "--check-only"])
    assert changed.exit_code == 1
    assert "data version differs" in changed.output and "dvc checkout" in changed.output
    strict = CliRunner().invoke(app, ["reproduce", run_id, "--strict"])
    assert strict.exit_code == 2 and "not reproducible" in strict.output
    monkeypatch.undo()
    monkeypatch.setattr(provenance, "git_commit", lambda root=None: original["tags"]["git.commit"])
    # The starting model is compared too: a model built by other code differs.
    assert original["tags"]["model.digest"]
    rebuilt = {**original, "tags": {**original["tags"], "model.digest": "sha256:" + "0" * 16}}
    monkeypatch.setattr(store, "read_run", lambda run_id, uri=None: rebuilt)
    other_model = CliRunner().invoke(app, ["reproduce", run_id, "--check-only"])
    assert other_model.exit_code == 1 and "starting model differs" in other_model.output
    monkeypatch.undo()
    monkeypatch.setattr(provenance, "git_commit", lambda root=None: original["tags"]["git.commit"])
    # The problems are compared by content (a config that selects other problems).
    import dataclasses

    from tasks.data import splits as splits_module

    assert original["tags"]["data.train_digest"] and original["tags"]["data.val_digest"]
    real = splits_module.splits

    def one_fewer(cfg):
        parts = real(cfg)
        return dataclasses.replace(parts, train=parts.train[:-1])

    monkeypatch.setattr(splits_module, "splits", one_fewer)
    fewer = CliRunner().invoke(app, ["reproduce", run_id, "--check-only"])
    assert fewer.exit_code == 1 and "training problems differ" in " ".join(fewer.output.split())
    missing = CliRunner().invoke(app, ["reproduce", "0123456789abcdef", "--check-only"])
    assert missing.exit_code == 2 and "not in the tracking store" in missing.output


@pytest.mark.slow
def test_reproduce_reruns_from_the_logged_config(pipeline_run, flow_cfg):
    from flows.reproduce import reproduce_run

    run_id = pipeline_run["train"].mlflow_run_id
    out = reproduce_run(run_id, run_name="repro-test", progress=False)
    new = out["result"]["train"]
    assert new.mlflow_run_id != run_id and new.steps == pipeline_run["train"].steps
    info = store.read_run(new.mlflow_run_id)
    assert info["tags"]["reproduces"] == run_id
    assert info["params"] == store.read_run(run_id)["params"]  # the same resolved config
    # the embedded default is deterministic: the same evaluation result
    before = pipeline_run["evaluate"].metrics["eval/avg_at_k"]
    assert out["result"]["evaluate"].metrics["eval/avg_at_k"] == before


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


@pytest.mark.slow
def test_dapo_ui_stops_its_server_and_workers_on_sigterm(flows_env, tmp_path):
    """SIGTERM to `dapo ui` takes the MLflow server and all its workers down: the port is free
    again, and nothing of the server's process group is left."""
    port = _free_port()
    log = (tmp_path / "ui.log").open("w")
    cmd = [sys.executable, "-m", "flows.cli", "ui", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/health"
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    ready = f"ready: http://127.0.0.1:{port} (Ctrl-C stops it)"
    try:
        # it says when the UI answers: it printed its URL some 10 s before it did
        while ready not in (tmp_path / "ui.log").read_text():
            assert proc.poll() is None, (tmp_path / "ui.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "dapo ui did not start"
            time.sleep(0.1)
        assert _answers(url)
        children = subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True
        ).stdout.split()
        assert children  # the server, in a process group of its own
        # MLflow's launcher and one uvicorn worker (beside the reaper): no pool of 4 workers, no
        # GenAI job consumers
        import psutil

        serving = [
            " ".join(c.cmdline()[1:4])
            for c in psutil.Process(proc.pid).children(recursive=True)
            if "lifetime.py" not in " ".join(c.cmdline())
        ]
        assert len(serving) == 2, serving
        # `dapo ui` itself waits as a process of the standard library (tasks.tracking.ui_host):
        # it gave up what the CLI had imported (torch alone is some 300 MB resident)
        host = psutil.Process(proc.pid)
        assert host.cmdline()[2].endswith("tasks/tracking/ui_host.py"), host.cmdline()
        assert host.memory_info().rss < 100 * 2**20, host.memory_info()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        group = int(children[0])
        for _ in range(20):  # workers may take a moment to exit after the leader
            if subprocess.run(["pgrep", "-g", str(group)], capture_output=True).returncode:
                break
            time.sleep(0.5)
        assert subprocess.run(["pgrep", "-g", str(group)], capture_output=True).returncode == 1
        assert not _answers(url)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()


def _serve(backend: str, port: int, log) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    proc = subprocess.Popen(
        cmd, env=store.mlflow_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while True:
        assert proc.poll() is None, "mlflow server exited at start"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            assert time.monotonic() < deadline, "mlflow server did not start"
            time.sleep(0.5)


@pytest.mark.slow
def test_a_tracking_server_away_mid_run_is_caught_up_when_back(
    tiny_cfg, tmp_path, monkeypatch, fresh_mlflow_uri
):
    """Issue 23, item 4: the server goes away (killed) while a run logs, and comes back on the
    same address: the steps logged meanwhile were buffered, and every step reaches it once."""
    from tasks.tracking import tracker as tracking
    from tasks.tracking.tracker import Tracker

    for key in tracking.HTTP_DEFAULTS:
        monkeypatch.setenv(key, {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}.get(key, "5"))
    backend, port = fresh_mlflow_uri, _free_port()
    uri = f"http://127.0.0.1:{port}"
    with (tmp_path / "server.log").open("w") as log:
        server = _serve(backend, port, log)
        try:
            t = Tracker(tiny_cfg, "train", uri=uri, flush_steps=1, retry_after_s=0.0)
            run_id = t.start_run("away and back", log_config=False)
            assert run_id
            t.log_metrics({"train/loss": 1.0}, 1)
            os.killpg(server.pid, signal.SIGKILL)  # the server goes away
            server.wait()
            t.log_metrics({"train/loss": 2.0}, 2)  # fail: kept in the buffer
            t.log_metrics({"train/loss": 3.0}, 3)
            assert t.failures >= 1 and t.active  # the run goes on
            server = _serve(backend, port, log)  # back, on the same address
            t.log_metrics({"train/loss": 4.0}, 4)
            t.end()
            history = store.metric_history(run_id, "train/loss", uri)
            assert history == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]
            assert store.read_run(run_id, uri)["status"] == "FINISHED"
        finally:
            os.killpg(server.pid, signal.SIGKILL)
