"""What ``dapo ui`` becomes once it has printed its links: a process of the standard library and
``tasks.lifetime`` only, which runs the MLflow UI server until it exits or this process is
stopped, then stops the server and every worker it started.

``dapo ui`` replaces itself with this (``exec``) rather than wait on the server: the CLI process
has imported torch, transformers and MLflow (a few hundred MB resident) and would hold them for as
long as the UI stays open, doing nothing. The process keeps its pid, its process group and its
terminal, so a Ctrl-C or a SIGTERM for ``dapo ui`` reaches this.

    python -I tasks/tracking/ui_host.py URL -- MLFLOW UI COMMAND...

It runs by its path in isolated mode (``-I``), as the reaper does: a ``tasks`` package in the
directory ``dapo ui`` was started from cannot shadow the project's.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

GRACE_S = 10.0  # how long the server has to stop its workers before they are killed
POLL_S = 0.25  # how often the server is asked whether it answers yet


def host(url: str, cmd: list[str]) -> int:
    """Run ``cmd`` (in a session of its own, watched by the reaper) until it exits, or until
    Ctrl-C or SIGTERM here; say when it answers at ``url``; the exit code to give."""
    from tasks.lifetime import start_helper, stop_helper

    signal.signal(signal.SIGTERM, _interrupt)  # stopped as by Ctrl-C: the clean-up below runs
    port = urllib.parse.urlsplit(url).port
    proc = start_helper(cmd)
    threading.Thread(target=_say_when_ready, args=(url, proc), daemon=True).start()
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second one would cut the stop short
            signal.signal(sig, signal.SIG_IGN)
        stop_helper(proc, GRACE_S)
        return 0
    if rc:
        sys.stderr.write(f"error: mlflow ui exited with {rc} (is port {port} in use?)\n")
    return rc


def _say_when_ready(url: str, proc: subprocess.Popen) -> None:
    """One line once the server listens (it takes seconds to start: a browser opened at once
    found nothing there). Uvicorn listens once the app has started; a connection, not a
    request, so that the server's access log has no line of ours."""
    parts = urllib.parse.urlsplit(url)
    # every interface: ask on loopback (IPv6's, for a server that may listen on IPv6 alone)
    loopback = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}
    address = (loopback.get(parts.hostname or "", parts.hostname), parts.port)
    while proc.poll() is None:
        try:
            socket.create_connection(address, timeout=2).close()
        except OSError:  # not listening yet
            time.sleep(POLL_S)
            continue
        sys.stderr.write(f"ready: {url} (Ctrl-C stops it)\n")
        sys.stderr.flush()
        return


def exec_host(url: str, cmd: list[str], env: dict[str, str]) -> None:
    """Replace this process with the host of ``cmd`` (never returns), which serves at ``url``.
    Whatever this process registered to run at exit (``atexit``) does not run, nor may it have
    started a helper or left last words (``tasks.lifetime``): its reaper's pipe closes with the
    exec."""
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [sys.executable, "-I", str(Path(__file__).resolve()), url, "--", *cmd]
    os.execve(sys.executable, argv, env)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project's root (-I)
    url, dashes, *command = sys.argv[1:]
    if dashes != "--" or not command:
        sys.exit("usage: python -I tasks/tracking/ui_host.py URL -- COMMAND...")
    sys.exit(host(url, command))
