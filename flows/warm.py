"""A warm process: ``dapo train`` (and evaluate, preflight, pipeline) starts in seconds.

A fresh ``dapo train`` spends most of its start-up importing torch, transformers, MLflow and
Prefect (docs/benchmarks.md, "Start-up"). The warm process imports them once and waits; each command
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
import hashlib
import json
import os
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

from flows.environment import ROOT, with_defaults

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


def lock_path(socket: Path) -> Path:
    """The lock a warm process holds on ``socket`` for its whole life (file kept)."""
    return socket.with_suffix(".lock")


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
            [sys.executable, "-m", "flows.warm_server"],
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


def start_ready(timeout: float = 120.0) -> tuple[int | None, dict[str, Any] | None]:
    """(pid started or None, its status once ready or None): :func:`start` then
    :func:`wait_ready`. A process started here that is not ready when this returns (it timed
    out, or Ctrl-C or SIGTERM raised while waiting) is ended: nobody asked for one that is not
    working."""
    pid, found = start(quiet=True), None
    try:
        found = wait_ready(timeout)
        return pid, found
    finally:
        if pid is not None and found is None:
            _end_unready(pid)


def _end_unready(pid: int) -> None:
    """End the warm process ``pid`` this process started, which has served nothing yet, and
    remove the socket it may have bound (a later ``warm status`` found a socket file with
    nobody behind it): unless another warm process has bound it since, which holds the lock."""
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)  # its own session
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)  # gone, its lock released
    import fcntl

    path = socket_path()
    with contextlib.suppress(OSError):
        lock = os.open(lock_path(path), os.O_RDWR)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink(missing_ok=True)
        finally:
            os.close(lock)


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
