"""What ``dapo ui`` becomes once it has printed its links: a process of the standard library and
``tasks.lifetime`` only, which runs the MLflow UI server until it exits or this process is
stopped, then stops the server and every worker it started.

``dapo ui`` replaces itself with this (``exec``) rather than wait on the server: the CLI process
has imported torch, transformers and MLflow (a few hundred MB resident) and would hold them for as
long as the UI stays open, doing nothing. The process keeps its pid, its process group and its
terminal, so a Ctrl-C or a SIGTERM for ``dapo ui`` reaches this.

    python -I tasks/tracking/ui_host.py PORT -- MLFLOW UI COMMAND...

It runs by its path in isolated mode (``-I``), as the reaper does: a ``tasks`` package in the
directory ``dapo ui`` was started from cannot shadow the project's.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

GRACE_S = 10.0  # how long the server has to stop its workers before they are killed


def host(port: int, cmd: list[str]) -> int:
    """Run ``cmd`` (in a session of its own, watched by the reaper) until it exits, or until
    Ctrl-C or SIGTERM here; the exit code to give."""
    from tasks.lifetime import start_helper, stop_helper

    signal.signal(signal.SIGTERM, _interrupt)  # stopped as by Ctrl-C: the clean-up below runs
    proc = start_helper(cmd)
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


def exec_host(port: int, cmd: list[str], env: dict[str, str]) -> None:
    """Replace this process with the host of ``cmd`` (never returns). Whatever this process
    registered to run at exit (``atexit``) does not run, nor may it have started a helper or
    left last words (``tasks.lifetime``): its reaper's pipe closes with the exec."""
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [sys.executable, "-I", str(Path(__file__).resolve()), str(port), "--", *cmd]
    os.execve(sys.executable, argv, env)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project's root (-I)
    port, dashes, *command = sys.argv[1:]
    if dashes != "--" or not command:
        sys.exit("usage: python -I tasks/tracking/ui_host.py PORT -- COMMAND...")
    sys.exit(host(int(port), command))
