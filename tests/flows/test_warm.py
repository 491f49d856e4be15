"""The warm process (flows.warm): commands it runs behave as cold ones (output, exit codes,
Ctrl-C), a stale one is never used, and it ends when asked. Real processes, the tiny model."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dapo_core.config_loader import resolve
from flows import warm, warm_server

DAPO = "import sys; sys.argv[0] = 'dapo'; from flows.entry import main; main()"


def test_the_fingerprint_follows_code_and_the_context_import_time_settings(tmp_path):
    package = tmp_path / "pkg"
    (package / "__pycache__").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    env = {"HF_HUB_OFFLINE": "1", "TERM": "xterm"}

    def key(**changes):
        return warm.context_key({**env, **changes})

    before = key()
    assert key(TERM="dumb", SHLVL="3") == before  # not read at import
    assert key(HF_HUB_OFFLINE="0") != before
    assert key(CUDA_VISIBLE_DEVICES="1") != before

    def fp():
        return warm.fingerprint(roots=(package,))

    code = fp()
    (package / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"")
    assert fp() == code
    os.utime(package / "a.py", ns=(1, 1))  # an edit
    assert fp() != code
    edited = fp()
    (package / "b.py").write_text("")
    assert fp() != edited


KEY = "from flows import warm; print(warm.context_key())"


def _key_under(preexec=None) -> str:
    """The context key of a fresh process started as a job would start it."""
    out = subprocess.run(
        [sys.executable, "-c", KEY], capture_output=True, text=True, preexec_fn=preexec, check=True
    )
    return out.stdout.strip()


def test_a_job_s_limits_nice_value_or_groups_give_another_context():
    """What a forked child would take from the warm process instead of the caller: a command
    under other limits (``ulimit -v``, a Slurm step) or another nice value maps to another
    socket, so it never runs in a warm process outside them."""
    import resource

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (64 << 30, resource.RLIM_INFINITY))

    plain = _key_under()
    assert _key_under() == plain  # the same context, the same key
    assert _key_under(limit_memory) != plain
    assert _key_under(lambda: os.nice(5)) != plain
    cgroup = warm.execution_context().get("cgroup")
    assert cgroup is None or cgroup == Path("/proc/self/cgroup").read_text()


def test_warm_processes_of_two_contexts_coexist_and_stop_all_ends_both(warm_dir, monkeypatch):
    import threading

    servers = []
    for key in ("a", "b"):
        monkeypatch.setattr(warm, "context_key", lambda env=None, k=key: k * 40)
        server = warm_server.Server(warm.socket_path(), idle_s=60)
        assert server.bind()
        server.ready()
        thread = threading.Thread(target=server.serve, daemon=True)
        thread.start()
        servers.append((server, thread))
    assert len(list(warm_dir.glob("*/*.sock"))) == 2  # neither took the other's place
    monkeypatch.setattr(warm, "context_key", lambda env=None: "c" * 40)
    assert warm.status(timeout=5) is None  # no warm process for this context
    found = warm.stop_all(timeout=5)
    assert [f["pid"] for f in found] == [os.getpid()] * 2
    for _server, thread in servers:
        thread.join(timeout=10)
        assert not thread.is_alive()
    assert list(warm_dir.glob("*/*.sock")) == []


def test_only_commands_that_import_torch_go_to_the_warm_process(monkeypatch):
    assert warm.routed(["train", "--resume", "x"]) and warm.routed(["evaluate"])
    assert not warm.routed(["config"]) and not warm.routed(["warm", "stop"])
    assert not warm.routed([])
    monkeypatch.setattr(warm, "_connect", lambda timeout=None: pytest.fail("connected"))
    monkeypatch.setenv("DAPO_WARM", "0")
    assert warm.run(["train"]) is None  # turned off: a cold start, no connection tried
    monkeypatch.setenv("DAPO_WARM", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert warm.run(["train"]) is None  # a launcher's rank runs itself


def test_a_socket_directory_others_can_open_is_never_used(tmp_path, monkeypatch):
    """The socket runs code as its owner: a directory another user made (or opened to others)
    means no warm process, neither used nor started."""
    monkeypatch.setenv("DAPO_WARM_DIR", str(tmp_path))
    where = warm.socket_path().parent
    where.mkdir(mode=0o755)
    where.chmod(0o755)  # whatever the umask
    assert warm._connect() is None and warm.start(quiet=True) is None
    assert list(where.iterdir()) == []
    where.chmod(0o700)
    assert warm._private_dir()


def test_a_warm_dir_that_does_not_exist_is_one_line_for_start_and_cold_for_a_command(
    tmp_path, monkeypatch
):
    from dapo_core.errors import PipelineError

    monkeypatch.setenv("DAPO_WARM_DIR", str(tmp_path / "missing"))
    assert warm._connect() is None  # a routed command starts cold
    with pytest.raises(PipelineError, match="is not a directory: create it, or unset"):
        warm.start(quiet=True)
    assert not (tmp_path / "missing").exists()


def test_a_warm_process_that_never_answers_leaves_the_command_to_run_cold(
    warm_dir, monkeypatch, capsys
):
    """A wedged warm process (it accepts, then says nothing) costs a command
    ``ANSWER_TIMEOUT_S``, one line, and a cold run, not a hang."""
    import socket
    import threading

    monkeypatch.setenv("DAPO_WARM", "1")
    monkeypatch.setattr(warm, "ANSWER_TIMEOUT_S", 0.5)
    assert warm._private_dir()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(warm.socket_path()))
    server.listen(1)
    held = []
    threading.Thread(target=lambda: held.append(server.accept()), daemon=True).start()
    try:
        assert warm.run(["train"]) is None
    finally:
        server.close()
    assert "did not answer within 0s, so this command runs cold" in capsys.readouterr().err


def test_an_imported_file_edited_since_makes_the_warm_process_stale(tmp_path, monkeypatch):
    monkeypatch.setenv("DAPO_WARM_DIR", str(tmp_path))
    server = warm_server.Server(warm.socket_path(), idle_s=60)
    module = tmp_path / "mod.py"
    module.write_text("x = 1\n")
    server.modules = {str(module): warm_server._mtime(str(module))}
    request = {"fingerprint": server.fingerprint, "context": server.context}
    assert server._stale(request) is None
    assert "differ" in server._stale({**request, "fingerprint": "another"})
    assert "context" in server._stale({**request, "context": "another"})
    os.utime(module, ns=(1, 1))
    assert server._stale(request) == f"{module} changed since it was imported"


@pytest.fixture
def warm_dir(monkeypatch):
    """A short socket directory (Unix socket paths are short), the warm process's settings for
    this test, and every process it leaves ended afterwards."""
    where = Path(tempfile.mkdtemp(prefix="dw"))
    monkeypatch.setenv("DAPO_WARM_DIR", str(where))
    monkeypatch.delenv("DAPO_WARM", raising=False)
    yield where
    found = warm.status(timeout=5)
    warm.stop(timeout=5)
    if found:
        _wait_gone(found["pid"], 30)
        with contextlib.suppress(OSError):
            os.kill(found["pid"], signal.SIGKILL)
    shutil.rmtree(where, ignore_errors=True)


def _state_becomes(pid: int, states: str, timeout_s: float = 10.0) -> bool:
    """Whether ``pid``'s state (/proc: R running, S sleeping, T stopped, Z exited but not
    reaped, X gone) is one of ``states`` within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            state = "X"
        if state in states:
            return True
        time.sleep(0.05)
    return False


def _wait_gone(pid: int, timeout_s: float) -> bool:
    """Whether ``pid`` exits within ``timeout_s`` (a zombie has: this test started it)."""
    return _state_becomes(pid, "ZX", timeout_s)


def _dapo(args, cwd, **kw):
    return subprocess.Popen(
        [sys.executable, "-c", DAPO, *args],
        cwd=cwd,
        env={**os.environ, **kw.pop("env", {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,
    )


def _served(log: Path) -> list[str]:
    return [ln for ln in log.read_text().splitlines() if ": dapo " in ln or ": exit " in ln]


@pytest.mark.slow
def test_a_warm_process_runs_commands_as_a_cold_start_would(tiny_cfg, tmp_path, warm_dir):
    """Output and exit codes come back through the client; a one-line error stays one line;
    the terminal's signals reach the command as a cold one's (a SIGHUP ignored under nohup,
    Ctrl-Z stops and SIGCONT continues it, Ctrl-C ends it: exit 130, 'interrupted'); a command
    from another context (here: under `ulimit -v`) runs cold and leaves the warm process of
    this one running; SIGKILL of a command's client ends the command, and SIGKILL of the warm
    process mid-command ends its child with its MLflow run KILLED."""
    params = tmp_path / "params.json"
    params.write_text(json.dumps(resolve(tiny_cfg.to_dict()).to_dict()))
    base = ["train", "--params", str(params), "--no-track"]
    assert warm.start(quiet=True) is not None
    ready = warm.wait_ready(timeout=120)
    assert ready and ready["running"] == 0
    assert warm.start(quiet=True) is None  # one at a time
    log = warm.socket_path().with_suffix(".log")

    ok = _dapo([*base, "--run-dir", str(tmp_path / "ok"), "-S", "train.steps=2"], tmp_path)
    out, _ = ok.communicate(timeout=120)
    assert ok.returncode == 0, out
    assert "done: 2 steps" in out and (tmp_path / "ok" / "final").is_dir()
    (ran, ended) = _served(log)
    assert ran.endswith(f"(in {tmp_path.resolve()})") and "train --params" in ran
    assert ended == f"{ran.split(':')[0]}: exit 0"
    assert int(ran.split()[1].rstrip(":")) != ok.pid  # the child ran it, not the client

    bad = _dapo([*base, "-S", "train.steps=-1"], tmp_path)
    out, _ = bad.communicate(timeout=60)
    assert bad.returncode == 2 and out.strip() == (
        "error: override -S train.steps=-1: train.steps must be >= 1, got -1"
    ), out

    read, write = os.pipe()  # a reader that left before the report (`dapo preflight | head -0`)
    os.close(read)
    try:
        gone = subprocess.run(
            [sys.executable, "-c", DAPO, "preflight", "--params", str(params)],
            cwd=tmp_path,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert gone.returncode == 128 + signal.SIGPIPE and "Traceback" not in gone.stderr, gone.stderr
    assert _served(log)[-1].endswith(": exit 141")  # the warm process ran it

    run = tmp_path / "long"
    long = _dapo(
        [*base, "--run-dir", str(run), "-S", "train.steps=500"],
        tmp_path,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),  # as nohup does
    )
    deadline = time.monotonic() + 60
    while not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").stat().st_size):
        assert long.poll() is None and time.monotonic() < deadline, long.stdout.read()
        time.sleep(0.1)
    child = int(_served(log)[-1].split()[1].rstrip(":"))
    os.killpg(long.pid, signal.SIGHUP)  # the terminal closed: ignored, as the client ignores it
    os.killpg(long.pid, signal.SIGTSTP)  # Ctrl-Z: the command stops, and its client
    assert _state_becomes(child, "T") and _state_becomes(long.pid, "T")
    os.killpg(long.pid, signal.SIGCONT)  # fg
    assert _state_becomes(child, "RS") and _state_becomes(long.pid, "RS")
    os.killpg(long.pid, signal.SIGINT)  # Ctrl-C in its terminal: the client's group only
    out, _ = long.communicate(timeout=30)
    assert long.returncode == 130, out
    assert out.strip().splitlines()[-1].startswith("interrupted: stopped after step"), out
    assert _served(log)[-1].endswith(": exit 130")

    import resource

    def job_limits():  # as `ulimit -v` (or a job step's limits) would start it
        resource.setrlimit(resource.RLIMIT_AS, (64 << 30, resource.RLIM_INFINITY))

    cold = _dapo(
        [*base, "--run-dir", str(tmp_path / "cold"), "-S", "train.steps=1"],
        tmp_path,
        preexec_fn=job_limits,
    )
    out, _ = cold.communicate(timeout=120)
    assert cold.returncode == 0, out
    assert len(_served(log)) == 8  # not run warm: another context
    assert warm.status(timeout=10)["pid"] == ready["pid"]  # which left this one be

    # Killed outright (SIGKILL: the OOM killer, a scheduler past its grace period), the
    # command's client takes its command with it: the warm process stops the child it ran.
    orphan, child = _training(base, tmp_path / "orphan", log)
    os.kill(orphan.pid, signal.SIGKILL)
    orphan.wait()
    assert _wait_gone(child, 60)

    # The warm process killed outright mid-command: its child gets SIGTERM (Linux's
    # parent-death signal), ends its MLflow run KILLED, and the client says so in one line.
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracked = [a for a in base if a != "--no-track"] + ["-S", f"tracking.tracking_uri={uri}"]
    last, child = _training(tracked, tmp_path / "last", log)
    os.kill(ready["pid"], signal.SIGKILL)
    out, _ = last.communicate(timeout=60)
    assert last.returncode == 1 and "the warm process ended while running this command" in out
    assert _wait_gone(child, 60) and _wait_gone(ready["pid"], 60)
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.status for r in runs] == ["KILLED"], out


def _training(args: list[str], run: Path, log: Path) -> tuple[subprocess.Popen, int]:
    """A long ``dapo train`` through the warm process, once its first step is logged: its
    client, and the pid of the warm process's child that runs it."""
    proc = _dapo([*args, "--run-dir", str(run), "-S", "train.steps=500"], run.parent)
    deadline = time.monotonic() + 60
    while not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").stat().st_size):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.1)
    return proc, int(_served(log)[-1].split()[1].rstrip(":"))


@pytest.mark.parametrize("waiting", ["interrupted", "timed out"])
def test_a_warm_start_that_ends_before_ready_ends_the_process_it_started(
    warm_dir, monkeypatch, waiting
):
    """Ctrl-C during `dapo warm start` (or no answer in time) leaves no warm process behind."""
    from typer.testing import CliRunner

    from flows.cli import app

    started = []
    start = warm.start

    def spy(quiet=False):
        started.append(start(quiet))
        return started[-1]

    def wait(timeout=120.0):
        deadline = time.monotonic() + 30
        while not warm.socket_path().exists():  # bound: it binds before it imports
            assert time.monotonic() < deadline
            time.sleep(0.05)
        if waiting == "interrupted":
            raise KeyboardInterrupt
        return None

    monkeypatch.setattr(warm, "start", spy)
    monkeypatch.setattr(warm, "wait_ready", wait)
    out = CliRunner().invoke(app, ["warm", "start"])
    assert out.exit_code == (130 if waiting == "interrupted" else 2), out.output
    assert started[0] is not None and _wait_gone(started[0], 15)
    assert not warm.socket_path().exists()  # no socket file with nobody behind it


def test_ending_an_unready_warm_process_keeps_a_socket_another_one_holds(warm_dir):
    """The socket file goes with the process that bound it, not when a newer warm process
    (which holds the lock) has bound it since."""
    import fcntl

    path = warm.socket_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_text("")  # stands for the socket
    gone = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    holder = os.open(warm.lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        warm._end_unready(gone.pid)
        assert path.exists()
    finally:
        os.close(holder)
    warm._end_unready(gone.pid)  # nobody holds it: removed
    assert not path.exists()


@pytest.mark.slow
def test_stop_ends_the_warm_process_and_its_socket(warm_dir):
    assert warm.start(quiet=True) and (found := warm.wait_ready(timeout=120))
    assert warm.stop() == {**found, "running": 0}
    assert _wait_gone(found["pid"], 15) and not warm.socket_path().exists()


def test_idle_counts_from_ready_and_ends_the_loop(tmp_path, monkeypatch):
    monkeypatch.setenv("DAPO_WARM_DIR", str(tmp_path))
    server = warm_server.Server(warm.socket_path(), idle_s=0.5)
    server.ready()
    assert not server._done()
    time.sleep(0.6)
    assert server._done()
