"""The project's long-lived Prefect server (`dapo server start`, issue 26 item 1): commands find
it and use it instead of starting a temporary server each, it outlives them, and `dapo server
stop` leaves nothing running."""

import json
import os
import subprocess
import sys

import pytest

from flows import server as srv
from tasks.params import REPO_ROOT


def _dapo(*args, env):
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_a_started_server_is_used_by_commands_and_stopped_whole(tmp_path, flow_cfg, prefect_home):
    home = prefect_home
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(home), HF_HUB_OFFLINE="1", DO_NOT_TRACK="true")
    assert srv.running_server(home) is None
    port = srv.free_port()
    started = _dapo("server", "start", "--port", str(port), env=env)
    assert started.returncode == 0, started.stderr
    url = f"http://127.0.0.1:{port}/api"
    assert f"UI http://127.0.0.1:{port};" in started.stderr
    assert srv.running_server(home) == url
    pid = json.loads((home / "dapo-server.json").read_text())["pid"]
    try:
        again = _dapo("server", "start", "--port", str(srv.free_port()), env=env)
        assert "already running" in again.stderr and srv.running_server(home) == url
        # a command reports its flow run there, and the server outlives it
        params = tmp_path / "params.json"
        params.write_text(json.dumps(flow_cfg.to_dict()))
        train = _dapo(
            "train", "--no-track", "--params", str(params), "--run-dir", str(tmp_path / "run"),
            "-S", "train.steps=1", env=env,
        )  # fmt: skip
        assert train.returncode == 0, train.stderr[-2000:]
        assert f"View at http://127.0.0.1:{port}/runs/flow-run/" in train.stderr
        assert not (home / "logs" / "prefect-server.log").exists()  # no temporary server
        assert srv.running_server(home) == url
    finally:
        stopped = _dapo("server", "stop", env=env)
    assert "stopped" in stopped.stderr and srv.running_server(home) is None
    with pytest.raises(ProcessLookupError):  # its whole session is gone
        os.killpg(pid, 0)
    assert not (home / "dapo-server.json").exists()
    assert "no Prefect server was running" in _dapo("server", "stop", env=env).stderr


def test_a_torn_or_stale_record_means_no_server(tmp_path):
    """A record a killed `dapo server start` left half-written, or one whose server is gone, is
    no server: commands start their own."""
    (tmp_path / "dapo-server.json").write_text('{"url": ')
    assert srv.running_server(tmp_path) is None
    port = srv.free_port()  # nothing listens there
    (tmp_path / "dapo-server.json").write_text(json.dumps({"url": f"http://127.0.0.1:{port}/api"}))
    assert srv.running_server(tmp_path) is None
    assert not srv.stop_server(tmp_path)  # no pid: nothing to stop, the record goes
    assert not (tmp_path / "dapo-server.json").exists()
