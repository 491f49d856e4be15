"""The Prefect server a command runs its flows against, started so that an interrupt cannot
take it down before the command has recorded how it ended.

Left to itself, Prefect starts a temporary ("ephemeral") server for a command that has no
``PREFECT_API_URL``, as a child in the command's own process group. A terminal sends Ctrl-C to
the whole foreground group, and a scheduler (Slurm, Kubernetes, systemd) sends SIGTERM to it: the
server died first, and the command then spent minutes retrying a server that was gone ("Error
logging to API"), finished the flow run it had been asked to stop, or crashed with a traceback.

``command_server`` starts the same server (Prefect's own ASGI app, run by uvicorn, UI off, as
the ephemeral server is) in a session of its own, points this process at it, and stops it only
after the command's flow has written its final state and its logs have been sent. Where a
server is configured (``PREFECT_API_URL``), it starts nothing: the runs appear there.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from dapo_core.errors import PipelineError
from tasks.durable import replace_atomically
from tasks.lifetime import start_helper, stop_helper, unwatch
from tasks.orchestration import without_prefect
from tasks.signals import own_session, release_session

SERVER_START_TIMEOUT_S = 120.0
SERVER_STOP_GRACE_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prefect_cli() -> list[str]:
    """The ``prefect`` command of this interpreter (works inside a virtualenv not on PATH)."""
    return [sys.executable, "-m", "prefect"]


def spawn(cmd: list[str], env: dict[str, str], log: Path, stack: ExitStack) -> subprocess.Popen:
    """Start ``cmd`` in its own session, so a Ctrl-C in the terminal reaches only the command
    that owns it, which then stops it in order."""
    out = stack.enter_context(log.open("ab"))
    proc = start_helper(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    own_session(proc.pid)  # killed by the watchdog if an interrupt's clean-up hangs
    stack.callback(release_session, proc.pid)
    return proc


def wait_until_healthy(url: str, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise PipelineError(f"the local Prefect server exited at start; see {log}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:  # not listening yet (URLError, connection refused, timeout)
            pass
        time.sleep(0.1)
    raise PipelineError(
        f"the local Prefect server did not answer within {SERVER_START_TIMEOUT_S:.0f}s; see {log}"
    )


def api_server_command(port: int) -> list[str]:
    """Prefect's API served by uvicorn, as Prefect starts its ephemeral server (no UI)."""
    import prefect

    return [
        *(sys.executable, "-m", "uvicorn", "--app-dir", str(Path(prefect.__file__).parent.parent)),
        *("--factory", "prefect.server.api.server:create_app"),
        *("--host", "127.0.0.1", "--port", str(port), "--log-level", "error", "--lifespan", "on"),
    ]


def configured_api_url() -> str | None:
    """The Prefect API the user configured (setting or environment), or None. Prefect's
    settings are read (importing Prefect, seconds) only where a source of them could name one."""
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    if not _prefect_settings_may_be_configured():
        return None
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def _prefect_settings_may_be_configured() -> bool:
    """Whether any source Prefect 3 reads its settings from exists besides the environment: a
    ``.env``, ``prefect.toml`` or ``pyproject.toml`` with ``[tool.prefect]`` in the working
    directory, or a profiles file (``PREFECT_PROFILES_PATH``, else ``$PREFECT_HOME`` or
    ``~/.prefect``). Where none does, the API URL is unset."""
    cwd = Path.cwd()
    if (cwd / ".env").exists() or (cwd / "prefect.toml").exists():
        return True
    with contextlib.suppress(OSError):
        if "tool.prefect" in (cwd / "pyproject.toml").read_text():
            return True
    homes = [
        Path(os.environ.get("PREFECT_HOME", "~/.prefect")).expanduser(),
        Path.home() / ".prefect",
    ]
    profiles = (
        [Path(os.environ["PREFECT_PROFILES_PATH"])]
        if "PREFECT_PROFILES_PATH" in os.environ
        else [h / "profiles.toml" for h in homes]
    )
    return any(p.exists() for p in profiles) or "PREFECT_PROFILE" in os.environ


def _record(prefect_home: Path) -> Path:
    return prefect_home / "dapo-server.json"


def _answers(url: str, timeout_s: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as answer:
            return answer.status == 200
    except OSError:
        return False


def running_server(prefect_home: Path) -> str | None:
    """The API URL of this project's long-lived server (``dapo server start``) if it answers."""
    try:
        url = json.loads(_record(prefect_home).read_text())["url"]
    except (OSError, ValueError, KeyError, TypeError):  # none, or a torn record
        return None
    return url if _answers(url) else None


def start_server(prefect_home: Path, port: int) -> tuple[str, bool]:
    """Start this project's long-lived Prefect server (API and UI) in a session of its own, or
    find the one running; ``(api url, started now)``. Commands then use it instead of starting a
    temporary server each (seconds saved per command), and its UI shows every run."""
    url = running_server(prefect_home)
    if url:
        return url, False
    from prefect.settings import get_current_settings

    logs = prefect_home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}/api"
    if _answers(url, 0.5) or not _port_free(port):
        raise PipelineError(f"port {port} is in use; pick another with --port")
    env = {**os.environ, **get_current_settings().to_environment_variables(exclude_unset=True)}
    env.pop("PREFECT_API_URL", None)
    env["PREFECT__SERVER_FINAL"] = "1"
    with ExitStack() as stack:  # closes this process's handle on the log, not the server
        server = spawn(api_server_command(port), env, logs / "server.log", stack)
        try:
            wait_until_healthy(url, server, logs / "server.log")
        except BaseException:
            stop_helper(server, SERVER_STOP_GRACE_S)
            raise
    record = _record(prefect_home)
    text = json.dumps({"url": url, "pid": server.pid})
    replace_atomically(record, lambda tmp: tmp.write_text(text))  # never read half-written
    # Meant to outlive this command from here on, where `dapo server stop` finds it: until now a
    # command killed outright (SIGKILL) has its reaper stop it, rather than leave one running
    # that no record names.
    release_session(server.pid)
    unwatch(server.pid)
    return url, True


def stop_server(prefect_home: Path) -> bool:
    """Stop the long-lived server (its whole session); False when none was recorded."""
    record = _record(prefect_home)
    try:
        saved = json.loads(record.read_text())
        pid, url = int(saved["pid"]), str(saved["url"])
    except (OSError, ValueError, KeyError, TypeError):
        record.unlink(missing_ok=True)
        return False
    if not (_answers(url, 2.0) or _runs_prefect(pid)):  # stale: the pid may be another's now
        record.unlink(missing_ok=True)
        return False
    for sig, wait_s in ((signal.SIGTERM, SERVER_STOP_GRACE_S), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.1)
    record.unlink(missing_ok=True)
    return True


def _runs_prefect(pid: int) -> bool:
    """Whether process ``pid`` runs Prefect (its command line, where /proc has it)."""
    try:
        return b"prefect" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT ok
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextmanager
def command_server(log_dir: Path, direct: bool = False) -> Iterator[str | None]:
    """Run the body with a Prefect server that outlives its flow's clean-up; yield its API URL
    (None where a configured server is used, or none at all). Its log goes to
    ``log_dir/prefect-server.log``.

    In order: a configured ``PREFECT_API_URL``; this project's long-lived server where one
    answers (``dapo server start``: no start-up to pay); with ``direct`` (a command whose flow
    is a single stage), no server: the flow and its task run as plain functions
    (``tasks.orchestration.without_prefect``); else a temporary server of the command's own,
    stopped after its flow has recorded how it ended."""
    if configured_api_url():
        yield None
        return
    running = running_server(log_dir.parent)
    if running:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: running}):
            try:
                yield running
            finally:
                flush_to_server()
        return
    if direct:
        with without_prefect():
            yield None
        return

    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / "prefect-server.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        **get_current_settings().to_environment_variables(exclude_unset=True),
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
    }
    env.pop("PREFECT_API_URL", None)
    with ExitStack() as stack:
        server = spawn(api_server_command(port), env, log, stack)
        stack.callback(stop_helper, server, SERVER_STOP_GRACE_S)  # last on the way out
        wait_until_healthy(url, server, log)
        stack.enter_context(temporary_settings(updates={PREFECT_API_URL: url}))
        stack.callback(flush_to_server)  # first on the way out, while the server still runs
        yield url


def flush_to_server() -> None:
    """Send this process's queued Prefect logs and events now. At exit Prefect would send them
    to a server stopped by then, retrying for over a minute before printing "Error logging to
    API"."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (APILogWorker, EventsWorker):
        try:
            service.drain_all(timeout=10)
        except Exception as e:  # noqa: BLE001 - never hide the command's outcome behind this
            import logging

            logging.getLogger(__name__).warning(
                "could not flush Prefect %s before stopping the server: %s", service, e
            )
