"""A warm process: ``dapo train`` (and evaluate, preflight, pipeline) starts in seconds.

A fresh ``dapo train`` spends most of its start-up importing torch, transformers, MLflow and
Prefect (BENCHMARKS.md, "Start-up"). The warm process imports them once and waits; each command
then connects to it, hands over its arguments, working directory, environment and terminal
(its stdin, stdout and stderr, passed as file descriptors), and the warm process forks a child
that runs the command as the ``dapo`` entry point would. The command's own process stays in the
terminal as a thin client: it relays Ctrl-C, SIGTERM and SIGHUP to the child's process group and
exits with the child's exit code. As the Gradle daemon does for builds.

When it is used, and when not (a cold start is always the fallback, with nothing lost):

- the first such command in an interactive terminal starts it in the background, saying so in
  one line; ``dapo warm start`` starts it anywhere (scripts, the start-up benchmark), ``dapo
  warm stop`` ends it, ``DAPO_WARM=0`` turns it off. It exits after ``DAPO_WARM_IDLE_S``
  seconds unused (30 minutes);
- a command whose code or import-time settings differ from the warm process's runs cold and
  ends it (the next one starts a fresh one): the fingerprint (:func:`fingerprint`) covers this
  project's Python files, the installed packages, the interpreter and the environment variables
  libraries read when imported (``HF_*``, ``TORCH*``, ``CUDA_*``, ``OMP_*``, ``MLFLOW_*``, ...);
- the socket lives in ``DAPO_WARM_DIR`` (the temporary directory by default), one per user and
  checkout, readable by its owner only.

The warm process runs no torch operation before it forks (a forked child of a process that ran
a parallel region can hang in OpenMP), and binds its socket before importing, so a command that
arrives while it imports waits for it rather than paying for its own imports. Everything here
imports only the standard library: the client path must cost milliseconds.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flows", "tasks", "dapo_core")
CLI = "flows.cli"
"""The module whose typer ``app`` a forked child runs (the ``dapo`` entry point's)."""
ROUTED = frozenset({"train", "evaluate", "preflight", "pipeline"})
"""Commands the warm process runs: those that train or sample, whose start-up is the imports."""
PRELOAD = (
    "torch",
    "transformers",
    "transformers.models.qwen2.modeling_qwen2",
    CLI,
    "tasks.training.run",
    "tasks.evaluation.evaluate",
    "tasks.tracking.tracker",
    "tasks.tracking.plots",
    "mlflow",
    "mlflow.store.tracking.sqlalchemy_store",
    "prefect",
    "prefect.flows",
)
"""What a warm process imports: what ``dapo train`` imports on its way to its first step."""
IMPORT_TIME_ENV = (
    *("HF_", "HUGGINGFACE", "TRANSFORMERS", "TOKENIZERS", "TORCH", "PYTORCH", "CUDA", "NCCL"),
    *("OMP_", "MKL_", "OPENBLAS", "KMP_", "MLFLOW_", "PREFECT_", "PYTHON", "LD_", "USE_", "DS_"),
)
"""Prefixes of the environment variables libraries may read once, when imported."""
IDLE_S = 1800.0
STOP_GRACE_S = 30.0
"""A command whose client vanished (killed) gets SIGTERM, then SIGKILL this much later."""


def enabled() -> bool:
    """Not turned off, and not one rank of a launcher's job (torchrun, deepspeed): each rank is
    a process its launcher watches and signals, so it runs itself."""
    launched = "LOCAL_RANK" in os.environ or "WORLD_SIZE" in os.environ
    return os.environ.get("DAPO_WARM", "") != "0" and not launched


def routed(argv: list[str]) -> bool:
    """Whether ``dapo ARGV`` is a command the warm process runs."""
    return bool(argv) and argv[0] in ROUTED


def socket_path() -> Path:
    """This user's and this checkout's socket (short: a Unix socket path has ~100 bytes)."""
    where = Path(os.environ.get("DAPO_WARM_DIR") or tempfile.gettempdir())
    checkout = hashlib.sha1(str(ROOT).encode()).hexdigest()[:10]
    return where / f"dapo-warm-{os.getuid()}-{checkout}.sock"


def fingerprint(env: dict[str, str] | None = None, roots: tuple[Path, ...] | None = None) -> str:
    """What must match for a warm process's imports to be the ones a cold start would make: the
    project's Python files (path, size, modification time), the installed packages (their
    directories' modification times change on every install), the interpreter, and the
    import-time environment variables."""
    env = os.environ if env is None else env
    roots = tuple(ROOT / p for p in PACKAGES) if roots is None else roots
    h = hashlib.sha1(f"{sys.executable}\0{sys.version}".encode())
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(f for f in filenames if f.endswith(".py")):
                st = os.stat(os.path.join(dirpath, name))
                h.update(f"{dirpath}/{name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    for path in sys.path:
        if path.endswith("-packages") and os.path.isdir(path):
            h.update(f"{path}\0{os.stat(path).st_mtime_ns}\0".encode())
    for key in sorted(k for k in env if k.startswith(IMPORT_TIME_ENV)):
        h.update(f"{key}={env[key]}\0".encode())
    return h.hexdigest()


# -- messages: a 4-byte length, then JSON --------------------------------------------------


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    data = json.dumps(message).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def _recv(sock: socket.socket) -> dict[str, Any] | None:
    """The next message, or None where the other end has gone."""
    head = _recv_exactly(sock, 4)
    if head is None:
        return None
    data = _recv_exactly(sock, struct.unpack("!I", head)[0])
    return None if data is None else json.loads(data)


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _connect(timeout: float | None = None) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(socket_path()))
    except OSError:
        sock.close()
        return None
    return sock


# -- the client: the `dapo` command's own process -------------------------------------------


def run(argv: list[str]) -> int | None:
    """Run ``dapo ARGV`` in the warm process and return its exit code; None where there is no
    warm process to run it (or it is stale): the caller starts cold."""
    if not (enabled() and routed(argv)):
        return None
    sock = _connect()
    if sock is None:
        return None
    with sock:
        try:
            socket.send_fds(sock, [b"R"], [0, 1, 2])
            request = {"argv": ["dapo", *argv], "cwd": os.getcwd(), "env": dict(os.environ)}
            _send(sock, {**request, "path": sys.path, "fingerprint": fingerprint()})
            reply = _recv(sock)  # waits while a just-started warm process still imports
        except OSError:
            return None
        if not reply or "pid" not in reply:
            return None  # stale (it ends itself), or gone: start cold
        pid = reply["pid"]
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, lambda signum, frame: _relay(pid, signum))
        try:
            reply = _recv(sock)
        except OSError:
            reply = None
    if reply is None:
        sys.stderr.write(
            f"dapo: the warm process ended while running this command (pid {pid}); its run "
            "directory has what it did; rerun with DAPO_WARM=0 to start cold\n"
        )
        return 1
    return int(reply["exit"])


def _relay(pid: int, signum: int) -> None:
    """What the terminal sent the command goes to the command's process group."""
    with contextlib.suppress(OSError):
        os.killpg(pid, signum)


def start(quiet: bool = False) -> int | None:
    """Start a warm process in the background unless one answers; its pid, or None if one was
    running already."""
    if status() is not None:
        return None
    log = socket_path().with_suffix(".log")
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.warm", "serve"],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the terminal's Ctrl-C is not for it
        )
    if not quiet:
        sys.stderr.write(
            f"dapo: started a warm process (pid {proc.pid}) that keeps torch, transformers and "
            f"MLflow imported, so the next `dapo {'|'.join(sorted(ROUTED))}` starts in seconds; "
            f"it exits after {IDLE_S / 60:.0f} min unused (`dapo warm stop`; DAPO_WARM=0 never "
            "starts one)\n"
        )
    return proc.pid


def start_if_wanted(argv: list[str]) -> None:
    """The first routed command in an interactive terminal starts a warm process for the next
    ones (a script or a batch job does not: nothing is left behind it unasked)."""
    interactive = sys.stdin.isatty() and sys.stderr.isatty()
    if enabled() and routed(argv) and (interactive or os.environ.get("DAPO_WARM") == "1"):
        start()


def status(timeout: float = 60.0) -> dict[str, Any] | None:
    """The warm process's state (pid, commands running, ready), or None where none answers."""
    return _ask({"op": "status"}, timeout)


def stop(timeout: float = 60.0) -> dict[str, Any] | None:
    """Ask the warm process to exit once the commands it runs have ended."""
    return _ask({"op": "stop"}, timeout)


def wait_ready(timeout: float = 120.0) -> dict[str, Any] | None:
    """Block until the warm process has imported everything (status answers then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (found := status(timeout=max(1.0, deadline - time.monotonic()))) is not None:
            return found
        time.sleep(0.2)
    return None


def _ask(message: dict[str, Any], timeout: float) -> dict[str, Any] | None:
    sock = _connect(timeout)
    if sock is None:
        return None
    with sock:
        try:
            sock.sendall(b"Q")
            _send(sock, message)
            return _recv(sock)
        except OSError:
            return None


# -- the warm process -----------------------------------------------------------------------


class Server:
    """The warm process's loop: accept commands, fork a child for each, report its exit code;
    end when stopped, stale, or idle for ``idle_s``."""

    def __init__(self, path: Path, idle_s: float):
        self.path, self.idle_s = path, idle_s
        self.children: dict[int, socket.socket] = {}  # pid -> its client's connection
        self.killing: dict[int, float] = {}  # pid -> when SIGKILL follows the SIGTERM
        self.selector = selectors.DefaultSelector()
        self.listener: socket.socket | None = None
        self.stopping, self.last_used = False, time.monotonic()
        self.fingerprint = fingerprint()

    def bind(self) -> bool:
        """Listen on the socket, replacing a dead process's leftover; False where a live warm
        process has it."""
        if _connect(5.0) is not None:
            return False
        self.path.unlink(missing_ok=True)
        old = os.umask(0o077)  # the socket runs code as its owner: nobody else may connect
        try:
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.listener.bind(str(self.path))
        finally:
            os.umask(old)
        self.listener.listen(16)
        self.selector.register(self.listener, selectors.EVENT_READ)
        return True

    def serve(self) -> dict[str, Any] | None:
        """Run until the end (None), or, in a forked child, return the command it must run."""
        self.last_used = time.monotonic()  # idle from when it is ready
        while self.children or not self._done():
            for key, _ in self.selector.select(timeout=0.2):
                if key.fileobj is self.listener:
                    if job := self._accept():
                        return job
                else:  # a client's connection: readable only at EOF (its process has gone)
                    self._client_gone(key.fileobj)
            self._reap()
        self.close()
        return None

    def _done(self) -> bool:
        return self.stopping or time.monotonic() - self.last_used > self.idle_s

    def _accept(self) -> dict[str, Any] | None:
        conn, _ = self.listener.accept()
        self.last_used = time.monotonic()
        try:
            conn.settimeout(10.0)
            _, fds, _, _ = socket.recv_fds(conn, 1, 3)
            message = _recv(conn)
        except OSError:
            conn.close()
            return None
        if message is None:
            _close_fds(fds)
            conn.close()
            return None
        if "op" in message:
            self._answer(conn, message["op"])
            return None
        if message.get("fingerprint") != self.fingerprint:
            _close_fds(fds)
            with conn:
                _send(conn, {"stale": True})
            self._stop()  # the next command starts a fresh one
            return None
        pid = os.fork()
        if pid == 0:
            self._in_child(conn)
            return {**message, "fds": fds}
        _close_fds(fds)
        print(f"pid {pid}: {' '.join(message['argv'])} (in {message['cwd']})", flush=True)
        _send(conn, {"pid": pid})
        self.children[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ)
        return None

    def _answer(self, conn: socket.socket, op: str) -> None:
        reply = {"pid": os.getpid(), "running": len(self.children), "ready": True}
        if op == "stop":
            self._stop()
        with conn:
            _send(conn, reply)

    def _stop(self) -> None:
        if self.listener is not None:
            self.selector.unregister(self.listener)
            self.listener.close()
            self.listener = None
            self.path.unlink(missing_ok=True)
        self.stopping = True

    def _in_child(self, conn: socket.socket) -> None:
        """Drop the server's sockets in the forked child (the socket file stays: it is the
        server's)."""
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()
        for c in self.children.values():
            c.close()
        self.selector.close()
        conn.close()

    def _client_gone(self, conn: Any) -> None:
        """A command's client exited without its exit code (killed): the command is stopped."""
        self.selector.unregister(conn)
        for pid, c in self.children.items():
            if c is conn:
                _relay(pid, signal.SIGTERM)
                self.killing[pid] = time.monotonic() + STOP_GRACE_S

    def _reap(self) -> None:
        now = time.monotonic()
        for pid, when in list(self.killing.items()):
            if now > when:
                _relay(pid, signal.SIGKILL)
                del self.killing[pid]
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.last_used = now
            code = os.waitstatus_to_exitcode(status)
            conn = self.children.pop(pid, None)
            self.killing.pop(pid, None)
            print(f"pid {pid}: exit {code}", flush=True)
            if conn is not None:
                if conn in self.selector.get_map():
                    self.selector.unregister(conn)
                with conn, contextlib.suppress(OSError):
                    _send(conn, {"exit": code if code >= 0 else 128 - code})

    def close(self) -> None:
        self._stop()
        self.selector.close()


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def become(job: dict[str, Any]) -> None:
    """In the forked child: take the command's terminal, directory, environment, arguments and
    import path, and its own process group (which the client relays signals to)."""
    from flows.signals import until_work_begins

    os.setpgid(0, 0)
    for target, fd in zip((0, 1, 2), job["fds"], strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(job["env"])
    os.chdir(job["cwd"])
    sys.argv, sys.path[:] = job["argv"], job["path"]
    until_work_begins()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    sys.stdout.reconfigure(line_buffering=sys.stdout.isatty())
    _refresh_consoles()


def _refresh_consoles() -> None:
    """Rich consoles made at import chose their colours for the warm process's log file: choose
    again for the command's terminal."""
    from rich.console import Console

    for module in list(sys.modules.values()):
        console = getattr(module, "console", None)
        if isinstance(console, Console):
            console._color_system = console._detect_color_system()


def serve_main() -> None:
    """``python -m flows.warm serve``: bind, import, serve; in a forked child, run the command."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    idle_s = float(os.environ.get("DAPO_WARM_IDLE_S", IDLE_S))
    server = Server(socket_path(), idle_s)
    if not server.bind():
        print("a warm process is running already", flush=True)
        return
    try:
        started = time.monotonic()
        for name in PRELOAD:
            importlib.import_module(name)
        gc.freeze()  # what the imports made stays shared with the children, not copied by GC
        print(f"pid {os.getpid()}: ready in {time.monotonic() - started:.1f}s", flush=True)
        job = server.serve()
    except BaseException:
        server.close()
        raise
    if job is not None:  # the forked child
        become(job)
        importlib.import_module(CLI).app()  # imported already: by name, as PRELOAD's modules


if __name__ == "__main__" and sys.argv[1:] == ["serve"]:
    serve_main()
