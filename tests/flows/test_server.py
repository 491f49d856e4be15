"""The project's long-lived Prefect server (`dapo server start`, issue 26 item 1): commands find
it and use it instead of starting a temporary server each, it outlives them, and `dapo server
stop` leaves nothing running."""

import json
import os
import subprocess
import sys
import urllib.request

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
def test_a_started_server_is_used_by_commands_and_stopped_whole(
    tmp_path, flow_cfg, prefect_home, fresh_mlflow_uri
):
    """`dapo server start`: commands report their flow runs there (no temporary server), and two
    `dapo ablate` started at once on a one-slot concurrency limit (issue 45) train one after the
    other; `dapo server stop` ends the server's whole session."""
    home = prefect_home
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(home), HF_HUB_OFFLINE="1", DO_NOT_TRACK="true")
    env["MLFLOW_TRACKING_URI"] = fresh_mlflow_uri
    assert srv.running_server(home) is None
    port = srv.free_port()
    started = _dapo("server", "start", "--port", str(port), env=env)
    assert started.returncode == 0, started.stderr
    url = f"http://127.0.0.1:{port}/api"
    assert f"UI http://127.0.0.1:{port};" in started.stderr
    assert srv.running_server(home) == url
    pid = json.loads((home / "dapo-server.json").read_text())["pid"]
    sweeps: list[subprocess.Popen] = []
    try:
        other = srv.free_port()
        again = _dapo("server", "start", "--port", str(other), env=env)
        assert "already running" in again.stderr and srv.running_server(home) == url
        assert f"(not on port {other}: `dapo server stop` first to move it)" in again.stderr
        # two sweeps report their flow runs there, and their trainings share one slot
        _post(url + "/v2/concurrency_limits/", {"name": "one-gpu", "limit": 1})
        params = tmp_path / "params.json"
        params.write_text(json.dumps(flow_cfg.to_dict()))
        runs, logs = tmp_path / "runs", [tmp_path / "sweep-a.log", tmp_path / "sweep-b.log"]
        for log in logs:  # files, not pipes: a full pipe would stall its sweep holding the slot
            with log.open("w") as out:
                sweeps.append(
                    subprocess.Popen(
                        [
                            *(sys.executable, "-m", "flows.cli", "ablate", "--params", str(params)),
                            *("--variants", "grpo", "--seeds", "0", "--run-name", log.stem),
                            *("--no-curate", "-S", "train.concurrency_limit=one-gpu"),
                            *("-S", f"train.out_dir={runs}"),
                        ],
                        cwd=REPO_ROOT,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
        codes = [p.wait(timeout=300) for p in sweeps]
        outs = [log.read_text() for log in logs]
        assert codes == [0, 0], [o[-2000:] for o in outs]
        assert all(f"View at http://127.0.0.1:{port}/runs/flow-run/" in o for o in outs)
        assert not (home / "logs" / "prefect-server.log").exists()  # no temporary server
        # a run's training begins (its config written) only once the other's has ended (its
        # final policy written): one slot, one training at a time
        spans = sorted(
            (d.joinpath("config.json").stat().st_mtime, d.joinpath("final").stat().st_mtime)
            for d in runs.glob("sweep-*/grpo/seed0")
        )
        assert len(spans) == 2 and spans[1][0] >= spans[0][1], spans
        assert srv.running_server(home) == url
    finally:
        for p in sweeps:
            if p.poll() is None:
                p.kill()
                p.wait()
        stopped = _dapo("server", "stop", env=env)
    assert "stopped" in stopped.stderr and srv.running_server(home) is None
    with pytest.raises(ProcessLookupError):  # its whole session is gone
        os.killpg(pid, 0)
    assert not (home / "dapo-server.json").exists()
    assert "no Prefect server was running" in _dapo("server", "stop", env=env).stderr


def _post(url: str, body: dict) -> None:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    urllib.request.urlopen(request, timeout=30).close()


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


@pytest.mark.parametrize(
    "args",
    [
        ["server", "start", "--port", "99999"],
        ["ui", "--port", "0"],
        ["dpo", "train", "--prompts", "0"],
        ["preflight", "--prompts", "-3"],
        ["preflight", "--prompts", "0"],
        ["pairs", "mine", "--per-group", "0"],
        ["pipeline", "--max-steps", "-1"],
    ],
    ids=lambda args: " ".join(args),
)
def test_an_out_of_range_option_is_refused_before_anything_starts(tmp_path, args):
    """A port outside 1-65535 or a count below 1 is a usage error (exit 2) naming the option,
    before any server starts or anything is written, in one line (Typer's was a box)."""
    from typer.testing import CliRunner

    from flows.cli import app

    out = CliRunner().invoke(app, args, env={"PREFECT_HOME": str(tmp_path)})
    assert out.exit_code == 2, out.output
    assert out.output.startswith(f"error: Invalid value for '{args[-2]}'"), out.output
    assert out.output.count("\n") == 1 and out.output.rstrip().endswith(" --help)"), out.output
    assert srv.running_server(tmp_path) is None and not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["variants", "-c", "x"], "error: No such option: -c (see: dapo variants --help)"),
        (["nope"], "error: No such command 'nope'. (see: dapo --help)"),
        (["server"], "error: Missing command. (see: dapo server --help)"),
        # what the user typed is not read as Rich markup (a closing tag crashed the message)
        (["x[/]"], "error: No such command 'x[/]'. (see: dapo --help)"),
        (
            ["config", "-S", "train.steps=[/]"],
            "error: override -S train.steps=[/]: 'train.steps' must be int, got '[/]'",
        ),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_a_usage_error_is_one_line_naming_the_help_to_read(args, said):
    from typer.testing import CliRunner

    from flows.cli import app

    out = CliRunner().invoke(app, args, prog_name="dapo")
    assert (out.exit_code, out.output) == (2, said + "\n")


def test_stop_with_a_stale_record_signals_nothing(tmp_path):
    """A server killed -9 leaves its record; its pid may be another process's by now, which
    `dapo server stop` must not kill."""
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        home = tmp_path / "prefect"
        home.mkdir()
        record = {"url": "http://127.0.0.1:9/api", "pid": other.pid}
        srv._record(home).write_text(json.dumps(record))
        assert srv.stop_server(home) is False
        assert other.poll() is None and not srv._record(home).exists()
    finally:
        other.kill()
        other.wait()


@pytest.mark.slow
def test_a_server_start_killed_before_the_server_answers_leaves_no_server(tmp_path):
    """`dapo server start` SIGKILLed during start-up left a server no record named: `server
    status` and `server stop` said none ran, and `server start` found its port in use. Until the
    record is written the server is the command's helper, which its reaper stops."""
    import signal
    import time

    from tasks.lifetime import alive, descendants

    home = tmp_path / "prefect"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(home), DO_NOT_TRACK="true")
    command = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "server", "start", "--port", str(srv.free_port())],
        cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline, servers = time.monotonic() + 120, []
    while not servers:  # the server process started, not answering yet
        assert time.monotonic() < deadline and command.poll() is None
        servers = [p for p in descendants([command.pid]) if b"uvicorn" in _cmdline(p)]
        time.sleep(0.05)
    command.send_signal(signal.SIGKILL)
    command.wait()
    deadline = time.monotonic() + 60
    try:
        while alive(servers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(servers)
        assert srv.running_server(home) is None
    finally:
        for pid in alive(servers):
            os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> bytes:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return b""
