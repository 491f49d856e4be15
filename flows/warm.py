"""A warm process: ``dapo train`` (and evaluate, preflight, pipeline) starts in seconds.

A fresh ``dapo train`` spends most of its start-up importing torch, transformers, MLflow and
Prefect (BENCHMARKS.md, "Start-up"). The warm process imports them once and waits; each command
then connects to it, hands over its arguments, working directory, environment and terminal
(its stdin, stdout and stderr, passed as file descriptors), and the warm process forks a child
that runs the command as the ``dapo`` entry point would. The command's own process stays in the
terminal as a thin client: it relays Ctrl-C, SIGTERM, SIGHUP and Ctrl-Z to the child's process
group and exits with the child's exit code. As the Gradle daemon does for builds.

When it is used, and when not (a cold start is always the fallback, with nothing lost):

- the first such command (or ``dapo demo``) in an interactive terminal starts it in the
  background, saying so in one line; ``dapo warm start`` starts it anywhere (scripts, the
  start-up benchmark), ``dapo warm stop`` ends it, ``DAPO_WARM=0`` turns it off. It exits
  after ``DAPO_WARM_IDLE_S`` seconds unused (30 minutes);
- a command whose code differs from the warm process's runs cold and ends it (the next one
  starts a fresh one): the fingerprint (:func:`fingerprint`) covers this project's Python
  files, the installed packages and the interpreter;
- a command from another context talks to another warm process, or runs cold: each context
  (:func:`context_key`: the environment variables libraries read when imported, ``HF_*``,
  ``TORCH*``, ``CUDA_*``, ``OMP_*``, ``MLFLOW_*``, ..., and the cgroup, resource limits, nice
  value, groups and namespaces a forked child would otherwise take from the warm process) has
  its own socket, so a command inside a job's limits never runs outside them, and two
  terminals' warm processes coexist;
- the warm process also checks, for each command, that no file of a module it imported has
  changed since (an editable package, a package patched in place);
- the socket, its lock and its log live in ``DAPO_WARM_DIR/dapo-warm-<uid>/`` (the temporary
  directory by default), one socket per checkout and context, in a directory only its user
  can open; a client talks only to a server of its own uid (``SO_PEERCRED``).

The warm process runs no torch operation before it forks (a forked child of a process that ran
a parallel region can hang in OpenMP), and binds its socket before importing, so a command that
arrives while it imports waits for it rather than paying for its own imports. Everything here
imports only the standard library (and ``flows.signals`` and ``tasks.lifetime``, which do too):
the client path must cost milliseconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import importlib
import json
import os
import selectors
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flows.environment import ROOT, apply_defaults, with_defaults
from flows.signals import until_work_begins
from tasks.lifetime import die_with_parent

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
    *("ATEN_", "ONEDNN_", "DNNL_", "DAPO_PORTABLE"),
    *("XDG_", "HOME", "TMPDIR", "TQDM_", "LANG", "LC_", "DO_NOT_TRACK", "NO_COLOR"),
)
"""Prefixes of the environment variables libraries may read once, when imported."""
STARTERS = ROUTED | {"demo"}
"""Commands that start a warm process for the next ones (``make demo`` is a newcomer's first)."""
RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
IDLE_S = 1800.0
STOP_GRACE_S = 30.0
"""A command whose client vanished (killed) gets SIGTERM, then SIGKILL this much later."""
# How long a command waits for the warm process to take it (a just-started one may still be
# importing) before it runs cold: a wedged warm process must not hang every command.
ANSWER_TIMEOUT_S = 120.0
NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "user", "uts")


def enabled() -> bool:
    """Not turned off, and not one rank of a launcher's job (torchrun, deepspeed): each rank is
    a process its launcher watches and signals, so it runs itself."""
    launched = "LOCAL_RANK" in os.environ or "WORLD_SIZE" in os.environ
    return os.environ.get("DAPO_WARM", "") != "0" and not launched


def routed(argv: list[str]) -> bool:
    """Whether ``dapo ARGV`` is a command the warm process runs."""
    return bool(argv) and argv[0] in ROUTED


def socket_path() -> Path:
    """The socket of this checkout's warm process for this process's context
    (:func:`context_key`), in this user's private directory (short: a Unix socket path has ~100
    bytes)."""
    return _socket_dir() / f"{_checkout()}-{context_key()[:8]}.sock"


def _socket_dir() -> Path:
    return _warm_root() / f"dapo-warm-{os.getuid()}"


def _checkout() -> str:
    return hashlib.sha1(str(ROOT).encode()).hexdigest()[:8]


def context_key(env: dict[str, str] | None = None) -> str:
    """What a command shares with the warm process that runs it besides code: the environment
    variables libraries read when imported, and what a forked child inherits from the warm
    process instead of from the caller (:func:`execution_context`). Each context has a socket
    of its own, so a command never runs outside the job it was started in (a Slurm step,
    ``systemd-run -p MemoryMax=...``, ``ulimit -v``): from another context it runs cold, or in a
    warm process of that context, and two terminals' warm processes coexist."""
    env = with_defaults(os.environ if env is None else env)  # applied or not yet
    h = hashlib.sha1(f"{sys.executable}\0".encode())
    for key in sorted(k for k in env if k.startswith(IMPORT_TIME_ENV)):
        h.update(f"{key}={env[key]}\0".encode())
    h.update(json.dumps(execution_context(), sort_keys=True).encode())
    return h.hexdigest()


def execution_context() -> dict[str, Any]:
    """The caller's place in the system: cgroup (a job's memory and device limits), every
    resource limit, nice value, user and groups, and namespaces (a container)."""
    import resource

    limits = {}
    for name in sorted(n for n in dir(resource) if n.startswith("RLIMIT_")):
        with contextlib.suppress(ValueError, OSError):  # one this kernel does not have
            limits[name] = resource.getrlimit(getattr(resource, name))
    ids = [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), sorted(os.getgroups())]
    context: dict[str, Any] = {"limits": limits, "ids": ids}
    context["nice"] = os.getpriority(os.PRIO_PROCESS, 0)
    with contextlib.suppress(OSError):
        context["cgroup"] = Path("/proc/self/cgroup").read_text()
    for ns in NAMESPACES:
        with contextlib.suppress(OSError):
            context[f"ns.{ns}"] = os.readlink(f"/proc/self/ns/{ns}")
    return context


def _warm_root() -> Path:
    return Path(os.environ.get("DAPO_WARM_DIR") or tempfile.gettempdir())


def _private_dir() -> bool:
    """Make the socket's directory, owned by this user and closed to others; False where it
    exists otherwise (another user made it first): then no warm process, for safety."""
    where = _socket_dir()
    if not where.parent.is_dir():
        from dapo_core.errors import PipelineError  # the CLI's one-line errors

        raise PipelineError(
            f"DAPO_WARM_DIR={where.parent} is not a directory: create it, or unset DAPO_WARM_DIR "
            "to use the temporary directory"
        )
    with contextlib.suppress(FileExistsError):
        where.mkdir(mode=0o700)
    st = os.lstat(where)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def fingerprint(roots: tuple[Path, ...] | None = None) -> str:
    """What must match for a warm process's imports to be the ones a cold start would make,
    besides its context (which the socket is chosen by): the project's Python files (path,
    size, modification time), the installed packages (their directories' modification times
    change on every install) and the interpreter."""
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


def _connect(timeout: float | None = None, path: Path | None = None) -> socket.socket | None:
    """A connection to this user's warm process for this context, or the one at ``path`` (its
    peer checked: our uid), or None."""
    if not _socket_dir().is_dir() or not _private_dir():
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path or socket_path()))
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", creds)[1] != os.getuid():
            raise OSError("the socket's owner is another user")
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
        # a signal this process ignores (nohup: SIGHUP) is one the command must ignore too
        ignored = [int(s) for s in RELAYED if signal.getsignal(s) is signal.SIG_IGN]
        try:
            socket.send_fds(sock, [b"R"], [0, 1, 2])
            request = {"argv": [sys.argv[0], *argv], "cwd": os.getcwd(), "env": dict(os.environ)}
            request.update(path=sys.path, ignored=ignored, fingerprint=fingerprint())
            request.update(context=context_key())
            request.update(umask=_umask(), cpus=sorted(os.sched_getaffinity(0)))
            _send(sock, request)
            sock.settimeout(ANSWER_TIMEOUT_S)
            reply = _recv(sock)  # waits while a just-started warm process still imports
            sock.settimeout(None)  # then the command takes as long as it takes
        except TimeoutError:
            sys.stderr.write(
                f"dapo: the warm process did not answer within {ANSWER_TIMEOUT_S:.0f}s, so this "
                "command runs cold (`dapo warm stop` ends it)\n"
            )
            return None
        except OSError:
            return None
        if not reply or "pid" not in reply:
            return None  # stale (it ends itself), or gone before it forked: start cold
        pid = reply["pid"]
        _relay_signals(pid, ignored)
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


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _relay(pid: int, signum: int) -> None:
    """What the terminal sent the command goes to the command's process group."""
    with contextlib.suppress(OSError):
        os.killpg(pid, signum)


def _relay_signals(pid: int, ignored: list[int]) -> None:
    """From now on the terminal's signals reach the command: Ctrl-C, SIGTERM, SIGHUP, SIGQUIT
    as they are; Ctrl-Z stops the command, then this process (the shell's job), and ``fg`` or
    ``bg`` (SIGCONT) continues both."""

    def suspend(signum: int, frame: Any) -> None:
        _relay(pid, signal.SIGTSTP)
        os.kill(os.getpid(), signal.SIGSTOP)

    for sig in RELAYED:
        if sig not in ignored:
            signal.signal(sig, lambda signum, frame: _relay(pid, signum))
    signal.signal(signal.SIGTSTP, suspend)
    signal.signal(signal.SIGCONT, lambda signum, frame: _relay(pid, signal.SIGCONT))


def start(quiet: bool = False) -> int | None:
    """Start a warm process in the background unless one answers; its pid, or None if one was
    running already."""
    if not _private_dir() or status() is not None:
        return None
    log = socket_path().with_suffix(".log")
    with open(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as out:
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
    wanted = interactive or os.environ.get("DAPO_WARM") == "1"
    # A DAPO_WARM_DIR that does not exist: `dapo warm start` says so; this command runs cold.
    usable = _warm_root().is_dir()
    if enabled() and argv and argv[0] in STARTERS and wanted and usable:
        start()


def status(timeout: float = 60.0) -> dict[str, Any] | None:
    """The warm process's state (pid, commands running, ready), or None where none answers."""
    return _ask({"op": "status"}, timeout)


def stop(timeout: float = 60.0) -> dict[str, Any] | None:
    """Ask this context's warm process to exit once the commands it runs have ended."""
    return _ask({"op": "stop"}, timeout)


def stop_all(timeout: float = 60.0) -> list[dict[str, Any]]:
    """Ask every warm process of this checkout (whatever its context) to exit, as :func:`stop`;
    what each answered."""
    sockets = sorted(_socket_dir().glob(f"{_checkout()}-*.sock")) if _socket_dir().is_dir() else []
    return [found for path in sockets if (found := _ask({"op": "stop"}, timeout, path))]


def wait_ready(timeout: float = 120.0) -> dict[str, Any] | None:
    """Block until the warm process has imported everything (status answers then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (found := status(timeout=max(1.0, deadline - time.monotonic()))) is not None:
            return found
        time.sleep(0.2)
    return None


def _ask(message: dict[str, Any], timeout: float, path: Path | None = None) -> dict | None:
    sock = _connect(timeout, path)
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
        self.modules: dict[str, int] = {}  # file -> mtime of what was imported

    def bind(self) -> bool:
        """Listen on the socket; False where a live warm process holds it (a lock held for
        life: two started at once cannot both bind)."""
        if not _private_dir():
            return False
        self.lock = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
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
        if message.get("context") != self.context:  # moved since it started (prlimit, cgroup)
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
    """``python -m flows.warm serve``: bind, import, serve; in a forked child, run the command."""
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
        importlib.import_module(CLI).app()  # imported already: by name, as PRELOAD's modules


if __name__ == "__main__" and sys.argv[1:] == ["serve"]:
    serve_main()
