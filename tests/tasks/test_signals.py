"""The interrupt path's handlers (``tasks.signals``): a signal held until a write is over, one
ignored while a stop cleans up, and the handlers put back afterwards."""

import signal
from pathlib import Path

import pytest

from tasks.signals import deferred_signals, held_signals


def _recording(calls: list[int]):
    def handler(signum, frame):
        calls.append(signum)

    return handler


def test_held_signals_delivers_the_first_after_the_body_and_a_second_at_once():
    calls: list[int] = []
    before = signal.signal(signal.SIGINT, _recording(calls))
    try:
        with held_signals():
            signal.raise_signal(signal.SIGINT)
            assert calls == []  # held: the write is not cut
            signal.raise_signal(signal.SIGINT)
            assert calls == [signal.SIGINT]  # sent again: meant now
        assert calls == [signal.SIGINT, signal.SIGINT]  # the held one, after the body
        handler = signal.getsignal(signal.SIGINT)
        assert handler is not None and handler.__name__ == "handler"  # put back
    finally:
        signal.signal(signal.SIGINT, before)


def test_deferred_signals_ignores_an_interrupt_and_puts_the_handler_back():
    calls: list[int] = []
    before = signal.signal(signal.SIGTERM, _recording(calls))
    try:
        with deferred_signals():
            signal.raise_signal(signal.SIGTERM)
        assert calls == []
        signal.raise_signal(signal.SIGTERM)
        assert calls == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_collector_is_off_while_a_command_imports_and_on_once_its_work_begins():
    """``dapo``'s start-up (``flows.signals.until_work_begins``) turns the garbage collector off:
    the imports make no garbage, and collecting over them cost a sixth of their time; loading the
    config (``_working``) turns it on again, before any work."""
    import gc

    from flows.commands.base import _working
    from flows.signals import GC_YOUNG, collector_for_work, until_work_begins

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    threshold = gc.get_threshold()
    gc.set_threshold(700, 10, 10)  # Python's default (a command run in this worker set its own)
    try:
        until_work_begins()
        assert not gc.isenabled()
        gc.unfreeze()
        _working()
        assert gc.isenabled()
        # what the imports made is out of the collector's passes, which run less often
        assert gc.get_freeze_count() > 10_000
        assert gc.get_threshold() == (GC_YOUNG, 10, 10)
        # once: a second call (a second run in the process) freezes nothing more
        gc.set_threshold(700, 10, 10)
        frozen = gc.get_freeze_count()
        alive = [[] for _ in range(100)]  # made since: a second freeze would hold them too
        collector_for_work()
        # (another thread may free frozen objects meanwhile: the count can fall, not rise by 100)
        assert gc.get_freeze_count() < frozen + len(alive) and gc.get_threshold()[0] == 700
        assert len(alive) == 100
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
        gc.enable()
        for s, handler in handlers.items():
            signal.signal(s, handler)


def test_a_process_that_dapo_spawns_keeps_its_collector(tmp_path):
    """The rollout process is spawned (``multiprocessing``): it imports its parent's main module,
    which for ``dapo`` turns the collector off at import, and never loads a config to turn it on
    again. It serves for hours: it must collect its garbage."""
    import subprocess
    import sys

    script = tmp_path / "dapo_like.py"  # what the `dapo` console script imports first
    script.write_text(
        "import gc\n"
        "import multiprocessing as mp\n"
        "from flows.entry import main  # noqa: F401\n"
        "def probe(q):\n"
        "    q.put(gc.isenabled())\n"
        "if __name__ == '__main__':\n"
        "    print('parent', gc.isenabled())\n"
        "    ctx = mp.get_context('spawn')\n"
        "    q = ctx.Queue()\n"
        "    p = ctx.Process(target=probe, args=(q,))\n"
        "    p.start()\n"
        "    print('child', q.get(timeout=120))\n"
        "    p.join()\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=180, check=True
    )
    assert out.stdout.split() == ["parent", "False", "child", "True"], out.stdout + out.stderr


@pytest.mark.parametrize("status", [0, 2])
def test_a_signal_after_the_command_ends_exits_with_its_status(status):
    """Ctrl-C while the interpreter shut down after a finished command ran the start-up's
    handler: "interrupted before anything had started", exit 130."""
    import subprocess
    import sys

    script = (
        "import atexit, os, signal, sys, time\n"
        "from flows.signals import run_to_the_end, until_work_begins\n"
        "until_work_begins()\n"
        "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(10)))\n"
        f"run_to_the_end(lambda: sys.exit({status}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == status and "interrupted" not in done.stderr, done.stderr


def _dapo_into_a_closed_pipe(*args: str) -> tuple[int, str]:
    """``dapo ARGS`` with a reader that closes the pipe at once (``| head -0``, as it were)."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first line is written
    try:
        done = subprocess.run(
            [str(Path(sys.executable).with_name("dapo")), *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env={**os.environ, "DAPO_WARM": "0"},
        )
    finally:
        os.close(write)
    return done.returncode, done.stderr


@pytest.mark.parametrize("printer", ["rich", "click", "json"])
def test_output_into_a_pipe_whose_reader_left_exits_141_quietly(printer: str) -> None:
    """``dapo variants | head -1`` exited 1, a failure's status; the shell's
    for a program whose reader left (SIGPIPE) is 141. Rich prints the table, click the help,
    and `dapo config` is a command whose expected errors (an OSError among them) are one line
    and exit 2: it said "error: [Errno 32] Broken pipe"."""
    args = {"rich": ["variants"], "click": ["--help"], "json": ["config"]}[printer]
    code, err = _dapo_into_a_closed_pipe(*args)
    assert code == 128 + signal.SIGPIPE and "Traceback" not in err, err


def test_a_stopped_command_exits_128_plus_its_first_signal():
    """The shell's status for a process a signal killed: 130 for Ctrl-C, 143 for SIGTERM (Slurm,
    Kubernetes, systemd). Both stopped a command alike, and both exited 130."""
    import subprocess
    import sys

    script = (
        "import os, signal\n"
        "from tasks import signals\n"
        "said = []\n"
        "for s in (signal.SIGINT, signal.SIGTERM):\n"
        "    signal.signal(s, signals.watched(lambda signum, frame: said.append(signum)))\n"
        "print(signals.interrupted_status())\n"  # none yet: a KeyboardInterrupt's 130
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"  # a second signal does not change it
        "print(signals.interrupted_status())\n"
        "signals.forget_interrupts()\n"  # the next command in this process
        "print(signals.interrupted_status())\n"
        "os._exit(0)\n"  # before the clean-up watchdog the signals armed
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["130", "143", "130"], done.stderr


def test_a_pipe_is_read_as_left_only_once_its_reader_has_closed_it():
    """A command that fails (exit 1) into a pipe someone still reads keeps its 1: only a pipe
    with no reader turns it into 141."""
    import os

    from flows.signals import _pipe_has_no_reader

    read, write = os.pipe()
    try:
        assert not _pipe_has_no_reader(write)
        os.close(read)
        assert _pipe_has_no_reader(write)
    finally:
        os.close(write)
