"""The warm process itself (``python -m flows.warm_server``, started by ``flows.warm.start``):
it binds this checkout's socket for its context, imports what ``dapo train`` imports, then
serves: each command it accepts runs in a forked child that takes the command's terminal,
directory, environment and signals (:func:`become`), while this loop reports its exit code to
the command's client. ``flows.warm`` has the client's side and what both sides share.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import importlib
import os
import selectors
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from flows.environment import apply_defaults
from flows.signals import run_to_the_end, until_work_begins
from flows.warm import (
    CLI,
    IDLE_S,
    PRELOAD,
    STOP_GRACE_S,
    _private_dir,
    _recv,
    _relay,
    _send,
    context_key,
    fingerprint,
    lock_path,
    socket_path,
)
from tasks.lifetime import die_with_parent


class Server:
    """The warm process's loop: accept commands, fork a child for each, report its exit code;
    end when stopped (``dapo warm stop``, SIGTERM), stale, or idle for ``idle_s``. A command's
    error never ends the loop: the commands still running need it for their exit codes."""

    def __init__(self, path: Path, idle_s: float):
        self.path, self.idle_s, self.pid = path, idle_s, os.getpid()
        self.children: dict[int, socket.socket] = {}  # pid -> its client's connection
        self.killing: dict[int, float] = {}  # pid -> when SIGKILL follows the SIGTERM
        self.selector = selectors.DefaultSelector()
        self.listener: socket.socket | None = None
        self.lock: int | None = None
        self.stopping, self.terminated, self.last_used = False, False, time.monotonic()
        self.fingerprint, self.context = fingerprint(), context_key()
        self.env = dict(os.environ)  # as the context was keyed: imports may set variables
        self.modules: dict[str, int] = {}  # file -> mtime of what was imported

    def bind(self) -> bool:
        """Listen on the socket; False where a live warm process holds it (a lock held for
        life: two started at once cannot both bind)."""
        if not _private_dir():
            return False
        self.lock = os.open(lock_path(self.path), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        self.path.unlink(missing_ok=True)  # a killed process's leftover
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        self.listener.listen(16)
        self.selector.register(self.listener, selectors.EVENT_READ)
        return True

    def ready(self) -> None:
        """Imports done: remember what they read, and from when idleness counts."""
        self.modules = _module_files()
        self.last_used = time.monotonic()

    def serve(self) -> dict[str, Any] | None:
        """Run until the end (None), or, in a forked child, return the command it must run."""
        while self.children or not self._done():
            if self.terminated:
                self._stop()
            for key, _ in self.selector.select(timeout=0.2):
                if key.fileobj is self.listener:
                    if (job := self._accept()) is not None:
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
        self.last_used, fds = time.monotonic(), []
        try:
            conn.settimeout(10.0)
            _, fds, _, _ = socket.recv_fds(conn, 1, 3)
            message = _recv(conn)
            if message is not None and "op" in message:
                self._answer(conn, message["op"])
            elif message is not None and (why := self._stale(message)) is not None:
                print(f"stale ({why}): ending", flush=True)
                self._stop()  # first: the command, run cold, starts a fresh one at once
                _send(conn, {"stale": why})
            elif message is not None and not _gave_up(conn):
                return self._fork(conn, message, fds)  # which owns the connection and fds now
        except Exception as e:  # noqa: BLE001 (one request's failure; the others go on)
            print(f"a request failed: {e!r}", flush=True)
        _close_fds(fds)
        conn.close()
        return None

    def _fork(self, conn: socket.socket, message: dict[str, Any], fds: list[int]) -> Any:
        warm = os.getpid()
        try:
            pid = os.fork()
        except OSError as e:
            print(f"fork failed: {e!r}", flush=True)
            _close_fds(fds)
            conn.close()
            return None
        if pid == 0:
            until_work_begins()  # not the warm process's handlers, from the first instant
            # A warm process that dies (OOM, SIGKILL) takes the command with it, as the command's
            # own process would be: SIGTERM, so it ends its runs KILLED.
            die_with_parent(warm)
            with contextlib.suppress(OSError):
                os.setpgid(0, 0)
            try:
                _send(conn, {"pid": os.getpid()})  # the command runs: the client never starts
            except OSError:  # it cold, whatever becomes of the warm process; unless it did
                os._exit(1)  # not hear this: then it starts cold, and this must not run too
            self._in_child(conn)
            return {**message, "fds": fds}
        with contextlib.suppress(OSError):  # both sides, as a shell does: no signal is lost to
            os.setpgid(pid, pid)  # a group that does not exist yet
        _close_fds(fds)
        print(f"pid {pid}: dapo {' '.join(message['argv'][1:])} (in {message['cwd']})", flush=True)
        self.children[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ)
        return None

    def _stale(self, message: dict[str, Any]) -> str | None:
        """Why this process must not run the command (None: it may)."""
        if message.get("fingerprint") != self.fingerprint:
            return "its code or packages differ"
        # Its place now, not at start: a warm process moved since (prlimit, a cgroup) is stale.
        if message.get("context") != self.context or context_key(self.env) != self.context:
            return "its context (environment, cgroup, limits, nice, groups) differs"
        if changed := [f for f, t in self.modules.items() if _mtime(f) != t]:
            return f"{changed[0]} changed since it was imported"
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return "CUDA was initialised in the warm process: children cannot use it"
        return None

    def _answer(self, conn: socket.socket, op: str) -> None:
        reply = {"pid": os.getpid(), "running": len(self.children), "ready": True}
        if op == "stop":
            self._stop()
        _send(conn, reply)

    def _stop(self) -> None:
        if self.listener is not None:
            self.selector.unregister(self.listener)
            self.listener.close()
            self.listener = None
            if os.getpid() == self.pid:  # never a forked child's doing
                self.path.unlink(missing_ok=True)
        if self.lock is not None:  # a fresh warm process may start while this one finishes
            os.close(self.lock)  # the commands it runs (their children closed their copies)
            self.lock = None
        self.stopping = True

    def _in_child(self, conn: socket.socket) -> None:
        """Drop the server's sockets and lock in the forked child (the socket file stays: it
        is the server's)."""
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()
        for c in self.children.values():
            c.close()
        self.selector.close()
        conn.close()
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None

    def _client_gone(self, conn: Any) -> None:
        """A command's client exited without its exit code (killed): the command is stopped
        (continued first, if Ctrl-Z had stopped it)."""
        self.selector.unregister(conn)
        for pid, c in self.children.items():
            if c is conn:
                _relay(pid, signal.SIGTERM)
                _relay(pid, signal.SIGCONT)
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


def _gave_up(conn: socket.socket) -> bool:
    """Whether the command's client has gone (Ctrl-C while this process still imported): its
    command must not start on a terminal nobody waits on."""
    timeout = conn.gettimeout()
    conn.setblocking(False)  # a socket with a timeout waits for data whatever the flags say
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    finally:
        conn.settimeout(timeout)


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _module_files() -> dict[str, int]:
    """Every imported module's file and its modification time: an edit to any of them (an
    editable package, a package patched in place) makes the warm process stale."""
    found = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and (mtime := _mtime(path)) is not None:
            found[path] = mtime
    return found


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def become(job: dict[str, Any]) -> None:
    """In the forked child: take the command's terminal, directory, environment, arguments,
    import path, umask, CPUs and signal dispositions; its process group is its own (the client
    relays signals to it)."""
    for target, fd in zip((0, 1, 2), job["fds"], strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(job["env"])
    os.chdir(job["cwd"])
    os.umask(job["umask"])
    os.sched_setaffinity(0, job["cpus"])
    sys.argv, sys.path[:] = job["argv"], job["path"]
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for sig in (signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN if sig in job["ignored"] else signal.SIG_DFL)
    sys.stdout.reconfigure(line_buffering=sys.stdout.isatty())
    _refresh_consoles()


def _refresh_consoles() -> None:
    """Rich consoles made at import judged the warm process's log file (no colour, not
    interactive): judge again for the command's terminal and environment."""
    from rich.console import Console

    for module in list(sys.modules.values()):
        console = getattr(module, "console", None)
        if isinstance(console, Console):
            console.no_color = os.environ.get("NO_COLOR", "") != ""
            console.is_interactive = console.is_terminal and not console.is_dumb_terminal
            console._color_system = console._detect_color_system()


def serve_main() -> None:
    """``python -m flows.warm_server``: bind, import, serve; in a forked child, run the command."""
    apply_defaults()  # as the `dapo` entry point does before it computes its fingerprint
    server = Server(socket_path(), float(os.environ.get("DAPO_WARM_IDLE_S", IDLE_S)))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: setattr(server, "terminated", True))
    if not server.bind():
        print("a warm process is running already", flush=True)
        return
    try:
        started = time.monotonic()
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except ImportError as e:  # an optional part: its commands import it themselves
                print(f"not preloaded: {name} ({e})", flush=True)
        gc.freeze()  # what the imports made stays shared with the children, not copied by GC
        server.ready()
        print(f"pid {os.getpid()}: ready in {time.monotonic() - started:.1f}s", flush=True)
        job = server.serve()
    except BaseException:
        if os.getpid() == server.pid:
            server.close()
        raise
    if job is not None:  # the forked child
        become(job)
        # imported already: by name, as PRELOAD's modules; run as the `dapo` entry point runs
        # it (a reader that left its output makes 141, not 1)
        run_to_the_end(importlib.import_module(CLI).app)


if __name__ == "__main__":
    serve_main()
